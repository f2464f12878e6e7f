"""How often our valid kernels fail on nkisim: the false-alarm rate of the whole pipeline.

Draws cases as the property tests do (``nkiverify.strategies.kernel_cases``, the hardware
contract), runs the shipped kernel of each family in both dialects on nkisim, and counts the
runs that fail (a wrong tolerance, a lucky baseline, a checker rejecting valid code). Each
failure prints its reason and the command that reproduces it. The shipped kernels are correct
by construction (every stored case and the device-checked course kernels pass), so every
failure here is a false alarm a user's correct kernel could hit too.

    python benchmarks/false_alarms.py                       # conv2d, 500 cases, fp32
    python benchmarks/false_alarms.py --kernel conv2d --examples 1500 --dtypes float32,bfloat16

Last line: ``false alarms: F of R runs (P%)``. Measured 2026-11-28 on an AVX-512 Xeon
(conv2d, fp32, 1,500 cases = 3,000 runs, 63-74 s): 24 before the conv2d baseline summed in the
PE array's order (all baseline checks, 1x1 filters on small outputs), 0 after; 0 of 2,000
fp16/bf16 runs; 0 of 1,200 runs for each of naive, tiled, stream and transpose (200 cases x 3
dtypes).
"""

import argparse
import collections
import sys
import time

from hypothesis import HealthCheck, Phase, given, seed, settings

from nkiverify import registry, strategies
from nkiverify._util import reproduce_command
from nkiverify.backends import get_backend

KERNELS = ("naive", "tiled", "stream", "transpose", "conv2d")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=KERNELS, default="conv2d")
    ap.add_argument("--examples", type=int, default=500, help="cases per dtype (default 500)")
    ap.add_argument("--dtypes", default="float32", help="comma-separated (default float32)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    ap.add_argument("--target", default="trn2", choices=("trn1", "trn2"))
    args = ap.parse_args(argv)

    backend = get_backend("nkisim", args.target)
    family = registry.spec_for(args.kernel)
    specs = [family.for_dialect(d) for d in ("beta1", "nki")]
    reasons = collections.Counter()
    runs = 0
    t0 = time.perf_counter()

    for dtype in args.dtypes.split(","):
        @seed(args.seed)
        @settings(max_examples=args.examples, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=strategies.kernel_cases(args.kernel, dtype=dtype, target=args.target,
                                            contract="hardware"))
        def run(case):
            nonlocal runs
            for spec in specs:
                runs += 1
                if runs % 200 == 0:
                    print(f"  ... {runs} runs, {sum(reasons.values())} failed, "
                          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
                try:
                    outcome = registry.run_case(spec, case.params, case.dtype, backend,
                                                seed=case.seed, dist=case.dist)
                except Exception as exc:           # noqa: BLE001 -- counted and shown
                    reason = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                else:
                    if outcome.passed:
                        continue
                    lines = outcome.comparison.message().splitlines()
                    reason = lines[1].strip() if len(lines) > 1 else lines[0]
                kind = reason.split(":")[0] if "baseline" not in reason else "baseline check"
                reasons[kind] += 1
                print(f"FAIL [{spec.dialect}] {case.id} {case.dtype} ({case.dist}): {reason}")
                print("  reproduce: " + reproduce_command(
                    spec.name, case.params, case.dtype, case.seed, case.dist, None,
                    args.target, dialect=spec.dialect))
        run()

    failed = sum(reasons.values())
    print(f"{args.kernel}, {args.dtypes}, {args.examples} cases per dtype, both dialects, "
          f"{time.perf_counter() - t0:.0f} s; by reason: {dict(reasons) or 'none'}")
    print(f"false alarms: {failed} of {runs} runs ({100 * failed / max(runs, 1):.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
