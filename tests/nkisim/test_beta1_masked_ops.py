"""Beta 1 ops under ``mask=`` and the documented limits of ``dma_copy(dst_rmw_op=...)``.

Truth: the API masking page (nki.api.shared.rst, aws-neuron-sdk 1db4d74e): a mask makes the
instruction process only the masked-in index region ("lowered into a hardware ISA instruction
that only processes 64x256 elements"); nisa.activation's docstring reduces its *output*
("accu_registers = reduce_op(accu_registers, reduce_op(output, axis=<FreeAxis>))"), and
dma_copy's: "Currently only np.add is supported ... If dst_rmw_op is specified, only
oob_mode=oob_mode.error is allowed". NumPy gives the values.
"""

import warnings

import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl

RNG = np.random.default_rng(5)
X = RNG.standard_normal((4, 8)).astype(np.float32)
KEEP = 5                                         # mask=(i_f < 5)


def simulate(k, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # (the partly written outputs are the point)
        return nki.simulate_kernel(nki.jit(k), *args)


@pytest.mark.parametrize("how", ["activation", "activation_reduce"])
def test_a_masked_activation_reduces_its_masked_in_outputs(how):
    def k(a):
        o = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        i_p, i_f = nl.mgrid[0:4, 0:8]
        r = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
        if how == "activation":
            nisa.activation(nl.exp, t[i_p, i_f], reduce_op=nl.add, reduce_res=r,
                            reduce_cmd=nisa.reduce_cmd.reset_reduce, mask=(i_f < KEEP))
        else:
            nisa.activation_reduce(nl.exp, t[i_p, i_f], reduce_op=nl.add, reduce_res=r,
                                   mask=(i_f < KEEP))
        nl.store(o, r)
        return o

    np.testing.assert_allclose(simulate(k, X)[:, 0], np.exp(X[:, :KEEP]).sum(1), rtol=1e-6)


def test_masked_softmax_and_rms_norm_use_the_masked_in_elements():
    def k(a, w):
        s = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        r = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        i_p, i_f = nl.mgrid[0:4, 0:8]
        nl.store(s[i_p, i_f], nl.softmax(t[i_p, i_f], axis=1, mask=(i_f < KEEP)),
                 mask=(i_f < KEEP))
        nl.store(r[i_p, i_f], nl.rms_norm(t[i_p, i_f], nl.load(w), axis=1, n=KEEP,
                                          mask=(i_f < KEEP)), mask=(i_f < KEEP))
        return s, r

    w = RNG.random((1, 8)).astype(np.float32)
    s, r = simulate(k, X, w)
    x = X[:, :KEEP]
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(s[:, :KEEP], e / e.sum(1, keepdims=True), rtol=1e-6)
    rms = np.sqrt((x ** 2).sum(1, keepdims=True) / KEEP + 1e-6)
    np.testing.assert_allclose(r[:, :KEEP], x / rms * w[:, :KEEP], rtol=1e-5)


@pytest.mark.parametrize("op,oob,match", [
    (np.multiply, None, r"dst_rmw_op=multiply is not supported \(\"Currently only np.add"),
    (np.add, nisa.oob_mode.skip, r"dst_rmw_op needs oob_mode=oob_mode.error"),
])
def test_dma_copy_read_modify_write_is_add_with_oob_error_only(op, oob, match):
    def k(a):
        o = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=a)
        kw = {} if oob is None else {"oob_mode": oob}
        nisa.dma_copy(dst=o, src=nl.load(a), dst_rmw_op=op, **kw)
        return o

    with pytest.raises(ValueError, match=match):
        simulate(k, X)


def test_dma_copy_add_read_modify_write_adds():
    def k(a):
        o = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=a)
        nisa.dma_copy(dst=o, src=nl.load(a), dst_rmw_op=np.add)
        return o

    np.testing.assert_array_equal(simulate(k, X), X + X)
