"""A small NKI kernel for the harness-like scripts: out = a.T @ b, tiled over the free dim."""

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def tiny_matmul(a, b):
    K, M = a.shape
    _, N = b.shape
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.hbm)
    a_sb = nl.load(a)
    for n in nl.affine_range(N // 128):
        b_sb = nl.load(b[:, n * 128:(n + 1) * 128])
        ps = nl.zeros((M, 128), dtype=nl.float32, buffer=nl.psum)
        ps += nisa.nc_matmul(a_sb, b_sb)
        res = nl.copy(ps, dtype=nl.float32)
        nl.store(out[:, n * 128:(n + 1) * 128], value=res)
    return out
