"""NKI errors on nkisim: exact exception class, ``exc.nki_code`` and exact message.

Truth: nki-reference §2.1 (codes, classes, the message texts the docs give, and the observed
format ``<message>. Info on how to fix: <docs>#<code-with-hyphens>``), §1.2–§1.12 for where each
error arises, issue 2 item 7 for the limits without a documented code (their messages quote the
documented rule and carry no docs link).
"""

import inspect
import re

import numpy as np
import pytest

from nkisim import NKISyntaxError, NKIWarning
from nkisim import beta1 as nki
from nkisim.beta1 import compiler as ncc
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl
from nkisim.beta1 import typing as nt
from nkisim.errors import NKIRuleWarning

DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/api/nki.errors.html"


def documented(code, message):
    """The full text of a documented NKI error: message, period, docs link with the anchor."""
    return f"{message}. Info on how to fix: {DOCS}#{code.replace('_', '-')}"


def check(exc_info, cls, code, message):
    exc = exc_info.value
    assert type(exc) is cls, type(exc)
    assert exc.nki_code == code
    assert str(exc) == message, str(exc)


def run(body, *arrays, **kw):
    """Run ``body`` as a kernel on ``arrays``; ``body`` returns an output or nothing."""
    def kernel(*args):
        r = body(*args)
        if r is None:
            r = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
            nl.store(r, nl.zeros((1, 1), dtype=nl.float32))
        return r
    kernel.__name__ = body.__name__
    kernel.__signature__ = inspect.signature(body)     # parameter names name the tensors
    return nki.simulate_kernel(nki.jit(kernel, **kw), *arrays)


A = np.zeros((128, 512), np.float32)
V = np.zeros((16, 16), np.float32)


# ---------------------------------------------------------------------------------------------
# err_num_partition_exceed_arch_limit


def test_partition_limit_exact_message_from_the_handout():
    def body():
        nl.ndarray((256, 1), dtype=nl.float32, buffer=nl.sbuf)

    with pytest.raises(ValueError) as ei:
        run(body)
    check(ei, ValueError, "err_num_partition_exceed_arch_limit",
          "number of partitions 256 exceed architecture limitation of 128. Info on how to fix: "
          "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/api/"
          "nki.errors.html#err-num-partition-exceed-arch-limit")


@pytest.mark.parametrize("make", [
    lambda a: nl.zeros((129, 4), dtype=nl.float32, buffer=nl.psum),
    lambda a: nl.load(a),
    lambda a: nl.ones((129, 2, 2), dtype=nl.bfloat16),
    lambda a: nl.broadcast_to(nl.load(a[0:1, 0:4]), shape=(129, 4)),
    lambda a: nisa.iota(nl.arange(129)[:, None] + nl.arange(2)[None, :], dtype=nl.int32),
    lambda a: nl.load_transpose2d(a[0:4, 0:129]),
])
def test_partition_limit_everywhere(make):
    a = np.zeros((129, 129), np.float32)
    with pytest.raises(ValueError) as ei:
        run(lambda a: make(a) and None, a)
    check(ei, ValueError, "err_num_partition_exceed_arch_limit",
          documented("err_num_partition_exceed_arch_limit",
                     "number of partitions 129 exceed architecture limitation of 128"))


# ---------------------------------------------------------------------------------------------
# indexing errors (ref §1.5)


def test_mixing_basic_and_advanced_indexing():
    def body(a):
        i_p = nl.arange(128)[:, None]
        nl.load(a[i_p, :])

    with pytest.raises(NKISyntaxError) as ei:
        run(body, A)
    check(ei, NKISyntaxError, "err_unsupported_mixing_basic_advanced_tensor_indexing",
          documented("err_unsupported_mixing_basic_advanced_tensor_indexing",
                     "Mixing basic tensor indexing and advanced tensor indexing is not "
                     "supported"))


def test_1d_arange_index():
    def body(a):
        tmp = nl.load(a)
        nl.exp(tmp[nl.arange(128)])

    with pytest.raises(NKISyntaxError) as ei:
        run(body, A)
    check(ei, NKISyntaxError, "err_1d_arange_not_supported",
          documented("err_1d_arange_not_supported",
                     "indexing tensor `tmp` with 1d arange is not supported"))


def test_out_of_bound_static_slice():
    x = np.zeros((128, 4000), np.float32)

    def body(x):
        nl.load(x[0:128, 0:4096])

    with pytest.raises(IndexError) as ei:
        run(body, x)
    check(ei, IndexError, "err_tensor_access_out_of_bound",
          documented("err_tensor_access_out_of_bound",
                     "Out-of-bound access for tensor `x` on dimension 1: index range [0, 4095] "
                     "exceed dimension size of 4000"))


@pytest.mark.parametrize("index,dim,lo,hi,size", [
    (lambda x: x[16], 0, 16, 16, 16),
    (lambda x: x[0:4, -1], 1, -1, -1, 16),
    (lambda x: x[nl.arange(8)[:, None] + 12, nl.arange(4)[None, :]], 0, 12, 19, 16),
    (lambda x: x[nl.mgrid[0:4, 0:20].p, nl.mgrid[0:4, 0:20].x], 1, 0, 19, 16),
    (lambda x: x[0:17, :], 0, 0, 16, 16),
])
def test_out_of_bound_index_forms(index, dim, lo, hi, size):
    def body(x):
        nl.load(index(x))

    with pytest.raises(IndexError) as ei:
        run(body, np.zeros((16, 16), np.float32))
    check(ei, IndexError, "err_tensor_access_out_of_bound",
          documented("err_tensor_access_out_of_bound",
                     f"Out-of-bound access for tensor `x` on dimension {dim}: index range "
                     f"[{lo}, {hi}] exceed dimension size of {size}"))


def test_out_of_bound_index_expression_not_fully_masked():
    def body(x):
        out = nl.ndarray((8, 12), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:16, 0:16]
        t = nl.load(x[i_p, i_f])
        nl.store(out[i_p, i_f], t, mask=(i_p < 8) & (i_f < 13))     # column 12 is outside
        return out

    with pytest.raises(IndexError) as ei:
        run(body, np.zeros((16, 16), np.float32))
    check(ei, IndexError, "err_tensor_access_out_of_bound",
          documented("err_tensor_access_out_of_bound",
                     "Out-of-bound access for tensor `out` on dimension 0: index range [0, 15] "
                     "exceed dimension size of 8"))


def test_cannot_assign_to_index():
    def body():
        i_p = nl.arange(128)[:, None]
        i_p[0] = 1

    with pytest.raises(TypeError) as ei:
        run(body)
    check(ei, TypeError, "err_cannot_assign_to_index",
          documented("err_cannot_assign_to_index", "'index' tensor does not support item "
                                                   "assignment"))


def test_cannot_assign_to_mgrid_or_mask():
    def body():
        g = nl.mgrid[0:4, 0:4]
        m = g.p < 2
        m[0, 0] = True

    with pytest.raises(TypeError) as ei:
        run(body)
    assert ei.value.nki_code == "err_cannot_assign_to_index"


def test_store_destination_smaller_than_source():
    def body(a):
        t = nl.ndarray((128, 1), dtype=nl.float32)
        t[...] = nl.load(a)

    with pytest.raises(ValueError) as ei:
        run(body, A)
    check(ei, ValueError, "err_store_dst_shape_smaller_than_other_shape",
          documented("err_store_dst_shape_smaller_than_other_shape",
                     "Illegal assignment destination shape in 'a = b': shape [128, 1] of "
                     "parameter 'a' is smaller than other parameter shapes b[128, 512]"))


def test_a_larger_destination_is_a_shape_mismatch_not_smaller():
    """The documented message says the destination "is smaller": only when it is. A [128, 512]
    accumulator of a [64, 512] product is larger, in its partitions."""
    def body(a):
        st = nl.load(a[:, 0:64])
        acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        acc += nisa.nc_matmul(st, nl.load(a))

    with pytest.raises(ValueError) as ei:
        run(body, A)
    check(ei, ValueError, "nkisim_shape_mismatch",
          "Parameter shapes (destination, value) of 'acc += nc_matmul(...)' has mismatched "
          "shapes: the destination is [128, 512], the value [64, 512]: neither the same "
          "partitions and element count nor a broadcast of the value.")

    def assign(a):
        t = nl.ndarray((128, 512), dtype=nl.float32)
        t[...] = nl.load(a[0:64, :])

    with pytest.raises(ValueError, match=r"of 'a = b' has mismatched shapes: the destination "
                                         r"is \[128, 512\], the value \[64, 512\]"):
        run(assign, A)


# ---------------------------------------------------------------------------------------------
# sizes, bounds and indices that are not integers (`/` for `//`): Python's range, slicing and
# NumPy shapes raise TypeError for them; nkisim used to truncate a float silently


@pytest.mark.parametrize("body, text", [
    (lambda a: nl.ndarray((128, 60 / 8), dtype=nl.float32),
     "dimension 1 of the shape (128, 7.5) must be an integer, got 7.5"),
    (lambda a: [None for _ in nl.affine_range(8 / 3)],
     "nl.affine_range's stop must be an integer, got 2.6666666666666665"),
    (lambda a: [None for _ in nl.sequential_range(0, 8, 1.5)],
     "nl.sequential_range's step must be an integer, got 1.5"),
    (lambda a: nl.load(a[:, 0:8 / 3]),
     "the stop of a slice of `a` must be an integer, got 2.6666666666666665"),
    (lambda a: nl.load(a[:, nl.ds(0, 1.5)]), "the size of nl.ds must be an integer, got 1.5"),
    (lambda a: nl.load(a).reshape((128, 1024 / 5)),
     "dimension 1 of the shape (128, 204.8) must be an integer, got 204.8"),
])
def test_a_fractional_size_is_a_type_error(body, text):
    with pytest.raises(TypeError) as ei:
        run(body, A)
    assert ei.value.nki_code == "nkisim_not_an_integer"
    assert str(ei.value) == f"{text} (`/` divides to a float; `//` for an integer)."


def test_a_tuple_bound_is_a_type_error_and_whole_floats_pass():
    with pytest.raises(TypeError) as ei:
        run(lambda a: [None for _ in nl.affine_range(a.shape)], A)
    assert str(ei.value) == "nl.affine_range's stop must be an integer, got (128, 512)."

    def body(a):          # 512 / 2 and 128 / 1 divide: no evidence the front end refuses them
        t = nl.ndarray((128 / 1, 512 / 2), dtype=nl.float32)
        for i in nl.affine_range(4 / 2):
            t[:, i * 128:(i + 1) * 128.0] = nl.load(a[:, i * 128:(i + 1) * 128])
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(t))
        return out
    np.testing.assert_array_equal(run(body, np.arange(128 * 512, dtype=np.float32).reshape(
        128, 512)), np.arange(128 * 512, dtype=np.float32).reshape(128, 512)[:, 0:256])


# ---------------------------------------------------------------------------------------------
# control flow (ref §1.9)


def test_ambiguous_truth_value_of_multi_element_tile():
    def body(a):
        t = nl.load(a)
        if t:
            pass

    with pytest.raises(ValueError) as ei:
        run(body, V)
    check(ei, ValueError, "err_ambiguous_tensor_truth_value",
          documented("err_ambiguous_tensor_truth_value",
                     "Cannot evaluate truth value of a multi-element tensor/array"))


@pytest.mark.parametrize("use", [lambda t, u: not t, lambda t, u: t and u,
                                 lambda t, u: t or u])
def test_ambiguous_truth_value_of_not_and_or(use):
    def body(a):
        t = nl.load(a)
        use(t, t)

    with pytest.raises(ValueError) as ei:
        run(body, V)
    assert ei.value.nki_code == "err_ambiguous_tensor_truth_value"


@pytest.mark.parametrize("use", [lambda t: bool(t), lambda t: range(t),
                                 lambda t: [0, 1][t]])
def test_dynamic_control_flow_on_tensor_value(use):
    def body(a):
        t = nl.load(a[0:1, 0:1])
        use(t)

    with pytest.raises(NKISyntaxError) as ei:
        run(body, V)
    check(ei, NKISyntaxError, "err_dynamic_control_flow_not_supported",
          documented("err_dynamic_control_flow_not_supported",
                     "dynamic control-flow depending on tensor value is not supported"))


@pytest.mark.parametrize("cond", [lambda i: i < 64, lambda i: bool(i), lambda i: range(i),
                                  lambda i: (i == 3) and True])
def test_control_flow_depending_on_arange(cond):
    def body():
        i_p = nl.arange(128)[:, None]
        if cond(i_p):
            pass

    with pytest.raises(NKISyntaxError) as ei:
        run(body)
    check(ei, NKISyntaxError, "err_control_flow_condition_depending_on_arange",
          documented("err_control_flow_condition_depending_on_arange",
                     "Control-flow depending on `nl.arange` or `nl.mgrid` is not supported"))


# ---------------------------------------------------------------------------------------------
# parameters, outputs, kernels (ref §1.1)


@pytest.mark.parametrize("write", [
    lambda a: nl.store(a, nl.zeros((16, 16), dtype=nl.float32)),
    lambda a: nisa.dma_copy(dst=a[0:4, :], src=nl.zeros((4, 16), dtype=nl.float32)),
    lambda a: a.__setitem__((slice(0, 2), slice(0, 2)), nl.zeros((2, 2), dtype=nl.float32)),
])
def test_cannot_update_immutable_parameter(write):
    def body(a):
        write(a)

    with pytest.raises(TypeError) as ei:
        run(body, V)
    check(ei, TypeError, "err_cannot_update_immutable_parameter",
          documented("err_cannot_update_immutable_parameter",
                     "Cannot update immutable parameter `a`"))


def test_mutable_parameter_not_returned():
    @nki.jit
    def kernel(a: nt.mutable_tensor):
        nl.store(a, nl.zeros((16, 16), dtype=nl.float32))
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.zeros((1, 1), dtype=nl.float32))
        return out

    with pytest.raises(NKISyntaxError) as ei:
        kernel(V.copy())
    check(ei, NKISyntaxError, "err_mutable_parameter_not_returned",
          documented("err_mutable_parameter_not_returned",
                     "Mutable kernel parameter `a` not returned by `return` statement"))


def test_nested_kernel_with_spmd_grid():
    @nki.jit
    def kernel1(a):
        return a

    @nki.jit
    def kernel2(a):
        return kernel1[4, 4](a)

    with pytest.raises(NKISyntaxError) as ei:
        kernel2(V)
    check(ei, NKISyntaxError, "err_nested_kernel_with_spmd_grid",
          documented("err_nested_kernel_with_spmd_grid",
                     "Calling kernel with spmd grid (kernel1[4, 4]) inside another kernel is "
                     "not supported"))


@pytest.mark.parametrize("call", [lambda: nl.zeros((4, 4), dtype=nl.float32),
                                  lambda: nl.affine_range(4).__next__(),
                                  lambda: nl.program_id(0),
                                  lambda: nisa.get_nc_version()])
def test_nki_api_outside_of_kernel(call):
    with pytest.raises(RuntimeError) as ei:
        call()
    check(ei, RuntimeError, "err_nki_api_outside_of_nki_kernel",
          documented("err_nki_api_outside_of_nki_kernel",
                     "Calling NKI API outside of NKI kernels is not supported"))


@pytest.mark.parametrize("make", [
    lambda: nl.zeros((4, 4), dtype=nl.float32, buffer=nl.shared_hbm),
    lambda: nl.full((4, 4), 2.0, dtype=nl.float32, buffer=nl.hbm),
    lambda: nl.ones((4, 4), dtype=nl.float32, buffer=nl.private_hbm),
])
def test_hbm_tensor_with_init_value(make):
    with pytest.raises(NKISyntaxError) as ei:
        run(lambda: make() and None)
    check(ei, NKISyntaxError, "err_hbm_tensor_with_init_value_not_supported",
          documented("err_hbm_tensor_with_init_value_not_supported",
                     "Creating HBM tensor with init value is not supported"))


@pytest.mark.parametrize("loop", ["affine_range", "sequential_range", "static_range"])
def test_shared_hbm_must_be_created_at_kernel_level(loop):
    def body():
        nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)       # works
        for _ in getattr(nl, loop)(2):
            nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)

    with pytest.raises(RuntimeError) as ei:
        run(body)
    check(ei, RuntimeError, "err_shared_hbm_must_in_kernel_level",
          documented("err_shared_hbm_must_in_kernel_level",
                     "shared_hbm buffer can only be created top level kernel scope"))


def test_shared_hbm_in_comprehension_at_kernel_level_is_fine():
    def body():
        outs = [nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(2)]
        for o in outs:
            nl.store(o, nl.zeros((4, 4), dtype=nl.float32))
        return tuple(outs)

    assert len(run(body)) == 2


def test_tensor_output_not_written_to():
    def body():
        result = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        return result

    with pytest.raises(ValueError) as ei:
        run(body)
    check(ei, ValueError, "err_tensor_output_not_written_to",
          documented("err_tensor_output_not_written_to",
                     "Output tensor `result` was never written to: all 16 elements (region "
                     "[0:4, 0:4]) of shape [4, 4] holds no value written by the kernel "
                     "(unwritten outputs hold garbage on device)"))


def test_tensor_output_partially_written_is_a_warning():
    # err_tensor_output_not_written_to is for an output "never written to" (nki.errors.rst);
    # AWS's doc examples example_indirect_save_1/2 return partly written outputs.
    def body(a):
        out = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0:6, :], nl.load(a[0:6, 0:4]))
        return out

    with pytest.warns(NKIWarning, match=r"output tensor `out` is only partly written: 8 of 32 "
                      r"elements \(region \[6:8, 0:4\]\) of shape \[8, 4\]"):
        out = run(body, V)
    assert np.isnan(out[6:]).all()


def test_annotation_shape_mismatch():
    def body(a):
        data = nl.load(a[0:128, 0:128])
        data.assert_shape((128, 512))

    with pytest.raises(TypeError) as ei:
        run(body, A)
    check(ei, TypeError, "err_annotation_shape_mismatch",
          documented("err_annotation_shape_mismatch",
                     "shape of `data[128, 128]` does not match the expected shape of [128, 512]"))


# ---------------------------------------------------------------------------------------------
# tiles and buffers


def test_failed_to_infer_tile_from_block_tensor():
    def body():
        t = nl.zeros((4, nl.par_dim(128), 8), dtype=nl.float32)
        nl.exp(t)

    with pytest.raises(TypeError) as ei, pytest.warns(NKIWarning):
        run(body)
    check(ei, TypeError, "err_failed_to_infer_tile_from_local_tensor",
          documented("err_failed_to_infer_tile_from_local_tensor",
                     "Failed to infer tile from tensor 't', the first dimension of a tile must "
                     "be the partition dimension"))


def test_failed_to_infer_tile_when_partition_dim_is_indexed_away():
    def body(a):
        a_tile = nl.load(a)
        nl.exp(a_tile[0])

    with pytest.raises(TypeError) as ei:
        run(body, V)
    assert ei.value.nki_code == "err_failed_to_infer_tile_from_local_tensor"


def test_block_dimension_is_deprecated_warning():
    def body():
        t = nl.zeros((2, nl.par_dim(4), 8), dtype=nl.float32)
        out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, t[1])
        return out

    with pytest.warns(NKIWarning, match="warn_block_dimension_is_deprecated"):
        run(body)


@pytest.mark.parametrize("body,param,api,expected,got", [
    (lambda a: nl.load(nl.load(a)), "src", "load", "hbm", "sbuf"),
    (lambda a: nl.exp(a), "x", "exp", "psum|sbuf", "hbm"),
    (lambda a: nl.add(a, 1.0), "x", "add", "psum|sbuf", "hbm"),
    (lambda a: nisa.tensor_copy(a), "src", "tensor_copy", "psum|sbuf", "hbm"),
    (lambda a: nl.store(nl.load(a), nl.load(a)), "dst", "store", "hbm", "sbuf"),
    (lambda a: nisa.dma_copy(dst=nl.ndarray((16, 16), nl.float32, buffer=nl.psum), src=a),
     "dst", "dma_copy", "hbm|sbuf", "psum"),
    (lambda a: nisa.dma_copy(dst=nl.ndarray((16, 16), nl.float32, buffer=nl.hbm),
                             src=nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)),
     "src", "dma_copy", "hbm|sbuf", "psum"),
    (lambda a: nisa.nc_matmul(nl.load(a), a), "moving", "nc_matmul", "sbuf", "hbm"),
    (lambda a: nisa.nc_matmul(a, nl.load(a)), "stationary", "nc_matmul", "sbuf", "hbm"),
    (lambda a: nl.matmul(nl.load(a), a, transpose_x=True), "y", "matmul", "sbuf", "hbm"),
    (lambda a: nisa.tensor_copy(nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine),
                                engine=nisa.gpsimd_engine),
     "src", "tensor_copy (gpsimd)", "sbuf", "psum"),
])
def test_unsupported_memory(body, param, api, expected, got):
    with pytest.raises(TypeError) as ei:
        run(lambda a: body(a) and None, V)
    check(ei, TypeError, "err_unsupported_memory",
          documented("err_unsupported_memory",
                     f"Expected operand '{param}' of '{api}' to be in address space "
                     f"'{expected}', but got a tile in '{got}' instead"))


def test_psum_stationary_is_a_tolerated_rule():
    """nc_matmul docs: "the stationary and moving must be SBUF tiles"; AWS's
    reference/attention.py (flash_attn_bwd, in AWS's CI) uses an nc_transpose result (PSUM) as
    the stationary. A warning quoting the rule; strict mode makes it an error."""
    a = np.random.default_rng(3).random((16, 16), dtype=np.float32)

    def body(a):
        out = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)
        nl.store(out, nisa.nc_matmul(at, nl.load(a)))
        return out

    with pytest.warns(NKIRuleWarning, match="must be SBUF tiles"):
        out = run(body, a)
    assert np.allclose(out, a @ a, rtol=1e-5)

    def nl_matmul(a):        # AWS's tutorials/attention_fwd_performance v1
        out = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, nl.matmul(t, nl.transpose(t), transpose_x=False))
        return out

    with pytest.warns(NKIRuleWarning, match="must be SBUF tiles"):
        out = run(nl_matmul, a)
    assert np.allclose(out, a @ a.T, rtol=1e-5)
    with pytest.MonkeyPatch.context() as mp, pytest.raises(ValueError) as ei:
        mp.setenv("NKISIM_STRICT", "1")
        run(body, a)
    assert ei.value.nki_code == "nkisim_strict_rule"
    assert "nki.isa.nc_matmul.html" in str(ei.value)


@pytest.mark.parametrize("op", ["matmul", "transpose"])
def test_tensor_engine_result_assigned_to_sbuf_lands_there(op):
    """`sbuf_tile[...] = nisa.nc_transpose(...)` / `= nisa.nc_matmul(...)`: the compiler adds
    the PSUM -> SBUF copy (AWS's tutorials/sd_attention, reference/double_row_matmul.py)."""
    a = np.random.default_rng(4).random((16, 16), dtype=np.float32)

    def body(a):
        out = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        dst = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
        if op == "matmul":
            dst[...] = nisa.nc_matmul(t, t)
        else:
            dst[...] = nisa.nc_transpose(t, engine=nisa.tensor_engine)
        nl.store(out, dst)
        return out

    out = run(body, a)
    assert np.allclose(out, a.T @ a if op == "matmul" else a.T, rtol=1e-5)


def test_assigning_an_existing_tile_is_a_copy():
    """`dst[...] = t` of a tile `t` the kernel keeps using is a copy, even when `t` came from
    the last instruction: `t` keeps its own values and buffer."""
    a = np.random.default_rng(5).random((16, 16), dtype=np.float32)

    def body(a):
        out = nl.ndarray((2, 16, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.exp(nl.load(a))
        dst = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
        dst[...] = t
        nl.store(out[0], dst)
        nl.store(out[1], t)
        return out

    kernel = nki.jit(body)
    out = nki.simulate_kernel(kernel, a)
    assert np.allclose(out[0], np.exp(a), rtol=1e-6) and np.allclose(out[1], np.exp(a),
                                                                       rtol=1e-6)
    ops = [i.op for i in kernel.last_run.trace.instrs]
    assert ops[:3] == ["dma_copy", "activation", "tensor_copy"], ops


def test_matmul_accumulation_into_sbuf_is_unsupported_memory():
    def body(a):
        t = nl.load(a)
        acc = nl.zeros((16, 16), dtype=nl.float32, buffer=nl.sbuf)
        acc += nisa.nc_matmul(t, t)

    with pytest.raises(TypeError) as ei:
        run(body, V)
    assert ei.value.nki_code == "err_unsupported_memory"
    assert "'dst' of 'nc_matmul'" in str(ei.value) and "'psum'" in str(ei.value)


def test_num_partition_mismatch():
    def body():
        data1 = nl.zeros((128, 512), dtype=nl.float32)
        data2 = nl.zeros((1, 512), dtype=nl.float32)
        nisa.tensor_tensor(data1, data2, op=nl.add)

    with pytest.raises(ValueError) as ei:
        run(body)
    check(ei, ValueError, "err_num_partition_mismatch",
          documented("err_num_partition_mismatch",
                     "number of partitions (dimension 0 size of a tile) mismatch in parameters "
                     "(data1[128, 512], data2[1, 512]) of 'tensor_tensor'"))


# ---------------------------------------------------------------------------------------------
# nl.transpose limits


def test_transpose_exceeds_max_dimensions():
    def body():
        x = nl.zeros((64, 32, 2), dtype=nl.float32)
        nl.transpose(x)

    with pytest.raises(ValueError) as ei:
        run(body)
    check(ei, ValueError, "err_exceed_max_supported_dimension",
          documented("err_exceed_max_supported_dimension",
                     "parameter 'x[64, 32, 2]' of 'transpose' exceed max supported number of "
                     "dimensions of 2"))


def test_transpose_dimension_exceeds_arch_limit():
    def body():
        x = nl.zeros((128, 512), dtype=nl.float32)
        nl.transpose(x)

    with pytest.raises(ValueError) as ei:
        run(body)
    check(ei, ValueError, "err_size_of_dimension_exceed_arch_limit",
          documented("err_size_of_dimension_exceed_arch_limit",
                     "size of dimension 1 in 'x[128, 512]' of 'transpose' exceed architecture "
                     "limitation of 128"))


def test_nc_transpose_vector_engine_limit_is_32():
    def body():
        data = nl.zeros((64, 16), dtype=nl.float32)
        nisa.nc_transpose(data, engine=nisa.vector_engine)

    with pytest.raises(ValueError) as ei:
        run(body)
    check(ei, ValueError, "err_size_of_dimension_exceed_arch_limit",
          documented("err_size_of_dimension_exceed_arch_limit",
                     "size of dimension 0 in 'data[64, 16]' of 'nc_transpose (vector engine)' "
                     "exceed architecture limitation of 32"))


def test_nc_transpose_tensor_engine_limit_is_128():
    def body():
        data = nl.zeros((128, 129), dtype=nl.float32)
        nisa.nc_transpose(data)

    with pytest.raises(ValueError) as ei:
        run(body)
    check(ei, ValueError, "err_size_of_dimension_exceed_arch_limit",
          documented("err_size_of_dimension_exceed_arch_limit",
                     "size of dimension 1 in 'data[128, 129]' of 'nc_transpose (tensor engine)' "
                     "exceed architecture limitation of 128"))


# ---------------------------------------------------------------------------------------------
# activation parameters


@pytest.mark.parametrize("bias", [lambda: nl.zeros((16, 1), dtype=nl.int32),
                                  lambda: nl.zeros((16, 1), dtype=nl.float8_e4m3),
                                  lambda: "bias"])
def test_activation_bias_invalid_type(bias):
    def body(a):
        nisa.activation(op=nl.exp, data=nl.load(a), bias=bias())

    with pytest.raises(TypeError) as ei:
        run(body, V)
    check(ei, TypeError, "err_activation_bias_invalid_type",
          documented("err_activation_bias_invalid_type",
                     "Bias parameter of activation or activation_reduce must be a vector of type "
                     "float32, float16, or bfloat16"))


def test_activation_scalar_bias_needs_nc_v3():
    def body(a):
        nisa.activation(op=nl.exp, data=nl.load(a), bias=1.0)

    run(body, V, platform_target="trn2")
    with pytest.raises(TypeError) as ei:
        run(body, V, platform_target="trn1")
    assert ei.value.nki_code == "err_activation_bias_invalid_type"


@pytest.mark.parametrize("dtype", [nl.bfloat16, nl.float16, nl.int32])
def test_activation_scale_invalid_type(dtype):
    def body(a):
        nisa.activation(op=nl.exp, data=nl.load(a), scale=nl.ones((16, 1), dtype=dtype))

    with pytest.raises(TypeError) as ei:
        run(body, V)
    check(ei, TypeError, "err_activation_scale_invalid_type",
          documented("err_activation_scale_invalid_type",
                     "Scale parameter of activation or activation_reduce must be a scalar or "
                     "vector of type float32"))


@pytest.mark.parametrize("scale", [lambda: nl.ones((16, 2), dtype=nl.float32),
                                   lambda: nl.ones((16, 16), dtype=nl.float32),
                                   lambda: [1.0, 2.0]])
def test_activation_scale_scalar_or_vector(scale):
    def body(a):
        nisa.activation(op=nl.exp, data=nl.load(a), scale=scale())

    with pytest.raises(NKISyntaxError) as ei:
        run(body, V)
    check(ei, NKISyntaxError, "err_activation_scale_scalar_or_vector",
          documented("err_activation_scale_scalar_or_vector",
                     "Scale parameter of activation must be either a scalar value or a 1D "
                     "vector spanning the partition dimension"))


# ---------------------------------------------------------------------------------------------
# direct-allocated kernels


def _sb(addr):
    return ncc.sbuf.mod_alloc(base_addr=addr)


def test_tensor_creation_on_scratchpad_with_init_value():
    def body():
        nl.zeros((128, 4), dtype=nl.float32, buffer=_sb(0))

    with pytest.raises(NKISyntaxError) as ei:
        run(body)
    check(ei, NKISyntaxError,
          "err_tensor_creation_on_scratchpad_with_init_value_not_supported",
          documented("err_tensor_creation_on_scratchpad_with_init_value_not_supported",
                     "Creating SBUF/PSUM tensor with init value is not supported in allocated "
                     "NKI kernels"))


@pytest.mark.parametrize("act", [
    lambda t: nisa.activation(op=nl.exp, data=t),
    lambda t: nl.exp(t),
    lambda t: nl.tanh(t),
])
def test_bias_tensor_must_be_specified_in_allocation(act):
    def body(a):
        t = nl.ndarray((16, 16), dtype=nl.float32, buffer=_sb(0))
        t[...] = nl.load(a)
        act(t)

    with pytest.raises(NKISyntaxError) as ei:
        run(body, V)
    check(ei, NKISyntaxError, "err_bias_tensor_must_be_specified_in_allocation",
          documented("err_bias_tensor_must_be_specified_in_allocation",
                     "Bias tensor of an activation op must be specified in allocated NKI "
                     "kernels"))


def test_activation_with_bias_in_allocated_kernel_is_fine():
    def body(a):
        t = nl.ndarray((16, 16), dtype=nl.float32, buffer=_sb(0))
        b = nl.ndarray((16, 1), dtype=nl.float32, buffer=_sb(64))
        t[...] = nl.load(a)
        b[...] = nisa.memset((16, 1), 0.0, dtype=nl.float32)
        r = nl.ndarray((16, 16), dtype=nl.float32, buffer=_sb(128))
        r[...] = nisa.activation(op=nl.exp, data=t, bias=b)
        out = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    np.testing.assert_array_equal(run(body, V), np.ones((16, 16), np.float32))


@pytest.mark.parametrize("op", [lambda t: nisa.nc_transpose(t, engine=nisa.tensor_engine),
                                lambda t: nisa.nc_transpose(t),
                                lambda t: nl.transpose(t),
                                lambda t: nl.matmul(t, t, transpose_x=False)])
def test_transpose_on_tensor_engine_not_allowed_in_allocated_kernel(op):
    def body(a):
        t = nl.ndarray((64, 64), dtype=nl.float32, buffer=_sb(0))
        t[...] = nl.load(a)
        op(t)

    with pytest.raises(NKISyntaxError) as ei:
        run(body, np.zeros((64, 64), np.float32))
    check(ei, NKISyntaxError, "err_transpose_on_tensor_engine_not_allowed_in_allocated_kernel",
          documented("err_transpose_on_tensor_engine_not_allowed_in_allocated_kernel",
                     "Transpose on tensor engine is not allowed in allocated NKI kernels"))


# ---------------------------------------------------------------------------------------------
# masks, affine-range output dependencies, scope


@pytest.mark.parametrize("mask", [lambda i: (i < 3) & 0.5,
                                  lambda i: nl.zeros((16, 1), dtype=nl.bool_)])
def test_unsupported_expression_in_mask(mask):
    def body(a):
        i_p = nl.arange(16)[:, None]
        nl.exp(nl.load(a), mask=mask(i_p))

    with pytest.raises(ValueError) as ei:
        run(body, V)
    check(ei, ValueError, "err_unsupported_expression_in_mask",
          documented("err_unsupported_expression_in_mask",
                     "NKI mask expressions must be affine expressions of static loop indices"))


def test_mask_and_a_loop_index_predicate():
    # AWS's reference/allocated_fused_linear.py (nki-samples fc5c69f, run by its CI) stores
    # with `mask=(i_res.x < head_dim) & ((2*i + grp) * pmax < seqlen)`, `i` an affine_range
    # index: nkisim's loop indices are integers, so the right operand is already a bool.
    def body(a):
        out = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.zeros((16, 16), dtype=nl.float32))
        g = nl.mgrid[0:16, 0:16]
        for i in nl.affine_range(2):
            nl.store(out[g.p, g.x], nl.load(a[g.p, g.x]),
                     mask=((g.x < 4) & ((2 * i + 0) * 8 < 8)) | (((2 * i) * 8 >= 8) & (g.x >= 12)))
        return out

    a = np.arange(256, dtype=np.float32).reshape(16, 16) + 1
    out = run(body, a)
    want = np.zeros_like(a)
    want[:, :4] = a[:, :4]            # i == 0: columns 0:4
    want[:, 12:] = a[:, 12:]          # i == 1: columns 12:16
    np.testing.assert_array_equal(out, want)


def test_non_affine_index_arithmetic_is_unsupported_in_mask():
    with pytest.raises(ValueError) as ei:
        nl.arange(4)[:, None] * 0.5
    assert ei.value.nki_code == "err_unsupported_expression_in_mask"


def test_unexpected_output_dependencies_in_affine_range():
    def body():
        a = nl.ndarray((4, 4), dtype=nl.float32)
        for _ in nl.affine_range(4):
            a[0:1, :] = 0.0

    with pytest.raises(NKISyntaxError) as ei:
        run(body)
    assert ei.value.nki_code == "err_unexpected_output_dependencies"
    msg = str(ei.value)
    assert msg.startswith("Unexpected output dependencies, different iterations of the `_` "
                          "loop (affine_range at test_errors.py:"), msg
    assert "write to `a[0:1, 0:4]`" in msg
    assert msg.endswith(". Info on how to fix: " + DOCS + "#err-unexpected-output-dependencies")


def test_local_variable_used_out_of_scope():
    def body(a):
        for _ in nl.affine_range(2):
            tmp = nl.load(a)
        nl.exp(tmp)

    with pytest.raises(NKISyntaxError) as ei:
        run(body, V)
    assert ei.value.nki_code == "err_local_variable_used_out_of_scope"
    assert str(ei.value).startswith("Local variable 'tmp' is referenced outside of its parent "
                                    "scope (loop at line test_errors.py:")
    assert str(ei.value).endswith(documented("err_local_variable_used_out_of_scope", "")[1:])


# ---------------------------------------------------------------------------------------------
# limits without a documented code (issue 2 item 7): no docs link


def test_insufficient_rank():
    def body():
        z = nl.zeros((128,), dtype=nl.float32, buffer=nl.sbuf)
        return z

    with pytest.raises(ValueError) as ei:
        run(body)
    check(ei, ValueError, "nkisim_insufficient_rank",
          "Insufficient rank: SBUF tensor 'z' of shape [128] must have at least 2 dimensions "
          "(partition, free); use (128, 1) instead (ref: NKI known issues).")


def test_psum_tile_larger_than_a_bank():
    def body():
        nl.ndarray((128, 513), dtype=nl.float32, buffer=nl.psum, name="p")

    with pytest.raises(ValueError) as ei:
        run(body)
    check(ei, ValueError, "nkisim_psum_bank_overflow",
          "PSUM tile 'p[128, 513]' (float32) needs 2052 bytes per partition, more than one 2048 "
          "byte PSUM bank; a PSUM tile cannot span multiple PSUM banks (at most 512 fp32 "
          "elements per partition).")


def test_psum_bf16_tile_of_1024_fits_a_bank():
    def body():
        p = nl.zeros((128, 1024), dtype=nl.bfloat16, buffer=nl.psum)
        out = nl.ndarray((128, 1024), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, p)
        return out

    assert run(body).shape == (128, 1024)


@pytest.mark.parametrize("shape", [(128, 129), (128, 2, 65)])
def test_matmul_stationary_too_large(shape):
    def body(st, mv):
        s = nl.load(st)
        m = nl.load(mv)
        nisa.nc_matmul(s, m)

    with pytest.raises(ValueError) as ei:
        run(body, np.zeros(shape, np.float32), np.zeros((128, 4), np.float32))
    dims = ", ".join(str(d) for d in shape)
    check(ei, ValueError, "nkisim_matmul_stationary_limit",
          f"stationary operand 's[{dims}]' of 'nc_matmul' exceeds the Tensor Engine limit: "
          "partitions <= 128 and free size <= 128 (gemm_stationary_fmax).")


@pytest.mark.parametrize("shape,free", [((128, 513), 513), ((128, 2, 300), 600)])
def test_matmul_moving_free_too_large(shape, free):
    def body(st, mv):
        s = nl.load(st)
        m = nl.load(mv)
        nisa.nc_matmul(s, m)

    with pytest.raises(ValueError) as ei:
        run(body, np.zeros((128, 128), np.float32), np.zeros(shape, np.float32))
    dims = ", ".join(str(d) for d in shape)
    check(ei, ValueError, "nkisim_matmul_moving_limit",
          f"moving operand 'm[{dims}]' of 'nc_matmul' has free size {free}, more than 512 "
          "(gemm_moving_fmax): each nc_matmul writes one 2 KiB PSUM bank.")


def test_matmul_contraction_mismatch():
    def body(st, mv):
        nisa.nc_matmul(nl.load(st), nl.load(mv))

    with pytest.raises(ValueError) as ei:
        run(body, np.zeros((128, 64), np.float32), np.zeros((64, 32), np.float32))
    check(ei, ValueError, "nkisim_matmul_contraction_mismatch",
          "contraction (partition) sizes of stationary [128, 64] and moving [64, 32] of "
          "'nc_matmul' differ.")


def test_nl_matmul_contraction_mismatch():
    def body(x, y):
        nl.matmul(nl.load(x), nl.load(y))

    # in nl.matmul's terms (reference §1.8: "x's free dim must equal y's partition dim (for
    # transpose_x=False)"), with the transpose_x hint when x.T @ y would fit
    with pytest.raises(ValueError) as ei:
        run(body, np.zeros((64, 32), np.float32), np.zeros((64, 16), np.float32))
    check(ei, ValueError, "nkisim_nl_matmul_shapes",
          "nl.matmul(x[64, 32], y[64, 16]): x @ y contracts x's free size 32 with y's partition "
          "size 64, which differ (x.T @ y: transpose_x=True).")

    def transposed(x, y):
        nl.matmul(nl.load(x), nl.load(y), transpose_x=True)

    with pytest.raises(ValueError) as ei:
        run(transposed, np.zeros((32, 64), np.float32), np.zeros((64, 16), np.float32))
    check(ei, ValueError, "nkisim_nl_matmul_shapes",
          "nl.matmul(x[32, 64], y[64, 16], transpose_x=True): x.T @ y contracts x's partition "
          "size 32 with y's partition size 64, which differ.")


def test_matmul_operand_dtype():
    def body(st):
        t = nl.load(st)
        nisa.nc_matmul(t, t)

    with pytest.raises(TypeError) as ei:
        run(body, np.zeros((8, 8), np.int32))
    check(ei, TypeError, "nkisim_operand_dtype",
          "operand 'stationary' of 'nc_matmul' has dtype int32; expected one of the following "
          "dtypes: float8_e4m3, float8_e5m2, bfloat16, float16, tfloat32, float32.")


def test_both_tensor_tensor_inputs_in_psum():
    def body(a):
        p1 = nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)
        p2 = nisa.nc_transpose(nl.load(a), engine=nisa.tensor_engine)
        nisa.tensor_tensor(p1, p2, op=nl.add)

    with pytest.raises(TypeError) as ei:
        run(body, np.zeros((64, 64), np.float32))
    check(ei, TypeError, "nkisim_both_inputs_psum",
          "'tensor_tensor' cannot read both inputs from PSUM; legal input buffers are SBUF+SBUF, "
          "SBUF+PSUM and PSUM+SBUF.")


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.complex64])
def test_unsupported_kernel_input_dtype(dtype):
    @nki.jit
    def kernel(a):
        return a

    with pytest.raises(TypeError) as ei:
        kernel(np.zeros((4, 4), dtype))
    check(ei, TypeError, "nkisim_operand_dtype",
          f"operand 'a' of 'kernel call' has dtype {np.dtype(dtype).name}; expected one of the "
          "following dtypes: float32, float16, bfloat16, float8_e4m3, float8_e5m2, "
          "float8_e4m3fn, float8_e8m0fnu, int8, int16, int32, uint8, uint16, uint32, bool (cast "
          "the NumPy array first, e.g. "
          "x.astype(np.float32)).")


def test_unsupported_tensor_dtype():
    def body():
        nl.ndarray((4, 4), dtype=np.float64)

    with pytest.raises(TypeError) as ei:
        run(body)
    assert ei.value.nki_code == "nkisim_operand_dtype"
    assert str(ei.value).startswith("operand 'dtype' of 'nl.ndarray' has dtype float64; "
                                    "expected one of the following dtypes: ")


def test_uninitialized_read_message_names_tensor_and_region():
    def body(a):
        buf = nl.ndarray((16, 16), dtype=nl.float32)
        buf[0:16, 0:8] = nl.load(a[:, 0:8])
        out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        e = nl.exp(buf)                     # columns 8:16 computed from never-written values
        nl.store(out, e[:, 8:16])           # ... leave the chip: an error
        return out

    with pytest.raises(ValueError) as ei:
        run(body, V)
    assert ei.value.nki_code == "nkisim_uninitialized_read"
    assert re.fullmatch(r"read of uninitialized memory: 'exp' at test_errors\.py:\d+ reads "
                        r"`buf\[0:16, 8:16\]` \(128 of 256 elements never written\)\.",
                        str(ei.value)), str(ei.value)


def test_every_documented_code_has_the_docs_link_and_nkisim_codes_have_none():
    import string

    from nkisim.errors import ERRORS, nki_error
    for code, (cls, template) in ERRORS.items():
        fields = {f: "x" for _, f, _, _ in string.Formatter().parse(template) if f}
        exc = nki_error(code, **fields)
        assert isinstance(exc, cls) and exc.nki_code == code
        if code.startswith("err_"):
            assert str(exc).endswith(f". Info on how to fix: {DOCS}#{code.replace('_', '-')}")
        else:
            assert "Info on how to fix" not in str(exc)


def test_reduction_over_the_partition_axis_is_rejected():
    def body(a):
        nl.sum(nl.load(a), axis=0)

    with pytest.raises(ValueError) as ei:
        run(body, V)
    check(ei, ValueError, "nkisim_invalid_argument",
          "sum: axis must be free dimensions, not the partition dimension (0); transpose first "
          "or matmul with a ones vector (ref §1.10).")


def test_nl_store_of_a_tile_with_other_partitions_is_a_shape_mismatch():
    # nl.store has nl.load's "same partition rules" (reference §1.7): a (64, 128) tile is no
    # (128, 64) destination (a forgotten transpose), as `dst[...] = tile` says too; a tile's
    # elements into a 1-D destination, or the same partitions with other free dims, store
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    with pytest.raises(ValueError, match=r"of 'nl.store' has mismatched shapes: the destination "
                                         r"is \[128, 64\], the value \[64, 128\]"):
        nki.simulate_kernel(k, np.ones((64, 128), np.float32))

    @nki.jit
    def flat(a):
        out = nl.ndarray((256,), dtype=nl.float32, buffer=nl.shared_hbm)
        grid = nl.ndarray((128, 1, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, t)
        nl.store(grid, t)
        return out, grid

    a = np.arange(256, dtype=np.float32).reshape(128, 2)
    o, g = nki.simulate_kernel(flat, a)
    np.testing.assert_array_equal(o, a.ravel())
    np.testing.assert_array_equal(g, a.reshape(128, 1, 2))


def test_mistyped_arguments_get_one_line_errors_naming_the_api():
    # a negative dimension (a size computed wrong), memset's arguments swapped, and the grid
    # attribute a 2-D nl.mgrid lacks: nkisim's one-line errors, not NumPy's or Python's
    def negative(a):
        t = nl.ndarray((128, a.shape[1] - 8), dtype=nl.float32, buffer=nl.sbuf)
        return t

    def swapped(a):
        return nisa.memset(0.0, (128, 4), nl.float32)

    def no_y(a):
        g = nl.mgrid[0:128, 0:4]
        return nl.load(a[g.p, g.y])

    cases = [(negative, r"SBUF tensor 't' has shape \[128, -4\]: a negative dimension"),
             (swapped, r"memset: shape must be a tuple of ints \(memset\(shape, value, dtype\)\), "
                       r"got 0.0"),
             (no_y, r"nl.mgrid\(...\).y: this grid has 2 dimensions: .p \(dim 0\), .x \(dim 1\)")]
    for body, match in cases:
        def k(a, body=body):
            out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
            nl.store(out, body(a))
            return out

        with pytest.raises(ValueError, match=match):
            nki.simulate_kernel(nki.jit(k), np.ones((128, 4), np.float32))


def _indexed(index_of, buffer):
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        idx = nisa.iota(127 - i_p, dtype=nl.int32)         # a tile of 128 runtime indices
        src = a if buffer == "hbm" else nl.load(a)
        nl.store(out, nl.copy(src[index_of(i_p, idx)]) if buffer != "hbm"
                 else nl.load(src[index_of(i_p, idx)]))
        return out
    return k


def test_indirect_indexing_is_for_the_partition_axis_of_hbm_tensors():
    # reference §1.5 and §2.1: "allowed only in nl.load/nl.store/nisa.dma_copy on the partition
    # (or block) dim of HBM tensors with an SBUF index tile": err_indirect_indices_free_dim on a
    # free dim, err_copy_dynamic_indirect_indices_not_natively_supported within SBUF
    a = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
    out = nki.simulate_kernel(_indexed(lambda i_p, idx: (idx, 0), "hbm"), a)
    np.testing.assert_array_equal(out[:, 0], a[::-1, 0])                  # the valid gather
    with pytest.raises(NKISyntaxError, match="indirect indexing to be on the partition or "
                                             "block dimension"):
        nki.simulate_kernel(_indexed(lambda i_p, idx: (i_p, idx), "hbm"), a)
    with pytest.raises(NKISyntaxError, match="Indexing SBUF tile .* with a tile of runtime "
                                             "indices is not natively supported"):
        nki.simulate_kernel(_indexed(lambda i_p, idx: (idx, 0), "sbuf"), a)


def test_partition_broadcast_through_an_operator_is_an_error():
    # "Partition broadcasting not supported for operator overloads (+ - * / << >>)" (Beta 1
    # known issues, reference §1.7); nl.add broadcasts the (1, 512) row
    def k(a, op):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        row = nl.load(a[0:1, :])
        nl.store(out, op(t, row))
        return out

    a = np.random.default_rng(1).random((128, 512), dtype=np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(nki.jit(k), a, nl.add), a + a[0:1])
    with pytest.raises(ValueError, match=r"of 'operator \+' has mismatched shapes: partition "
                                         "broadcasting is not supported for operator overloads"):
        nki.simulate_kernel(nki.jit(k), a, lambda x, y: x + y)
