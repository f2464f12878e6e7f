"""Mistakes in the current dialect (NKI 0.3-0.7) that ran silently, crashed or said something
misleading, each with its valid neighbour.

Truth: the 0.6.0/0.7 stub docstrings (STUB-R32 nki/api/nki: tensor_scalar's operand0 "Must be
None or 0 when op0 is a unary operator"; dma_copy/dma_transpose's "priority level 0-3"),
shared/spec/nki-current.md (§1: what each release added; §2.1: ``kernel[lnc]`` launches, 1 by
default; §2.4: abs_max/abs_min op codes of NeuronCore-v4), NumPy for the values.
"""

import numpy as np
import pytest

from nkisim import nki as nki_face
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl

X = np.random.default_rng(23).standard_normal((128, 64)).astype(np.float32)


def run(body, *arrays, grid=None):
    k = nki_face.jit(body)
    return nki_face.simulate(k if grid is None else k[grid])(*arrays)


def through(fn):
    """A kernel body: x -> SBUF, ``fn(dst, src)`` -> SBUF, -> a shared_hbm output."""
    def body(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        fn(r, t)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=r)
        return out
    return body


@pytest.mark.parametrize("call", [lambda: nl.program_id(1), lambda: nl.program_id(-1),
                                  lambda: nl.num_programs(1)])
@pytest.mark.parametrize("grid", [None, 1, 2])
def test_a_grid_axis_the_launch_lacks_is_the_same_error_for_every_launch(call, grid):
    # `kernel(...)` is `kernel[1](...)` (LNC 1 by default): the same one-line error
    def body(x):
        call()
        return through(lambda r, t: nisa.tensor_copy(dst=r, src=t))(x)

    with pytest.raises(ValueError, match=r"axis -?1 out of range for a grid of 1 dims"):
        run(body, X, grid=grid)
    np.testing.assert_array_equal(run(through(lambda r, t: nisa.tensor_copy(dst=r, src=t)), X), X)


def test_program_id_0_and_num_programs_0_run():
    def body(x):
        assert nl.program_id(0) == 0 and nl.num_programs(0) == 1
        return through(lambda r, t: nisa.tensor_copy(dst=r, src=t))(x)

    np.testing.assert_array_equal(run(body, X), X)


def test_flatten_dims_with_start_after_end_is_an_error():
    def body(x):
        t = nl.ndarray((128, 8, 8), dtype=nl.float32, buffer=nl.sbuf)
        t.flatten_dims(2, 1)

    with pytest.raises(ValueError, match="start_dim 2 comes after end_dim 1"):
        run(body, X)


def test_a_unary_op0_takes_operand0_none_or_0_only():
    with pytest.raises(nisa.NkiValidationError,
                       match=r"operand0 must be None or 0 when op0 is the unary abs"):
        run(through(lambda r, t: nisa.tensor_scalar(r, t, nl.abs, 3.0)), X)
    for zero in (None, 0, 0.0):
        np.testing.assert_array_equal(
            run(through(lambda r, t, z=zero: nisa.tensor_scalar(r, t, nl.abs, z)), X), abs(X))


def test_a_trn3_op_code_says_so():
    with pytest.raises(ValueError, match=r"op nl.abs_max is an ALU op code of NeuronCore-v4 "
                                         r"\(trn3\) and newer only"):
        run(through(lambda r, t: nisa.tensor_scalar(r, t, nl.abs_max, 0.5)), X)


@pytest.mark.parametrize("name,since", [("bypass", "0.4"), ("prelu", "0.4"),
                                        ("float8_e8m0fnu", "0.5")])
def test_names_newer_than_the_version_are_attribute_errors(monkeypatch, name, since):
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.3")
    with pytest.raises(AttributeError, match=rf"has no attribute '{name}' \(added in NKI "
                                             rf"{since}.0; NKISIM_NKI_VERSION=0.3\)"):
        getattr(nl, name)
    monkeypatch.setenv("NKISIM_NKI_VERSION", since)
    assert getattr(nl, name) is not None


@pytest.mark.parametrize("name,since", [("psum_bank_fmax", "0.4"), ("sbuf_fmax", "0.4"),
                                        ("psum_num_banks", "0.5")])
def test_tile_sizes_newer_than_the_version_are_attribute_errors(monkeypatch, name, since):
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.3")
    with pytest.raises(AttributeError, match=rf"'tile_size' has no attribute '{name}' \(added "
                                             rf"in NKI {since}.0"):
        getattr(nl.tile_size, name)
    monkeypatch.setenv("NKISIM_NKI_VERSION", since)
    assert getattr(nl.tile_size, name) > 0


def test_a_dtype_typo_names_the_dtype_it_is_closest_to():
    def body(x):
        nl.ndarray((128, 64), dtype="bfloat", buffer=nl.sbuf)

    with pytest.raises(TypeError, match=r"data type 'bfloat' is not an NKI dtype: did you mean "
                                        r"'bfloat16'"):
        run(body, X)


def test_a_dma_priority_is_a_level_0_to_3():
    def copy(priority):
        def fn(r, t):
            nisa.dma_copy(dst=r, src=t, priority=priority)
        return fn

    with pytest.raises(nisa.NkiValidationError, match=r"priority must be a level 0-3 .* got 7"):
        run(through(copy(7)), X)
    np.testing.assert_array_equal(run(through(copy(3)), X), X)


@pytest.mark.parametrize("s", [2.0, 2, np.float64(2.0), np.float32(2.0), np.int64(2)])
@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_numpy_scalar_arguments_pass_through_unchanged(s, how):
    # "Array arguments become NkiTensors ... Other arguments pass through unchanged" (the
    # simulator docs, spec §3): a NumPy scalar (np.float32(2.0), a np.int64 loop variable over
    # np.array([1, 2])) is no array; it was a 0-d HBM tensor when passed positionally
    def body(x, s):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=s)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=r)
        return out

    k = nki_face.simulate(nki_face.jit(body))
    got = k(X, s) if how == "positional" else k(X, s=s)
    np.testing.assert_allclose(got, X * 2)


H = np.arange(64 * 128 * 8, dtype=np.float32).reshape(64, 128, 8)


def _indirect(view, shape):
    def body(h):
        idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(idx, value=2)
        vec = nl.ndarray((64, 1), nl.int32, buffer=nl.sbuf)
        nisa.iota(vec, [[0, 1]], 63, -1)                   # 63 - p: rows in reverse
        out = nl.ndarray(shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=view(h, idx, vec))
        return out
    return run(body, H)


@pytest.mark.parametrize("view, shape, want", [
    (lambda h, i, v: h.select(0, i)[:, 0:4], (128, 4), H[2][:, 0:4]),
    (lambda h, i, v: h.select(0, i).slice(1, 0, 4), (128, 4), H[2][:, 0:4]),
    (lambda h, i, v: h.select(0, i).permute((1, 0)), (8, 128), H[2].T),
    (lambda h, i, v: h.vector_select(0, v).permute((0, 2, 1)), (64, 8, 128),
     H[::-1].transpose(0, 2, 1)),
    (lambda h, i, v: h.vector_select(0, v)[:, 0:64, :], (64, 64, 8), H[::-1, 0:64, :]),
])
def test_views_of_an_indirect_view_compose(view, shape, want):
    # "they compose freely" (language guide); only the indirect dimension is fixed
    # (NkiTensor.is_indirect: it "cannot be further sliced or selected")
    np.testing.assert_array_equal(_indirect(view, shape), want)


@pytest.mark.parametrize("view", [lambda h, i, v: h.vector_select(0, v)[0:32],
                                  lambda h, i, v: h.vector_select(0, v).permute((1, 0, 2))])
def test_the_indirect_dimension_of_a_vector_select_stays_whole_and_first(view):
    with pytest.raises(ValueError, match="participates in the indirection"):
        _indirect(view, (32, 128, 8))


def test_a_dynamic_select_of_a_2d_tile_keeps_the_dimension_at_size_1():
    def body(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(idx, value=5)
        r = nl.ndarray((128, 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=t.select(1, idx))
        out = nl.ndarray((128, 1), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=r)
        return out

    np.testing.assert_array_equal(run(body, X), X[:, 5:6])


@pytest.mark.parametrize("pattern, error", [
    ([[64, 128], [1, 2], [2, 2], [4, 2], [8, 2], [16, 4]],
     "6 levels, 6 after merging contiguous ones: an on-chip access pattern has at most 5"),
    ([[64, 128], [1.5, 4]], r"stride must be an integer, got 1.5"),
])
def test_access_patterns_the_docs_do_not_allow(pattern, error):
    # "a strided access pattern with up to 5 dimensions" (language guide, NkiTensor);
    # `pattern: list[list[int]]` (NkiTensor.ap stub): 1.5 was truncated to 1
    def copy_of(r, t):
        nisa.tensor_copy(dst=r[:, 0:64], src=t.ap(pattern))

    with pytest.raises((ValueError, TypeError), match=error):
        run(through(copy_of), X)


def test_an_access_pattern_of_levels_that_merge_counts_them_once():
    # [8, 2] [4, 2] [1, 4] is one level [1, 16]: 6 levels written, 4 after merging
    def copy_of(r, t):
        nisa.tensor_copy(dst=r, src=t.ap([[64, 128], [8, 2], [4, 2], [1, 4], [16, 2], [32, 2]]))

    want = X.reshape(128, 2, 2, 16).transpose(0, 3, 2, 1).reshape(128, 64)
    np.testing.assert_array_equal(run(through(copy_of), X), want)



@pytest.mark.parametrize("pick", [lambda h, idx: h.select(0, idx),
                                  lambda h, idx: h.vector_select(0, idx)])
def test_an_offset_tile_never_written_is_the_uninitialized_read(pick):
    # the 0.6 select docstring's idx tile is filled before use; a never-written one held the
    # integer placeholder 4, silently selecting row 4 (or out of bound with 4 rows)
    def body(h):
        idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        out = nl.ndarray((1, 128, 8) if "vector" in repr(pick.__code__.co_names) else (128, 8),
                         nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=pick(h, idx))
        return out

    with pytest.raises(ValueError, match=r"read of uninitialized memory: 'h\.\w*select' .* "
                                         r"reads `idx\[0:1, 0:1\]`"):
        run(body, H[:6])


@pytest.mark.parametrize("version, exact", [("0.3", False), ("0.5", False), ("0.6", True),
                                            ("0.7", True)])
def test_nl_copy_of_int32_passes_through_fp32_before_0_6(version, exact, monkeypatch):
    # 0.3 nl.copy: "Uses the Scalar Engine via activation(op=copy) ... casts through FP32,
    # which may be lossy for integer types"; 0.6.0: Vector Engine, bit-exact (spec §2.3)
    monkeypatch.setenv("NKISIM_NKI_VERSION", version)
    a = np.array([[16777217, 1073741827, 7, 123456789]], np.int32)

    def body(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=nl.copy(t))
        return out

    want = a if exact else a.astype(np.float32).astype(np.int32)
    np.testing.assert_array_equal(run(body, a), want)
    assert exact or not np.array_equal(want, a)


@pytest.mark.parametrize("view, error, message", [
    (lambda t, i: t[:, None], NotImplementedError, r"use \.expand_dim\(d\) or \.reshape"),
    (lambda t, i: t.reshape((128, 8, 8)).permute((0, 2, 1)).flatten_dims(1, 2), ValueError,
     "the dimensions must already be contiguous in memory"),
    (lambda t, i: t.vector_select(0, i), ValueError, "only supported on HBM tensors"),
    (lambda t, i: t.reshape_dim(1, (-1, -1)), ValueError, "one element of shape may be -1"),
])
def test_view_mistakes_name_the_documented_rule(view, error, message):
    # each was "not supported by nkisim" or a message about something the user did not write
    def body(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        idx = nl.ndarray((64, 1), nl.int32, buffer=nl.sbuf)
        nisa.iota(idx, [[1, 1]], 0, 1)
        view(t, idx)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.raises(error, match=message):
        run(body, X)
