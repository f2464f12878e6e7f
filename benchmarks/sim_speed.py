"""Simulation and verification speed on the course's large conv2d, stage by stage (issue 12).

Verifies ``fused_conv2d_maxpool`` on B images of 256 -> 256 channels, 224x224, 3x3 (default
float32, B=4: the course's large-image correctness configuration) through the same pipeline as
``nki-verify`` (``nkiverify.registry``: inputs, nkisim backend, golden, baseline, compare) and
reports each stage's CPU time, and, computed in the same run, the NumPy lower bound of the
simulation: the trace's own instructions replayed as the same NumPy operations in a tight loop
(every matmul ``matmul(a.T, b, out=tmp); acc += tmp`` or straight into PSUM, every DMA and
engine op a copy/add of the same size, on preallocated contiguous buffers). Peak RSS at the end.

    python benchmarks/sim_speed.py [--batch 4] [--dtype float32] [--checks all|none]
        [--schedule] [--no-verify] [--repeats N]

Targets (issue 12): simulation <= 1.3x the lower bound (B=1 fp32); simulate + golden + baseline
+ compare <= 2x simulation alone and peak RSS <= 1.5 GiB (B=4 fp32). The baseline is computed as
the pipeline does, only when the comparison asks for it (0 otherwise): first on a band of rows
(``registry.BASELINE_SAMPLE``), on the whole output only when the band does not decide; its
row counts both. CPU time (process time)
is used because the machine is shared; BLAS is single-threaded as in nkisim's simulation.
``--repeats N`` verifies the case N times and reports each stage's minimum (the method of
issue 12's own figures: a shared machine's interruptions only ever add time; on the 2-core
VMs single runs of the same code spread by 30%), then each run's ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")      # before NumPy loads its BLAS

import numpy as np  # noqa: E402


class _Stage:
    """CPU and wall time of a block."""

    def __init__(self, name, times):
        self.name, self.times = name, times

    def __enter__(self):
        self.c0, self.w0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.times[self.name] = (time.process_time() - self.c0, time.perf_counter() - self.w0)


def numpy_lower_bound(trace) -> float:
    """CPU seconds of the trace's instructions as plain NumPy operations (see module doc)."""
    bufs = {}

    def buf(key, shape):
        b = bufs.get((key, shape))
        if b is None:
            b = bufs[key, shape] = np.ones(shape, np.float32)
        return b

    plan = []
    for ins in trace.instrs:
        d = ins.detail
        if ins.op == "nc_matmul" and not d.get("transpose"):
            K, M, N = d["K"], d["M"], d["N"]
            a, b, out = buf("a", (K, M)), buf("b", (K, N)), buf("out", (M, N))
            if d.get("accumulate"):
                plan.append((np.matmul, (a.T, b), buf("tmp", (M, N)), out))
            else:
                plan.append((np.matmul, (a.T, b), out, None))
        elif ins.op in ("nc_transpose", "nc_matmul"):
            K, M = d.get("K", ins.partitions), d.get("M", ins.free)
            plan.append((np.copyto, (buf("t", (M, K)), buf("src", (K, M)).T), None, None))
        elif ins.op == "dma_copy":
            n = max(1, d.get("bytes", 4) // 4)
            plan.append((np.copyto, (buf("dma_dst", (n,)), buf("dma_src", (n,))), None, None))
        else:
            shape = (ins.partitions, max(1, ins.free))
            plan.append((np.add, (buf("x", shape), buf("y", shape)), buf("z", shape), None))
    t0 = time.process_time()
    for fn, args, out, acc in plan:
        if out is None:
            fn(*args)
        else:
            fn(*args, out=out)
            if acc is not None:
                np.add(acc, out, out=acc)
    return time.process_time() - t0


def one_run(args, spec, params, dtype, backend, kernel):
    """One verification of the case, stage by stage: (times, instruction count, estimated
    latency or None, comparison or None); ``times`` maps a stage to (CPU s, wall s)."""
    from nkisim.runtime import last_run
    from nkiverify import registry
    from nkiverify.compare import compare

    times = {}
    inputs = spec.inputs(params, dtype, seed=0)
    with _Stage("simulate", times):
        out = backend.run(kernel, *inputs.args, **inputs.kwargs)
    run = last_run()
    n_instr = len(run.trace)
    with _Stage("numpy lower bound", times):
        lower = numpy_lower_bound(run.trace)
    times["numpy lower bound"] = (lower, times["numpy lower bound"][1])
    us = None
    if args.schedule:
        from nkisim.runtime import estimate
        with _Stage("schedule", times):
            _, us = estimate(run)
    del run
    result = None
    if not args.no_verify:
        # as nkiverify.registry.run_case does it: the golden and its scale, then the comparison,
        # which asks for the baseline only when it could change the verdict (for fp32 outputs
        # of a long reduction it does; for 16-bit ones usually not)
        with _Stage("golden", times):
            expected = registry.Expected(spec, dtype, inputs)
        times["baseline"] = (0.0, 0.0)

        def timed(fn):
            def run():
                with _Stage("b", part):
                    value = fn()
                c, w = times["baseline"]
                times["baseline"] = (c + part["b"][0], w + part["b"][1])
                return value
            return run
        part = {}
        sample = expected.baseline_sample
        with _Stage("compare", times):
            result = compare(out, expected.golden, dtype,
                             reduction_length=spec.reduction_length(params),
                             scale=expected.scale, baseline=timed(expected.baseline),
                             baseline_sample=None if sample is None else timed(sample))
        cpu, wall = times["compare"]
        times["compare"] = (cpu - times["baseline"][0], wall - times["baseline"][1])
    return times, n_instr, us, result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--checks", default=None, help="NKISIM_CHECKS spec (default: all checks)")
    p.add_argument("--schedule", action="store_true", help="also time the latency schedule")
    p.add_argument("--no-verify", action="store_true", help="simulate and lower bound only")
    p.add_argument("--repeats", type=int, default=1,
                   help="whole runs; each stage's minimum over them is reported (default 1)")
    args = p.parse_args()
    if args.checks is not None:
        os.environ["NKISIM_CHECKS"] = args.checks

    from nkiverify import registry
    from nkiverify.backends import NkisimBackend

    spec = registry.get("conv2d")
    C, H = args.channels, args.size
    params = {"batch": args.batch, "c_in": C, "c_out": C, "height": H, "width": H, "k": 3,
              "pool": 1, "bias": True}
    dtype = registry.dtype_of(args.dtype)
    backend = NkisimBackend()
    kernel = backend.load(spec.import_path)
    runs = []
    for _ in range(max(1, args.repeats)):
        times, n_instr, us, result = one_run(args, spec, params, dtype, backend, kernel)
        runs.append(times)
    # every stage's minimum over the runs (a shared machine only ever adds time), and each
    # run's own ratios next to it
    times = {stage: tuple(min(t[stage][k] for t in runs) for k in (0, 1)) for stage in runs[0]}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20      # KiB -> GiB

    def verification_ratio(t):
        total = sum(t[s][0] for s in ("simulate", "golden", "baseline", "compare"))
        return total, total / t["simulate"][0]

    print(f"conv2d B={args.batch} {C}->{C} {H}x{H} 3x3 {registry.dtype_name(dtype)}, "
          f"checks={os.environ.get('NKISIM_CHECKS', 'all')}; {n_instr} instructions"
          + (f"; min of {len(runs)} runs" if len(runs) > 1 else ""))
    print(f"{'stage':<20}{'CPU s':>8}{'wall s':>8}")
    for name, (cpu, wall) in times.items():
        print(f"{name:<20}{cpu:>8.2f}{wall:>8.2f}")
    sim = times["simulate"][0]
    lower = times["numpy lower bound"][0]
    print(f"simulation: {1e6 * sim / n_instr:.0f} us/instruction, "
          f"{1e6 * (sim - lower) / n_instr:.0f} us over NumPy")
    if args.schedule:
        print(f"schedule: {100 * times['schedule'][0] / sim:.1f}% of simulation; "
              f"estimated latency {us:.0f} us")
    if len(runs) > 1:
        print("each run: simulation/lower bound "
              + ", ".join(f"{t['simulate'][0] / t['numpy lower bound'][0]:.2f}" for t in runs)
              + ("" if args.no_verify else "; verification/simulation "
                 + ", ".join(f"{verification_ratio(t)[1]:.2f}" for t in runs)))
    if not args.no_verify:
        print(f"verdict: {'passed' if result.passed else 'FAILED'}; max ULP error "
              f"{result.stats.ulp.max:.3g}; baseline "
              + ("not needed" if result.baseline_stats is None else
                 f"on {result.baseline_stats.n} elements"
                 + (" (a sample)" if result.baseline_sampled else "")))
        total, ratio = verification_ratio(times)
        print(f"verification/simulation CPU ratio: {ratio:.2f} "
              f"(simulate + golden + baseline + compare = {total:.2f} s)")
    print(f"peak RSS: {peak:.2f} GiB")
    print(f"simulation/numpy lower bound CPU ratio: {sim / lower:.2f}")


if __name__ == "__main__":
    main()
