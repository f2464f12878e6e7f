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

The golden ``expected`` must be computed *from the inputs the kernel saw*, i.e. after rounding
them to the kernel's dtype, so input rounding is not part of the error; in float64 for fp32
outputs, in float32 at least for 16-bit and 8-bit outputs (``reference/``: a float32 sum's error
is a small fraction of their half-ulp allowance).

The statistics stream over the output in chunks (``CHUNK`` elements) through scratch arrays
reused from chunk to chunk: memory stays bounded whatever the output size, nothing is sorted,
and the baseline gets only its max abs error and mismatch count, which is all the baseline check
and the report use. The baseline is computed only when it can change the verdict, first on a
part of the output when the caller can make one (``baseline_sample``).
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


def ulp(x, dtype, out=None):
    """Spacing of ``dtype``'s numbers at ``|x|``: ``2**(floor(log2|x|) - nmant)``.

    Below the smallest normal (including exact zero) the spacing is constant, the smallest
    subnormal ``2**(minexp - nmant)``. At a power of two this is the spacing above it, as
    ``np.spacing``. NaN for non-finite ``x``. Computed in float64, exactly. ``out``: a float64
    array of ``x``'s shape to write into (may be ``x`` itself).
    """
    info = _finfo(dtype)
    mag = np.asarray(x, dtype=np.float64)
    # Keeping only the exponent bits of a float64 gives 2**floor(log2|x|) (0 for zero and
    # float64 subnormals) in one cheap pass; np.frexp is several times slower.
    exponent_bits = np.asarray(np.bitwise_and(
        mag.view(np.uint64), np.uint64(0x7FF0_0000_0000_0000),
        out=None if out is None else out.view(np.uint64)))
    spacing = exponent_bits.view(np.float64)
    spacing *= 2.0**-info.nmant
    np.maximum(spacing, 2.0 ** (info.minexp - info.nmant), out=spacing)
    # inf/NaN |x| leave inf (all exponent bits set); one reduction finds them (the max
    # propagates NaN too) without the boolean temporary of isfinite().all()
    if spacing.size and not math.isfinite(float(spacing.max())):
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

    def allowed(self, expected, scale, out=None, work=None):
        """Allowed ``|actual - expected|`` per element (float64, broadcast over ``expected``).

        ``out`` (and ``work``, when ``scale`` is an array): float64 arrays of ``expected``'s
        shape to compute in, so a chunked comparison allocates nothing per chunk."""
        expected = np.asarray(expected, dtype=np.float64)
        if np.ndim(scale) == 0:
            accum = self.rtol * float(scale)
        else:
            accum = np.multiply(np.asarray(scale, dtype=np.float64), self.rtol, out=work)
        if out is None or np.shape(accum) not in ((), expected.shape):
            magnitude = np.abs(expected) + accum
        else:
            magnitude = np.abs(expected, out=out)
            magnitude += accum
        allowed = ulp(magnitude, self.dtype, out=magnitude)
        allowed *= self.max_ulp
        allowed += accum
        if self.atol:
            allowed += self.atol
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
    """Summary of one error metric over the finite elements.

    ``max`` and ``mean`` are exact. The percentiles are exact (``np.percentile``, linear
    interpolation) up to ``EXACT_PERCENTILES`` finite elements; above that they come from a
    histogram of the values' float64 exponent and top ``HIST_BITS`` mantissa bits, accurate to
    ``2**-HIST_BITS`` (0.4%) relative, with no sort and memory independent of the output size.
    Above ``PERCENTILE_SAMPLE`` elements the histogram holds a fixed sample, every s-th chunk
    of ``CHUNK`` elements (at least ``PERCENTILE_SAMPLE`` values; a B=4 224x224 conv2d has 50M
    outputs, binning them all was a quarter of the comparison's time): the percentiles then
    carry that sample's error too (p99.9 of 4M values: ~4000 above it).
    No verdict depends on a percentile (the verdicts use the max ratio, the mismatch count, the
    mean error and the max abs error, all exact).
    """

    max: float
    mean: float
    p50: float
    p90: float
    p99: float
    p999: float

    @classmethod
    def of(cls, values, overwrite=False):
        """Summarize a 1-D array exactly; ``overwrite=True`` lets the percentiles reorder it."""
        if values.size == 0:
            return cls(*([math.nan] * 6))
        p50, p90, p99, p999 = np.percentile(values, PERCENTILES, overwrite_input=overwrite)
        return cls(float(values.max()), float(values.mean()),
                   float(p50), float(p90), float(p99), float(p999))

    def format(self):
        return "  ".join(f"{v:>10.3g}" for v in asdict(self).values())


# Error statistics stream over the output in chunks of CHUNK elements, so their memory does not
# grow with the output (a B=4 256->256 224x224 conv2d has 50M outputs: whole-array float64
# temporaries took 4 GiB). 64Ki elements: the dozen float64 temporaries of a chunk (512 KiB
# each) stay in the CPU's caches; measured on the 2-core machine, a 12.6M-element conv2d output
# compares in 0.6 s CPU against 1.1 s with 1Mi-element chunks (issue 12).
CHUNK = 1 << 16
EXACT_PERCENTILES = 1 << 20     # up to this many finite elements the percentiles are exact
PERCENTILE_SAMPLE = 1 << 22     # above this many elements the percentiles come from a sample
HIST_BITS = 8                   # histogram bins per octave: 2**HIST_BITS (relative error 0.4%)
_HIST_SHIFT = np.uint64(52 - HIST_BITS)
_HIST_BINS = 1 << (11 + HIST_BITS)   # every non-negative float64, +inf included


class _Summary:
    """Streaming max, mean and percentiles of a non-negative float64 metric (see Distribution)."""

    def __init__(self, exact_limit=EXACT_PERCENTILES):
        self.n, self.total, self.max = 0, 0.0, -math.inf
        self.m = 0                # how many of them the percentiles see (all, or the sample)
        self.exact_limit = exact_limit
        self.kept = []            # the values themselves while there are few
        self.hist = None
        self.idx = None           # scratch for the bin indices

    def add(self, v, sampled=True):
        """Count ``v`` in the max and mean, and in the percentiles when ``sampled``."""
        if not v.size:
            return
        self.n += v.size
        self.total += float(v.sum())
        self.max = max(self.max, float(v.max()))
        if not sampled:
            return
        self.m += v.size
        if self.hist is None:
            self.kept.append(v.copy())        # v is the caller's scratch array
            if self.m <= self.exact_limit:
                return
            self.hist = np.zeros(_HIST_BINS, np.int64)
            kept, self.kept = self.kept, []
            for k in kept:
                self._bin(k)
        else:
            self._bin(v)

    def _bin(self, v):
        # Non-negative float64 bit patterns sort as the values: exponent and top mantissa bits
        # are a log-scale bin index.
        if self.idx is None or self.idx.size < v.size:
            self.idx = np.empty(v.size, np.uint64)
        idx = np.right_shift(v.view(np.uint64), _HIST_SHIFT, out=self.idx[:v.size])
        lo = int(idx.min())
        idx -= np.uint64(lo)                   # bins from the chunk's smallest: a short count
        counts = np.bincount(idx.view(np.int64))
        self.hist[lo:lo + counts.size] += counts

    def _order_stat(self, cum, k):
        """Estimate of the k-th smallest value (0-based) from the histogram."""
        b = int(np.searchsorted(cum, k, side="right"))
        before = int(cum[b - 1]) if b else 0
        count = int(cum[b]) - before
        lo = float(np.uint64(b << (52 - HIST_BITS)).view(np.float64))
        hi = min(float(np.uint64((b + 1) << (52 - HIST_BITS)).view(np.float64)), self.max)
        return lo + (hi - lo) * (k - before + 0.5) / count if hi > lo else lo

    def distribution(self) -> Distribution:
        if self.n == 0:
            return Distribution(*([math.nan] * 6))
        if self.m == 0:                    # the sampled chunks had no finite element
            ps = [math.nan] * len(PERCENTILES)
        elif self.hist is None:
            values = np.concatenate(self.kept) if len(self.kept) > 1 else self.kept[0]
            ps = np.percentile(values, PERCENTILES)
        else:
            cum = np.cumsum(self.hist)
            ps = []
            for q in PERCENTILES:          # np.percentile's linear interpolation of ranks
                rank = q / 100 * (self.m - 1)
                k = int(rank)
                lo = self._order_stat(cum, k)
                hi = self._order_stat(cum, k + 1) if k + 1 < self.m else lo
                ps.append(min(lo + (hi - lo) * (rank - k), self.max))
        return Distribution(self.max, self.total / self.n, *(float(p) for p in ps))


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
    Statistics that were not computed (``error_stats(..., full=False)``) are NaN.
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


def _flat(x):
    """``x`` as a 1-D array, a view when it is contiguous."""
    return np.asarray(x).reshape(-1)


def _chunks(n, chunk=None):
    chunk = chunk or CHUNK
    return ((i, min(i + chunk, n)) for i in range(0, n, chunk))


def finite_absmax(x) -> float:
    """max |x| over the finite elements (NaN when there are none), chunked."""
    best = math.nan
    flat = _flat(x)
    for i, j in _chunks(flat.size):
        c = flat[i:j]
        # max and min: no temporary (NaN propagates, inf shows): |x| only when one is there
        m = max(abs(float(c.max())), abs(float(c.min()))) if c.size else math.nan
        if not math.isfinite(m):
            c = np.abs(np.asarray(c, dtype=np.float64))
            c = c[np.isfinite(c)]
            m = float(c.max()) if c.size else math.nan
        best = m if not best >= m else best      # NaN-aware max
    return best


def _mean_ulp(expected, dtype) -> float:
    """Mean ulp of ``dtype`` over the finite golden values, chunked."""
    total, n = 0.0, 0
    flat = _flat(expected)
    for i, j in _chunks(flat.size):
        e = np.asarray(flat[i:j], dtype=np.float64)
        e = e[np.isfinite(e)]
        total += float(ulp(e, dtype).sum()) if e.size else 0.0
        n += e.size
    return total / n if n else math.nan


def error_stats(actual, expected, dtype, tolerance, scale=None, *, full=True, chunk=None,
                exact_percentiles=EXACT_PERCENTILES):
    """Compute ``ErrorStats`` of ``actual`` against the golden ``expected``.

    ``expected`` is the float64 golden (a float32 golden is enough for 16-bit and 8-bit outputs,
    see ``reference/``); it is read in float64. ``scale`` is the magnitude the accumulation error
    grows with: an array broadcastable to ``expected`` (e.g. the golden on |inputs|) or a scalar;
    default max|expected|. ``full=False`` computes only what the baseline check uses: the counts
    (``n``, ``mismatches``, ``nan_count``) and the max abs error; everything else is NaN/None.

    The statistics stream over ``chunk`` elements at a time (default ``CHUNK``): memory does not
    grow with the output. The verdict figures (mismatches, max ratio and worst element, mean
    error and its limit, max abs error) are exact; see ``Distribution`` for the percentiles.
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch: actual {actual.shape}, expected {expected.shape}")
    shape, n = expected.shape, expected.size
    a_flat, e_flat = _flat(actual), _flat(expected)

    s_flat, s_scalar = None, None
    if scale is None:
        s_scalar = finite_absmax(expected)
    elif np.ndim(scale) == 0:
        s_scalar = float(scale)
    elif np.shape(scale) == shape:
        s_flat = _flat(scale)
    else:
        try:
            s_flat = np.broadcast_to(np.asarray(scale, dtype=np.float64), shape).ravel()
        except ValueError:
            raise ValueError(f"scale of shape {np.shape(scale)} does not broadcast to "
                             f"the output shape {shape}") from None

    tiny = float(_finfo(tolerance.dtype).smallest_normal)
    # allowed >= max_ulp * (a positive ulp) + atol > 0, unless both are 0 (exact tolerances)
    # or half float64's smallest subnormal underflows (float64 outputs)
    exact = not (tolerance.atol > 0 or
                 tolerance.max_ulp > 0 and _finfo(tolerance.dtype).bits < 64)
    abs_s = _Summary(exact_percentiles)
    rel_s = _Summary(exact_percentiles)
    ulp_s = _Summary(exact_percentiles)
    nan_count = special_bad = mismatches = finite = 0
    first_nonfinite = None
    worst_ratio, worst = -math.inf, None
    sum_err = sum_err2 = sum_ulp2 = sum_allowed = 0.0
    abs_max = -math.inf
    # the percentiles' sample: every `stride`-th chunk, at least PERCENTILE_SAMPLE values
    size = chunk or CHUNK
    stride = max(1, n // PERCENTILE_SAMPLE)

    # Scratch arrays of one chunk, reused: fresh 512 KiB temporaries per operation were
    # returned to the OS and page-faulted back at every chunk (glibc trims its heap above
    # 128 KiB free), half of a large comparison's CPU time (measured, issue 12).
    width = min(size, n) or 1
    buf = {name: np.empty(width) for name in ("a", "e", "s", "err", "abs", "allowed", "work",
                                              "ratio", "ulp", "rel")}

    def as64(flat, name, i, j):
        part = flat[i:j]
        if part.dtype == np.float64:
            return part
        out = buf[name][:j - i]
        np.copyto(out, part, casting="unsafe")
        return out

    for i, j in _chunks(n, chunk):
        a = as64(a_flat, "a", i, j)
        e = as64(e_flat, "e", i, j)
        s = s_scalar if s_flat is None else as64(s_flat, "s", i, j)
        # a and e may be views of the caller's arrays: no in-place operation on them
        with np.errstate(invalid="ignore"):         # inf - inf: found just below
            err = np.subtract(a, e, out=buf["err"][:j - i])
        abs_err = np.abs(err, out=buf["abs"][:j - i])
        chunk_max = float(abs_err.max())
        positions = None
        if not math.isfinite(chunk_max):     # a NaN/inf in a or e (or an overflowing a - e)
            e_fin, a_fin = np.isfinite(e), np.isfinite(a)
            nonfinite = e_fin & ~a_fin
            bad = int(np.count_nonzero(nonfinite))
            if bad and first_nonfinite is None:
                first_nonfinite = i + int(np.argmax(nonfinite))
            nan_count += bad
            # Where the golden itself is inf/NaN, the kernel must produce the same special value.
            special_bad += int(np.count_nonzero(
                ~e_fin & ~((a == e) | (np.isnan(a) & np.isnan(e)))))
            positions = np.flatnonzero(e_fin & a_fin)
            a, e = a[positions], e[positions]
            if s_flat is not None:
                s = s[positions]
            err = a - e
            abs_err = np.abs(err)
            chunk_max = float(abs_err.max()) if abs_err.size else -math.inf
        if not e.size:
            continue
        m = e.size
        # the chunk's scratch arrays; after dropping non-finite elements, fresh ones
        scratch = {name: (b[:m] if positions is None else None) for name, b in buf.items()}
        finite += m
        allowed = tolerance.allowed(e, s, out=scratch["allowed"], work=scratch["work"])
        if exact:       # allowed is 0 only for exact tolerances: ratio inf where abs_err > 0
            with np.errstate(divide="ignore"):
                ratio = np.divide(abs_err, allowed, out=np.zeros_like(abs_err),
                                  where=abs_err > 0)
        else:
            ratio = np.divide(abs_err, allowed, out=scratch["ratio"])
        k = int(np.argmax(ratio))
        if ratio[k] > 1:
            mismatches += int(np.count_nonzero(ratio > 1))
        abs_max = max(abs_max, chunk_max)
        if not full:
            continue
        if ratio[k] > worst_ratio:
            worst_ratio = float(ratio[k])
            flat = i + (k if positions is None else int(positions[k]))
            worst = (flat, float(a_flat[flat]), float(e[k]))
        sum_err += float(err.sum())
        sum_err2 += float(np.dot(err, err))
        sum_allowed += float(allowed.sum())
        ulp_err = ulp(e, tolerance.dtype, out=scratch["ulp"])
        sum_ulp2 += float(np.dot(ulp_err, ulp_err))
        with np.errstate(over="ignore"):     # float64 outputs: ulp(0) is 5e-324
            np.divide(abs_err, ulp_err, out=ulp_err)
        rel_err = np.abs(e, out=scratch["rel"])
        np.maximum(rel_err, tiny, out=rel_err)
        np.divide(abs_err, rel_err, out=rel_err)
        sampled = (i // size) % stride == 0
        abs_s.add(abs_err, sampled)
        rel_s.add(rel_err, sampled)
        ulp_s.add(ulp_err, sampled)

    nan6 = Distribution(*([math.nan] * 6))
    mean_error, mean_error_limit = math.nan, math.inf
    if full and finite:
        mean_error = sum_err / finite
        if tolerance.bias_z is not None:
            # Standard error of the mean; the variance is floored by that of one
            # round-to-nearest (ulp^2/12) so a handful of same-sign roundings is not "bias".
            variance = max(sum_err2 / finite - mean_error**2, 0.0)
            variance += sum_ulp2 / finite / 12
            mean_error_limit = max(tolerance.bias_z * math.sqrt(variance / finite),
                                   tolerance.bias_fraction * sum_allowed / finite)
    if full:
        abs_d = abs_s.distribution()
    else:
        abs_d = Distribution(abs_max if finite else math.nan, *([math.nan] * 5))
    return ErrorStats(
        n=n,
        mismatches=mismatches + nan_count + special_bad,
        nan_count=nan_count,
        abs=abs_d,
        rel=rel_s.distribution() if full else nan6,
        ulp=ulp_s.distribution() if full else nan6,
        max_ratio=worst_ratio if worst is not None else math.nan,
        worst_index=_index(worst[0], shape) if worst is not None else None,
        worst_actual=worst[1] if worst is not None else None,
        worst_expected=worst[2] if worst is not None else None,
        first_nonfinite_index=_index(first_nonfinite, shape) if nan_count else None,
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
    baseline_sampled: bool = False   # baseline_stats are of a sample of the output

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
            lines.append(f"  abs error {err:.4g}, rel error {rel:.3g}, {ulps:.3g} ulp" +
                         ("" if not math.isfinite(st.max_ratio) else
                          f"; {st.max_ratio:.3g}x the allowed error"))
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
            if self.baseline_sampled:
                lines.append(f"baseline (fp32-accumulated {self.dtype}) on a sample of {b.n} "
                             f"elements: max abs error {b.abs.max:.4g} there, so the kernel "
                             f"limit is at least {self.baseline_limit:.4g} (= {self.k:g} x "
                             "max(baseline, 1 ulp at max|golden|)), which the kernel meets")
            else:
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
            k=4.0, tolerance=None, baseline_sample=None):
    """Compare a kernel's ``actual`` output with the float64 golden ``expected``.

    ``dtype`` is the output dtype the kernel rounds to; ``reduction_length`` the number of
    products summed per output (``reference.conv2d.conv2d_reduction_length``); ``scale`` the
    magnitude of the summed terms (array or scalar, default max|expected|); ``baseline`` the
    low-precision baseline output (``reference.*_baseline``), enabling the ``k`` x baseline
    check, or a function computing it, called only when the check could fail (the kernel's
    max error exceeds ``k`` ulps at max|golden|); ``tolerance`` overrides
    ``tolerance_for(dtype, reduction_length)``.

    ``baseline_sample``: a function returning ``(values, index)``, the baseline on a part of the
    output (``expected[index]``, basic indexing). The baseline's max error over a part is at most
    its max error over the whole, so when the kernel's max error is within ``k`` x the part's,
    it is within ``k`` x the whole's: the check passes as it would with the whole baseline,
    which is not computed (B=4 224x224 fp32 conv2d: a 4 s float32 conv becomes a 0.1 s one on
    a band of rows; issue 12; the part must be the same computation as the whole, see
    ``registry.BASELINE_SAMPLE``). Otherwise ``baseline`` is computed and decides.
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

    absmax = None       # max|golden| over its finite elements: computed once, used twice
    if scale is None or baseline is not None:
        absmax = finite_absmax(expected)
    if scale is None:
        scale = absmax
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
        exact = tolerance.max_ulp == 0 and tolerance.rtol == 0 and not tolerance.atol
        if st.worst_index is not None and st.max_ratio > 1:
            # (an exact tolerance allows 0: the ratio is infinite and says nothing)
            detail = (f"; worst at index {st.worst_index}: actual = {st.worst_actual!r}, "
                      f"expected = {st.worst_expected!r}" +
                      ("" if exact else f", {st.max_ratio:.3g}x the allowed error"))
        result.reasons.append(
            f"{beyond} of {st.n} elements ({_percent(beyond, st.n)}) " +
            ("differ, where the output must be exact (data movement does no arithmetic)"
             if exact else "beyond tolerance") + detail)
    if abs(st.mean_error) > st.mean_error_limit:
        mean_ulp = st.mean_error / _mean_ulp(expected, dtype)
        a = st.abs
        if a.mean > 0 and a.p50 < 0.25 * a.mean:
            # most of the error on a minority of the elements: not an offset of all of them
            # (a missing bias moves every element; a max pool over half its window leaves
            # the elements whose max it kept right)
            hint = (f"the error sits on part of the elements (median abs error {a.p50:.3g}, "
                    f"mean {a.mean:.3g}): a max pool over the wrong window or axes, a row, "
                    "column or channel block computed wrong, or a wrong slice?")
        else:
            hint = (f"a missing bias (or one added after rounding to {dtype}, which drops it "
                    "when it is below half an ulp), an offset, or a truncating cast?")
        result.reasons.append(
            f"systematic error: mean(actual - expected) = {st.mean_error:.4g} "
            f"({mean_ulp:+.3g} ulp on average) exceeds +-{st.mean_error_limit:.3g}; {hint}")
    floor = float(ulp(absmax, dtype)) if absmax is not None and absmax == absmax else 0.0
    if callable(baseline) and not st.abs.max > k * floor:
        # The limit is k x max(baseline error, floor) >= k x floor, which the kernel's max
        # error already meets: the baseline cannot change the verdict, so it is not computed
        # (a B=1 224x224 conv2d baseline is a second conv in float32; issue 12: "only the
        # statistics a verdict/report uses"). Typical of 16-bit outputs (within an ulp).
        result.baseline_limit = k * floor
        baseline = None
    elif callable(baseline) and baseline_sample is not None:
        sample = baseline_sample()
        if sample is not None:
            values, index = sample
            part = expected[index]
            part_scale = scale
            if np.ndim(scale):
                part_scale = np.broadcast_to(np.asarray(scale), expected.shape)[index]
            if np.shape(values) != part.shape:
                raise ValueError(f"baseline sample shape {np.shape(values)} != golden "
                                 f"sample shape {part.shape}")
            sst = error_stats(values, part, dtype, tolerance, part_scale, full=False)
            lower = sst.abs.max if math.isfinite(sst.abs.max) else 0.0
            if st.abs.max <= k * max(lower, floor):
                result.baseline_stats, result.baseline_sampled = sst, True
                result.baseline_limit = k * max(lower, floor)
                baseline = None
        if baseline is not None:
            baseline = baseline()
    elif callable(baseline):
        baseline = baseline()
    if baseline is not None:
        baseline = np.asarray(baseline)
        if baseline.shape != expected.shape:
            raise ValueError(f"baseline shape {baseline.shape} != golden shape {expected.shape}")
        # the baseline check uses the baseline's max abs error alone (and its mismatch count
        # in the report): no distribution
        bst = result.baseline_stats = error_stats(baseline, expected, dtype, tolerance, scale,
                                                  full=False)
        result.baseline_limit = k * max(bst.abs.max if math.isfinite(bst.abs.max) else 0.0,
                                        floor)
        if st.abs.max > result.baseline_limit and result.tolerance.reduction_length:
            result.reasons.append(
                f"max abs error {st.abs.max:.4g} exceeds {k:g} x the fp32-accumulated "
                f"{dtype} baseline's ({bst.abs.max:.4g}, floored at 1 ulp at max|golden| = "
                f"{floor:.3g}): limit {result.baseline_limit:.4g}")
    result.passed = not result.reasons
    return result
