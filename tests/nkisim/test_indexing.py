"""Indexing on nkisim: ints, slices, strided slices, nl.ds, arange/mgrid affine expressions, masks.

Truth: NumPy indexing of the same arrays, and nki-reference §1.5 (basic vs advanced indexing,
index expressions with broadcasting, the maxpool 5-D index example) and §1.12 (masks).
"""

import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl

RNG = np.random.default_rng(7)


def hbm_out(shape, dtype=np.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)


def a2d(p=16, f=24):
    return np.arange(p * f, dtype=np.float32).reshape(p, f)


def run_load(index_fn, a, out_shape):
    """Load ``a[index_fn(a)]`` into SBUF and store it back to a fresh HBM tensor."""
    @nki.jit
    def kernel(a):
        t = nl.load(index_fn(a))
        assert t.shape == out_shape, t.shape
        out = hbm_out(out_shape, a.dtype)
        nl.store(out, t)
        return out
    return nki.simulate_kernel(kernel, a)


# ---------------------------------------------------------------------------------------------
# basic indexing


@pytest.mark.parametrize("key,shape", [
    ((slice(0, 16), slice(0, 24)), (16, 24)),
    ((slice(3, 9), slice(5, 20)), (6, 15)),
    ((slice(None), slice(4, None)), (16, 20)),
    ((Ellipsis,), (16, 24)),
    ((slice(0, 16), slice(0, 24, 2)), (16, 12)),      # strided 0:n:2
    ((slice(2, 16, 3), slice(1, 24, 5)), (5, 5)),
    ((slice(0, 16), 5), (16,)),                         # int index drops the free dim
])
def test_basic_indexing_matches_numpy(key, shape):
    a = a2d()
    out = run_load(lambda t: t[key], a, shape if len(shape) == 2 else (shape[0], 1))
    np.testing.assert_array_equal(out, a[key].reshape(out.shape))


def test_integer_index_on_leading_dim_gives_a_tile():
    a = np.arange(3 * 8 * 5, dtype=np.float32).reshape(3, 8, 5)
    out = run_load(lambda t: t[1], a, (8, 5))
    np.testing.assert_array_equal(out, a[1])
    out = run_load(lambda t: t[2, :, 1:4], a, (8, 3))
    np.testing.assert_array_equal(out, a[2, :, 1:4])


def test_ds_with_loop_variables():
    a = a2d(16, 32)

    @nki.jit
    def kernel(a):
        out = hbm_out((16, 32))
        for i in nl.affine_range(2):
            for j in nl.affine_range(4):
                t = nl.load(a[nl.ds(i * 8, 8), nl.ds(j * 8, 8)])
                assert t.shape == (8, 8)
                nl.store(out[nl.ds(i * 8, 8), nl.ds(j * 8, 8)], nl.add(t, 1.0))
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a + 1)


def test_ds_equals_slice():
    d = nl.ds(5, 3)
    assert d.as_slice() == slice(5, 8, 1)


def test_slicing_sbuf_tile_views_write_through():
    a = a2d(8, 8)

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        t[0:4, 0:8:2] = nl.multiply(t[0:4, 0:8:2], -1.0)
        out = hbm_out((8, 8))
        nl.store(out, t)
        return out

    ref = a.copy()
    ref[0:4, 0:8:2] *= -1
    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), ref)


def test_fewer_indices_than_dims_keeps_trailing_dims():
    a = np.arange(2 * 4 * 6, dtype=np.float32).reshape(2, 4, 6)
    out = run_load(lambda t: t[1, 0:3], a, (3, 6))
    np.testing.assert_array_equal(out, a[1, 0:3])


# ---------------------------------------------------------------------------------------------
# advanced indexing: affine index expressions


def test_arange_index_expressions_even_and_odd_columns():
    a = a2d(16, 24)

    @nki.jit
    def kernel(a):
        i_p = nl.arange(16)[:, None]
        i_f = nl.arange(12)[None, :]
        even = nl.load(a[i_p, 2 * i_f])
        odd = nl.load(a[i_p, 2 * i_f + 1])
        assert even.shape == odd.shape == (16, 12)
        o1, o2 = hbm_out((16, 12)), hbm_out((16, 12))
        nl.store(o1[i_p, i_f], even)
        nl.store(o2, odd)
        return o1, o2

    even, odd = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(even, a[:, 0::2])
    np.testing.assert_array_equal(odd, a[:, 1::2])


def test_arange_with_start_and_loop_variable_offsets():
    a = a2d(16, 24)

    @nki.jit
    def kernel(a):
        out = hbm_out((16, 24))
        i_p = nl.arange(8)[:, None]
        i_f = nl.arange(2, 8)[None, :]        # arange(start, stop)
        for k in nl.affine_range(2):
            for c in nl.affine_range(4):
                t = nl.load(a[k * 8 + i_p, c * 6 + i_f - 2])
                nl.store(out[k * 8 + i_p, c * 6 + i_f - 2], t)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a)


def test_mgrid_unpack_and_attributes():
    a = a2d(16, 24)

    @nki.jit
    def kernel(a):
        i_p, i_f = nl.mgrid[0:16, 0:8]
        g = nl.mgrid[0:16, 0:8]
        t1 = nl.load(a[i_p, i_f + 8])
        t2 = nl.load(a[g.p, g.x + 16])
        o1, o2 = hbm_out((16, 8)), hbm_out((16, 8))
        nl.store(o1, t1)
        nl.store(o2, t2)
        return o1, o2

    t1, t2 = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(t1, a[:, 8:16])
    np.testing.assert_array_equal(t2, a[:, 16:24])


def test_mgrid_matches_numpy_mgrid_and_y_attribute():
    g = nl.mgrid[0:2, 1:4, 0:6:2]
    ref = np.mgrid[0:2, 1:4, 0:6:2]
    for i in range(3):
        np.testing.assert_array_equal(g[i].v, ref[i])
    np.testing.assert_array_equal(g.y.v, ref[2])


def test_f1_f2_transpose_with_three_index_arrays_on_2d_tile():
    # out[i_p0, i_f2*sz_f1 + i_f1] = copy(in[i_p0, i_f1*sz_f2 + i_f2])   (ref §1.5)
    sz_p, sz_f1, sz_f2 = 8, 3, 5
    a = np.arange(sz_p * sz_f1 * sz_f2, dtype=np.float32).reshape(sz_p, sz_f1 * sz_f2)

    @nki.jit
    def kernel(a):
        i_p0 = nl.arange(sz_p)[:, None, None]
        i_f1 = nl.arange(sz_f1)[None, :, None]
        i_f2 = nl.arange(sz_f2)[None, None, :]
        in_tile = nl.load(a)
        out_tile = nl.ndarray((sz_p, sz_f2 * sz_f1), dtype=a.dtype)
        out_tile[i_p0, i_f2 * sz_f1 + i_f1] = nl.copy(in_tile[i_p0, i_f1 * sz_f2 + i_f2])
        out = hbm_out((sz_p, sz_f2 * sz_f1))
        nl.store(out, out_tile)
        return out

    ref = a.reshape(sz_p, sz_f1, sz_f2).transpose(0, 2, 1).reshape(sz_p, -1)
    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), ref)


@pytest.mark.parametrize("pool", [2, 3])
def test_maxpool_five_d_index_on_three_d_tile(pool):
    # the official example: nl.max(in_tile[i_0, P*i_1+i_2, P*i_3+i_4], axis=[2, 4])
    C, H, W = 16, 3 * pool, 4 * pool
    x = RNG.standard_normal((C, H, W)).astype(np.float32)

    @nki.jit
    def kernel(x):
        in_tile = nl.load(x)
        i_0 = nl.arange(C)[:, None, None, None, None]
        i_1 = nl.arange(H // pool)[None, :, None, None, None]
        i_2 = nl.arange(pool)[None, None, :, None, None]
        i_3 = nl.arange(W // pool)[None, None, None, :, None]
        i_4 = nl.arange(pool)[None, None, None, None, :]
        out_tile = nl.max(in_tile[i_0, pool * i_1 + i_2, pool * i_3 + i_4], axis=[2, 4])
        assert out_tile.shape == (C, H // pool, W // pool)
        out = hbm_out((C, H // pool, W // pool))
        nl.store(out, out_tile)
        return out

    ref = x.reshape(C, H // pool, pool, W // pool, pool).max(axis=(2, 4))
    np.testing.assert_array_equal(nki.simulate_kernel(kernel, x), ref)


def test_index_expression_arithmetic():
    i = nl.arange(4)[:, None]
    j = nl.arange(3)[None, :]
    e = 3 * i - j + 2
    np.testing.assert_array_equal(e.v, 3 * np.arange(4)[:, None] - np.arange(3)[None, :] + 2)
    assert e.shape == (4, 3)
    np.testing.assert_array_equal((i * 2 + 1 - 1).v, np.arange(4)[:, None] * 2)
    np.testing.assert_array_equal((-i).v, -np.arange(4)[:, None])


def test_program_id_in_index_expression():
    a = a2d(16, 8)

    @nki.jit
    def kernel(a):
        out = nl.ndarray((16, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        i_p, i_f = nl.mgrid[0:4, 0:8]
        t = nl.load(a[pid * 4 + i_p, i_f])
        nl.store(out[pid * 4 + i_p, i_f], nl.add(t, pid))
        return out

    ref = a + np.repeat(np.arange(4), 4)[:, None]
    np.testing.assert_array_equal(nki.simulate_kernel(kernel[4], a), ref)


# ---------------------------------------------------------------------------------------------
# masks (ref §1.12)


def test_mask_on_store_limits_the_region():
    # store of a [0:16, 0:16] index range into an [8, 12] tensor is legal with a mask that keeps
    # the access in bounds (ref §1.12: "masks prevent OOB errors")
    a = RNG.standard_normal((16, 16)).astype(np.float32)

    @nki.jit
    def kernel(a):
        out = nl.ndarray((8, 12), dtype=a.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:16, 0:16]
        t = nl.load(a[i_p, i_f])
        nl.store(out[i_p, i_f], t, mask=(i_p < 8) & (i_f < 12))
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a[:8, :12])


def test_mask_on_compute_leaves_masked_out_elements_untouched():
    a = RNG.standard_normal((8, 8)).astype(np.float32)

    @nki.jit
    def kernel(a):
        i_p = nl.arange(8)[:, None]
        i_f = nl.arange(8)[None, :]
        t = nl.load(a)
        res = nl.ndarray((8, 8), dtype=nl.float32)
        res[...] = t
        res[i_p, i_f] = nl.exp(t, mask=(i_p < 4) & (i_f >= 2))
        out = hbm_out((8, 8))
        nl.store(out, res)
        return out

    out = nki.simulate_kernel(kernel, a)
    ref = a.copy()
    ref[:4, 2:] = np.exp(a[:4, 2:])
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_mask_with_loop_variable_tail():
    # the classic tail mask: last tile of a length-20 dim processed in tiles of 8
    a = RNG.standard_normal((20, 4)).astype(np.float32)

    @nki.jit
    def kernel(a):
        out = nl.ndarray((20, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:8, 0:4]
        for t in nl.affine_range(3):
            tile = nl.load(a[t * 8 + i_p, i_f], mask=(t * 8 + i_p < 20))
            nl.store(out[t * 8 + i_p, i_f], nl.multiply(tile, 2.0, mask=(t * 8 + i_p < 20)),
                     mask=(t * 8 + i_p < 20))
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), 2 * a)


def test_affine_select_with_mgrid_predicate():
    a = RNG.standard_normal((8, 8)).astype(np.float32)

    @nki.jit
    def kernel(a):
        ix, iy = nl.mgrid[0:8, 0:8]
        t = nl.load(a)
        r = nisa.affine_select(pred=(iy < ix), on_true_tile=t, on_false_value=nl.fp32.min)
        out = hbm_out((8, 8))
        nl.store(out, r)
        return out

    out = nki.simulate_kernel(kernel, a)
    ref = np.where(np.tril(np.ones((8, 8), bool), -1), a, np.finfo(np.float32).min)
    np.testing.assert_array_equal(out, ref)


# ---------------------------------------------------------------------------------------------
# rectangular index expressions are basic views (nkisim.indexing._as_slices)


@pytest.mark.parametrize("make, want", [
    (lambda i: (i.p, i.x), (slice(0, 8, 1), slice(0, 12, 1))),                          # mgrid
    (lambda i: (3 + i.p, 2 * i.x + 1), (slice(3, 11, 1), slice(1, 24, 2))),
    (lambda i: (nl.arange(8)[:, None], nl.arange(12)[None, :]), (slice(0, 8, 1), slice(0, 12, 1))),
])
def test_rectangular_index_expressions_select_what_slices_select(make, want):
    """`t[k * 128 + i.p, i.x]` (AWS's tutorials) picks a rectangle: the same elements in the
    same order as the slice key (NumPy's advanced indexing is the truth), and nkisim serves it
    as a view."""
    from nkisim.indexing import normalize_key
    i = nl.mgrid[0:8, 0:12]
    key = make(i)
    a = np.arange(16 * 24).reshape(16, 24)
    kind, norm = normalize_key(key, a.shape, "a")
    assert kind == "basic" and norm == want
    np.testing.assert_array_equal(a[norm], a[tuple(k.v for k in key)])


@pytest.mark.parametrize("make", [
    lambda i: (i.x, i.p),                         # transposing: partition index on axis 1
    lambda i: (i.p, i.p),                         # diagonal
    lambda i: (i.p + i.x, i.x),                   # skewed
    lambda i: (nl.arange(8)[:, None], 5 + 0 * nl.arange(12)[None, :]),
])
def test_other_index_expressions_stay_advanced(make):
    from nkisim.indexing import normalize_key
    key = make(nl.mgrid[0:8, 0:12])
    kind, norm = normalize_key(key, (32, 32), "a")
    assert kind == "advanced"
    a = np.arange(32 * 32).reshape(32, 32)
    np.testing.assert_array_equal(a[norm], a[tuple(k.v for k in key)])


@pytest.mark.filterwarnings("ignore:NKI rule the device tolerates.*block dimensions")
def test_mgrid_indexed_block_tile_round_trip():
    """AWS's matmul tutorial (hoist_load) stores loads into `tiles[k, i.p, i.x]` of a block
    tile and reads them back the same way: values as NumPy computes them."""
    a = RNG.random((256, 64), dtype=np.float32)

    @nki.jit
    def kernel(a):
        out = hbm_out((256, 64))
        i = nl.mgrid[0:128, 0:64]
        tiles = nl.ndarray((2, nl.par_dim(128), 64), dtype=nl.float32, buffer=nl.sbuf)
        for k in nl.affine_range(2):
            tiles[k, i.p, i.x] = nl.load(a[k * 128 + i.p, i.x])
        for k in nl.affine_range(2):
            nl.store(out[k * 128 + i.p, i.x], value=nl.multiply(tiles[k, i.p, i.x], 2.0))
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), 2 * a)


def test_a_derived_expressions_form_is_the_one_its_values_have():
    """IndexExpr.form() is computed once per expression and carried through `+ - *` with an int
    and negation (issue 12: a course conv2d re-analysed its 128x444 mgrid grids on every
    index). The carried form must be what a pass over the values finds, the bounds their min
    and max, and a key of such expressions must select what NumPy's advanced indexing selects."""
    from nkisim.indexing import _affine_form, normalize_key
    rng = np.random.default_rng(5)
    ops = [lambda e, c: e + c, lambda e, c: c + e, lambda e, c: e - c, lambda e, c: c - e,
           lambda e, c: e * c, lambda e, c: c * e, lambda e, c: -e]
    a = np.arange(512 * 512).reshape(512, 512)    # (every key below is in bounds)
    views = 0
    for _ in range(400):
        g = nl.mgrid[0:5, 0:7]
        key = []
        for axis in (0, 1):
            e = g[axis] if rng.random() < 0.8 else g[1 - axis]
            e.form()
            for _ in range(rng.integers(0, 4)):
                e = ops[rng.integers(len(ops))](e, int(rng.integers(-3, 4)))
            assert e._form is not None                  # carried, not computed again
            assert e.form() == _affine_form(e.v)
            assert e.bounds() == (int(e.v.min()), int(e.v.max()))
            key.append(e + 250)
        kind, norm = normalize_key(tuple(key), a.shape, "a")
        views += kind == "basic"
        np.testing.assert_array_equal(a[norm], a[tuple(k.v for k in key)])
    assert views > 40           # (the random keys include rectangles, not only gathers)


def test_index_expressions_that_do_not_broadcast_are_a_one_line_error():
    i_p = lambda: nl.arange(16)[:, None]        # noqa: E731
    i_q = lambda: nl.arange(8)[:, None]         # noqa: E731
    with pytest.raises(ValueError, match=r"indexing `a`: index expressions of shapes \[16, 1\] "
                                         r"and \[8, 1\] do not broadcast together"):
        run_load(lambda a: a[i_p(), i_q()], a2d(), (16, 1))


def test_an_index_tile_of_two_columns_is_named_in_a_one_line_error():
    # one index per partition (nki.errors: `idx_tile[i_p, 0]`); NumPy's broadcast error before
    a = a2d(256, 64)
    idx = np.stack([np.arange(128), np.arange(128)[::-1]], 1).astype(np.int32)

    @nki.jit
    def k(a, idx):
        out = hbm_out((128, 64))
        it = nl.load(idx)
        nl.store(out, nl.load(a[it, nl.arange(64)[None, :]]))
        return out

    with pytest.raises(ValueError, match=r"the index tile `it`\[128, 2\] does not broadcast with "
                                         r"the other indices \(\[1, 64\]\)"):
        nki.simulate_kernel(k, a, idx)

    @nki.jit
    def column(a, idx):
        out = hbm_out((128, 64))
        it = nl.load(idx)
        i_p = nl.arange(128)[:, None]
        nl.store(out, nl.load(a[it[i_p, 1], nl.arange(64)[None, :]]))
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(column, a, idx), a[idx[:, 1]])


@pytest.mark.parametrize("make", [lambda i: (i.p, i.x // 2), lambda i: (i.p, i.x % 4),
                                  lambda i: (i.p, (i.p * i.x) % 16),
                                  lambda i: (i.p, 2 // (i.x + 1))])
def test_an_index_that_is_not_affine_is_an_error(make):
    # "Index represents the result of the affine expression" (Beta 1 programming model);
    # nkisim used to gather NumPy's answer
    from nkisim.indexing import normalize_key
    with pytest.raises(ValueError, match="index of dimension 1 is not affine in the aranges"):
        normalize_key(make(nl.mgrid[0:8, 0:12]), (32, 32), "a")


def test_a_mask_that_is_not_affine_is_the_nki_error():
    # nki.errors, err_unsupported_expression_in_mask: "mask=(i % 4) < 2  # Error: i % 2 is
    # not an affine expression"
    i = nl.arange(8)[None, :]
    with pytest.raises(ValueError, match="NKI mask expressions must be affine"):
        _ = (i % 4) < 2
    assert ((i * 2 + 1) < 5).v.sum() == 2          # (an affine one is a mask)
