"""Beta 1 matmul masks: "operand masking" (``lhs_T[i_f <= 64]``) and ``psum += nc_matmul(...,
mask=...)``.

Truth: the API masking page (nki.api.shared.rst, aws-neuron-sdk 1db4d74e): "we introduce
'operand masking' syntax for matmult APIs to let users to precisely define the masking on the
inputs", ``nl.matmul(lhs_T[i_lhs_f <= 64], rhs[i_rhs_f <= 256], transpose_x=True)``,
"currently only matmult APIs support operand masking"; a masked instruction "only processes"
the masked-in elements. ``psum += nisa.nc_matmul(...)`` is one accumulating matmul instruction
(reference §1.11), so a masked one leaves the masked-out PSUM elements as they were, which
nki-samples reference/allocated_fused_linear.py relies on (``mask=((2*i + grp) * pmax <
seqlen)`` for the last tile). NumPy gives the values.
"""

import warnings

import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl

RNG = np.random.default_rng(11)
LHS_T = RNG.standard_normal((128, 128)).astype(np.float32)
RHS = RNG.standard_normal((128, 512)).astype(np.float32)


def simulate(k, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return nki.simulate_kernel(nki.jit(k), *args)


def test_the_docs_operand_masking_example_computes_the_masked_in_block():
    # `<= 64` keeps 65 columns of lhs_T and `<= 256` 257 of rhs, as the predicate says
    def k(lhs_t, rhs):
        out = nl.ndarray((65, 257), dtype=nl.float32, buffer=nl.shared_hbm)
        i_lhs_f = nl.arange(128)[None, :]
        i_rhs_f = nl.arange(512)[None, :]
        lt = nl.load(lhs_t)
        rt = nl.load(rhs)
        res = nl.matmul(lt[i_lhs_f <= 64], rt[i_rhs_f <= 256], transpose_x=True)
        nl.store(out, res[0:65, 0:257])
        return out

    np.testing.assert_allclose(simulate(k, LHS_T, RHS), LHS_T[:, :65].T @ RHS[:, :257],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("transpose_x", [True, False])
def test_masked_out_operand_elements_are_never_read(transpose_x):
    # a remainder tile: only the first 40 partitions (contraction rows) were loaded; the rest
    # of the tile was never written, and the mask keeps the matmul away from it
    def k(x, rhs):
        out = nl.ndarray((64, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        shape = (128, 64) if transpose_x else (64, 128)
        xt = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        rt = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        if transpose_x:
            xt[0:40, :] = nl.load(x)
            i_k = nl.arange(128)[:, None]
        else:
            xt[:, 0:40] = nl.load(x)
            i_k = nl.arange(128)[None, :]
        rt[0:40, :] = nl.load(rhs[0:40, :])
        i_kr = nl.arange(128)[:, None]
        res = nl.matmul(xt[i_k < 40], rt[i_kr < 40], transpose_x=transpose_x)
        nl.store(out, res)
        return out

    x = LHS_T[:40, :64] if transpose_x else np.ascontiguousarray(LHS_T[:40, :64].T)
    np.testing.assert_allclose(simulate(k, x, RHS), LHS_T[:40, :64].T @ RHS[:40],
                               rtol=1e-4, atol=1e-4)


def test_the_result_elements_outside_the_operand_masks_are_not_computed():
    def k(lhs_t, rhs):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        i_f = nl.arange(128)[None, :]
        res = nisa.nc_matmul(nl.load(lhs_t)[i_f < 64], nl.load(rhs))
        nl.store(out, res)           # rows 64-127 of the result were never computed
        return out

    with pytest.warns(UserWarning, match=r"reads `res\[64:128, 0:512\]` \(32768 of 65536 "
                      "elements never written"):
        nki.simulate_kernel(nki.jit(k), LHS_T, RHS)


def test_operand_masking_is_for_matmuls_only():
    def k(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        i_f = nl.arange(512)[None, :]
        nl.store(out, nl.exp(nl.load(a)[i_f < 256]))
        return out

    with pytest.raises(ValueError, match="only matmult APIs support operand masking"):
        nki.simulate_kernel(nki.jit(k), RHS)


def test_a_masked_accumulating_matmul_leaves_the_masked_out_psum_elements():
    # allocated_fused_linear's pattern: the last tile's matmul is masked off entirely
    def k(lhs_t, rhs):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        lt = nl.load(lhs_t)
        rt = nl.load(rhs)
        ps = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        for i in nl.affine_range(4):
            ps += nisa.nc_matmul(lt, rt, mask=(i * 128 < 300))
        nl.store(out, ps)
        return out

    np.testing.assert_allclose(simulate(k, LHS_T, RHS), 3 * (LHS_T.T @ RHS),
                               rtol=1e-4, atol=1e-3)


def test_a_masked_accumulating_matmul_accumulates_its_masked_in_columns_only():
    def k(lhs_t, rhs):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        lt = nl.load(lhs_t)
        rt = nl.load(rhs)
        i_p, i_f = nl.mgrid[0:128, 0:512]
        ps = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        ps += nisa.nc_matmul(lt, rt)
        ps += nisa.nc_matmul(lt, rt[i_p, i_f], mask=(i_f < 100))
        nl.store(out, ps)
        return out

    want = LHS_T.T @ RHS
    want[:, :100] *= 2
    np.testing.assert_allclose(simulate(k, LHS_T, RHS), want, rtol=1e-4, atol=1e-3)


def test_nl_matmul_passes_its_mask_on():
    # nl.matmul(mask=) used to be dropped: the whole product was computed and stored
    def k(lhs_t, rhs):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:512]
        ps = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        ps += nl.matmul(nl.load(lhs_t), nl.load(rhs)[i_p, i_f], transpose_x=True,
                        mask=(i_f < 200))
        nl.store(out, ps)
        return out

    want = LHS_T.T @ RHS
    want[:, 200:] = 0
    np.testing.assert_allclose(simulate(k, LHS_T, RHS), want, rtol=1e-4, atol=1e-3)
