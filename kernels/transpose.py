"""Matrix transpose (CS149 Assignment 4, Part 1 Step 3), as real ``neuronxcc.nki`` code.

``matrix_transpose(a)`` for any (M, N) with both multiples of 128; the only compute instruction is
``nisa.nc_transpose`` on the Tensor Engine (the course rule), PSUM results go to SBUF through
``nisa.tensor_copy`` (``dma_copy`` cannot read PSUM).

Data movement is what costs (64 MiB in + 64 MiB out at 4096x4096 fp32), so both sides use wide
DMAs: a whole 128-row band of the input per load (N*4 bytes per partition), and the output is
staged for ``GROUP`` input bands so every store writes ``GROUP*128`` contiguous elements per row
(2 KiB+ per partition, where DMA efficiency is past 80%, nki-reference §3.5). Four 128x128
transposes fill one 2 KiB PSUM bank (128x512 fp32) and leave it with one copy.
"""

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

TILE = 128
BANK_TILES = 4          # 4 x 128 fp32 columns = one 2 KiB PSUM bank per partition


@nki.compiler.skip_middle_end_transformations
@nki.jit
def matrix_transpose(a_tensor):
    M, N = a_tensor.shape
    out = nl.ndarray((N, M), dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    if M % TILE or N % TILE:
        raise ValueError(f"matrix_transpose needs both dimensions to be multiples of {TILE}, "
                         f"got ({M}, {N})")
    m_tiles, n_tiles = M // TILE, N // TILE
    # input bands staged per output store: a divisor of m_tiles, at most 4 (2 KiB fp32 rows)
    group = 4 if m_tiles % 4 == 0 else (2 if m_tiles % 2 == 0 else 1)
    bank = BANK_TILES if n_tiles % BANK_TILES == 0 else (2 if n_tiles % 2 == 0 else 1)
    for g in nl.affine_range(m_tiles // group):
        # stage[:, j, c]: row (j*128 + partition) of the output, columns g*group*128 + c
        stage = nl.ndarray((TILE, n_tiles, group * TILE), dtype=a_tensor.dtype, buffer=nl.sbuf)
        for gi in nl.affine_range(group):
            band = nl.ndarray((TILE, N), dtype=a_tensor.dtype, buffer=nl.sbuf)
            row0 = (g * group + gi) * TILE
            nisa.dma_copy(src=a_tensor[row0:row0 + TILE, :], dst=band)
            for jb in nl.affine_range(n_tiles // bank):
                # `bank` transposes write side by side into one PSUM tile: columns k*128.. hold
                # the transpose of input block (band, jb*bank + k)
                pt = nl.ndarray((TILE, bank * TILE), dtype=a_tensor.dtype, buffer=nl.psum)
                for k in nl.affine_range(bank):
                    col0 = (jb * bank + k) * TILE
                    pt[:, k * TILE:(k + 1) * TILE] = nisa.nc_transpose(band[:, col0:col0 + TILE])
                for k in nl.affine_range(bank):
                    stage[:, jb * bank + k, gi * TILE:(gi + 1) * TILE] = nisa.tensor_copy(
                        pt[:, k * TILE:(k + 1) * TILE])
        for j in nl.affine_range(n_tiles):
            nisa.dma_copy(src=stage[:, j, :],
                          dst=out[j * TILE:(j + 1) * TILE,
                                  g * group * TILE:(g + 1) * group * TILE])
    return out
