"""``nki.isa`` of NKI 0.3-0.7 (nkisim.nki.isa): the destination-passing ISA against NumPy.

Truth: the signatures and rules of shared/spec/nki-current.md §2.0/§2.4/§7 (STUB-R32 isa, MIG,
RN), the accumulate policy of §6 item 5, and NumPy for every value (computed here independently
of nkisim). Kernels run under ``nki.jit`` (the current face's runtime rules) and allocate with
the core's ``ndarray``; the trace comparisons run both styles under Beta 1's ``jit``.
"""

import inspect
import warnings

import ml_dtypes
import numpy as np
import pytest
from nki_tiles import load, out_of, ps, sb

import nkisim.nki as nki
from nkisim import beta1 as b1
from nkisim import ops
from nkisim.beta1 import isa as b1isa
from nkisim.errors import NKIWarning
from nkisim.nki import isa as nisa
from nkisim.runtime import last_run

RNG = np.random.default_rng(2029)
BF16 = np.dtype(ml_dtypes.bfloat16)


def rand(shape, lo=-4.0, hi=4.0, dtype=np.float32):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def instrs(op=None):
    return [i for i in last_run().trace.instrs if op is None or i.op == op]


def one(op):
    found = instrs(op)
    assert len(found) == 1, [i.op for i in instrs()]
    return found[0]


def bf16(x):
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# signatures (spec §2.4 "Current" column; STUB-R32 isa)

SIGNATURES = {
    "dma_copy": "dst src priority oob_mode dge_mode engine name",
    "tensor_copy": "dst src engine name",
    "tensor_scalar": "dst data op0 operand0 reverse0 op1 operand1 reverse1 engine name",
    "tensor_tensor": "dst data1 data2 op engine name",
    "tensor_reduce": "dst op data axis negate keepdims name",
    "nc_matmul": "dst stationary moving is_stationary_onezero is_moving_onezero is_transpose "
                 "accumulate tile_position tile_size perf_mode name",
    "nc_transpose": "dst data engine name",
    "activation": "dst op data bias scale reduce_op reduce_res reduce_cmd name",
    "iota": "dst pattern offset channel_multiplier name",
    "memset": "dst value engine name",
    "affine_select": "dst pattern channel_multiplier on_true_tile on_false_value cmp_op offset "
                     "name",
    "nc_stream_shuffle": "dst src shuffle_mask name",
}
DST_FIRST = ["dma_copy", "dma_transpose", "tensor_copy", "tensor_scalar", "tensor_tensor",
             "scalar_tensor_tensor", "tensor_tensor_scan", "tensor_reduce", "activation",
             "activation_reduce", "reciprocal", "iota", "memset", "affine_select", "nc_matmul",
             "nc_transpose", "max8", "nc_find_index8", "nc_match_replace8", "select_reduce",
             "range_select", "tensor_scalar_reduce", "tensor_partition_reduce",
             "nc_stream_shuffle", "bn_stats", "bn_aggr", "dropout", "tensor_copy_predicated",
             "local_gather", "sequence_bounds"]


@pytest.mark.parametrize("op", sorted(SIGNATURES))
def test_signature_is_the_current_one(op):
    params = list(inspect.signature(getattr(nisa, op)).parameters)
    assert params == SIGNATURES[op].split()


@pytest.mark.parametrize("op", DST_FIRST)
def test_dst_is_first_and_every_op_takes_name(op):
    params = inspect.signature(getattr(nisa, op)).parameters
    assert list(params)[0] == "dst"
    assert params["name"].default is None
    assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params.values())


@pytest.mark.parametrize("op", DST_FIRST)
@pytest.mark.parametrize("kw", ["dtype", "mask", "no_such_option"])
def test_dtype_mask_and_unknown_keywords_are_pythons_type_error(op, kw):
    # spec §2.0 item 2 (RN27: no dtype=/mask=) and item 5 (RN 2.28: unknown kwargs raise
    # "unexpected keyword argument"); Python's own message, raised before anything runs
    with pytest.raises(TypeError, match=f"{op}\\(\\) got an unexpected keyword argument '{kw}'"):
        getattr(nisa, op)(None, **{kw: None})


def test_enums_have_the_current_members():
    assert [m.name for m in nisa.engine] == ["unknown", "tensor", "vector", "scalar", "gpsimd",
                                             "dma", "sync"]
    assert [m.name for m in nisa.reduce_cmd] == ["idle", "reset", "reduce", "reset_reduce",
                                                 "load_reduce"]
    assert [m.name for m in nisa.dge_mode] == ["unknown", "swdge", "hwdge", "none"]
    assert [m.name for m in nisa.oob_mode] == ["error", "skip"]
    assert [m.name for m in nisa.matmul_perf_mode] == ["none", "double_row"]
    assert [m.name for m in nisa.nc_version] == ["gen2", "gen3", "gen4"]
    assert [m.name for m in nisa.dma_engine] == ["dma", "gpsimd_dma"]
    assert nisa.vector_engine is nisa.engine.vector
    assert issubclass(nisa.NkiValidationError, Exception)


@pytest.mark.parametrize("target,gen", [("trn1", "gen2"), ("trn2", "gen3")])
def test_get_nc_version_reports_the_target(monkeypatch, target, gen):
    monkeypatch.setenv("NKISIM_TARGET", target)
    seen = []

    @nki.jit
    def k():
        seen.append(nisa.get_nc_version())

    k()
    assert seen == [nisa.nc_version[gen]]
    assert nisa.get_nc_version() is nisa.nc_version[gen]


def test_integer_enum_values_are_rejected():
    # MIG 0.2->0.3: "Integer enum values (for example dge_mode=2) ... are rejected"
    @nki.jit
    def k(x):
        t = sb(x.shape)
        nisa.dma_copy(dst=t, src=x, dge_mode=2)

    # ... yet AWS's nki-library passes dge_mode=3 (a tolerated rule: an error in strict mode;
    # test_nki_conformance_patterns.py); other enums given as integers stay TypeErrors
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NKISIM_STRICT", "1")
        with pytest.raises(ValueError, match="Integer enum values"):
            k(rand((4, 4)))

    @nki.jit
    def k1(x):
        t = sb(x.shape)
        nisa.dma_copy(dst=t, src=x, oob_mode=0)

    with pytest.raises(TypeError, match="oob_mode must be a nki.isa.oob_mode member"):
        k1(rand((4, 4)))

    beta1_vector = b1isa.engine.vector      # Beta 1's enum, an IntEnum

    @nki.jit
    def k2(x):
        a = load(x)
        nisa.tensor_copy(dst=sb(x.shape), src=a, engine=beta1_vector)

    with pytest.raises(TypeError, match="engine must be a nki.isa.engine member"):
        k2(rand((4, 4)))


def test_ops_return_an_instruction_handle_not_a_tile():
    got = []

    @nki.jit
    def k(x):
        a = load(x)
        c = sb(x.shape)
        h = nisa.tensor_tensor(c, a, a, ops.add, name="twice")
        got.append(h)
        got.append(h.depends_on(h))
        return out_of(c)

    k(rand((4, 8)))
    h = got[0]
    assert isinstance(h, nisa.NkiInstruction) and not hasattr(h, "shape")
    assert got[1] is h
    assert h.instr is one("tensor_tensor") and h.name == "twice"


def test_ops_the_simulator_lacks_say_so():
    @nki.jit
    def k():
        nisa.exponential(None, None)

    with pytest.raises(Exception, match="nki.isa.exponential"):
        k()
    with pytest.raises(AttributeError, match="no attribute 'nc_no_such_op'"):
        nisa.nc_no_such_op  # noqa: B018


# ---------------------------------------------------------------------------------------------
# data movement


def test_dma_copy_positional_and_keyword_with_cast():
    a = rand((16, 24))

    @nki.jit
    def k(x):
        t = sb(x.shape, BF16)
        nisa.dma_copy(t, x)                  # positional (dst, src)
        o = ops.ndarray(x.shape, np.float32, buffer=ops.shared_hbm)
        nisa.dma_copy(src=t, dst=o)          # keywords in either order
        return o

    np.testing.assert_array_equal(k(a), bf16(a))
    assert [i.op for i in instrs()] == ["dma_copy", "dma_copy"]


def test_dma_copy_never_touches_psum():
    @nki.jit
    def k(x):
        p = ps(x.shape)
        nisa.memset(p, 0.0)
        o = ops.ndarray(x.shape, np.float32, buffer=ops.shared_hbm)
        nisa.dma_copy(dst=o, src=p)

    with pytest.raises(AssertionError, match="dma_copy src cannot be in PSUM"):
        k(rand((4, 4)))


def test_dma_copy_hwdge_needs_identical_dtypes():
    @nki.jit
    def k(x):
        t = sb(x.shape, np.float16)
        nisa.dma_copy(dst=t, src=x, dge_mode=nisa.dge_mode.hwdge)

    with pytest.raises(nisa.NkiValidationError, match="hwdge needs identical dtypes"):
        k(rand((4, 4)))


def test_dma_copy_priority_is_new_in_0_4(monkeypatch):
    @nki.jit
    def k(x):
        t = sb(x.shape)
        nisa.dma_copy(dst=t, src=x, priority=1)
        return out_of(t)

    a = rand((4, 4))
    np.testing.assert_array_equal(k(a), a)
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.3")
    with pytest.raises(TypeError, match="unexpected keyword argument 'priority'"):
        k(a)


def test_tensor_copy_casts_to_dst_dtype_and_evicts_psum():
    a = rand((32, 40), -300, 300)

    @nki.jit
    def k(x):
        p = ps(x.shape)
        nisa.tensor_copy(p, load(x))
        i = sb(x.shape, np.int32)
        nisa.tensor_copy(dst=i, src=p)
        return out_of(i)

    np.testing.assert_array_equal(k(a), np.rint(a).astype(np.int32))
    assert [i.op for i in instrs("tensor_copy")] == ["tensor_copy"] * 2


def test_tensor_copy_on_gpsimd_cannot_read_psum():
    @nki.jit
    def k(x):
        p = ps(x.shape)
        nisa.tensor_copy(p, load(x))
        nisa.tensor_copy(sb(x.shape), p, engine=nisa.engine.gpsimd)

    with pytest.raises(AssertionError, match="GpSimd engine cannot access PSUM"):
        k(rand((4, 4)))


def test_dma_transpose_exact_shape_until_0_6(monkeypatch):
    a = rand((24, 16))

    @nki.jit
    def k(x, shape):
        t = sb(shape)
        nisa.dma_transpose(dst=t, src=x)
        return out_of(t)

    np.testing.assert_array_equal(k(a, (16, 24)), a.T)
    np.testing.assert_array_equal(k(a, (16, 4, 6)), a.T.reshape(16, 4, 6))   # relaxed in 0.6
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.5")
    with pytest.raises(AssertionError, match=r"must be the transposed shape \[16, 24\]"):
        k(a, (16, 4, 6))


# ---------------------------------------------------------------------------------------------
# element-wise


@pytest.mark.parametrize("op,fn", [(ops.add, np.add), (ops.subtract, np.subtract),
                                   (ops.multiply, np.multiply), (ops.maximum, np.maximum),
                                   (np.minimum, np.minimum)])
@pytest.mark.parametrize("dt", [np.float32, BF16, np.float16])
def test_tensor_tensor_against_numpy(op, fn, dt):
    a, b = rand((64, 3, 10)), rand((64, 3, 10))

    @nki.jit
    def k(x, y):
        c = sb(x.shape, dt)
        nisa.tensor_tensor(c, load(x), load(y), op)
        return out_of(c, np.float32)

    expect = fn(a, b).astype(dt).astype(np.float32)
    np.testing.assert_array_equal(k(a, b), expect)
    ins = one("tensor_tensor")
    assert ins.engine == "vector" and ins.dtype == np.dtype(dt).name


def test_tensor_tensor_same_elements_per_partition_other_shape():
    a, b = rand((8, 12)), rand((8, 3, 4))

    @nki.jit
    def k(x, y):
        c = sb((8, 12))
        nisa.tensor_tensor(dst=c, data1=load(x), data2=load(y), op=ops.multiply)
        return out_of(c)

    np.testing.assert_array_equal(k(a, b), a * b.reshape(8, 12))


def test_tensor_tensor_does_not_broadcast():
    @nki.jit
    def k(x, y):
        nisa.tensor_tensor(sb((8, 12)), load(x), load(y), ops.add)

    with pytest.raises(AssertionError, match="no broadcast: use tensor_scalar"):
        k(rand((8, 12)), rand((8, 1)))


def test_tensor_tensor_inputs_not_both_in_psum():
    @nki.jit
    def k(x):
        p1, p2 = ps(x.shape), ps(x.shape)
        nisa.tensor_copy(p1, load(x))
        nisa.tensor_copy(p2, load(x))
        nisa.tensor_tensor(sb(x.shape), p1, p2, ops.add)

    with pytest.raises(nisa.NkiValidationError, match="cannot both be in PSUM"):
        k(rand((4, 4)))


def test_tensor_tensor_gpsimd_never_psum():
    @nki.jit
    def k(x):
        p = ps(x.shape)
        nisa.tensor_tensor(p, load(x), load(x), ops.add, engine=nisa.engine.gpsimd)

    with pytest.raises(AssertionError, match="GpSimd engine cannot access PSUM \\(dst"):
        k(rand((4, 4)))


def test_tensor_tensor_power_and_int32_operands_run_on_gpsimd():
    a, b = rand((8, 6), 0.5, 2), rand((8, 6), 0.5, 2)
    i, j = RNG.integers(-50, 50, (8, 6)).astype(np.int32), RNG.integers(-50, 50, (8, 6)).astype(
        np.int32)

    @nki.jit
    def k(x, y, u, v):
        c = sb(x.shape)
        nisa.tensor_tensor(c, load(x), load(y), ops.power)
        d = sb(u.shape, np.int32)
        nisa.tensor_tensor(d, load(u), load(v), ops.add)
        return out_of(c), out_of(d)

    c, d = k(a, b, i, j)
    np.testing.assert_allclose(c, a ** b, rtol=1e-6)
    np.testing.assert_array_equal(d, i + j)
    assert [x.engine for x in instrs("tensor_tensor")] == ["gpsimd", "gpsimd"]

    @nki.jit
    def k2(x, y):
        nisa.tensor_tensor(ps(x.shape), load(x), load(y), ops.power)

    with pytest.raises(AssertionError, match="GpSimd engine cannot access PSUM"):
        k2(a, b)


def test_partition_limit_message_matches_the_simulator_docs():
    # SIM: "AssertionError: tensor_tensor data1 partition dimension 256 exceeds maximum 128".
    # No allocation gives 256 partitions, so build such a view over a real tile's storage.
    from nkisim.tensor import Tensor

    @nki.jit
    def k(x):
        a = load(x)
        big = Tensor(np.zeros((256, 4), np.float32), None, a.root, a.dtype, (256, 4), 0, None)
        nisa.tensor_tensor(sb((128, 4)), big, a, ops.add)

    with pytest.raises(AssertionError,
                       match="^tensor_tensor data1 partition dimension 256 exceeds maximum 128$"):
        k(rand((128, 4)))


def test_tensor_scalar_scalar_and_vector_operands_with_reverse():
    a = rand((16, 20))
    v = rand((16, 1), 1, 2)

    @nki.jit
    def k(x, s):
        c = sb(x.shape, BF16)
        nisa.tensor_scalar(c, load(x), ops.subtract, load(s), True, ops.multiply, 3.0)
        return out_of(c, np.float32)

    np.testing.assert_array_equal(k(a, v), bf16((v - a) * np.float32(3.0)))


def test_tensor_scalar_on_the_trn2_scalar_engine_takes_mul_add_only():
    a = rand((8, 8))

    @nki.jit
    def k(x, op0, op1):
        c = sb(x.shape)
        nisa.tensor_scalar(c, load(x), op0, 2.0, op1=op1, operand1=None if op1 is None else 1.0,
                           engine=nisa.engine.scalar)
        return out_of(c)

    np.testing.assert_array_equal(k(a, ops.multiply, ops.add), a * 2 + 1)
    np.testing.assert_array_equal(k(a, ops.add, None), a + 2)
    with pytest.raises(AssertionError, match="Scalar engine of gen3 supports"):
        k(a, ops.maximum, None)


def test_tensor_scalar_vector_operand_must_be_fp32():
    @nki.jit
    def k(x, s):
        nisa.tensor_scalar(sb(x.shape), load(x), ops.add, load(s, np.float16))

    with pytest.raises(AssertionError, match="operand0 must be float32"):
        k(rand((4, 4)), rand((4, 1)))


def test_scalar_tensor_tensor_against_numpy():
    a, b = rand((16, 20)), rand((16, 20))
    v = rand((16, 1))

    @nki.jit
    def k(x, y, s):
        c = sb(x.shape)
        nisa.scalar_tensor_tensor(dst=c, data=load(x), op0=ops.multiply, operand0=load(s),
                                  op1=ops.add, operand1=load(y))
        return out_of(c)

    np.testing.assert_allclose(k(a, b, v), a * v + b, rtol=1e-6)


def test_tensor_tensor_scan_against_numpy():
    a, b = rand((8, 10)), rand((8, 10))

    @nki.jit
    def k(x, y):
        c = sb(x.shape)
        nisa.tensor_tensor_scan(c, load(x), load(y), 0.5, ops.multiply, ops.add)
        return out_of(c)

    expect = np.empty_like(a)
    prev = np.full(8, 0.5, np.float32)
    for i in range(10):
        prev = a[:, i] * prev + b[:, i]
        expect[:, i] = prev
    np.testing.assert_allclose(k(a, b), expect, rtol=1e-5)


def test_reciprocal_against_numpy():
    a = rand((8, 10), 0.5, 4)

    @nki.jit
    def k(x):
        c = sb(x.shape)
        nisa.reciprocal(c, load(x))
        return out_of(c)

    np.testing.assert_allclose(k(a), 1 / a, rtol=1e-6)


def test_activation_scale_bias_and_reduce():
    a = rand((32, 24), -2, 2)
    bias = rand((32, 1))
    scale = rand((32, 1), 0.5, 1.5)

    @nki.jit
    def k(x, b, s):
        c = sb(x.shape, BF16)
        r = sb((32, 1))
        # (reset_reduce: with the default idle, reduce_res reads the registers unchanged,
        # STUB-R32 activation pseudocode; test_nki_isa_audit_fixes.py)
        nisa.activation(c, ops.exp, load(x), bias=load(b), scale=load(s), reduce_op=ops.add,
                        reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return out_of(c, np.float32), out_of(r)

    out, red = k(a, bias, scale)
    y = np.exp(a * scale + bias)
    np.testing.assert_allclose(out, bf16(y), rtol=1e-2)
    np.testing.assert_allclose(red[:, 0], y.sum(axis=1), rtol=1e-5)
    ins = one("activation")
    assert ins.engine == "scalar" and len(ins.writes) == 2     # dst and reduce_res


def test_activation_takes_an_fp8_bias_tile():
    # nki 0.3+ documents no bias dtype rule (Beta 1's err_activation_bias_invalid_type allowed
    # fp32/fp16/bf16 only; tests/nkisim/test_errors.py): AWS's nki-library qkv_cte passes a
    # float8_e4m3 bias under static quantization
    FP8 = np.dtype(ml_dtypes.float8_e4m3)
    a = rand((32, 24), -2, 2)
    bias = rand((32, 1), -1, 1).astype(FP8)

    @nki.jit
    def k(x, b):
        c = sb(x.shape)
        nisa.activation(c, ops.exp, load(x), bias=load(b))
        return out_of(c)

    np.testing.assert_allclose(k(a, bias), np.exp(a + bias.astype(np.float32)), rtol=1e-5)
    with pytest.raises(TypeError, match="must be a vector of type float32"):
        k(a, (bias.astype(np.float32) * 4).astype(np.int32))


def test_activation_reduce_sums_along_the_free_dims():
    a = rand((16, 3, 8), -1, 1)

    @nki.jit
    def k(x):
        c = sb(x.shape)
        r = sb((16, 1))
        nisa.activation_reduce(c, ops.tanh, load(x), ops.add, r, scale=2.0)
        return out_of(c), out_of(r)

    c, r = k(a)
    np.testing.assert_allclose(c, np.tanh(2 * a), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(r[:, 0], np.tanh(2 * a).sum(axis=(1, 2)), rtol=1e-5)


def test_activation_reduce_op_must_be_add_in_the_current_dialect():
    """nki-current §2.4 activation: "`reduce_op` must be `nl.add`" (every target); Beta 1 says
    so of NC-v2 only (reference §1.10), so a trn2 Beta 1 kernel may take the max."""
    a = rand((16, 8), -1, 1)

    @nki.jit
    def k(x):
        c, r = sb(x.shape), sb((16, 1))
        nisa.activation(c, ops.exp, load(x), reduce_op=ops.maximum, reduce_res=r)
        return out_of(r)

    with pytest.raises(Exception, match="activation: reduce_op must be nl.add"):
        k(a)

    @b1.jit
    def beta1(x):
        r = b1.language.ndarray((16, 1), dtype=np.float32, buffer=b1.language.sbuf)
        b1isa.activation(ops.exp, b1.language.load(x), reduce_op=ops.maximum, reduce_res=r,
                         reduce_cmd=b1isa.reduce_cmd.reset_reduce)
        o = b1.language.ndarray((16, 1), dtype=np.float32, buffer=b1.language.shared_hbm)
        b1.language.store(o, r)
        return o

    np.testing.assert_allclose(b1.simulate_kernel(beta1, a)[:, 0], np.exp(a).max(axis=1),
                               rtol=1e-6)


def test_activation_reduce_cmd_load_reduce_is_not_silently_ignored():
    # activation's docs define reset, idle, reduce and reset_reduce (the others are simulated:
    # test_nki_isa_audit_fixes.py); load_reduce has nothing to load
    @nki.jit
    def k(x):
        nisa.activation(sb(x.shape), ops.exp, load(x), reduce_op=ops.add,
                        reduce_res=sb((4, 1)), reduce_cmd=nisa.reduce_cmd.load_reduce)

    with pytest.raises(Exception, match="reduce_cmd=load_reduce"):
        k(rand((4, 4)))


# ---------------------------------------------------------------------------------------------
# reductions


@pytest.mark.parametrize("axis", [(3,), (2, 3), (1, 2, 3), 3, -1, (-2, -1)])
def test_tensor_reduce_over_the_last_free_axes(axis):
    a = rand((8, 3, 4, 5))
    ax = (axis,) if isinstance(axis, int) else axis

    @nki.jit
    def k(x):
        n = tuple(d % 4 for d in ax)
        shape = tuple(s for d, s in enumerate(x.shape) if d not in n)
        c = sb(shape if len(shape) >= 2 else (8, 1))
        nisa.tensor_reduce(c, ops.maximum, load(x), axis)
        return out_of(c)

    expect = a.max(axis=tuple(d % 4 for d in ax))
    np.testing.assert_array_equal(k(a).reshape(expect.shape), expect)


@pytest.mark.parametrize("axis", [(1, 3), (2,), (1, 2), 0, (0, 1, 2, 3)])
def test_tensor_reduce_rejects_axes_that_are_not_the_last(axis):
    # STUB-R32: "the axes must be the last contiguous free dims ending at the final dim";
    # the Beta 1 CS149 max-pool axis=(2, 4) style is invalid
    @nki.jit
    def k(x):
        nisa.tensor_reduce(sb((8, 1)), ops.maximum, load(x), axis)

    with pytest.raises(AssertionError, match="must be the last contiguous free dimensions"):
        k(rand((8, 3, 4, 5)))


def test_tensor_reduce_negate_keepdims_and_cast():
    a = rand((16, 6, 7))

    @nki.jit
    def k(x):
        c = sb((16, 1, 1), BF16)
        nisa.tensor_reduce(dst=c, op=ops.add, data=load(x), axis=(1, 2), negate=True,
                           keepdims=True)
        return out_of(c, np.float32)

    np.testing.assert_allclose(k(a), bf16(-a.sum(axis=(1, 2), keepdims=True)), rtol=1e-2)


def test_tensor_partition_reduce_against_numpy():
    a = rand((32, 10))

    @nki.jit
    def k(x):
        c = sb((1, 10))
        nisa.tensor_partition_reduce(c, ops.add, load(x))
        return out_of(c)

    np.testing.assert_allclose(k(a), a.sum(axis=0, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("with_res", [True, False])
def test_tensor_scalar_reduce(with_res):
    a = rand((16, 12))

    @nki.jit
    def k(x):
        c = sb(x.shape)
        r = sb((16, 1)) if with_res else None
        nisa.tensor_scalar_reduce(c, load(x), ops.multiply, 2.0, ops.add, r)
        return (out_of(c), out_of(r)) if with_res else out_of(c)

    res = k(a)
    if with_res:
        np.testing.assert_allclose(res[1][:, 0], (2 * a).sum(axis=1), rtol=1e-5)
        res = res[0]
    np.testing.assert_array_equal(res, 2 * a)
    assert len(one("tensor_scalar_reduce").writes) == (2 if with_res else 1)


def test_tensor_scalar_reduce_res_is_required_before_0_6(monkeypatch):
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.5")

    @nki.jit
    def k(x):
        nisa.tensor_scalar_reduce(sb(x.shape), load(x), ops.multiply, 2.0, ops.add)

    with pytest.raises(TypeError, match="reduce_res"):
        k(rand((4, 4)))


def test_max8_find_index8_match_replace8():
    a = RNG.permutation(16 * 40).astype(np.float32).reshape(16, 40)

    @nki.jit
    def k(x):
        d = load(x)
        top = sb((16, 8))
        nisa.max8(top, d)
        idx = sb((16, 8), np.uint32)
        nisa.nc_find_index8(dst=idx, data=d, vals=top)
        rep = sb(x.shape)
        ridx = sb((16, 8), np.uint32)
        nisa.nc_match_replace8(rep, d, top, -1.0, dst_idx=ridx)
        return out_of(top), out_of(idx), out_of(rep), out_of(ridx)

    top, idx, rep, ridx = k(a)
    order = np.argsort(-a, axis=1)[:, :8]
    np.testing.assert_array_equal(top, np.take_along_axis(a, order, axis=1))
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_array_equal(ridx, order)
    expect = a.copy()
    np.put_along_axis(expect, order, -1.0, axis=1)
    np.testing.assert_array_equal(rep, expect)
    assert len(one("nc_match_replace8").writes) == 2


def test_select_reduce_and_range_select():
    a = rand((8, 16))
    pred = (RNG.random((8, 16)) < 0.5).astype(np.uint8)

    @nki.jit
    def k(x, p):
        d = load(x)
        sel = sb(x.shape)
        r1 = sb((8, 1))
        nisa.select_reduce(sel, load(p), d, -5.0, reduce_res=r1,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rs = sb(x.shape)
        r2 = sb((8, 1))
        nisa.range_select(rs, d, ops.greater_equal, ops.less, 3.0, 9.0,
                          reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=r2,
                          on_false_value=ops.fp32.min)     # "this must be FP32_MIN"
        return out_of(sel), out_of(r1), out_of(rs), out_of(r2)

    sel, r1, rs, r2 = k(a, pred)
    exp_sel = np.where(pred != 0, a, np.float32(-5.0))
    np.testing.assert_array_equal(sel, exp_sel)
    np.testing.assert_array_equal(r1[:, 0], exp_sel.max(axis=1))
    i = np.arange(16)
    exp_rs = np.where((i >= 3) & (i < 9), a, np.finfo(np.float32).min)
    np.testing.assert_array_equal(rs, exp_rs)
    np.testing.assert_array_equal(r2[:, 0], exp_rs.max(axis=1))


# ---------------------------------------------------------------------------------------------
# constants and selection


def test_memset_value_type_must_match_an_integer_dtype():
    @nki.jit
    def k(v):
        t = sb((4, 8), np.int32)
        nisa.memset(t, v)
        return out_of(t)

    np.testing.assert_array_equal(k(7), np.full((4, 8), 7, np.int32))
    # a non-integral float has no int32 value: an error
    with pytest.raises(AssertionError, match="memset value 2.5 is a float but dst is int32"):
        k(2.5)
    # an integral float is a tolerated rule (AWS's nki-library router_topk memsets uint32 tiles
    # with value=0.0): a warning quoting the rule, the value read exactly; strict: an error
    with pytest.warns(Warning, match="must match dst.dtype"):
        np.testing.assert_array_equal(k(2.0), np.full((4, 8), 2, np.int32))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NKISIM_STRICT", "1")
        with pytest.raises(ValueError, match="must match dst.dtype"):
            k(0.0)


def test_memset_float_tile_and_engines():
    @nki.jit
    def k():
        t = sb((4, 8), BF16)
        nisa.memset(dst=t, value=0, engine=nisa.engine.gpsimd)      # an int 0 on a float tile
        u = sb((4, 8))
        nisa.memset(u, -1.5)
        return out_of(t, np.float32), out_of(u)

    t, u = k()
    np.testing.assert_array_equal(t, np.zeros((4, 8), np.float32))
    np.testing.assert_array_equal(u, np.full((4, 8), -1.5, np.float32))
    assert [i.engine for i in instrs("memset")] == ["gpsimd", "vector"]


def test_memset_engine_must_be_vector_or_gpsimd():
    @nki.jit
    def k():
        nisa.memset(sb((4, 8)), 0.0, engine=nisa.engine.scalar)

    with pytest.raises(AssertionError, match="engine scalar is not supported"):
        k()


def test_iota_pattern_against_numpy():
    @nki.jit
    def k():
        t = sb((16, 3, 5), np.int32)
        nisa.iota(t, [[10, 3], [-1, 5]], offset=4, channel_multiplier=100)
        f = sb((16, 4))
        nisa.iota(dst=f, pattern=[[2, 4]])
        return out_of(t), out_of(f)

    t, f = k()
    p, i, j = np.meshgrid(np.arange(16), np.arange(3), np.arange(5), indexing="ij")
    np.testing.assert_array_equal(t, 4 + 100 * p + 10 * i - j)
    np.testing.assert_array_equal(f, np.tile(np.arange(0, 8, 2, dtype=np.float32), (16, 1)))


def test_iota_writes_sbuf_only():
    @nki.jit
    def k():
        nisa.iota(ps((16, 4)), [[1, 4]])

    with pytest.raises(AssertionError, match="iota dst must be in SBUF"):
        k()


def test_affine_select_causal_mask_against_numpy():
    a = rand((32, 32))

    @nki.jit
    def k(x):
        c = sb(x.shape)
        # keep where q (partition) >= k (free index): p - f >= 0; positional order of 0.3+
        nisa.affine_select(c, [[-1, 32]], 1, load(x), -1e9, ops.greater_equal)
        return out_of(c)

    p, f = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    np.testing.assert_array_equal(k(a), np.where(p >= f, a, np.float32(-1e9)))
    assert one("affine_select").engine == "gpsimd"


def test_affine_select_offset_is_a_keyword_with_default_0():
    a = rand((8, 8))

    @nki.jit
    def k(x):
        c = sb(x.shape)
        nisa.affine_select(dst=c, pattern=[[1, 8]], channel_multiplier=0, on_true_tile=load(x),
                           on_false_value=0.0, offset=-3)
        return out_of(c)

    f = np.arange(8)
    np.testing.assert_array_equal(k(a), np.where(f - 3 == 0, a, 0.0))


def test_tensor_copy_predicated_and_dropout():
    a, b = rand((8, 10)), rand((8, 10))
    pred = (RNG.random((8, 10)) < 0.5).astype(np.uint8)

    @nki.jit
    def k(x, y, p):
        d = load(x)
        nisa.tensor_copy_predicated(d, load(y), load(p), reverse_pred=True)
        z = sb(x.shape)
        nisa.dropout(z, load(y), 1.0)
        kept = sb(x.shape)
        nisa.dropout(kept, load(y), 0.0)
        return out_of(d), out_of(z), out_of(kept)

    d, z, kept = k(a, b, pred)
    np.testing.assert_array_equal(d, np.where(pred == 0, b, a))
    np.testing.assert_array_equal(z, np.zeros_like(b))          # "prob 1.0: all zeros"
    np.testing.assert_array_equal(kept, b)


def test_bn_stats_and_bn_aggr_give_mean_and_variance():
    a = rand((16, 64))

    @nki.jit
    def k(x):
        st = sb((16, 6))
        nisa.bn_stats(st, load(x))
        ag = sb((16, 2))
        nisa.bn_aggr(dst=ag, data=st)
        return out_of(ag)

    ag = k(a)
    np.testing.assert_allclose(ag[:, 0], a.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ag[:, 1], a.var(axis=1), rtol=1e-4)


def test_local_gather_and_sequence_bounds():
    src = rand((16, 20))
    index = RNG.integers(0, 20, size=(16, 2)).astype(np.uint16)
    seg = np.array([[1, 1, 2, 2, 2, 0, 3]], np.int32)

    @nki.jit
    def k(s, ix, sg):
        g = sb((16, 32, 1))
        nisa.local_gather(g, load(s), load(ix))
        bnd = sb((1, 2, 7), np.int32)
        nisa.sequence_bounds(bnd, load(sg))
        return out_of(g), out_of(bnd)

    g, bnd = k(src, index, seg)
    flat = index.flatten(order="F")           # partition-first within the 16-partition group
    np.testing.assert_array_equal(g[:, :, 0], src[:, flat])
    np.testing.assert_array_equal(bnd[0], [[0, 0, 2, 2, 2, 7, 6], [2, 2, 5, 5, 5, -1, 7]])


def test_nc_stream_shuffle_takes_dst_first():
    a = rand((32, 6))
    perm = list(RNG.permutation(32))

    @nki.jit
    def k(x):
        d = sb(x.shape, name="d")
        nisa.memset(d, 0.0)
        nisa.nc_stream_shuffle(d, load(x), perm)
        return out_of(d)

    np.testing.assert_array_equal(k(a), a[perm])
    ins = one("nc_stream_shuffle")
    assert ins.writes[0].name == "d"


# ---------------------------------------------------------------------------------------------
# Tensor Engine: nc_transpose


def test_nc_transpose_tensor_engine_into_psum():
    a = rand((128, 96)).astype(BF16)

    @nki.jit
    def k(x):
        p = ps((96, 128), BF16)
        nisa.nc_transpose(p, load(x))
        return out_of(p)

    np.testing.assert_array_equal(k(a), a.T)
    assert one("nc_transpose").engine == "tensor"


def test_nc_transpose_dtype_must_match():
    @nki.jit
    def k(x):
        nisa.nc_transpose(ps((8, 8)), load(x, np.float16))

    with pytest.raises(AssertionError, match="dst dtype float32 must equal the data dtype"):
        k(rand((8, 8)))


def test_nc_transpose_tensor_engine_writes_psum_only():
    @nki.jit
    def k(x):
        nisa.nc_transpose(sb((64, 128)), load(x))

    with pytest.raises(AssertionError, match="Tensor Engine writes PSUM"):
        k(rand((128, 64)))


def test_nc_transpose_explicit_engine_is_ignored_before_0_4(monkeypatch):
    # RN 2.30: before 0.4.0 an explicit engine was silently ignored (the shape decides)
    @nki.jit
    def k(x):
        p = ps((64, 128))
        nisa.nc_transpose(p, load(x), engine=nisa.engine.vector)
        return out_of(p)

    a = rand((128, 64))
    with pytest.raises(Exception, match="vector engine"):
        k(a)
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.3")
    np.testing.assert_array_equal(k(a), a.T)
    assert one("nc_transpose").engine == "tensor"


def test_nc_transpose_vector_engine_in_sbuf():
    a = rand((32, 20))

    @nki.jit
    def k(x):
        t = sb((20, 32))
        nisa.nc_transpose(dst=t, data=load(x), engine=nisa.engine.vector)
        return out_of(t)

    np.testing.assert_array_equal(k(a), a.T)
    assert one("nc_transpose").engine == "vector"


# ---------------------------------------------------------------------------------------------
# Tensor Engine: nc_matmul and the accumulate policy (spec §2.4, §6 item 5)


def _mm_kernel(steps):
    """A kernel running ``steps``: ("mm", accumulate, col_slice) or ("memset", v, col_slice)
    on one fresh (32, 16) PSUM tile, with stationary ``w`` (8, 32) and moving ``x`` (8, 16)."""
    @nki.jit
    def k(w, x):
        ws, xs = load(w), load(x)
        p = ps((32, 16))
        for kind, arg, cols in steps:
            if kind == "mm":
                nisa.nc_matmul(p[:, cols], ws, xs[:, cols], accumulate=arg)
            else:
                nisa.memset(p[:, cols], arg)
        return out_of(p)
    return k


W, X = rand((8, 32)), rand((8, 16))
MM = (W.T @ X).astype(np.float32)
ALL = slice(0, 16)


def test_matmul_accumulate_none_overwrites_first_then_adds():
    out = _mm_kernel([("mm", None, ALL)] * 3)(W, X)
    np.testing.assert_allclose(out, 3 * MM, rtol=1e-5)
    assert [i.detail["accumulate"] for i in instrs("nc_matmul")] == [False, True, True]


def test_matmul_accumulate_false_restarts_the_group():
    out = _mm_kernel([("mm", None, ALL), ("mm", None, ALL), ("mm", False, ALL)])(W, X)
    np.testing.assert_allclose(out, MM, rtol=1e-5)


def test_matmul_explicit_accumulate_i_gt_0_as_the_docs_hint():
    out = _mm_kernel([("mm", i > 0, ALL) for i in range(4)])(W, X)
    np.testing.assert_allclose(out, 4 * MM, rtol=1e-5)


def test_matmul_none_after_a_memset_overwrites():
    # a non-matmul write ends the group (spec §6 item 5): the next matmul starts a new one
    out = _mm_kernel([("memset", 5.0, ALL), ("mm", None, ALL)])(W, X)
    np.testing.assert_allclose(out, MM, rtol=1e-5)


def test_matmul_true_after_a_memset_adds_and_warns():
    with pytest.warns(NKIWarning, match="accumulate=True.*no matmul initialised"):
        out = _mm_kernel([("memset", 5.0, ALL), ("mm", True, ALL)])(W, X)
    np.testing.assert_allclose(out, MM + 5, rtol=1e-5)


def test_matmul_true_into_fresh_psum_is_garbage_and_warns_from_0_5(monkeypatch):
    # garbage (never-written PSUM plus the product) making up the whole output: the read's
    # error, in every version; the version decides only the warning (0.5.0+)
    def uninit():
        return pytest.raises(ValueError, match=r"read of uninitialized memory: 'nc_matmul "
                                               r"\(accumulate\)'")
    with pytest.warns(NKIWarning, match="no matmul initialised"), uninit():
        _mm_kernel([("mm", True, ALL)])(W, X)
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.4")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NKIWarning)
        with uninit():
            _mm_kernel([("mm", True, ALL)])(W, X)


@pytest.mark.parametrize("steps, cols_twice", [
    # a whole tile initialised, then half of it rewritten by a memset: that half starts over
    ([("mm", None, ALL), ("memset", 5.0, slice(0, 8)), ("mm", None, ALL)], slice(8, 16)),
    # a whole tile initialised, then a matmul into a part of it: that part accumulates
    ([("mm", None, ALL), ("mm", None, slice(0, 8))], slice(0, 8)),
])
def test_matmul_none_after_a_whole_tile_group(steps, cols_twice):
    out = _mm_kernel(steps)(W, X)
    expect = MM.copy()
    expect[:, cols_twice] *= 2
    np.testing.assert_allclose(out, expect, rtol=1e-5)


def test_matmul_none_tracks_overlapping_regions_per_element():
    # the conv pattern (RN 2.32): [0:10) then [6:16): columns 6..9 accumulate, 10..15 start
    out = _mm_kernel([("mm", None, slice(0, 10)), ("mm", None, slice(6, 16))])(W, X)
    expect = MM.copy()
    expect[:, 6:10] *= 2
    np.testing.assert_allclose(out, expect, rtol=1e-5)


def _garbage_rows_kernel(store_rows):
    """Rows 16:32 of PSUM ``p`` are a matmul of a never-written stationary; then the whole of
    ``p`` accumulates another matmul (accumulate=None); rows ``store_rows`` go to HBM."""
    @nki.jit
    def k(w, x):
        ws, xs = load(w), load(x)
        junk = sb((8, 16))                                  # never written
        p = ps((32, 16))
        nisa.nc_matmul(p[0:16, :], ws[:, 0:16], xs)
        nisa.nc_matmul(p[16:32, :], junk, xs)
        nisa.nc_matmul(p, ws, xs)                           # adds everywhere
        return out_of(p[store_rows, :])
    return k


def test_matmul_accumulating_into_garbage_stays_garbage_not_an_error():
    # qkv_cte/moe_cte (nki-library): the accumulate read of a partial sum computed from
    # never-written inputs is not itself an error (it is garbage, like the sum it was): only
    # garbage that reaches HBM is (nkisim.tensor, "never-written values"; an output partly
    # garbage is a warning naming the first read of never-written memory)
    out = _garbage_rows_kernel(slice(0, 16))(W, X)
    np.testing.assert_allclose(out, 2 * MM[0:16], rtol=1e-5)
    with pytest.warns(NKIWarning, match=r"partly written.*\[16:32, 0:16\].*uninitialized"):
        _garbage_rows_kernel(slice(0, 32))(W, X)


def test_matmul_group_survives_reads_of_the_psum_tile():
    # reading PSUM (tensor_copy to SBUF) is not a write: the group continues
    @nki.jit
    def k(w, x):
        ws, xs = load(w), load(x)
        p = ps((32, 16))
        nisa.nc_matmul(p, ws, xs)
        mid = sb((32, 16))
        nisa.tensor_copy(mid, p)
        nisa.nc_matmul(p, ws, xs)
        return out_of(mid), out_of(p)

    mid, end = k(W, X)
    np.testing.assert_allclose(mid, MM, rtol=1e-5)
    np.testing.assert_allclose(end, 2 * MM, rtol=1e-5)


def test_matmul_fresh_psum_tile_per_iteration_starts_clean():
    @nki.jit
    def k(w, x):
        ws, xs = load(w), load(x)
        outs = []
        for _ in range(2):
            p = ps((32, 16))            # a new nl.ndarray starts with a clear mask
            nisa.nc_matmul(p, ws, xs)
            outs.append(out_of(p))
        return tuple(outs)

    a, b = k(W, X)
    np.testing.assert_allclose(a, MM, rtol=1e-5)
    np.testing.assert_allclose(b, MM, rtol=1e-5)


def test_matmul_3d_moving_window():
    w = rand((16, 32))
    x = rand((16, 6, 10))

    @nki.jit
    def k(wa, xa):
        p = ps((32, 4, 8))
        nisa.nc_matmul(dst=p, stationary=load(wa), moving=load(xa)[:, 1:5, 2:10])
        return out_of(p)

    expect = np.einsum("km,kab->mab", w, x[:, 1:5, 2:10])
    np.testing.assert_allclose(k(w, x), expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case,match", [
    ("dst_sbuf", "nc_matmul dst must be in PSUM"),
    ("stationary_psum", "nc_matmul stationary must be in SBUF"),
    ("bf16_dst", "nc_matmul dst dtype must be float32 on gen3, got bfloat16"),
    ("shape", "nc_matmul dst shape \\[32, 8\\] does not match the result shape \\[32, 16\\]"),
])
def test_matmul_memory_and_dtype_rules(case, match):
    @nki.jit
    def k(w, x):
        ws, xs = load(w), load(x)
        if case == "dst_sbuf":
            nisa.nc_matmul(sb((32, 16)), ws, xs)
        elif case == "stationary_psum":
            p = ps((8, 32))
            nisa.tensor_copy(p, ws)
            nisa.nc_matmul(ps((32, 16)), p, xs)
        elif case == "bf16_dst":
            nisa.nc_matmul(ps((32, 16), BF16), ws, xs)
        else:
            nisa.nc_matmul(ps((32, 8)), ws, xs)

    with pytest.raises(nisa.NkiValidationError, match=match):
        k(W, X)


def test_matmul_is_transpose_keeps_the_data_dtype():
    a = rand((64, 32)).astype(BF16)

    @nki.jit
    def k(x, ident):
        p = ps((32, 64), BF16)
        nisa.nc_matmul(p, load(x), load(ident), is_transpose=True)
        return out_of(p)

    np.testing.assert_array_equal(k(a, np.eye(64, dtype=BF16)), a.T)

    @nki.jit
    def k2(x, ident):
        nisa.nc_matmul(ps((32, 64)), load(x), load(ident), is_transpose=True)

    with pytest.raises(AssertionError, match="dst dtype float32 must equal the stationary "
                                             "dtype bfloat16"):
        k2(a, np.eye(64, dtype=BF16))


def test_core_constraint_errors_are_validation_errors_of_their_own_class_too():
    # contraction (partition) sizes 8 and 16 differ: the core's check, raised through the face
    @nki.jit
    def k(w, x):
        nisa.nc_matmul(ps((32, 16)), load(w), load(x))

    with pytest.raises(nisa.NkiValidationError, match="\\[8, 32\\].*\\[16, 16\\]") as e:
        k(W, rand((16, 16)))
    assert isinstance(e.value, AssertionError) and isinstance(e.value, ValueError)
    assert e.value.nki_code == "nkisim_matmul_contraction_mismatch"


def test_a_core_syntax_error_code_keeps_its_message_as_a_validation_error():
    # err_activation_scale_scalar_or_vector is an NKISyntaxError in the core
    @nki.jit
    def k(x, s):
        nisa.activation(sb(x.shape), ops.exp, load(x), scale=load(s))

    with pytest.raises(nisa.NkiValidationError, match="Scale parameter of activation") as e:
        k(rand((4, 4)), rand((4, 2)))
    assert isinstance(e.value, SyntaxError) and "Scale parameter" in str(e.value)


def test_kernel_checks_are_not_validation_errors():
    # reading never-written SBUF into an output is the uninitialised-read check, not a
    # hardware constraint
    @nki.jit
    def k(x):
        c = sb(x.shape)
        nisa.tensor_tensor(c, load(x), sb(x.shape), ops.add)
        return out_of(c)

    with pytest.raises(ValueError) as e:
        k(rand((4, 4)))
    assert not isinstance(e.value, nisa.NkiValidationError)


def test_matmul_accumulate_must_be_a_bool_or_none():
    @nki.jit
    def k(w, x):
        nisa.nc_matmul(ps((32, 16)), load(w), load(x), accumulate=3)

    with pytest.raises(TypeError, match="accumulate must be None, True or False"):
        k(W, X)


# ---------------------------------------------------------------------------------------------
# one instruction per call, the same as Beta 1's `dst[...] = nisa.op(...)`


def _regions(rs):
    # HBM keys are allocation ids, new in every run; on-chip keys are allocation sites
    return tuple((r.buffer, None if r.buffer == "hbm" else r.key, r.p0, r.p1, r.b0, r.b1)
                 for r in rs)


def _trace_of(kernel, *args):
    kernel(*args)
    return [(i.op, i.engine, _regions(i.reads), _regions(i.writes), i.dtype,
             i.partitions, i.free, {k: v for k, v in i.detail.items() if k != "name"})
            for i in last_run().trace.instrs]


@pytest.mark.parametrize("op", ["tensor_tensor", "tensor_scalar", "activation", "tensor_copy",
                                "tensor_reduce", "nc_transpose", "reciprocal", "memset",
                                "nc_matmul"])
def test_trace_equals_beta1_assignment_trace(op):
    a, b = rand((128, 64)), rand((128, 64))

    def body(style, x, y):
        xs, ys = sb(x.shape), sb(x.shape)
        if style == "b1":
            xs[...] = ops.load(x)
            ys[...] = ops.load(y)
        else:
            nisa.dma_copy(xs, x)
            nisa.dma_copy(ys, y)
        dst = {"tensor_reduce": lambda: sb((128, 1), BF16),
               "nc_transpose": lambda: ps((64, 128)),
               "nc_matmul": lambda: ps((64, 64))}.get(op, lambda: sb((128, 64), BF16))()
        if style == "b1":
            if op == "tensor_tensor":
                dst[...] = b1isa.tensor_tensor(xs, ys, np.add, dtype=dst.dtype)
            elif op == "tensor_scalar":
                dst[...] = b1isa.tensor_scalar(xs, np.multiply, 2.0, dtype=dst.dtype)
            elif op == "activation":
                dst[...] = b1isa.activation(ops.exp, xs, scale=0.5, dtype=dst.dtype)
            elif op == "tensor_copy":
                dst[...] = b1isa.tensor_copy(xs, dtype=dst.dtype)
            elif op == "tensor_reduce":
                dst[...] = b1isa.tensor_reduce(np.maximum, xs, axis=(1,), dtype=dst.dtype)
            elif op == "nc_transpose":
                dst[...] = b1isa.nc_transpose(xs, dtype=dst.dtype)
            elif op == "reciprocal":
                dst[...] = b1isa.reciprocal(xs, dtype=dst.dtype)
            elif op == "memset":
                dst[...] = b1isa.memset(dst.shape, 1.5, dst.dtype)
            else:
                dst[...] = b1isa.nc_matmul(xs[:, 0:64], ys)
        else:
            if op == "tensor_tensor":
                nisa.tensor_tensor(dst, xs, ys, ops.add)
            elif op == "tensor_scalar":
                nisa.tensor_scalar(dst, xs, ops.multiply, 2.0)
            elif op == "activation":
                nisa.activation(dst, ops.exp, xs, scale=0.5)
            elif op == "tensor_copy":
                nisa.tensor_copy(dst, xs)
            elif op == "tensor_reduce":
                nisa.tensor_reduce(dst, ops.maximum, xs, axis=(1,))
            elif op == "nc_transpose":
                nisa.nc_transpose(dst, xs)
            elif op == "reciprocal":
                nisa.reciprocal(dst, xs)
            elif op == "memset":
                nisa.memset(dst, 1.5)
            else:
                nisa.nc_matmul(dst, xs[:, 0:64], ys)

    @b1.jit
    def k1(x, y):
        body("b1", x, y)

    @b1.jit
    def k2(x, y):
        body("face", x, y)

    t1, t2 = _trace_of(k1, a, b), _trace_of(k2, a, b)
    assert t1[2:] == t2[2:] and len(t2) == 3
    assert t2[2][0] == op and t2[2][3][0][0] == ("psum" if op in ("nc_matmul", "nc_transpose")
                                                 else "sbuf")


def test_trace_of_an_accumulating_matmul_equals_beta1_plus_equals():
    def body(style, w, x):
        ws, xs = sb(w.shape), sb(x.shape)
        ws[...] = ops.load(w)
        xs[...] = ops.load(x)
        p = ps((32, 16))
        for _ in range(3):
            if style == "b1":
                p += b1isa.nc_matmul(ws, xs)
            else:
                nisa.nc_matmul(p, ws, xs)

    @b1.jit
    def k1(w, x):
        body("b1", w, x)

    @b1.jit
    def k2(w, x):
        body("face", w, x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # Beta 1 `+=` into an nl.ndarray is a tolerated rule
        t1 = _trace_of(k1, W, X)
    t2 = _trace_of(k2, W, X)
    # the same instructions; only the first matmul's flag differs: it starts the group
    # (overwrites), which Beta 1's `+=` records as an accumulation too
    assert [t[7].pop("accumulate") for t in t2[2:]] == [False, True, True]
    assert [t[7].pop("accumulate") for t in t1[2:]] == [True, True, True]
    assert t1 == t2 and len(t2) == 5


def test_every_instruction_names_dst_as_its_written_region():
    a = rand((16, 8))

    @nki.jit
    def k(x):
        d = load(x)
        target = sb((16, 8), name="target")
        nisa.tensor_scalar(target[:, 2:6], d[:, 0:4], ops.add, 1.0)
        return out_of(target[:, 2:6])

    np.testing.assert_array_equal(k(a), a[:, 0:4] + 1)
    (ins,) = instrs("tensor_scalar")
    (w,) = ins.writes
    assert w.name == "target" and (w.b0, w.b1) == (8, 24)     # bytes [2*4, 6*4) of the row


def test_shape_mismatch_between_dst_and_result_is_an_error():
    @nki.jit
    def k(x):
        nisa.tensor_tensor(sb((16, 4)), load(x), load(x), ops.add)

    with pytest.raises(AssertionError, match="dst shape \\[16, 4\\] does not match the result "
                                             "shape \\[16, 8\\]"):
        k(rand((16, 8)))


def test_version_env_is_validated(monkeypatch):
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.2")
    from nkisim.nki import _version
    with pytest.raises(ValueError, match="NKISIM_NKI_VERSION='0.2'.*0.3, 0.4, 0.5, 0.6, 0.7"):
        _version.nki_version()
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.6")
    assert _version.at_least("0.6") and not _version.at_least("0.7")
    monkeypatch.delenv("NKISIM_NKI_VERSION")
    assert _version.nki_version() == (0, 7)


def test_tensor_copy_dynamic_ops_only_in_0_3(monkeypatch):
    with pytest.raises(AttributeError, match="removed in NKI 0.4.0"):
        nisa.tensor_copy_dynamic_src  # noqa: B018
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.3")
    a = rand((8, 12))

    @nki.jit
    def k(x):
        d = sb((8, 4), BF16)
        nisa.tensor_copy_dynamic_src(d, load(x)[:, 4:8])
        e = sb((8, 12))
        nisa.memset(e, 0.0)
        nisa.tensor_copy_dynamic_dst(dst=e[:, 8:12], src=d)
        return out_of(e)

    expect = np.zeros((8, 12), np.float32)
    expect[:, 8:12] = bf16(a[:, 4:8])
    np.testing.assert_array_equal(k(a), expect)


def test_writes_through_an_ap_view_of_an_address_placed_tile():
    # nki-library's TensorView writes through .ap() views of SbufManager tiles placed with
    # nl.ndarray(address=...): the view must address that tile's own storage
    from nkisim.nki import language as nl
    a = np.arange(256, dtype=np.float32).reshape(64, 4)

    @nki.jit
    def k(x):
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf, address=(0, 1024))
        nisa.memset(t, 0.0)
        s = nl.ndarray((64, 4), dtype=nl.float32, buffer=nl.sbuf, address=(0, 4096))
        nisa.dma_copy(dst=s, src=x)
        nisa.tensor_copy(dst=t.ap(pattern=[[8, 64], [1, 4]], offset=64 * 8 + 2), src=s)
        return out_of(t)

    expect = np.zeros((128, 8), np.float32)
    expect[64:, 2:6] = a
    np.testing.assert_array_equal(k(a), expect)
