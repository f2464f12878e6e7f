"""The bug catalogue (issue 5): the suite catches every kernel in ``fixtures/buggy_kernels`` with
its expected diagnostic, and none of the correct kernels trigger any check.

A bug is caught when, with every nkisim check on (the default):

- an NKI error code is expected: running the kernel raises an exception with that ``nki_code``
  (and the module's ``MATCH`` text: the tensor, region or loop the message must name);
- ``warning:<text>`` is expected: an ``NKIWarning`` containing ``<text>`` is emitted;
- ``golden-mismatch`` is expected: the kernel runs without raising, and its output fails the
  comparison with the float64 golden model (``nkiverify.compare``, the suite's comparator).

The root conftest.py prints ``bug catalogue: caught N/N`` at the end of the terminal summary.
"""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

import nkisim.shim
from nkisim import NKIWarning
from nkisim.errors import ERRORS, NKIRuleWarning
from nkisim.runtime import simulate

nkisim.shim.install()          # kernels and fixtures import neuronxcc.nki

from fixtures import buggy_kernels  # noqa: E402

try:
    from nkiverify.compare import compare as _compare
except ImportError:  # pragma: no cover - nkiverify ships with this repository
    _compare = None


def golden_check(actual, expected, dtype, reduction_length):
    """(passed, message) of the suite's golden comparison (allclose-style fallback)."""
    if _compare is not None:
        c = _compare(actual, expected, dtype, reduction_length=reduction_length)
        return c.passed, c.message()
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return False, f"shape mismatch: {actual.shape} vs {expected.shape}"
    rtol = 4 * np.sqrt(max(reduction_length, 1)) * float(np.finfo(dtype).eps)
    ok = np.allclose(actual, expected, rtol=rtol, atol=0)
    return bool(ok), f"allclose(rtol={rtol:.3g}): {ok}"


@pytest.fixture(autouse=True)
def _all_checks(monkeypatch):
    monkeypatch.delenv("NKISIM_CHECKS", raising=False)     # every check on, as by default


def _split(expected):
    codes = [e for e in expected if e != "golden-mismatch" and not e.startswith("warning:")]
    texts = [e[len("warning:"):] for e in expected if e.startswith("warning:")]
    return codes, texts, "golden-mismatch" in expected


def test_catalogue_is_complete():
    """At least 15 bugs, each with a one-line description and a well-formed diagnostic."""
    mods = buggy_kernels.modules()
    assert len(mods) >= 15
    for mod in mods:
        assert mod.DESCRIPTION and "\n" not in mod.DESCRIPTION, mod.__name__
        codes, texts, golden = _split(buggy_kernels.expected(mod))
        assert codes or texts or golden, mod.__name__
        assert len(codes) <= 1, mod.__name__
        for code in codes:
            assert code in ERRORS, f"{mod.__name__}: unknown NKI error code {code}"
        if golden or hasattr(mod, "golden"):
            assert hasattr(mod, "golden") and hasattr(mod, "DTYPE"), mod.__name__
        assert callable(mod.run)


@pytest.mark.parametrize("name", buggy_kernels.CATALOGUE)
def test_bug_is_caught(name):
    mod = importlib.import_module(f"{buggy_kernels.__name__}.{name}")
    codes, texts, golden = _split(buggy_kernels.expected(mod))
    out = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NKIWarning)
        if codes:
            with pytest.raises(Exception) as info:
                mod.run()
            code = getattr(info.value, "nki_code", None)
            assert code == codes[0], f"{name}: expected {codes[0]}, got {code}: {info.value}"
            if hasattr(mod, "MATCH"):
                assert mod.MATCH in str(info.value), str(info.value)
        else:
            out = mod.run()        # golden-mismatch / warning bugs must not raise
    messages = [str(w.message) for w in caught if issubclass(w.category, NKIWarning)]
    for text in texts:
        assert any(text in m for m in messages), f"{name}: no warning with {text!r}: {messages}"
    if golden:
        passed, message = golden_check(out, mod.golden(), mod.DTYPE,
                                       getattr(mod, "REDUCTION_LENGTH", 1))
        assert not passed, f"{name}: the golden comparison did not catch the bug:\n{message}"


# ---------------------------------------------------------------------------------------------
# tolerated patterns: what the device computes right is no error (issue 8)


@pytest.mark.parametrize("name", buggy_kernels.TOLERATED)
def test_tolerated_pattern_is_not_an_error(name, monkeypatch):
    """Runs with every check on, computes the golden result; a documented rule it breaks is an
    NKIRuleWarning quoting it (``warning:<text>``), and an error only in strict mode."""
    assert name not in buggy_kernels.CATALOGUE
    mod = importlib.import_module(f"{buggy_kernels.__name__}.{name}")
    exp = buggy_kernels.expected(mod)
    texts = [e[len("warning:"):] for e in exp if e.startswith("warning:")]
    assert texts or exp == ("clean",), exp
    monkeypatch.setenv("NKISIM_STRICT", "0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NKIWarning)
        out = mod.run()
    messages = [str(w.message) for w in caught if issubclass(w.category, NKIWarning)]
    for text in texts:
        assert any(text in m and issubclass(w.category, NKIRuleWarning)
                   for w, m in zip([w for w in caught if issubclass(w.category, NKIWarning)],
                                   messages)), messages
    if not texts:
        assert messages == []
    passed, message = golden_check(out, mod.golden(), mod.DTYPE, mod.REDUCTION_LENGTH)
    assert passed, message
    monkeypatch.setenv("NKISIM_STRICT", "1")
    if texts:
        with pytest.raises(ValueError) as info:
            mod.run()
        assert info.value.nki_code == "nkisim_strict_rule"
        assert texts[0] in str(info.value)
    else:
        mod.run()


# ---------------------------------------------------------------------------------------------
# the correct kernels trigger nothing


def _run_clean(kernel, *args, **kwargs):
    """Simulate with every check on, in strict mode, and NKI warnings as errors."""
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("error", NKIWarning)
        mp.setenv("NKISIM_STRICT", "1")
        return simulate(kernel, args, kwargs, checks_spec="all")


def _vector_cases():
    from kernels import vector_add
    rng = np.random.default_rng(30)
    cases = []
    for kernel, sizes in ((vector_add.vector_add_naive, (1, 100, 128)),
                          (vector_add.vector_add_tiled, (128, 1000, 25600)),
                          (vector_add.vector_add_stream, (128, 25600, 256000))):
        for n in sizes:
            a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
            cases.append(pytest.param(kernel, (a, b), a + b, id=f"{kernel.__name__}-{n}"))
    return cases


@pytest.mark.parametrize("kernel, args, want", _vector_cases())
def test_vector_add_kernels_trigger_no_check(kernel, args, want):
    out = _run_clean(kernel, *args)
    assert np.array_equal(out, want)


def _handout_cases():
    from fixtures import handout
    rng = np.random.default_rng(33)
    a, b = rng.random(25600, dtype=np.float32), rng.random(25600, dtype=np.float32)
    m = rng.random((256, 384), dtype=np.float32)
    return [
        pytest.param(handout.make_vector_add_tiled(128), (a, b), a + b, id="tiled-128"),
        pytest.param(handout.make_vector_add_stream(2), (a, b), a + b, id="stream-2"),
        pytest.param(handout.make_vector_add_stream(200), (a, b), a + b, id="stream-200"),
        pytest.param(handout.make_vector_add_stream_trn1(200), (a, b), a + b,
                     id="trn1-stream-200"),
        pytest.param(handout.transpose_per_tile, (m,), m.T, id="transpose-per-tile"),
    ]


@pytest.mark.parametrize("kernel, args, want", _handout_cases())
def test_handout_solutions_trigger_no_check(kernel, args, want):
    out = _run_clean(kernel, *args)
    assert np.array_equal(out.reshape(want.shape), want)


def test_transpose_triggers_no_check():
    from kernels.transpose import matrix_transpose
    a = np.random.default_rng(31).random((256, 384), dtype=np.float32)
    out = _run_clean(matrix_transpose, a)
    assert np.array_equal(out, a.T)


CONV_CASES = [  # (B, C_in, C_out, H, W, pool)
    (1, 128, 128, 8, 8, 1),
    (2, 128, 256, 8, 8, 2),
    (2, 256, 128, 10, 12, 2),
    (1, 128, 128, 32, 16, 1),
]


@pytest.mark.parametrize("B, c_in, c_out, H, W, pool", CONV_CASES)
def test_conv2d_triggers_no_check(B, c_in, c_out, H, W, pool):
    conv2d = pytest.importorskip("kernels.conv2d")
    from reference.conv2d import conv2d_maxpool
    rng = np.random.default_rng(32)
    X = rng.random((B, c_in, H, W), dtype=np.float32)
    Wt = rng.random((c_out, c_in, 3, 3), dtype=np.float32)
    bias = rng.random(c_out, dtype=np.float32)
    out = _run_clean(conv2d.fused_conv2d_maxpool, X, Wt, bias, pool_size=pool)
    passed, message = golden_check(out, conv2d_maxpool(X, Wt, bias, pool), np.float32,
                                   c_in * 9)
    assert passed, message


@pytest.mark.parametrize("c_out, pool", [(128, 1), (128, 2), (256, 2)])
def test_conv_control_triggers_no_check(c_out, pool):
    """The correct base of the conv bugs passes every check and the golden comparison."""
    from fixtures.buggy_kernels import _control_conv as control
    from reference.conv2d import conv2d_maxpool
    X, Wt, bias, _ = control.inputs(c_out=c_out, pool_size=pool)
    out = _run_clean(control.fused_conv2d_maxpool, X, Wt, bias, pool_size=pool)
    passed, message = golden_check(out, conv2d_maxpool(X, Wt, bias, pool), np.float32,
                                   control.REDUCTION_LENGTH)
    assert passed, message
