"""Keywords a Beta 1 op's ``**kwargs`` swallows (nkisim.ops.ignored_keywords).

Truth: Beta 1's signatures end in ``**kwargs`` (``nl.matmul(x, y, *, transpose_x=False,
mask=None, **kwargs)``, reference §1.6-1.8), so a misspelled keyword is no Python error there
and the op runs without it: ``nl.matmul(x, y, tranpose_x=True)`` computes ``x @ y``. nkisim
computes what the device does and says which keyword went nowhere; the keywords an op names run
without a warning.
"""

import warnings

import numpy as np
import pytest

from nkisim import NKIWarning
from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl

RNG = np.random.default_rng(7)
X = RNG.random((128, 128), dtype=np.float32)
Y = RNG.random((128, 256), dtype=np.float32)


def simulate(kernel, *args):
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        out = nki.simulate_kernel(nki.jit(kernel), *args)
    return out, [str(w.message) for w in ws if issubclass(w.category, NKIWarning)]


def matmul(**kw):
    def k(x, y):
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nl.matmul(nl.load(x), nl.load(y), **kw)))
        return out
    return k


def test_a_misspelled_keyword_is_named_with_the_parameter_it_is_closest_to():
    out, texts = simulate(matmul(tranpose_x=True), X, Y)
    np.testing.assert_allclose(out, X @ Y, rtol=1e-5)        # the device ignores it too
    assert texts == ["suspicious pattern: nl.matmul() has no parameter `tranpose_x`; NKI Beta 1 "
                     "takes it into **kwargs and ignores it: did you mean transpose_x=?"]


def test_the_keywords_an_op_names_run_without_a_warning():
    out, texts = simulate(matmul(transpose_x=True), X, Y)
    np.testing.assert_allclose(out, X.T @ Y, rtol=1e-5)
    assert texts == []


@pytest.mark.parametrize("call,api,meant", [
    (lambda x: nl.sum(nl.load(x), axis=1, keepdim=True), "nl.sum", "keepdims"),
    (lambda x: nl.load(x, dtpye=nl.bfloat16), "nl.load", "dtype"),
    (lambda x: nisa.tensor_reduce(nl.add, nl.load(x), axis=1, negat=True), "nisa.tensor_reduce",
     "negate"),
])
def test_each_face_names_its_op(call, api, meant):
    def k(x):
        t = call(x)
        out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    _, texts = simulate(k, X)
    assert len(texts) == 1, texts
    assert texts[0].startswith(f"suspicious pattern: {api}() has no parameter `")
    assert texts[0].endswith(f"did you mean {meant}=?")


def test_a_keyword_like_no_parameter_passes_silently():
    # AWS's nki-samples reference/attention.py passes nl.full(..., lazy_initialization=True),
    # which no docstring lists: keywords that are no near miss may mean something to the
    # compiler
    def k(x):
        t = nl.full((128, 128), 1.0, dtype=nl.float32, buffer=nl.sbuf, lazy_initialization=True)
        u = nl.add(nl.load(x), t, op=np.add)
        out = nl.ndarray(u.shape, dtype=u.dtype, buffer=nl.shared_hbm)
        nl.store(out, u)
        return out

    out, texts = simulate(k, X)
    np.testing.assert_array_equal(out, X + 1)
    assert texts == []
