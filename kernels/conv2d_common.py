"""The NKI-free part of the fused conv2d + max pool kernels (``kernels/conv2d.py``, Beta 1, and
``kernels/conv2d_nki.py``, the current ``nki`` dialect): argument checks and the band plan, shared
so both dialects compute the same schedule from the same sizes."""

import math

PMAX = 128                  # partitions: the C_in / C_out tile (nl.tile_size.pmax)
PSUM_FMAX = 512             # fp32 per PSUM bank per partition = max moving free size
PSUM_BANK_BYTES = 2048      # one PSUM bank per partition
# SBUF bytes per partition the kernel plans to use: trn2 has 224 KiB per partition (28 MiB); the
# compiler's reservation is not documented (trn1 reserves 16 of 192 KiB), so we leave 32 KiB.
SBUF_BUDGET = 192 * 1024
# Input-band DMA size per partition per C_in tile we aim for: well past the 4 KiB where DMA
# efficiency saturates (nki-reference §3.5), small enough that the first load (not overlapped
# with compute) stays short.
BAND_BYTES = 8 * 1024


def _check_args(X, W, bias, pool_size):
    """Validate shapes; raise ValueError with the reason."""
    if len(X.shape) != 4 or len(W.shape) != 4:
        raise ValueError(f"X must be (B, C_in, H, W) and W (C_out, C_in, K, K); got X "
                         f"{tuple(X.shape)}, W {tuple(W.shape)}")
    _, c_in, in_h, in_w = X.shape
    c_out, c_in_w, fh, fw = W.shape
    if c_in_w != c_in:
        raise ValueError(f"C_in mismatch: X has {c_in} channels, W has {c_in_w}")
    if c_in % PMAX:
        raise ValueError(f"C_in must be a multiple of {PMAX}, got {c_in}")
    if c_out % PMAX:
        raise ValueError(f"C_out must be a multiple of {PMAX}, got {c_out}")
    if fh != fw:
        raise ValueError(f"the filter must be square (K x K), got {fh} x {fw}")
    if fh < 1 or fh > in_h or fw > in_w:
        raise ValueError(f"a {fh} x {fw} filter does not fit a {in_h} x {in_w} image")
    if tuple(bias.shape) != (c_out,):
        raise ValueError(f"bias must have shape ({c_out},), got {tuple(bias.shape)}")
    out_h, out_w = in_h - fh + 1, in_w - fw + 1
    if out_w > PSUM_FMAX:
        raise ValueError(f"the output width W - K + 1 = {out_w} exceeds {PSUM_FMAX} "
                         f"(nl.tile_size.gemm_moving_fmax)")
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
        raise ValueError(f"pool_size must be a positive int, got {pool_size!r}")
    if out_h % pool_size:
        raise ValueError(f"the output height {out_h} is not divisible by pool_size={pool_size}")
    if pool_size > out_w:
        raise ValueError(f"pool_size={pool_size} exceeds the output width {out_w}")


def _plan(n_ci, n_co, in_w, k, out_h, pw, pool, itemsize, fixed_bytes):
    """(rows, band): output rows per PSUM tile, output rows per input band (a multiple of pool).

    One band site holds the input rows (n_ci, band + k - 1, in_w), the output staging
    (n_co, band / pool, pw) and, when pooling, the fp32 column-pooled rows (band, pw) and the
    row-pooled result (band / pool, pw); two sites are live at once. Closed form (no loops).
    """
    cols = pw * pool
    rows = min(out_h, PSUM_FMAX // cols)
    unit = rows * pool // math.gcd(rows, pool)
    if unit > out_h:
        unit = pool
    per_row = n_ci * in_w * itemsize + (n_co * pw * itemsize) // pool
    if pool > 1:
        per_row += pw * 4 + (pw * 4) // pool
    const = n_ci * (k - 1) * in_w * itemsize
    avail = (SBUF_BUDGET - fixed_bytes) // 2 - const
    m_fit = avail // (per_row * unit) if avail > 0 else 0
    if m_fit < 1 and unit > pool:
        unit = pool
        m_fit = avail // (per_row * unit) if avail > 0 else 0
    if m_fit < 1:
        raise ValueError(f"the weights ({fixed_bytes} bytes per partition) and two input bands "
                         f"of {pool + k - 1} rows x {in_w} columns x {n_ci} channel tiles do not "
                         f"fit the {SBUF_BUDGET}-byte SBUF budget per partition")
    target_rows = max(1, BAND_BYTES // (in_w * itemsize) - (k - 1))
    m_target = -(-target_rows // unit)
    band = unit * max(1, min(m_fit, m_target, out_h // unit))
    return rows, band


def _schedule(X, W, bias, pool):
    """(rows, band, n_pairs, rest_c, rest_d) of a valid call (see ``_check_args``): output rows
    per PSUM tile, output rows per band, the pairs of full bands (two buffer sets: the load of
    one overlaps the compute of the other) and up to two shorter bands for the remaining rows.
    Raises ValueError when the resident weights do not fit the SBUF budget."""
    _, c_in, in_h, in_w = X.shape
    c_out, _, k, _ = W.shape
    out_h, out_w = in_h - k + 1, in_w - k + 1
    n_ci, n_co = c_in // PMAX, c_out // PMAX
    taps = k * k
    # SBUF per partition: the resident W^T, two natural W blocks while transposing, the bias
    resident = n_ci * taps * c_out * X.itemsize + n_co * (4 + bias.itemsize)
    staging = 2 * c_in * taps * W.itemsize
    if resident + staging > SBUF_BUDGET:
        raise ValueError(f"the weights do not fit in SBUF: W^T needs {resident} bytes per "
                         f"partition plus {staging} to stage two C_out tiles, more than the "
                         f"{SBUF_BUDGET}-byte budget")
    rows, band = _plan(n_ci, n_co, in_w, k, out_h, out_w // pool, pool, X.itemsize, resident)
    n_pairs = out_h // (2 * band)
    rest = out_h - 2 * band * n_pairs
    rest_c = min(band, rest)
    return rows, band, n_pairs, rest_c, rest - rest_c
