"""``nl`` compute ops on nkisim against NumPy: element-wise binary and unary math, reductions,
tile operator overloads, nl.where, nl.loop_reduce, nl.transpose, nl.matmul.

Truth: NumPy (float64 or fp32) with the hardware's numerics (nki-reference §1.3: engines compute
in fp32 and cast the result to the output dtype with round-to-nearest-even, bf16 via ml_dtypes).
"""

import math

import ml_dtypes
import numpy as np
import pytest
import scipy.special

from nkisim import beta1 as nki
from nkisim.beta1 import language as nl

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
FLOAT_DTYPES = [np.float32, np.float16, BF16]
RNG = np.random.default_rng(99)


def rand(shape, dtype=np.float32, lo=-4.0, hi=4.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32).astype(dtype)


def run_op(fn, *arrays):
    """Load each array into SBUF, apply ``fn`` to the tiles, return the result and its dtype."""
    @nki.jit
    def kernel(*ins):
        tiles = [nl.load(x) for x in ins]
        r = fn(*tiles)
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    return nki.simulate_kernel(kernel, *arrays)


def engine_ref(np_fn, dtype, *arrays):
    """The hardware's result: fp32 computation, one RNE cast to ``dtype``."""
    with np.errstate(all="ignore"):
        r = np_fn(*[np.asarray(a).astype(np.float32) for a in arrays])
    return np.asarray(r, dtype=np.float32).astype(dtype)


def ulp_close(out, ref, dtype, ulps=2):
    """|out - ref| within ``ulps`` units in the last place of ``dtype``."""
    eps = float(ml_dtypes.finfo(dtype).eps)
    o, r = out.astype(np.float64), ref.astype(np.float64)
    tol = ulps * eps * np.maximum(np.abs(r), float(ml_dtypes.finfo(dtype).tiny))
    bad = ~((np.abs(o - r) <= tol) | (np.isnan(o) & np.isnan(r)))
    assert not bad.any(), f"{bad.sum()} mismatches, e.g. {o[bad][:4]} vs {r[bad][:4]}"


# ---------------------------------------------------------------------------------------------
# element-wise binary ops


ARITH = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "mod": np.mod, "fmod": np.fmod,
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", sorted(ARITH))
def test_binary_arith_float(name, dtype):
    a = rand((64, 48), dtype)
    b = rand((64, 48), dtype, 0.5, 3.0) * np.where(RNG.random((64, 48)) < 0.5, -1, 1).astype(dtype)
    out = run_op(getattr(nl, name), a, b)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, engine_ref(ARITH[name], dtype, a, b))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_power(dtype):
    a = rand((32, 16), dtype, 0.1, 3.0)
    b = rand((32, 16), dtype, -2.0, 2.0)
    out = run_op(nl.power, a, b)
    ulp_close(out, engine_ref(np.power, dtype, a, b), dtype, ulps=1)


@pytest.mark.parametrize("dtype", [np.int32, np.int16, np.uint8])
@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "maximum", "minimum"])
def test_binary_arith_int_small_values_exact(name, dtype):
    lo = 0 if np.dtype(dtype).kind == "u" else -10
    a = RNG.integers(lo, 11, size=(16, 8)).astype(dtype)
    b = RNG.integers(0, 11, size=(16, 8)).astype(dtype)
    out = run_op(getattr(nl, name), a, b)
    assert out.dtype == np.dtype(dtype)
    ref = ARITH[name](a.astype(np.int64), b.astype(np.int64))
    info = np.iinfo(dtype)
    np.testing.assert_array_equal(out, np.clip(ref, info.min, info.max).astype(dtype))


def test_int_arithmetic_saturates_on_the_fp32_to_int_cast():
    # engines compute in fp32 and cast back (ref §1.3); nkisim's cast saturates (dtypes.py)
    a = np.array([[100, -100, 120]], np.int8)
    b = np.array([[100, -100, 7]], np.int8)
    out = run_op(nl.add, a, b)
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, [[127, -128, 127]])


COMPARE = {"equal": np.equal, "not_equal": np.not_equal, "greater": np.greater,
           "greater_equal": np.greater_equal, "less": np.less, "less_equal": np.less_equal}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [np.int32])
@pytest.mark.parametrize("name", sorted(COMPARE))
def test_comparisons_default_to_bool(name, dtype):
    a = RNG.integers(-3, 4, size=(16, 12)).astype(dtype)
    b = RNG.integers(-3, 4, size=(16, 12)).astype(dtype)
    out = run_op(getattr(nl, name), a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, COMPARE[name](a, b))


def test_comparison_with_explicit_dtype():
    a, b = rand((8, 8)), rand((8, 8))
    out = run_op(lambda x, y: nl.greater(x, y, dtype=nl.float32), a, b)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, (a > b).astype(np.float32))


@pytest.mark.parametrize("name,fn", [("logical_and", np.logical_and),
                                     ("logical_or", np.logical_or),
                                     ("logical_xor", np.logical_xor)])
def test_logical_ops(name, fn):
    a = RNG.integers(0, 2, size=(16, 8)).astype(np.uint8)
    b = RNG.integers(0, 2, size=(16, 8)).astype(np.uint8)
    out = run_op(getattr(nl, name), a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, fn(a, b))


@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int8, np.uint8])
@pytest.mark.parametrize("name", ["bitwise_and", "bitwise_or", "bitwise_xor"])
def test_bitwise_ops(name, dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, size=(16, 8), endpoint=True).astype(dtype)
    b = RNG.integers(info.min, info.max, size=(16, 8), endpoint=True).astype(dtype)
    out = run_op(getattr(nl, name), a, b)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, getattr(np, name)(a, b))


@pytest.mark.parametrize("dtype", [np.uint32, np.uint16, np.int32])
def test_shifts(dtype):
    a = RNG.integers(0, 1 << 12, size=(16, 8)).astype(dtype)
    s = RNG.integers(0, 4, size=(16, 8)).astype(dtype)
    np.testing.assert_array_equal(run_op(nl.left_shift, a, s), np.left_shift(a, s))
    np.testing.assert_array_equal(run_op(nl.right_shift, a, s), np.right_shift(a, s))


def test_right_shift_is_logical():
    # "right_shift (logical) ... arithmetic shift right not supported" (ref §1.10 ALU table)
    a = np.array([[-8, -1, 16]], np.int32)
    s = np.array([[1, 4, 2]], np.int32)
    out = run_op(nl.right_shift, a, s)
    ref = (a.view(np.uint32) >> s.view(np.uint32)).view(np.int32)
    np.testing.assert_array_equal(out, ref)


def test_bitwise_op_on_floats_raises():
    with pytest.raises(TypeError) as ei:
        run_op(nl.bitwise_and, rand((4, 4)), rand((4, 4)))
    assert ei.value.nki_code == "nkisim_operand_dtype"


@pytest.mark.parametrize("b_shape", [(64, 1), (1, 48), (1, 1)])
def test_binary_broadcasting(b_shape):
    a, b = rand((64, 48)), rand(b_shape)
    out = run_op(nl.add, a, b)
    assert out.shape == (64, 48)
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize("scalar", [2, 2.5, -0.75])
def test_binary_with_scalar_operand(scalar):
    a = rand((16, 16))
    np.testing.assert_array_equal(run_op(lambda t: nl.multiply(t, scalar), a),
                                  engine_ref(lambda x: x * np.float32(scalar), F32, a))
    np.testing.assert_array_equal(run_op(lambda t: nl.subtract(scalar, t), a),
                                  engine_ref(lambda x: np.float32(scalar) - x, F32, a))


def test_binary_dtype_argument_casts_output():
    a, b = rand((16, 16)), rand((16, 16))
    out = run_op(lambda x, y: nl.add(x, y, dtype=nl.bfloat16), a, b)
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, (a + b).astype(BF16))


def test_binary_ops_accept_numpy_ufuncs_as_nisa_op_codes():
    from nkisim.beta1 import isa as nisa
    a, b = rand((8, 8)), rand((8, 8))
    for op, ref in ((np.add, a + b), (np.maximum, np.maximum(a, b)), (nl.subtract, a - b)):
        np.testing.assert_array_equal(
            run_op(lambda x, y, op=op: nisa.tensor_tensor(x, y, op=op), a, b), ref)


# ---------------------------------------------------------------------------------------------
# element-wise unary ops


def _gelu(x):
    return 0.5 * x * (1 + scipy.special.erf(x / math.sqrt(2)))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


UNARY = {  # name -> (float64 reference, input range)
    "exp": (np.exp, (-4, 4)), "log": (np.log, (0.01, 10)), "sqrt": (np.sqrt, (0, 10)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.01, 10)), "tanh": (np.tanh, (-4, 4)),
    "sigmoid": (_sigmoid, (-6, 6)), "relu": (lambda x: np.maximum(x, 0), (-4, 4)),
    "gelu": (_gelu, (-4, 4)), "silu": (lambda x: x * _sigmoid(x), (-4, 4)),
    "erf": (scipy.special.erf, (-3, 3)), "softplus": (lambda x: np.log1p(np.exp(x)), (-4, 4)),
    "mish": (lambda x: x * np.tanh(np.log1p(np.exp(x))), (-4, 4)),
    "square": (np.square, (-4, 4)), "abs": (np.abs, (-4, 4)),
    "negative": (np.negative, (-4, 4)), "sign": (np.sign, (-4, 4)),
    "trunc": (np.trunc, (-4, 4)), "floor": (np.floor, (-4, 4)), "ceil": (np.ceil, (-4, 4)),
    "sin": (np.sin, (-3.1, 3.1)), "cos": (np.cos, (-3.1, 3.1)), "tan": (np.tan, (-1.2, 1.2)),
    "arctan": (np.arctan, (-1.5, 1.5)), "reciprocal": (lambda x: 1 / x, (0.25, 8)),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float(name, dtype):
    ref_fn, (lo, hi) = UNARY[name]
    a = rand((32, 40), dtype, lo, hi)
    out = run_op(getattr(nl, name), a)
    assert out.dtype == np.dtype(dtype)
    ref = ref_fn(a.astype(np.float64)).astype(np.float32).astype(dtype)
    ulp_close(out, ref, dtype, ulps=2 if dtype == np.float32 else 1)


def test_unary_dtype_argument():
    a = rand((8, 8), np.float32, 0, 2)
    out = run_op(lambda t: nl.exp(t, dtype=nl.bfloat16), a)
    assert out.dtype == BF16
    ulp_close(out, np.exp(a.astype(np.float64)).astype(np.float32).astype(BF16), BF16, 1)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int16])
def test_invert_on_integers(dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, size=(8, 8), endpoint=True).astype(dtype)
    out = run_op(nl.invert, a)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.invert(a))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_logical_not(dtype):
    a = RNG.integers(0, 3, size=(8, 8)).astype(dtype)
    out = run_op(nl.logical_not, a)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, np.logical_not(a))


# ---------------------------------------------------------------------------------------------
# reductions


REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean, "prod": np.prod}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", sorted(REDUCE))
@pytest.mark.parametrize("axis", [1, (1,), [1], -1])
def test_reductions_2d(name, axis, dtype):
    lo, hi = (0.9, 1.1) if name == "prod" else (-4, 4)
    a = rand((64, 30), dtype, lo, hi)
    out = run_op(lambda t: getattr(nl, name)(t, axis=axis), a)
    assert out.shape == (64, 1)                 # a tile keeps 2 dims: (P, 1)
    assert out.dtype == np.dtype(dtype)
    ref = REDUCE[name](a.astype(np.float64), axis=1, keepdims=True)
    # fp32 accumulation error bound (n * u * sum|a|) plus one rounding to the output dtype
    acc_err = 30 * 2.0**-24 * np.abs(a.astype(np.float64)).sum(axis=1, keepdims=True)
    eps = float(ml_dtypes.finfo(dtype).eps)
    assert (np.abs(out.astype(np.float64) - ref) <= acc_err + eps * np.abs(ref)).all()


@pytest.mark.parametrize("name", sorted(REDUCE))
@pytest.mark.parametrize("axis,keepdims", [((1, 2), False), ([2, 3], False), (2, True),
                                           ((1, 3), True), (3, False), ((1, 2, 3), True)])
def test_reductions_4d_axes_and_keepdims(name, axis, keepdims):
    lo, hi = (0.9, 1.1) if name == "prod" else (-4, 4)
    a = rand((16, 3, 4, 5), np.float32, lo, hi)
    out = run_op(lambda t: getattr(nl, name)(t, axis=axis, keepdims=keepdims), a)
    ref = REDUCE[name](a.astype(np.float64), axis=tuple(np.atleast_1d(axis)), keepdims=keepdims)
    if ref.ndim == 1:
        ref = ref[:, None]
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_mean_of_integers_is_float32():
    a = RNG.integers(-50, 50, size=(16, 7)).astype(np.int32)
    out = run_op(lambda t: nl.mean(t, axis=1), a)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[:, 0], a.mean(axis=1), rtol=1e-6)


def test_sum_of_int32_is_int32():
    a = RNG.integers(-50, 50, size=(16, 7)).astype(np.int32)
    out = run_op(lambda t: nl.sum(t, axis=1), a)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out[:, 0], a.sum(axis=1))


def test_reduction_dtype_argument():
    a = rand((16, 64), BF16)
    out = run_op(lambda t: nl.sum(t, axis=1, dtype=nl.float32), a)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[:, 0], a.astype(np.float64).sum(axis=1), rtol=1e-5,
                               atol=1e-5)


# ---------------------------------------------------------------------------------------------
# operator overloads (ref §1.8: `c_tile = a_tile + b_tile`)


@pytest.mark.parametrize("expr,ref", [
    (lambda x, y: x + y, lambda x, y: x + y),
    (lambda x, y: x - y, lambda x, y: x - y),
    (lambda x, y: x * y, lambda x, y: x * y),
    (lambda x, y: x / y, lambda x, y: x / y),
    (lambda x, y: x + 1.5, lambda x, y: x + np.float32(1.5)),
    (lambda x, y: 2.0 - x, lambda x, y: np.float32(2.0) - x),
    (lambda x, y: 3.0 * y, lambda x, y: np.float32(3.0) * y),
    (lambda x, y: 1.0 / y, lambda x, y: np.float32(1.0) / y),
    (lambda x, y: -x, lambda x, y: -x),
    (lambda x, y: abs(x), lambda x, y: np.abs(x)),
    (lambda x, y: x % y, lambda x, y: np.mod(x, y)),
])
def test_float_operator_overloads(expr, ref):
    a = rand((16, 16))
    b = rand((16, 16), np.float32, 0.5, 2.0)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run_op(expr, a, b), ref(a, b))


def test_power_overload():
    a = rand((16, 16), np.float32, 0.5, 2.0)
    ulp_close(run_op(lambda x: x ** 2.0, a), np.power(a.astype(np.float64), 2).astype(
        np.float32), np.float32, 1)


@pytest.mark.parametrize("expr,ref", [
    (lambda x, y: x & y, np.bitwise_and), (lambda x, y: x | y, np.bitwise_or),
    (lambda x, y: x ^ y, np.bitwise_xor), (lambda x, y: x << y, np.left_shift),
    (lambda x, y: x >> y, np.right_shift), (lambda x, y: ~x, lambda x, y: np.invert(x)),
])
def test_int_operator_overloads(expr, ref):
    a = RNG.integers(0, 1000, size=(8, 8)).astype(np.int32)
    b = RNG.integers(0, 5, size=(8, 8)).astype(np.int32)
    np.testing.assert_array_equal(run_op(expr, a, b), ref(a, b))


@pytest.mark.parametrize("expr,ref", [
    (lambda x, y: x < y, np.less), (lambda x, y: x <= y, np.less_equal),
    (lambda x, y: x > y, np.greater), (lambda x, y: x >= y, np.greater_equal),
])
def test_comparison_overloads(expr, ref):
    a = RNG.integers(0, 3, size=(8, 8)).astype(np.float32)
    b = RNG.integers(0, 3, size=(8, 8)).astype(np.float32)
    out = run_op(expr, a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, ref(a, b))


# ---------------------------------------------------------------------------------------------
# nl.where, nl.loop_reduce


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_where(dtype):
    a, b = rand((32, 16), dtype), rand((32, 16), dtype)
    out = run_op(lambda x, y: nl.where(nl.greater(x, y), x, y), a, b)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.where(a > b, a, b))


def test_where_with_scalar_branch():
    a = rand((32, 16))
    out = run_op(lambda x: nl.where(x > 0.0, x, 0.0), a)
    np.testing.assert_array_equal(out, np.where(a > 0, a, 0).astype(np.float32))


@pytest.mark.parametrize("op,ref", [(np.add, np.sum), (np.maximum, np.max), (nl.minimum, np.min)])
def test_loop_reduce(op, ref):
    a = rand((4, 16, 8))

    @nki.jit
    def kernel(a):
        acc = nl.load(a[0])
        for k in nl.affine_range(1, 4):     # an associative reduction: no loop-carried dep
            x = nl.load(a[k])
            acc = nl.loop_reduce(x, op=op, loop_indices=[k])
        out = nl.ndarray((16, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, acc)
        return out

    np.testing.assert_allclose(nki.simulate_kernel(kernel, a), ref(a, axis=0), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# nl.transpose, nl.matmul


@pytest.mark.parametrize("shape", [(128, 128), (64, 100), (1, 128), (128, 3)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nl_transpose(shape, dtype):
    a = rand(shape, dtype)

    @nki.jit
    def kernel(a):
        t = nl.transpose(nl.load(a))
        assert t.shape == (shape[1], shape[0])
        out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    out = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(out.astype(np.float32), a.T.astype(np.float32))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("M,K,N", [(128, 128, 512), (64, 32, 100), (1, 128, 1)])
def test_nl_matmul(M, K, N, dtype):
    x = rand((M, K), dtype, -1, 1)
    y = rand((K, N), dtype, -1, 1)

    @nki.jit
    def kernel(x, y):
        r = nl.matmul(nl.load(x), nl.load(y))
        assert r.shape == (M, N) and r.dtype == np.float32 and r.buffer == "psum"
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    out = nki.simulate_kernel(kernel, x, y)
    ref = x.astype(np.float64) @ y.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nl_matmul_transpose_x(dtype):
    xt = rand((96, 64), dtype, -1, 1)            # (K, M): x.T is the stationary layout
    y = rand((96, 256), dtype, -1, 1)

    @nki.jit
    def kernel(xt, y):
        r = nl.matmul(nl.load(xt), nl.load(y), transpose_x=True)
        assert r.shape == (64, 256)
        out = nl.ndarray(r.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    out = nki.simulate_kernel(kernel, xt, y)
    np.testing.assert_allclose(out, xt.astype(np.float64).T @ y.astype(np.float64),
                               rtol=1e-5, atol=1e-5)


def test_nl_matmul_psum_accumulation():
    # psum += nl.matmul(...) over K tiles (ref §1.11)
    x = rand((128, 384), np.float32, -1, 1)      # (M, K)
    y = rand((384, 200), np.float32, -1, 1)      # (K, N)

    @nki.jit
    def kernel(x, y):
        acc = nl.zeros((128, 200), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(3):
            acc += nl.matmul(nl.load(x[:, k * 128:(k + 1) * 128]),
                             nl.load(y[k * 128:(k + 1) * 128, :]))
        out = nl.ndarray((128, 200), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, acc)
        return out

    np.testing.assert_allclose(nki.simulate_kernel(kernel, x, y),
                               x.astype(np.float64) @ y.astype(np.float64), rtol=1e-5,
                               atol=1e-5)
