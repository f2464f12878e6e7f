"""Harness-like script (written for nkisim's tests, shaped like the course's Part 1
run_benchmark.py): with ``--profile_name NAME`` it benchmarks with ``save_neff_name="file.neff"``
and ``save_trace_name=NAME + ".ntff"``, then moves file.neff to NAME.neff with ``mv``."""

import argparse
import subprocess

import neuronxcc.nki as nki
import numpy as np
from tiny_kernel import tiny_matmul


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile_name", default=None)
    args = ap.parse_args()
    a = np.random.rand(128, 128).astype(np.float32)
    b = np.random.rand(128, 512).astype(np.float32)
    if args.profile_name:
        bench = nki.benchmark(tiny_matmul, warmup=1, iters=10, save_neff_name="file.neff",
                              save_trace_name=args.profile_name + ".ntff",
                              additional_compile_opt="--disable-dge")
        bench(a, b)
        subprocess.run(["mv", "file.neff", args.profile_name + ".neff"], check=True)
    else:
        bench = nki.benchmark(tiny_matmul, warmup=1, iters=10)
        bench(a, b)
    print(f"Execution Time: {bench.benchmark_result.nc_latency.get_latency_percentile(99)} us")


if __name__ == "__main__":
    main()
