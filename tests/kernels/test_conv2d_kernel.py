"""kernels.conv2d.fused_conv2d_maxpool on nkisim against an independent float64 NumPy golden.

Covers the course harness's configurations (cs149 §2), what the harness leaves out (small images
with bias and pool, C_out != C_in, C = 384, other filter sizes, odd heights, pool 3, batch 1,
float16/bfloat16, signed data), the kernel's internal paths (band pairs and remainder bands, PSUM
tile pairs and tails, wide images whose pool windows span PSUM tiles), one large 224x224 image
(slow), and the ValueError preconditions.
"""

import nkisim.shim

nkisim.shim.install()

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kernels import conv2d as conv_module  # noqa: E402
from kernels import conv2d_common  # noqa: E402
from kernels.conv2d import fused_conv2d_maxpool  # noqa: E402

# tests without a dtype parameter run float32 inputs (for --nki-dtypes / tox -e fp16)
pytestmark = [pytest.mark.simulate, pytest.mark.shipped_kernel("conv2d"),
              pytest.mark.nki_dtype("float32")]

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16}
U_FP32 = 2.0 ** -24          # unit roundoff of the fp32 PSUM accumulator


# --- golden -----------------------------------------------------------------------------------

def golden(X, W, bias, pool):
    """float64 cross-correlation + bias + max pool (floor mode): one tensordot per filter tap."""
    x = np.asarray(X, dtype=np.float64)
    w = np.asarray(W, dtype=np.float64)
    k = w.shape[2]
    oh, ow = x.shape[2] - k + 1, x.shape[3] - k + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for di in range(k):
        for dj in range(k):
            # (C_out, C_in) . (B, C_in, oh, ow) over C_in -> (C_out, B, oh, ow)
            out += np.tensordot(w[:, :, di, dj], x[:, :, di:di + oh, dj:dj + ow],
                                axes=([1], [1])).transpose(1, 0, 2, 3)
    out += np.asarray(bias, dtype=np.float64)[None, :, None, None]
    ph, pw = oh // pool, ow // pool
    out = out[:, :, :ph * pool, :pw * pool]
    return out.reshape(out.shape[0], out.shape[1], ph, pool, pw, pool).max(axis=(3, 5))


def tolerance(dtype, reduction_length, scale):
    """Absolute error bound for one output element, ``scale`` = max |golden|.

    - The output is rounded once to ``dtype``: <= eps/2 * |y|. Inputs are generated in ``dtype``
      and the golden uses exactly those values, so input rounding is not an error here; 16-bit
      products are exact in fp32. We allow 4 eps * scale: 8x the final rounding, so only errors
      beyond it (a wrong accumulation dtype, a lost tap, a bad pool) fail.
    - PSUM accumulates n = C_in*K*K (+ bias) terms in fp32; each partial sum is rounded by at most
      u * |partial| <= u * scale (u = 2^-24), and the n roundings are independent and zero-mean,
      so the sum's error has a standard deviation below sqrt(n) * u * scale / sqrt(3); 4 sqrt(n)
      u * scale is over 6 sigma. (This is the course's own margin: rtol 1e-5 at n = 2304 is
      3.5 sqrt(n) u.) It matters for float32, where eps is u's size.
    """
    eps = float(ml_dtypes.finfo(dtype).eps)
    return 4.0 * eps * scale + 4.0 * np.sqrt(reduction_length + 1) * U_FP32 * scale


def make_inputs(B, c_in, c_out, h, w, k, dtype="float32", bias=True, dist="uniform", seed=0):
    """The harness's data (uniform [0, 1)) or signed normal data, generated in ``dtype``."""
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]
    if dist == "uniform":
        X = rng.random((B, c_in, h, w), dtype=np.float32)
        W = rng.random((c_out, c_in, k, k), dtype=np.float32)
        b = rng.random(c_out, dtype=np.float32) if bias else np.zeros(c_out, np.float32)
    else:
        X = rng.standard_normal((B, c_in, h, w), dtype=np.float32)
        W = rng.standard_normal((c_out, c_in, k, k), dtype=np.float32)
        b = rng.standard_normal(c_out, dtype=np.float32) * 4 if bias else \
            np.zeros(c_out, np.float32)
    return X.astype(dt), W.astype(dt), b.astype(dt)


def check(X, W, bias, pool):
    """Run the kernel and compare with the golden; return (out, golden)."""
    out = fused_conv2d_maxpool(X, W, bias, pool_size=pool)
    ref = golden(X, W, bias, pool)
    assert out.shape == ref.shape
    assert out.dtype == X.dtype
    got = out.astype(np.float64)
    assert np.all(np.isfinite(got)), "the kernel left non-finite values in its output"
    scale = float(np.abs(ref).max())
    tol = tolerance(X.dtype, W.shape[1] * W.shape[2] * W.shape[3], scale)
    err = np.abs(got - ref)
    worst = np.unravel_index(int(np.argmax(err)), err.shape)
    assert err.max() <= tol, (f"max |error| {err.max():.3g} at {worst} (got {got[worst]:.6g}, "
                              f"want {ref[worst]:.6g}) exceeds {tol:.3g} "
                              f"(max |golden| {scale:.4g})")
    return out, ref


# --- the course harness's correctness configurations (cs149 §2) ------------------------------

@pytest.mark.parametrize("c_in,c_out", [(128, 128), (128, 256), (256, 128), (256, 256)])
def test_course_small_images(c_in, c_out):
    """B=4, 32x16, K=3, zero bias, no pool; also the harness's own criterion, np.allclose."""
    X, W, b = make_inputs(4, c_in, c_out, 32, 16, 3, bias=False)
    out, ref = check(X, W, b, 1)
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("pool", [1, 2])
@pytest.mark.parametrize("c_in,c_out", [(128, 256), (256, 256)])
def test_small_images_bias_and_pool(c_in, c_out, pool):
    X, W, b = make_inputs(4, c_in, c_out, 32, 16, 3)
    out, ref = check(X, W, b, pool)
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-8)


# --- shapes the harness does not try -----------------------------------------------------------

@pytest.mark.parametrize("c_in,c_out", [(384, 128), (128, 384), (384, 256)])
def test_channels_384_and_unequal(c_in, c_out):
    """Odd numbers of channel tiles on both sides (the weight staging handles an unpaired tile)."""
    X, W, b = make_inputs(2, c_in, c_out, 12, 10, 3)
    check(X, W, b, 2)


@pytest.mark.parametrize("k,h,w,pool", [(1, 9, 7, 1), (1, 8, 9, 2), (2, 20, 17, 1), (2, 21, 13, 2),
                                        (5, 14, 12, 1), (5, 16, 20, 2)])
def test_filter_sizes(k, h, w, pool):
    X, W, b = make_inputs(2, 128, 128, h, w, k)
    check(X, W, b, pool)


def test_odd_output_height_no_pool():
    """out 19x17: PSUM tiles of 30 rows cannot be used, the last tile is short."""
    X, W, b = make_inputs(2, 128, 256, 21, 19, 3)
    check(X, W, b, 1)


@pytest.mark.parametrize("h,w", [(20, 16), (32, 16)])
def test_pool_3(h, w):
    """out_h 18 / 30 divisible by 3, out_w 14 is not: the last 2 columns are dropped."""
    X, W, b = make_inputs(2, 128, 128, h, w, 3, dist="normal")
    check(X, W, b, 3)


@pytest.mark.parametrize("pool", [1, 2])
def test_batch_1(pool):
    X, W, b = make_inputs(1, 256, 256, 32, 16, 3)
    check(X, W, b, pool)


@pytest.mark.parametrize("pool", [1, 2])
def test_signed_data(pool):
    """Negative values: a max pool that starts from 0, or a bias added to the wrong channel or
    twice, shows up here (uniform [0, 1) data hides both)."""
    X, W, b = make_inputs(2, 256, 128, 18, 14, 3, dist="normal", seed=3)
    check(X, W, b, pool)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("pool", [1, 2])
def test_16bit(dtype, pool):
    X, W, b = make_inputs(2, 256, 256, 32, 16, 3, dtype=dtype)
    check(X, W, b, pool)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_signed_pool_3(dtype):
    X, W, b = make_inputs(1, 128, 256, 17, 21, 3, dtype=dtype, dist="normal", seed=5)
    check(X, W, b, 3)


@pytest.mark.nki_dtype("float16")
def test_16bit_accumulates_in_fp32():
    """With 2304 products of ~0.25 per output, fp16 partial sums would be rounded in steps of
    0.25-0.5 (eps 2^-10 at 256-512); accumulating in fp32 keeps the error to the final rounding
    alone: at most half a float16 ulp of the result (checked far tighter than ``tolerance``)."""
    X, W, b = make_inputs(1, 256, 128, 10, 10, 3, dtype="float16", bias=False)
    out = fused_conv2d_maxpool(X, W, b, pool_size=1)
    ref = golden(X, W, b, 1)
    half_ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64) / 2
    # 1e-3 relative slack for the fp32 accumulation itself, far below one fp16 ulp
    assert np.all(np.abs(out.astype(np.float64) - ref) <= half_ulp * 1.001 + 1e-3)


def test_harness_style_baremetal_call():
    """The harness wraps the kernel in nki.baremetal and passes pool_size by keyword."""
    from neuronxcc import nki
    X, W, b = make_inputs(1, 128, 128, 12, 10, 3)
    out = nki.baremetal(fused_conv2d_maxpool)(X, W, b, pool_size=2)
    np.testing.assert_allclose(out, golden(X, W, b, 2), rtol=1e-5)


# --- the kernel's internal paths ----------------------------------------------------------------

def _band_plan(X, W, pool):
    """The kernel's (rows per PSUM tile, rows per band) for these operands (bias in X's dtype)."""
    return conv2d_common._schedule(X, W, np.zeros(W.shape[0], X.dtype), pool)[:2]


@pytest.mark.parametrize("h,w,pool", [(48, 132, 1), (64, 106, 2)])
def test_band_pairs_remainders_and_tile_tails(h, w, pool):
    """A pair of full bands, then both remainder bands; each full band has an odd number of
    PSUM tiles (pairs plus a third) and the last remainder band ends with a short tile."""
    X, W, b = make_inputs(1, 128, 128, h, w, 3, dist="normal", seed=7)
    rows, band = _band_plan(X, W, pool)
    out_h = h - 2
    n_pairs = out_h // (2 * band)
    rest = out_h - 2 * band * n_pairs
    # the shape still exercises those paths (if the planner changes, pick another shape)
    assert n_pairs >= 1 and band < rest < 2 * band, (rows, band, rest)
    assert (band // rows) % 2 == 1 and (rest - band) % rows, (rows, band, rest)
    check(X, W, b, pool)


@pytest.mark.parametrize("w,pool", [(300, 2), (514, 1), (400, 3)])
def test_wide_images(w, pool):
    """out_w up to the 512-column limit; with a pool, one PSUM tile holds fewer rows than a pool
    window, so windows span tiles (and pool 3 drops columns)."""
    h = 3 * pool + 2
    X, W, b = make_inputs(1, 128, 128, h, w, 3, dist="normal", seed=11)
    check(X, W, b, pool)


def test_batches_do_not_mix():
    """Each image of a batch gets its own result (a batch-index bug copies image 0)."""
    X, W, b = make_inputs(3, 128, 128, 10, 9, 3)
    X[1] *= 2
    X[2] = 0
    out, ref = check(X, W, b, 1)
    np.testing.assert_allclose(out[2], np.broadcast_to(b[:, None, None], out[2].shape))


# --- the large image (cs149 §2 correctness tests 2-4 use B=4; one B=1 image here) -----------------

@pytest.mark.parametrize("channels", [
    128,       # the 224x224 image path (every band, full width) at a quarter of the work
    pytest.param(256, marks=pytest.mark.slow)])
def test_large_image_224(channels):
    X, W, b = make_inputs(1, channels, channels, 224, 224, 3, seed=1)
    out, ref = check(X, W, b, 1)
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-8)


# --- preconditions --------------------------------------------------------------------------------

def _arrays(B=1, c_in=128, c_out=128, h=8, w=8, kh=3, kw=3, n_bias=None, dtype=np.float32):
    return (np.zeros((B, c_in, h, w), dtype), np.zeros((c_out, c_in, kh, kw), dtype),
            np.zeros(c_out if n_bias is None else n_bias, dtype))


@pytest.mark.parametrize("args,pool,match", [
    (dict(c_in=192), 1, "C_in must be a multiple of 128"),
    (dict(c_out=200), 1, "C_out must be a multiple of 128"),
    (dict(kh=3, kw=2), 1, "must be square"),
    (dict(w=515), 1, "output width .* exceeds 512"),
    (dict(h=9), 2, "not divisible by pool_size=2"),
    (dict(h=8), 4, "not divisible by pool_size=4"),
    (dict(h=2), 1, "does not fit"),
    (dict(n_bias=64), 1, "bias must have shape"),
    (dict(), 0, "pool_size must be a positive int"),
    (dict(h=11, w=4), 3, "exceeds the output width"),
])
def test_preconditions(args, pool, match):
    X, W, b = _arrays(**args)
    with pytest.raises(ValueError, match=match):
        fused_conv2d_maxpool(X, W, b, pool_size=pool)


def test_c_in_mismatch():
    X = np.zeros((1, 256, 8, 8), np.float32)
    W = np.zeros((128, 128, 3, 3), np.float32)
    with pytest.raises(ValueError, match="C_in mismatch"):
        fused_conv2d_maxpool(X, W, np.zeros(128, np.float32))


def test_weights_too_big_for_sbuf():
    """1024 -> 1024 channels, 3x3, fp32: W^T alone is 288 KiB per partition."""
    X, W, b = _arrays(c_in=1024, c_out=1024, h=5, w=5)
    with pytest.raises(ValueError, match="weights do not fit in SBUF"):
        fused_conv2d_maxpool(X, W, b)


def test_big_weights_shrink_the_bands():
    """1024 -> 256, 3x3, fp32: W^T is 72 KiB per partition (plus 72 KiB of staging while it is
    transposed), so the SBUF budget, not the DMA-size target, sets the band height."""
    X, W, b = make_inputs(1, 1024, 256, 10, 200, 3, dist="normal", seed=13)
    rows, band = _band_plan(X, W, 1)
    target_rows = conv_module.BAND_BYTES // (200 * 4) - 2
    assert band < target_rows and band < X.shape[2] - 2, (rows, band, target_rows)
    check(X, W, b, 1)
