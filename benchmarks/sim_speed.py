"""Simulation speed: nkisim vs the NumPy golden model on the course's large conv2d case.

Simulates ``fused_conv2d_maxpool`` on B=4, 256->256 channels, 224x224, 3x3, float32 (the course's
large-image correctness configuration), times the float64 golden model on the same inputs, and
prints both times and, as the last line, ``simulate/reference time ratio: X`` (target X <= 3).

    python benchmarks/sim_speed.py [--batch 4] [--checks all|none|-races] [--schedule]

``--schedule`` also times the cost model's schedule of the trace (issue: <= 25% of simulation).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--checks", default=None, help="NKISIM_CHECKS spec (default: all checks)")
    p.add_argument("--schedule", action="store_true", help="also time the latency schedule")
    args = p.parse_args()
    if args.checks is not None:
        os.environ["NKISIM_CHECKS"] = args.checks

    import nkisim.shim
    nkisim.shim.install()
    from kernels.conv2d import fused_conv2d_maxpool
    from nkisim.runtime import last_run
    from reference.conv2d import conv2d_maxpool

    rng = np.random.default_rng(0)
    B, C, H = args.batch, args.channels, args.size
    X = rng.random((B, C, H, H), dtype=np.float32)
    W = rng.random((C, C, 3, 3), dtype=np.float32)
    bias = np.zeros(C, np.float32)

    t0 = time.perf_counter()
    out = fused_conv2d_maxpool(X, W, bias, pool_size=1)
    t_sim = time.perf_counter() - t0
    run = last_run()
    print(f"simulate: {t_sim:.2f} s  ({len(run.trace)} instructions, "
          f"{t_sim / max(len(run.trace), 1) * 1e6:.1f} us/instruction, checks="
          f"{','.join(sorted(run.checks)) or 'none'})")

    t0 = time.perf_counter()
    ref = conv2d_maxpool(X, W, bias, pool_size=1)
    t_ref = time.perf_counter() - t0
    print(f"reference (float64 golden): {t_ref:.2f} s")
    err = float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    print(f"max |error| / max |golden|: {err:.2e}")

    if args.schedule:
        from nkisim.runtime import estimate
        t0 = time.perf_counter()
        sched, us = estimate(run)
        t_sch = time.perf_counter() - t0
        print(f"schedule: {t_sch:.2f} s = {100 * t_sch / t_sim:.1f}% of simulation; "
              f"estimated latency {us:.0f} us")
    print(f"simulate/reference time ratio: {t_sim / t_ref:.2f}")


if __name__ == "__main__":
    main()
