"""benchmarks/conformance.py's glue for nki-library's simulation mode, without the corpus.

nki-library (test/utils/simulation_setup.py) imports ``nki_cpu_simulator``'s modules, aliases
``sys.modules["nki"]``, ``nki.language``, ``nki.isa``, ``nki.isa.constants``... to them and runs
``nki.cpu_simulate(kernel)[lnc](**kwargs)`` with ``NKI_NC_VERSION`` set. This test does the same
(our own minimal reproduction of those steps) against the stand-in the script writes, in a fresh
interpreter, and checks the result against NumPy.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    spec = importlib.util.spec_from_file_location(
        "_conformance", os.path.join(ROOT, "benchmarks", "conformance.py"))
    conformance = importlib.util.module_from_spec(spec)
    sys.modules["_conformance"] = conformance        # its dataclasses look it up by name
    try:
        spec.loader.exec_module(conformance)
    finally:
        del sys.modules["_conformance"]
    out = tmp_path_factory.mktemp("glue")
    for rel, text in conformance.NKI_CPU_SIMULATOR.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(out)


SCRIPT = r'''
import os, sys
import numpy as np
import nki_cpu_simulator.nki as sim_nki
import nki_cpu_simulator.nki.isa as sim_nisa
import nki_cpu_simulator.nki.isa.constants as sim_const
import nki_cpu_simulator.nki.language as sim_nl
import nki_cpu_simulator.nki.language.dtypes as sim_dtypes
for name, mod in (("nki", sim_nki), ("nki.isa", sim_nisa), ("nki.isa.constants", sim_const),
                  ("nki.language", sim_nl), ("nki.dtype", sim_dtypes)):
    sys.modules[name] = mod

import nki
import nki.isa as nisa
import nki.language as nl
from nki.isa.constants import oob_mode            # noqa: F401 (an import the library makes)


@nki.jit
def add_rows(x, y):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    p, f = x.shape
    half = p // nl.num_programs()
    rows = slice(nl.program_id(0) * half, (nl.program_id(0) + 1) * half)
    a = nl.ndarray((half, f), dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray((half, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x[rows, :])
    nisa.dma_copy(dst=b, src=y[rows, :])
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out[rows, :], src=a)
    return out


os.environ["NKI_NC_VERSION"] = "gen3"
rng = np.random.default_rng(0)
x = rng.standard_normal((128, 64)).astype(np.float32)
y = rng.standard_normal((128, 64)).astype(np.float32)
for lnc in (1, 2):
    got = nki.cpu_simulate(add_rows)[lnc](x=x, y=y)
    assert np.array_equal(np.asarray(got), x + y), lnc
print("target", os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"])
'''


def test_cpu_simulate_runs_a_kernel_on_nkisim(glue_dir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([glue_dir, env_path()]))
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "target trn2" in r.stdout                  # NKI_NC_VERSION=gen3 is a trn2


def env_path():
    return os.environ.get("PYTHONPATH", "")


def test_neuron_dtypes_stand_in_casts_like_the_hardware(glue_dir):
    sys.path.insert(0, glue_dir)
    try:
        spec = importlib.util.spec_from_file_location(
            "_nd", os.path.join(glue_dir, "neuron_dtypes.py"))
        nd = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(nd)
    finally:
        sys.path.remove(glue_dir)
    # float -> int: round to nearest even, saturate (nki 0.6.0 release notes, nki-current §3)
    got = nd.static_cast(np.array([1.5, 2.5, -1.5, 300.0, -300.0]), np.int8)
    assert got.dtype == np.int8 and got.tolist() == [2, 2, -2, 127, -128]
    bf = nd.static_cast(np.array([1.0 + 2.0 ** -8]), "bfloat16")      # a tie: to even
    assert bf.dtype.name == "bfloat16" and float(bf[0]) == 1.0
    assert nd.is_float_type(np.float16) and nd.is_float_type("bfloat16")
    assert not nd.is_float_type(np.int32)
    assert nd.sizeinbytes("bfloat16") == 2 and nd.sizeinbytes(np.float32) == 4
    with pytest.raises(NotImplementedError, match="packed MX type"):
        nd.static_cast(np.zeros(4), nd.float8_e4m3fn_x4)


@pytest.fixture(scope="module")
def conformance_module():
    spec = importlib.util.spec_from_file_location(
        "_conformance", os.path.join(ROOT, "benchmarks", "conformance.py"))
    conformance = importlib.util.module_from_spec(spec)
    sys.modules["_conformance"] = conformance
    try:
        spec.loader.exec_module(conformance)
    finally:
        del sys.modules["_conformance"]
    return conformance


SAMPLED_FILE = '''
import time
import pytest


@pytest.mark.parametrize("i", range(10))
def test_many(i):
    assert i != 6


@pytest.mark.skip(reason="skipped by its own file")
@pytest.mark.parametrize("j", range(2))
def test_skipped(j):
    pass


def test_slow():
    time.sleep(30)


@pytest.mark.trace_only
def test_traced():
    pass
'''


# SAMPLED_FILE uses no hypothesis: without hypothesis's pytest plugin the child session does not
# import it (nor rewrite its asserts) at the end, 2.0 -> 1.2 s of CPU per session (issue 12); the
# flag is one of `extra`, which conformance.py passes on to pytest unchanged.
NO_HYPOTHESIS = ["-p", "no:hypothesispytest"]


def test_per_file_sample_is_chosen_in_the_running_process(conformance_module, tmp_path):
    """--per-file N: one pytest process per file keeps N evenly spaced tests among those not
    skipped (in collection order), and says how many it chose of how many."""
    (tmp_path / "test_sampled.py").write_text(SAMPLED_FILE)
    # 10 + 1 runnable (test_slow is the last), 2 skipped: evenly spaced 4 of 11 = 0, 2, 5, 8
    res = conformance_module.run_pytest("x", str(tmp_path), ["test_sampled.py"], [], NO_HYPOTHESIS,
                                        timeout=120, sample=4)
    r = res["test_sampled.py"]
    assert (r.passed, r.failed) == (4, 0)
    assert r.sample == "4 of 11 runnable (14 collected, 1 marked trace/compile-only)"
    res = conformance_module.run_pytest("x", str(tmp_path), ["test_sampled.py"], [], NO_HYPOTHESIS,
                                        timeout=120, sample=11, test_timeout=2)
    r = res["test_sampled.py"]
    assert (r.passed, r.failed) == (9, 2)        # test_many[6] and test_slow (over 2 s)
    assert any("TIMEOUT" in msg for _, msg in r.errors), r.errors


def test_per_100_grows_big_files_samples_and_the_rate_is_weighted(conformance_module,
                                                                   tmp_path):
    """--per-100 K: at least K tests per 100 runnable ones (11 runnable, K=30 -> ceil(3.3) = 4
    > --per-file 2); the weighted rate weighs each file's sample rate by its runnable tests."""
    (tmp_path / "test_sampled.py").write_text(SAMPLED_FILE.replace("time.sleep(30)", "pass"))
    res = conformance_module.run_pytest("x", str(tmp_path), ["test_sampled.py"], [], NO_HYPOTHESIS,
                                        timeout=120, sample=2, per_100=30)
    r = res["test_sampled.py"]
    assert r.sample.startswith("4 of 11 runnable") and r.runnable == 11
    FileResult = conformance_module.FileResult
    rate, n = conformance_module.weighted_rate({
        "a": FileResult("a", passed=3, failed=1, runnable=300),     # 75% of 300
        "b": FileResult("b", passed=1, failed=1, runnable=100),     # 50% of 100
        "c": FileResult("c", passed=0, failed=2)})                  # no sample record: left out
    assert n == 400 and rate == pytest.approx(100 * (225 + 50) / 400)


def test_upstream_failures_are_recognised_by_all_their_patterns(conformance_module):
    why = conformance_module._upstream_failure(
        "nki-library", 'E   KeyError: \'mask_out_hbm\'\n  return {"golden_mask": '
                       'kernel_input["mask_out_hbm"]}')
    assert why and "must_alias_input" in why
    assert conformance_module._upstream_failure(
        "nki-library", "E   KeyError: 'mask_out_hbm'  (raised inside the simulator)") is None


def test_an_upstream_failure_can_name_its_parametrization(conformance_module):
    test = ("test_moe_block_kernel_model[MODEL_WIP_GENERALITY_ln-2_ae-1_ba-128_sq-4_hi-3072_"
            "ha-2880_im-360_ge-128_le-16_tk-4_rf-1_af-3_sm-1_wd-bfloat16_id-bfloat16_se-0]")
    failure = "E   AssertionError: Validation failed for ['out']"
    why = conformance_module._upstream_failure("nki-library", f"{test}\n{failure}")
    assert why and "routes differently" in why
    # the same message from another configuration is nkisim's to explain
    other = test.replace("im-360", "im-720")
    assert conformance_module._upstream_failure("nki-library", f"{other}\n{failure}") is None
