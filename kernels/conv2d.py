"""Fused conv2d + bias + max pool (CS149 Assignment 4, Part 2), as real ``neuronxcc.nki`` code.

``fused_conv2d_maxpool(X, W, bias, pool_size=1)``: X (B, C_in, H, W), W (C_out, C_in, K, K),
bias (C_out,); stride 1, no padding, cross-correlation; bias per output channel; max pool with
window = stride = ``pool_size`` (floor mode in width, ``out_h % pool_size == 0`` required). The
result is (B, C_out, out_h // pool, out_w // pool) in X's dtype; products accumulate in fp32 PSUM.

Algorithm (the handout's hint): for each filter tap (di, dj)

    out[co, i, j] += sum_ci W[co, ci, di, dj] * X[ci, i + di, j + dj]

is a matmul contracting over C_in on the partition dim: stationary = W^T[ci_tile, tap, co_tile]
(128 x 128), moving = a shifted window of the input rows, the 3-D slice x[ci_tile, r + di : r + di
+ R, dj : dj + out_w] (R output rows at once, R * out_w <= 512). All K*K*C_in/128 matmuls of one
(co_tile, R rows) output tile accumulate in one PSUM bank, which is then evacuated once.

- Weights: each co_tile block W[co_tile] is loaded naturally ((128, C_in*K*K), contiguous per
  partition; two blocks in flight), its 128x128 (co, ci) blocks are transposed on the Tensor
  Engine into PSUM (several taps per bank, two banks alternating) and copied to SBUF in the
  compute dtype, once. All transposed weights stay resident (256x256x3x3 fp32 is 18 KiB per
  partition); the bias becomes a (128, C_out/128) fp32 tile of per-partition columns.
- Input: streamed in row bands of ``band`` output rows (``band + K - 1`` input rows for every
  C_in tile, one DMA of ~8 KiB per partition per C_in tile; ``_plan`` sizes the bands to the
  SBUF left after the weights). Band tiles are allocated at two sites used alternately (an
  unrolled pair of bands per loop iteration), so the next band's load overlaps the current
  band's matmuls; the output staging of a band is double-buffered the same way, so stores
  overlap too. Leftover rows form up to two shorter bands.
- PSUM: output tiles alternate between two PSUM allocation sites (an unrolled pair of row groups
  per iteration, then up to two leftover tiles at their own sites): the Tensor Engine fills one
  bank while the other is evacuated. Without pooling
  the evacuation is one ``tensor_scalar`` (PSUM + bias -> SBUF in the output dtype), alternating
  between the Vector and Scalar engines.
- Pooling (only the pw * p columns that survive the floor are computed): each PSUM tile's column
  windows are max-reduced straight from PSUM into an fp32 band buffer (``tensor_reduce`` over a
  (128, R, pw, p) view), so windows may span PSUM tiles; after the band, rows are pooled by
  ``tensor_tensor`` maxima of the p row slices and the bias is added on the Scalar engine (a
  per-channel bias commutes with the max).
"""

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from nkiverify.kernels.conv2d_common import (  # noqa: F401  (shared with conv2d_nki.py)
    BAND_BYTES,
    PMAX,
    PSUM_BANK_BYTES,
    PSUM_FMAX,
    _check_args,
    _schedule,
)


@nki.compiler.skip_middle_end_transformations
@nki.jit
def fused_conv2d_maxpool(X, W, bias, pool_size=1):
    _check_args(X, W, bias, pool_size)
    batch, c_in, in_h, in_w = X.shape
    c_out, _, k, _ = W.shape
    pool = pool_size
    out_h, out_w = in_h - k + 1, in_w - k + 1
    ph, pw = out_h // pool, out_w // pool
    n_ci, n_co = c_in // PMAX, c_out // PMAX

    X_out = nl.ndarray((batch, c_out, ph, pw), dtype=X.dtype, buffer=nl.hbm)

    rows, band, n_pairs, rest_c, rest_d = _schedule(X, W, bias, pool)

    bias_sb = _load_bias(bias, n_co)
    wT = _load_weights(W, X.dtype, n_ci, n_co, k)

    # the pairs of full bands, then the shorter bands of the remaining rows (_schedule)
    pband = band // pool
    for b in nl.affine_range(batch):
        if n_pairs:
            for bp in nl.affine_range(n_pairs):
                x_a = nl.ndarray((PMAX, n_ci, band + k - 1, in_w), dtype=X.dtype,
                                 buffer=nl.sbuf)
                o_a = nl.ndarray((PMAX, n_co, pband, pw), dtype=X.dtype, buffer=nl.sbuf)
                _conv_band(X, X_out, wT, bias_sb, x_a, o_a, b, 2 * bp * band, 2 * bp * pband,
                           rows, pool, k)
                x_b = nl.ndarray((PMAX, n_ci, band + k - 1, in_w), dtype=X.dtype,
                                 buffer=nl.sbuf)
                o_b = nl.ndarray((PMAX, n_co, pband, pw), dtype=X.dtype, buffer=nl.sbuf)
                _conv_band(X, X_out, wT, bias_sb, x_b, o_b, b, (2 * bp + 1) * band,
                           (2 * bp + 1) * pband, rows, pool, k)
        if rest_c:
            row0 = 2 * band * n_pairs
            x_c = nl.ndarray((PMAX, n_ci, rest_c + k - 1, in_w), dtype=X.dtype, buffer=nl.sbuf)
            o_c = nl.ndarray((PMAX, n_co, rest_c // pool, pw), dtype=X.dtype, buffer=nl.sbuf)
            _conv_band(X, X_out, wT, bias_sb, x_c, o_c, b, row0, row0 // pool, rows, pool, k)
        if rest_d:
            row0 = 2 * band * n_pairs + rest_c
            x_d = nl.ndarray((PMAX, n_ci, rest_d + k - 1, in_w), dtype=X.dtype, buffer=nl.sbuf)
            o_d = nl.ndarray((PMAX, n_co, rest_d // pool, pw), dtype=X.dtype, buffer=nl.sbuf)
            _conv_band(X, X_out, wT, bias_sb, x_d, o_d, b, row0, row0 // pool, rows, pool, k)
    return X_out


def _load_bias(bias, n_co):
    """bias (C_out,) -> SBUF (128, n_co) fp32: column t holds channels t*128 .. t*128+127."""
    raw = nl.ndarray((PMAX, n_co), dtype=bias.dtype, buffer=nl.sbuf)
    for co in nl.affine_range(n_co):
        nisa.dma_copy(src=bias[co * PMAX:(co + 1) * PMAX], dst=raw[:, co:co + 1])
    bias_sb = nl.ndarray((PMAX, n_co), dtype=nl.float32, buffer=nl.sbuf)
    bias_sb[...] = nisa.tensor_copy(raw, dtype=nl.float32)
    return bias_sb


def _load_weights(W, dtype, n_ci, n_co, k):
    """W (C_out, C_in, K, K) -> SBUF wT (128 ci, n_ci, taps, C_out) in ``dtype``:
    wT[p, t, tap, co] = W[co, t*128 + p, tap // K, tap % K].

    C_out tiles are staged two at a time (two allocation sites, so both loads are in flight
    together) and their transposes interleave, so consecutive transposes alternate between two
    PSUM tiles and the Tensor Engine does not wait for each PSUM -> SBUF copy.
    """
    c_out, c_in = W.shape[0], W.shape[1]
    taps = k * k
    w_flat = W.reshape((c_out, c_in, taps))
    wT = nl.ndarray((PMAX, n_ci, taps, c_out), dtype=dtype, buffer=nl.sbuf)
    if n_co >= 2:
        for cp in nl.affine_range(n_co // 2):
            w_a = nl.ndarray((PMAX, c_in, taps), dtype=W.dtype, buffer=nl.sbuf)
            nisa.dma_copy(src=w_flat[2 * cp * PMAX:(2 * cp + 1) * PMAX, :, :], dst=w_a)
            w_b = nl.ndarray((PMAX, c_in, taps), dtype=W.dtype, buffer=nl.sbuf)
            nisa.dma_copy(src=w_flat[(2 * cp + 1) * PMAX:(2 * cp + 2) * PMAX, :, :], dst=w_b)
            _transpose_weights(w_a, w_b, wT, 2 * cp, n_ci, k)
    if n_co % 2:
        w_c = nl.ndarray((PMAX, c_in, taps), dtype=W.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=w_flat[(n_co - 1) * PMAX:n_co * PMAX, :, :], dst=w_c)
        _transpose_weights(w_c, None, wT, n_co - 1, n_ci, k)
    return wT


def _transpose_weights(w_a, w_b, wT, co, n_ci, k):
    """Transpose the (co, ci) 128x128 blocks of staged C_out tile(s) co (and co + 1 from w_b)
    into wT, ``tg`` taps (all K*K, one filter row of K, or 1) per PSUM bank."""
    taps = k * k
    tg = taps if taps * PMAX * w_a.itemsize <= PSUM_BANK_BYTES else (
        k if k * PMAX * w_a.itemsize <= PSUM_BANK_BYTES else 1)
    for ci in nl.affine_range(n_ci):
        for g in nl.affine_range(taps // tg):
            pa = nl.ndarray((PMAX, tg, PMAX), dtype=w_a.dtype, buffer=nl.psum)
            for t in nl.affine_range(tg):
                pa[:, t, :] = nisa.nc_transpose(w_a[:, ci * PMAX:(ci + 1) * PMAX, g * tg + t])
            wT[:, ci, g * tg:(g + 1) * tg, co * PMAX:(co + 1) * PMAX] = nisa.tensor_copy(
                pa, dtype=wT.dtype)
            if w_b is not None:
                pb = nl.ndarray((PMAX, tg, PMAX), dtype=w_b.dtype, buffer=nl.psum)
                for t in nl.affine_range(tg):
                    pb[:, t, :] = nisa.nc_transpose(w_b[:, ci * PMAX:(ci + 1) * PMAX, g * tg + t])
                wT[:, ci, g * tg:(g + 1) * tg, (co + 1) * PMAX:(co + 2) * PMAX] = \
                    nisa.tensor_copy(pb, dtype=wT.dtype, engine=nisa.scalar_engine)


def _conv_band(X, X_out, wT, bias_sb, xt, ot, b, row0, prow0, rows, pool, k):
    """Output rows row0 .. row0 + nrows of image b for every C_out tile.

    xt: (128, n_ci, nrows + K - 1, W) input band tile, ot: (128, n_co, nrows / pool, pw) output
    staging tile (both allocated by the caller, so consecutive bands use different buffers).
    """
    n_ci, in_rows = xt.shape[1], xt.shape[2]
    n_co, pw = ot.shape[1], ot.shape[3]
    nrows = in_rows - k + 1
    cols = pw * pool
    for ci in nl.affine_range(n_ci):
        nisa.dma_copy(src=X[b, ci * PMAX:(ci + 1) * PMAX, row0:row0 + in_rows, :],
                      dst=xt[:, ci, :, :])
    n_gp = nrows // (2 * rows)
    extra = nrows - 2 * rows * n_gp
    full3 = rows if extra >= rows else 0
    tail = extra - full3
    for co in nl.affine_range(n_co):
        cm = None
        if pool > 1:
            cm = nl.ndarray((PMAX, nrows, pw), dtype=nl.float32, buffer=nl.sbuf)
        if n_gp:
            for gp in nl.affine_range(n_gp):
                ps1 = nl.zeros((PMAX, rows, cols), dtype=nl.float32, buffer=nl.psum)
                _accumulate(ps1, wT, xt, co, 2 * gp * rows, k)
                _evacuate(ps1, ot, cm, bias_sb, co, 2 * gp * rows, pool, nisa.vector_engine)
                ps2 = nl.zeros((PMAX, rows, cols), dtype=nl.float32, buffer=nl.psum)
                _accumulate(ps2, wT, xt, co, (2 * gp + 1) * rows, k)
                _evacuate(ps2, ot, cm, bias_sb, co, (2 * gp + 1) * rows, pool,
                          nisa.scalar_engine)
        if full3:
            ps3 = nl.zeros((PMAX, full3, cols), dtype=nl.float32, buffer=nl.psum)
            _accumulate(ps3, wT, xt, co, 2 * rows * n_gp, k)
            _evacuate(ps3, ot, cm, bias_sb, co, 2 * rows * n_gp, pool, nisa.vector_engine)
        if tail:
            ps4 = nl.zeros((PMAX, tail, cols), dtype=nl.float32, buffer=nl.psum)
            _accumulate(ps4, wT, xt, co, 2 * rows * n_gp + full3, k)
            _evacuate(ps4, ot, cm, bias_sb, co, 2 * rows * n_gp + full3, pool,
                      nisa.scalar_engine)
        if pool > 1:
            _pool_rows(cm, ot, bias_sb, co, pool)
        nisa.dma_copy(src=ot[:, co, :, :],
                      dst=X_out[b, co * PMAX:(co + 1) * PMAX, prow0:prow0 + nrows // pool, :])


def _accumulate(ps, wT, xt, co, r, k):
    """ps (128, R, cols) += sum over C_in tiles and taps of W^T[tap] . shifted input window."""
    n_ci = xt.shape[1]
    nr, cols = ps.shape[1], ps.shape[2]
    for ci in nl.affine_range(n_ci):
        for di in nl.affine_range(k):
            for dj in nl.affine_range(k):
                ps += nisa.nc_matmul(wT[:, ci, di * k + dj, co * PMAX:(co + 1) * PMAX],
                                     xt[:, ci, r + di:r + di + nr, dj:dj + cols])


def _evacuate(ps, ot, cm, bias_sb, co, r, pool, engine):
    """PSUM tile (rows r.. of C_out tile co) -> SBUF: + bias into the output staging (no pool),
    or the max over each pool-wide column window into the fp32 band buffer ``cm``."""
    nr, cols = ps.shape[1], ps.shape[2]
    if pool == 1:
        _add_bias(ot, co, r, nr, ps, bias_sb[:, co:co + 1], engine)
    else:
        cm[:, r:r + nr, :] = nisa.tensor_reduce(
            nl.max, ps.reshape((PMAX, nr, cols // pool, pool)), axis=3)


def _pool_rows(cm, ot, bias_sb, co, pool):
    """Max over each pool-high row window of the column-pooled band, + bias, into ``ot``."""
    nrows, pw = cm.shape[1], cm.shape[2]
    npr = nrows // pool
    rows_v = cm.reshape((PMAX, npr, pool * pw))
    mx = nl.ndarray((PMAX, npr, pw), dtype=nl.float32, buffer=nl.sbuf)
    mx[...] = nisa.tensor_tensor(rows_v[:, :, 0:pw], rows_v[:, :, pw:2 * pw], nl.maximum)
    if pool > 2:
        for j in nl.sequential_range(2, pool):
            mx[...] = nisa.tensor_tensor(mx, rows_v[:, :, j * pw:(j + 1) * pw], nl.maximum)
    _add_bias(ot, co, 0, ot.shape[2], mx, bias_sb[:, co:co + 1], nisa.scalar_engine)


def _add_bias(ot, co, r, nr, src, bias, engine):
    """``ot[:, co, r:r + nr, :] = src + bias`` (a (128, 1) column) in ot's dtype on ``engine``,
    assigned here (not returned): ``t[key] = op(...)`` lets the engine write its result straight
    into the staging tile. The Scalar Engine adds with tensor_scalar only from NeuronCore-v3
    ("Add and Multiply are supported on Scalar Engine only from NeuronCore-v3", Beta 1 ALU
    table); on trn1 its add is the activation's bias: copy(src * 1 + bias)."""
    if engine == nisa.scalar_engine and nisa.get_nc_version() == nisa.nc_version.gen2:
        ot[:, co, r:r + nr, :] = nisa.activation(nl.copy, src, bias=bias, dtype=ot.dtype)
    else:
        ot[:, co, r:r + nr, :] = nisa.tensor_scalar(src, nl.add, bias, dtype=ot.dtype,
                                                    engine=engine)
