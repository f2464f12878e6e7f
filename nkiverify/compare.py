"""Tolerance-aware comparison of a kernel's output with its float64 golden model.

``compare(actual, expected, dtype)`` checks, in order:

1. the shapes are equal (no broadcasting);
2. no NaN/inf in the output where the golden is finite;
3. every element is within the dtype's tolerance (``Tolerance.allowed``);
4. the mean signed error is not a systematic offset (a missing bias hides under one bf16 ulp
   per element but shifts the mean by the bias);
5. when the low-precision ``baseline`` output is given, the kernel's max abs error is at most
   ``k`` times the baseline's (floored at one ulp at max|golden|).

and reports the error distribution (abs, rel, ULP of the output dtype: max, mean and
percentiles) with the worst element, so a failure says what, where and by how much.

The golden ``expected`` must be computed in float64 *from the inputs the kernel saw*, i.e. after
rounding them to the kernel's dtype; input rounding is then not part of the error.
"""

import math
from dataclasses import asdict, dataclass, field

import ml_dtypes
import numpy as np

PERCENTILES = (50, 90, 99, 99.9)
FP32_UNIT_ROUNDOFF = 2.0**-24  # u = eps/2 of the fp32 PSUM accumulator and the engines


def _finfo(dtype):
    """``ml_dtypes.finfo`` (handles float16/32/64, bfloat16 and the float8 types)."""
    try:
        return ml_dtypes.finfo(np.dtype(dtype))
    except (TypeError, ValueError):
        raise TypeError(f"compare needs a floating-point output dtype, got {dtype!r}") from None


def ulp(x, dtype):
    """Spacing of ``dtype``'s numbers at ``|x|``: ``2**(floor(log2|x|) - nmant)``.

    Below the smallest normal (including exact zero) the spacing is constant, the smallest
    subnormal ``2**(minexp - nmant)``. At a power of two this is the spacing above it, as
    ``np.spacing``. NaN for non-finite ``x``. Computed in float64, exactly.
    """
    info = _finfo(dtype)
    mag = np.asarray(x, dtype=np.float64)
    # Keeping only the exponent bits of a float64 gives 2**floor(log2|x|) (0 for zero and
    # float64 subnormals) in one cheap pass; np.frexp is several times slower.
    exponent_bits = np.asarray(mag.view(np.uint64) & np.uint64(0x7FF0_0000_0000_0000))
    spacing = exponent_bits.view(np.float64)
    spacing *= 2.0**-info.nmant
    np.maximum(spacing, 2.0 ** (info.minexp - info.nmant), out=spacing)
    if not np.isfinite(spacing).all():
        spacing[~np.isfinite(spacing)] = np.nan
    return spacing[()]


def ulp_error(actual, expected, dtype):
    """``|actual - expected| / ulp(expected, dtype)``, elementwise, in float64."""
    expected = np.asarray(expected, dtype=np.float64)
    actual = np.asarray(actual).astype(np.float64)
    return np.abs(actual - expected) / ulp(expected, dtype)


@dataclass(frozen=True)
class Tolerance:
    """Per-element error allowance for an output of ``dtype`` that sums ``reduction_length`` terms.

    ``allowed(y, s) = max_ulp * ulp_dtype(|y| + rtol*s) + rtol*s + atol`` where ``y`` is the
    float64 golden, ``s`` the magnitude scale (sum of |terms|, or max|y|), and
    ``rtol = accum_factor * sqrt(reduction_length) * accum_unit_roundoff``.

    Derivation (see ``tolerance_for``): the kernel sums K products in fp32, which moves the
    result by at most ``rtol*s`` (probabilistically), then rounds once to ``dtype``, which moves
    it by at most half an ulp of a magnitude <= ``|y| + rtol*s``.

    ``bias_z`` and ``bias_fraction`` set the systematic-error check: the mean signed error fails
    when it exceeds both ``bias_z`` standard errors of the mean and ``bias_fraction`` of the mean
    allowance (``bias_z=None`` disables the check).
    """

    dtype: str
    reduction_length: int = 1
    max_ulp: float = 0.5
    accum_factor: float = 4.0
    accum_unit_roundoff: float = FP32_UNIT_ROUNDOFF
    atol: float = 0.0
    bias_z: float | None = 6.0
    bias_fraction: float = 0.05

    @property
    def rtol(self):
        """Accumulation allowance per unit of scale: ``accum_factor*sqrt(K)*u_acc``."""
        return self.accum_factor * math.sqrt(self.reduction_length) * self.accum_unit_roundoff

    def allowed(self, expected, scale):
        """Allowed ``|actual - expected|`` per element (float64, broadcast over ``expected``)."""
        accum = self.rtol * np.asarray(scale, dtype=np.float64)
        magnitude = np.abs(np.asarray(expected, dtype=np.float64)) + accum
        allowed = ulp(magnitude, self.dtype)
        allowed *= self.max_ulp
        allowed += accum + self.atol
        return allowed

    def describe(self):
        return (
            f"|actual - expected| <= {self.max_ulp:g} ulp_{self.dtype}(|y| + rtol*scale)"
            f" + rtol*scale + atol, rtol = {self.rtol:.3g} (= {self.accum_factor:g}"
            f"*sqrt({self.reduction_length})*{self.accum_unit_roundoff:.3g}), atol = {self.atol:g}"
        )

    def to_dict(self):
        return {**asdict(self), "rtol": self.rtol}


def tolerance_for(dtype, reduction_length=1):
    """Default tolerance for an output of ``dtype`` produced by summing ``reduction_length``
    products (conv2d: C_in*K*K; vector add: 1; ``0`` means pure data movement, exact).

    * ``max_ulp = 0.5``: the hardware rounds to nearest even (nki-reference.md §1.3),
      once, when the fp32 result (bias added in fp32, pooled) is written as ``dtype``: at most
      half an ulp of |fp32 result| <= |y| + rtol*scale. Max pooling commutes with monotone
      rounding and adds nothing. This is a bound, not an estimate, so no slack is needed, and
      it is tight enough that rounding an intermediate to ``dtype`` (bf16 partial sums, or the
      PSUM result cast before the bias add) is caught. Pass ``max_ulp=1`` for stochastic rounding.
    * ``rtol = 4*sqrt(K)*u_acc``: fp32 accumulation of K terms. The worst case is K*u32*sum|t|
      (Higham, Accuracy and Stability, §3.1); with independent roundings the error of a
      sequential sum has standard deviation <= u32*sqrt(K)/3 * sum|t| (Higham & Mary 2019,
      probabilistic bound), so 4*sqrt(K) is >= 12 sigma, and blocked (PE-array/PSUM) order is
      smaller still. For fp32, K = 256*9 and sum|t| = |y| ~ 576 this is ~1.1e-5*|y|, about the
      course harness's np.allclose rtol=1e-5, so a kernel that passes the official check passes.
    * u_acc is fp32's unit roundoff (PSUM and the engines compute in fp32), or the output
      dtype's if that is finer (float64).
    * Input rounding is not in the tolerance: the golden is computed from the rounded inputs.
    """
    dtype = np.dtype(dtype)
    info = _finfo(dtype)
    if reduction_length < 0:
        raise ValueError(f"reduction_length must be >= 0, got {reduction_length}")
    if reduction_length == 0:
        # A transpose or copy does no arithmetic: every element must be bit-exact.
        return Tolerance(str(dtype), 0, max_ulp=0.0, accum_factor=0.0)
    accum_u = min(FP32_UNIT_ROUNDOFF, float(info.eps) / 2)
    return Tolerance(str(dtype), int(reduction_length), accum_unit_roundoff=accum_u)


@dataclass
class Distribution:
    """Summary of one error metric over the finite elements."""

    max: float
    mean: float
    p50: float
    p90: float
    p99: float
    p999: float

    @classmethod
    def of(cls, values, overwrite=False):
        """Summarize a 1-D array; ``overwrite=True`` lets the percentiles reorder it in place."""
        if values.size == 0:
            return cls(*([math.nan] * 6))
        p50, p90, p99, p999 = np.percentile(values, PERCENTILES, overwrite_input=overwrite)
        return cls(float(values.max()), float(values.mean()),
                   float(p50), float(p90), float(p99), float(p999))

    def format(self):
        return "  ".join(f"{v:>10.3g}" for v in asdict(self).values())


@dataclass
class ErrorStats:
    """Error distribution of an output against its golden model.

    ``abs``, ``rel`` and ``ulp`` summarize |actual - expected|, that over max(|expected|, the
    dtype's smallest normal) and that in ulps of the output dtype at |expected|, over the
    elements where both values are finite. ``mismatches`` counts every failing element
    (beyond tolerance, NaN/inf where the golden is finite, or a non-finite golden not matched);
    ``nan_count`` only the NaN/inf ones. The worst element is the one with the largest
    ``|error| / allowed`` ratio (``max_ratio``; above 1 means beyond tolerance).
    ``mean_error`` is the mean signed error, ``mean_error_limit`` the systematic-error limit.
    """

    n: int
    mismatches: int
    nan_count: int
    abs: Distribution
    rel: Distribution
    ulp: Distribution
    max_ratio: float
    worst_index: tuple | None
    worst_actual: float | None
    worst_expected: float | None
    first_nonfinite_index: tuple | None
    mean_error: float
    mean_error_limit: float

    def to_dict(self):
        """Plain dict for JSON; NaN/inf become None (JSON has no NaN)."""
        def clean(value):
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, tuple):
                return [int(i) for i in value]
            if isinstance(value, float) and not math.isfinite(value):
                return None
            return value

        return clean(asdict(self))


def _index(flat_index, shape):
    return tuple(int(i) for i in np.unravel_index(int(flat_index), shape))


def error_stats(actual, expected, dtype, tolerance, scale=None):
    """Compute ``ErrorStats`` of ``actual`` against the float64 golden ``expected``.

    ``scale`` is the magnitude the accumulation error grows with: an array broadcastable to
    ``expected`` (e.g. the golden on |inputs|) or a scalar; default max|expected|.
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch: actual {actual.shape}, expected {expected.shape}")
    shape, n = expected.shape, expected.size
    a = actual.astype(np.float64).ravel()
    e = expected.ravel()

    e_finite, a_finite = np.isfinite(e), np.isfinite(a)
    nonfinite = e_finite & ~a_finite
    nan_count = int(nonfinite.sum())
    # Where the golden itself is inf/NaN, the kernel must produce the same special value.
    special_bad = int((~e_finite & ~((a == e) | (np.isnan(a) & np.isnan(e)))).sum())
    both = e_finite & a_finite
    positions = None if both.all() else np.flatnonzero(both)
    if positions is not None:
        a, e = a[positions], e[positions]

    if scale is None:
        s = float(np.abs(e).max()) if e.size else 0.0
    else:
        try:
            s = np.broadcast_to(np.asarray(scale, dtype=np.float64), shape).ravel()
        except ValueError:
            raise ValueError(f"scale of shape {np.shape(scale)} does not broadcast to "
                             f"the output shape {shape}") from None
        if positions is not None:
            s = s[positions]

    # Large outputs (50M elements) make every temporary cost: operate in place where we can.
    err = a - e
    abs_err = np.abs(err)
    allowed = tolerance.allowed(e, s)
    with np.errstate(divide="ignore"):  # allowed is 0 only for exact tolerances: ratio inf
        ratio = np.divide(abs_err, allowed, out=np.zeros_like(abs_err), where=abs_err > 0)
    ulp_err = ulp(e, tolerance.dtype)
    mean_square_ulp = float(np.dot(ulp_err, ulp_err)) / max(e.size, 1)
    np.divide(abs_err, ulp_err, out=ulp_err)
    rel_err = np.abs(e)
    np.maximum(rel_err, float(_finfo(tolerance.dtype).smallest_normal), out=rel_err)
    np.divide(abs_err, rel_err, out=rel_err)

    worst = (None, None, None, math.nan)
    mean_error, mean_error_limit = math.nan, math.inf
    if e.size:
        k = int(np.argmax(ratio))
        flat = k if positions is None else positions[k]
        worst = (_index(flat, shape), float(a[k]), float(e[k]), float(ratio[k]))
        mean_error = float(err.mean())
        if tolerance.bias_z is not None:
            # Standard error of the mean; the variance is floored by that of one
            # round-to-nearest (ulp^2/12) so a handful of same-sign roundings is not "bias".
            variance = max(float(np.dot(err, err)) / e.size - mean_error**2, 0.0)
            variance += mean_square_ulp / 12
            mean_error_limit = max(tolerance.bias_z * math.sqrt(variance / e.size),
                                   tolerance.bias_fraction * float(allowed.mean()))

    return ErrorStats(
        n=n,
        mismatches=int((ratio > 1).sum()) + nan_count + special_bad,
        nan_count=nan_count,
        abs=Distribution.of(abs_err, overwrite=True),
        rel=Distribution.of(rel_err, overwrite=True),
        ulp=Distribution.of(ulp_err, overwrite=True),
        max_ratio=worst[3],
        worst_index=worst[0],
        worst_actual=worst[1],
        worst_expected=worst[2],
        first_nonfinite_index=_index(np.argmax(nonfinite), shape) if nan_count else None,
        mean_error=mean_error,
        mean_error_limit=mean_error_limit,
    )


@dataclass
class Comparison:
    """Outcome of ``compare``: ``passed``, the ``reasons`` it failed, and the statistics.

    ``stats`` is None only when the shapes differ. ``baseline_limit`` is the max abs error the
    kernel was allowed by the baseline check (None without a baseline).
    """

    passed: bool
    dtype: str
    shape: tuple
    tolerance: Tolerance
    stats: ErrorStats | None
    baseline_stats: ErrorStats | None = None
    baseline_limit: float | None = None
    k: float = 4.0
    reasons: list[str] = field(default_factory=list)

    def __bool__(self):
        return self.passed

    def message(self):
        """Multi-line report: verdict and reasons, worst element, tolerance, distribution."""
        verdict = "passed" if self.passed else "FAILED"
        lines = [f"compare {self.dtype} output of shape {self.shape}, reduction length "
                 f"{self.tolerance.reduction_length}: {verdict}"]
        lines += [f"  - {reason}" for reason in self.reasons]
        st = self.stats
        if st is None:
            return "\n".join(lines)
        if st.worst_index is not None:
            err = abs(st.worst_actual - st.worst_expected)
            rel = err / max(abs(st.worst_expected), float(_finfo(self.dtype).smallest_normal))
            ulps = err / float(ulp(st.worst_expected, self.dtype))
            lines.append(f"worst element at index {st.worst_index}: actual = {st.worst_actual!r}, "
                         f"expected = {st.worst_expected!r}")
            lines.append(f"  abs error {err:.4g}, rel error {rel:.3g}, {ulps:.3g} ulp; "
                         f"{st.max_ratio:.3g}x the allowed error")
            if 1 < st.max_ratio <= 8 and _finfo(self.dtype).bits < 32:
                lines.append(f"  hint: errors of a few ulp in {self.dtype} usually mean an "
                             f"intermediate result was rounded to {self.dtype} (partial sums, or "
                             "the conv result cast before the bias add) instead of kept in fp32")
        lines.append(f"tolerance: {self.tolerance.describe()}")
        lines.append(f"mean error (actual - expected): {st.mean_error:.4g} "
                     f"(systematic-error limit +-{st.mean_error_limit:.3g})")
        lines.append(f"error distribution over {st.n - st.nan_count} finite of {st.n} elements:")
        lines.append("  metric" + "".join(f"{h:>12}" for h in
                                          ("max", "mean", "p50", "p90", "p99", "p99.9")))
        for name in ("abs", "rel", "ulp"):
            lines.append(f"  {name:<6}  {getattr(st, name).format()}")
        if self.baseline_stats is not None:
            b = self.baseline_stats
            lines.append(f"baseline (fp32-accumulated {self.dtype}): max abs error "
                         f"{b.abs.max:.4g}, kernel limit {self.baseline_limit:.4g} "
                         f"(= {self.k:g} x max(baseline, 1 ulp at max|golden|))")
            if b.mismatches:
                lines.append(f"  note: the baseline itself has {b.mismatches} elements beyond "
                             "tolerance; the tolerance may be too strict for this case")
        return "\n".join(lines)


def _percent(count, total):
    return f"{100 * count / total:.3g}%" if total else "0%"


def compare(actual, expected, dtype, *, reduction_length=1, scale=None, baseline=None,
            k=4.0, tolerance=None):
    """Compare a kernel's ``actual`` output with the float64 golden ``expected``.

    ``dtype`` is the output dtype the kernel rounds to; ``reduction_length`` the number of
    products summed per output (``reference.conv2d.conv2d_reduction_length``); ``scale`` the
    magnitude of the summed terms (array or scalar, default max|expected|); ``baseline`` the
    low-precision baseline output (``reference.*_baseline``), enabling the ``k`` x baseline
    check; ``tolerance`` overrides ``tolerance_for(dtype, reduction_length)``.
    """
    dtype = np.dtype(dtype)
    tolerance = tolerance or tolerance_for(dtype, reduction_length)
    actual, expected = np.asarray(actual), np.asarray(expected)
    result = Comparison(passed=False, dtype=str(dtype), shape=actual.shape,
                        tolerance=tolerance, stats=None, k=k)
    if actual.shape != expected.shape:
        reason = f"shape mismatch: kernel output {actual.shape}, golden {expected.shape}"
        if actual.size == expected.size:
            reason += " (same number of elements: a missing reshape?)"
        result.reasons.append(reason)
        return result

    st = result.stats = error_stats(actual, expected, dtype, tolerance, scale)
    if st.nan_count:
        idx = st.first_nonfinite_index
        result.reasons.append(
            f"{st.nan_count} NaN/inf values where the golden is finite (first at index {idx}: "
            f"actual = {float(actual[idx])!r}, expected = {float(expected[idx])!r}); "
            "output never written, or overflow?")
    beyond = st.mismatches - st.nan_count
    if beyond:
        detail = ""
        if st.worst_index is not None and st.max_ratio > 1:
            detail = (f"; worst at index {st.worst_index}: actual = {st.worst_actual!r}, "
                      f"expected = {st.worst_expected!r}, {st.max_ratio:.3g}x the allowed error")
        result.reasons.append(f"{beyond} of {st.n} elements ({_percent(beyond, st.n)}) "
                              f"beyond tolerance{detail}")
    if abs(st.mean_error) > st.mean_error_limit:
        mean_ulp = st.mean_error / float(np.mean(ulp(expected[np.isfinite(expected)], dtype)))
        result.reasons.append(
            f"systematic error: mean(actual - expected) = {st.mean_error:.4g} "
            f"({mean_ulp:+.3g} ulp on average) exceeds +-{st.mean_error_limit:.3g}; "
            f"a missing bias (or one added after rounding to {dtype}, which drops it when it is "
            "below half an ulp), an offset, or a truncating cast?")
    if baseline is not None:
        baseline = np.asarray(baseline)
        if baseline.shape != expected.shape:
            raise ValueError(f"baseline shape {baseline.shape} != golden shape {expected.shape}")
        bst = result.baseline_stats = error_stats(baseline, expected, dtype, tolerance, scale)
        finite = expected[np.isfinite(expected)]
        floor = float(ulp(np.abs(finite).max(), dtype)) if finite.size else 0.0
        result.baseline_limit = k * max(bst.abs.max if math.isfinite(bst.abs.max) else 0.0,
                                        floor)
        if st.abs.max > result.baseline_limit:
            result.reasons.append(
                f"max abs error {st.abs.max:.4g} exceeds {k:g} x the fp32-accumulated "
                f"{dtype} baseline's ({bst.abs.max:.4g}, floored at 1 ulp at max|golden| = "
                f"{floor:.3g}): limit {result.baseline_limit:.4g}")
    result.passed = not result.reasons
    return result
