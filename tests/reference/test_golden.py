"""The golden models against independent truth: slow loops, scipy, and rounding-error bounds."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slow_reference import conv2d_fp32_in_order_loops, conv2d_loops, maxpool_loops

from reference import (
    conv2d_maxpool,
    conv2d_maxpool_baseline,
    conv2d_maxpool_scale,
    conv2d_reduction_length,
    matrix_transpose,
    matrix_transpose_baseline,
    maxpool2d,
    vector_add,
    vector_add_baseline,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
U32 = 2.0**-24  # unit roundoff of the fp32 accumulator

# (B, C_in, C_out, H, W, K, pool): C_in != C_out, K in {1, 2, 3, 5}, pools 1/2/3,
# batch > 1, odd out_h, and out_w not divisible by the pool (floor mode).
CONV_CASES = [
    (1, 1, 1, 5, 5, 1, 1),
    (2, 3, 5, 7, 6, 2, 2),  # out 6x5 -> pooled 3x2 (floor in width)
    (2, 4, 2, 9, 8, 3, 1),  # out 7x6, odd out_h
    (1, 5, 3, 11, 10, 3, 3),  # out 9x8 -> pooled 3x2
    (3, 2, 4, 9, 9, 5, 1),  # out 5x5
    (2, 6, 3, 8, 12, 5, 2),  # out 4x8 -> pooled 2x4
    (1, 3, 2, 6, 7, 2, 1),  # out 5x6, odd out_h
    (2, 4, 4, 7, 7, 1, 1),  # 1x1 filter, odd out_h
]


def case_id(case):
    return "B{}_Ci{}_Co{}_{}x{}_K{}_p{}".format(*case)


def make_conv_inputs(rng, B, C_in, C_out, H, W, K, signed=False, dtype=np.float32):
    draw = rng.standard_normal if signed else rng.random
    X = draw((B, C_in, H, W)).astype(dtype)
    Wt = draw((C_out, C_in, K, K)).astype(dtype)
    bias = draw(C_out).astype(dtype)
    return X, Wt, bias


def unit_roundoff(dtype):
    return float(ml_dtypes.finfo(dtype).eps) / 2


@pytest.mark.parametrize("case", CONV_CASES, ids=case_id)
def test_conv2d_maxpool_matches_loops(case):
    B, C_in, C_out, H, W, K, pool = case
    X, Wt, bias = make_conv_inputs(np.random.default_rng(sum(case)), *case[:6], signed=True)
    got = conv2d_maxpool(X, Wt, bias, pool_size=pool)
    want = maxpool_loops(conv2d_loops(X, Wt, bias), pool)
    assert got.dtype == np.float64
    assert got.shape == (B, C_out, (H - K + 1) // pool, (W - K + 1) // pool)
    # Both sum at most 5*5*6 = 150 float64 products of fp32 values, in different orders:
    # the difference is a few float64 ulps, far below 1e-12 relative.
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(2, 3, 4, 9, 8), (1, 5, 2, 12, 7), (1, 2, 3, 3, 3),
                                   (2, 4, 4, 10, 11), (1, 3, 2, 6, 10), (1, 2, 3, 13, 5)],
                         ids=str)
@pytest.mark.parametrize("tile_rows", [1, 2, 16])
def test_winograd_3x3_float64_golden_matches_loops(shape, tile_rows, monkeypatch):
    # the float64 golden of a 3x3 filter is Winograd F(4x4, 3x3): output sizes of every residue
    # mod 4 (padded tiles), several tile-row batches (the last one partial)
    import reference.conv2d as conv
    monkeypatch.setattr(conv, "WINOGRAD_TILE_ROWS", tile_rows)
    monkeypatch.setattr(conv, "WINOGRAD_MIN_OUTPUTS", 1)    # conv2d_maxpool takes it too
    B, C_in, C_out, H, W = shape
    X, Wt, bias = make_conv_inputs(np.random.default_rng(H * W), B, C_in, C_out, H, W, 3,
                                   signed=True)
    got = conv._winograd3(X, Wt, bias, tile_rows=tile_rows)
    want = conv2d_loops(X, Wt, bias)
    # Winograd's transforms scale by at most 8 and 1/24: about 1e-14 of the magnitudes
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got.dtype == np.float64
    np.testing.assert_allclose(conv2d_maxpool(X, Wt, bias), want, rtol=1e-12, atol=1e-12)


def test_winograd_batches_do_not_see_each_others_rows():
    # the tile-row batches share one buffer of input phases: where the last batch ends before
    # it, the rows past the image must read as zeros, not as the previous batch's rows (huge
    # here: their cancellation in the transforms would swamp the last rows' outputs)
    import reference.conv2d as conv
    rng = np.random.default_rng(11)
    # out_h 10: a batch of 2 tile rows, then one of 1, whose input rows past the image (12
    # and 13) sit in the shared buffer where the first batch had rows 4 and 5
    X, Wt, bias = make_conv_inputs(rng, 1, 3, 2, 12, 9, 3, signed=True)
    X[:, :, :8] *= np.float32(1e30)
    got = conv._winograd3(X, Wt, bias, tile_rows=2)
    want = conv2d_loops(X, Wt, bias)
    np.testing.assert_allclose(got[:, :, 8:], want[:, :, 8:], rtol=1e-12, atol=1e-12)


def test_float64_golden_keeps_an_inf_input_where_the_direct_sum_does(monkeypatch):
    # Winograd's transforms subtract, so an inf input would come out as NaN across its whole
    # 4x4 block; the golden takes the direct taps when an input is not finite
    import reference.conv2d as conv
    monkeypatch.setattr(conv, "WINOGRAD_MIN_OUTPUTS", 1)
    rng = np.random.default_rng(3)
    X = rng.random((1, 2, 10, 11)).astype(np.float32)
    Wt = rng.random((3, 2, 3, 3)).astype(np.float32) + np.float32(0.5)   # all positive
    bias = np.zeros(3, np.float32)
    X[0, 1, 4, 5] = np.inf
    got = conv2d_maxpool(X, Wt, bias)
    inf_rows, inf_cols = slice(2, 5), slice(3, 6)       # the outputs whose window holds it
    assert np.all(got[0, :, inf_rows, inf_cols] == np.inf)
    finite = np.ones(got.shape, bool)
    finite[0, :, inf_rows, inf_cols] = False
    X[0, 1, 4, 5] = 0
    np.testing.assert_allclose(got[finite], conv2d_loops(X, Wt, bias)[finite], rtol=1e-12)


@pytest.mark.parametrize("case", CONV_CASES[:6], ids=case_id)
def test_conv2d_matches_scipy_correlate(case):
    # scipy.ndimage, not scipy.signal: importing scipy.signal costs ~1.1 s of CPU (it parses its
    # docstrings), scipy.ndimage 0.1 s, in every process that runs this (issue 12). Both are
    # independent of our golden; ndimage sums directly (no FFT) in float64.
    import scipy.ndimage

    B, C_in, C_out, H, W, K, _ = case
    X, Wt, bias = make_conv_inputs(np.random.default_rng(7), *case[:6], signed=True)
    got = conv2d_maxpool(X, Wt, bias, pool_size=1)
    out_h, out_w = H - K + 1, W - K + 1
    want = np.empty_like(got)
    for b in range(B):
        for c in range(C_out):
            # 3-D correlation over (C_in, H, W) with zeros outside: output[i, j, k] sums
            # weights[u, v, w] * input[i + u - C_in//2, j + v - K//2, k + w - K//2] (ndimage
            # centres a filter of size n at n // 2), so the "valid" correlation that sums all
            # channels is the slice at channel C_in//2, rows and columns from K//2.
            full = scipy.ndimage.correlate(X[b].astype(np.float64), Wt[c].astype(np.float64),
                                           mode="constant", cval=0.0)
            want[b, c] = full[C_in // 2, K // 2:K // 2 + out_h, K // 2:K // 2 + out_w] + bias[c]
    # Different summation order only (~1e-15 relative to the magnitudes).
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_conv2d_is_correlation_not_convolution():
    rng = np.random.default_rng(3)
    X, Wt, bias = make_conv_inputs(rng, 1, 2, 2, 6, 6, 3, signed=True)
    got = conv2d_maxpool(X, Wt, bias)
    flipped = conv2d_maxpool(X, Wt[:, :, ::-1, ::-1], bias)
    assert not np.allclose(got, flipped)


@given(
    B=st.integers(1, 2), C_in=st.integers(1, 3), C_out=st.integers(1, 3),
    K=st.sampled_from([1, 2, 3, 5]), pool=st.integers(1, 3),
    extra_h=st.integers(0, 2), out_w=st.integers(1, 7), seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=40, deadline=None)
def test_conv2d_maxpool_matches_loops_random_shapes(B, C_in, C_out, K, pool, extra_h, out_w, seed):
    out_h = pool * (extra_h + 1)
    out_w = max(out_w, pool)
    X, Wt, bias = make_conv_inputs(
        np.random.default_rng(seed), B, C_in, C_out, out_h + K - 1, out_w + K - 1, K, signed=True
    )
    got = conv2d_maxpool(X, Wt, bias, pool_size=pool)
    want = maxpool_loops(conv2d_loops(X, Wt, bias), pool)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)  # order of float64 sums only


@pytest.mark.parametrize("shape,pool", [((2, 3, 6, 6), 2), ((1, 2, 7, 5), 2), ((1, 1, 9, 8), 3)])
def test_maxpool2d_matches_loops(shape, pool):
    y = np.random.default_rng(0).standard_normal(shape)
    np.testing.assert_array_equal(maxpool2d(y, pool), maxpool_loops(y, pool))


def test_bf16_and_fp16_inputs_accepted():
    rng = np.random.default_rng(11)
    for dtype in (BF16, np.dtype(np.float16)):
        X, Wt, bias = make_conv_inputs(rng, 2, 3, 2, 6, 6, 3, dtype=dtype)
        got = conv2d_maxpool(X, Wt, bias, pool_size=2)
        assert got.dtype == np.float64 and got.shape == (2, 2, 2, 2)
        # Products of bf16/fp16 values are exact in float64; only the sum order differs.
        np.testing.assert_allclose(got, maxpool_loops(conv2d_loops(X, Wt, bias), 2), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16), BF16], ids=str)
@pytest.mark.parametrize("signed", [False, True], ids=["uniform", "normal"])
def test_conv2d_baseline_within_rounding_error_bound(dtype, signed):
    rng = np.random.default_rng(5)
    X, Wt, bias = make_conv_inputs(rng, 2, 64, 8, 8, 8, 3, signed=signed)
    X, Wt, bias = (a.astype(dtype) for a in (X, Wt, bias))  # the golden sees the rounded inputs
    exact = conv2d_maxpool(X, Wt, bias, pool_size=2)
    scale = conv2d_maxpool_scale(X, Wt, bias, pool_size=2)
    base = conv2d_maxpool_baseline(X, Wt, bias, pool_size=2)
    assert base.dtype == dtype and base.shape == exact.shape
    err = np.abs(base.astype(np.float64) - exact)
    # Deterministic bounds (Higham, Accuracy and Stability, §3.1): an fp32 sum of K terms
    # (K = 576 products + bias) is off by at most ~K*u32*sum|terms|; we allow 2x that for the
    # product roundings of fp32 inputs. The final rounding to dtype adds at most u_out*|y|
    # (pooling commutes with monotone rounding, so it adds nothing).
    K = conv2d_reduction_length(64, 3) + 1
    bound = unit_roundoff(dtype) * np.abs(exact) * (1 + 2 * K * U32) + 2 * K * U32 * scale
    assert np.all(err <= bound)
    if dtype != np.float32:
        assert np.any(err > 0)  # the rounding to dtype really happened


@pytest.mark.parametrize("case", [(1, 5, 3, 4, 5, 3, 1), (2, 7, 2, 4, 4, 1, 2),
                                  (1, 3, 2, 6, 6, 2, 1)], ids=case_id)
def test_conv2d_baseline_sums_in_channel_order(case):
    # Bit for bit the scalar loop: the baseline's order is the PE array's, not BLAS's.
    B, C_in, C_out, H, W, K, pool = case
    X, Wt, bias = make_conv_inputs(np.random.default_rng(sum(case)), *case[:6], signed=True)
    want = maxpool_loops(conv2d_fp32_in_order_loops(X, Wt, bias), pool).astype(np.float32)
    np.testing.assert_array_equal(conv2d_maxpool_baseline(X, Wt, bias, pool_size=pool), want)


def test_conv2d_baseline_no_luckier_than_other_fp32_orders():
    # A kernel summing in fp32 in another order (here BLAS with the weights transposed, as
    # nkisim's nc_matmul calls it) must stay within nkiverify's 4x of the baseline's max error
    # (floored at 1 ulp at max|golden|). Small 1x1 convs are where OpenBLAS's small-matrix
    # kernels made a BLAS baseline up to 4x more accurate than the in-order sum on an AVX-512
    # Xeon: 24 of 3,000 drawn runs of the shipped kernels failed there (2026-11-28,
    # benchmarks/false_alarms.py).
    rng = np.random.default_rng(11)
    worst = 0.0
    for _ in range(150):
        c_in, c_out = int(rng.choice([128, 256])), 128
        height, width = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        X, Wt, bias = make_conv_inputs(rng, 1, c_in, c_out, height, width, 1)
        exact = conv2d_maxpool(X, Wt, bias)
        base = conv2d_maxpool_baseline(X, Wt, bias).astype(np.float64)
        other = np.zeros((c_out, height * width), np.float32)
        for c0 in range(0, c_in, 128):     # one 128-row matmul per PSUM accumulation
            stationary = np.ascontiguousarray(Wt[:, c0:c0 + 128, 0, 0].T)
            other += stationary.T @ X[0, c0:c0 + 128].reshape(128, -1)
        other = (other + bias[:, None]).reshape(exact.shape)
        floor = np.spacing(np.float32(np.abs(exact).max()))
        ratio = (np.abs(other - exact).max()
                 / max(np.abs(base - exact).max(), float(floor)))
        worst = max(worst, ratio)
    assert worst <= 4, worst


def test_conv2d_baseline_rounds_inputs_to_dtype():
    rng = np.random.default_rng(2)
    X, Wt, bias = make_conv_inputs(rng, 1, 4, 3, 7, 7, 3)
    from_fp32 = conv2d_maxpool_baseline(X, Wt, bias, dtype="bfloat16")
    from_bf16 = conv2d_maxpool_baseline(X.astype(BF16), Wt.astype(BF16), bias.astype(BF16))
    assert from_fp32.dtype == BF16 and from_bf16.dtype == BF16
    np.testing.assert_array_equal(from_fp32.astype(np.float32), from_bf16.astype(np.float32))


def test_conv2d_scale_bounds_golden():
    X, Wt, bias = make_conv_inputs(np.random.default_rng(4), 2, 5, 3, 8, 8, 3, signed=True)
    exact = conv2d_maxpool(X, Wt, bias, pool_size=2)
    scale = conv2d_maxpool_scale(X, Wt, bias, pool_size=2)
    assert np.all(scale >= np.abs(exact))
    assert np.all(scale > 2 * np.abs(exact).mean())  # cancellation: sum|terms| >> |y|
    Xp, Wp, bp = (np.abs(a) for a in (X, Wt, bias))
    np.testing.assert_array_equal(conv2d_maxpool_scale(Xp, Wp, bp), conv2d_maxpool(Xp, Wp, bp))


def test_conv2d_reduction_length():
    assert conv2d_reduction_length(256, 3) == 2304
    assert conv2d_reduction_length(128, 1) == 128


BAD_SHAPES = [
    ((2, 3, 8, 8), (4, 2, 3, 3), (4,), 1, "C_in mismatch"),
    ((2, 3, 8, 8), (4, 3, 3, 2), (4,), 1, "square"),
    ((2, 3, 8, 8), (4, 3, 3, 3), (5,), 1, "bias has 5 entries"),
    ((2, 3, 9, 8), (4, 3, 3, 3), (4,), 2, "not divisible by pool_size=2"),
    ((3, 8, 8), (4, 3, 3, 3), (4,), 1, "X must be 4-D"),
    ((2, 3, 8, 8), (4, 3, 3), (4,), 1, "W must be 4-D"),
    ((2, 3, 8, 8), (4, 3, 3, 3), (4, 1), 1, "bias must be 1-D"),
    ((2, 3, 2, 2), (4, 3, 3, 3), (4,), 1, "does not fit"),
    ((2, 3, 8, 8), (4, 3, 3, 3), (4,), 0, "positive integer"),
    ((2, 3, 8, 8), (4, 3, 3, 3), (4,), 1.5, "positive integer"),
    ((2, 3, 8, 4), (4, 3, 3, 3), (4,), 3, "larger than the conv output width"),
]


@pytest.mark.parametrize("x_shape,w_shape,b_shape,pool,match", BAD_SHAPES,
                         ids=[c[-1] for c in BAD_SHAPES])
@pytest.mark.parametrize("model", [conv2d_maxpool, conv2d_maxpool_baseline, conv2d_maxpool_scale])
def test_conv2d_shape_errors(model, x_shape, w_shape, b_shape, pool, match):
    with pytest.raises(ValueError, match=match):
        model(np.zeros(x_shape), np.zeros(w_shape), np.zeros(b_shape), pool_size=pool)


def test_vector_add_exact_and_baseline():
    rng = np.random.default_rng(0)
    a, b = rng.random(1000).astype(np.float32), rng.random(1000).astype(np.float32)
    exact = vector_add(a, b)
    assert exact.dtype == np.float64
    np.testing.assert_array_equal(exact, a.astype(np.float64) + b.astype(np.float64))
    # IEEE addition is correctly rounded, so the fp32 baseline is NumPy's fp32 add bit for bit.
    np.testing.assert_array_equal(vector_add_baseline(a, b), a + b)

    ab, bb = a.astype(BF16), b.astype(BF16)
    base = vector_add_baseline(ab, bb)
    assert base.dtype == BF16
    exact = vector_add(ab, bb)
    err = np.abs(base.astype(np.float64) - exact)
    # One fp32 rounding then one bf16 rounding: at most (u32 + u_bf16) relative, with slack.
    assert np.all(err <= (unit_roundoff(BF16) + 2 * U32) * np.abs(exact))
    assert np.any(err > 0)


def test_vector_add_shape_mismatch():
    with pytest.raises(ValueError, match="same shape"):
        vector_add(np.zeros(4), np.zeros(5))
    with pytest.raises(ValueError, match="same shape"):
        vector_add_baseline(np.zeros(4), np.zeros((4, 1)))


def test_matrix_transpose():
    a = np.random.default_rng(1).random((3, 5)).astype(np.float32)
    t = matrix_transpose(a)
    assert t.shape == (5, 3) and t.dtype == np.float64 and t.flags.c_contiguous
    for i in range(3):
        for j in range(5):
            assert t[j, i] == a[i, j]
    base = matrix_transpose_baseline(a, dtype=BF16)
    assert base.dtype == BF16 and base.shape == (5, 3)
    np.testing.assert_array_equal(base.astype(np.float64), a.astype(BF16).astype(np.float64).T)
    with pytest.raises(ValueError, match="2-D"):
        matrix_transpose(np.zeros(4))
    with pytest.raises(ValueError, match="2-D"):
        matrix_transpose_baseline(np.zeros((2, 2, 2)))


def test_auto_precision_golden():
    # float32 for 16-bit inputs (products exact in float32), float64 otherwise; the float32
    # golden stays within a few percent of a 16-bit output's half-ulp allowance of the float64 one.
    from reference.conv2d import golden_dtype
    rng = np.random.default_rng(12)
    for dtype, want in ((BF16, np.float32), (np.dtype(np.float16), np.float32),
                        (np.dtype(np.float32), np.float64)):
        X, Wt, bias = make_conv_inputs(rng, 1, 256, 4, 8, 8, 3, signed=True, dtype=dtype)
        assert golden_dtype(X, Wt, bias) == want
        got = conv2d_maxpool(X, Wt, bias, pool_size=2, dtype="auto")
        exact = conv2d_maxpool(X, Wt, bias, pool_size=2)
        assert got.dtype == want and exact.dtype == np.float64
        scale = conv2d_maxpool_scale(X, Wt, bias, pool_size=2)
        auto_scale = conv2d_maxpool_scale(X, Wt, bias, pool_size=2, dtype="auto")
        assert auto_scale.dtype == want and np.all(auto_scale >= 0)
        # error bound of a float32 sum of C_in products per tap plus the taps (see golden_dtype)
        bound = (256 + 9 + 1) * U32 * scale
        assert np.all(np.abs(got - exact) <= bound)
        if want == np.float32:
            assert np.all(np.abs(got - exact) <= 0.05 * (unit_roundoff(dtype) * np.abs(exact)
                                                        + 4 * 48 * U32 * scale))
    assert golden_dtype(np.zeros(2, np.float16), np.zeros(2, np.float32)) == np.float64
    with pytest.raises(ValueError, match="float64, float32 or 'auto'"):
        conv2d_maxpool(X, Wt, bias, dtype=np.float16)
