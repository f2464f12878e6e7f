"""Cost of nkisim's checks (issue 5: at most 30% extra simulation time on the large conv2d case).

Simulates ``kernels.conv2d.fused_conv2d_maxpool`` on B images of 256 -> 256 channels, 224 x 224,
3 x 3, float32, with every check off (``NKISIM_CHECKS=none``) and on (``all``, the default),
alternating the two ``--repeats`` times per batch size, and reports the best CPU time of each
(process time: less sensitive to other load on the machine than wall time) and the overhead.
BLAS runs single-threaded (``OPENBLAS_NUM_THREADS=1`` etc., unless already set) so that CPU time
is not inflated by threads spinning on a loaded machine.

    python benchmarks/checks_overhead.py [--batches 1,2,3,4] [--repeats 2] [--size 224]
"""

from __future__ import annotations

import argparse
import os
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")      # before NumPy loads its BLAS

import numpy as np  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,2,3,4")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--channels", type=int, default=256)
    args = p.parse_args()

    import nkisim.shim
    nkisim.shim.install()
    from nkiverify.kernels.conv2d import fused_conv2d_maxpool

    from nkisim.runtime import simulate

    rng = np.random.default_rng(0)
    C, H = args.channels, args.size
    W = rng.random((C, C, 3, 3), dtype=np.float32)
    bias = rng.random(C, dtype=np.float32)
    print(f"conv2d {C}->{C} channels, {H}x{H}, 3x3, float32; best of {args.repeats} "
          "(CPU seconds)")
    print(f"{'B':>3} {'checks=none':>12} {'checks=all':>12} {'overhead':>9}")
    for B in (int(b) for b in args.batches.split(",")):
        X = rng.random((B, C, H, H), dtype=np.float32)
        best = {"none": float("inf"), "all": float("inf")}
        for _ in range(args.repeats):
            for spec in ("none", "all"):
                t0 = time.process_time()
                simulate(fused_conv2d_maxpool, (X, W, bias), {"pool_size": 1}, checks_spec=spec)
                best[spec] = min(best[spec], time.process_time() - t0)
        extra = best["all"] / best["none"] - 1
        print(f"{B:>3} {best['none']:>12.2f} {best['all']:>12.2f} {extra:>+9.1%}", flush=True)


if __name__ == "__main__":
    main()
