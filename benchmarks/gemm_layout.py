"""What our conv2d's matmuls cost in plain NumPy, on the lower bound's hot buffers and on the
kernel's own memory layout (issue 12: why the B=1 simulation stays above 1.3x the bound).

``sim_speed.py``'s lower bound replays every matmul as ``matmul(a.T, b, out=tmp); acc += tmp``
on one preallocated 128x128 stationary and one contiguous 128x444 moving buffer: they stay in
the CPU's caches. The kernel (``kernels/conv2d.py``, B=1 256->256 224x224) reads each matmul's
operands from its tiles instead: a 128x128 stationary ``wT[:, ci, tap, co]`` of a 2.4 MB weight
tile and a [128, 2, 222] window of an 8.7 MB input band, a different one each time. This script
times, with no interpreter at all, per matmul and add (nkisim's own GEMM call,
``nkisim.gemm.product``, for the windows):

- ``bound``: the lower bound's loop;
- ``layout``: the kernel's sequence of operands on arrays of its layout (two N=222 GEMMs per
  strided window, as nkisim computes them);
- ``layout, flat windows``: the same with each window a contiguous span of two 224-wide rows
  (N=448), as a kernel with "flat" windows would read them;
- ``layout, compact weights``: the windows of ``layout`` with every stationary a compact copy.

Rounds alternate between the variants; min and median over ``--rounds`` of ``--matmuls`` each.

    python benchmarks/gemm_layout.py [--rounds 15] [--matmuls 400]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")      # before NumPy loads its BLAS

import numpy as np  # noqa: E402

N_CI, TAPS, C_OUT, WIDTH, BAND_ROWS = 2, 9, 256, 224, 38   # the kernel's tiles at 224x224
ROWS, COLS = 2, 222                                          # one PSUM tile: 2 rows of 222


def _variants():
    from nkisim.gemm import product
    rng = np.random.default_rng(0)
    wT = rng.standard_normal((128, N_CI, TAPS, C_OUT)).astype(np.float32)
    compact = np.ascontiguousarray(wT.transpose(1, 2, 3, 0))    # [ci, tap, c_out, k]
    bands = [rng.standard_normal((128, N_CI, BAND_ROWS + 1, WIDTH)).astype(np.float32)
             for _ in range(2)]                                 # the two band sites
    acc = np.zeros((128, ROWS * COLS), np.float32)
    acc_flat = np.zeros((128, ROWS * WIDTH), np.float32)
    tmp = np.empty((128, ROWS * COLS), np.float32)
    a_hot = np.ones((128, 128), np.float32)
    b_hot = np.ones((128, ROWS * COLS), np.float32)

    def bound(n):
        for _ in range(n):
            np.matmul(a_hot.T, b_hot, out=tmp)
            np.add(acc, tmp, out=acc)

    def sequence(n, flat=False, compact_weights=False):
        i = 0
        while True:
            for band in bands:
                xf = band.reshape(128, N_CI, -1)
                for co in range(C_OUT // 128):
                    for r in range(0, BAND_ROWS - 2, ROWS):
                        for ci in range(N_CI):
                            for di in range(3):
                                for dj in range(3):
                                    tap = di * 3 + dj
                                    if compact_weights:
                                        a = compact[ci, tap, co * 128:(co + 1) * 128].T
                                    else:
                                        a = wT[:, ci, tap, co * 128:(co + 1) * 128]
                                    if flat:
                                        s = (r + di) * WIDTH + dj
                                        out = product(a, xf[:, ci, s:s + ROWS * WIDTH],
                                                      (128, ROWS * WIDTH), reuse=True)
                                        np.add(acc_flat, out, out=acc_flat)
                                    else:
                                        win = band[:, ci, r + di:r + di + ROWS, dj:dj + COLS]
                                        out = product(a, win, (128, ROWS, COLS), reuse=True)
                                        np.add(acc, out.reshape(128, -1), out=acc)
                                    i += 1
                                    if i == n:
                                        return

    return {
        "bound": bound,
        "layout": sequence,
        "layout, flat windows": lambda n: sequence(n, flat=True),
        "layout, compact weights": lambda n: sequence(n, compact_weights=True),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--matmuls", type=int, default=400, help="matmuls per round and variant")
    args = p.parse_args()
    variants = _variants()
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            t0 = time.process_time()
            fn(args.matmuls)
            times[name].append((time.process_time() - t0) / args.matmuls * 1e6)
    best = min(times["bound"])
    median = statistics.median(times["bound"])
    print(f"conv2d B=1 256->256 224x224 matmuls in plain NumPy; CPU us per matmul and add, "
          f"{args.rounds} alternating rounds of {args.matmuls}")
    print(f"{'variant':<26}{'min':>8}{'median':>8}{'min/bound':>11}{'median/bound':>14}")
    for name, ts in times.items():
        m, md = min(ts), statistics.median(ts)
        print(f"{name:<26}{m:>8.1f}{md:>8.1f}{m / best:>11.2f}{md / median:>14.2f}")


if __name__ == "__main__":
    main()
