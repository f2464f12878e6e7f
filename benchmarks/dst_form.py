"""Beta 1's ``t[key] = op(...)`` written straight into ``t[key]`` (``nkisim.dstform``) against
building the result tile and retargeting it (``dstform.ENABLED = False``), on two kernels:

- the trn1 handout's ``vector_add_tiled`` (fixtures/handout.py, ``a_tile[...] =
  nl.load(a_vec[m * ROW_CHUNK : (m + 1) * ROW_CHUNK])``) at ROW_CHUNK=1, n=25600 by default:
  25,600 iterations of two such loads, an add and a store, the instruction-heavy kernel the
  handout has students time;
- ``z[...] = nisa.tensor_tensor(x, y, op=nl.add)`` on (128, 512) fp32 tiles, 1,000 times.

Both paths give the same outputs and trace (tests/nkisim/test_lazy_matmul.py compares them);
this prints the CPU time of each, alternating, the minimum of ``--repeats`` runs, and the ratio.

    python benchmarks/dst_form.py [--n 25600] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")      # before NumPy loads its BLAS

import numpy as np  # noqa: E402

from nkisim import dstform  # noqa: E402
from nkisim.beta1 import isa as nisa  # noqa: E402
from nkisim.beta1 import language as nl  # noqa: E402
from nkisim.beta1 import simulate_kernel  # noqa: E402


def _tensor_tensor_kernel(n):
    def kernel(x, y):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x_t = nl.load(x)
        y_t = nl.load(y)
        z = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        for _ in nl.sequential_range(n):
            z[...] = nisa.tensor_tensor(x_t, y_t, op=nl.add)
        nl.store(out, z)
        return out
    return kernel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=25600, help="vector length (default 25600)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    from nkisim import shim
    shim.install()                  # (the handout's kernels import neuronxcc.nki)
    from nkiverify.fixtures.handout import make_vector_add_tiled_trn1
    rng = np.random.default_rng(0)
    a, b = rng.random(args.n, dtype=np.float32), rng.random(args.n, dtype=np.float32)
    x, y = rng.random((128, 512), dtype=np.float32), rng.random((128, 512), dtype=np.float32)
    cases = {
        f"handout trn1 vector_add_tiled ROW_CHUNK=1 n={args.n}":
            (make_vector_add_tiled_trn1(1), (a, b), a + b, args.n),
        "z[...] = nisa.tensor_tensor (128x512 fp32) x1000":
            (_tensor_tensor_kernel(1000), (x, y), x + y, 1000),
    }
    print(f"CPU seconds, min of {args.repeats} alternating runs")
    for name, (kernel, inputs, want, iters) in cases.items():
        times = {True: [], False: []}
        for _ in range(args.repeats):
            for enabled in (True, False):
                dstform.ENABLED = enabled
                t0 = time.process_time()
                out = simulate_kernel(kernel, *inputs)
                times[enabled].append(time.process_time() - t0)
                np.testing.assert_array_equal(out, want)
        dstform.ENABLED = True
        d, r = min(times[True]), min(times[False])
        print(f"{name}: direct {d:.3f} s ({1e6 * d / iters:.1f} us/iteration), retargeting "
              f"{r:.3f} s ({1e6 * r / iters:.1f}), ratio {d / r:.2f}")


if __name__ == "__main__":
    main()
