"""NKI dialects in nkiverify: our kernels in Beta 1 and in the current ``nki`` dialect, which
dialect a kernel is written in, which dialect each backend runs, and the pytest/CLI options.

The device rules follow issue #11's brief and nki-current.md §1/§2.1: neuronx-cc up to 2.27 runs
Beta 1 kernels on a device; nki 0.3+ runs ``import nki`` kernels called with NumPy arrays; SDK
2.28 (nki 0.2) neither.
"""

import os
import types

import numpy as np
import pytest

from nkiverify import backends, registry
from nkiverify.backends import (
    DeviceBackend,
    NkisimBackend,
    device_dialect_reason,
    device_dialects,
    parse_total_time_us,
)

pytest_plugins = ["pytester"]


# ---- which dialect a kernel is written in ---------------------------------------------------

def test_shipped_kernels_have_a_twin_in_each_dialect():
    for name in ("naive", "tiled", "stream", "transpose", "conv2d"):
        spec = registry.SHIPPED[name]
        beta1, nki = spec.for_dialect("beta1"), spec.for_dialect("nki")
        assert beta1.import_path == spec.import_path and beta1.dialect == "beta1"
        assert nki.import_path.startswith("nkiverify.kernels.") and "_nki:" in nki.import_path
        assert nki.import_path.split(":")[1] == spec.import_path.split(":")[1]   # same name
        assert registry.kernel_dialect(beta1.import_path) == "beta1"
        assert registry.kernel_dialect(nki.import_path) == "nki"
        # the same golden model, inputs and tolerance
        assert (nki.golden, nki.make_inputs, nki.reduction_length) == \
            (spec.golden, spec.make_inputs, spec.reduction_length)


def test_kernel_dialect_reads_a_files_imports(tmp_path):
    cur = tmp_path / "cur.py"
    cur.write_text("import nki\nimport nki.language as nl\n\n@nki.jit\ndef k(a):\n    return a\n")
    old = tmp_path / "old.py"
    old.write_text("from neuronxcc import nki\n\n@nki.jit\ndef k(a):\n    return a\n")
    neither = tmp_path / "neither.py"
    neither.write_text("import numpy as np\n\ndef k(a):\n    return a\n")
    assert registry.kernel_dialect(f"{cur}:k") == "nki"
    assert registry.kernel_dialect(f"{old}:k") == "beta1"
    assert registry.kernel_dialect(f"{neither}:k") is None
    assert registry.kernel_dialect(f"{tmp_path / 'missing.py'}:k") is None


def test_kernel_dialect_of_loaded_kernel_objects():
    backend = NkisimBackend("trn2")
    assert registry.kernel_dialect(
        backend.load("nkiverify.kernels.vector_add_nki:vector_add_tiled")) == "nki"
    assert registry.kernel_dialect(
        backend.load("nkiverify.kernels.vector_add:vector_add_tiled")) == "beta1"


def test_a_users_kernel_is_only_in_its_own_dialect(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("import neuronxcc.nki as nki\n\n@nki.jit\ndef vector_add_tiled(a, b):\n"
                    "    return a\n")
    spec = registry.spec_for(f"{path}:vector_add_tiled")
    assert spec.dialect == "beta1" and spec.for_dialect("beta1").import_path == spec.import_path
    with pytest.raises(registry.DialectMismatch, match="beta1 dialect.*not nki"):
        spec.for_dialect("nki")
    with pytest.raises(ValueError, match="unknown NKI dialect 'nkl'"):
        spec.for_dialect("nkl")


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_nki_twins_pass_their_golden_model_on_nkisim(target):
    # trn1 too: the nki dialect runs on gen2 (nki-current.md: NEURON_PLATFORM_TARGET_OVERRIDE
    # trn1|gen2), where the conv's Scalar-engine tensor_copy does not exist
    backend = NkisimBackend(target)
    conv = {"batch": 1, "c_in": 128, "c_out": 256, "height": 6, "width": 6, "k": 3,
            "bias": True, "pool": 2}
    for name, params in (("naive", {"n": 100}), ("tiled", {"n": 300}), ("stream", {"n": 640}),
                         ("transpose", {"m": 256, "n": 384}), ("conv2d", conv)):
        spec = registry.get(name).for_dialect("nki")
        outcome = registry.run_case(spec, params, "float16", backend, seed=3, dist="normal")
        assert outcome.passed, (name, outcome.comparison.message())


# ---- which dialect the device runs ----------------------------------------------------------

@pytest.mark.parametrize("versions, runs", [
    ({"neuronx-cc": "2.27.5334.0", "nki": None}, ["beta1"]),
    ({"neuronx-cc": "2.21.18209.0", "nki": None}, ["beta1"]),
    ({"neuronx-cc": "2.28.1.0", "nki": "0.2.0+g82fdb402"}, []),
    ({"neuronx-cc": "2.29.0.0", "nki": "0.3.0"}, ["nki"]),
    ({"neuronx-cc": None, "nki": "0.6.0+31049202112.g85070674"}, ["nki"]),
    ({"neuronx-cc": None, "nki": None}, []),
])
def test_the_device_runs_the_dialect_of_the_installed_sdk(versions, runs):
    assert device_dialects(versions) == runs
    for d in ("beta1", "nki"):
        reason = device_dialect_reason(d, versions)
        assert (reason is None) == (d in runs)


def test_device_skip_reasons_are_precise():
    why = device_dialect_reason("beta1", {"neuronx-cc": "2.30.1.0", "nki": "0.4.0"})
    assert "neuronx-cc 2.30.1.0" in why and "2.28" in why and "--nki-dialect nki" in why
    why = device_dialect_reason("nki", {"neuronx-cc": "2.27.5334.0", "nki": None})
    assert "0.3" in why and "only neuronx-cc 2.27.5334.0 is installed" in why
    why = device_dialect_reason("nki", {"neuronx-cc": "2.28.1.0", "nki": "0.2.0"})
    assert "nki 0.2.0 predates 0.3.0" in why


def _fake_nki_kernel(record):
    """A kernel object whose class lives in an `nki` module, as AWS's nki.jit kernels do."""
    cls = types.new_class("Kernel")
    cls.__module__ = "nki.compiler.kernel"

    def call(self, *args, **kwargs):
        record.append((os.environ.get("NKI_SIMULATOR"), os.environ.get("NEURON_FRAMEWORK_DEBUG"),
                       args, kwargs))
        return np.asarray(args[0]) + 1
    cls.__call__ = call
    return cls()


def test_device_runs_an_nki_kernel_by_calling_it_with_numpy(monkeypatch, tmp_path):
    calls = []
    kernel = _fake_nki_kernel(calls)
    assert registry.kernel_dialect(kernel) == "nki"
    monkeypatch.setenv("NKI_SIMULATOR", "1")
    device = DeviceBackend("trn2", device_path=str(tmp_path / "none"))
    out = device.run(kernel, np.zeros(3), scale=2)
    assert out.tolist() == [1.0, 1.0, 1.0]
    # NKI_SIMULATOR=1 would route the call to AWS's CPU simulator: unset for the device run
    assert calls[0][0] is None and calls[0][3] == {"scale": 2}
    assert os.environ["NKI_SIMULATOR"] == "1"          # restored


def test_device_timing_of_an_nki_kernel_needs_the_profiler(monkeypatch):
    monkeypatch.setenv("PATH", "")
    kernel = _fake_nki_kernel([])
    with pytest.raises(RuntimeError, match="neuron-explorer.*NEURON_FRAMEWORK_DEBUG=1"):
        backends.profile_nki_on_device(kernel, (np.zeros(2),), {})


def test_profile_summary_total_time_is_seconds():
    text = "some header\ntotal_time                 0.000412\ndma_transfer_count 12\n"
    assert parse_total_time_us(text) == pytest.approx(412.0)
    assert parse_total_time_us("total_time: 1.5e-05") == pytest.approx(15.0)
    with pytest.raises(RuntimeError, match="no total_time"):
        parse_total_time_us("nothing here")


def test_nkisim_runs_both_dialects():
    backend = NkisimBackend("trn2")
    assert backend.dialect_skip_reason("beta1") is None
    assert backend.dialect_skip_reason("nki") is None


# ---- pytest: --nki-dialect and the nki_dialect fixture --------------------------------------

OPT_IN = "[pytest]\nnki_verify = true\n"


def test_tests_asking_for_a_dialect_run_once_per_dialect(pytester):
    pytester.makeini(OPT_IN)
    pytester.makepyfile("""
        def test_k(nki_dialect, nki_verify):
            out = nki_verify("stream", {"n": 384}, "float16", case_id="n384")
            assert out.output.shape == (384,)

        def test_plain(nki_verify):
            nki_verify("naive", {"n": 64}, "float32", case_id="n64")
    """)
    ids = [ln for ln in pytester.runpytest("--collect-only", "-q").outlines if "::" in ln]
    assert [i.split("::")[1] for i in ids] == [
        "test_k[beta1-simulate]", "test_k[beta1-device]", "test_k[nki-simulate]",
        "test_k[nki-device]", "test_plain[simulate]", "test_plain[device]"]
    result = pytester.runpytest("-m", "simulate")
    result.assert_outcomes(passed=3, deselected=3)
    assert "stream[nki]" in result.stdout.str()          # the summary's row of the nki twin
    only = pytester.runpytest("-m", "simulate", "--nki-dialect", "nki", "--collect-only", "-q")
    assert [ln.split("::")[1] for ln in only.outlines if "::" in ln] == [
        "test_k[nki-simulate]", "test_plain[simulate]"]


def test_a_users_kernel_skips_the_other_dialect(pytester, tmp_path):
    pytester.makeini(OPT_IN)
    mine = tmp_path / "mine.py"
    mine.write_text("import nki\nimport nki.isa as nisa\nimport nki.language as nl\n\n"
                    "@nki.jit\ndef vector_add_naive(a, b):\n"
                    "    n = a.shape[0]\n"
                    "    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)\n"
                    "    x = nl.ndarray((n, 1), dtype=a.dtype, buffer=nl.sbuf)\n"
                    "    y = nl.ndarray((n, 1), dtype=a.dtype, buffer=nl.sbuf)\n"
                    "    nisa.dma_copy(dst=x, src=a.reshape((n, 1)))\n"
                    "    nisa.dma_copy(dst=y, src=b.reshape((n, 1)))\n"
                    "    nisa.tensor_tensor(dst=x, data1=x, data2=y, op=nl.add)\n"
                    "    nisa.dma_copy(dst=out.reshape((n, 1)), src=x)\n"
                    "    return out\n")
    pytester.makepyfile("""
        def test_k(nki_dialect, nki_verify):
            nki_verify("naive", {"n": 64}, "float32", case_id="n64")
    """)
    result = pytester.runpytest("-m", "simulate", "-rs", "--nki-kernel", f"{mine}:vector_add_naive")
    result.assert_outcomes(passed=1, skipped=1)
    out = result.stdout.str()
    assert "--nki-dialect beta1" in out and "written in the nki dialect (import nki)" in out
