"""The worked examples of shared/spec/nki-current.md §5 (vector add, transpose, conv2d + bias +
max-pool) in the current dialect, against NumPy.

The kernels are the spec's own code (written for the spec, not AWS's), run through the current
face exactly as a user runs them: ``@nki.jit`` kernels called through ``nki.simulate``, with
``nki.language`` and ``nki.isa``. Spec §5.0 checked them against a NumPy mock of the documented
semantics; here they run on nkisim and must match NumPy references computed independently.
"""

import numpy as np
import pytest

import nkisim.nki as nki
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl
from nkisim.runtime import last_run

RNG = np.random.default_rng(55)


def run(kernel, *args, **kwargs):
    return nki.simulate(kernel)(*args, **kwargs)


# --- §5.1 vector_add_tiled (CS149 Part 1) ----------------------------------------------------

@nki.jit
def vector_add_tiled(a_vec, b_vec):
    M = a_vec.shape[0]
    P = nl.tile_size.pmax
    assert M % P == 0
    out = nl.ndarray(a_vec.shape, dtype=a_vec.dtype, buffer=nl.shared_hbm)
    a2, b2, o2 = a_vec.reshape((M, 1)), b_vec.reshape((M, 1)), out.reshape((M, 1))
    for m in range(M // P):
        rows = slice(m * P, (m + 1) * P)
        a_t = nl.ndarray((P, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
        b_t = nl.ndarray((P, 1), dtype=b_vec.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a_t, src=a2[rows, :])
        nisa.dma_copy(dst=b_t, src=b2[rows, :])
        c_t = nl.ndarray((P, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=c_t, data1=a_t, data2=b_t, op=nl.add)
        nisa.dma_copy(dst=o2[rows, :], src=c_t)
    return out


def test_vector_add_tiled_matches_numpy():
    a, b = RNG.normal(size=1024).astype(np.float32), RNG.normal(size=1024).astype(np.float32)
    np.testing.assert_array_equal(run(vector_add_tiled, a, b), a + b)


# --- §5.2 matrix_transpose (nc_transpose path) -----------------------------------------------

@nki.jit
def matrix_transpose(a_tensor):
    M, N = a_tensor.shape
    T = nl.tile_size.pmax
    assert M % T == 0 and N % T == 0
    out = nl.ndarray((N, M), dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    for i in range(M // T):
        for j in range(N // T):
            a_sb = nl.ndarray((T, T), dtype=a_tensor.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a_sb, src=a_tensor[i*T:(i+1)*T, j*T:(j+1)*T])
            t_ps = nl.ndarray((T, T), dtype=a_tensor.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=t_ps, data=a_sb)
            t_sb = nl.ndarray((T, T), dtype=a_tensor.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=t_sb, src=t_ps)
            nisa.dma_copy(dst=out[j*T:(j+1)*T, i*T:(i+1)*T], src=t_sb)
    return out


def test_matrix_transpose_matches_numpy():
    a = RNG.normal(size=(256, 384)).astype(np.float32)
    np.testing.assert_array_equal(run(matrix_transpose, a), a.T)


# --- §5.3 conv2d + bias + max-pool (CS149 Part 2 shape) ---------------------------------------

@nki.jit
def fused_conv2d_maxpool(X, W, bias, pool_size=1, explicit=True, bias_tt=False):
    # `explicit`: the spec's accumulate=(step > 0), or its note [t]'s alternative, None;
    # `bias_tt`: note [u]'s alternative, tensor_tensor with a stride-0 .ap() bias

    B, C_in, H, Wd = X.shape
    C_out, _, K, _ = W.shape
    P = nl.tile_size.pmax
    OH, OW = H - K + 1, Wd - K + 1
    R = min(OH, nl.tile_size.gemm_moving_fmax // OW)
    R -= R % pool_size
    assert C_in % P == 0 and C_out % P == 0 and OH % R == 0
    n_ci, n_co, KK = C_in // P, C_out // P, K * K
    X_out = nl.ndarray((B, C_out, OH // pool_size, OW // pool_size), dtype=X.dtype,
                       buffer=nl.shared_hbm)
    W3, bias2 = W.reshape((C_out, C_in, KK)), bias.reshape((C_out, 1))
    for co in range(n_co):
        cos = slice(co * P, (co + 1) * P)
        b_raw = nl.ndarray((P, 1), dtype=bias.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=b_raw, src=bias2[cos, :])
        b_f32 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=b_f32, src=b_raw)
        w_T = []
        for ci in range(n_ci):
            w_nat = nl.ndarray((P, P, KK), dtype=W.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=w_nat, src=W3[cos, ci*P:(ci+1)*P, :])
            wt = nl.ndarray((P, KK, P), dtype=W.dtype, buffer=nl.sbuf)
            for t in range(KK):
                wt_ps = nl.ndarray((P, P), dtype=W.dtype, buffer=nl.psum)
                nisa.nc_transpose(dst=wt_ps, data=w_nat[:, :, t])
                nisa.tensor_copy(dst=wt[:, t, :], src=wt_ps)
            w_T.append(wt)
        for b in range(B):
            for r0 in range(0, OH, R):
                x_sb = []
                for ci in range(n_ci):
                    xt = nl.ndarray((P, R + K - 1, Wd), dtype=X.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=xt, src=X[b, ci*P:(ci+1)*P, r0:r0 + R + K - 1, :])
                    x_sb.append(xt)
                ps = nl.ndarray((P, R, OW), dtype=nl.float32, buffer=nl.psum)
                step = 0
                for ci in range(n_ci):
                    for kh in range(K):
                        for kw in range(K):
                            nisa.nc_matmul(dst=ps,
                                           stationary=w_T[ci][:, kh*K + kw, :],
                                           moving=x_sb[ci][:, kh:kh + R, kw:kw + OW],
                                           accumulate=(step > 0) if explicit else None)
                            step += 1
                conv = nl.ndarray((P, R, OW), dtype=X.dtype, buffer=nl.sbuf)
                if bias_tt:
                    b_bc = b_f32.ap([[1, P], [0, R], [0, OW]])      # stride 0: broadcast
                    nisa.tensor_tensor(dst=conv, data1=ps, data2=b_bc, op=nl.add)
                else:
                    nisa.tensor_scalar(dst=conv, data=ps, op0=nl.add, operand0=b_f32)
                if pool_size == 1:
                    nisa.dma_copy(dst=X_out[b, cos, r0:r0 + R, :], src=conv)
                else:
                    s = pool_size
                    win = conv.ap([[R*OW, P], [s*OW, R//s], [s, OW//s], [OW, s], [1, s]])
                    pooled = nl.ndarray((P, R//s, OW//s), dtype=X.dtype, buffer=nl.sbuf)
                    nisa.tensor_reduce(dst=pooled, op=nl.maximum, data=win, axis=(3, 4))
                    nisa.dma_copy(dst=X_out[b, cos, r0//s:(r0 + R)//s, :], src=pooled)
    return X_out


def conv_reference(X, W, bias, pool):
    B, C_in, H, Wd = X.shape
    C_out, _, K, _ = W.shape
    OH, OW = H - K + 1, Wd - K + 1
    out = np.zeros((B, C_out, OH, OW), np.float64)
    for kh in range(K):
        for kw in range(K):
            out += np.einsum("oc,bchw->bohw", W[:, :, kh, kw].astype(np.float64),
                             X[:, :, kh:kh + OH, kw:kw + OW].astype(np.float64))
    out += bias.reshape(1, -1, 1, 1)
    if pool > 1:
        out = out.reshape(B, C_out, OH // pool, pool, OW // pool, pool).max(axis=(3, 5))
    return out


@pytest.mark.parametrize("pool", [1, 2])
@pytest.mark.parametrize("explicit", [True, False], ids=["accumulate_i_gt_0", "accumulate_None"])
def test_conv2d_maxpool_matches_numpy(pool, explicit):
    X = RNG.normal(size=(2, 256, 10, 12)).astype(np.float32)
    W = (RNG.normal(size=(256, 256, 3, 3)) / 48).astype(np.float32)
    bias = RNG.normal(size=256).astype(np.float32)
    out = run(fused_conv2d_maxpool, X, W, bias, pool_size=pool, explicit=explicit)
    np.testing.assert_allclose(out, conv_reference(X, W, bias, pool), rtol=1e-4, atol=1e-4)
    mm = [i for i in last_run().trace.instrs if i.op == "nc_matmul"]
    assert len(mm) == 2 * 2 * 2 * 9 and [i.detail["accumulate"] for i in mm[:9]] == \
        [False] + [True] * 8                   # each PSUM tile: one group of 2 x 9 matmuls


def test_conv2d_bias_through_tensor_tensor_and_a_stride_0_ap():
    X = RNG.normal(size=(1, 128, 6, 8)).astype(np.float32)
    W = (RNG.normal(size=(128, 128, 3, 3)) / 34).astype(np.float32)
    bias = RNG.normal(size=128).astype(np.float32)
    out = run(fused_conv2d_maxpool, X, W, bias, pool_size=2, bias_tt=True)
    np.testing.assert_allclose(out, conv_reference(X, W, bias, 2), rtol=1e-4, atol=1e-4)
