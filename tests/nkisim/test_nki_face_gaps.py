"""Four gaps of the ``nki`` face (NKI 0.3-0.7) closed, each with its valid neighbour.

Truth: the NKI migration guide (SDK 2.32 docs, nki/migration/index.rst: "0.2 -> 0.3 Language
restrictions", "0.3 -> 0.4 neuronxcc.nki.* inside kernels — now a compilation error", "0.4 -> 0.5
nki.language.rsqrt — PSUM inputs no longer supported"), shared/spec/nki-current.md (§1, §2.0
items 2 and 5: no ``mask=`` from 0.2.0, unknown keywords a TypeError from 2.28), AWS's
nki-library d2ad3a5 (written for NKI 0.3.0: its @nki.jit kernels test ``x is None``, so that
rule is tolerated); NumPy for the values.
"""

import importlib

import numpy as np
import pytest

from nkisim import beta1
from nkisim import nki as nki_face
from nkisim.beta1 import language as bnl
from nkisim.errors import NKIRuleWarning
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl

RNG = np.random.default_rng(19)
BEFORE_07 = ["0.3", "0.4", "0.5", "0.6"]


def rand(shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def run(body, *arrays, **kwargs):
    return nki_face.simulate(nki_face.jit(body))(*arrays, **kwargs)


@pytest.fixture
def version(monkeypatch):
    """Set NKISIM_NKI_VERSION for the test (no strict mode, all checks)."""
    monkeypatch.delenv("NKISIM_STRICT", raising=False)
    monkeypatch.delenv("NKISIM_CHECKS", raising=False)

    def set_version(v):
        monkeypatch.setenv("NKISIM_NKI_VERSION", v)
    return set_version


def _load_store(fn):
    """A kernel body: load the input, apply ``fn`` to its SBUF tile, store the result."""
    def body(x):
        r = fn(nl.load(x))
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    return body


def copy_through(x):
    """A clean kernel body: x -> SBUF -> a shared_hbm output."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


# ---------------------------------------------------------------------------------------------
# 1. `mask=None` on the nl wrappers: their 0.3+ signatures have no `mask` (STUB-R32:
#    add(x, y, dtype=None), exp(x, dtype=None), copy(x, dtype=None), max(x, axis, dtype=None,
#    keepdims=False)); from 2.28 an unknown keyword is Python's TypeError (spec §2.0 item 5)

MASK_NONE_CALLS = {
    "add": lambda t: nl.add(t, t, mask=None),
    "multiply": lambda t: nl.multiply(t, t, mask=None),
    "exp": lambda t: nl.exp(t, mask=None),
    "copy": lambda t: nl.copy(t, mask=None),
    "max": lambda t: nl.max(t, axis=1, keepdims=True, mask=None),
    "sum": lambda t: nl.sum(t, 1, mask=None),
    "where": lambda t: nl.where(t, t, t, mask=None),
}


@pytest.mark.parametrize("v", ["0.3", "0.7"])
@pytest.mark.parametrize("name", sorted(MASK_NONE_CALLS))
def test_nl_wrappers_reject_an_explicit_mask_none(version, v, name):
    version(v)
    with pytest.raises(TypeError, match=rf"nl\.{name}\(\) got an unexpected keyword argument "
                                        r"'mask'"):
        run(_load_store(MASK_NONE_CALLS[name]), rand((128, 64)))


def test_nl_wrappers_without_mask_compute_numpys_values():
    x = rand((128, 64))
    np.testing.assert_array_equal(run(_load_store(lambda t: nl.add(t, t)), x), x + x)
    np.testing.assert_array_equal(run(_load_store(lambda t: nl.copy(t)), x), x)
    np.testing.assert_array_equal(
        run(_load_store(lambda t: nl.max(t, axis=1, keepdims=True)), x),
        x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(run(_load_store(lambda t: nl.exp(t)), x), np.exp(x), rtol=1e-6)


def test_beta1_wrappers_still_take_mask_none_and_a_mask():
    # Beta 1: add(x, y, *, dtype=None, mask=None, **kwargs) (aws-neuron-sdk 1db4d74e)
    x = rand((128, 64))

    def k(a):
        t = bnl.load(a)
        i_f = bnl.arange(64)[None, :]
        s = bnl.add(t, t, mask=None)
        e = bnl.exp(s, mask=None)
        m = bnl.max(bnl.copy(e, mask=None), axis=1, keepdims=True, mask=None)
        out = bnl.ndarray((128, 65), dtype=a.dtype, buffer=bnl.shared_hbm)
        bnl.store(out[:, 0:64], bnl.multiply(e, 1.0, mask=(i_f < 64)))
        bnl.store(out[:, 64:65], m)
        return out
    got = beta1.simulate_kernel(beta1.jit(k), x)
    np.testing.assert_allclose(got[:, :64], np.exp(x + x), rtol=1e-6)
    np.testing.assert_allclose(got[:, 64:], np.exp(x + x).max(axis=1, keepdims=True), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# 2. nl.rsqrt: from 0.5.0 it "now runs on the GpSimd Engine for higher numerical precision and
#    no longer accepts PSUM inputs" (MIG 0.4 -> 0.5; spec §1 row 0.5.0)

def _rsqrt_of(buffer, through_activation=False):
    def k(x):
        t = nl.load(x)
        src = t
        if buffer == "psum":
            src = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
            nisa.tensor_copy(dst=src, src=t)
        if through_activation:
            r = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=r, op=nl.rsqrt, data=src)
        else:
            r = nl.rsqrt(src)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    return k


@pytest.mark.parametrize("v", ["0.5", "0.6", "0.7"])
def test_rsqrt_rejects_psum_from_0_5(version, v):
    version(v)
    with pytest.raises(nisa.NkiValidationError,
                       match="nl.rsqrt x must be in SBUF, got PSUM.*since NKI 0.5.0.*no longer "
                             "accepts PSUM inputs") as e:
        run(_rsqrt_of("psum"), rand((128, 64), 0.5, 4.0))
    assert isinstance(e.value, AssertionError)      # as the simulator shows violations


@pytest.mark.parametrize("v", ["0.3", "0.4"])
def test_rsqrt_takes_psum_before_0_5(version, v):
    version(v)
    x = rand((128, 64), 0.5, 4.0)
    np.testing.assert_allclose(run(_rsqrt_of("psum"), x), 1.0 / np.sqrt(x), rtol=1e-6)


@pytest.mark.parametrize("v", ["0.3", "0.5", "0.7"])
def test_rsqrt_on_sbuf_in_every_release(version, v):
    version(v)
    x = rand((128, 64), 0.5, 4.0)
    np.testing.assert_allclose(run(_rsqrt_of("sbuf"), x), 1.0 / np.sqrt(x), rtol=1e-6)


def test_rsqrt_as_an_activation_op_code_takes_psum(version):
    # the guide's way for a PSUM input: "call nki.isa.activation directly with the
    # reciprocal-square-root op instead"
    version("0.7")
    x = rand((128, 64), 0.5, 4.0)
    np.testing.assert_allclose(run(_rsqrt_of("psum", through_activation=True), x),
                               1.0 / np.sqrt(x), rtol=1e-6)


def test_rsqrt_assigned_into_a_tile_slice(version):
    version("0.7")
    x = rand((128, 64), 0.5, 4.0)

    def k(a):
        t = nl.load(a)
        r = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        r[:, 0:64] = nl.rsqrt(t)
        r[:, 64:128] = nl.rsqrt(t, dtype=nl.float32)
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    got = run(k, x)
    np.testing.assert_allclose(got, np.concatenate([1.0 / np.sqrt(x)] * 2, axis=1), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# 3. neuronxcc.nki imported inside the kernel body: "Using the deprecated neuronxcc.nki.*
#    namespace inside NKI kernels now raises a compilation error" (MIG 0.3 -> 0.4)

def local_import_kernel(x):
    import neuronxcc.nki.language as onl
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    onl.store(out, onl.load(x))
    return out


def local_from_import_kernel(x):
    from neuronxcc.nki import language
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    language.store(out, language.load(x))
    return out


def _helper_with_local_import(x):
    import neuronxcc.nki.language as onl
    return onl.load(x)


def helper_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, _helper_with_local_import(x))
    return out


def nki_local_import_kernel(x):
    import nki.language as nl2
    out = nl2.ndarray(x.shape, dtype=x.dtype, buffer=nl2.shared_hbm)
    nl2.store(out, nl2.load(x))
    return out


@pytest.mark.parametrize("v", ["0.4", "0.5", "0.6", "0.7"])
@pytest.mark.parametrize("kernel, bound, module", [
    (local_import_kernel, "onl", "neuronxcc.nki.language"),
    (local_from_import_kernel, "language", "neuronxcc.nki.language"),
    (helper_kernel, "onl", "neuronxcc.nki.language")])
def test_neuronxcc_imported_inside_the_kernel_is_an_error_from_0_4(served, version, v, kernel,
                                                                   bound, module):
    version(v)
    with pytest.raises(ValueError, match=rf"`{bound}` is {module}: using neuronxcc.nki inside "
                                         r"an NKI kernel is a compile error since NKI 0\.4\.0"):
        run(kernel, rand((128, 64)))


def test_neuronxcc_imported_inside_the_kernel_warns_under_0_3(served, version):
    version("0.3")
    x = rand((128, 64))
    with pytest.warns(FutureWarning, match="uses `onl` \\(neuronxcc.nki.language\\): "
                                           "neuronxcc.nki inside NKI kernels is deprecated"):
        got = run(local_import_kernel, x)
    np.testing.assert_array_equal(got, x)


def test_nki_imported_inside_the_kernel_is_fine(served, version):
    version("0.7")
    x = rand((128, 64))
    importlib.invalidate_caches()
    np.testing.assert_array_equal(run(nki_local_import_kernel, x), x)


# ---------------------------------------------------------------------------------------------
# 4. the 0.3-0.6 compiler's language restrictions (MIG 0.2 -> 0.3 "Language restrictions"; spec
#    §2.0 item 5); 0.7's Python-tracing front end: full Python semantics (spec §1, row 0.7.0)

def star_kernel(x, *, scale=1.0):
    return copy_through(x)


def is_true_kernel(x, flag=False):
    if flag is True:
        return copy_through(x)
    return copy_through(x)


def is_not_kernel(x, other=0):
    if x is not other:
        return copy_through(x)
    return copy_through(x)


def is_none_kernel(x, bias=None):
    if bias is None:
        return copy_through(x)
    return copy_through(x)


def list_kernel(x, stride):
    return copy_through(x)


def list_default_kernel(x, stride=[1, 1]):  # noqa: B006 - the pattern the guide migrates
    return copy_through(x)


def equal_kernel(x, flag=False):
    if flag == True:  # noqa: E712 - the guide's replacement for `is True`
        return copy_through(x)
    return copy_through(x)


RESTRICTED = [
    ("star", lambda x: run(star_kernel, x),
     r"separator `\*` before scale: the NKI 0.3.0 compiler does not support the \* separator "
     r"in kernel function signatures"),
    ("is True", lambda x: run(is_true_kernel, x),
     r"`flag is True` at line \d+: the NKI 0.3.0 compiler does not support Python's is / is "
     r"not operators"),
    ("is not", lambda x: run(is_not_kernel, x),
     r"`x is not other` at line \d+: the NKI 0.3.0 compiler does not support Python's is / is "
     r"not operators"),
    ("list argument", lambda x: run(list_kernel, x, [1, 1]),
     r"argument `stride` is a list \(\[1, 1\]\): the NKI 0.3.0 compiler does not support list "
     r"as a kernel argument type"),
    ("list keyword", lambda x: run(list_kernel, x, stride=[2]),
     r"argument `stride` is a list \(\[2\]\): the NKI 0.3.0 compiler does not support list"),
    ("list default", lambda x: run(list_default_kernel, x),
     r"argument `stride` is a list \(\[1, 1\]\)"),
]


@pytest.mark.parametrize("v", BEFORE_07)
@pytest.mark.parametrize("case, call, message", RESTRICTED, ids=[r[0] for r in RESTRICTED])
def test_language_restrictions_are_errors_under_0_3_to_0_6(version, v, case, call, message):
    version(v)
    with pytest.raises(ValueError, match=message):
        call(rand((128, 64)))


@pytest.mark.parametrize("case, call, message", RESTRICTED, ids=[r[0] for r in RESTRICTED])
def test_language_restrictions_are_lifted_by_0_7s_tracing_front_end(version, case, call,
                                                                    message):
    version("0.7")
    x = rand((128, 64))
    np.testing.assert_array_equal(call(x), x)


@pytest.mark.parametrize("v", BEFORE_07)
def test_the_migrated_forms_run_under_0_3_to_0_6(version, v):
    version(v)
    x = rand((128, 64))
    np.testing.assert_array_equal(run(list_kernel, x, (1, 1)), x)        # a tuple
    np.testing.assert_array_equal(run(list_kernel, x, stride=(1, 1)), x)
    np.testing.assert_array_equal(run(equal_kernel, x), x)               # == instead of is


@pytest.mark.parametrize("v", BEFORE_07)
def test_is_none_is_a_tolerated_rule_under_0_3_to_0_6(version, v, monkeypatch):
    # AWS's nki-library d2ad3a5 (NKI 0.3.0) tests `x is None` in its CI-tested @nki.jit kernels
    # (core/attention/attention_cte.py `if sliding_window is None:`): a warning quoting the rule
    version(v)
    x = rand((128, 64))
    with pytest.warns(NKIRuleWarning, match=r"nki kernel is_none_kernel tests `bias is None` "
                                            r"at line \d+.*does not support Python's is / is "
                                            r"not operators") as seen:
        got = run(is_none_kernel, x)
    np.testing.assert_array_equal(got, x)
    assert {w.filename for w in seen if w.category is NKIRuleWarning} == {__file__}
    monkeypatch.setenv("NKISIM_STRICT", "1")
    with pytest.raises(ValueError, match=r"strict mode.*`bias is None`.*is / is not operators"):
        run(is_none_kernel, x)


def test_is_none_is_silent_under_0_7(version, recwarn):
    version("0.7")
    x = rand((128, 64))
    np.testing.assert_array_equal(run(is_none_kernel, x), x)
    assert not [w for w in recwarn if w.category is NKIRuleWarning]
