"""Dtypes and numerics on nkisim: the promotion table, RNE stores, fp32 engines, integer casts.

Truth: nki-reference §1.3 (every listed promotion pair, weakly typed scalars, RNE, "engines
compute in fp32 and cast"), ml_dtypes' casts for bf16/fp8, IEEE arithmetic in NumPy.
"""

import ml_dtypes
import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim import dtypes
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8_E4M3 = np.dtype(ml_dtypes.float8_e4m3)
FP8_E5M2 = np.dtype(ml_dtypes.float8_e5m2)
TF32 = nl.tfloat32
RNG = np.random.default_rng(5)


def test_nl_dtypes_are_numpy_dtypes():
    assert nl.float32 is np.float32 and nl.float16 is np.float16
    assert nl.int8 is np.int8 and nl.uint32 is np.uint32 and nl.bool_ is np.bool_
    assert nl.bfloat16 == BF16
    assert nl.float8_e4m3 == FP8_E4M3 and nl.float8_e5m2 == FP8_E5M2
    assert nl.tfloat32 == np.dtype("V4") and nl.tfloat32.itemsize == 4


def test_fp_min_constants():
    assert np.float32(nl.fp32.min).view(np.uint32) == 0xFF7FFFFF   # most negative finite fp32
    assert nisa.fp32.min == nl.fp32.min


# (a, b) -> promoted: every pair listed in ref §1.3
PROMOTION = [
    (np.int32, np.float16, np.float16),
    (np.uint16, TF32, TF32),
    (np.float32, TF32, np.float32),
    (np.float32, BF16, np.float32),
    (np.float16, BF16, np.float32),
    (FP8_E4M3, np.float16, np.float16),
    (FP8_E4M3, BF16, BF16),
    (FP8_E4M3, FP8_E5M2, BF16),
    (np.int16, np.int32, np.int32),
    (np.uint8, np.uint16, np.uint16),
    (np.uint16, np.int32, np.int32),
    (np.int8, np.uint8, np.int16),
    (np.int8, np.uint16, np.int32),
    (np.int32, np.uint32, np.float32),
]


@pytest.mark.parametrize("a,b,expected", PROMOTION,
                         ids=[f"{dtypes.name(a)}-{dtypes.name(b)}" for a, b, _ in PROMOTION])
def test_promotion_table_in_kernel(a, b, expected):
    seen = []

    @nki.jit
    def kernel():
        x = nl.ones((4, 4), dtype=a)
        y = nl.full((4, 4), 2, dtype=b)
        for r in (nl.add(x, y), nl.add(y, x), x * y):
            seen.append(r.dtype)
        out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.add(x, y, dtype=nl.float32))
        return out

    out = nki.simulate_kernel(kernel)
    assert seen == [np.dtype(expected)] * 3
    np.testing.assert_array_equal(out, np.full((4, 4), 3, np.float32))


@pytest.mark.parametrize("a,b,expected", PROMOTION)
def test_promote_is_symmetric(a, b, expected):
    assert dtypes.promote(a, b) == dtypes.promote(b, a) == np.dtype(expected)


@pytest.mark.parametrize("tile_dtype,scalar,expected", [
    (np.int8, 2, np.int32),            # int -> int32
    (np.float16, 1.2, np.float32),     # float -> float32
    (np.float16, 2, np.float16),       # (float, int) -> the float
    (np.uint8, True, np.uint8),        # bool -> uint8
    (BF16, 0.5, np.float32),
    (np.float16, np.float16(2), np.float16),    # a typed scalar keeps its dtype
])
def test_weakly_typed_python_scalars(tile_dtype, scalar, expected):
    seen = []

    @nki.jit
    def kernel():
        t = nl.ones((2, 2), dtype=tile_dtype)
        seen.append(nl.add(t, scalar).dtype)
        seen.append(nl.multiply(scalar, t).dtype)
        out = nl.ndarray((2, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.add(t, scalar, dtype=nl.float32))
        return out

    out = nki.simulate_kernel(kernel)
    assert seen == [np.dtype(expected)] * 2
    np.testing.assert_array_equal(out, np.full((2, 2), 1 + float(scalar), np.float32))


# ---------------------------------------------------------------------------------------------
# round to nearest even on every write


HALFWAY_BF16 = np.array([[1.0 + 2.0**-8,          # halfway 1 | 1+2^-7 -> 1 (even)
                          1.0 + 3 * 2.0**-8,      # halfway 1+2^-7 | 1+2^-6 -> 1+2^-6 (even)
                          -(1.0 + 2.0**-8),
                          1.0 + 2.0**-8 + 2.0**-20,   # just above halfway -> up
                          65504.0, 3.0e38, 1e-40, 0.0]], np.float32)


def test_bf16_store_rounds_to_nearest_even():
    a = HALFWAY_BF16

    @nki.jit
    def kernel(a):
        t = nl.ndarray(a.shape, dtype=nl.bfloat16)
        nisa.dma_copy(dst=t, src=a)
        out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    out = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(out, a.astype(BF16))      # ml_dtypes casts with RNE
    np.testing.assert_array_equal(out.astype(np.float32)[0, :4],
                                  [1.0, 1.0 + 2.0**-6, -1.0, 1.0 + 2.0**-7])


@pytest.mark.parametrize("dtype", [BF16, np.float16, FP8_E4M3, FP8_E5M2])
@pytest.mark.parametrize("op", ["add", "multiply", "subtract", "divide"])
def test_engine_result_is_fp32_then_one_rne_cast(op, dtype):
    a = RNG.uniform(-2, 2, (64, 32)).astype(np.float32).astype(dtype)
    b = RNG.uniform(0.5, 2, (64, 32)).astype(np.float32).astype(dtype)

    @nki.jit
    def kernel(a, b):
        r = getattr(nl, op)(nl.load(a), nl.load(b))
        assert r.dtype == np.dtype(dtype)
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    out = nki.simulate_kernel(kernel, a, b)
    f32 = getattr(np, op)(a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_array_equal(out, f32.astype(dtype))


def test_bf16_chain_rounds_at_every_write_not_at_the_end():
    # two adds of 2^-8 to 1.0: each result is rounded to bf16 (1.0 stays 1.0 twice); one fp32
    # computation of the whole chain would give 1 + 2^-7
    a = np.ones((4, 4), BF16)

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        t1 = nl.add(t, nl.full((4, 4), 2.0**-8, dtype=nl.bfloat16))
        t2 = nl.add(t1, nl.full((4, 4), 2.0**-8, dtype=nl.bfloat16))
        out = nl.ndarray((4, 4), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, t2)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a).astype(np.float32), 1.0)


def test_tfloat32_rounds_mantissa_to_10_bits():
    a = np.array([[1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-11 + 2.0**-20]], np.float32)

    @nki.jit
    def kernel(a):
        t = nl.ndarray(a.shape, dtype=nl.tfloat32)
        nisa.dma_copy(dst=t, src=a)
        back = nl.ndarray(a.shape, dtype=nl.float32)
        nisa.dma_copy(dst=back, src=t)
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, back)
        return out

    out = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(out, [[1.0, 1.0 + 2.0**-9, 1.0 + 2.0**-10]])


# ---------------------------------------------------------------------------------------------
# integer casts


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.uint16])
def test_float_to_int_cast_rounds_half_even_and_saturates(dtype):
    vals = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, 2.4999, 3.7, -3.7, 1e9, -1e9, np.nan]],
                    np.float32)

    @nki.jit
    def kernel(v):
        t = nl.ndarray(v.shape, dtype=dtype)
        nisa.dma_copy(dst=t, src=v)
        out = nl.ndarray(v.shape, dtype=dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    from nkisim.runtime import simulate
    out = simulate(kernel, (vals,), {}, checks_spec="-uninit")
    info = np.iinfo(dtype)
    ref = np.clip(np.rint(np.nan_to_num(vals.astype(np.float64), nan=0.0)), info.min, info.max)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, ref.astype(dtype))


def test_int_to_float_cast_is_exact_or_rne():
    vals = np.array([[1, -7, 2**24 + 1, 2**31 - 1]], np.int32)

    @nki.jit
    def kernel(v):
        t = nl.load(v, dtype=nl.float32)
        out = nl.ndarray(v.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, vals), vals.astype(np.float32))


def test_op_output_dtype_int_from_float_result():
    a = np.array([[1.4, 2.5, 3.5, -2.5]], np.float32)

    @nki.jit
    def kernel(a):
        r = nl.multiply(nl.load(a), 1.0, dtype=nl.int32)
        out = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), [[1, 2, 4, -2]])


def test_static_cast_builds_low_precision_host_arrays():
    x = np.array([1.0 + 2.0**-8, 3.0], np.float32)
    np.testing.assert_array_equal(nl.static_cast(x, nl.bfloat16), x.astype(BF16))
    assert nl.static_cast(x, nl.float8_e4m3).dtype == FP8_E4M3


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, FP8_E4M3, FP8_E5M2, np.int8,
                                   np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.bool_])
def test_every_supported_dtype_roundtrips_through_the_kernel(dtype):
    a = (RNG.uniform(0, 3, (8, 8))).astype(np.float32).astype(dtype)

    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    out = nki.simulate_kernel(kernel, a)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, a)
