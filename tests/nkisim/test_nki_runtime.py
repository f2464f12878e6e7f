"""The ``nki`` face's kernels and runners (NKI 0.3-0.7), and the shim serving ``import nki``.

Truth: shared/spec/nki-current.md §2.1 (jit, kernel[lnc], simulate, removed runners), §3 (the
simulator: NumPy in and out, inputs updated in place, NKI_SIMULATOR=1), §2.0 item 6 (outputs must
be nl.shared_hbm), §1 (0.4.0: neuronxcc.nki inside an nki kernel is an error), §3/§6 item 15 (the
PyPI ``nki`` placeholder); NumPy for the values.
"""

import importlib
import sys
import warnings

import numpy as np
import pytest

from nkisim import nki, shim
from nkisim.nki import _version
from nkisim.nki import language as nl

RNG = np.random.default_rng(11)


def rand(shape, dtype=np.float32):
    return RNG.uniform(-2, 2, size=shape).astype(dtype)


@nki.jit
def vector_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    P = nl.tile_size.pmax
    for i in range(a.shape[0] // P):
        rows = slice(i * P, (i + 1) * P)
        nl.store(out[rows, :], nl.add(nl.load(a[rows, :]), nl.load(b[rows, :])))
    return out


def test_simulate_returns_numpy_equal_to_numpy_add():
    a, b = rand((256, 64)), rand((256, 64))
    out = nki.simulate(vector_add)(a, b)
    assert isinstance(out, np.ndarray) and out.shape == (256, 64)
    np.testing.assert_array_equal(out, a + b)


def test_direct_call_and_nki_simulator_env_give_the_same_result(monkeypatch):
    a, b = rand((128, 32)), rand((128, 32))
    direct = vector_add(a, b)
    monkeypatch.setenv("NKI_SIMULATOR", "1")
    routed = vector_add(a, b)
    np.testing.assert_array_equal(direct, routed)
    np.testing.assert_array_equal(routed, a + b)


def test_simulate_wraps_a_plain_function_in_jit():
    def plain(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.exp(nl.load(a)))
        return out
    a = rand((128, 16))
    np.testing.assert_allclose(nki.simulate(plain)(a), np.exp(a), rtol=1e-6)


def test_inputs_written_by_the_kernel_are_updated_in_place():
    @nki.jit
    def scale_in_place(a):
        t = nl.load(a)
        nl.store(a, nl.multiply(t, 3.0))
        out = nl.ndarray((1, 1), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a[0:1, 0:1]))
        return out
    a = rand((128, 8))
    before = a.copy()
    out = nki.simulate(scale_in_place)(a)
    np.testing.assert_allclose(a, before * 3.0, rtol=1e-6)
    np.testing.assert_allclose(out, before[0:1, 0:1] * 3.0, rtol=1e-6)


def test_non_contiguous_input_is_written_back():
    @nki.jit
    def negate(a):
        nl.store(a, nl.negative(nl.load(a)))
        return a
    base = rand((16, 128))
    a = base.T                     # (128, 16), not C-contiguous: nkisim works on a copy
    expect = -a.copy()
    nki.simulate(negate)(a)
    np.testing.assert_array_equal(a, expect)


@pytest.mark.parametrize("contiguous", [True, False])
def test_read_only_input_is_read_and_not_written_back(contiguous):
    # nki-library's output_proj_tkg fp8 sweep passes a read-only array the kernel only reads
    @nki.jit
    def double(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(a), 2.0))
        return out
    base = rand((128, 16)) if contiguous else rand((16, 128)).T
    a = base.view()
    a.flags.writeable = False
    np.testing.assert_array_equal(nki.simulate(double)(a), 2 * base)

    @nki.jit
    def negate(a):
        nl.store(a, nl.negative(nl.load(a)))
        return a
    with pytest.raises(NotImplementedError, match="`a`.*read-only; pass a writable copy"):
        nki.simulate(negate)(a)
    np.testing.assert_array_equal(a, base)


# ---------------------------------------------------------------------------------------------
# kernel[lnc]


@nki.jit
def lnc_info(a):
    out = nl.ndarray((2, 3), dtype=np.int32, buffer=nl.shared_hbm)
    pid = nl.program_id(0)
    for j, v in enumerate((pid, nl.num_programs(), nl.program_ndim())):
        nl.store(out[pid:pid + 1, j:j + 1], v)
    return out


def test_lnc2_runs_two_instances_with_program_ids_0_and_1():
    out = nki.simulate(lnc_info[2])(rand((2, 2)))
    np.testing.assert_array_equal(out, [[0, 2, 1], [1, 2, 1]])


def test_lnc1_bracket_and_plain_call():
    with pytest.warns(Warning, match="only partly written"):     # row 1: no instance 1
        one = nki.simulate(lnc_info[1])(rand((2, 2)))
    assert one[0].tolist() == [0, 1, 1]
    # no bracket: not an SPMD launch (program_ndim() == 0, nki-library's
    # get_program_sharding_info "Returns (0, 1, 0) for non-SPMD execution")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = nki.simulate(_first_row_info)(rand((2, 2)))
    assert plain.tolist() == [[0, 1, 0]]


@nki.jit
def _first_row_info(a):
    out = nl.ndarray((1, 3), dtype=np.int32, buffer=nl.shared_hbm)
    for j, v in enumerate((nl.program_id(0), nl.num_programs(), nl.program_ndim())):
        nl.store(out[0:1, j:j + 1], v)
    return out


@pytest.mark.parametrize("bad", [(2, 2), (1, 1), 3, 0, 2.0, True])
def test_lnc_bracket_takes_one_number_1_or_2(bad):
    with pytest.raises(ValueError, match="only one number|LNC degree must be 1 or 2"):
        vector_add[bad]


def test_with_schedule_is_accepted_and_changes_nothing():
    a, b = rand((128, 8)), rand((128, 8))
    k = vector_add.with_schedule([("x", "y")])
    assert isinstance(k, nki.Kernel)
    np.testing.assert_array_equal(k(a, b), a + b)


# ---------------------------------------------------------------------------------------------
# jit options, removed runners


def test_platform_target_is_an_error():
    with pytest.raises(ValueError, match="platform_target.*NEURON_PLATFORM_TARGET_OVERRIDE"):
        nki.jit(platform_target="trn2")(vector_add.func)


def test_mode_is_deprecated_and_ignored():
    with pytest.warns(DeprecationWarning, match="mode.*deprecated"):
        k = nki.jit(mode="simulation")(vector_add.func)
    a, b = rand((128, 4)), rand((128, 4))
    np.testing.assert_array_equal(k(a, b), a + b)


@pytest.mark.parametrize("name", ["baremetal", "benchmark", "profile"])
def test_removed_runners_raise_not_available(name):
    fn = getattr(nki, name)
    with pytest.raises(NotImplementedError, match=f"nki.{name} is not available"):
        fn(vector_add)


def test_simulate_kernel_does_not_exist():
    # NS issue #134 on 2.32: AttributeError: module 'nki' has no attribute 'simulate_kernel'
    with pytest.raises(AttributeError, match="simulate_kernel"):
        nki.simulate_kernel  # noqa: B018


def test_platform_target_override_env_selects_the_target(monkeypatch):
    from nkisim.runtime import last_run
    a, b = rand((128, 4)), rand((128, 4))
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    vector_add(a, b)
    assert last_run().arch.name == "trn1"
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen3")
    vector_add(a, b)
    assert last_run().arch.name == "trn2"


# ---------------------------------------------------------------------------------------------
# outputs must be shared_hbm (§2.0 item 6)


@pytest.mark.parametrize("buf", ["hbm", "private_hbm"])
def test_output_not_in_shared_hbm_is_an_error(buf):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=getattr(nl, buf))
        nl.store(out, nl.load(a))
        return out
    with pytest.raises(ValueError, match="must use nl.shared_hbm") as e:
        k(rand((128, 4)))
    assert e.value.nki_code == "nkisim_output_not_shared_hbm"


def test_returning_an_input_is_allowed():
    @nki.jit
    def k(a):
        return a
    a = rand((128, 4))
    np.testing.assert_array_equal(k(a), a)


# ---------------------------------------------------------------------------------------------
# versions


def test_version_parse_and_default(monkeypatch):
    monkeypatch.delenv("NKISIM_NKI_VERSION", raising=False)
    assert _version.current() == _version.NEWEST == (0, 7)
    assert nki.__version__.startswith("0.7.0")
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.6.0+31049202112.g85070674")
    assert _version.current() == (0, 6)
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.2")
    with pytest.raises(ValueError, match="0.3 to 0.7"):
        _version.current()
    monkeypatch.setenv("NKISIM_NKI_VERSION", "latest")
    with pytest.raises(ValueError, match="expected a version"):
        _version.current()


# ---------------------------------------------------------------------------------------------
# the shim serves `import nki`


def test_shim_serves_nki_and_its_submodules(served):
    import nki as real_name
    import nki.collectives
    import nki.isa
    import nki.isa.constants  # noqa: F401
    import nki.language
    import nki.typing
    assert real_name is nki and sys.modules["nki"] is importlib.import_module("nkisim.nki")
    assert sys.modules["nki.language"] is nl
    assert nki.typing.tensor[128, 512].shape == (128, 512)
    assert nki.collectives.ReplicaGroup([[0, 1]]).groups == [[0, 1]]
    assert shim.serves_nki()


def _fake_nki(tmp_path, real):
    pkg = tmp_path / "nki"
    pkg.mkdir()
    if real:
        (pkg / "__init__.py").write_text("")
        for sub in ("language", "isa"):
            (pkg / sub).mkdir()
            (pkg / sub / "__init__.py").write_text("")
    else:   # the PyPI nki 0.0.1 placeholder (spec §3 "Install source")
        (pkg / "__init__.py").write_text(
            'raise ImportError("WRONG PACKAGE. Please install the package from Neuron '
            'Repository - pip.repos.neuron.amazonaws.com")\n')


def test_the_pypi_placeholder_counts_as_absent(tmp_path, monkeypatch):
    _fake_nki(tmp_path, real=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert not shim.real_nki_available()


def test_a_real_nki_package_is_detected(tmp_path, monkeypatch):
    _fake_nki(tmp_path, real=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert shim.real_nki_available()


def test_neuronxcc_nki_inside_an_nki_kernel(served, monkeypatch, tmp_path):
    (tmp_path / "beta1_in_nki.py").write_text(
        "import neuronxcc.nki.language as bnl\n"
        "from neuronxcc.nki.isa import nc_transpose\n"
        "import nki, nki.language as nl\n"
        "def helper(a):\n"
        "    return bnl.load(a)\n"
        "def k(a):\n"
        "    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, helper(a))\n"
        "    return out\n"
        "def clean(a):\n"
        "    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, nl.load(a))\n"
        "    return out\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("beta1_in_nki")
    k = nki.jit(mod.k)
    a = rand((128, 4))
    # 0.4.0+: a compile error (RN 2.30), also through a helper the kernel calls
    with pytest.raises(ValueError, match="`bnl` is neuronxcc.nki.language.*since NKI 0.4.0"):
        k(a)
    np.testing.assert_array_equal(nki.jit(mod.clean)(a), a)    # a clean kernel of that module
    # 0.3: a deprecation warning, and it runs
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.3")
    with pytest.warns(FutureWarning, match="neuronxcc.nki inside NKI kernels") as seen:
        out = k(a)
    np.testing.assert_array_equal(out, a)
    # at the line of the function that uses it (a FutureWarning: shown by default, unlike a
    # DeprecationWarning raised from inside nkisim)
    assert [(w.filename, w.lineno) for w in seen] == \
        [(mod.helper.__code__.co_filename, mod.helper.__code__.co_firstlineno)]


def test_inputs_are_hbm_or_shared_hbm_under_lnc2():
    seen = []

    @nki.jit
    def k(a):
        seen.append(a.buffer)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nl.store(out, nl.load(a))
        return out
    a = rand((128, 4))
    k(a)
    nki.simulate(k[2])(a)
    assert seen[0] == nl.hbm and seen[0] != nl.shared_hbm
    assert seen[1:] == [nl.shared_hbm, nl.shared_hbm]


def test_nkisim_run_serves_import_nki(tmp_path):
    import subprocess
    script = tmp_path / "script.py"
    script.write_text(
        "import numpy as np\n"
        "import nki, nki.language as nl, nki.isa as nisa\n"
        "@nki.jit\n"
        "def k(a):\n"
        "    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)\n"
        "    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)\n"
        "    nisa.dma_copy(dst=t, src=a)\n"
        "    nisa.activation(dst=t, op=nl.exp, data=t)\n"
        "    nisa.dma_copy(dst=out, src=t)\n"
        "    return out\n"
        "a = np.linspace(-1, 1, 128 * 4, dtype=np.float32).reshape(128, 4)\n"
        "print('ok', np.allclose(k(a), np.exp(a), rtol=1e-6), nki.__version__)\n")
    r = subprocess.run([sys.executable, "-m", "nkisim", "run", str(script)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ok True 0.7.0+nkisim" in r.stdout


def test_install_leaves_a_real_nki_alone_and_serves_past_the_placeholder(tmp_path, monkeypatch,
                                                                       shim_restored):
    shim.uninstall()
    real, fake = tmp_path / "real", tmp_path / "placeholder"
    real.mkdir()
    fake.mkdir()
    _fake_nki(real, real=True)
    _fake_nki(fake, real=False)
    monkeypatch.syspath_prepend(str(real))
    importlib.invalidate_caches()
    shim.install()
    assert not shim.serves_nki()
    import nki as got
    assert got.__file__.startswith(str(real))
    shim.uninstall()
    del sys.modules["nki"]
    monkeypatch.syspath_prepend(str(fake))    # the placeholder first on the path
    importlib.invalidate_caches()
    shim.install()
    assert shim.serves_nki()
    import nki as got2
    assert got2 is importlib.import_module("nkisim.nki")


def test_torch_tensors_in_and_out():
    # SIM: NKI_SIMULATOR=1 accepts torch tensors from 0.4.0 and returns results the same way
    torch = pytest.importorskip("torch")

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, nl.multiply(t, 2.0))
        nl.store(a, nl.add(t, 1.0))          # an input written in place
        return out
    for dt in (torch.float32, torch.bfloat16):
        a = torch.linspace(-1, 1, 128 * 4).reshape(128, 4).to(dt)
        before = a.clone()
        out = nki.simulate(k)(a)
        assert isinstance(out, torch.Tensor) and out.dtype == dt
        assert torch.equal(out, (before.float() * 2).to(dt))
        assert torch.equal(a, (before.float() + 1).to(dt))
