"""Each shipped kernel in both NKI dialects on nkisim's cost model: the current-``nki`` twin must be
at least as fast as its Beta 1 original (issue #11).

    python benchmarks/dialect_perf.py [--target trn2] [--quick] [--cases PATTERN]

For every case of fixtures/configs.py (the course's configurations and our extra ones; the run in
the case's first dtype) the Beta 1 kernel (``kernels/*.py``) and its ``nki`` twin
(``kernels/*_nki.py``) run once on nkisim through ``nkiverify``'s nkisim backend, their outputs
are checked against the float64 golden model, and the cost model schedules each trace
(``nkisim.runtime.estimate``). The table shows both estimates and their ratio; the last line says
how many twins are slower than their original (the exit status is 1 if any is, or if a case
fails its golden check). ``--quick`` leaves out the slow (large) cases.

BLAS runs single-threaded, as in benchmarks/conv2d_perf.py: nkisim's many small GEMMs only lose
time to thread synchronisation.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import fnmatch  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from nkiverify.fixtures.configs import CASES  # noqa: E402

from nkiverify import registry  # noqa: E402
from nkiverify.backends import get_backend  # noqa: E402


def measure(backend, spec, case, dtype):
    """(estimated µs, passed, seconds simulated) of one case of ``spec``."""
    inputs = spec.inputs(case.params, dtype, seed=registry.case_seed(case.id, dtype),
                         dist=case.dist)
    kernel = backend.load(spec.import_path)
    t0 = time.perf_counter()
    out, _, us = backend.estimate(kernel, inputs.args, inputs.kwargs)
    wall = time.perf_counter() - t0
    ok = registry.check_output(spec, case.params, dtype, inputs, out).passed
    return us, ok, wall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=os.environ.get("NKISIM_TARGET", "trn2"))
    p.add_argument("--quick", action="store_true", help="leave out the slow (large) cases")
    p.add_argument("--cases", metavar="PATTERN", help="glob over case ids (e.g. 'conv2d-*')")
    args = p.parse_args(argv)
    backend = get_backend("nkisim", target=args.target)
    rows, slower, failed = [], 0, 0
    for case in CASES:
        if args.quick and case.slow:
            continue
        if args.cases and not fnmatch.fnmatchcase(case.id, args.cases):
            continue
        dtype = case.dtypes[0]
        spec = registry.get(case.kernel)
        b_us, b_ok, b_s = measure(backend, spec.for_dialect("beta1"), case, dtype)
        n_us, n_ok, n_s = measure(backend, spec.for_dialect("nki"), case, dtype)
        ratio = n_us / b_us
        slower += ratio > 1.0 + 1e-9
        failed += (not b_ok) + (not n_ok)
        rows.append((case.id, dtype, f"{b_us:.2f}", f"{n_us:.2f}", f"{ratio:.4f}",
                     ("ok" if b_ok else "FAIL") + "/" + ("ok" if n_ok else "FAIL"),
                     f"{b_s:.1f}/{n_s:.1f}"))
        print(f"  {case.id} {dtype}: beta1 {b_us:.2f} us, nki {n_us:.2f} us", file=sys.stderr)
    head = ("case", "dtype", "beta1 us", "nki us", "nki/beta1", "golden", "simulated s")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print(f"nkisim cost model, target {args.target}")
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))))
    print(f"{len(rows)} cases: {slower} nki twins slower than their Beta 1 original, "
          f"{failed} golden-check failures")
    return 1 if slower or failed else 0


if __name__ == "__main__":
    sys.exit(main())
