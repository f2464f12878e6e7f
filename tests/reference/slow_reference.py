"""Slow, obviously-correct loop implementations used only to test the golden models.

They follow the course's ``conv_numpy`` / ``maxpool_numpy`` helpers (spec §2): explicit loops,
float64 accumulation, no shared code with ``reference/``.
"""

import numpy as np


def conv2d_loops(X, W, bias):
    """out[b, c, i, j] = sum_{ci, di, dj} X[b, ci, i+di, j+dj] * W[c, ci, di, dj] + bias[c]."""
    X, W, bias = (np.asarray(a, dtype=np.float64) for a in (X, W, bias))
    batch, c_in, h, w = X.shape
    c_out, _, fh, fw = W.shape
    out_h, out_w = h - fh + 1, w - fw + 1
    out = np.zeros((batch, c_out, out_h, out_w))
    for b in range(batch):
        for c in range(c_out):
            for i in range(out_h):
                for j in range(out_w):
                    total = bias[c]
                    for ci in range(c_in):
                        for di in range(fh):
                            for dj in range(fw):
                                total += X[b, ci, i + di, j + dj] * W[c, ci, di, dj]
                    out[b, c, i, j] = total
    return out


def conv2d_fp32_in_order_loops(X, W, bias):
    """The conv as fp32 hardware sums it, one scalar at a time: per tap (di, dj) a sum over the
    input channels in order, every product and partial sum rounded to float32 (a systolic
    array's column); the taps' sums added in order into a float32 accumulator (PSUM); then the
    bias."""
    f32 = np.float32
    X, W, bias = (np.asarray(a, dtype=f32) for a in (X, W, bias))
    batch, c_in, h, w = X.shape
    c_out, _, fh, fw = W.shape
    out = np.zeros((batch, c_out, h - fh + 1, w - fw + 1), dtype=f32)
    for b in range(batch):
        for c in range(c_out):
            for i in range(h - fh + 1):
                for j in range(w - fw + 1):
                    acc = f32(0)
                    for di in range(fh):
                        for dj in range(fw):
                            column = f32(0)
                            for ci in range(c_in):
                                column = f32(column + f32(X[b, ci, i + di, j + dj]
                                                          * W[c, ci, di, dj]))
                            acc = f32(acc + column)
                    out[b, c, i, j] = f32(acc + bias[c])
    return out


def maxpool_loops(y, pool_size):
    """Max over non-overlapping pool_size x pool_size windows, floor mode."""
    batch, channels, h, w = y.shape
    out_h, out_w = 1 + (h - pool_size) // pool_size, 1 + (w - pool_size) // pool_size
    out = np.empty((batch, channels, out_h, out_w), dtype=np.float64)
    for b in range(batch):
        for c in range(channels):
            for i in range(out_h):
                for j in range(out_w):
                    best = -np.inf
                    for u in range(pool_size):
                        for v in range(pool_size):
                            best = max(best, y[b, c, i * pool_size + u, j * pool_size + v])
                    out[b, c, i, j] = best
    return out
