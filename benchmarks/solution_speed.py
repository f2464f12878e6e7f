"""How fast nkisim simulates real course solutions' conv2d, not only ours (issue 12).

Simulates the conv2d of each checkout given (``--solution DIR``, repeatable; a trn2 checkout's
``part2/conv2d.py`` on trn2, a trn1 one's on trn1, as ``nki-verify course`` picks) on the
course's B=1 256->256 224x224 3x3 configuration with bias, in float32 and float16, and prints
the CPU time (min of ``--repeats`` runs, default 3), the instruction count, the time per
instruction, and our own kernel's figures for comparison. ``--ab`` also times each run with
nkisim's kept operand copies turned off (``nkisim.engines.KEEP_STATIONARIES``: the compact
stationaries, the Tensor Engine transposes and the fp32 mirrors of fp16 tiles), alternating.
Nothing from the checkouts is copied; without ``--solution`` only our kernel is timed.

    python benchmarks/solution_speed.py --solution ~/asst4-trainium2 --solution ~/asst4-trainium
        [--dtypes float32,float16] [--repeats 3] [--ab]
"""

from __future__ import annotations

import argparse
import os
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")      # before NumPy loads its BLAS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--solution", action="append", default=[], metavar="DIR",
                   help="a course checkout (its part2/conv2d.py); repeatable")
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ab", action="store_true",
                   help="also time each run without the kept operand copies (stationaries, "
                        "transposes, fp16 mirrors)")
    args = p.parse_args()

    from nkisim import engines
    from nkisim.runtime import last_run
    from nkiverify import registry
    from nkiverify.backends import NkisimBackend
    from nkiverify.cli import course_target

    runs = [("ours (kernels/conv2d.py)", registry.get("conv2d").import_path, "trn2")]
    for d in args.solution:
        path = os.path.join(d, "part2", "conv2d.py")
        if not os.path.isfile(path):
            print(f"skipped {d}: no part2/conv2d.py there")
            continue
        target, _ = course_target(os.path.abspath(d), None)
        runs.append((os.path.basename(os.path.normpath(d)), f"{path}:fused_conv2d_maxpool",
                     target))
    if len(runs) == 1:
        print("no --solution given: timing our kernel only")
    spec = registry.get("conv2d")
    params = {"batch": 1, "c_in": 256, "c_out": 256, "height": 224, "width": 224, "k": 3,
              "pool": 1, "bias": True}
    modes = (True, False) if args.ab else (True,)
    print(f"conv2d B=1 256->256 224x224 3x3 bias; CPU s, min of {args.repeats}")
    print(f"{'kernel':<32}{'target':<8}{'dtype':<9}{'instr':>7}{'CPU s':>8}{'us/instr':>9}"
          + (f"{'copies off':>12}" if args.ab else ""))
    for label, where, target in runs:
        backend = NkisimBackend(target=target)
        kernel = backend.load(where)
        for dt in args.dtypes.split(","):
            inputs = spec.inputs(params, registry.dtype_of(dt), seed=0)
            best = {m: float("inf") for m in modes}
            n = 0
            try:
                for _ in range(max(1, args.repeats)):
                    for keep in modes:          # alternating: a shared machine drifts
                        engines.KEEP_STATIONARIES = keep
                        t0 = time.process_time()
                        backend.run(kernel, *inputs.args, **inputs.kwargs)
                        best[keep] = min(best[keep], time.process_time() - t0)
                        n = len(last_run().trace)
            finally:
                engines.KEEP_STATIONARIES = True
            print(f"{label:<32}{target:<8}{dt:<9}{n:>7}{best[True]:>8.2f}"
                  f"{1e6 * best[True] / n:>9.0f}"
                  + (f"{best[False]:>12.2f}" if args.ab else ""))


if __name__ == "__main__":
    main()
