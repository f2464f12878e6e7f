"""Tensors on nkisim: creation ops, memory ops, HBM views, assignment, poisoned memory, aliasing.

Truth: NumPy semantics and the rules of nki-reference §1.2, §1.5–§1.7, §1.11.
"""

import re

import ml_dtypes
import numpy as np
import pytest

from nkisim import NKIWarning
from nkisim import beta1 as nki
from nkisim.beta1 import compiler as ncc
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = [np.float32, np.float16, BF16]
RNG = np.random.default_rng(1234)


def rand(shape, dtype=np.float32, lo=-4.0, hi=4.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32).astype(dtype)


def hbm_out(shape, dtype):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)


# ---------------------------------------------------------------------------------------------
# creation ops


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [np.int32, np.uint8, np.int16])
def test_zeros_ones_full(dtype):
    @nki.jit
    def kernel():
        z = nl.zeros((128, 6), dtype=dtype)
        o = nl.ones((128, 6), dtype=dtype, buffer=nl.sbuf)
        f = nl.full((128, 6), 3, dtype=dtype)
        outs = []
        for t in (z, o, f):
            out = hbm_out(t.shape, t.dtype)
            nl.store(out, t)
            outs.append(out)
        return tuple(outs)

    z, o, f = nki.simulate_kernel(kernel)
    for arr, val in ((z, 0), (o, 1), (f, 3)):
        assert arr.dtype == np.dtype(dtype)
        assert arr.shape == (128, 6)
        np.testing.assert_array_equal(arr.astype(np.float64), np.full((128, 6), val, np.float64))


def test_full_rounds_fill_value_to_dtype():
    # 1 + 2**-8 is halfway between two bf16 values: RNE gives 1.0 (ref §1.3 rounding)
    @nki.jit
    def kernel():
        f = nl.full((4, 4), 1.0 + 2.0**-8, dtype=nl.bfloat16)
        out = hbm_out((4, 4), nl.bfloat16)
        nl.store(out, f)
        return out

    out = nki.simulate_kernel(kernel)
    assert out.dtype == BF16
    np.testing.assert_array_equal(out.astype(np.float32), np.ones((4, 4), np.float32))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [np.int32])
def test_zeros_like_and_empty_like(dtype):
    a = rand((32, 8), dtype) if dtype != np.int32 else np.arange(256, dtype=np.int32).reshape(32, 8)

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        z = nl.zeros_like(t)
        e = nl.empty_like(t)
        assert z.shape == e.shape == (32, 8)
        assert z.dtype == e.dtype == np.dtype(dtype)
        assert z.buffer == e.buffer == "sbuf"
        e[...] = t                       # empty_like gives storage to fill
        zf = nl.zeros_like(t, dtype=nl.float32)
        assert zf.dtype == np.dtype(np.float32)
        h = nl.empty_like(a, buffer=nl.hbm)
        assert h.buffer == "hbm" and h.shape == a.shape
        out1, out2 = hbm_out(a.shape, a.dtype), hbm_out(a.shape, nl.float32)
        nl.store(out1, e)
        nl.store(out2, zf)
        return out1, out2

    e, zf = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(e, a)
    np.testing.assert_array_equal(zf, np.zeros((32, 8), np.float32))


def test_ndarray_is_poisoned_and_read_raises_naming_tensor_and_region():
    a = rand((8, 16))

    @nki.jit
    def kernel(a):
        t = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        t[0:3, :] = nl.load(a[0:3, :])
        t[3:8, 0:10] = nl.load(a[3:8, 0:10])
        out = hbm_out((8, 16), nl.float32)
        nl.store(out, t)
        return out

    # part of the output is garbage: a warning naming the read (nkisim.checks.check_outputs)
    with pytest.warns(NKIWarning) as ws:
        out = nki.simulate_kernel(kernel, a)
    assert re.search(
        r"read of uninitialized memory: 'store' at test_tensors\.py:\d+ reads "
        r"`t\[3:8, 10:16\]` \(30 of 128 elements never written\)\.", str(ws[0].message)), \
        str(ws[0].message)
    assert np.isnan(out[3:8, 10:16]).all() and np.array_equal(out[3:8, 0:10], a[3:8, 0:10])


def test_ndarray_poison_values_nan_for_floats_sentinel_for_ints():
    # with the uninitialized-read check off, the poison itself is visible (ref §4.2 sentinels)
    @nki.jit
    def kernel():
        f = nl.ndarray((4, 4), dtype=nl.float32)
        i = nl.ndarray((4, 4), dtype=nl.int32)
        b = nl.ndarray((4, 4), dtype=nl.bfloat16)
        outs = []
        for t in (f, i, b):
            o = hbm_out(t.shape, t.dtype)
            nl.store(o, t)
            outs.append(o)
        return tuple(outs)

    from nkisim.runtime import simulate
    f, i, b = simulate(kernel, (), {}, checks_spec="-uninit")
    assert np.isnan(f).all()
    assert np.isnan(b.astype(np.float32)).all()
    np.testing.assert_array_equal(i, np.full((4, 4), 4, np.int32))


def test_uninitialized_read_of_hbm_output_region():
    @nki.jit
    def kernel():
        h = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.hbm)
        t = nl.load(h[0:2, 2:6])
        out = hbm_out((2, 4), nl.float32)
        nl.store(out, t)
        return out

    with pytest.raises(ValueError, match=r"reads `h\[0:2, 2:6\]` \(8 of 8 elements never "
                                         r"written\)") as ei:
        nki.simulate_kernel(kernel)
    assert ei.value.nki_code == "nkisim_uninitialized_read"


# ---------------------------------------------------------------------------------------------
# load / store / copy / load_transpose2d / broadcast_to


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [np.int32, np.uint16])
def test_load_store_roundtrip(dtype):
    a = (rand((128, 40)) * 10).astype(dtype)

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        assert t.shape == (128, 40) and t.dtype == np.dtype(dtype) and t.buffer == "sbuf"
        out = hbm_out(a.shape, a.dtype)
        nl.store(out, value=t)
        return out

    out = nki.simulate_kernel(kernel, a)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, a)


def test_load_of_1d_vector_is_a_partition_column():
    a = rand((100,))

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        assert t.shape == (100, 1)
        out = hbm_out(a.shape, a.dtype)
        nl.store(out, t)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a)


def test_load_with_dtype_casts_rne():
    a = np.array([[1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8), 3.14159265]], np.float32)

    @nki.jit
    def kernel(a):
        t = nl.load(a, dtype=nl.bfloat16)
        assert t.dtype == BF16
        out = hbm_out(a.shape, nl.bfloat16)
        nl.store(out, t)
        return out

    out = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(out, a.astype(BF16))
    np.testing.assert_array_equal(out.astype(np.float32)[0, :3],
                                  [1.0, 1.0 + 2.0**-6, -1.0])


def test_store_casts_to_destination_dtype():
    a = rand((16, 16))

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        out = hbm_out(a.shape, nl.float16)
        nl.store(out, t)
        return out

    out = nki.simulate_kernel(kernel, a)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, a.astype(np.float16))


def test_store_from_psum_tile():
    a = rand((64, 32))

    @nki.jit
    def kernel(a):
        p = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.psum)
        p[...] = nl.load(a)
        out = hbm_out(a.shape, a.dtype)
        nl.store(out, p)                 # "an extra copy will be performed" (ref §1.7)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_copy_with_and_without_dtype(dtype):
    a = rand((32, 24))

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        c = nl.copy(t)
        assert c.dtype == np.dtype(np.float32) and c.buffer == "sbuf"
        d = nl.copy(t, dtype=dtype)
        assert d.dtype == np.dtype(dtype)
        o1, o2 = hbm_out(a.shape, a.dtype), hbm_out(a.shape, dtype)
        nl.store(o1, c)
        nl.store(o2, d)
        return o1, o2

    c, d = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(c, a)
    np.testing.assert_array_equal(d, a.astype(dtype))


def test_copy_from_psum_evacuates_to_sbuf():
    a = rand((64, 48))

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        p = nisa.nc_transpose(t)
        assert p.buffer == "psum"
        s = nl.copy(p, dtype=nl.bfloat16)
        assert s.buffer == "sbuf" and s.shape == (48, 64)
        out = hbm_out((48, 64), nl.bfloat16)
        nl.store(out, s)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a.T.astype(BF16))


@pytest.mark.parametrize("shape", [(128, 64), (37, 5), (1, 9)])
def test_load_transpose2d(shape):
    a = rand(shape)

    @nki.jit
    def kernel(a):
        t = nl.load_transpose2d(a)
        assert t.shape == (shape[1], shape[0])
        out = hbm_out(t.shape, a.dtype)
        nl.store(out, t)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a.T)


def test_load_transpose2d_with_dtype():
    a = rand((16, 8))

    @nki.jit
    def kernel(a):
        t = nl.load_transpose2d(a, dtype=nl.float16)
        out = hbm_out(t.shape, t.dtype)
        nl.store(out, t)
        return out

    out = nki.simulate_kernel(kernel, a)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, a.T.astype(np.float16))


@pytest.mark.parametrize("src_shape,dst_shape", [((64, 1), (64, 10)), ((1, 10), (64, 10)),
                                                 ((1, 1), (128, 3)), ((8, 1, 4), (8, 5, 4))])
def test_broadcast_to(src_shape, dst_shape):
    a = rand(src_shape)

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        b = nl.broadcast_to(t, shape=dst_shape)
        c = t.broadcast_to(dst_shape)          # the tensor method (ref §1.2)
        assert b.shape == c.shape == dst_shape
        o1, o2 = hbm_out(dst_shape, a.dtype), hbm_out(dst_shape, a.dtype)
        nl.store(o1, b)
        nl.store(o2, c)
        return o1, o2

    b, c = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(b, np.broadcast_to(a, dst_shape))
    np.testing.assert_array_equal(c, np.broadcast_to(a, dst_shape))


# ---------------------------------------------------------------------------------------------
# HBM tensors: linear memory, reshape views, slicing


def test_hbm_reshape_view_and_slicing():
    a = np.arange(1024, dtype=np.float32)

    @nki.jit
    def kernel(a):
        a2 = a.reshape((8, 128))
        assert a2.shape == (8, 128)
        out = nl.ndarray((8, 128), dtype=a.dtype, buffer=nl.hbm)
        t = nl.load(a2[2:4, 64:128])
        nl.store(out[0:2, 0:64], t)
        t2 = nl.load(a2[0:8, 0:64])
        nl.store(out[0:8, 64:128], t2)
        u = nl.load(a2[2:8, 0:64])
        nl.store(out[2:8, 0:64], u)
        return out.reshape(a.shape)

    out = nki.simulate_kernel(kernel, a)
    A = a.reshape(8, 128)
    ref = np.empty((8, 128), np.float32)
    ref[0:2, 0:64] = A[2:4, 64:128]
    ref[:, 64:128] = A[:, 0:64]
    ref[2:8, 0:64] = A[2:8, 0:64]
    assert out.shape == (1024,)
    np.testing.assert_array_equal(out, ref.reshape(-1))


def test_hbm_reshape_writes_through_to_base_tensor():
    a = rand((4, 6))

    @nki.jit
    def kernel(a):
        out = nl.ndarray((24,), dtype=a.dtype, buffer=nl.shared_hbm)
        view = out.reshape((4, 6))
        nl.store(view, nl.load(a))
        return out                        # returning the base sees the writes to the view

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a.reshape(-1))


def test_hbm_3d_reshape_integer_index():
    a = np.arange(2 * 128 * 4, dtype=np.float32)

    @nki.jit
    def kernel(a):
        a3 = a.reshape((2, 128, 4))
        out = nl.ndarray((2, 128, 4), dtype=a.dtype, buffer=nl.hbm)
        for m in nl.affine_range(2):
            t = nl.load(a3[m])
            assert t.shape == (128, 4)
            nl.store(out[m], value=nl.multiply(t, 2.0))
        return out.reshape((1024,))

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), 2 * a)


def test_tensor_properties():
    a = np.zeros((4, 6), np.float16)

    @nki.jit
    def kernel(a):
        assert a.shape == (4, 6) and a.ndim == 2 and a.itemsize == 2
        assert a.dtype == np.float16 and a.buffer == "hbm"
        t = nl.load(a)
        assert t.assert_shape((4, 6)) is t
        e = t.expand_dims(1)
        assert e.shape == (4, 1, 6)
        out = hbm_out(a.shape, a.dtype)
        nl.store(out, t)
        return out

    nki.simulate_kernel(kernel, a)


def test_astype_copies_with_cast():
    a = rand((8, 8))

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        h = t.astype(nl.float16)
        assert h.dtype == np.float16 and h is not t
        out = hbm_out(a.shape, nl.float16)
        nl.store(out, h)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a.astype(np.float16))


def test_tensor_view_reinterprets_bits():
    a = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)

    @nki.jit
    def kernel(a):
        t = nl.load(a)
        bits = t.view(nl.int32)
        assert bits.dtype == np.int32
        out = hbm_out(a.shape, nl.int32)
        nl.store(out, bits)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a.view(np.int32))


# ---------------------------------------------------------------------------------------------
# assignment: `var[...] = op(...)` writes into var; `var = op(...)` rebinds


def test_subscript_assignment_writes_into_existing_tile():
    a = rand((16, 8))

    @nki.jit
    def kernel(a):
        t = nl.zeros((16, 8), dtype=nl.float32)
        alias = t
        t[...] = nl.load(a)
        assert t is alias
        out = hbm_out(a.shape, a.dtype)
        nl.store(out, alias)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a)


def test_plain_assignment_rebinds_and_leaves_old_tile():
    a = rand((16, 8))

    @nki.jit
    def kernel(a):
        t = nl.zeros((16, 8), dtype=nl.float32)
        alias = t
        t = nl.load(a)
        assert t is not alias
        o1, o2 = hbm_out(a.shape, a.dtype), hbm_out(a.shape, a.dtype)
        nl.store(o1, alias)
        nl.store(o2, t)
        return o1, o2

    old, new = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(old, np.zeros((16, 8), np.float32))
    np.testing.assert_array_equal(new, a)


def test_subscript_assignment_of_isa_result_into_slice_and_cast():
    a = rand((16, 8))

    @nki.jit
    def kernel(a):
        t = nl.zeros((16, 16), dtype=nl.bfloat16)
        x = nl.load(a)
        t[:, 8:16] = nisa.tensor_scalar(x, nl.multiply, 3.0)
        out = hbm_out((16, 16), nl.bfloat16)
        nl.store(out, t)
        return out

    out = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(out[:, :8].astype(np.float32), 0)
    np.testing.assert_array_equal(out[:, 8:], (a * np.float32(3)).astype(BF16))


@pytest.mark.parametrize("src_shape", [(32, 1), (1, 12), (1, 1)])
def test_assignment_broadcasts_source_to_destination(src_shape):
    a = rand(src_shape)

    @nki.jit
    def kernel(a):
        t = nl.ndarray((32, 12), dtype=nl.float32)
        t[...] = nl.load(a)
        out = hbm_out((32, 12), nl.float32)
        nl.store(out, t)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a),
                                  np.broadcast_to(a, (32, 12)))


@pytest.mark.parametrize("value,dtype", [(2.5, np.float32), (7, np.int32), (-1.25, BF16)])
def test_assignment_of_scalar_fills(value, dtype):
    @nki.jit
    def kernel():
        t = nl.ndarray((8, 4), dtype=dtype)
        t[...] = value
        t[0:2, 0:1] = 0
        out = hbm_out((8, 4), dtype)
        nl.store(out, t)
        return out

    ref = np.full((8, 4), value, np.float64)
    ref[0:2, 0:1] = 0
    out = nki.simulate_kernel(kernel)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.astype(np.float64), ref)


def test_tile_to_tile_assignment_copies_values_with_cast():
    a = rand((8, 8))

    @nki.jit
    def kernel(a):
        src = nl.load(a)
        dst = nl.ndarray((8, 8), dtype=nl.float16)
        dst[...] = src
        out = hbm_out((8, 8), nl.float16)
        nl.store(out, dst)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a.astype(np.float16))


def test_iadd_on_sbuf_tile_in_sequential_loop():
    a = rand((8, 8))

    @nki.jit
    def kernel(a):
        acc = nl.zeros((8, 8), dtype=nl.float32)
        x = nl.load(a)
        for _ in nl.sequential_range(3):
            acc += x
        out = hbm_out((8, 8), nl.float32)
        nl.store(out, acc)
        return out

    np.testing.assert_allclose(nki.simulate_kernel(kernel, a), 3 * a, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# direct allocation: real storage at SBUF addresses


def test_direct_allocation_with_distinct_addresses_is_independent():
    a, b = rand((128, 8)), rand((128, 8))

    @nki.jit
    def kernel(a, b):
        x = nl.ndarray((128, 8), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        y = nl.ndarray((128, 8), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=32))
        x[...] = nl.load(a)
        y[...] = nl.load(b)
        o1, o2 = hbm_out(a.shape, a.dtype), hbm_out(a.shape, a.dtype)
        nl.store(o1, x)
        nl.store(o2, y)
        return o1, o2

    x, y = nki.simulate_kernel(kernel, a, b)
    np.testing.assert_array_equal(x, a)
    np.testing.assert_array_equal(y, b)


def test_direct_allocation_overlapping_addresses_share_storage():
    # x occupies bytes [0, 32) of each partition, y bytes [16, 48): x[:, 4:8] is y[:, 0:4]
    a, b = rand((128, 8)), rand((128, 8))

    @nki.jit
    def kernel(a, b):
        x = nl.ndarray((128, 8), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        y = nl.ndarray((128, 8), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=16))
        x[...] = nl.load(a)
        y[...] = nl.load(b)             # overwrites the upper half of x
        out = hbm_out(a.shape, a.dtype)
        nl.store(out, x)
        return out

    out = nki.simulate_kernel(kernel, a, b)
    np.testing.assert_array_equal(out[:, :4], a[:, :4])
    np.testing.assert_array_equal(out[:, 4:], b[:, :4])


def test_direct_allocation_aliasing_reinterprets_bytes_across_dtypes():
    a = rand((64, 4))
    ib = np.arange(64 * 4, dtype=np.int32).reshape(64, 4)

    @nki.jit
    def kernel(a, ib):
        f = nl.ndarray((64, 4), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=128))
        i = nl.ndarray((64, 4), dtype=nl.int32, buffer=ncc.sbuf.mod_alloc(base_addr=128))
        f[...] = nl.load(a)
        i[...] = nl.load(ib)
        out = hbm_out((64, 4), nl.float32)
        nl.store(out, f)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a, ib), ib.view(np.float32))


def test_mod_alloc_block_tiles_map_modulo_num_free_tiles():
    # (4, par_dim(128), 2) with num_free_tiles=(2,): logical tiles 0 and 2 share a physical tile
    a = rand((4, 128, 2))

    @nki.jit
    def kernel(a):
        t = nl.ndarray((4, nl.par_dim(128), 2), dtype=nl.float32,
                       buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)))
        for m in nl.sequential_range(4):
            t[m] = nl.load(a[m])
        out = nl.ndarray((4, 128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        for m in nl.sequential_range(4):
            nl.store(out[m], value=t[m])
        return out

    with pytest.warns(NKIWarning, match="warn_block_dimension_is_deprecated"):
        out = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(out[2:], a[2:])
    np.testing.assert_array_equal(out[:2], a[2:])   # tiles 0, 1 were overwritten by 2, 3


def test_psum_direct_allocation():
    a = rand((32, 16))

    @nki.jit
    def kernel(a):
        p = nl.ndarray((16, 32), dtype=nl.float32, buffer=ncc.psum.mod_alloc(base_addr=0))
        p[...] = nl.load_transpose2d(a)
        out = hbm_out((16, 32), nl.float32)
        nl.store(out, p)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a.T)


def test_auto_alloc_is_the_default_buffer():
    assert ncc.sbuf.auto_alloc() is nl.sbuf
    assert ncc.psum.auto_alloc() is nl.psum
    assert nl.hbm.kind == nl.private_hbm.kind == nl.shared_hbm.kind == "hbm"


def test_reshape_nocopy_is_a_view_or_an_error_without_deprecated_numpy_calls():
    # NumPy 2.5 deprecates setting an array's shape, which the no-copy reshape used
    import warnings

    from nkisim.tensor import reshape_nocopy
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = reshape_nocopy(a, (2, 12))
        assert np.shares_memory(v, a) and v.shape == (2, 12)
        with pytest.raises((ValueError, AttributeError)):
            reshape_nocopy(a[:, 0:3], (12,))          # would need a copy
