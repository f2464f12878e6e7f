"""The interpreter's share of a conv2d simulation: the GEMMs stubbed out (issue 12).

Simulates the B=1 256->256 224x224 3x3 fp32 conv2d of ``sim_speed.py`` (``--batch``, ``--height``,
``--width``, ``--pool`` change it) with ``np.matmul`` inside ``nkisim.gemm`` replaced by a stub
that returns its ``out=`` array unchanged (``--stub``), or as is (no ``--stub``), and prints the
minimum CPU time of ``--repeats`` runs (default 3). The conv kernel's matmuls take a 3-D moving
window ([128, 2, 222] of a 4-D band tile), which nkisim multiplies with ``np.matmul(...,
out=)``: stubbed, the run keeps every other cost (the views, the checks, the trace, the PSUM
additions) and loses only the GEMMs, so its time is the interpreter's share; the full run minus
it is what the GEMMs cost inside the simulation. The results of a stubbed run are garbage (never
compared); a 2-D product (``np.matmul`` without ``out=``) gets an uninitialized array.

Checks: ``--checks all`` (default, what ``sim_speed.py`` runs) or ``none`` (``NKISIM_CHECKS``).
BLAS single-threaded, as nkisim runs it; CPU time (``time.process_time``).

    python benchmarks/interp_share.py [--stub] [--checks none] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")      # before NumPy loads its BLAS

import numpy as np  # noqa: E402


class _NoGemm:
    """``nkisim.gemm.np`` with ``matmul`` stubbed: returns ``out`` (no product)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def matmul(a, b, out=None, **kwargs):
        return np.empty(a.shape[:-1] + b.shape[-1:], np.float32) if out is None else out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stub", action="store_true", help="stub np.matmul out (interpreter share)")
    p.add_argument("--checks", default="all", help="NKISIM_CHECKS: all (default) or none")
    p.add_argument("--repeats", type=int, default=3, help="runs; the minimum is printed")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--height", type=int, default=224)
    p.add_argument("--width", type=int, default=224)
    p.add_argument("--pool", type=int, default=1)
    args = p.parse_args()
    os.environ["NKISIM_CHECKS"] = args.checks

    import nkisim.gemm
    from nkiverify import registry
    from nkiverify.backends import NkisimBackend

    spec = registry.get("conv2d")
    params = {"batch": args.batch, "c_in": 256, "c_out": 256, "height": args.height,
              "width": args.width, "k": 3, "pool": args.pool, "bias": True}
    inputs = spec.inputs(params, registry.dtype_of("float32"), seed=0)
    backend = NkisimBackend()
    kernel = backend.load(spec.import_path)
    if args.stub:
        nkisim.gemm.np = _NoGemm()
    times = []
    try:
        for _ in range(max(1, args.repeats)):
            t0 = time.process_time()
            backend.run(kernel, *inputs.args, **inputs.kwargs)
            times.append(time.process_time() - t0)
    finally:
        nkisim.gemm.np = np
    what = "GEMMs stubbed (interpreter share)" if args.stub else "full simulation"
    print(f"conv2d B={args.batch} 256->256 {args.height}x{args.width} 3x3 pool {args.pool} "
          f"float32, checks={args.checks}: {what}: {min(times):.3f} s CPU "
          f"(min of {len(times)})")


if __name__ == "__main__":
    main()
