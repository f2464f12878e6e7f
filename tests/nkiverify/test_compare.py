"""nkiverify.compare: ULPs, error statistics, failure messages, and the default tolerances.

The tolerance tests run realistic conv2d data (uniform [0, 1) as the course harness, and signed
normal) through models of correct kernels and of the classic bugs, and check both directions.
"""

import json
import math

import ml_dtypes
import numpy as np
import pytest

from nkiverify.compare import (
    Tolerance,
    compare,
    error_stats,
    tolerance_for,
    ulp,
    ulp_error,
)
from reference import (
    conv2d_maxpool,
    conv2d_maxpool_baseline,
    conv2d_maxpool_scale,
    conv2d_reduction_length,
    maxpool2d,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
FP32 = np.dtype(np.float32)
FP8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
FP8_E5M2 = np.dtype(ml_dtypes.float8_e5m2)


# --- ulp ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,expected", [
    (FP16, 2.0**-10), (BF16, 2.0**-7), (FP32, 2.0**-23), (FP8_E4M3, 2.0**-3), (FP8_E5M2, 2.0**-2),
], ids=str)
def test_ulp_of_one(dtype, expected):
    assert ulp(1.0, dtype) == expected
    assert ulp(-1.5, dtype) == expected  # same binade, sign ignored
    assert ulp(2.0, dtype) == 2 * expected


def test_ulp_at_zero_and_subnormals_is_smallest_subnormal():
    assert ulp(0.0, FP16) == 2.0**-24
    assert ulp(0.0, FP32) == 2.0**-149
    assert ulp(1e-42, FP32) == 2.0**-149  # fp32 subnormal
    assert ulp(0.0, BF16) == float(ml_dtypes.finfo(BF16).smallest_subnormal)
    assert math.isnan(ulp(np.nan, FP32)) and math.isnan(ulp(np.inf, FP32))


@pytest.mark.parametrize("dtype", [FP16, BF16, FP32, FP8_E4M3, FP8_E5M2], ids=str)
def test_ulp_matches_np_spacing_on_representable_values(dtype):
    info = ml_dtypes.finfo(dtype)
    rng = np.random.default_rng(0)
    # Magnitudes from the subnormals to well below the max, so everything stays finite.
    mags = np.exp2(rng.uniform(info.minexp - info.nmant, info.maxexp - 2, 2000))
    values = (mags * rng.choice([-1, 1], mags.size)).astype(dtype)
    values = values[values != 0]
    want = np.spacing(np.abs(values)).astype(np.float64)  # NumPy/ml_dtypes as the truth
    np.testing.assert_array_equal(ulp(values.astype(np.float64), dtype), want)


def test_ulp_error():
    assert ulp_error(1.0 + 2.0**-10, 1.0, FP16) == 1.0
    assert ulp_error(np.float32(3.0), 3.0 + 2.0**-8, BF16) == 0.25  # ulp_bf16(3) = 2**-6
    np.testing.assert_array_equal(ulp_error([0.0, 2.0], [0.0, 2.0], FP32), [0.0, 0.0])


def test_ulp_rejects_integer_dtype():
    with pytest.raises(TypeError, match="floating-point"):
        ulp(1.0, np.int32)


# --- tolerance_for -----------------------------------------------------------------------------

def test_tolerance_for_formula():
    tol = tolerance_for(BF16, 2304)
    assert tol.max_ulp == 0.5
    assert tol.rtol == pytest.approx(4 * 48 * 2.0**-24)
    assert tolerance_for(FP32, 1).rtol == pytest.approx(4 * 2.0**-24)
    # float64 outputs are not accumulated in fp32: their own unit roundoff.
    assert tolerance_for(np.float64, 4).rtol == pytest.approx(4 * 2 * 2.0**-53)
    exact = tolerance_for(FP32, 0)
    assert exact.max_ulp == 0 and exact.rtol == 0
    with pytest.raises(ValueError):
        tolerance_for(FP32, -1)


def test_fp32_tolerance_is_not_stricter_than_the_course_harness():
    # The harness checks np.allclose(out, torch_ref) (rtol=1e-5, atol=1e-8) on uniform [0, 1)
    # data where sum|terms| = |y|, for C_in = 256, 3x3. A kernel it accepts must pass here.
    tol = tolerance_for(FP32, conv2d_reduction_length(256, 3))
    y = np.linspace(100, 1000, 50)
    assert np.all(tol.allowed(y, y) >= 1e-5 * y + 1e-8)


# --- error_stats -------------------------------------------------------------------------------

def test_error_stats_distribution_matches_numpy():
    rng = np.random.default_rng(1)
    expected = rng.standard_normal((7, 50)) * 10
    actual = (expected + rng.standard_normal(expected.shape) * 1e-3).astype(np.float32)
    st = error_stats(actual, expected, FP32, tolerance_for(FP32, 16))
    abs_err = np.abs(actual.astype(np.float64) - expected)
    rel_err = abs_err / np.abs(expected)
    ulp_err = abs_err / np.spacing(np.abs(expected).astype(np.float32)).astype(np.float64)
    for dist, values in ((st.abs, abs_err), (st.rel, rel_err)):
        assert dist.max == pytest.approx(values.max(), rel=1e-12)
        assert dist.mean == pytest.approx(values.mean(), rel=1e-12)
        p50, p90, p99, p999 = np.percentile(values, [50, 90, 99, 99.9])
        assert (dist.p50, dist.p90, dist.p99, dist.p999) == pytest.approx((p50, p90, p99, p999))
    # ulp is taken at the float64 golden; NumPy's spacing at its fp32 rounding agrees except
    # where rounding crosses a power of two, so compare the median only.
    assert st.ulp.p50 == pytest.approx(np.percentile(ulp_err, 50), rel=1e-6)
    assert st.n == 350 and st.nan_count == 0
    assert st.mismatches > 0  # 1e-3 errors on |y| ~ 10 are far beyond fp32 tolerance
    i = st.worst_index
    assert expected[i] == st.worst_expected and float(actual[i]) == st.worst_actual


def test_error_stats_worst_index_is_largest_tolerance_ratio():
    expected = np.array([[1000.0, 1.0], [10.0, 100.0]])
    actual = expected.copy()
    actual[0, 0] += 0.5  # largest abs error: 2x the allowance 0.5 * ulp_fp16(1000) = 0.25
    actual[1, 0] += 0.05  # 0.05 / (0.5 * ulp_fp16(10) = 2**-8) = 12.8x: the worst ratio
    st = error_stats(actual, expected, FP16, tolerance_for(FP16, 1), scale=0.0)
    assert st.worst_index == (1, 0)
    assert st.max_ratio == pytest.approx(0.05 / (0.5 * 2.0**-7))
    assert st.mismatches == 2


def test_nan_and_inf_detection():
    expected = np.arange(1.0, 13.0).reshape(3, 4)
    actual = expected.astype(np.float32)
    actual[1, 2] = np.nan
    actual[2, 3] = np.inf
    result = compare(actual, expected, FP32)
    assert not result.passed
    st = result.stats
    assert st.nan_count == 2 and st.mismatches == 2
    assert st.first_nonfinite_index == (1, 2)
    assert st.abs.max == 0.0  # the distribution covers the finite elements only
    assert any("2 NaN/inf" in r and "(1, 2)" in r for r in result.reasons)


def test_nonfinite_golden_must_be_matched():
    expected = np.array([1.0, np.inf, np.nan])
    assert compare(np.array([1.0, np.inf, np.nan], np.float32), expected, FP32).passed
    result = compare(np.array([1.0, 5.0, np.nan], np.float32), expected, FP32)
    assert not result.passed and result.stats.mismatches == 1 and result.stats.nan_count == 0


def test_output_never_written():
    expected = np.ones((4, 4))
    result = compare(np.full((4, 4), np.nan, np.float32), expected, FP32)
    assert not result.passed
    assert result.stats.worst_index is None
    d = result.stats.to_dict()
    assert d["abs"]["max"] is None and d["nan_count"] == 16
    json.dumps(d, allow_nan=False)
    assert "16 NaN/inf" in result.message()


def test_scale_must_broadcast():
    with pytest.raises(ValueError, match="does not broadcast"):
        compare(np.ones((2, 3)), np.ones((2, 3)), FP32, scale=np.ones(4))


# --- compare: shapes and messages --------------------------------------------------------------

def test_shape_mismatch_fails_with_a_clear_reason():
    result = compare(np.zeros((4, 2)), np.zeros((2, 4)), FP32)
    assert not result.passed and result.stats is None
    assert result.reasons == ["shape mismatch: kernel output (4, 2), golden (2, 4) "
                              "(same number of elements: a missing reshape?)"]
    assert "shape mismatch" in result.message()
    other = compare(np.zeros(3), np.zeros((2, 2)), FP32)
    assert not other.passed and "missing reshape" not in other.reasons[0]


def test_failure_message_says_what_where_how_much():
    rng = np.random.default_rng(2)
    expected = rng.random((2, 3, 4, 4)) * 100
    actual = expected.astype(BF16)
    actual[1, 2, 3, 0] += 10  # one bad element
    result = compare(actual, expected, BF16, reduction_length=9)
    assert not result.passed
    msg = result.message()
    lines = msg.splitlines()
    assert "FAILED" in lines[0]
    assert "1 of 96 elements" in msg and "beyond tolerance" in msg
    assert "(1, 2, 3, 0)" in msg
    assert repr(float(actual[1, 2, 3, 0])) in msg and repr(float(expected[1, 2, 3, 0])) in msg
    assert "tolerance: |actual - expected| <= 0.5 ulp_bfloat16" in msg
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["metric"])
    assert lines[header].split() == ["metric", "max", "mean", "p50", "p90", "p99", "p99.9"]
    rows = [line.split() for line in lines[header + 1:header + 4]]
    assert [row[0] for row in rows] == ["abs", "rel", "ulp"]
    assert all(len(row) == 7 for row in rows)
    worst_abs = abs(float(actual[1, 2, 3, 0]) - expected[1, 2, 3, 0])
    assert float(rows[0][1]) == pytest.approx(worst_abs, rel=1e-2)  # max abs error (3 digits)


def test_passing_comparison():
    expected = np.linspace(-3, 3, 101)
    result = compare(expected.astype(FP16), expected, FP16)
    assert result.passed and bool(result) and result.reasons == []
    assert result.message().splitlines()[0].endswith("passed")
    assert result.stats.ulp.max <= 0.5
    json.dumps(result.stats.to_dict(), allow_nan=False)


def test_exact_tolerance_for_data_movement():
    a = np.random.default_rng(0).random((8, 16)).astype(np.float32)
    assert compare(a.T, a.T.astype(np.float64), FP32, reduction_length=0).passed
    off = a.T.copy()
    off[3, 5] = np.nextafter(off[3, 5], np.float32(2))
    result = compare(off, a.T.astype(np.float64), FP32, reduction_length=0)
    assert not result.passed and result.stats.mismatches == 1 and result.stats.max_ratio == np.inf


# --- compare: systematic error and baseline checks ---------------------------------------------

def test_systematic_offset_is_caught_even_below_one_ulp():
    rng = np.random.default_rng(3)
    expected = 512 + rng.random(4096) * 512  # bf16 ulp is 4 here
    offset = (expected - 1.0).astype(BF16)  # every element shifted by -1 = -0.25 ulp
    result = compare(offset, expected, BF16, reduction_length=2304)
    assert not result.passed
    assert result.stats.mismatches < 4096  # most elements are individually fine ...
    assert any(r.startswith("systematic error") for r in result.reasons)  # ... the mean is not
    unchecked = Tolerance("bfloat16", 2304, bias_z=None)
    assert not any(r.startswith("systematic") for r in
                   compare(offset, expected, BF16, tolerance=unchecked).reasons)
    assert compare(expected.astype(BF16), expected, BF16, reduction_length=2304).passed


def test_baseline_check_uses_k_times_baseline_error_with_an_ulp_floor():
    rng = np.random.default_rng(4)
    expected = rng.random(1000) * 8  # max|golden| < 8: fp32 ulp there is 2**-21
    baseline = expected.astype(np.float32)
    # The baseline is correctly rounded (error <= 2**-22 < the 1-ulp floor), so the limit is
    # k * 2**-21. A kernel 3 ulps off everywhere passes with a generous tolerance and k=4,
    # and fails with k=2.
    kernel = (expected + 3 * 2.0**-21).astype(np.float32)
    loose = Tolerance("float32", 1, max_ulp=8, bias_z=None)
    ok = compare(kernel, expected, FP32, baseline=baseline, tolerance=loose, k=4)
    assert ok.passed and ok.baseline_limit == pytest.approx(4 * 2.0**-21)
    bad = compare(kernel, expected, FP32, baseline=baseline, tolerance=loose, k=2)
    assert not bad.passed and "baseline" in bad.reasons[0]
    assert "baseline (fp32-accumulated float32)" in bad.message()
    with pytest.raises(ValueError, match="baseline shape"):
        compare(kernel, expected, FP32, baseline=baseline[:10])


def test_a_baseline_function_is_called_only_when_the_verdict_needs_it():
    rng = np.random.default_rng(4)
    expected = rng.random(1000) * 8                 # 1-ulp floor at max|golden|: 2**-21
    baseline = expected.astype(np.float32)
    loose = Tolerance("float32", 1, max_ulp=8, bias_z=None)
    calls = []

    def make_baseline():
        calls.append(1)
        return baseline

    # 3 ulps off: within k=4 x the floor whatever the baseline, so it is not computed
    near = (expected + 3 * 2.0**-21).astype(np.float32)
    ok = compare(near, expected, FP32, baseline=make_baseline, tolerance=loose, k=4)
    assert ok.passed and not calls and ok.baseline_stats is None
    assert ok.baseline_limit == pytest.approx(4 * 2.0**-21)
    # the same verdicts as with the array when it matters
    bad = compare(near, expected, FP32, baseline=make_baseline, tolerance=loose, k=2)
    assert calls == [1] and not bad.passed and "baseline" in bad.reasons[0]
    assert bad.baseline_limit == compare(near, expected, FP32, baseline=baseline,
                                         tolerance=loose, k=2).baseline_limit


def test_a_baseline_sample_decides_only_when_it_proves_the_pass():
    # The baseline's max error on a part is at most its max on the whole: a kernel within k x
    # the part's passes as with the whole; otherwise the whole baseline is computed and decides.
    rng = np.random.default_rng(7)
    expected = rng.random((4, 250)) * 8                   # 1-ulp floor at max|golden|: 2**-21
    noise = rng.standard_normal(expected.shape) * 2.0**-19
    baseline = (expected + noise).astype(np.float32)      # a baseline ~4 ulps off
    loose = Tolerance("float32", 1, atol=1e-3, bias_z=None)  # only the baseline check decides
    part = (slice(0, 1), slice(None))
    calls, decided = [], set()

    def whole():
        calls.append("whole")
        return baseline

    def sample():
        calls.append("sample")
        return baseline[part], part

    for kernel_noise, k in ((1.0, 4), (3.0, 2), (0.5, 1)):
        kernel = (expected + kernel_noise * noise[::-1]).astype(np.float32)
        calls.clear()
        got = compare(kernel, expected, FP32, baseline=whole, baseline_sample=sample,
                      tolerance=loose, k=k)
        want = compare(kernel, expected, FP32, baseline=baseline, tolerance=loose, k=k)
        assert got.passed == want.passed and got.reasons == want.reasons
        part_max = np.abs(baseline[part].astype(np.float64) - expected[part]).max()
        decided.add(got.baseline_sampled)
        if got.baseline_sampled:
            assert calls == ["sample"] and got.passed
            assert got.baseline_limit == pytest.approx(k * part_max)
            assert got.baseline_limit <= want.baseline_limit
            assert got.baseline_stats.n == 250 and "on a sample of 250" in got.message()
        else:
            assert calls == ["sample", "whole"]
            assert got.baseline_limit == want.baseline_limit
    assert decided == {True, False}                   # both ways were exercised
    with pytest.raises(ValueError, match="baseline sample shape"):
        compare((expected + 4 * noise).astype(np.float32), expected, FP32, baseline=whole,
                baseline_sample=lambda: (baseline[:2], part), tolerance=loose)


def test_percentiles_of_a_large_output_come_from_every_sth_chunk(monkeypatch):
    import nkiverify.compare as cmp
    monkeypatch.setattr(cmp, "PERCENTILE_SAMPLE", 1000)
    actual, expected = _noisy(4500, FP32, 2)
    st = error_stats(actual, expected, FP32, tolerance_for(FP32, 16), chunk=250)
    values = _plain_numpy_stats(actual, expected, FP32, tolerance_for(FP32, 16),
                                np.abs(expected).max())["abs"]
    # n // PERCENTILE_SAMPLE = 4: chunks 0, 4, 8, ... of 250 elements
    sampled = np.concatenate([values[i:i + 250] for i in range(0, 4500, 1000)])
    assert st.abs.max == values.max() and st.abs.mean == pytest.approx(values.mean())
    assert (st.abs.p50, st.abs.p90, st.abs.p99, st.abs.p999) == pytest.approx(
        tuple(np.percentile(sampled, [50, 90, 99, 99.9])), rel=1e-12)


# --- the default tolerance on realistic conv2d data --------------------------------------------

B, C_IN, C_OUT, H, K, POOL = 2, 256, 32, 10, 3, 2  # reduction length 256*9 = 2304, as the course


def conv_inputs(data, dtype, seed=0):
    """Inputs rounded to ``dtype``: uniform [0, 1) (course harness) or signed normal."""
    rng = np.random.default_rng(seed)
    if data == "uniform":
        X, W, bias = rng.random((B, C_IN, H, H)), rng.random((C_OUT, C_IN, K, K)), rng.random(C_OUT)
    else:  # activations N(0, 1), weights N(0, 1/fan_in) so |y| ~ 1, bias N(0, 0.25)
        X = rng.standard_normal((B, C_IN, H, H))
        W = rng.standard_normal((C_OUT, C_IN, K, K)) / math.sqrt(C_IN * K * K)
        bias = rng.standard_normal(C_OUT) * 0.5
    return tuple(a.astype(np.float32).astype(dtype) for a in (X, W, bias))


def pe_array_kernel(X, W, bias, pool, dtype, cast_before_bias=False, partial_sums_in_dtype=False):
    """Model of a kernel on the hardware: for each tap and each 128-channel chunk, the PE
    array sums 128 products sequentially in fp32, and PSUM accumulates the chunks in fp32;
    then bias (fp32), max pool, and one rounding to ``dtype``. The flags model two defects:
    casting the PSUM result to ``dtype`` before the bias add, and keeping each tap's partial
    sum in ``dtype``."""
    x, w, b = (a.astype(np.float32) for a in (X, W, bias))
    out_h = x.shape[2] - w.shape[2] + 1
    psum = np.zeros((x.shape[0], w.shape[0], out_h, out_h), np.float32)
    for di in range(w.shape[2]):
        for dj in range(w.shape[3]):
            patch = x[:, :, di:di + out_h, dj:dj + out_h]
            for c0 in range(0, x.shape[1], 128):
                column = np.zeros_like(psum)
                for c in range(c0, min(c0 + 128, x.shape[1])):
                    column += w[None, :, c, di, dj, None, None] * patch[:, c:c + 1]
                psum += column
            if partial_sums_in_dtype:
                psum = psum.astype(dtype).astype(np.float32)
    if cast_before_bias:
        psum = psum.astype(dtype).astype(np.float32)
    return maxpool2d(psum + b[None, :, None, None], pool).astype(dtype)


def wrong_pool_axes(y, pool):
    """Pooling after a reshape that interleaves the wrong axes (a classic indexing bug)."""
    b, c, h, w = y.shape
    return y.reshape(b, c, h // pool, w // pool, pool, pool).max(axis=(-2, -1))


def check(out, X, W, bias, dtype, use_scale):
    golden = conv2d_maxpool(X, W, bias, POOL)
    scale = conv2d_maxpool_scale(X, W, bias, POOL) if use_scale else None
    baseline = conv2d_maxpool_baseline(X, W, bias, POOL)
    return compare(out, golden, dtype, reduction_length=conv2d_reduction_length(C_IN, K),
                   scale=scale, baseline=baseline)


@pytest.mark.parametrize("use_scale", [False, True], ids=["scale=max", "scale=abs-golden"])
@pytest.mark.parametrize("data", ["uniform", "normal"])
@pytest.mark.parametrize("dtype", [BF16, FP16, FP32], ids=str)
def test_correct_fp32_accumulating_kernels_pass(dtype, data, use_scale):
    X, W, bias = conv_inputs(data, dtype)
    baseline = conv2d_maxpool_baseline(X, W, bias, POOL)
    for out in (baseline, pe_array_kernel(X, W, bias, POOL, dtype)):
        result = check(out, X, W, bias, dtype, use_scale)
        assert result.passed, result.message()


BUGS = {
    "missing bias": lambda X, W, b, dt: conv2d_maxpool_baseline(X, W, np.zeros_like(b), POOL),
    "one tap missing": lambda X, W, b, dt: conv2d_maxpool_baseline(
        X, W * (np.arange(K * K).reshape(K, K) != K * K - 1).astype(W.dtype), b, POOL),
    "window off by one row": lambda X, W, b, dt: conv2d_maxpool_baseline(
        np.roll(X, -1, axis=2), W, b, POOL),
    "window off by one column": lambda X, W, b, dt: conv2d_maxpool_baseline(
        np.roll(X, -1, axis=3), W, b, POOL),
    "wrong pooling axes": lambda X, W, b, dt: wrong_pool_axes(
        conv2d_maxpool_baseline(X, W, b, 1), POOL),
    "partial sums in dtype": lambda X, W, b, dt: pe_array_kernel(
        X, W, b, POOL, dt, partial_sums_in_dtype=True),
    "cast before bias add": lambda X, W, b, dt: pe_array_kernel(
        X, W, b, POOL, dt, cast_before_bias=True),
}


@pytest.mark.parametrize("use_scale", [False, True], ids=["scale=max", "scale=abs-golden"])
@pytest.mark.parametrize("data", ["uniform", "normal"])
@pytest.mark.parametrize("bug", list(BUGS))
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
def test_buggy_kernels_fail_in_low_precision(dtype, bug, data, use_scale):
    X, W, bias = conv_inputs(data, dtype)
    result = check(BUGS[bug](X, W, bias, dtype), X, W, bias, dtype, use_scale)
    assert not result.passed, result.message()


def test_missing_bias_in_bf16_is_caught_by_the_mean_not_the_elements():
    # With harness data |y| ~ 576, where one bf16 ulp is 4: a bias in [0, 1) moves few
    # elements past half an ulp, but shifts the mean error by -mean(bias).
    X, W, bias = conv_inputs("uniform", BF16)
    result = check(BUGS["missing bias"](X, W, bias, BF16), X, W, bias, BF16, True)
    assert result.stats.mismatches < result.stats.n / 4
    assert result.stats.mean_error == pytest.approx(-float(bias.astype(np.float64).mean()), abs=0.1)
    assert any(r.startswith("systematic error") for r in result.reasons)


@pytest.mark.parametrize("bug", ["missing bias", "one tap missing", "window off by one row",
                                 "window off by one column", "wrong pooling axes"])
@pytest.mark.parametrize("data", ["uniform", "normal"])
def test_buggy_kernels_fail_in_fp32(bug, data):
    X, W, bias = conv_inputs(data, FP32)
    result = check(BUGS[bug](X, W, bias, FP32), X, W, bias, FP32, False)
    assert not result.passed and result.stats.mismatches > 0


# --- chunked statistics against a plain NumPy computation ---------------------------------------

def _plain_numpy_stats(actual, expected, dtype, tol, scale):
    """The statistics computed the obvious way, on whole arrays (the truth for the chunked ones)."""
    a, e = actual.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    s = np.broadcast_to(scale, expected.shape).ravel() if np.ndim(scale) else scale
    ok = np.isfinite(a) & np.isfinite(e)
    a, e = a[ok], e[ok]
    s = s[ok] if np.ndim(s) else s
    abs_err = np.abs(a - e)
    allowed = tol.allowed(e, s)
    ratio = np.where(abs_err > 0, abs_err / np.where(allowed > 0, allowed, 1), 0)
    rel = abs_err / np.maximum(np.abs(e), float(ml_dtypes.finfo(dtype).smallest_normal))
    ulps = abs_err / ulp(e, dtype)
    k = int(np.argmax(ratio))
    return {"abs": abs_err, "rel": rel, "ulp": ulps, "mismatches": int((ratio > 1).sum()),
            "worst": int(np.flatnonzero(ok)[k]), "max_ratio": ratio[k],
            "mean_error": float((a - e).mean())}


def _noisy(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    expected = rng.standard_normal(shape) * 50
    actual = (expected + rng.standard_normal(shape) * 2e-2).astype(dtype)
    return actual, expected


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=str)
@pytest.mark.parametrize("chunk", [1, 7, 1000, None])
def test_chunked_stats_equal_whole_array_numpy(dtype, chunk):
    actual, expected = _noisy((13, 17, 9), dtype, 5)
    actual[3, 4, 5] = np.nan                      # NaNs in different chunks
    actual[12, 0, 1] = np.inf
    tol = tolerance_for(dtype, 64)
    scale = np.abs(expected) + 1
    st = error_stats(actual, expected, dtype, tol, scale, chunk=chunk)
    want = _plain_numpy_stats(actual, expected, dtype, tol, scale)
    assert st.nan_count == 2 and st.first_nonfinite_index == (3, 4, 5)
    assert st.mismatches == want["mismatches"] + 2
    assert st.worst_index == np.unravel_index(want["worst"], expected.shape)
    assert st.max_ratio == pytest.approx(want["max_ratio"], rel=1e-12)
    assert st.mean_error == pytest.approx(want["mean_error"], rel=1e-9)
    for name in ("abs", "rel", "ulp"):
        dist, values = getattr(st, name), want[name]
        assert dist.max == values.max()                       # exact
        assert dist.mean == pytest.approx(values.mean(), rel=1e-12)
        assert (dist.p50, dist.p90, dist.p99, dist.p999) == pytest.approx(
            tuple(np.percentile(values, [50, 90, 99, 99.9])), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_histogram_percentiles_within_their_documented_accuracy(seed):
    # More values than EXACT_PERCENTILES (lowered here): percentiles come from the log-histogram,
    # within 2**-HIST_BITS relative of np.percentile; max and mean stay exact.
    from nkiverify.compare import HIST_BITS
    actual, expected = _noisy(20000, FP32, seed)
    tol = tolerance_for(FP32, 16)
    exact = error_stats(actual, expected, FP32, tol, chunk=999)
    hist = error_stats(actual, expected, FP32, tol, chunk=999, exact_percentiles=500)
    want = _plain_numpy_stats(actual, expected, FP32, tol, np.abs(expected).max())
    for name in ("abs", "rel", "ulp"):
        d, values = getattr(hist, name), want[name]
        assert d.max == values.max()
        assert d.mean == pytest.approx(values.mean(), rel=1e-12)
        got = (d.p50, d.p90, d.p99, d.p999)
        assert got == pytest.approx(tuple(np.percentile(values, [50, 90, 99, 99.9])),
                                    rel=2.0**-HIST_BITS)
        e = getattr(exact, name)
        assert got != (e.p50, e.p90, e.p99, e.p999)    # the histogram path did run
    assert hist.mismatches == exact.mismatches and hist.worst_index == exact.worst_index


def test_histogram_percentiles_of_zero_and_constant_errors():
    expected = np.arange(5000, dtype=np.float64)
    st = error_stats(expected.astype(np.float32), expected, FP32, tolerance_for(FP32, 1),
                     exact_percentiles=10, chunk=333)
    assert (st.abs.max, st.abs.p50, st.abs.p999, st.abs.mean) == (0.0, 0.0, 0.0, 0.0)
    off = expected + 0.25
    st = error_stats(off, expected, np.float64, tolerance_for(np.float64, 1),
                     exact_percentiles=10, chunk=333)
    assert st.abs.max == 0.25 and st.abs.p50 == 0.25 and st.abs.p999 == 0.25


def test_baseline_gets_only_its_max_and_counts():
    actual, expected = _noisy((40, 30), FP16, 3)
    tol = tolerance_for(FP16, 1)
    full = error_stats(actual, expected, FP16, tol)
    lean = error_stats(actual, expected, FP16, tol, full=False, chunk=64)
    assert lean.abs.max == full.abs.max == np.abs(actual.astype(np.float64) - expected).max()
    assert (lean.n, lean.mismatches, lean.nan_count) == (full.n, full.mismatches, full.nan_count)
    assert math.isnan(lean.abs.p99) and math.isnan(lean.ulp.max) and lean.worst_index is None


def test_compare_does_not_modify_its_float64_inputs():
    actual, expected = _noisy((64, 64), np.float64, 4)
    a0, e0 = actual.copy(), expected.copy()
    compare(actual, expected, FP32, baseline=actual, scale=np.abs(expected))
    np.testing.assert_array_equal(actual, a0)
    np.testing.assert_array_equal(expected, e0)


def half_window_pool(y, pool):
    """A max pool over the first column of each window only (the window's stride forgotten)."""
    b, c, h, w = y.shape
    return y.reshape(b, c, h // pool, pool, w // pool, pool)[..., 0].max(axis=3)


def test_the_systematic_error_hint_tells_an_offset_from_a_partial_error():
    # a missing bias moves every element; a max pool over half its window leaves right the
    # elements whose max it kept (never above the true max): the median error is near zero,
    # and the hint must not send the student to the bias (fp32, the course's correctness dtype)
    X, W, bias = conv_inputs("uniform", FP32)

    def systematic(out):
        result = check(out, X, W, bias, FP32, False)
        return [r for r in result.reasons if r.startswith("systematic error")]

    pool = systematic(half_window_pool(conv2d_maxpool_baseline(X, W, bias, 1), POOL))
    assert pool and "the error sits on part of the elements" in pool[0] and "bias" not in pool[0]
    missing = systematic(BUGS["missing bias"](X, W, bias, FP32))
    assert missing and "a missing bias" in missing[0]


def test_an_exact_output_that_differs_says_so_without_infinite_ratios():
    # a transpose that leaves its tiles unswapped: the tolerance of data movement is 0, so
    # "inf x the allowed error" and a baseline comparison would say nothing
    rng = np.random.default_rng(3)
    a = rng.random((256, 256), dtype=np.float32)
    want = a.T.copy()
    got = want.copy()
    got[:128, 128:], got[128:, :128] = want[128:, :128], want[:128, 128:]
    result = compare(got, want.astype(np.float64), np.float32, reduction_length=0,
                     baseline=want)
    assert not result.passed
    assert result.reasons == [
        f"32768 of 65536 elements (50%) differ, where the output must be exact (data movement "
        f"does no arithmetic); worst at index {result.stats.worst_index}: actual = "
        f"{result.stats.worst_actual!r}, expected = {result.stats.worst_expected!r}"]
    assert "inf" not in result.message()
