"""Golden models for the Part 2 kernel ``fused_conv2d_maxpool(X, W, bias, pool_size=1)``.

Shapes (spec §2): ``X`` is (B, C_in, H, W), ``W`` is (C_out, C_in, K, K), ``bias`` is (C_out,).
Stride 1, no padding, cross-correlation (no filter flip)::

    out[b, c, i, j] = sum_{ci, di, dj} X[b, ci, i + di, j + dj] * W[c, ci, di, dj] + bias[c]

followed by a max pool with window = stride = ``pool_size`` in floor mode, so the result is
(B, C_out, out_h // pool_size, out_w // pool_size) with out_h = H - K + 1, out_w = W - K + 1.
The course guarantees ``out_h % pool_size == 0``; we enforce it.

The convolution is one matmul per filter tap over C_in: for tap (di, dj) the rows
``X[b, :, di:di + out_h, :]`` are a (C_in, out_h * W) view (no copy), multiplied by the
(C_out, C_in) tap matrix, and the columns ``dj:dj + out_w`` of the product are accumulated.
That is K*K large GEMMs per image, so B=4, 256 -> 256 channels, 224x224, 3x3 takes seconds.
The float64 golden of a 3x3 filter uses Winograd's F(4x4, 3x3) instead (``_winograd3``):
36 GEMMs per 4x4 block of outputs instead of 144 (issue 12).
"""

import operator

import ml_dtypes  # noqa: F401  (registers bfloat16/float8 so np.dtype("bfloat16") works)
import numpy as np


def conv2d_reduction_length(C_in, K):
    """Number of products summed into one conv output element: ``C_in * K * K``."""
    return C_in * K * K


def _pool_size(pool_size):
    try:
        p = operator.index(pool_size)
    except TypeError:
        raise ValueError(f"pool_size must be a positive integer, got {pool_size!r}") from None
    if isinstance(pool_size, bool) or p < 1:
        raise ValueError(f"pool_size must be a positive integer, got {pool_size!r}")
    return p


def _check_shapes(X, W, bias, pool_size):
    """Validate the operands; return the pool size as an int."""
    if X.ndim != 4:
        raise ValueError(f"X must be 4-D (B, C_in, H, W), got shape {X.shape}")
    if W.ndim != 4:
        raise ValueError(f"W must be 4-D (C_out, C_in, K, K), got shape {W.shape}")
    if bias.ndim != 1:
        raise ValueError(f"bias must be 1-D (C_out,), got shape {bias.shape}")
    _, c_in, h, w = X.shape
    c_out, w_c_in, fh, fw = W.shape
    if w_c_in != c_in:
        raise ValueError(f"C_in mismatch: X has C_in={c_in} (shape {X.shape}), "
                         f"W has C_in={w_c_in} (shape {W.shape})")
    if fh != fw:
        raise ValueError(f"filter must be square (fh == fw), got fh={fh}, fw={fw}")
    if fh < 1 or fh > h or fw > w:
        raise ValueError(f"filter {fh}x{fw} does not fit the {h}x{w} image")
    if bias.shape[0] != c_out:
        raise ValueError(f"bias has {bias.shape[0]} entries but W has C_out={c_out}")
    p = _pool_size(pool_size)
    out_h, out_w = h - fh + 1, w - fw + 1
    if out_h % p != 0:
        raise ValueError(f"out_h = H - K + 1 = {out_h} is not divisible by pool_size={p}")
    if out_w < p:
        raise ValueError(f"pool_size={p} is larger than the conv output width out_w={out_w}")
    return p


def maxpool2d(y, pool_size):
    """Max pool over the last two axes, window = stride = ``pool_size``, floor mode."""
    p = _pool_size(pool_size)
    if p == 1:
        return y
    *lead, h, w = y.shape
    ph, pw = h // p, w // p
    windows = y[..., : ph * p, : pw * p].reshape(*lead, ph, p, pw, p)
    return windows.max(axis=(-3, -1))


def _matmul_in_order(a, b, out):
    """``a @ b`` into ``out`` with each output's products added one after another, in the
    order of the reduction index, every product and every partial sum rounded to ``out``'s
    dtype: the order of a systolic array's column (the Tensor Engine is a 128x128 systolic
    array, docs/nki-reference.md), whatever BLAS would do."""
    term = np.empty_like(out)
    np.multiply(a[:, :1], b[:1], out=out)
    for c in range(1, a.shape[1]):
        np.multiply(a[:, c : c + 1], b[c : c + 1], out=term)
        out += term
    return out


def _all_finite(*arrays):
    """Whether every element is finite: a float64 sum without a temporary array (any inf or
    NaN makes it non-finite; so can an overflow of huge finite values, which only costs the
    Winograd path)."""
    return all(np.isfinite(np.sum(a, dtype=np.float64)) for a in arrays)


def _conv2d(x, w, bias, acc_dtype, in_order=False):
    """Cross-correlation plus bias, every matmul and every sum carried out in ``acc_dtype``;
    ``in_order``: each tap's matmul sums over C_in in channel order (``_matmul_in_order``)."""
    # (K, K, C_out, C_in): each tap matrix is contiguous, so matmul does not copy it.
    if (not in_order and np.dtype(acc_dtype) == np.float64 and w.shape[2:] == (3, 3) and
            (x.shape[2] - 2) * (x.shape[3] - 2) >= WINOGRAD_MIN_OUTPUTS and
            _all_finite(x, w, bias)):
        return _winograd3(x, w, bias, acc_dtype)
    taps = np.ascontiguousarray(np.moveaxis(np.asarray(w, dtype=acc_dtype), (2, 3), (0, 1)))
    bias = np.asarray(bias, dtype=acc_dtype)
    batch, c_in, h, width = x.shape
    k, _, c_out, _ = taps.shape
    out_h, out_w = h - k + 1, width - k + 1
    out = np.empty((batch, c_out, out_h, out_w), dtype=acc_dtype)
    product = np.empty((c_out, out_h * width), dtype=acc_dtype)
    for b in range(batch):
        # one image at a time in acc_dtype: a float64 copy of a whole B=4 256x224x224 batch
        # would be 400 MB more at the peak
        xb = np.ascontiguousarray(x[b], dtype=acc_dtype)
        acc = out[b]
        acc[...] = 0
        for di in range(k):
            # Rows di .. di+out_h-1 of every channel, full width: a view, no copy.
            rows = xb[:, di : di + out_h, :].reshape(c_in, out_h * width)
            for dj in range(k):
                if in_order:
                    _matmul_in_order(taps[di, dj], rows, out=product)
                else:
                    np.matmul(taps[di, dj], rows, out=product)
                acc += product.reshape(c_out, out_h, width)[:, :, dj : dj + out_w]
        acc += bias[:, None, None]
    return out


# Winograd's minimal filtering F(4x4, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional
# Neural Networks", 2016, the points 0, +-1, +-2 and infinity): each 4x4 block of outputs is
# A^T [(G g G^T) * (B^T d B)] A for the 6x6 input tile d, so a 3x3 layer is 36 GEMMs over C_in
# on (out_h/4)(out_w/4) tiles instead of 9 on out_h*W columns: 4x fewer multiply-adds (F(2x2,
# 3x3), used before: 2.25x). Its transforms scale by up to 8 and 1/24, so in float64 the result
# differs from the direct sum by about 1e-14 of the summed magnitudes (measured on N(0, 1)
# inputs, 256 -> 256 channels, 64x64: at most 4.2e-15 of the sum of |terms|, 6.2e-12 absolute
# on outputs up to 237), against the 3e-8 half ulp of the fp32 outputs it judges. Used for
# the float64 golden of finite inputs only: the float32 models keep the direct taps (the
# baseline is what fp32 hardware accumulation does), and so do inputs with an inf or a NaN
# (the transforms' differences would turn an inf into NaN where the direct sum keeps it).
#
# Both transforms are one GEMM each over a whole batch of tiles: B^T d B of every tile is the
# 36x36 Kronecker matrix B^T (x) B^T times the tile's 36 values, A^T m A the 16x36 matrix
# A^T (x) A^T times its 36 products. The dense matrices multiply by their zeros too, but a GEMM
# reads its operand once where the separable transform (2 x 6 small combinations of rows, then
# of columns, one NumPy pass each) read it about a hundred times; the transforms are
# memory-bound, the GEMM is not. Measured 2026-11-28 on the 2-core AVX-512 machine, one
# 256 -> 256 224x224 image in float64, alternating runs: 0.61-0.74 s against 0.87-1.05 s for
# the separable transforms (issue 12: the golden of the B=4 fp32 case is as long as its
# simulation). Of the 0.61 s, 0.28 s are the 36 GEMMs over C_in.
WINOGRAD_TILE_ROWS = 8       # tile rows per GEMM batch: 33 MB of float64 transforms at C=256
# Below this many outputs per image the direct taps are faster (fixed costs: the filter
# transform, the buffers); measured with F(2x2, 3x3), 256 channels: 30x14 outputs 0.09 s
# Winograd against 0.08 s direct, 62x62 0.26 against 0.29-0.32, 110x110 0.42 against 0.45.
WINOGRAD_MIN_OUTPUTS = 2048

_BT4 = np.array([[4, 0, -5, 0, 1, 0],
                 [0, -4, -4, 1, 1, 0],
                 [0, 4, -4, -1, 1, 0],
                 [0, -2, -1, 2, 1, 0],
                 [0, 2, -1, -2, 1, 0],
                 [0, 4, 0, -5, 0, 1]], dtype=np.float64)
_G4 = np.array([[1 / 4, 0, 0],
                [-1 / 6, -1 / 6, -1 / 6],
                [-1 / 6, 1 / 6, -1 / 6],
                [1 / 24, 1 / 12, 1 / 6],
                [1 / 24, -1 / 12, 1 / 6],
                [0, 0, 1]], dtype=np.float64)
_AT4 = np.array([[1, 1, 1, 1, 1, 0],
                 [0, 1, -1, 2, -2, 0],
                 [0, 1, 1, 4, 4, 0],
                 [0, 1, -1, 8, -8, 1]], dtype=np.float64)
# row a*6 + c of _BT36 makes V[a, c] from the tile's d[i, j] at column i*6 + j; row i*4 + j of
# _AT16 makes Y[i, j] from M[a, c] at column a*6 + c
_BT36 = np.kron(_BT4, _BT4)
_AT16 = np.kron(_AT4, _AT4)


def _winograd3(x, w, bias, acc_dtype=np.float64, tile_rows=WINOGRAD_TILE_ROWS):
    """Cross-correlation with a 3x3 filter plus bias by Winograd F(4x4, 3x3), in ``acc_dtype``.

    Output blocks of 4x4 from input tiles of 6x6 at stride 4 (the input is zero-padded to
    whole tiles and the extra outputs dropped). All buffers are allocated once. A batch of
    ``tile_rows`` tile rows is (C, n tile rows, tw + 1 tile columns): the extra column (a tile
    across the end of the row, read from the zero padding) makes every gathered tile value one
    3-D copy and is dropped with the padding."""
    taps = np.asarray(w, dtype=acc_dtype)
    c_out, c_in = taps.shape[:2]
    # U = G g G^T per (C_out, C_in) filter, as (36, C_out, C_in): 36 GEMM matrices
    U = np.ascontiguousarray(np.einsum("ak,oikl,bl->aboi", _G4, taps, _G4))
    U = U.reshape(36, c_out, c_in)
    bt36, at16 = _BT36.astype(acc_dtype), _AT16.astype(acc_dtype)
    bias = np.asarray(bias, dtype=acc_dtype)
    batch, _, h, width = x.shape
    out_h, out_w = h - 2, width - 2
    th, tw = -(-out_h // 4), -(-out_w // 4)
    tw1 = tw + 1
    nr = min(tile_rows, th)
    out = np.empty((batch, c_out, out_h, out_w), dtype=acc_dtype)
    # the 16 phases of a batch's input rows (row 4(t0 + s) + r, column 4t + p is phase (r, p),
    # index (s, t)), contiguous and zero-padded to whole tiles plus the extra column; the
    # columns past the image stay zero, rows past it are zeroed where a batch ends early
    xph = np.zeros((4, 4, c_in, nr + 1, tw1 + 1), dtype=acc_dtype)
    d_buf = np.empty((36, c_in, nr, tw1), dtype=acc_dtype)       # tile value i*6 + j
    v_buf = np.empty((36, c_in * nr * tw1), dtype=acc_dtype)
    m_buf = np.empty((36, c_out * nr * tw1), dtype=acc_dtype)
    y_buf = np.empty((16, c_out * nr * tw1), dtype=acc_dtype)    # row i*4 + j of the block
    for b in range(batch):
        for t0 in range(0, th, nr):
            n = min(th, t0 + nr) - t0
            cols = n * tw1
            for r in range(4):
                for p in range(4):
                    ph = x[b][:, 4 * t0 + r: 4 * (t0 + n + 1) + r: 4, p::4]
                    xph[r, p, :, : ph.shape[1], : ph.shape[2]] = ph
                    xph[r, p, :, ph.shape[1]:] = 0
            d = d_buf[:, :, :n]
            for i in range(6):
                for j in range(6):
                    # input row 4(t0 + s) + i is row phase i % 4, index s + i // 4; input
                    # column 4t + j likewise
                    d[i * 6 + j] = xph[i % 4, j % 4, :, i // 4: i // 4 + n, j // 4: j // 4 + tw1]
            v = v_buf[:, : c_in * cols]
            np.matmul(bt36, d.reshape(36, c_in * cols), out=v)
            m = m_buf[:, : c_out * cols]
            for k in range(36):
                np.matmul(U[k], v[k].reshape(c_in, cols), out=m[k].reshape(c_out, cols))
            y = y_buf[:, : c_out * cols]
            np.matmul(at16, m, out=y)
            r0, r1 = 4 * t0, min(out_h, 4 * (t0 + n))
            for i in range(4):
                nrows = len(range(r0 + i, r1, 4))
                for j in range(4):
                    ncols = (out_w - j + 3) // 4
                    if nrows and ncols:
                        yij = y[i * 4 + j].reshape(c_out, n, tw1)
                        np.add(yij[:, :nrows, :ncols], bias[:, None, None],
                               out=out[b, :, r0 + i: r1: 4, j::4])
    return out


def golden_dtype(*arrays):
    """The precision the golden model needs for inputs of these dtypes: float32 when every
    input is a float of at most 16 bits (float16, bfloat16, float8), else float64.

    Why float32 suffices there: a product of two floats of at most 16 bits has at most
    2*11 = 22 significant bits, so it is exact in float32 (24 bits); only the sums round. Each
    tap's GEMM sums C_in products and the K*K taps are then added, so the golden's error is at
    most about (C_in + K*K) * 2**-24 of the sum of |terms| (256 channels, 3x3: 1.6e-5) and
    typically sqrt(C_in + K*K) * 2**-24 (1e-6), with zero mean. Such outputs are allowed half an
    ulp of float16 (2**-11 = 4.9e-4 of |y|) or coarser plus ``4*sqrt(K)*2**-24`` (1.1e-5) of
    the sum of |terms| (``nkiverify.compare.tolerance_for``): the golden's typical error is a
    few percent of that. fp32 outputs need float64: their half ulp (3e-8 of |y|) is below a
    float32 sum's error. (The float32 golden is about 2x faster and half the memory.)
    """
    for a in arrays:
        dt = np.dtype(a.dtype)
        if dt.kind not in "fV" or dt.itemsize > 2:
            return np.dtype(np.float64)
    return np.dtype(np.float32)


def _precision(dtype, X, W, bias):
    if dtype is None:
        return np.dtype(np.float64)
    if dtype == "auto":
        return golden_dtype(X, W, bias)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype must be float64, float32 or 'auto', got {dtype}")
    return dtype


def conv2d_maxpool(X, W, bias, pool_size=1, dtype=None, conv=None):
    """Exact conv2d + bias + max pool, in float64, from the given (already rounded) inputs.

    Accepts any float input dtype (float32, float16, ``ml_dtypes.bfloat16``, ...); products of
    two inputs of at most fp32 precision are exact in float64, and the float64 sum's error
    (about K * 2**-53 relative; a 3x3 filter's Winograd form, a few times that) is far below
    any output dtype's resolution.
    Returns float64 of shape (B, C_out, out_h // pool_size, out_w // pool_size).
    ``dtype="auto"`` computes in ``golden_dtype(X, W, bias)`` instead (float32 for 16-bit
    inputs, which is accurate enough to judge 16-bit outputs), and returns that dtype.
    ``conv``: ``conv2d(X, W, bias, dtype=dtype)`` computed before (cases that differ only in
    the pool size share it): only the pool is applied (the shapes are still checked).
    """
    X, W, bias = np.asarray(X), np.asarray(W), np.asarray(bias)
    p = _check_shapes(X, W, bias, pool_size)
    if conv is None:
        conv = _conv2d(X, W, bias, _precision(dtype, X, W, bias))
    return maxpool2d(conv, p)


def conv2d(X, W, bias, pool_size=1, dtype=None):
    """The convolution plus bias that ``conv2d_maxpool`` max-pools (its ``conv=``; the pool
    size is validated against the output as there). ``dtype`` as for ``conv2d_maxpool``;
    returns (B, C_out, out_h, out_w) in that precision."""
    X, W, bias = np.asarray(X), np.asarray(W), np.asarray(bias)
    _check_shapes(X, W, bias, pool_size)
    return _conv2d(X, W, bias, _precision(dtype, X, W, bias))


def conv2d_maxpool_scale(X, W, bias, pool_size=1, dtype=None):
    """Magnitude of the terms summed into each output: the exact model on ``|X|, |W|, |bias|``.

    Each conv element becomes ``sum |x * w| + |bias|``; the max pool of those bounds the value
    for whichever window element the kernel's max selects. This is the ``scale`` that
    ``nkiverify.compare`` uses for the fp32 accumulation error, which grows with the sum of
    magnitudes, not with the (possibly cancelled) result. ``dtype`` as for ``conv2d_maxpool``.
    """
    X, W, bias = np.asarray(X), np.asarray(W), np.asarray(bias)
    p = _check_shapes(X, W, bias, pool_size)
    return maxpool2d(_conv2d(np.abs(X), np.abs(W), np.abs(bias),
                             _precision(dtype, X, W, bias)), p)


# Up to this many multiply-adds (B * C_out * out_h * W * C_in * K * K) the baseline sums each
# tap's products in channel order, as the PE array does; above it BLAS's sgemm stands in.
# Why (measured 2026-11-28 on a Xeon with AVX-512, numpy 2.4.6's OpenBLAS 0.3.31): for small
# matrices OpenBLAS takes kernels whose summation order depends on the operands' layout: the
# (128 x 128) @ (128 x 2) product of a 1x1 conv had a max error of 1 fp32 ulp against 4 ulp for
# the same product with the weights transposed (nkisim's nc_matmul) and for the in-order sum.
# A baseline that lucky made the shipped kernels fail the 4x baseline check on 24 of 3,000
# drawn fp32 runs (1x1 filters, small outputs; benchmarks/false_alarms.py); in order, 0.
# For wide GEMMs (N = 500 columns) BLAS's max error is within 10% of the in-order sum's, so the
# stand-in changes nothing there. 2**24 multiply-adds take about 20 ms in this loop.
IN_ORDER_MAX_WORK = 1 << 24


def conv2d_maxpool_baseline(X, W, bias, pool_size=1, dtype=None):
    """conv2d + bias + max pool as correct hardware computes it.

    Inputs are rounded to ``dtype`` (default: ``X.dtype``; round-to-nearest-even), then each
    tap's matmul runs in float32, its products summed in channel order as the PE array's
    columns do (BLAS's order on large convolutions: ``IN_ORDER_MAX_WORK``), and the taps are
    summed in float32, as fp32 PSUM accumulation does; the bias is added in float32; the
    pooled result is rounded to ``dtype``. The PE array multiplies in at most fp32, so float64
    inputs are rounded to float32 for the matmuls. Returns an array of ``dtype``.
    """
    X, W, bias = np.asarray(X), np.asarray(W), np.asarray(bias)
    p = _check_shapes(X, W, bias, pool_size)
    dtype = np.dtype(X.dtype if dtype is None else dtype)
    # no copies when the inputs already are float32 (the B=4 fp32 input is 200 MB)
    x, w, b = (a.astype(dtype, copy=False).astype(np.float32, copy=False) for a in (X, W, bias))
    batch, c_in, h, width = X.shape
    c_out, _, k, _ = W.shape
    in_order = batch * c_out * (h - k + 1) * width * c_in * k * k <= IN_ORDER_MAX_WORK
    return maxpool2d(_conv2d(x, w, b, np.float32, in_order=in_order), p).astype(dtype)
