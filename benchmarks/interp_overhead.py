"""Interpreter overhead per instruction: nkisim minus the same NumPy operations (issue 12).

Each loop runs ``--iters`` instructions (default 1,000) in one kernel on nkisim, with every check
on (``NKISIM_CHECKS`` default, ``all``) and with every check off (``none``), and the same NumPy
operations in a tight loop (the physical limit, DESIGN.md "Keep the interpreter fast"):

- ``nc_matmul``: ``acc += nisa.nc_matmul(a, b)`` with a (128, 128) stationary and a (128, 512)
  moving fp32 tile, accumulating into one fp32 PSUM tile (an ``affine_range`` loop, as the
  conv2d kernel's accumulation groups); NumPy: ``matmul(a.T, b, out=tmp); acc += tmp``.
- ``tensor_tensor``: ``z = nisa.tensor_tensor(x, y, op=nl.add)`` on (128, 512) fp32 tiles
  (a fresh result tile each iteration); NumPy: ``add(x, y, out=z)``.
- ``tensor_tensor (dst=)``: ``z[...] = nisa.tensor_tensor(x, y, op=nl.add)`` into a fixed tile
  (``sequential_range``: every iteration writes the same tile).
- ``dma_copy (fixed)``: ``nisa.dma_copy(dst=t, src=x_hbm)`` of 128x512 fp32 HBM -> one SBUF tile
  (``sequential_range``); ``dma_copy (fresh)``: into ``t = nl.ndarray(...)`` allocated in the
  body; NumPy: ``copyto(t, x)``.

Timing: CPU time of this process (``time.process_time``: less sensitive to other load on a
shared machine than wall time), BLAS single-threaded (as nkisim runs it). The variants of an
op (NumPy, checks on, checks off) run back to back, and the ops in turn, ``--repeats`` times
(default 20) with ``--iters`` instructions per loop (default 1,000): many short alternating
runs rather than a few long ones (it was 3 x 10,000; about as long in all), because the load of
a shared machine comes and goes (NumPy's own 128x128 by 128x512 matmul swings between 230 and
350 us from one run to the next on the 2-core host) and the minimum of each variant over more
runs is nearer its unloaded time. A run's fixed cost (about 2 ms: the kernel's loads and
stores, the end-of-run checks; 0.2 us per instruction at 10,000 iterations, 2 at 1,000) is
measured by the same kernels with a one-iteration loop, in every repeat, and taken out: an
instruction costs ``(min nkisim time - min nkisim time of the one-iteration loop) /
(iterations - 1)`` on nkisim and ``min NumPy time / iterations`` in NumPy, and its overhead is
the difference; it includes the loop's own per-iteration cost. The spread columns give the
overhead measured within each repeat (from its three runs): the median and the range (min-max)
over the repeats; a wide range means the figures were
taken on a busy machine and only their order of magnitude counts. The last line gives the
``nc_matmul`` figures, the instruction the large kernels are made of.

    python benchmarks/interp_overhead.py [--quick] [--iters 1000] [--repeats 20]
"""

from __future__ import annotations

import argparse
import functools
import os
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")      # before NumPy loads its BLAS

import numpy as np  # noqa: E402

P, M, N = 128, 128, 512


# ---- the kernels (real NKI code, run through the nkisim shim) ----------------------------------

def _kernels(n):
    import neuronxcc.nki.isa as nisa
    import neuronxcc.nki.language as nl

    def matmul_kernel(a, b):
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        a_t = nl.load(a)
        b_t = nl.load(b)
        acc = nl.zeros((M, N), nl.float32, buffer=nl.psum)
        for _ in nl.affine_range(n):
            acc += nisa.nc_matmul(a_t, b_t)
        nl.store(out, acc)
        return out

    def tensor_tensor_kernel(x, y):
        out = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.shared_hbm)
        x_t = nl.load(x)
        y_t = nl.load(y)
        for _ in nl.affine_range(n):
            z = nisa.tensor_tensor(x_t, y_t, op=nl.add)    # noqa: F841 (dies in its iteration)
        nl.store(out, x_t)
        return out

    def tensor_tensor_dst_kernel(x, y):
        out = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.shared_hbm)
        x_t = nl.load(x)
        y_t = nl.load(y)
        z = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.sbuf)
        for _ in nl.sequential_range(n):
            z[...] = nisa.tensor_tensor(x_t, y_t, op=nl.add)
        nl.store(out, z)
        return out

    def dma_fixed_kernel(x):
        out = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.sbuf)
        for _ in nl.sequential_range(n):
            nisa.dma_copy(dst=t, src=x)
        nl.store(out, t)
        return out

    def dma_fresh_kernel(x):
        out = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.shared_hbm)
        for _ in nl.affine_range(n):
            t = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x)
        nl.store(out, nl.load(x))
        return out

    return {"nc_matmul": matmul_kernel, "tensor_tensor": tensor_tensor_kernel,
            "tensor_tensor (dst=)": tensor_tensor_dst_kernel,
            "dma_copy (fixed)": dma_fixed_kernel, "dma_copy (fresh)": dma_fresh_kernel}


# ---- the same NumPy operations ------------------------------------------------------------------

def _numpy_loops(n):
    def matmul(a, b):
        acc = np.zeros((M, N), np.float32)
        tmp = np.empty((M, N), np.float32)
        at = a.T
        for _ in range(n):
            np.matmul(at, b, out=tmp)
            np.add(acc, tmp, out=acc)
        return acc

    def add(x, y):
        z = np.empty((P, N), np.float32)
        for _ in range(n):
            np.add(x, y, out=z)
        return z

    def copy(x):
        t = np.empty((P, N), np.float32)
        for _ in range(n):
            np.copyto(t, x)
        return t

    return {"nc_matmul": matmul, "tensor_tensor": add, "tensor_tensor (dst=)": add,
            "dma_copy (fixed)": copy, "dma_copy (fresh)": copy}


def _cpu(fn, *args):
    t0 = time.process_time()
    fn(*args)
    return time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=None, help="instructions per loop (1000)")
    p.add_argument("--quick", action="store_true", help="500 instructions per loop, 6 repeats")
    p.add_argument("--repeats", type=int, default=None,
                   help="alternating runs (20); the min of each variant is kept")
    args = p.parse_args()
    n = max(2, args.iters or (500 if args.quick else 1000))
    repeats = args.repeats or (6 if args.quick else 20)

    import nkisim.shim
    nkisim.shim.install()
    from nkisim.runtime import simulate

    rng = np.random.default_rng(0)
    a = rng.random((P, M), dtype=np.float32)
    b = rng.random((P, N), dtype=np.float32)
    kernels, single, loops = _kernels(n), _kernels(1), _numpy_loops(n)
    operands = {"nc_matmul": (a, b), "tensor_tensor": (b, b + 1),
                "tensor_tensor (dst=)": (b, b + 1),
                "dma_copy (fixed)": (b,), "dma_copy (fresh)": (b,)}

    # correctness first: the kernels compute what the NumPy loops compute
    for name in ("nc_matmul", "tensor_tensor (dst=)", "dma_copy (fixed)"):
        small = _kernels(3)[name]
        got = simulate(small, operands[name], {})
        want = _numpy_loops(3)[name](*operands[name])
        np.testing.assert_allclose(got, want, rtol=1e-5)

    variants = ("numpy", "all", "none", "all1", "none1")      # all1: one iteration
    times = {(name, v): [] for name in kernels for v in variants}
    for _ in range(repeats):
        for name, kernel in kernels.items():
            for variant in variants:      # alternate within each repeat
                if variant == "numpy":
                    t = _cpu(loops[name], *operands[name])
                else:
                    k = single[name] if variant.endswith("1") else kernel
                    t = _cpu(functools.partial(simulate, k, operands[name], {},
                                               checks_spec=variant.rstrip("1")))
                times[name, variant].append(t)

    us, us1 = 1e6 / n, 1e6 / (n - 1)
    print(f"{n} instructions per loop, min of {repeats} alternating runs, CPU time "
          f"(us per instruction; the one-iteration loop's time taken out)")
    print(f"{'op':<22}{'numpy':>9}{'nkisim on':>11}{'nkisim off':>12}{'overhead on':>13}"
          f"{'overhead off':>14}   spread on: median (min-max)   off")
    over = {}
    for name in kernels:
        best = {v: min(times[name, v]) for v in variants}
        t_np = best["numpy"] * us
        t_on = (best["all"] - best["all1"]) * us1
        t_off = (best["none"] - best["none1"]) * us1
        over[name] = (t_on - t_np, t_off - t_np)
        spread = []
        for v in ("all", "none"):
            per = sorted((s - s1) * us1 - q * us for s, s1, q in zip(
                times[name, v], times[name, v + "1"], times[name, "numpy"]))
            spread.append(f"{float(np.median(per)):6.1f} ({per[0]:.1f}-{per[-1]:.1f})")
        print(f"{name:<22}{t_np:>9.1f}{t_on:>11.1f}{t_off:>12.1f}{over[name][0]:>13.1f}"
              f"{over[name][1]:>14.1f}   {spread[0]:<22}{spread[1]}")
    on, off = over["nc_matmul"]
    print(f"interpreter overhead: {on:.1f} us/instruction (checks on), {off:.1f} (checks off)")


if __name__ == "__main__":
    main()
