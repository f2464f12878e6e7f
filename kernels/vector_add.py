"""Vector add kernels (CS149 Assignment 4, Part 1), as real ``neuronxcc.nki`` code.

- ``vector_add_naive``: the handout's single-tile kernel; vectors of at most 128 elements (one
  element per partition). Longer vectors fail with NKI's partition-limit error, as on a trn2.
- ``vector_add_tiled``: 128-element chunks (``ROW_CHUNK = 128``); any length, the last chunk may
  be shorter.
- ``vector_add_stream``: the vector viewed as ``(128, M // 128)`` and streamed in large free-dim
  tiles; lengths must be multiples of 128 (a clear error otherwise); the last tile may be narrower,
  so no tail is ever dropped.
"""

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PARTITIONS = 128
# Free-dim elements per streamed tile: 2048 fp32 = 8 KiB per partition per DMA, past the 4 KiB
# where DMA efficiency saturates (nki-reference §3.5), small enough that loads, the add and the
# stores of consecutive tiles overlap.
STREAM_FREE_DIM = 2048


@nki.compiler.skip_middle_end_transformations
@nki.jit
def vector_add_naive(a_vec, b_vec):
    out = nl.ndarray(shape=a_vec.shape, dtype=a_vec.dtype, buffer=nl.hbm)
    a_sbuf = nl.ndarray(shape=(a_vec.shape[0], 1), dtype=a_vec.dtype, buffer=nl.sbuf)
    b_sbuf = nl.ndarray(shape=(b_vec.shape[0], 1), dtype=b_vec.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=a_vec, dst=a_sbuf)
    nisa.dma_copy(src=b_vec, dst=b_sbuf)
    res = nisa.tensor_scalar(a_sbuf, nl.add, b_sbuf)
    nisa.dma_copy(src=res, dst=out)
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def vector_add_tiled(a_vec, b_vec):
    out = nl.ndarray(shape=a_vec.shape, dtype=a_vec.dtype, buffer=nl.hbm)
    M = a_vec.shape[0]
    ROW_CHUNK = PARTITIONS
    n_full = M // ROW_CHUNK
    for m in nl.affine_range(n_full):
        a_tile = nl.ndarray((ROW_CHUNK, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
        b_tile = nl.ndarray((ROW_CHUNK, 1), dtype=b_vec.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=a_vec[m * ROW_CHUNK:(m + 1) * ROW_CHUNK], dst=a_tile)
        nisa.dma_copy(src=b_vec[m * ROW_CHUNK:(m + 1) * ROW_CHUNK], dst=b_tile)
        res = nisa.tensor_scalar(a_tile, nl.add, b_tile)
        nisa.dma_copy(src=res, dst=out[m * ROW_CHUNK:(m + 1) * ROW_CHUNK])
    tail = M - n_full * ROW_CHUNK
    if tail:
        start = n_full * ROW_CHUNK
        a_tile = nl.ndarray((tail, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
        b_tile = nl.ndarray((tail, 1), dtype=b_vec.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=a_vec[start:M], dst=a_tile)
        nisa.dma_copy(src=b_vec[start:M], dst=b_tile)
        res = nisa.tensor_scalar(a_tile, nl.add, b_tile)
        nisa.dma_copy(src=res, dst=out[start:M])
    return out


@nki.compiler.skip_middle_end_transformations
@nki.jit
def vector_add_stream(a_vec, b_vec):
    M = a_vec.shape[0]
    if M % PARTITIONS:
        raise ValueError(f"vector_add_stream needs a length that is a multiple of {PARTITIONS}, "
                         f"got {M}; use vector_add_tiled for other lengths")
    cols = M // PARTITIONS
    a_re = a_vec.reshape((PARTITIONS, cols))
    b_re = b_vec.reshape((PARTITIONS, cols))
    out = nl.ndarray(shape=(PARTITIONS, cols), dtype=a_vec.dtype, buffer=nl.hbm)
    F = min(STREAM_FREE_DIM, cols)
    n_full = cols // F
    for m in nl.affine_range(n_full):
        a_tile = nl.ndarray((PARTITIONS, F), dtype=a_vec.dtype, buffer=nl.sbuf)
        b_tile = nl.ndarray((PARTITIONS, F), dtype=b_vec.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=a_re[:, m * F:(m + 1) * F], dst=a_tile)
        nisa.dma_copy(src=b_re[:, m * F:(m + 1) * F], dst=b_tile)
        res = nisa.tensor_tensor(a_tile, b_tile, op=nl.add)
        nisa.dma_copy(src=res, dst=out[:, m * F:(m + 1) * F])
    tail = cols - n_full * F
    if tail:
        start = n_full * F
        a_tile = nl.ndarray((PARTITIONS, tail), dtype=a_vec.dtype, buffer=nl.sbuf)
        b_tile = nl.ndarray((PARTITIONS, tail), dtype=b_vec.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=a_re[:, start:cols], dst=a_tile)
        nisa.dma_copy(src=b_re[:, start:cols], dst=b_tile)
        res = nisa.tensor_tensor(a_tile, b_tile, op=nl.add)
        nisa.dma_copy(src=res, dst=out[:, start:cols])
    return out.reshape(a_vec.shape)
