"""Matrix transpose (CS149 Assignment 4, Part 1 Step 3) in the current NKI dialect (``import
nki``, NKI 0.3-0.7): the twin of ``kernels/transpose.py`` (Beta 1), same algorithm, same cases.

``matrix_transpose(a)`` for any (M, N) with both multiples of 128. The only compute instruction
is ``nisa.nc_transpose`` on the Tensor Engine (the course rule), written into PSUM
(``nc_transpose(dst, data)``: a [128, 128] tile selects the Tensor Engine, whose dst is PSUM and
"must have the same data type as data", STUB-R32); PSUM results go to SBUF through
``nisa.tensor_copy(dst, src)`` (``dma_copy`` may not read PSUM from 0.3.0, MIG 0.2->0.3).

Both sides use wide DMAs, as the Beta 1 twin: a whole 128-row band of the input per load, and the
output staged for ``group`` input bands so each store writes ``group*128`` contiguous elements per
row. Four 128x128 transposes fill one 2 KiB PSUM bank (128x512 fp32) and leave it with one copy
each. Integer indices on an SBUF free dim drop it (``stage[:, j, a:b]`` is 2-D; LG §Tensor
Indexing).
"""

import nki
import nki.isa as nisa
import nki.language as nl

TILE = 128
BANK_TILES = 4          # 4 x 128 fp32 columns = one 2 KiB PSUM bank per partition


@nki.jit
def matrix_transpose(a_tensor):
    M, N = a_tensor.shape
    if M % TILE or N % TILE:
        raise ValueError(f"matrix_transpose needs both dimensions to be multiples of {TILE}, "
                         f"got ({M}, {N})")
    out = nl.ndarray((N, M), dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    m_tiles, n_tiles = M // TILE, N // TILE
    group = 4 if m_tiles % 4 == 0 else (2 if m_tiles % 2 == 0 else 1)
    bank = BANK_TILES if n_tiles % BANK_TILES == 0 else (2 if n_tiles % 2 == 0 else 1)
    for g in range(m_tiles // group):
        # stage[:, j, c]: row (j*128 + partition) of the output, columns g*group*128 + c
        stage = nl.ndarray((TILE, n_tiles, group * TILE), dtype=a_tensor.dtype, buffer=nl.sbuf)
        for gi in range(group):
            band = nl.ndarray((TILE, N), dtype=a_tensor.dtype, buffer=nl.sbuf)
            row0 = (g * group + gi) * TILE
            nisa.dma_copy(dst=band, src=a_tensor[row0:row0 + TILE, :])
            for jb in range(n_tiles // bank):
                # `bank` transposes side by side in one PSUM tile: columns k*128.. hold the
                # transpose of input block (band, jb*bank + k)
                pt = nl.ndarray((TILE, bank * TILE), dtype=a_tensor.dtype, buffer=nl.psum)
                for k in range(bank):
                    col0 = (jb * bank + k) * TILE
                    nisa.nc_transpose(dst=pt[:, k * TILE:(k + 1) * TILE],
                                      data=band[:, col0:col0 + TILE])
                for k in range(bank):
                    nisa.tensor_copy(dst=stage[:, jb * bank + k, gi * TILE:(gi + 1) * TILE],
                                     src=pt[:, k * TILE:(k + 1) * TILE])
        for j in range(n_tiles):
            nisa.dma_copy(dst=out[j * TILE:(j + 1) * TILE,
                                  g * group * TILE:(g + 1) * group * TILE],
                          src=stage[:, j, :])
    return out
