"""Harness-like script (written for nkisim's tests, shaped like the course's Part 2 harness):
``--simulate`` wraps the kernel in a plain function that calls ``nki.simulate_kernel``, and the
performance test benchmarks whatever callable it has with ``nki.benchmark``."""

import argparse

import neuronxcc.nki as nki
import numpy as np
from tiny_kernel import tiny_matmul


def simulate_kernel_wrapper(kernel):
    def wrapped(*args, **kwargs):
        return nki.simulate_kernel(kernel, *args, **kwargs)
    return wrapped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--simulate", action="store_true")
    ap.add_argument("--profile", default=None)
    args = ap.parse_args()
    kernel = tiny_matmul
    if args.simulate:
        kernel = simulate_kernel_wrapper(kernel)
    a = np.random.rand(128, 128).astype(np.float32)
    b = np.random.rand(128, 1024).astype(np.float32)
    out = kernel(a, b)
    assert np.allclose(out, a.T @ b, rtol=1e-4), "wrong result"
    bench_kwargs = {}
    if args.profile:
        bench_kwargs = {"save_neff_name": args.profile + ".neff",
                        "additional_compile_opt": "--disable-dge"}
    bench = nki.benchmark(warmup=5, iters=20, **bench_kwargs)(kernel)
    bench(a, b)
    p99 = bench.benchmark_result.nc_latency.get_latency_percentile(99)
    print(f"Execution Time for student implementation: {p99} us")


if __name__ == "__main__":
    main()
