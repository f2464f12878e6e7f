"""``nisa`` ops on nkisim against NumPy (nki-reference §1.10, §1.11).

Truth: NumPy in fp32/float64, ml_dtypes casts (RNE), and the semantics the reference quotes from
the 2.26 docs and tests (e.g. ``tensor_scalar(a, np.subtract, 1.0)`` = a - 1, with ``reverse0`` =
1 - a; ``nc_matmul`` = stationary.T @ moving in fp32 PSUM).
"""

import ml_dtypes
import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = [np.float32, np.float16, BF16]
RNG = np.random.default_rng(2024)


def rand(shape, dtype=np.float32, lo=-4.0, hi=4.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32).astype(dtype)


def hbm_out(shape, dtype=np.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)


def store(t):
    out = hbm_out(t.shape, t.dtype)
    nl.store(out, t)
    return out


def run_tiles(fn, *arrays):
    @nki.jit
    def kernel(*ins):
        return store(fn(*[nl.load(x) for x in ins]))
    return nki.simulate_kernel(kernel, *arrays)


# ---------------------------------------------------------------------------------------------
# enums and versions


def test_engine_enums_values_and_aliases():
    assert (int(nisa.engine.unknown), int(nisa.engine.tensor), int(nisa.engine.scalar),
            int(nisa.engine.gpsimd), int(nisa.engine.vector), int(nisa.engine.sync)) == \
        (0, 1, 2, 3, 5, 6)
    assert nisa.tensor_engine is nisa.engine.tensor
    assert nisa.vector_engine is nisa.engine.vector
    assert nisa.scalar_engine is nisa.engine.scalar
    assert nisa.gpsimd_engine is nisa.engine.gpsimd
    assert nisa.unknown_engine is nisa.engine.unknown
    assert [int(m) for m in nisa.dge_mode] == [0, 1, 2, 3]
    assert (int(nisa.oob_mode.error), int(nisa.oob_mode.skip)) == (0, 1)
    assert [int(c) for c in nisa.reduce_cmd] == [0, 1, 2, 3]
    assert (int(nisa.nc_version.gen2), int(nisa.nc_version.gen3)) == (2, 3)


@pytest.mark.parametrize("target,version", [("trn1", 2), ("trn2", 3), (None, 3)])
def test_get_nc_version_per_target(target, version):
    seen = []

    def body():
        seen.append(nisa.get_nc_version())
        t = nl.zeros((1, 1), dtype=nl.float32)
        return store(t)

    kernel = nki.jit(body, platform_target=target) if target else nki.jit(body)
    nki.simulate_kernel(kernel)
    assert seen == [nisa.nc_version(version)]


def test_get_nc_version_follows_nkisim_target_env(monkeypatch):
    monkeypatch.setenv("NKISIM_TARGET", "trn1")
    seen = []

    @nki.jit
    def kernel():
        seen.append(nisa.get_nc_version())
        return store(nl.zeros((1, 1), dtype=nl.float32))

    nki.simulate_kernel(kernel)
    assert seen == [nisa.nc_version.gen2]


# ---------------------------------------------------------------------------------------------
# dma_copy


def test_dma_copy_hbm_sbuf_hbm():
    a = rand((128, 64))

    @nki.jit
    def kernel(a):
        t = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a)


def test_dma_copy_hbm_to_hbm_has_no_partition_limit():
    a = rand((256, 1))

    @nki.jit
    def kernel(a):
        out = nl.ndarray((256, 1), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a)


def test_dma_copy_sbuf_to_sbuf_and_element_count_reshape():
    a = rand((64,))

    @nki.jit
    def kernel(a):
        t = nl.ndarray((64, 1), dtype=a.dtype)
        nisa.dma_copy(src=a, dst=t)                 # (N,) -> (N, 1) as CS149 does
        u = nl.ndarray((64, 1), dtype=a.dtype)
        nisa.dma_copy(src=t, dst=u)
        out = nl.ndarray((64,), dtype=a.dtype, buffer=nl.hbm)
        nisa.dma_copy(src=u, dst=out)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a)


@pytest.mark.parametrize("src_dtype,dst_dtype", [(np.float32, BF16), (np.float32, np.float16),
                                                 (BF16, np.float32), (np.float32, np.int32),
                                                 (np.int32, np.float32)])
def test_dma_copy_casts(src_dtype, dst_dtype):
    a = (rand((32, 16)) * 100).astype(src_dtype)

    @nki.jit
    def kernel(a):
        t = nl.ndarray((32, 16), dtype=dst_dtype)
        nisa.dma_copy(dst=t, src=a)
        return store(t)

    out = nki.simulate_kernel(kernel, a)
    assert out.dtype == np.dtype(dst_dtype)
    if np.dtype(dst_dtype).kind == "i":
        ref = np.rint(a.astype(np.float64)).astype(dst_dtype)   # RNE (dtypes.py)
    else:
        ref = a.astype(np.float32).astype(dst_dtype)
    np.testing.assert_array_equal(out, ref)


def test_dma_copy_dst_rmw_op_accumulates():
    a, b = rand((16, 8)), rand((16, 8))

    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        t = nl.load(b)
        nisa.dma_copy(dst=out, src=t, dst_rmw_op=np.add)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a, b), a + b)


def test_dma_copy_with_dge_mode_and_oob_mode_kwargs():
    a = rand((8, 8))

    @nki.jit
    def kernel(a):
        t = nl.ndarray((8, 8), dtype=a.dtype)
        nisa.dma_copy(dst=t, src=a, dge_mode=nisa.dge_mode.hwdge, oob_mode=nisa.oob_mode.error)
        return store(t)

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a)


# ---------------------------------------------------------------------------------------------
# tensor_copy


@pytest.mark.parametrize("engine", [nisa.engine.unknown, nisa.vector_engine, nisa.scalar_engine,
                                    nisa.gpsimd_engine])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_tensor_copy_engines_and_dtype(engine, dtype):
    a = rand((32, 20))
    out = run_tiles(lambda t: nisa.tensor_copy(t, engine=engine, dtype=dtype), a)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, a.astype(dtype))


def test_tensor_copy_from_psum_returns_sbuf():
    a = rand((64, 64))

    @nki.jit
    def kernel(a):
        p = nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)
        s = nisa.tensor_copy(p)
        assert p.buffer == "psum" and s.buffer == "sbuf"
        return store(s)

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a.T)


def test_tensor_copy_into_predeclared_psum_tile():
    a = rand((16, 16))

    @nki.jit
    def kernel(a):
        p = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.psum)
        p[...] = nisa.tensor_copy(nl.load(a))
        return store(nl.copy(p))

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a)


# ---------------------------------------------------------------------------------------------
# tensor_scalar


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_tensor_scalar_single_op_and_reverse(dtype):
    a = rand((64, 32), dtype)
    f32 = a.astype(np.float32)
    out = run_tiles(lambda t: nisa.tensor_scalar(t, np.subtract, 1.0), a)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, (f32 - 1).astype(dtype))
    out = run_tiles(lambda t: nisa.tensor_scalar(t, np.subtract, 1.0, reverse0=True), a)
    np.testing.assert_array_equal(out, (1 - f32).astype(dtype))


def test_tensor_scalar_two_ops_with_vector_operand():
    # op0=np.multiply, operand0=f[(64,1)], op1=np.add, operand1=2.5 = e*f+2.5 (ref §1.10)
    e, f = rand((64, 48)), rand((64, 1))
    out = run_tiles(lambda x, y: nisa.tensor_scalar(data=x, op0=np.multiply, operand0=y,
                                                    op1=np.add, operand1=2.5), e, f)
    np.testing.assert_array_equal(out, e * f + np.float32(2.5))


def test_tensor_scalar_reverse1():
    e, f = rand((32, 8)), rand((32, 1), np.float32, 1, 2)
    out = run_tiles(lambda x, y: nisa.tensor_scalar(x, nl.add, 1.0, op1=nl.divide, operand1=y,
                                                    reverse1=True), e, f)
    np.testing.assert_array_equal(out, f / (e + np.float32(1)))


def test_tensor_scalar_both_reversed_with_two_vectors():
    e, f, g = rand((32, 8)), rand((32, 1)), rand((32, 1))
    out = run_tiles(lambda x, y, z: nisa.tensor_scalar(x, nl.subtract, y, reverse0=True,
                                                       op1=nl.subtract, operand1=z,
                                                       reverse1=True), e, f, g)
    np.testing.assert_array_equal(out, g - (f - e))


def test_tensor_scalar_vector_add_of_column_tiles():
    # the CS149 naive kernel: tensor_scalar(a_sbuf, nl.add, b_sbuf) with (N, 1) tiles
    a, b = rand((128, 1)), rand((128, 1))
    np.testing.assert_array_equal(run_tiles(lambda x, y: nisa.tensor_scalar(x, nl.add, y), a, b),
                                  a + b)


def test_tensor_scalar_computes_in_fp32_between_ops():
    # fp16: 300 * 300 = 90000 overflows fp16 (max 65504); in fp32 (then / 300) it is exact
    a = np.full((8, 8), 300, np.float16)
    out = run_tiles(lambda t: nisa.tensor_scalar(t, np.multiply, 300.0, op1=np.divide,
                                                 operand1=300.0), a)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, a)


def test_tensor_scalar_bitvec_on_ints():
    a = RNG.integers(0, 1 << 16, size=(16, 8)).astype(np.int32)
    out = run_tiles(lambda t: nisa.tensor_scalar(t, nl.bitwise_and, 0xFF, op1=nl.left_shift,
                                                 operand1=2), a)
    np.testing.assert_array_equal(out, (a & 0xFF) << 2)


def test_tensor_scalar_dtype_and_psum_input():
    a = rand((32, 32))

    @nki.jit
    def kernel(a):
        p = nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)
        r = nisa.tensor_scalar(p, nl.multiply, 2.0, dtype=nl.bfloat16)
        assert r.dtype == BF16 and r.buffer == "sbuf"
        return store(r)

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), (a.T * 2).astype(BF16))


# ---------------------------------------------------------------------------------------------
# tensor_tensor


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,ref", [(nl.add, np.add), (np.subtract, np.subtract),
                                    (nl.multiply, np.multiply), (np.maximum, np.maximum),
                                    (nl.divide, np.divide)])
def test_tensor_tensor(op, ref, dtype):
    a, b = rand((128, 50), dtype), rand((128, 50), dtype, 0.5, 2)
    out = run_tiles(lambda x, y: nisa.tensor_tensor(x, y, op=op), a, b)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, ref(a.astype(np.float32), b.astype(np.float32))
                                  .astype(dtype))


def test_tensor_tensor_output_dtype_is_higher_precision_input():
    a, b = rand((16, 16), BF16), rand((16, 16), np.float32)
    out = run_tiles(lambda x, y: nisa.tensor_tensor(x, y, op=nl.add), a, b)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, a.astype(np.float32) + b)
    out = run_tiles(lambda x, y: nisa.tensor_tensor(x, y, op=nl.add, dtype=nl.float16), a, b)
    assert out.dtype == np.float16


def test_tensor_tensor_with_psum_input():
    a, b = rand((64, 64)), rand((64, 64))

    @nki.jit
    def kernel(a, b):
        p = nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)    # PSUM
        s = nl.load(b)
        r1 = nisa.tensor_tensor(p, s, op=nl.add)
        r2 = nisa.tensor_tensor(s, p, op=nl.subtract)
        return store(r1), store(r2)

    r1, r2 = nki.simulate_kernel(kernel, a, b)
    np.testing.assert_array_equal(r1, a.T + b)
    np.testing.assert_array_equal(r2, b - a.T)


def test_tensor_tensor_free_dim_broadcast_of_column_operand():
    # adding a per-partition bias (P, 1) to a (P, F) tile
    a, bias = rand((128, 30)), rand((128, 1))
    out = run_tiles(lambda x, y: nisa.tensor_tensor(x, y, op=nl.add), a, bias)
    assert out.shape == (128, 30)
    np.testing.assert_array_equal(out, a + bias)


def test_tensor_tensor_same_elements_per_partition_different_shape():
    a, b = rand((16, 4, 6)), rand((16, 24))
    out = run_tiles(lambda x, y: nisa.tensor_tensor(x, y, op=nl.multiply), a, b)
    np.testing.assert_array_equal(out.reshape(16, 24), a.reshape(16, 24) * b)


def test_tensor_tensor_gpsimd_engine_int32():
    a = RNG.integers(-1000, 1000, size=(16, 8)).astype(np.int32)
    b = RNG.integers(-1000, 1000, size=(16, 8)).astype(np.int32)
    out = run_tiles(lambda x, y: nisa.tensor_tensor(x, y, op=nl.add, engine=nisa.gpsimd_engine),
                    a, b)
    np.testing.assert_array_equal(out, a + b)


# ---------------------------------------------------------------------------------------------
# tensor_reduce


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op,ref", [(np.add, np.sum), (nl.add, np.sum), (nl.max, np.max),
                                    (np.max, np.max), (nl.maximum, np.max), (nl.min, np.min),
                                    (np.multiply, np.prod)])
def test_tensor_reduce_last_axis(op, ref, dtype):
    lo, hi = (0.9, 1.1) if ref is np.prod else (-4, 4)
    a = rand((128, 64), dtype, lo, hi)
    out = run_tiles(lambda t: nisa.tensor_reduce(op, t, axis=[1]), a)
    assert out.shape == (128, 1) and out.dtype == np.dtype(dtype)
    refv = ref(a.astype(np.float32), axis=1, keepdims=True)
    np.testing.assert_allclose(out.astype(np.float32), refv.astype(dtype).astype(np.float32),
                               rtol=float(ml_dtypes.finfo(dtype).eps) * 2, atol=1e-4)


@pytest.mark.parametrize("axis", [3, (3,), [2, 3], (1, 2, 3), -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_tensor_reduce_axis_forms_and_keepdims(axis, keepdims):
    a = rand((16, 2, 3, 5))
    out = run_tiles(lambda t: nisa.tensor_reduce(np.add, t, axis=axis, keepdims=keepdims), a)
    axes = tuple(x % 4 for x in np.atleast_1d(axis))
    ref = a.astype(np.float64).sum(axis=axes, keepdims=keepdims)
    if ref.ndim == 1:
        ref = ref[:, None]
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_tensor_reduce_negate():
    a = rand((32, 40))
    out = run_tiles(lambda t: nisa.tensor_reduce(np.max, t, axis=1, negate=True, keepdims=True),
                    a)
    np.testing.assert_array_equal(out, -a.max(axis=1, keepdims=True))


def test_tensor_reduce_on_psum_and_dtype():
    a = rand((64, 128))

    @nki.jit
    def kernel(a):
        p = nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)    # (128, 64) in PSUM
        r = nisa.tensor_reduce(nl.add, p, axis=(1,), dtype=nl.bfloat16)
        assert r.dtype == BF16 and r.buffer == "sbuf"
        return store(r)

    out = nki.simulate_kernel(kernel, a)
    ref = a.T.astype(np.float64).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2**-7, atol=1e-3)


def test_tensor_reduce_bitwise_on_ints():
    a = RNG.integers(0, 256, size=(8, 16)).astype(np.int32)
    out = run_tiles(lambda t: nisa.tensor_reduce(nl.bitwise_or, t, axis=1), a)
    np.testing.assert_array_equal(out[:, 0], np.bitwise_or.reduce(a, axis=1))


# ---------------------------------------------------------------------------------------------
# nc_matmul (ref §1.10, §1.11)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [np.dtype(ml_dtypes.float8_e4m3)])
@pytest.mark.parametrize("K,M,N", [(128, 128, 512), (128, 126, 512), (37, 5, 11), (1, 1, 1)])
def test_nc_matmul_2d(K, M, N, dtype):
    st = rand((K, M), dtype, -1, 1)
    mv = rand((K, N), dtype, -1, 1)

    @nki.jit
    def kernel(st, mv):
        r = nisa.nc_matmul(nl.load(st), nl.load(mv))
        assert r.shape == (M, N) and r.dtype == np.float32 and r.buffer == "psum"
        return store(r)

    out = nki.simulate_kernel(kernel, st, mv)
    ref = st.astype(np.float64).T @ mv.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_nc_matmul_pe_tiling_the_docs_test_and_its_limits():
    """ref §1.10: tile_position/tile_size both set, multiples of 32, tile_size >= the stationary
    (the docs' test: 64x64x512 matmuls at ((i%2)*64, (j%2)*64) of size (64, 64)); a tile past
    the 128x128 array cannot be placed."""
    st, mv = rand((64, 64), np.float32, -1, 1), rand((64, 512), np.float32, -1, 1)

    def kernel_for(position, size):
        @nki.jit
        def kernel(st, mv):
            return store(nisa.nc_matmul(nl.load(st), nl.load(mv), tile_position=position,
                                        tile_size=size))
        return kernel

    for position in ((0, 0), (0, 64), (64, 0), (64, 64)):
        out = nki.simulate_kernel(kernel_for(position, (64, 64)), st, mv)
        np.testing.assert_allclose(out, st.astype(np.float64).T @ mv, rtol=1e-5, atol=1e-5)
    for position, size, why in [
            ((0, 0), (32, 64), r"tile_size \(32, 64\) is smaller than the stationary \(64 "
                               r"partitions, 64 columns\)"),
            ((96, 0), (64, 64), r"tile_position \(96, 0\) \+ tile_size \(64, 64\) reaches "
                                r"past the 128x128 PE array"),
            ((0, 16), (64, 64), "multiples of 32")]:
        with pytest.raises(ValueError, match=why):
            nki.simulate_kernel(kernel_for(position, size), st, mv)


@pytest.mark.parametrize("moving_shape", [(128, 4, 64), (64, 2, 4, 32), (32, 8, 1)])
def test_nc_matmul_multi_dim_moving(moving_shape):
    K = moving_shape[0]
    st = rand((K, 96), np.float32, -1, 1)
    mv = rand(moving_shape, np.float32, -1, 1)

    @nki.jit
    def kernel(st, mv):
        r = nisa.nc_matmul(nl.load(st), nl.load(mv))
        assert r.shape == (96,) + moving_shape[1:]
        return store(r)

    out = nki.simulate_kernel(kernel, st, mv)
    ref = np.tensordot(st.astype(np.float64), mv.astype(np.float64), axes=([0], [0]))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_nc_matmul_psum_accumulation_over_affine_range():
    # res_psum += nisa.nc_matmul(lhsT_tile, rhs_tile) inside affine_range(K // 128) (CS149-25)
    K, M, N = 512, 128, 384
    lhsT = rand((K, M), np.float32, -1, 1)
    rhs = rand((K, N), np.float32, -1, 1)

    @nki.jit
    def kernel(lhsT, rhs):
        res_psum = nl.zeros((M, N), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(K // 128):
            lhsT_tile = nl.ndarray((128, M), dtype=lhsT.dtype)
            rhs_tile = nl.ndarray((128, N), dtype=rhs.dtype)
            nisa.dma_copy(src=lhsT[k * 128:(k + 1) * 128, :], dst=lhsT_tile)
            nisa.dma_copy(src=rhs[k * 128:(k + 1) * 128, :], dst=rhs_tile)
            res_psum += nisa.nc_matmul(lhsT_tile[...], rhs_tile[...])
        res_sb = nisa.tensor_copy(res_psum)
        return store(res_sb)

    out = nki.simulate_kernel(kernel, lhsT, rhs)
    np.testing.assert_allclose(out, lhsT.astype(np.float64).T @ rhs.astype(np.float64),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_nc_matmul_low_precision_operands_accumulate_in_fp32(dtype):
    # 1.0 then sixteen times 2**-10: fp32 PSUM holds 1 + 16 * 2**-10 exactly; an accumulator in
    # the operand dtype would round every partial sum back to 1.0 (bf16) or lose bits (fp16)
    ones = np.ones((1, 4), dtype)
    vals = np.concatenate([np.ones((1, 1, 8)), np.full((16, 1, 8), 2.0**-10)]).astype(dtype)

    @nki.jit
    def kernel(ones, vals):
        st = nl.load(ones)
        acc = nl.zeros((4, 8), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(17):
            acc += nisa.nc_matmul(st, nl.load(vals[k]))
        return store(nl.copy(acc))

    out = nki.simulate_kernel(kernel, ones, vals)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.full((4, 8), 1 + 16 * 2.0**-10, np.float32))


def test_nc_matmul_result_stays_fp32_for_bf16_inputs():
    # products of bf16 values are exact in fp32: the PSUM result has more bits than bf16
    st = np.full((1, 1), 1 + 2.0**-7, BF16)
    mv = np.full((1, 1), 1 + 2.0**-7, BF16)
    out = run_tiles(lambda s, m: nisa.nc_matmul(s, m), st, mv)
    assert out.dtype == np.float32
    assert out[0, 0] == np.float32((1 + 2.0**-7) ** 2)


def test_nc_matmul_into_predeclared_psum_slice():
    st, mv = rand((128, 64), np.float32, -1, 1), rand((128, 32), np.float32, -1, 1)

    @nki.jit
    def kernel(st, mv):
        p = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
        s, m = nl.load(st), nl.load(mv)
        p[:, 0:32] = nisa.nc_matmul(s, m)
        p[:, 32:64] = nisa.nc_matmul(s, m)
        return store(nl.copy(p))

    out = nki.simulate_kernel(kernel, st, mv)
    ref = st.astype(np.float64).T @ mv.astype(np.float64)
    np.testing.assert_allclose(out, np.concatenate([ref, ref], axis=1), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# nc_transpose


@pytest.mark.parametrize("shape", [(128, 128), (128, 5), (7, 128), (64, 32)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nc_transpose_tensor_engine_into_psum(shape, dtype):
    a = rand(shape, dtype)

    @nki.jit
    def kernel(a):
        p = nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)
        assert p.buffer == "psum" and p.shape == (shape[1], shape[0])
        return store(nisa.tensor_copy(p))

    out = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(out, a.T)


@pytest.mark.parametrize("shape", [(32, 32), (8, 20), (1, 32)])
def test_nc_transpose_vector_engine_small_tiles(shape):
    a = rand(shape, BF16)

    @nki.jit
    def kernel(a):
        t = nisa.nc_transpose(nl.load(a), engine=nisa.vector_engine)
        assert t.shape == (shape[1], shape[0]) and t.buffer == "sbuf"
        return store(t)

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a.T)


# ---------------------------------------------------------------------------------------------
# activation


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_activation_plain(dtype):
    a = rand((64, 32), dtype, -2, 2)
    out = run_tiles(lambda t: nisa.activation(op=nl.exp, data=t), a)
    assert out.dtype == np.dtype(dtype)
    ref = np.exp(a.astype(np.float64)).astype(np.float32).astype(dtype).astype(np.float64)
    np.testing.assert_allclose(out.astype(np.float64), ref,
                               rtol=float(ml_dtypes.finfo(dtype).eps) * 2)


def test_activation_bias_and_scalar_scale():
    a, bias = rand((64, 32), np.float32, -1, 1), rand((64, 1), np.float32, -1, 1)
    out = run_tiles(lambda t, b: nisa.activation(op=np.tanh, data=t, bias=b, scale=2.0), a, bias)
    ref = np.tanh(a.astype(np.float64) * 2 + bias)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)


def test_activation_vector_scale():
    a, scale = rand((64, 32), np.float32, -1, 1), rand((64, 1), np.float32, 0.5, 2)
    out = run_tiles(lambda t, s: nisa.activation(op=nl.relu, data=t, scale=s), a, scale)
    np.testing.assert_array_equal(out, np.maximum(a * scale, 0))


def test_activation_copy_identity_with_dtype():
    a = rand((16, 16))
    out = run_tiles(lambda t: nisa.activation(op=nl.copy, data=t, dtype=nl.bfloat16), a)
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, a.astype(BF16))


def test_activation_reduce():
    a = rand((32, 24), np.float32, -1, 1)

    @nki.jit
    def kernel(a):
        red = nl.ndarray((32, 1), dtype=nl.float32)
        r = nisa.activation_reduce(op=nl.exp, data=nl.load(a), reduce_op=nl.add,
                                   reduce_res=red)
        return store(r), store(red)

    r, red = nki.simulate_kernel(kernel, a)
    np.testing.assert_allclose(r, np.exp(a), rtol=1e-6)
    np.testing.assert_allclose(red, np.exp(a.astype(np.float64)).sum(1, keepdims=True),
                               rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# iota, memset, affine_select, scalar_tensor_tensor, tensor_tensor_scan


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_iota(dtype):
    @nki.jit
    def kernel():
        expr = nl.arange(128)[:, None] * 3 + nl.arange(10)[None, :]
        t = nisa.iota(expr, dtype=dtype)
        assert t.shape == (128, 10) and t.dtype == np.dtype(dtype)
        return store(t)

    ref = np.arange(128)[:, None] * 3 + np.arange(10)[None, :]
    np.testing.assert_array_equal(nki.simulate_kernel(kernel), ref.astype(dtype))


def test_iota_from_mgrid_expression():
    @nki.jit
    def kernel():
        i_p, i_f = nl.mgrid[0:16, 0:8]
        return store(nisa.iota(i_f - i_p, dtype=nl.int32))

    i_p, i_f = np.mgrid[0:16, 0:8]
    np.testing.assert_array_equal(nki.simulate_kernel(kernel), (i_f - i_p).astype(np.int32))


@pytest.mark.parametrize("value,dtype", [(0, np.float32), (1.5, BF16), (-3, np.int32),
                                         (7.0, np.float16)])
@pytest.mark.parametrize("engine", [nisa.engine.unknown, nisa.vector_engine, nisa.gpsimd_engine])
def test_memset(value, dtype, engine):
    @nki.jit
    def kernel():
        t = nisa.memset((64, 12), value, dtype=dtype, engine=engine)
        assert t.shape == (64, 12) and t.dtype == np.dtype(dtype)
        return store(t)

    np.testing.assert_array_equal(nki.simulate_kernel(kernel).astype(np.float64),
                                  np.full((64, 12), value, np.float64))


def test_affine_select_upper_triangle():
    a = rand((16, 16))

    @nki.jit
    def kernel(a):
        i_p = nl.arange(16)[:, None]
        i_f = nl.arange(16)[None, :]
        r = nisa.affine_select(i_f >= i_p, nl.load(a), -1e9)
        return store(r)

    out = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(out, np.where(np.triu(np.ones((16, 16), bool)), a,
                                                np.float32(-1e9)))


def test_scalar_tensor_tensor():
    d, o0, o1 = rand((64, 20)), rand((64, 1)), rand((64, 20))
    out = run_tiles(lambda x, y, z: nisa.scalar_tensor_tensor(
        data=x, op0=nl.multiply, operand0=y, op1=nl.add, operand1=z), d, o0, o1)
    np.testing.assert_array_equal(out, d * o0 + o1)
    out = run_tiles(lambda x, z: nisa.scalar_tensor_tensor(
        data=x, op0=np.subtract, operand0=2.0, op1=np.multiply, operand1=z, reverse0=True), d, o1)
    np.testing.assert_array_equal(out, (np.float32(2) - d) * o1)
    out = run_tiles(lambda x, z: nisa.scalar_tensor_tensor(
        data=x, op0=np.add, operand0=1.0, op1=np.subtract, operand1=z, reverse1=True), d, o1)
    np.testing.assert_array_equal(out, o1 - (d + np.float32(1)))


def test_tensor_tensor_scan():
    # result[:, i] = op1(op0(data0[:, i], result[:, i-1]), data1[:, i]); a linear recurrence
    d0, d1 = rand((32, 24), np.float32, 0, 1), rand((32, 24))
    init = rand((32, 1))
    out = run_tiles(lambda a, b, c: nisa.tensor_tensor_scan(a, b, c, op0=np.multiply,
                                                            op1=np.add), d0, d1, init)
    ref = np.empty((32, 24), np.float32)
    prev = init[:, 0]
    for i in range(24):
        prev = d0[:, i] * prev + d1[:, i]
        ref[:, i] = prev
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_tensor_tensor_scan_scalar_initial():
    d0, d1 = rand((8, 10)), rand((8, 10))
    out = run_tiles(lambda a, b: nisa.tensor_tensor_scan(a, b, 0.0, op0=np.add, op1=np.maximum),
                    d0, d1)
    ref = np.empty((8, 10), np.float32)
    prev = np.zeros(8, np.float32)
    for i in range(10):
        prev = np.maximum(d0[:, i] + prev, d1[:, i])
        ref[:, i] = prev
    np.testing.assert_array_equal(out, ref)


def test_reciprocal():
    a = rand((16, 16), np.float32, 0.5, 4)
    np.testing.assert_array_equal(run_tiles(lambda t: nisa.reciprocal(t), a),
                                  np.float32(1) / a)


@pytest.mark.parametrize("ops, ok", [(("multiply", "add"), True), (("multiply", None), True),
                                     (("add", None), True), (("subtract", "maximum"), False),
                                     (("maximum", None), False)])
def test_the_trn2_scalar_engine_runs_three_tensor_scalar_op_pairs(ops, ok):
    # "The Scalar Engine on trn2 only supports a subset of the operator combination: op0=
    # np.multiply and op1=np.add, op0=np.multiply and op1=None, op0=add and op1=None"
    # (tensor_scalar docstring, 2.26); the current dialect's face has the same rule
    a = rand((128, 64))
    op0, op1 = (getattr(nl, o) if o else None for o in ops)

    @nki.jit
    def k(a):
        out = hbm_out(a.shape)
        nl.store(out, nisa.tensor_scalar(nl.load(a), op0, 2.0, op1=op1,
                                         operand1=None if op1 is None else 0.5,
                                         engine=nisa.scalar_engine))
        return out

    if ok:
        want = (a * 2 if ops[0] == "multiply" else a + 2) + (0.5 if ops[1] else 0)
        np.testing.assert_allclose(nki.simulate_kernel(k, a), want, rtol=1e-6)
    else:
        with pytest.raises(ValueError, match=r"the Scalar Engine on trn2 does not run "
                                             rf"op0={ops[0]}, op1={ops[1]}"):
            nki.simulate_kernel(k, a)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_a_trn1_tensor_engine_transpose_spreads_inf_and_nan_along_rows(target, monkeypatch):
    # the PE transpose is a matmul with an identity moving tile: on NeuronCore-v2 an inf or NaN
    # in column f of the input meets the zeros (inf * 0 = NaN) along row f of the result
    # ("On NC-v2 the TensorE transpose is not bit-accurate for NaN/Inf", reference §1.10);
    # trn2's transpose mode is bit-accurate
    monkeypatch.setenv("NKISIM_TARGET", target)
    a = rand((128, 64))
    a[5, 3] = np.inf
    a[9, 7] = np.nan

    @nki.jit
    def k(a):
        out = hbm_out((64, 128))
        nl.store(out, nl.copy(nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)))
        return out

    got = nki.simulate_kernel(k, a)
    want = a.T.copy()
    if target == "trn1":
        want[3, :] = np.nan
        want[3, 5] = np.inf              # (its own diagonal term: inf * 1 + 0s)
        want[7, :] = np.nan
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fn, lo, hi, bad", [
    ("sin", -3.0, 3.0, 4.0), ("arctan", -1.5, 1.5, 2.0), ("log", 1e-3, 1e3, 1e-25),
    ("rsqrt", 1e-3, 1e3, 1e-30), ("reciprocal", -1e3, 1e3, 1e-15)])
def test_scalar_engine_inputs_outside_the_documented_range_are_a_warning(fn, lo, hi, bad):
    # Beta 1 activation function table: "piecewise-polynomial approximations", log valid on
    # [2^-64, 2^64], sin on [-pi, pi], arctan on [-pi/2, pi/2], rsqrt on [2^-87, 2^97],
    # reciprocal on +-[2^-42, 2^42]: the device's output outside is invalid
    a = np.random.default_rng(1).uniform(lo, hi, (128, 64)).astype(np.float32)
    a[a == 0] = lo

    def run(a):
        @nki.jit
        def k(a):
            out = hbm_out(a.shape)
            nl.store(out, nisa.activation(getattr(nl, fn), nl.load(a)))
            return out
        return nki.simulate_kernel(k, a)

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(a)                                              # within the range: quiet
    a[7, 9] = bad
    with pytest.warns(UserWarning, match=rf"{fn} on the Scalar Engine gets 1 of 8192 inputs "
                                         "outside its documented valid range"):
        run(a)
