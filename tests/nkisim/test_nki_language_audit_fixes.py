"""Fixes from the audit of ``nki.language`` and ``NkiTensor`` against AWS's NKI 0.6.0 stub
docstrings (nki/api/nki/language/__init__.py of SDK 2.32, quoted in each test), with Beta 1's
documented behaviour kept where its docs (aws-neuron-sdk 1db4d74e nki/api/nki/language/
__init__.py, nki/api/nki/__init__.py) say otherwise. Values against NumPy.
"""

import ml_dtypes
import numpy as np
import pytest

from nkisim import beta1 as b1nki
from nkisim import nki
from nkisim.beta1 import language as b1nl
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl

RNG = np.random.default_rng(11)


def rand(shape, dtype=np.float32):
    return RNG.uniform(-2, 2, size=shape).astype(dtype)


def run(body, *arrays):
    return nki.simulate(nki.jit(body))(*arrays)


def sbuf_of(a):
    """``a`` (an HBM input) in a new SBUF tile."""
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    return t


def out_of(t):
    """A shared_hbm output holding the SBUF/PSUM tile ``t``."""
    if nl.is_psum(t.buffer):
        s = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=t)
        t = s
    o = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o


def apply(fn, *arrays):
    """``fn`` of the inputs' SBUF tiles, returned: (values, the result tile's shape and dtype)."""
    seen = {}

    def k(*hbm):
        r = fn(*[sbuf_of(a) for a in hbm])
        seen["shape"], seen["dtype"] = tuple(r.shape), r.dtype
        return out_of(r)
    got = run(k, *arrays)
    return got, seen["shape"], seen["dtype"]


def b1_out(t):
    """A Beta 1 kernel's output holding the SBUF tile ``t``."""
    o = b1nl.ndarray(t.shape, dtype=t.dtype, buffer=b1nl.shared_hbm)
    b1nl.store(o, t)
    return o


# ---------------------------------------------------------------------------------------------
# A1: negative indices ("Supports integers (select), slices, ``Ellipsis``, negative indices,
# and nl.ds", NkiTensor.__getitem__)

@pytest.mark.parametrize("key", [
    (slice(None), slice(-8, None)), (slice(None), -1), (slice(None), slice(2, -2)),
    (slice(-4, None), slice(None)), (slice(None), slice(-8, -1, 2)), (Ellipsis, -3)])
def test_negative_indices_count_from_the_end_on_chip(key):
    x = rand((128, 64))

    def k(a):
        t = sbuf_of(a)
        v = t[key]
        return out_of(nl.copy(v))
    got = run(k, x)
    want = x[key]
    want = want.reshape(want.shape[0], -1) if want.ndim == 1 else want
    np.testing.assert_array_equal(got, want)


def test_negative_index_on_the_partition_dim_keeps_it():
    # "integer indexing on dim 0 produces a size-1 slice (partition dim is preserved)"
    x = rand((128, 64))
    got, shape, _ = apply(lambda t: nl.copy(t[-1]), x)
    assert shape == (1, 64)
    np.testing.assert_array_equal(got, x[-1:])


def test_negative_index_on_hbm():
    x = rand((4, 8, 16))

    def k(a):
        o = nl.ndarray((8, 16), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=a[-1])
        return o
    np.testing.assert_array_equal(run(k, x), x[-1])


def test_a_negative_bound_still_outside_after_counting_from_the_end_is_out_of_bound():
    def k(a):
        return out_of(nl.copy(sbuf_of(a)[:, -100:]))
    with pytest.raises(IndexError, match="Out-of-bound"):
        run(k, rand((128, 64)))


def test_beta1_negative_slice_is_an_error_not_a_wider_view():
    """Beta 1 (docs silent; loop indices symbolic, so `t[i - 1]` at i = 0 is the index range
    [-1, ...], err_tensor_access_out_of_bound, reference §1.5): `t[:, -8:]` of a 64-wide tile
    was a 72-wide view; it is the out-of-bound error at the index."""
    seen = {}

    @b1nki.jit
    def k(a):
        t = b1nl.load(a)
        try:
            seen["shape"] = t[:, -8:].shape
        except IndexError as e:
            seen["error"] = str(e)
        return a
    b1nki.simulate_kernel(k, rand((128, 64)))
    assert "shape" not in seen and "Out-of-bound" in seen["error"]


# ---------------------------------------------------------------------------------------------
# A4, C3: softmax(x, axis=-1, dtype=None); axis "can only be the last contiguous dim(s)"

def test_softmax_axis_defaults_to_the_last():
    x = rand((128, 32))
    got, _, _ = apply(lambda t: nl.softmax(t), x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_softmax_over_a_non_last_axis_is_rejected():
    with pytest.raises(ValueError, match="last contiguous free dimensions"):
        apply(lambda t: nl.softmax(t, axis=1), rand((128, 4, 8)))


# ---------------------------------------------------------------------------------------------
# B1: comparisons and logical_not default to the input tile's dtype

@pytest.mark.parametrize("name, fn", [("equal", np.equal), ("not_equal", np.not_equal),
                                      ("less", np.less), ("less_equal", np.less_equal),
                                      ("greater", np.greater),
                                      ("greater_equal", np.greater_equal)])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32])
def test_comparisons_default_to_the_input_dtype(name, fn, dtype):
    # "Defaults to the input tile dtype. Use dtype=nl.uint8 for a boolean-like result."
    # ":return: a tile with 1 where equal, 0 otherwise."
    x = (RNG.integers(-2, 3, size=(128, 16))).astype(dtype)
    y = (RNG.integers(-2, 3, size=(128, 16))).astype(dtype)
    got, _, dt = apply(lambda a, b: getattr(nl, name)(a, b), x, y)
    assert dt == np.dtype(dtype)
    np.testing.assert_array_equal(got, fn(x, y).astype(dtype))
    got, _, dt = apply(lambda a: getattr(nl, name)(a, 0), x)
    assert dt == np.dtype(dtype)
    np.testing.assert_array_equal(got, fn(x, 0).astype(dtype))
    _, _, dt = apply(lambda a, b: getattr(nl, name)(a, b, dtype=nl.uint8), x, y)
    assert dt == np.uint8


def test_logical_not_defaults_to_the_input_dtype():
    # "if not specified, it will default to be the same as the data type of the input tile"
    x = RNG.integers(0, 2, size=(128, 16)).astype(np.float32)
    got, _, dt = apply(nl.logical_not, x)
    assert dt == np.float32
    np.testing.assert_array_equal(got, np.logical_not(x).astype(np.float32))


def test_beta1_comparisons_and_logical_not_stay_bool():
    # Beta 1: `def equal(x, y, *, dtype=bool, ...)`, `def logical_not(x, *, dtype=bool, ...)`
    seen = {}

    @b1nki.jit
    def k(a):
        t = b1nl.load(a)
        seen["eq"] = b1nl.equal(t, t).dtype
        seen["not"] = b1nl.logical_not(t).dtype
        return b1_out(t)
    b1nki.simulate_kernel(k, rand((128, 8)))
    assert seen == {"eq": np.bool_, "not": np.bool_}


# ---------------------------------------------------------------------------------------------
# B2: tile_size.sbuf_size_bytes is the whole SBUF

def test_sbuf_size_bytes_is_all_partitions():
    # "Total SBUF capacity in bytes (all partitions combined)."; total_available_sbuf_size
    # "returns the usable SBUF capacity *per partition*, not the total"
    seen = {}

    def k(a):
        seen["total"] = nl.tile_size.sbuf_size_bytes
        seen["per_partition"] = nl.tile_size.total_available_sbuf_size
        seen["pmax"] = nl.tile_size.pmax
        return out_of(sbuf_of(a))
    run(k, rand((1, 1)))
    assert seen["total"] == 28 * 1024 * 1024         # trn2: 24 MiB SBUF is trn1's; 28 MiB trn2
    assert seen["total"] == seen["pmax"] * seen["per_partition"]


# ---------------------------------------------------------------------------------------------
# B3, B4: var always keeps dims; mean of an int tile keeps the int dtype

@pytest.mark.parametrize("axis, keepdims", [(2, False), (2, True), ([1, 2], False)])
def test_var_result_always_has_the_keepdims_shape(axis, keepdims):
    # "keepdims: currently ignored; result always has keepdims=True shape."
    x = rand((128, 4, 8))
    got, shape, _ = apply(lambda t: nl.var(t, axis, keepdims=keepdims), x)
    want = np.var(x.astype(np.float64), axis=tuple(np.atleast_1d(axis)), keepdims=True)
    assert shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mean_of_an_int_tile_keeps_its_dtype():
    # "if not specified, it will default to be the same as the data type of the input tile"
    x = RNG.integers(0, 10, size=(128, 8)).astype(np.int32)
    got, _, dt = apply(lambda t: nl.mean(t, 1), x)
    assert dt == np.int32
    want = np.rint(x.mean(axis=1, keepdims=True, dtype=np.float64)).astype(np.int32)
    np.testing.assert_array_equal(got, want)


def test_beta1_mean_of_an_int_tile_is_fp32_and_var_drops_the_axis():
    # Beta 1 mean: "``float32`` intermediate and return values are used for integer inputs";
    # var: "a shape of the input tile's shape with the specified axes removed"
    seen = {}

    @b1nki.jit
    def k(a, f):
        t = b1nl.load(a)
        seen["mean"] = b1nl.mean(t, axis=1).dtype
        seen["var"] = b1nl.var(b1nl.load(f), axis=2).shape
        return b1_out(t)
    b1nki.simulate_kernel(k, np.ones((128, 8), np.int32), rand((128, 4, 8)))
    assert seen["mean"] == np.float32 and tuple(seen["var"]) == (128, 4)


# ---------------------------------------------------------------------------------------------
# B5: rms_norm's compute_dtype is internal only

def test_rms_norm_result_dtype_ignores_compute_dtype():
    # dtype: "if not specified, it will default to be the same as the data type of the input
    # tile"; compute_dtype: "(optional) dtype for the internal computation"
    x, w = rand((128, 64)), rand((128, 64))
    got, _, dt = apply(lambda a, b: nl.rms_norm(a, b, 1, 64, compute_dtype=nl.bfloat16), x, w)
    assert dt == np.float32
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)    # bf16 intermediates
    _, _, dt = apply(lambda a, b: nl.rms_norm(a, b, 1, 64, dtype=nl.float16), x, w)
    assert dt == np.float16


def test_beta1_rms_norm_compute_dtype_sets_the_result_dtype():
    # Beta 1: "currently `dtype` and `compute_dtype` behave the same, both sets internal compute
    # and return dtype"
    seen = {}

    @b1nki.jit
    def k(a):
        t = b1nl.load(a)
        seen["dt"] = b1nl.rms_norm(t, t, axis=1, n=8, compute_dtype=b1nl.bfloat16).dtype
        return b1_out(t)
    b1nki.simulate_kernel(k, rand((128, 8)))
    assert seen["dt"] == ml_dtypes.bfloat16


# ---------------------------------------------------------------------------------------------
# B6: shared_constant is in shared_hbm

def test_shared_constant_is_in_shared_hbm():
    # "Create a tensor in shared HBM"; ":return: an NkiTensor in shared_hbm"
    c = rand((128, 8))
    seen = {}

    def k(a):
        t = nl.shared_constant(c)
        seen["buffer"] = t.buffer
        o = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o
    np.testing.assert_array_equal(run(k, rand((1, 1))), c)
    assert seen["buffer"] == nl.shared_hbm and seen["buffer"] != nl.private_hbm


# ---------------------------------------------------------------------------------------------
# B7, A6: is_contiguous skips the partition dim on chip; get_pattern

def test_is_contiguous_skips_the_partition_dim_on_chip():
    # "For on-chip tensors (SBUF, PSUM), the partition dim (dim 0) is skipped ... Contiguity
    # is evaluated per-partition over the free dims only."
    seen = {}

    def k(a):
        sb = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        t3 = nl.ndarray((128, 4, 8), dtype=nl.float32, buffer=nl.sbuf)
        h = nl.ndarray((4, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        seen.update(cols=sb[:, 0:32].is_contiguous(), mid=t3[:, 1:3, :].is_contiguous(),
                    step=sb[:, 0:32:2].is_contiguous(), inner=t3[:, :, 0:4].is_contiguous(),
                    hbm_cols=h[:, 0:32].is_contiguous(), hbm_rows=h[1:3, :].is_contiguous())
        return out_of(sbuf_of(a))
    run(k, rand((1, 1)))
    assert seen == dict(cols=True, mid=True, step=False, inner=False, hbm_cols=False,
                        hbm_rows=True)


def test_get_pattern_pairs_strides_with_the_shape():
    # "Return the view's access pattern as [[stride, count], ...] ... pairs each of the view's
    # dimensions with its current stride, in the same order as shape / strides"
    seen = {}
    x = rand((128, 64))

    def k(a):
        sb = sbuf_of(a)
        v = sb[:, 8:24]
        seen["p"] = v.get_pattern()
        return out_of(nl.copy(sb.ap(v.get_pattern(), offset=8)))
    got = run(k, x)
    assert seen["p"] == [[64, 128], [1, 16]]
    np.testing.assert_array_equal(got, x[:, 8:24])


# ---------------------------------------------------------------------------------------------
# B8: HBM integer indexing keeps at least one dimension

def test_hbm_all_integer_index_is_1d():
    # "HBM tensors: integer indexing removes the dimension. Result is at least 1D."
    x = rand((4, 8, 16))
    seen = {}

    def k(a):
        v = a[1, 2, 3]
        seen["shape"] = tuple(v.shape)
        o = nl.ndarray((1,), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=v)
        return o
    got = run(k, x)
    assert seen["shape"] == (1,)
    np.testing.assert_array_equal(got, x[1, 2, 3:4])


# ---------------------------------------------------------------------------------------------
# B9: random_seed reads a 32-bit integer seed exactly

def test_random_seed_takes_every_bit_of_an_int32_seed():
    # "a [1,1] tensor on SBUF or PSUM with a 32-bit seed value": 2**24 and 2**24 + 1 are two
    # seeds (fp32 holds 24 bits: they were one)
    def draw(seed):
        def k(a):
            s = sbuf_of(a)
            nl.random_seed(s)
            return out_of(nl.rand((4, 8), nl.float32))
        return run(k, np.array([[seed]], np.int32))
    a, b = draw(2 ** 24), draw(2 ** 24 + 1)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, draw(2 ** 24))


# ---------------------------------------------------------------------------------------------
# C1: reshape of a non-contiguous view

@pytest.mark.parametrize("make", [lambda t: t[:, :, 0:3].reshape((128, 12)),
                                  lambda t: t.permute((0, 2, 1)).reshape((128, 24))])
def test_reshape_of_a_non_contiguous_view_is_an_error(make):
    # "Fails if the current memory layout is incompatible with the requested shape (e.g. after
    # a non-contiguous slice or permute)."
    with pytest.raises(ValueError, match="incompatible with the shape"):
        apply(lambda t: nl.copy(make(t)), rand((128, 4, 6)))


def test_reshape_of_a_contiguous_view_still_works():
    x = rand((128, 4, 6))
    got, _, _ = apply(lambda t: nl.copy(t[:, 1:3, :].reshape((128, 12))), x)
    np.testing.assert_array_equal(got, x[:, 1:3, :].reshape(128, 12))


def test_beta1_reshape_that_would_copy_is_an_error():
    # Beta 1 tensor.reshape: "Return a new view of the tensor, no copy will occur"
    @b1nki.jit
    def k(a):
        v = a[:, 0:3].reshape((12,))
        return b1_out(b1nl.load(v.reshape((4, 3))))
    with pytest.raises(ValueError, match="incompatible with the shape"):
        b1nki.simulate_kernel(k, rand((4, 6)))


# ---------------------------------------------------------------------------------------------
# C2: the view primitives' documented constraints

@pytest.mark.parametrize("call", [
    lambda t, t1: t1.broadcast(0, 4),          # "On-chip tensors: dim must not be 0"
    lambda t, t1: t.expand_dim(0),             # "On-chip tensors: dim must not be 0"
    lambda t, t1: t1.squeeze_dim(0),           # "On-chip tensors: dim must not be 0"
    lambda t, t1: t.slice(1, 0, 70),           # "0 <= start < end <= t.shape[dim]"
    lambda t, t1: t.slice(1, 10, 10),
    lambda t, t1: t.slice(1, -4, 8),
    lambda t, t1: t.slice(1, 8, 0, -1),        # "step >= 1"
    lambda t, t1: t.slice(1, 0, 8, 0)])
def test_view_primitive_constraints(call):
    def k(a):
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        t1 = nl.ndarray((1, 1, 8), dtype=nl.float32, buffer=nl.sbuf)
        call(t, t1)
        return out_of(sbuf_of(a))
    with pytest.raises(ValueError, match="dim must not be 0|start < end|step must be"):
        run(k, rand((1, 1)))


def test_view_primitives_on_hbm_dim_0_and_valid_slices_still_work():
    x = rand((1, 128, 64))
    seen = {}

    def k(a):
        seen["b"] = tuple(a.broadcast(0, 3).shape)
        seen["e"] = tuple(a.expand_dim(0).shape)
        seen["s"] = tuple(a.squeeze_dim(0).shape)
        t = sbuf_of(a.squeeze_dim(0))
        return out_of(nl.copy(t.slice(1, 8, 24, 2)))
    got = run(k, x)
    assert seen == {"b": (3, 128, 64), "e": (1, 1, 128, 64), "s": (128, 64)}
    np.testing.assert_array_equal(got, x[0][:, 8:24:2])


# ---------------------------------------------------------------------------------------------
# E: MemoryRegion values and lookup

def test_memory_region_members_have_their_enum_values():
    # `class MemoryRegion(Enum): sbuf = 'sbuf'; psum = 'psum'; private_hbm = 'private_hbm';
    # shared_hbm = 'shared_hbm'`
    assert [m.value for m in nl.MemoryRegion] == ["sbuf", "psum", "private_hbm", "shared_hbm"]
    assert nl.MemoryRegion("psum") is nl.psum and nl.MemoryRegion.sbuf is nl.sbuf
    assert nl.MemoryRegion("shared_hbm") is nl.shared_hbm
    assert nl.MemoryRegion(nl.sbuf) is nl.sbuf
    with pytest.raises(ValueError, match="not a valid MemoryRegion"):
        nl.MemoryRegion("hbm2")


# ---------------------------------------------------------------------------------------------
# A3: float8_e4m3fn and float8_e8m0fnu are tensor dtypes

@pytest.mark.parametrize("dt", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu])
def test_new_fp8_dtypes_as_inputs_constants_and_copies(dt):
    # l.44-45 / 56-57 define both; shared_constant's "Supported element types: ...
    # float8_e4m3fn, float8_e5m2, float8_e8m0fnu."
    vals = np.array([0.25, 0.5, 1, 2, 4, 8, 16, 64], np.float32).reshape(1, 8)
    x = np.tile(vals, (128, 1)).astype(dt)
    c = x[:4].copy()

    def k(a):
        t = nl.ndarray(a.shape, dtype=getattr(nl, np.dtype(dt).name), buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        f = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=f, src=t)
        back = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=back, src=f)
        const = nl.shared_constant(c)
        o = nl.ndarray((132, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o[0:128], src=back)
        nisa.dma_copy(dst=o[128:132], src=const)
        return o
    got = run(k, x)
    assert got.dtype == np.dtype(dt)
    np.testing.assert_array_equal(got.astype(np.float32),
                                  np.concatenate([x, c]).astype(np.float32))
