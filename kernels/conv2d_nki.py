"""Fused conv2d + bias + max pool (CS149 Assignment 4, Part 2) in the current NKI dialect
(``import nki``, NKI 0.3-0.7): the twin of ``kernels/conv2d.py`` (Beta 1), with the same contract,
algorithm, band plan (``kernels/conv2d_common.py``) and cases; read that file's docstring for the
algorithm.

``fused_conv2d_maxpool(X, W, bias, pool_size=1)``: X (B, C_in, H, W), W (C_out, C_in, K, K),
bias (C_out,); stride 1, no padding; max pool with window = stride = ``pool_size``. The result is
(B, C_out, out_h // pool, out_w // pool) in X's dtype, returned in ``nl.shared_hbm``.

What changes from Beta 1 (spec nki-current.md §2.0, §2.4, §5.3):
- every ``nisa`` op writes its ``dst`` (first parameter) and returns nothing usable; the output
  dtype is ``dst.dtype`` (no ``dtype=``), so casts happen by writing into a tile of that dtype;
- PSUM output tiles are fresh ``nl.ndarray`` tiles filled by ``nc_matmul(dst=..., accumulate=
  step > 0)`` instead of ``nl.zeros`` + ``ps += nc_matmul(...)``;
- the column max-pool reduces the last free axis with the op token ``nl.maximum`` (current
  ``tensor_reduce`` axes must be the last contiguous free dims);
- engines are ``nisa.engine.vector``/``nisa.engine.scalar`` (the module-level
  ``nisa.vector_engine`` constants are deprecated aliases, STUB-R32 isa);
- DMA source and destination have identical shapes (the bias is viewed as (C_out, 1));
- loops are plain ``range``; no ``nki.compiler`` decorators (not in the current API).
"""

import nki
import nki.isa as nisa
import nki.language as nl
from nkiverify.kernels.conv2d_common import (
    PMAX,
    PSUM_BANK_BYTES,
    _check_args,
    _schedule,
)


@nki.jit
def fused_conv2d_maxpool(X, W, bias, pool_size=1):
    _check_args(X, W, bias, pool_size)
    batch, c_in, in_h, in_w = X.shape
    c_out, _, k, _ = W.shape
    pool = pool_size
    out_h, out_w = in_h - k + 1, in_w - k + 1
    ph, pw = out_h // pool, out_w // pool
    n_ci, n_co = c_in // PMAX, c_out // PMAX

    X_out = nl.ndarray((batch, c_out, ph, pw), dtype=X.dtype, buffer=nl.shared_hbm)

    rows, band, n_pairs, rest_c, rest_d = _schedule(X, W, bias, pool)

    bias_sb = _load_bias(bias, n_co)
    wT = _load_weights(W, X.dtype, n_ci, n_co, k)

    # the pairs of full bands, then the shorter bands of the remaining rows (_schedule)
    pband = band // pool
    for b in range(batch):
        if n_pairs:
            for bp in range(n_pairs):
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
    bias2 = bias.reshape((n_co * PMAX, 1))
    for co in range(n_co):
        nisa.dma_copy(dst=raw[:, co:co + 1], src=bias2[co * PMAX:(co + 1) * PMAX, :])
    bias_sb = nl.ndarray((PMAX, n_co), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=bias_sb, src=raw)         # the cast to fp32 is dst's dtype
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
        for cp in range(n_co // 2):
            w_a = nl.ndarray((PMAX, c_in, taps), dtype=W.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=w_a, src=w_flat[2 * cp * PMAX:(2 * cp + 1) * PMAX, :, :])
            w_b = nl.ndarray((PMAX, c_in, taps), dtype=W.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=w_b, src=w_flat[(2 * cp + 1) * PMAX:(2 * cp + 2) * PMAX, :, :])
            _transpose_weights(w_a, w_b, wT, 2 * cp, n_ci, k)
    if n_co % 2:
        w_c = nl.ndarray((PMAX, c_in, taps), dtype=W.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w_c, src=w_flat[(n_co - 1) * PMAX:n_co * PMAX, :, :])
        _transpose_weights(w_c, None, wT, n_co - 1, n_ci, k)
    return wT


def _transpose_weights(w_a, w_b, wT, co, n_ci, k):
    """Transpose the (co, ci) 128x128 blocks of staged C_out tile(s) co (and co + 1 from w_b)
    into wT, ``tg`` taps (all K*K, one filter row of K, or 1) per PSUM bank."""
    taps = k * k
    tg = taps if taps * PMAX * w_a.itemsize <= PSUM_BANK_BYTES else (
        k if k * PMAX * w_a.itemsize <= PSUM_BANK_BYTES else 1)
    for ci in range(n_ci):
        for g in range(taps // tg):
            pa = nl.ndarray((PMAX, tg, PMAX), dtype=w_a.dtype, buffer=nl.psum)
            for t in range(tg):
                nisa.nc_transpose(dst=pa[:, t, :],
                                  data=w_a[:, ci * PMAX:(ci + 1) * PMAX, g * tg + t])
            nisa.tensor_copy(dst=wT[:, ci, g * tg:(g + 1) * tg, co * PMAX:(co + 1) * PMAX],
                             src=pa, engine=nisa.engine.vector)
            if w_b is not None:
                pb = nl.ndarray((PMAX, tg, PMAX), dtype=w_b.dtype, buffer=nl.psum)
                for t in range(tg):
                    nisa.nc_transpose(dst=pb[:, t, :],
                                      data=w_b[:, ci * PMAX:(ci + 1) * PMAX, g * tg + t])
                _copy_on_scalar_engine(
                    wT[:, ci, g * tg:(g + 1) * tg, (co + 1) * PMAX:(co + 2) * PMAX], pb)


def _copy_on_scalar_engine(dst, src):
    """``dst = src`` on the Scalar engine (beside the Vector engine's copy of the other half).
    gen2 (trn1) has no Scalar-engine ``tensor_copy`` (STUB-R32: "no Scalar-Engine tensor_copy on
    v2"): there the engine's copy is ``activation(op=nl.copy)``, exact for these weights (fp32
    inside, values already in the weights' dtype)."""
    if nisa.get_nc_version() == nisa.nc_version.gen2:
        nisa.activation(dst=dst, op=nl.copy, data=src)
    else:
        nisa.tensor_copy(dst=dst, src=src, engine=nisa.engine.scalar)


def _conv_band(X, X_out, wT, bias_sb, xt, ot, b, row0, prow0, rows, pool, k):
    """Output rows row0 .. row0 + nrows of image b for every C_out tile.

    xt: (128, n_ci, nrows + K - 1, W) input band tile, ot: (128, n_co, nrows / pool, pw) output
    staging tile (both allocated by the caller, so consecutive bands use different buffers).
    """
    n_ci, in_rows = xt.shape[1], xt.shape[2]
    n_co, pw = ot.shape[1], ot.shape[3]
    nrows = in_rows - k + 1
    cols = pw * pool
    for ci in range(n_ci):
        nisa.dma_copy(dst=xt[:, ci, :, :],
                      src=X[b, ci * PMAX:(ci + 1) * PMAX, row0:row0 + in_rows, :])
    n_gp = nrows // (2 * rows)
    extra = nrows - 2 * rows * n_gp
    full3 = rows if extra >= rows else 0
    tail = extra - full3
    for co in range(n_co):
        cm = None
        if pool > 1:
            cm = nl.ndarray((PMAX, nrows, pw), dtype=nl.float32, buffer=nl.sbuf)
        if n_gp:
            for gp in range(n_gp):
                ps1 = nl.ndarray((PMAX, rows, cols), dtype=nl.float32, buffer=nl.psum)
                _accumulate(ps1, wT, xt, co, 2 * gp * rows, k)
                _evacuate(ps1, ot, cm, bias_sb, co, 2 * gp * rows, pool, nisa.engine.vector)
                ps2 = nl.ndarray((PMAX, rows, cols), dtype=nl.float32, buffer=nl.psum)
                _accumulate(ps2, wT, xt, co, (2 * gp + 1) * rows, k)
                _evacuate(ps2, ot, cm, bias_sb, co, (2 * gp + 1) * rows, pool,
                          nisa.engine.scalar)
        if full3:
            ps3 = nl.ndarray((PMAX, full3, cols), dtype=nl.float32, buffer=nl.psum)
            _accumulate(ps3, wT, xt, co, 2 * rows * n_gp, k)
            _evacuate(ps3, ot, cm, bias_sb, co, 2 * rows * n_gp, pool, nisa.engine.vector)
        if tail:
            ps4 = nl.ndarray((PMAX, tail, cols), dtype=nl.float32, buffer=nl.psum)
            _accumulate(ps4, wT, xt, co, 2 * rows * n_gp + full3, k)
            _evacuate(ps4, ot, cm, bias_sb, co, 2 * rows * n_gp + full3, pool,
                      nisa.engine.scalar)
        if pool > 1:
            _pool_rows(cm, ot, bias_sb, co, pool)
        nisa.dma_copy(dst=X_out[b, co * PMAX:(co + 1) * PMAX, prow0:prow0 + nrows // pool, :],
                      src=ot[:, co, :, :])


def _accumulate(ps, wT, xt, co, r, k):
    """ps (128, R, cols) = sum over C_in tiles and taps of W^T[tap] . shifted input window: the
    first matmul overwrites the fresh PSUM tile, the others accumulate (``accumulate=(step > 0)``,
    the STUB-R32 ``nc_matmul`` docstring's hint; it replaces Beta 1's ``nl.zeros`` PSUM tile and
    ``ps += nc_matmul(...)``, which the current docs advise against, spec §2.4)."""
    n_ci = xt.shape[1]
    nr, cols = ps.shape[1], ps.shape[2]
    step = 0
    for ci in range(n_ci):
        for di in range(k):
            for dj in range(k):
                nisa.nc_matmul(dst=ps,
                               stationary=wT[:, ci, di * k + dj, co * PMAX:(co + 1) * PMAX],
                               moving=xt[:, ci, r + di:r + di + nr, dj:dj + cols],
                               accumulate=step > 0)
                step += 1


def _evacuate(ps, ot, cm, bias_sb, co, r, pool, engine):
    """PSUM tile (rows r.. of C_out tile co) -> SBUF: + bias into the output staging (no pool),
    or the max over each pool-wide column window into the fp32 band buffer ``cm``."""
    nr, cols = ps.shape[1], ps.shape[2]
    if pool == 1:
        _add_bias(ot[:, co, r:r + nr, :], ps, bias_sb[:, co:co + 1], engine)
    else:
        nisa.tensor_reduce(dst=cm[:, r:r + nr, :], op=nl.maximum,
                           data=ps.reshape((PMAX, nr, cols // pool, pool)), axis=(3,))


def _pool_rows(cm, ot, bias_sb, co, pool):
    """Max over each pool-high row window of the column-pooled band, + bias, into ``ot``."""
    nrows, pw = cm.shape[1], cm.shape[2]
    npr = nrows // pool
    rows_v = cm.reshape((PMAX, npr, pool * pw))
    mx = nl.ndarray((PMAX, npr, pw), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=mx, data1=rows_v[:, :, 0:pw], data2=rows_v[:, :, pw:2 * pw],
                       op=nl.maximum)
    for j in range(2, pool):
        nisa.tensor_tensor(dst=mx, data1=mx, data2=rows_v[:, :, j * pw:(j + 1) * pw],
                           op=nl.maximum)
    _add_bias(ot[:, co, :, :], mx, bias_sb[:, co:co + 1], nisa.engine.scalar)


def _add_bias(dst, src, bias, engine):
    """``dst = src + bias`` (a (128, 1) column) on ``engine``. The Scalar Engine adds with
    tensor_scalar only from NeuronCore-v3 (Beta 1 ALU table: "Add and Multiply are supported on
    Scalar Engine only from NeuronCore-v3"); on gen2 its add is the activation's bias."""
    if engine == nisa.engine.scalar and nisa.get_nc_version() == nisa.nc_version.gen2:
        nisa.activation(dst=dst, op=nl.copy, data=src, bias=bias)
    else:
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.add, operand0=bias, engine=engine)
