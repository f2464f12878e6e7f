"""nc_matmul's product (nkisim.gemm): the scratch buffer of the ``acc += nc_matmul`` path.

The product is checked against ``np.einsum`` (independent of the BLAS calls gemm makes), the
scratch path against the fresh-array path bit for bit, and a pending result that is built into a
tile after all must keep its values when a later matmul reuses the scratch buffer.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nkisim import engines, gemm
from nkisim import tensor as tensor_mod
from nkisim.beta1 import language as nl
from nkisim.beta1 import simulate_kernel


def _operands(rng, K, M, rows, width, pad):
    """A (K, M) stationary slice of a wider tile and a moving operand: (K, width) when rows is
    0, else a (K, rows, width) window of a (K, rows + 1, width + pad) band."""
    a = rng.standard_normal((K, M + 3), dtype=np.float32)[:, 1:M + 1]
    if rows == 0:
        b = rng.standard_normal((K, width + pad), dtype=np.float32)[:, pad:]
        return a, b, (M, width)
    band = rng.standard_normal((K, rows + 1, width + pad), dtype=np.float32)
    return a, band[:, 1:, pad:], (M,) + (rows, width)


@settings(max_examples=40, deadline=None)
@given(K=st.integers(1, 128), M=st.integers(1, 128), rows=st.integers(0, 3),
       width=st.sampled_from([1, 7, 38, 128, 222]), pad=st.integers(0, 3), seed=st.integers(0, 9))
def test_product_is_the_matrix_product_and_the_scratch_path_is_bit_identical(
        K, M, rows, width, pad, seed):
    a, b, shape = _operands(np.random.default_rng(seed), K, M, rows, width, pad)
    want = np.einsum("km,k...->m...", a.astype(np.float64), b.astype(np.float64))
    fresh = gemm.product(a, b, shape)
    assert fresh.shape == shape and fresh.dtype == np.float32
    np.testing.assert_allclose(fresh, want, rtol=1e-4, atol=1e-4 * np.sqrt(K))
    reused = gemm.product(a, b, shape, reuse=True)
    assert reused is gemm.scratch(shape)
    np.testing.assert_array_equal(reused, fresh)


def test_fresh_products_never_share_the_scratch_buffer():
    a, b, shape = _operands(np.random.default_rng(1), 64, 32, 2, 130, 2)
    s = gemm.product(a, b, shape, reuse=True)
    f = gemm.product(a, b, shape)
    assert f is not s and not np.shares_memory(f, s)


@pytest.mark.parametrize("moving", [(128, 300), (128, 2, 150)])
def test_a_pending_result_built_later_keeps_its_values(moving):
    """Two deferred matmuls of one shape: the second builds the first's result tile before it
    computes into the scratch buffer; the first tile must not be that buffer."""
    rng = np.random.default_rng(3)
    A = rng.standard_normal((128, 64), dtype=np.float32)
    B = rng.standard_normal(moving, dtype=np.float32)
    C = rng.standard_normal(moving, dtype=np.float32)

    def kernel(a, b, c):
        o1 = nl.ndarray((64,) + moving[1:], dtype=nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((64,) + moving[1:], dtype=nl.float32, buffer=nl.shared_hbm)
        at, bt, ct = nl.load(a), nl.load(b), nl.load(c)
        p1 = engines.nc_matmul(at, bt, _defer=True)
        p2 = engines.nc_matmul(at, ct, _defer=True)     # builds p1's tile first
        assert type(p1) is tensor_mod.Tensor and type(p2) is tensor_mod.PendingMatmul
        nl.store(o2, p2)                                # builds p2's tile
        nl.store(o1, p1)
        return o1, o2

    o1, o2 = simulate_kernel(kernel, A, B, C)
    assert not tensor_mod.PENDING
    np.testing.assert_allclose(o1, np.einsum("km,k...->m...", A, B), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(o2, np.einsum("km,k...->m...", A, C), rtol=1e-4, atol=1e-3)
