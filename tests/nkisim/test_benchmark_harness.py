"""nki.benchmark / nki.profile of any callable, and the files course scripts expect.

The course harness's ``--simulate`` mode benchmarks a plain function that calls
``nki.simulate_kernel``; run_benchmark.py ``--profile_name`` moves ``file.neff`` after the
benchmark. The scripts in ``harness_like/`` are written for these tests in the shape of those
scripts and run unchanged under ``nkisim run``.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.join(os.path.dirname(__file__), "harness_like")


def _nkisim_run(script, *args, cwd=None):
    env = {**os.environ, "NKISIM_QUIET": "1"}
    r = subprocess.run([sys.executable, "-m", "nkisim.cli", "run", os.path.join(HERE, script),
                        *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _kernel():
    sys.path.insert(0, HERE)
    try:
        import nkisim.shim
        nkisim.shim.install()
        from tiny_kernel import tiny_matmul
    finally:
        sys.path.remove(HERE)
    return tiny_matmul


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.random((128, 128), dtype=np.float32), rng.random((128, 1024), dtype=np.float32))


def _direct_estimate(**opts):
    from nkisim.runtime import benchmark
    b = benchmark(warmup=1, iters=1, **opts)(_kernel())
    b(*_inputs())
    return b.benchmark_result.nc_latency.get_latency_percentile(99)


def test_simulate_path_prints_the_kernel_estimate():
    direct = _direct_estimate()
    out_sim = _nkisim_run("perf_harness.py", "--simulate")
    out_dev = _nkisim_run("perf_harness.py")
    val = [float(line.split(":")[1].split()[0]) for line in (out_sim, out_dev)
           for line in line.splitlines() if line.startswith("Execution Time")]
    assert len(val) == 2
    # the wrapper is charged the kernel it launches: the same estimate as the kernel itself,
    # not the launch overhead alone
    assert val[0] == pytest.approx(direct, rel=1e-9)
    assert val[1] == pytest.approx(direct, rel=1e-9)


def test_profile_name_runs_through(tmp_path):
    out = _nkisim_run("run_bench.py", "--profile_name", "prof", cwd=tmp_path)
    assert "Execution Time" in out
    assert not (tmp_path / "file.neff").exists()           # moved by the script's `mv`
    neff = json.loads((tmp_path / "prof.neff").read_text())
    assert neff["kernels"] == ["tiny_matmul"]
    assert neff["additional_compile_opt"] == "--disable-dge"
    est = float(out.split("Execution Time:")[1].split()[0])
    assert neff["estimated_latency_us"] == pytest.approx(est)
    trace = json.loads((tmp_path / "prof.ntff").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "nc_matmul" in names and "tiny_matmul" in names


def test_every_launch_inside_a_callable_is_charged():
    from neuronxcc import nki
    k = _kernel()
    one = _direct_estimate()

    def twice(a, b):
        nki.simulate_kernel(k, a, b)
        return k(a, b)

    bench = nki.benchmark(warmup=1, iters=1)(twice)
    out = bench(*_inputs())
    a, b = _inputs()
    np.testing.assert_allclose(out, a.T @ b, rtol=1e-4)
    res = bench.benchmark_result
    assert len(res.schedules) == 2
    assert res.nc_latency.get_latency_percentile(99) == pytest.approx(2 * one, rel=1e-9)


def test_benchmark_options_reach_kernels_launched_inside_a_callable():
    from neuronxcc import nki
    k = _kernel()
    desc = _direct_estimate(additional_compile_opt="--disable-dge")
    trn1 = _direct_estimate(platform_target="trn1")
    assert desc != pytest.approx(_direct_estimate())      # the DMA path changes the estimate

    def wrapped(a, b):
        return nki.simulate_kernel(k, a, b)

    for opts, want in (({"additional_compile_opt": "--disable-dge"}, desc),
                       ({"platform_target": "trn1"}, trn1)):
        bench = nki.benchmark(warmup=1, iters=1, **opts)(wrapped)
        bench(*_inputs())
        assert bench.benchmark_result.nc_latency.get_latency_percentile(99) == \
            pytest.approx(want, rel=1e-9)


def test_a_callable_that_launches_nothing_is_refused():
    from neuronxcc import nki
    bench = nki.benchmark(warmup=1, iters=1)(lambda a, b: a @ b)
    with pytest.raises(RuntimeError, match="launched no NKI kernel"):
        bench(*_inputs())


def test_an_undecorated_kernel_is_simulated_as_a_kernel():
    from neuronxcc import nki
    k = _kernel()
    bench = nki.benchmark(warmup=1, iters=1)(k.func)       # the plain Python function
    bench(*_inputs())
    assert bench.benchmark_result.nc_latency.get_latency_percentile(99) == \
        pytest.approx(_direct_estimate(), rel=1e-9)


def test_profile_of_a_wrapper_writes_the_kernels_timeline(tmp_path):
    from neuronxcc import nki
    k = _kernel()
    prof = nki.profile(working_directory=str(tmp_path), save_trace_name="w.ntff")(
        lambda a, b: nki.simulate_kernel(k, a, b))
    prof(*_inputs())
    trace = json.loads((tmp_path / "w.json").read_text())
    assert "nc_matmul" in {e.get("name") for e in trace["traceEvents"]}


ROW_COPIES = '''
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def row_copies(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(a.shape[0]):
        t = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=a[m:m + 1, :], dst=t)
        nisa.dma_copy(src=t, dst=out[m:m + 1, :])
    return out
'''


@pytest.mark.parametrize("target", ["trn2", "trn1"])
def test_a_dge_bound_estimate_comes_with_its_disable_dge_range(tmp_path, target, capsys):
    # 1,024 tiny DMAs: on trn2's default (hardware DGE) path their issue, ~600 ns each, is
    # the whole latency; the note gives the --disable-dge estimate beside it. trn1 has no DGE.
    import types

    import nkisim.shim
    from nkisim import runtime
    nkisim.shim.install()
    mod = types.ModuleType("row_copies_kernel")
    exec(compile(ROW_COPIES, str(tmp_path / "row_copies.py"), "exec"), mod.__dict__)
    a = np.arange(512 * 4, dtype=np.float32).reshape(512, 4)
    out = runtime.simulate(mod.row_copies, (a,), {}, target=target)
    np.testing.assert_array_equal(out, a)
    run = runtime.last_run()
    sched, us = runtime.estimate(run)
    note = runtime.dge_range_note(run, sched)
    if target == "trn1":
        assert note is None
        return
    _, us_descriptors = runtime.estimate(run, "--disable-dge")
    assert us > 1024 * 0.45 and us_descriptors < us / 2   # issue-bound against overlapped
    assert note is not None and f"--disable-dge: {us_descriptors:.1f} us" in note
    assert note.startswith("bound by hardware-DGE DMA issue")
    # a compute-bound kernel gets no note
    runtime.simulate(_kernel(), _inputs(), {}, target="trn2")
    run = runtime.last_run()
    assert runtime.dge_range_note(run, runtime.estimate(run)[0]) is None
    # nki.benchmark says it on stderr, beside the course's table
    runtime.benchmark(warmup=1, iters=1)(mod.row_copies)(a)
    assert "--disable-dge" in capsys.readouterr().err


def test_a_busy_dge_that_is_not_the_bound_is_not_called_the_bound():
    # three DMAs (the naive vector add): the DGE issues them back to back, busy most of the
    # short body, but the descriptor path's fixed DMA latency is no faster: no "bound by"
    from nkisim import runtime
    from nkisim.beta1 import jit
    from nkisim.beta1 import language as nl

    def naive(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(b)))
        return out

    a = np.ones((128, 1), np.float32)
    runtime.simulate(jit(naive), (a, a), {}, target="trn2")
    run = runtime.last_run()
    sched, us = runtime.estimate(run)
    note = runtime.dge_range_note(run, sched)
    _, us_descriptors = runtime.estimate(run, "--disable-dge")
    assert us_descriptors >= us
    assert note is not None and not note.startswith("bound by")
    assert note.startswith("Hardware-DGE DMA issue (") and "though not the bound" in note
