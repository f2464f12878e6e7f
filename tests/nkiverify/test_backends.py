"""nkiverify.backends: one interface over nkisim, neuronx-cc's simulator and a device.

The device and neuronx-cc plumbing is tested against a fake ``neuronxcc`` package whose
``baremetal``/``benchmark``/``simulate_kernel`` record how they are called: injected into
``sys.modules``, and as a package on ``sys.path`` (what a trn2 instance looks like to Python).
"""

import sys
import types

import numpy as np
import pytest

import nkisim.runtime
from nkisim import shim
from nkiverify import backends, registry
from nkiverify.backends import DeviceBackend, NeuronxccBackend, NkisimBackend, get_backend

# ---- a fake neuronxcc ---------------------------------------------------------------------

FAKE_NKI = '''
"""A fake neuronxcc.nki that records calls (tests/nkiverify/test_backends.py)."""
CALLS = []


def jit(func=None, **kwargs):
    return func if func is not None else (lambda f: f)


class compiler:
    @staticmethod
    def skip_middle_end_transformations(func=None):
        return func


def baremetal(kernel=None, **kwargs):
    CALLS.append(("baremetal", kernel, kwargs))

    def run(*args, **kw):
        CALLS.append(("baremetal-call", args, kw))
        return "device-output"
    return run


class _Latency:
    def get_latency_percentile(self, percentile):
        CALLS.append(("percentile", percentile))
        return 100.0 + percentile


class _Result:
    nc_latency = _Latency()


def benchmark(kernel=None, **kwargs):
    CALLS.append(("benchmark", kernel, kwargs))

    def wrap(k):
        class Bench:
            def __call__(self, *args, **kw):
                CALLS.append(("benchmark-call", k, args, kw))
                self.benchmark_result = _Result()
        return Bench()
    return wrap


def simulate_kernel(kernel, *args, **kwargs):
    CALLS.append(("simulate_kernel", kernel, args, kwargs))
    return "simulated-output"
'''


def _fake_modules():
    pkg = types.ModuleType("neuronxcc")
    pkg.__path__ = []
    nki = types.ModuleType("neuronxcc.nki")
    exec(compile(FAKE_NKI, "fake_nki", "exec"), nki.__dict__)
    pkg.nki = nki
    return pkg, nki


@pytest.fixture
def fake_in_sys_modules(monkeypatch):
    """A fake real neuronx-cc in sys.modules (as after `import neuronxcc` on a trn2)."""
    pkg, nki = _fake_modules()
    monkeypatch.setitem(sys.modules, "neuronxcc", pkg)
    monkeypatch.setitem(sys.modules, "neuronxcc.nki", nki)
    return nki


@pytest.fixture
def device_file(tmp_path):
    path = tmp_path / "neuron0"
    path.write_text("")
    return str(path)


@pytest.fixture
def trn2_like(tmp_path, monkeypatch):
    """A process where `import neuronxcc` finds a (fake) real package on sys.path and the shim
    is not installed; everything is restored afterwards."""
    root = tmp_path / "site"
    (root / "neuronxcc" / "nki").mkdir(parents=True)
    (root / "neuronxcc" / "__init__.py").write_text("")
    (root / "neuronxcc" / "nki" / "__init__.py").write_text(FAKE_NKI)
    for sub in ("language", "isa"):
        (root / "neuronxcc" / "nki" / f"{sub}.py").write_text("")
    saved = {n: m for n, m in sys.modules.items() if n.split(".")[0] == "neuronxcc"}
    was_installed = shim.installed()
    shim.uninstall()
    for name in saved:
        sys.modules.pop(name, None)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(backends, "_PRIVATE", {})
    monkeypatch.setattr(backends, "_FLAVOR_MODULES", {})
    try:
        yield root
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "neuronxcc"]:
            del sys.modules[name]
        if was_installed:
            shim.install(force=True)
            for name in [n for n in sys.modules if n.split(".")[0] == "neuronxcc"]:
                del sys.modules[name]
        sys.modules.update(saved)


# ---- nkisim -------------------------------------------------------------------------------

def test_nkisim_backend_runs_a_kernel_on_its_target():
    b = NkisimBackend(target="trn1")
    kernel = b.load("kernels.vector_add:vector_add_stream")
    a = np.arange(256, dtype=np.float32)
    out = b.run(kernel, a, 2 * a)
    np.testing.assert_array_equal(out, 3 * a)
    assert b.last_run.arch.name == "trn1"
    assert NkisimBackend(target="trn2").target == "trn2"


def test_nkisim_backend_release_forgets_the_last_run():
    b = NkisimBackend()
    kernel = b.load("kernels.vector_add:vector_add_stream")
    a = np.arange(256, dtype=np.float32)
    b.run(kernel, a, a)
    run = b.last_run
    assert nkisim.runtime.last_run() is run and nkisim.runtime._as_kernel(kernel).last_run is run
    b.release()            # nothing keeps the run's HBM tensors (the inputs, the output) alive
    assert b.last_run is None and nkisim.runtime.last_run() is None
    assert nkisim.runtime._as_kernel(kernel).last_run is None
    b.release()            # twice: nothing to do
    b.run(kernel, a, a)    # and the backend still runs
    assert b.last_run is not None


def test_nkisim_backend_rejects_an_unknown_target():
    with pytest.raises(ValueError, match="unknown target"):
        NkisimBackend(target="trn9")


def test_nkisim_benchmark_is_the_cost_model_estimate():
    b = NkisimBackend(target="trn2")
    kernel = b.load("kernels.transpose:matrix_transpose")
    a = np.ones((256, 128), dtype=np.float32)
    us = b.benchmark(kernel, (a,), {}, warmup=5, iters=20)
    _, expected = nkisim.runtime.estimate(b.last_run)
    assert us == pytest.approx(expected) and us > 0


def test_nkisim_kernels_raise_nki_errors_through_the_backend():
    b = NkisimBackend()
    kernel = b.load("kernels.vector_add:vector_add_naive")
    a = np.ones(256, dtype=np.float32)       # more elements than partitions
    with pytest.raises(Exception, match="128"):
        b.run(kernel, a, a)


def test_get_backend():
    assert isinstance(get_backend("nkisim"), NkisimBackend)
    assert isinstance(get_backend("neuronxcc"), NeuronxccBackend)
    assert isinstance(get_backend("device", target="trn2"), DeviceBackend)
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        get_backend("gpu")


def test_load_reports_a_bad_path():
    b = NkisimBackend()
    with pytest.raises(ValueError, match="module:function"):
        b.load("kernels.vector_add")
    with pytest.raises(ImportError, match="has no function 'nope'"):
        b.load("kernels.vector_add:nope")


# ---- skip reasons -------------------------------------------------------------------------

def test_skip_reasons_say_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(backends, "neuronxcc_available", lambda: False)
    reason = NeuronxccBackend().skip_reason()
    assert "neuronx-cc is not importable" in reason
    missing = str(tmp_path / "neuron0")
    reason = DeviceBackend(device_path=missing).skip_reason()
    assert "neuronx-cc is not importable" in reason and f"{missing} does not exist" in reason
    with pytest.raises(RuntimeError, match="device is not available"):
        DeviceBackend(device_path=missing).load("kernels.vector_add:vector_add_naive")


def test_device_needs_both_the_compiler_and_the_device(monkeypatch, device_file, tmp_path):
    monkeypatch.setattr(backends, "neuronxcc_available", lambda: True)
    assert DeviceBackend(device_path=device_file).skip_reason() is None
    reason = DeviceBackend(device_path=str(tmp_path / "none")).skip_reason()
    assert "neuronx-cc" not in reason and "no Neuron device" in reason
    monkeypatch.setattr(backends, "neuronxcc_available", lambda: False)
    assert "neuronx-cc" in DeviceBackend(device_path=device_file).skip_reason()


def test_without_neuronxcc_here_the_device_is_unavailable():
    # this machine: nkisim's shim serves neuronxcc, there is no real package
    if backends.neuronxcc_available():
        pytest.skip("a real neuronx-cc is installed")
    assert not DeviceBackend().available()
    assert not NeuronxccBackend().available()


# ---- device plumbing with the fake in sys.modules -----------------------------------------

def test_device_run_is_baremetal(fake_in_sys_modules, device_file):
    b = DeviceBackend(device_path=device_file)
    assert b.available()
    kernel = object()
    a = np.ones(4, dtype=np.float32)
    assert b.run(kernel, a, a, pool_size=2) == "device-output"
    calls = fake_in_sys_modules.CALLS
    assert calls[0] == ("baremetal", kernel, {})
    assert calls[1][0] == "baremetal-call" and calls[1][2] == {"pool_size": 2}
    assert calls[1][1][0] is a


def test_device_benchmark_is_p99_of_nc_latency(fake_in_sys_modules, device_file):
    b = DeviceBackend(device_path=device_file)
    kernel = object()
    x = np.zeros(3)
    us = b.benchmark(kernel, (x,), {"pool_size": 1}, warmup=5, iters=20)
    assert us == 199.0 and isinstance(us, float)
    calls = fake_in_sys_modules.CALLS
    assert calls[0] == ("benchmark", None, {"warmup": 5, "iters": 20})
    assert calls[1][0] == "benchmark-call" and calls[1][1] is kernel
    assert calls[1][3] == {"pool_size": 1}
    assert calls[2] == ("percentile", 99)


def test_device_benchmark_defaults_are_the_course_harness(fake_in_sys_modules, device_file):
    DeviceBackend(device_path=device_file).benchmark(object(), ())
    assert fake_in_sys_modules.CALLS[0][2] == {"warmup": 5, "iters": 20}


def test_neuronxcc_backend_uses_simulate_kernel(fake_in_sys_modules):
    b = NeuronxccBackend()
    assert b.available()
    kernel = object()
    assert b.run(kernel, 1, 2, pool_size=2) == "simulated-output"
    assert fake_in_sys_modules.CALLS == [("simulate_kernel", kernel, (1, 2), {"pool_size": 2})]
    with pytest.raises(NotImplementedError, match="no timing model"):
        b.benchmark(kernel, ())


# ---- a trn2-like process: the real package is what `import neuronxcc` gives ---------------

KERNEL_MODULE = '''
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def double(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=a, dst=t)
    r = nisa.tensor_tensor(t, t, op=nl.add)
    nisa.dma_copy(src=r, dst=out)
    return out
'''


def test_trn2_like_nkisim_loads_kernels_privately(trn2_like):
    (trn2_like / "nkv_test_kernel_mod.py").write_text(KERNEL_MODULE)
    import neuronxcc.nki as real
    assert real.__name__ == "neuronxcc.nki" and hasattr(real, "CALLS")   # the fake
    assert backends.neuronxcc_available()

    b = NkisimBackend()
    kernel = b.load("nkv_test_kernel_mod:double")
    a = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
    np.testing.assert_array_equal(b.run(kernel, a), 2 * a)
    # the process still sees the real package, and the shim was not left installed
    assert sys.modules["neuronxcc.nki"] is real
    assert not shim.installed()


def test_trn2_like_device_loads_the_kernel_with_the_real_package(trn2_like):
    (trn2_like / "neuron0").write_text("")
    b = DeviceBackend(device_path=str(trn2_like / "neuron0"))
    assert b.available()
    # kernels.vector_add was imported under nkisim by this test session: the device backend
    # must load it again with the real package
    kernel = b.load("kernels.vector_add:vector_add_stream")
    import neuronxcc.nki as real
    assert not isinstance(kernel, nkisim.runtime.Kernel)     # the fake jit returns the function
    a = np.ones(256, dtype=np.float32)
    assert b.run(kernel, a, a) == "device-output"
    assert real.CALLS[0] == ("baremetal", kernel, {})
    assert b.load("kernels.vector_add:vector_add_stream") is kernel     # cached


def test_run_case_pipeline_on_nkisim():
    b = NkisimBackend()
    outcome = registry.run_case("conv2d", {"batch": 1, "c_in": 128, "c_out": 128, "height": 5,
                                           "width": 6, "k": 3, "bias": True, "pool": 1},
                                "bfloat16", b, seed=3, dist="normal")
    assert outcome.passed, outcome.comparison.message()
    assert outcome.output.shape == (1, 128, 3, 4)
    assert outcome.kernel_s > 0 and outcome.elapsed_s >= outcome.kernel_s
