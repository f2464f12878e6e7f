"""Vector add kernels (CS149 Assignment 4, Part 1) in the current NKI dialect (``import nki``,
NKI 0.3-0.7): the twins of ``kernels/vector_add.py`` (Beta 1), same contract, same cases.

What changes from Beta 1 (spec nki-current.md §2.0, §2.4):
- ``nisa`` ops are destination-passing: ``nisa.tensor_tensor(dst, data1, data2, op)`` writes
  ``dst`` and returns nothing usable (STUB-R32 isa).
- Outputs are ``nl.shared_hbm`` (MIG 0.2->0.3: "Output tensors must use nl.shared_hbm").
- DMA source and destination get identical shapes: the 1-D vectors are viewed as (M, 1) so a
  (P, 1) SBUF tile receives a (P, 1) HBM slice (aws-neuron-sdk#1281 "DMA Copy in/out shape must
  match"; HBM reshapes are free views, LG §Tensor Values).
- The add is ``tensor_tensor``: Beta 1's naive/tiled kernels used ``tensor_scalar`` with a (P, 1)
  tile operand, but current ``tensor_scalar`` tile operands must be fp32 (STUB-R32
  ``tensor_scalar``), and these kernels also run in float16/bfloat16.
- No ``@nki.compiler.skip_middle_end_transformations`` (not part of the current API, spec §2.1);
  loops are plain ``range`` (``affine_range`` is a deprecated alias of ``range``, spec §2.2).

- ``vector_add_naive``: one tile, vectors of at most 128 elements (one element per partition);
  longer vectors fail with the partition-limit error, as on a trn2.
- ``vector_add_tiled``: 128-element chunks; any length, the last chunk may be shorter.
- ``vector_add_stream``: the vector viewed as ``(128, M // 128)`` and streamed in large free-dim
  tiles; lengths must be multiples of 128 (a clear error otherwise).
"""

import nki
import nki.isa as nisa
import nki.language as nl

PARTITIONS = 128
# Free-dim elements per streamed tile: 2048 fp32 = 8 KiB per partition per DMA, past the 4 KiB
# where DMA efficiency saturates (nki-reference §3.5); the same as the Beta 1 twin.
STREAM_FREE_DIM = 2048


@nki.jit
def vector_add_naive(a_vec, b_vec):
    M = a_vec.shape[0]
    out = nl.ndarray(a_vec.shape, dtype=a_vec.dtype, buffer=nl.shared_hbm)
    a_sbuf = nl.ndarray((M, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
    b_sbuf = nl.ndarray((M, 1), dtype=b_vec.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sbuf, src=a_vec.reshape((M, 1)))
    nisa.dma_copy(dst=b_sbuf, src=b_vec.reshape((M, 1)))
    res = nl.ndarray((M, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res, data1=a_sbuf, data2=b_sbuf, op=nl.add)
    nisa.dma_copy(dst=out.reshape((M, 1)), src=res)
    return out


def _add_rows(a2, b2, o2, start, rows, dtype):
    """o2[start:start+rows, :] = a2[...] + b2[...] through SBUF, rows <= 128."""
    a_tile = nl.ndarray((rows, 1), dtype=dtype, buffer=nl.sbuf)
    b_tile = nl.ndarray((rows, 1), dtype=b2.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_tile, src=a2[start:start + rows, :])
    nisa.dma_copy(dst=b_tile, src=b2[start:start + rows, :])
    res = nl.ndarray((rows, 1), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res, data1=a_tile, data2=b_tile, op=nl.add)
    nisa.dma_copy(dst=o2[start:start + rows, :], src=res)


@nki.jit
def vector_add_tiled(a_vec, b_vec):
    M = a_vec.shape[0]
    out = nl.ndarray(a_vec.shape, dtype=a_vec.dtype, buffer=nl.shared_hbm)
    a2, b2, o2 = a_vec.reshape((M, 1)), b_vec.reshape((M, 1)), out.reshape((M, 1))
    n_full = M // PARTITIONS
    for m in range(n_full):
        _add_rows(a2, b2, o2, m * PARTITIONS, PARTITIONS, a_vec.dtype)
    tail = M - n_full * PARTITIONS
    if tail:
        _add_rows(a2, b2, o2, n_full * PARTITIONS, tail, a_vec.dtype)
    return out


def _add_cols(a_re, b_re, o_re, start, cols, dtype):
    """o_re[:, start:start+cols] = a_re[...] + b_re[...] through SBUF."""
    a_tile = nl.ndarray((PARTITIONS, cols), dtype=dtype, buffer=nl.sbuf)
    b_tile = nl.ndarray((PARTITIONS, cols), dtype=b_re.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_tile, src=a_re[:, start:start + cols])
    nisa.dma_copy(dst=b_tile, src=b_re[:, start:start + cols])
    res = nl.ndarray((PARTITIONS, cols), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res, data1=a_tile, data2=b_tile, op=nl.add)
    nisa.dma_copy(dst=o_re[:, start:start + cols], src=res)


@nki.jit
def vector_add_stream(a_vec, b_vec):
    M = a_vec.shape[0]
    if M % PARTITIONS:
        raise ValueError(f"vector_add_stream needs a length that is a multiple of {PARTITIONS}, "
                         f"got {M}; use vector_add_tiled for other lengths")
    cols = M // PARTITIONS
    out = nl.ndarray(a_vec.shape, dtype=a_vec.dtype, buffer=nl.shared_hbm)
    a_re = a_vec.reshape((PARTITIONS, cols))
    b_re = b_vec.reshape((PARTITIONS, cols))
    o_re = out.reshape((PARTITIONS, cols))
    F = min(STREAM_FREE_DIM, cols)
    n_full = cols // F
    for m in range(n_full):
        _add_cols(a_re, b_re, o_re, m * F, F, a_vec.dtype)
    tail = cols - n_full * F
    if tail:
        _add_cols(a_re, b_re, o_re, n_full * F, tail, a_vec.dtype)
    return out
