"""Golden models for the Part 1 ``matrix_transpose`` kernel."""

import ml_dtypes  # noqa: F401  (registers bfloat16/float8 so np.dtype("bfloat16") works)
import numpy as np


def _check_matrix(a):
    if a.ndim != 2:
        raise ValueError(f"matrix_transpose: expected a 2-D (M, N) matrix, got shape {a.shape}")


def matrix_transpose(a):
    """Exact transpose ``a.T`` of an (M, N) matrix as a contiguous float64 (N, M) array."""
    a = np.asarray(a)
    _check_matrix(a)
    return np.ascontiguousarray(a.astype(np.float64).T)


def matrix_transpose_baseline(a, dtype=None):
    """Transpose as the hardware computes it: a pure data movement, so exact in ``dtype``.

    The input is rounded to ``dtype`` (default: ``a.dtype``); the result has that dtype.
    """
    a = np.asarray(a)
    _check_matrix(a)
    dtype = np.dtype(a.dtype if dtype is None else dtype)
    return np.ascontiguousarray(a.astype(dtype).T)
