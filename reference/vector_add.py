"""Golden models for the Part 1 vector-add kernels (``vector_add_naive/tiled/stream``)."""

import ml_dtypes  # noqa: F401  (registers bfloat16/float8 so np.dtype("bfloat16") works)
import numpy as np


def _check_same_shape(a, b):
    if a.shape != b.shape:
        raise ValueError(
            f"vector_add: a and b must have the same shape, got {a.shape} and {b.shape}")


def vector_add(a, b):
    """Exact ``a + b`` in float64 from the given (already rounded) inputs."""
    a, b = np.asarray(a), np.asarray(b)
    _check_same_shape(a, b)
    return a.astype(np.float64) + b.astype(np.float64)


def vector_add_baseline(a, b, dtype=None):
    """``a + b`` as the hardware computes it.

    Inputs are rounded to ``dtype`` (default: ``a.dtype``), added in float32 (the engines compute
    in fp32), and the sum is rounded to ``dtype`` with round-to-nearest-even.
    """
    a, b = np.asarray(a), np.asarray(b)
    _check_same_shape(a, b)
    dtype = np.dtype(a.dtype if dtype is None else dtype)
    a32 = a.astype(dtype).astype(np.float32)
    b32 = b.astype(dtype).astype(np.float32)
    return (a32 + b32).astype(dtype)
