"""A tile's partitions are indexed by one contiguous run: strides, reversals, broadcasts and
transposes along the partition dimension are errors, in both dialects; HBM rows are free.

Truth: Beta 1 programming model, "Advanced Tensor Indexing": "such flexible indexing is not
supported along the partition dimension" (its Case #2 transposes with nc_transpose); the
current dialect's nki-aps.rst, "Restriction on SBUF/PSUM Tensors": "the access on the
partition dimension must be contiguous ... not allowed because it reads every other
partition". NumPy gives the values of the valid neighbours.
"""

import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim import nki as nki_face
from nkisim.beta1 import language as nl
from nkisim.nki import isa as nisa_c
from nkisim.nki import language as nl_c

A = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)


def beta1(index):
    @nki.jit
    def k(a):
        t = nl.load(a)
        i_p = nl.arange(64)[:, None]
        i_f = nl.arange(64)[None, :]
        u = nl.copy(index(t, i_p, i_f))
        out = nl.ndarray((64, 64), a.dtype, buffer=nl.shared_hbm)
        nl.store(out, u)
        return out
    return nki.simulate_kernel(k, A)


@pytest.mark.parametrize("index, what", [
    (lambda t, i_p, i_f: t[0:128:2, :], r"steps through partitions \(0:128:2\)"),
    (lambda t, i_p, i_f: t[2 * i_p, i_f], r"steps through partitions \(0:127:2\)"),
    (lambda t, i_p, i_f: t[63 - i_p, i_f], "steps through partitions by -1"),
    (lambda t, i_p, i_f: t[0 * i_p, i_f], "reads one partition into many"),
    (lambda t, i_p, i_f: t[i_f, i_p], "picks partitions other than one contiguous run"),
])
def test_beta1_tile_partitions_are_one_contiguous_run(index, what):
    with pytest.raises(ValueError, match=what + ".*flexible indexing is not supported along "
                                              "the partition dimension"):
        beta1(index)


@pytest.mark.parametrize("index, want", [
    (lambda t, i_p, i_f: t[64 + i_p, i_f], A[64:, :]),
    (lambda t, i_p, i_f: t[32:96, 0:64], A[32:96, :]),
    (lambda t, i_p, i_f: t[i_p, 2 * i_f - i_f], A[:64, :]),
])
def test_beta1_contiguous_partitions_with_any_offset_are_fine(index, want):
    np.testing.assert_array_equal(beta1(index), want)


def test_beta1_hbm_rows_take_any_pattern():
    @nki.jit
    def k(a):
        i_p = nl.arange(64)[:, None]
        i_f = nl.arange(64)[None, :]
        out = nl.ndarray((64, 64), a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a[2 * i_p + 1, i_f]))
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(k, A), A[1::2])


@pytest.mark.parametrize("view", [lambda t: t[0:128:2, :], lambda t: t.slice(0, 0, 128, 2)])
def test_current_dialect_views_step_through_partitions_as_ap_does_not(view):
    def body(x):
        t = nl_c.ndarray(x.shape, dtype=x.dtype, buffer=nl_c.sbuf)
        nisa_c.dma_copy(dst=t, src=x)
        r = nl_c.ndarray((64, 64), dtype=x.dtype, buffer=nl_c.sbuf)
        nisa_c.tensor_copy(dst=r, src=view(t))
        out = nl_c.ndarray((64, 64), dtype=x.dtype, buffer=nl_c.shared_hbm)
        nisa_c.dma_copy(dst=out, src=r)
        return out

    with pytest.raises(ValueError, match="steps through partitions"):
        nki_face.simulate(nki_face.jit(body))(A)
