"""Estimated trn2 latency of ``kernels.conv2d.fused_conv2d_maxpool`` on the course's performance
configurations, against the course thresholds (docs/cs149-assignment.md §2).

    python benchmarks/conv2d_perf.py [--target trn2] [--summary] [--only fp16]

Each configuration runs once on nkisim (so the inputs are real and the outputs are checked against
a float64 NumPy golden on a few channels); the trace is scheduled by the cost model
(``nkisim.runtime.estimate``). The table shows the estimate, the course's "optimized" threshold
(full credit; the course measures p99 ``nc_latency`` on a trn2.3xlarge), the model's MFU (as
neuron-profile defines it: fp32 matmuls count at the bf16 peak, so fp32 tops out at 25%, 21.8%
on trn2 where an fp32 matmul takes 4596 / 1002 x the bf16 time, see nkisim.cost), the MFU as
the CS149-era profiler GUI showed it (GUI: fp32 matmuls counted twice,
``Schedule.mfu_profile_gui``), the busiest engine, how long the simulation itself took, and the
reason for the gap to the PE array's peak (``gap_reason``). The course harness benchmarks
without ``--profile``, i.e. on trn2's hardware DGE path, as here.

Single-threaded BLAS: nkisim issues thousands of small (128x128 by 128x512) GEMMs; a multithreaded
OpenBLAS on a small or busy machine spends far more time synchronizing its threads than computing
them (10x slower here), so unless the caller chose otherwise we pin it to one thread.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import nkisim.shim  # noqa: E402

nkisim.shim.install()

from kernels.conv2d import fused_conv2d_maxpool  # noqa: E402
from nkisim.runtime import estimate, last_run  # noqa: E402

# (dtype, image height) -> the course's optimized threshold in us (cs149 §2, final harness);
# the same with and without max pool.
THRESHOLDS_US = {
    ("float32", 224): 4596.0,
    ("float16", 224): 1002.0,
    ("float32", 32): 110.0,
    ("float16", 32): 84.0,
}
# the harness's performance configurations: B=1, 256 -> 256 channels, 3x3 filter;
# main tests 224x224, extra credit 32x16; pool 1 and 2; float32 and float16
CONFIGS = [(dtype, h, w, pool)
           for (h, w) in ((224, 224), (32, 16))
           for pool in (1, 2)
           for dtype in ("float16", "float32")]


def golden_channels(X, W, bias, pool, channels):
    """float64 conv + bias + max pool of output ``channels`` only (a spot check)."""
    x = X.astype(np.float64)
    w = W[channels].astype(np.float64)
    k = W.shape[2]
    oh, ow = X.shape[2] - k + 1, X.shape[3] - k + 1
    out = np.zeros((X.shape[0], len(channels), oh, ow))
    for di in range(k):
        for dj in range(k):
            out += np.einsum("oc,bchw->bohw", w[:, :, di, dj], x[:, :, di:di + oh, dj:dj + ow],
                             optimize=True)
    out += bias[channels].astype(np.float64)[None, :, None, None]
    ph, pw = oh // pool, ow // pool
    return out[:, :, :ph * pool, :pw * pool].reshape(
        X.shape[0], len(channels), ph, pool, pw, pool).max(axis=(3, 5))


def run(dtype, h, w, pool, *, target, seed=0, summary=False):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    # the harness's inputs: np.random.rand(...).astype(dtype), bias random
    X = rng.random((1, 256, h, w), dtype=np.float32).astype(dt)
    W = rng.random((256, 256, 3, 3), dtype=np.float32).astype(dt)
    bias = rng.random(256, dtype=np.float32).astype(dt)
    kernel = fused_conv2d_maxpool
    if target:
        from neuronxcc import nki
        kernel = nki.jit(fused_conv2d_maxpool, platform_target=target)
    t0 = time.perf_counter()
    out = kernel(X, W, bias, pool_size=pool)
    wall = time.perf_counter() - t0
    sched, us = estimate(last_run())
    channels = np.array([0, 129, 255])
    ref = golden_channels(X, W, bias, pool, channels)
    got = out[:, channels].astype(np.float64)
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    if summary:
        print(sched.format_summary())
    return us, sched, wall, rel


def gap_reason(sched) -> str:
    """Why the estimate is above the PE array's peak (MFU 100%), from the schedule."""
    total = sched.total_ns
    pe = sched.engine_busy_ns.get("tensor", 0.0) / total
    launch = sched.launch_ns / total
    parts = []
    if sched.adjusted_flops > sched.model_flops * 1.01:
        f = sched.params.fp32_matmul_factor
        if f == 4.0:
            parts.append("fp32: 4 PE passes per matmul (MFU ceiling 25%)")
        else:
            # NC-v3: 4 documented passes, and 4596 / 1002 x the bf16 time measured (nkisim.cost)
            parts.append(f"fp32: {f:.2f}x the bf16 PE time per matmul (4 passes documented, "
                         f"the rest measured on trn2; MFU ceiling {100 / f:.1f}%)")
    if pe >= 0.9:
        parts.append(f"PE {100 * pe:.0f}% busy; the rest: launch {100 * launch:.0f}% + "
                     "first loads / last stores")
    elif sched.bottleneck in ("tensor", "latency"):
        parts.append(f"PE {100 * pe:.0f}% busy over the total: launch {100 * launch:.0f}%, and "
                     "the first weight/input loads and last stores are a large share of so "
                     "small a problem")
    else:
        parts.append(f"PE {100 * pe:.0f}% busy: bound by {sched.bottleneck}, "
                     f"launch {100 * launch:.0f}%")
    return "; ".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="nkisim target (default: trn2)")
    ap.add_argument("--summary", action="store_true", help="print the schedule summary per row")
    ap.add_argument("--only", default="", help="run only rows whose label contains this")
    args = ap.parse_args(argv)
    hdr = (f"{'config':<28} {'estimate us':>11} {'target us':>9} {'ratio':>6} {'MFU':>6} "
           f"{'GUI':>6} {'bottleneck':>10} {'busy T/V/S/DMA %':>18} {'sim s':>6} {'rel err':>8}  "
           f"gap to peak")
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for dtype, h, w, pool in CONFIGS:
        label = f"{dtype} {h}x{w} pool={pool}"
        if args.only and args.only not in label:
            continue
        us, sched, wall, rel = run(dtype, h, w, pool, target=args.target, summary=args.summary)
        thr = THRESHOLDS_US[(dtype, h)]
        busy = sched.engine_busy_pct
        busy_s = "/".join(f"{busy.get(e, 0.0):.0f}" for e in ("tensor", "vector", "scalar", "dma"))
        flag = "" if us <= thr else "  OVER"
        ok &= us <= thr
        print(f"{label:<28} {us:>11.1f} {thr:>9.0f} {us / thr:>6.2f} {100 * sched.mfu:>5.1f}% "
              f"{100 * sched.mfu_profile_gui:>5.1f}% "
              f"{sched.bottleneck:>10} {busy_s:>18} {wall:>6.2f} {rel:>8.1e}{flag}  "
              f"{gap_reason(sched)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
