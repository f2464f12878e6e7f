"""The current dialect's destination-passing ISA against Beta 1's form of the same instruction.

``nki.isa`` (nkisim/nki/isa.py) computes through the core instruction and writes its result
straight into ``dst`` (``nkisim.tensor.write_into``), where Beta 1's ``dst[...] = nisa.op(...)``
builds a result tile and retargets it; ``nc_matmul`` keeps a per-element "matmul-initialised"
state for ``accumulate=None``. This prints the time per instruction of:

- ``nc_matmul``: ``nisa.nc_matmul(psum, a, b)`` (accumulate=None) vs Beta 1's
  ``psum += nisa.nc_matmul(a, b)``, a (128, 128) stationary and a (128, 512) moving fp32 tile, 16
  matmuls per fresh PSUM tile;
- ``tensor_tensor``: ``nisa.tensor_tensor(z, x, y, nl.add)`` vs ``z[...] =
  nisa.tensor_tensor(x, y, np.add)`` on (128, 512) fp32 tiles.

Timing: CPU time of this process (``time.process_time``), BLAS single-threaded, the variants
alternated ``--repeats`` times and the minimum taken.

    python benchmarks/nki_isa_overhead.py [--iters 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")      # before NumPy loads its BLAS

import numpy as np  # noqa: E402

from nkisim import beta1, ops  # noqa: E402
from nkisim.beta1 import isa as b1isa  # noqa: E402
from nkisim.nki import isa as nisa  # noqa: E402


def _tiles(w, x):
    ws = ops.ndarray(w.shape, np.float32, buffer=ops.sbuf)
    xs = ops.ndarray(x.shape, np.float32, buffer=ops.sbuf)
    nisa.dma_copy(ws, w)
    nisa.dma_copy(xs, x)
    return ws, xs


def kernels(iters):
    groups = max(1, iters // 16)

    @beta1.jit
    def mm_face(w, x):
        ws, xs = _tiles(w, x)
        for _ in range(groups):
            p = ops.ndarray((128, 512), np.float32, buffer=ops.psum)
            for _ in range(16):
                nisa.nc_matmul(p, ws, xs)

    @beta1.jit
    def mm_beta1(w, x):
        ws, xs = _tiles(w, x)
        for _ in range(groups):
            p = ops.zeros((128, 512), np.float32, buffer=ops.psum)
            for _ in range(16):
                p += b1isa.nc_matmul(ws, xs)

    @beta1.jit
    def tt_face(a, b):
        xs, ys = _tiles(a, b)
        z = ops.ndarray((128, 512), np.float32, buffer=ops.sbuf)
        for _ in range(iters):
            nisa.tensor_tensor(z, xs, ys, ops.add)

    @beta1.jit
    def tt_beta1(a, b):
        xs, ys = _tiles(a, b)
        z = ops.ndarray((128, 512), np.float32, buffer=ops.sbuf)
        for _ in range(iters):
            z[...] = b1isa.tensor_tensor(xs, ys, np.add)

    return {"nc_matmul": (mm_face, mm_beta1, groups * 16),
            "tensor_tensor": (tt_face, tt_beta1, iters)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    w = rng.random((128, 128), np.float32)
    x = rng.random((128, 512), np.float32)
    y = rng.random((128, 512), np.float32)
    warnings.simplefilter("ignore")      # Beta 1 `+=` into nl.ndarray PSUM: a tolerated rule
    for op, (face, beta, n) in kernels(args.iters).items():
        a, b = (w, x) if op == "nc_matmul" else (x, y)
        best = {"nki.isa": float("inf"), "Beta 1": float("inf")}
        for _ in range(args.repeats):
            for label, k in (("nki.isa", face), ("Beta 1", beta)):
                t = time.process_time()
                k(a, b)
                best[label] = min(best[label], time.process_time() - t)
        f, bt = (best[k] / n * 1e6 for k in ("nki.isa", "Beta 1"))
        print(f"{op:14s} nki.isa {f:8.1f} us/instr   Beta 1 {bt:8.1f} us/instr   "
              f"ratio {f / bt:.2f}")


if __name__ == "__main__":
    main()
