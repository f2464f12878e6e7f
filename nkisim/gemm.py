"""The Tensor Engine's arithmetic: ``stationary.T @ moving`` in fp32 (issue 12).

``product`` computes nc_matmul's result. An ``acc += nc_matmul(...)`` result is added to the
accumulator and dropped within the same bytecode (``nkisim.tensor.PendingMatmul``), so it is
computed into a per-thread scratch buffer of its shape instead of a fresh array: a fresh
128x444 fp32 result (227 KB, past glibc's trim threshold) costs its page faults again on every
matmul. Measured on the 2-core machine (tmp script, the conv2d's operands: a 128x128 strided
stationary, a [128, 2, 222] window of a 224-wide band, 18 accumulations, min of 30): 203-209 us
per matmul + add with a fresh result, 189-192 with the scratch buffer. Alternatives measured and
dropped: CBLAS ``sgemm`` with beta=1 straight into the accumulator (198-200 us: the kernel's own
read of C costs what the add pass did) and one GEMM over the window's rows as a single strided
446-column span (198 us: the add then reads a strided result).

The values are the same either way (the same BLAS calls with the same N, only the destination
differs); tests/nkisim/test_lazy_matmul.py compares the lazy path with the eager one bit for bit.
"""

from __future__ import annotations

import math
import threading

import numpy as np

_local = threading.local()
_SCRATCH_MAX = 8        # shapes kept per thread (a kernel uses one or two accumulator shapes)


def scratch(shape: tuple) -> np.ndarray:
    """This thread's fp32 scratch array of ``shape`` (its values are garbage)."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(shape)
    if buf is None:
        if len(bufs) >= _SCRATCH_MAX:
            bufs.clear()
        buf = bufs[shape] = np.empty(shape, np.float32)
    return buf


def product(a: np.ndarray, b: np.ndarray, shape: tuple, reuse: bool = False) -> np.ndarray:
    """``a.T @ b`` as an array of ``shape`` ((M,) + the moving tile's free shape): ``a`` is
    (K, M) fp32, ``b`` (K, N) or (K, ...) fp32. ``reuse``: into ``scratch(shape)``, which the
    next ``product(..., reuse=True)`` of that shape overwrites (the caller consumes it first)."""
    out = scratch(shape) if reuse else None
    if b.ndim == 2:
        return np.matmul(a.T, b, out=out)
    if out is None:
        out = np.empty(shape, np.float32)
    if b.ndim == 3 and b.shape[2] >= 128 and not b.flags.c_contiguous:
        # a window of rows of a wider tile (conv2d's shifted input rows): one GEMM per row
        # on the strided rows instead of copying the window first (issue 12: 5-10% of a
        # 224x224 conv2d simulation went to that copy)
        np.matmul(a.T, b.transpose(1, 0, 2), out=out.transpose(1, 0, 2))
        return out
    n = math.prod(shape[1:])
    np.matmul(a.T, b.reshape(b.shape[0], n), out=out.reshape(shape[0], n))
    return out
