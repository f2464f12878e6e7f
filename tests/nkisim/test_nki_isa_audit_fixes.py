"""Fixes from the audit of nkisim's current-dialect ``nki.isa`` against AWS's NKI 0.6.0 API stub
docstrings (STUB-R32 isa). Each test asserts against the docstring sentence it quotes or NumPy;
where Beta 1's docs (aws-neuron-sdk 1db4d74e nki/api/nki/isa/__init__.py) say otherwise, the
Beta 1 face keeps its behaviour and a test says so.
"""

import ml_dtypes
import numpy as np
import pytest
from nki_tiles import load, out_of, ps, sb

import nkisim.nki as nki
from nkisim import beta1 as b1
from nkisim import ops
from nkisim.beta1 import isa as b1isa
from nkisim.nki import isa as nisa
from nkisim.runtime import last_run

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(606)


def instrs(op):
    return [i for i in last_run().trace.instrs if i.op == op]


def run(body, *arrays):
    """Run ``body(*sbuf tiles)`` (returning tiles) under nki.jit; NumPy results."""
    @nki.jit
    def k(*xs):
        res = body(*[load(x) for x in xs])
        res = res if isinstance(res, tuple) else (res,)
        return tuple(out_of(t) for t in res)

    out = k(*arrays)
    return out if isinstance(out, tuple) else (out,)


def invalid(match):
    return pytest.raises(nisa.NkiValidationError, match=match)


# ---------------------------------------------------------------------------------------------
# 1. tensor_tensor on int32/uint32: "When all input/output tiles are int32 or uint32, the
# operation defaults to GpSimd Engine, which uses native integer arithmetic. This ensures exact
# results for all 32-bit integer values."

A32 = np.array([[123456789, 16777217, -2147483647, 7]], np.int32)
B32 = np.array([[987654321, 0, -5, -3]], np.int32)


@pytest.mark.parametrize("op,ref", [(ops.add, np.add), (ops.subtract, np.subtract),
                                    (ops.multiply, np.multiply), (ops.maximum, np.maximum),
                                    (ops.minimum, np.minimum)])
def test_tensor_tensor_int32_is_exact_native_integer_arithmetic_on_gpsimd(op, ref):
    def body(x, y):
        z = sb(x.shape, np.int32)
        nisa.tensor_tensor(dst=z, data1=x, data2=y, op=op)
        return z

    (got,) = run(body, A32, B32)
    with np.errstate(over="ignore"):
        want = ref(A32, B32)                  # NumPy's int32 arithmetic wraps as 32-bit does
    np.testing.assert_array_equal(got, want)
    assert instrs("tensor_tensor")[0].engine == "gpsimd"


def test_tensor_tensor_int32_with_explicit_vector_engine_stays_fp32():
    # "You may override this by passing engine=nki.isa.engine.vector explicitly": the Vector
    # Engine "casts input data types to float32"
    def body(x, y):
        z = sb(x.shape, np.int32)
        nisa.tensor_tensor(dst=z, data1=x, data2=y, op=ops.add, engine=nisa.engine.vector)
        return z

    (got,) = run(body, A32[:, :2], B32[:, :2])
    want = (A32[:, :2].astype(np.float32) + B32[:, :2].astype(np.float32)).astype(np.float64)
    np.testing.assert_array_equal(got, want.astype(np.int64))
    assert got[0, 1] == 16777216          # 16777217 is not an fp32 value
    assert instrs("tensor_tensor")[0].engine == "vector"


def test_tensor_tensor_int32_inputs_into_a_float_dst_are_not_all_int32():
    # "all input/output tiles": an fp32 dst keeps the fp32 path (on the Vector Engine)
    def body(x, y):
        z = sb(x.shape, np.float32)
        nisa.tensor_tensor(dst=z, data1=x, data2=y, op=ops.add)
        return z

    (got,) = run(body, A32[:, :2], B32[:, :2])
    np.testing.assert_array_equal(got, A32[:, :2].astype(np.float32) + B32[:, :2].astype(
        np.float32))
    assert instrs("tensor_tensor")[0].engine == "vector"


def test_tensor_tensor_beta1_exact_for_integer_add_multiply_subtract_only():
    # Beta 1: "``power`` or integer ``add``, ``multiply``, or ``subtract`` which run on the
    # GpSimd Engine", fp32 math "unless it is one of the supported integer ops"
    @b1.jit
    def k(a, b):
        x, y = b1.language.load(a), b1.language.load(b)
        s = b1isa.tensor_tensor(x, y, ops.add)
        m = b1isa.tensor_tensor(x, y, ops.maximum, dtype=np.int32)
        o1 = b1.language.ndarray(a.shape, dtype=np.int32, buffer=b1.language.shared_hbm)
        o2 = b1.language.ndarray(a.shape, dtype=np.int32, buffer=b1.language.shared_hbm)
        b1.language.store(o1, s)
        b1.language.store(o2, m)
        return o1, o2

    a = np.array([[16777217, 5]], np.int32)
    b = np.array([[0, 16777217]], np.int32)
    s, m = b1.simulate_kernel(k, a, b)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(m, [[16777216, 16777216]])   # fp32 maximum


# ---------------------------------------------------------------------------------------------
# 2. nc_match_replace8 with duplicate vals: "with data = [1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8] and
# vals = [3, 8, 8, 8, 8, 8, 8, 8], dst_idx is [2, 10, 9, 8, 7, 6, 5, 4]"

MR_DATA = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
MR_VALS = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)


def test_nc_match_replace8_docstring_example_pairs_duplicates_in_descending_order():
    def body(d, v):
        out, idx = sb(d.shape), sb((1, 8), np.uint32)
        nisa.nc_match_replace8(dst=out, data=d, vals=v, imm=-1.0, dst_idx=idx)
        return out, idx

    out, idx = run(body, MR_DATA, MR_VALS)
    assert idx[0].tolist() == [2, 10, 9, 8, 7, 6, 5, 4]
    np.testing.assert_array_equal(out, [[1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1]])


def test_nc_match_replace8_beta1_keeps_its_forward_numpy_equivalent():
    # Beta 1's NumPy equivalent: "for j in range(vals_2d.shape[1]): ... indices[i, j] =
    # matches[0]" with each match replaced, so the duplicates get ascending positions
    @b1.jit
    def k(a, v):
        idx = b1.language.ndarray((1, 8), dtype=np.uint32, buffer=b1.language.sbuf)
        b1isa.nc_match_replace8(data=b1.language.load(a), vals=b1.language.load(v), imm=-1.0,
                                dst_idx=idx)
        o = b1.language.ndarray((1, 8), dtype=np.uint32, buffer=b1.language.shared_hbm)
        b1.language.store(o, idx)
        return o

    assert b1.simulate_kernel(k, MR_DATA, MR_VALS)[0].tolist() == [2, 4, 5, 6, 7, 8, 9, 10]


# ---------------------------------------------------------------------------------------------
# 3. dma_transpose gathering with 2-D indices: "Hardware uses column-major flattening:
# flat_indices = indices.T.flatten()"; "gathered = src[flat_indices, :]; dst = gathered.T"


def test_dma_transpose_gather_reads_2d_indices_column_major():
    # the docstring's gather_transpose_2d_kernel, with N_COLS = 2
    @nki.jit
    def gather_transpose_2d_kernel(src_hbm, idx_hbm):
        P, F = 128, 256
        output = ops.ndarray((P, F), dtype=src_hbm.dtype, buffer=ops.shared_hbm)
        idx_sb = load(idx_hbm)
        dst_sb = sb((P, F), src_hbm.dtype)
        nisa.memset(dst=dst_sb, value=0)
        src_ap = src_hbm.ap(pattern=[[P, F], [1, P]], vector_offset=idx_sb, indirect_dim=0)
        nisa.dma_transpose(dst=dst_sb, src=src_ap, axes=(1, 0))
        nisa.dma_copy(dst=output, src=dst_sb)
        return output

    src = RNG.uniform(-1, 1, (300, 128)).astype(BF16)
    idx = RNG.permutation(300)[:256].astype(np.uint32).reshape(128, 2)
    got = gather_transpose_2d_kernel(src, idx)
    flat = idx.T.flatten()[:src.shape[0]]
    np.testing.assert_array_equal(got.astype(np.float32), src[flat, :].T.astype(np.float32))


def test_dma_copy_gather_keeps_row_major_indices():
    # only dma_transpose documents the column-major order; a dma_copy gather through the same
    # kind of view reads the indices as they are laid out
    @nki.jit
    def k(src_hbm, idx_hbm):
        idx_sb = load(idx_hbm)
        dst = sb((128, 8), src_hbm.dtype)
        view = src_hbm.ap(pattern=[[4, 256], [1, 4]], vector_offset=idx_sb, indirect_dim=0)
        nisa.dma_copy(dst=dst, src=view)
        return out_of(dst)

    src = np.arange(300 * 4, dtype=np.float32).reshape(300, 4)
    idx = RNG.permutation(300)[:256].astype(np.uint32).reshape(128, 2)
    np.testing.assert_array_equal(k(src, idx).reshape(256, 4), src[idx.flatten()])


# ---------------------------------------------------------------------------------------------
# 8. signatures: dma_transpose(dst, src, axes=None, priority=None, dge_mode=..., oob_mode=...,
# name=None); reciprocal(dst, data, name=None); scalar_tensor_tensor(..., reverse1=False,
# name=None)


def test_dma_transpose_takes_priority_as_its_fourth_parameter():
    import inspect
    params = list(inspect.signature(nisa.dma_transpose).parameters)
    assert params == ["dst", "src", "axes", "priority", "dge_mode", "oob_mode", "name"]
    a = RNG.uniform(-1, 1, (16, 32)).astype(BF16)

    @nki.jit
    def k(x):
        d = sb((32, 16), BF16)
        nisa.dma_transpose(d, load(x), (1, 0), 2, nisa.dge_mode.unknown)   # positional
        return out_of(d)

    np.testing.assert_array_equal(k(a).astype(np.float32), a.T.astype(np.float32))


@pytest.mark.parametrize("op", ["reciprocal", "scalar_tensor_tensor"])
def test_a_positional_name_does_not_bind_to_engine(op):
    x = RNG.uniform(1, 2, (8, 8)).astype(np.float32)

    @nki.jit
    def k(a):
        t, d = load(a), sb(a.shape)
        if op == "reciprocal":
            h = nisa.reciprocal(d, t, "inv")
        else:
            h = nisa.scalar_tensor_tensor(d, t, ops.multiply, 2.0, ops.add, t, False, False,
                                          "stt")
        assert h.name in ("inv", "stt")
        return out_of(d)

    want = 1 / x if op == "reciprocal" else x * 2 + x
    np.testing.assert_allclose(k(x), want, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# 5 and 11. activation's reduce_regs: "reset: Reset reduce_regs to zero only"; "idle: Do not
# modify reduce_regs"; "reduce: Reduce activated data over existing values in reduce_regs";
# "reset_reduce: Reset reduce_regs to zero and then store the reduction result"; "if
# reduce_res: reduce_res = reduce_regs"

X = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)      # row sums 10, 26


def _chain(*steps):
    """Run activation(copy) steps (data scale, reduce_cmd, read out?) on X; the read-outs."""
    def body(x):
        outs = []
        for scale, cmd, read in steps:
            r = sb((2, 1)) if read else None
            nisa.activation(sb(x.shape), ops.copy, x, scale=scale, reduce_op=ops.add,
                            reduce_res=r, reduce_cmd=getattr(nisa.reduce_cmd, cmd))
            if read:
                outs.append(r)
        return tuple(outs)

    return [o[:, 0].tolist() for o in run(body, X)]


def test_activation_idle_reads_out_the_registers_unchanged():
    # reset_reduce on x (sums 10, 26), then idle on 2x: the registers still hold 10, 26
    assert _chain((1.0, "reset_reduce", False), (2.0, "idle", True)) == [[10, 26]]


@pytest.mark.parametrize("cmd", ["idle", "reduce"])
def test_activation_reading_registers_nothing_reset_is_warned(cmd):
    # the docs give no value for the registers before a reset: with the default idle, a kernel
    # that forgot reduce_cmd=reset_reduce reads undefined registers on the device
    from nkisim.errors import NKIWarning
    with pytest.warns(NKIWarning, match=f"reduce_cmd={cmd}.*no instruction has reset"):
        _chain((1.0, cmd, True))


def test_activation_registers_reset_first_are_not_warned():
    import warnings

    from nkisim.errors import NKIWarning
    with warnings.catch_warnings():
        warnings.simplefilter("error", NKIWarning)
        assert _chain((1.0, "reset", False), (1.0, "reduce", True)) == [[10, 26]]


def test_activation_reduce_accumulates_over_the_registers():
    assert _chain((1.0, "reset_reduce", True), (2.0, "reduce", True),
                  (3.0, "reduce", True)) == [[10, 26], [30, 78], [60, 156]]


def test_activation_reset_zeroes_the_registers_only():
    assert _chain((1.0, "reset_reduce", False), (5.0, "reset", True),
                  (1.0, "reduce", True)) == [[0, 0], [10, 26]]


def test_activation_reduce_without_reduce_res_keeps_the_sum_in_the_registers():
    # reduce_res=None: "keep the reduction result in the Scalar Engine's internal accumulator
    # without writing it out ... only the final call needs to pass a tile"
    assert _chain((1.0, "reset_reduce", False), (1.0, "reduce", False),
                  (0.5, "reduce", True)) == [[25, 65]]


def test_activation_reduce_is_reset_reduce_with_a_read_out():
    # "This API is equivalent to calling nisa.activation with reduce_cmd=reset_reduce"
    def body(x):
        r1, r2 = sb((2, 1)), sb((2, 1))
        nisa.activation(sb(x.shape), ops.copy, x, scale=3.0, reduce_op=ops.add,
                        reduce_res=None, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation_reduce(sb(x.shape), ops.copy, x, ops.add, r1)
        nisa.activation(sb(x.shape), ops.copy, x, reduce_res=r2)       # idle read-out
        return r1, r2

    r1, r2 = run(body, X)
    assert r1[:, 0].tolist() == [10, 26] and r2[:, 0].tolist() == [10, 26]


def _b1_chain(*cmds):
    """Beta 1 activation(copy) on X with each reduce_cmd in turn, reading reduce_res out."""
    @b1.jit
    def k(a):
        outs = []
        x = b1.language.load(a)
        for cmd in cmds:
            r = b1.language.ndarray((2, 1), dtype=np.float32, buffer=b1.language.sbuf)
            if cmd == "activation_reduce":
                b1isa.activation_reduce(ops.copy, x, reduce_op=ops.add, reduce_res=r)
            else:
                b1isa.activation(ops.copy, x, reduce_op=ops.add, reduce_res=r,
                                 reduce_cmd=getattr(b1isa.reduce_cmd, cmd))
            o = b1.language.ndarray((2, 1), dtype=np.float32, buffer=b1.language.shared_hbm)
            b1.language.store(o, r)
            outs.append(o)
        return tuple(outs)

    return [o[:, 0].tolist() for o in b1.simulate_kernel(k, X)]


def test_activation_beta1_drives_the_same_registers():
    # Beta 1 docs (aws-neuron-sdk 1db4d74e isa activation): "There are 128 registers on the
    # scalar engine for storing reduction results"; "reduce_cmd.idle: Do not use the
    # accumulators"; "reduce: keeps accumulating over the current value of the accumulator";
    # "reset_reduce: Resets the accumulators then immediately accumulate the results of the
    # current instruction"; "read out the current values stored in the register by passing in
    # a tensor in the reduce_res arguments". activation_reduce stores "a reduction along the
    # free dimension of the nisa.activation result" (its own: reset_reduce)
    assert _b1_chain("reset_reduce", "reduce", "idle", "activation_reduce") == [
        [10, 26], [20, 52], [20, 52], [10, 26]]


def test_activation_beta1_idle_read_out_of_unset_registers_is_warned():
    from nkisim.errors import NKIWarning
    with pytest.warns(NKIWarning, match="no instruction has reset"):
        _b1_chain("idle")


# ---------------------------------------------------------------------------------------------
# 7. tensor_scalar_reduce(..., reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None,
# reduce_res_negate=False, name=None): "reset_reduce: (default) Reset accumulators to the
# identity value for reduce_op, then accumulate the current results"; "reduce: Continue
# accumulating without resetting"; "load_reduce: Load the values from reduce_init into the
# accumulator, then accumulate the current result on top of it"; "reduce_res_negate: Negate the
# reduction result before writing it to reduce_res, does not modify the internal reduction
# registers"

T1 = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
T2 = np.array([[10, 20, 30], [-1, -2, -3]], np.float32)


def _tsr(steps, *arrays):
    def body(*xs):
        outs = []
        for i, op, kw in steps:
            r = sb((2, 1)) if kw.pop("read", True) else None
            nisa.tensor_scalar_reduce(sb(xs[i].shape), xs[i], ops.multiply, 2.0, op,
                                      reduce_res=r, **kw)
            if r is not None:
                outs.append(r)
        return tuple(outs)

    return [o[:, 0].tolist() for o in run(body, *arrays)]


def test_tensor_scalar_reduce_accumulates_with_reduce_cmd():
    got = _tsr([(0, ops.add, {}), (1, ops.add, {"reduce_cmd": nisa.reduce_cmd.reduce})], T1, T2)
    s1 = (2 * T1).sum(axis=1)
    assert got == [s1.tolist(), (s1 + (2 * T2).sum(axis=1)).tolist()]


def test_tensor_scalar_reduce_reduce_chains_without_reduce_res():
    # "Pass None to keep the reduction result in the Vector Engine's internal accumulator"
    got = _tsr([(0, ops.maximum, {"read": False}),
                (1, ops.maximum, {"reduce_cmd": nisa.reduce_cmd.reduce})], T1, T2)
    assert got == [np.maximum((2 * T1).max(axis=1), (2 * T2).max(axis=1)).tolist()]


def test_tensor_scalar_reduce_load_reduce_starts_from_reduce_init():
    init = np.array([[100], [-100]], np.float32)

    def body(x, i):
        r = sb((2, 1))
        nisa.tensor_scalar_reduce(sb(x.shape), x, ops.multiply, 2.0, ops.add, reduce_res=r,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=i)
        r2 = sb((2, 1))
        nisa.tensor_scalar_reduce(sb(x.shape), x, ops.multiply, 1.0, ops.add, reduce_res=r2,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=7.0)
        return r, r2

    r, r2 = run(body, T1, init)
    np.testing.assert_array_equal(r[:, 0], init[:, 0] + (2 * T1).sum(axis=1))
    np.testing.assert_array_equal(r2[:, 0], 7 + T1.sum(axis=1))


def test_tensor_scalar_reduce_negate_leaves_the_register():
    got = _tsr([(0, ops.add, {"reduce_res_negate": True}),
                (1, ops.add, {"reduce_cmd": nisa.reduce_cmd.reduce})], T1, T2)
    s1 = (2 * T1).sum(axis=1)
    assert got == [(-s1).tolist(), (s1 + (2 * T2).sum(axis=1)).tolist()]


def test_tensor_scalar_reduce_reduce_init_only_with_load_reduce():
    # "reduce_init should only be set when reduce_cmd is load_reduce"; "Must be provided when
    # reduce_cmd is load_reduce"
    with pytest.raises(Exception, match="reduce_init should only be set"):
        _tsr([(0, ops.add, {"reduce_init": 3.0})], T1)
    with pytest.raises(Exception, match="reduce_init must be provided"):
        _tsr([(0, ops.add, {"reduce_cmd": nisa.reduce_cmd.load_reduce})], T1)


# ---------------------------------------------------------------------------------------------
# 9. operand0 "Must be None or 0 when op0 is a unary operator (e.g., nl.abs)"


def test_unary_op0_takes_operand0_none():
    x = np.array([[-1.5, 2.0, -3.0]], np.float32)

    def body(t):
        a, b, r = sb(t.shape), sb(t.shape), sb((1, 1))
        nisa.tensor_scalar(a, t, ops.abs, None)
        nisa.tensor_scalar(b, t, ops.abs, None, op1=ops.multiply, operand1=2.0)
        nisa.tensor_scalar_reduce(sb(t.shape), t, ops.abs, None, ops.maximum, reduce_res=r)
        return a, b, r

    a, b, r = run(body, x)
    np.testing.assert_array_equal(a, np.abs(x))
    np.testing.assert_array_equal(b, 2 * np.abs(x))
    assert r[0, 0] == 3.0


def test_binary_op0_still_needs_operand0():
    with pytest.raises(Exception, match="operand0 must be a scalar or a tile"):
        run(lambda t: (nisa.tensor_scalar(sb(t.shape), t, ops.add, None), t)[1], T1)


# ---------------------------------------------------------------------------------------------
# 10. tensor_partition_reduce "op: the reduction operator (add, average, max, bitwise_or,
# bitwise_and)"


def test_tensor_partition_reduce_average_is_the_mean_over_partitions():
    x = RNG.uniform(-4, 4, (16, 5)).astype(np.float32)

    def body(t):
        d = sb((1, 5))
        nisa.tensor_partition_reduce(d, nki.language.average, t)
        return d

    (got,) = run(body, x)
    np.testing.assert_allclose(got, x.mean(axis=0, keepdims=True), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# 12-18. documented-invalid calls: NkiValidationError quoting the docs' rule

F8 = np.dtype(ml_dtypes.float8_e4m3)


def _k(body, *arrays):
    @nki.jit
    def k(*xs):
        body(*[load(x) for x in xs])

    return k(*arrays)


def test_nc_matmul_fp32_with_bf16_is_invalid():
    # "if one of the input tiles is tfloat32/float32, the other tile must also be
    # tfloat32/float32"
    w, x = np.ones((8, 4), np.float32), np.ones((8, 4), BF16)
    with invalid("the other tile must also be tfloat32/float32"):
        _k(lambda a, b: nisa.nc_matmul(ps((4, 4)), a, b), w, x)


def test_nc_matmul_double_row_needs_fp8_and_no_column_tiling():
    # "when performance mode is double_row, stationary and moving tiles must be one of
    # float8_e4m3 or float8_e5m2"; "double_row performance mode cannot be combined with Tensor
    # Engine column tiling mode"
    w, x = np.ones((8, 2, 32), BF16), np.ones((8, 2, 16), BF16)
    dr = nisa.matmul_perf_mode.double_row
    with invalid("double_row needs float8"):
        _k(lambda a, b: nisa.nc_matmul(ps((32, 16)), a, b, perf_mode=dr), w, x)
    w8, x8 = w.astype(F8), x.astype(F8)
    with invalid("column tiling mode"):
        _k(lambda a, b: nisa.nc_matmul(ps((32, 16)), a, b, perf_mode=dr, tile_position=(0, 0),
                                       tile_size=(128, 32)), w8, x8)
    _k(lambda a, b: nisa.nc_matmul(ps((32, 16)), a, b, perf_mode=dr), w8, x8)   # valid


def test_tensor_copy_predicated_dtype_rules():
    # "predicate must be of type uint8, uint16, or uint32"; "src and dst must share the same
    # data type"
    src, p8 = np.ones((4, 4), np.float32), np.ones((4, 4), np.int8)
    with invalid("predicate must be of type uint8, uint16, or uint32"):
        _k(lambda s, p: nisa.tensor_copy_predicated(sb((4, 4)), s, p), src, p8)
    with invalid("src and dst must share the same data type"):
        _k(lambda s, p: nisa.tensor_copy_predicated(sb((4, 4), BF16), s, p), src,
           p8.astype(np.uint8))


def test_select_reduce_and_range_select_dtype_rules():
    on_true, pred = np.ones((4, 4), np.float32), np.ones((4, 4), np.uint8)
    with invalid("except tfloat32, int32, uint32"):
        _k(lambda t, p: nisa.select_reduce(sb((4, 4), np.int32), p, t, 0.0),
           on_true.astype(np.int32), pred)
    with invalid("predicate dtype can be any supported integer type"):
        _k(lambda t, p: nisa.select_reduce(sb((4, 4)), p, t, 0.0), on_true,
           pred.astype(np.float32))
    with invalid("reduce_res dtype must of float type"):
        _k(lambda t, p: nisa.select_reduce(sb((4, 4)), p, t, 0.0,
                                           reduce_res=sb((4, 1), np.int32),
                                           reduce_cmd=nisa.reduce_cmd.reset_reduce),
           on_true, pred)
    b = np.full((4, 1), 2.0, np.float32)
    with invalid("this must be FP32_MIN"):
        _k(lambda t, b0: nisa.range_select(sb((4, 4)), t, ops.greater_equal, ops.less, b0, b0,
                                           on_false_value=0.0), on_true, b)
    with invalid("bound0/bound1 must be FP32 types"):
        _k(lambda t, b0: nisa.range_select(sb((4, 4)), t, ops.greater_equal, ops.less, b0, b0),
           on_true, b.astype(BF16))
    with invalid("on_true_tile must be one of the FP dtypes"):
        _k(lambda t, b0: nisa.range_select(sb((4, 4), np.int32), t, ops.greater_equal,
                                           ops.less, b0, b0), on_true.astype(np.int32), b)


def test_scalar_tensor_tensor_operand1_shape_and_bitvec():
    d, o1 = np.ones((4, 4), np.float32), np.ones((4, 2), np.float32)
    # "The operand1 tile must have the same shape as data": a one-line validation error, not
    # NumPy's broadcast ValueError
    with invalid("must have the shape of data"):
        _k(lambda a, b: nisa.scalar_tensor_tensor(sb((4, 4)), a, ops.add, 1.0, ops.add, b), d,
           o1)
    # "Bitvec operators are not supported"
    i = np.ones((4, 4), np.int32)
    with invalid("Bitvec operators are not supported"):
        _k(lambda a, b: nisa.scalar_tensor_tensor(sb((4, 4), np.int32), a, ops.bitwise_and, 1,
                                                  ops.add, b), i, i)


def test_tensor_tensor_scan_inputs_not_both_in_psum():
    # "The two input tiles, data0 and data1 cannot both reside in PSUM"
    def body(a, b):
        pa, pb = ps((4, 4)), ps((4, 4))
        nisa.tensor_copy(pa, a)
        nisa.tensor_copy(pb, b)
        nisa.tensor_tensor_scan(sb((4, 4)), pa, pb, 0.0, ops.multiply, ops.add)

    x = np.ones((4, 4), np.float32)
    with invalid("cannot both reside in PSUM"):
        _k(body, x, x)


def test_tensor_tensor_bitvec_needs_integers_and_engine_values():
    # "For bitvec operators, the input/output data types must be integer types"
    x = np.ones((4, 4), np.float32)
    with invalid("must be integer types"):
        _k(lambda a, b: nisa.tensor_tensor(sb((4, 4)), a, b, ops.bitwise_and), x, x)
    # "engine: nki.isa.engine.vector, nki.isa.engine.gpsimd or nki.isa.engine.unknown"
    with invalid("engine scalar is not supported"):
        _k(lambda a, b: nisa.tensor_tensor(sb((4, 4)), a, b, ops.add,
                                           engine=nisa.engine.scalar), x, x)


def test_nc_stream_shuffle_start_partition_rules():
    # "If num_active_partitions is 64, src_start_partition/dst_start_partition must be 0/64";
    # 32 active partitions may start at 0/32/64/96 (AWS's nki-library broadcasts that way)
    x = np.ones((128, 4), np.float32)

    def body(a, start, n):
        nisa.nc_stream_shuffle(a[start:start + n, :], a[0:1 if n == 32 else n, :], [0] * 32)

    with invalid("start partition must be 0/64"):
        _k(lambda a: body(a, 32, 64), x)
    for start in (0, 32, 64, 96):
        _k(lambda a, s=start: body(a, s, 32), x)
    _k(lambda a: body(a, 64, 64), x)


def test_dropout_dtype_rules():
    x = np.ones((4, 4), np.float32)
    # "The output data type dst.dtype must match the input data type data.dtype"
    with invalid("must match the data dtype"):
        _k(lambda a: nisa.dropout(sb((4, 4), BF16), a, 0.5), x)
    # "If data type of data is any of the integer types ..., prob data type must be float32"
    with invalid("must be float32"):
        _k(lambda a, p: nisa.dropout(sb((4, 4), np.int32), a, p), x.astype(np.int32),
           np.full((4, 1), 0.5, BF16))


def test_dma_transpose_dst_dtype_and_hwdge_rules():
    x = np.ones((16, 32), BF16)

    @nki.jit
    def k(a, case):
        if case == "hbm":
            nisa.dma_transpose(ops.ndarray((32, 16), BF16, buffer=ops.shared_hbm), a)
        elif case == "dtype":
            nisa.dma_transpose(sb((32, 16), np.float32), a)
        elif case == "hwdge_rows":
            nisa.dma_transpose(sb((32, 8), BF16), a[0:8, :], dge_mode=nisa.dge_mode.hwdge)
        elif case == "hwdge_fp32":
            t = sb((16, 32), np.float32)
            nisa.tensor_copy(t, load(a))
            nisa.dma_transpose(sb((32, 16), np.float32), t, dge_mode=nisa.dge_mode.hwdge)
        else:
            d = sb((32, 16), BF16)
            nisa.dma_transpose(d, a, dge_mode=nisa.dge_mode.hwdge)
            return out_of(d)

    for case, msg in (("hbm", "must be a tile in SBUF"), ("dtype", r"src.dtype == dst.dtype"),
                      ("hwdge_rows", r"src.shape\[0\] == 16"),
                      ("hwdge_fp32", "src.dtype is 2 bytes")):
        with invalid(msg):
            k(x, case)
    np.testing.assert_array_equal(k(x, "ok").astype(np.float32), x.T.astype(np.float32))


def test_dma_transpose_dge_mode_none_is_a_tolerated_rule():
    # "The only valid dge_modes are unknown and hwdge"; AWS's nki-library
    # mlp_tkg_gate_up_projection passes dge_mode=_DGE_MODE_NONE: a warning, not an error
    from nkisim.errors import NKIRuleWarning
    x = np.ones((16, 32), BF16)

    @nki.jit
    def k(a):
        d = sb((32, 16), BF16)
        nisa.dma_transpose(d, a, dge_mode=nisa.dge_mode.none)
        return out_of(d)

    with pytest.warns(NKIRuleWarning, match="only valid dge_mode"):
        np.testing.assert_array_equal(k(x).astype(np.float32), x.T.astype(np.float32))


def test_dma_copy_engine_values():
    # "engine: the engine to use for HWDGE descriptor generation: nki.isa.engine.sync or
    # nki.isa.engine.scalar. Only valid when dge_mode=nisa.dge_mode.hwdge"
    x = np.ones((4, 4), np.float32)

    @nki.jit
    def k(a, engine, dge):
        nisa.dma_copy(sb((4, 4)), a, engine=engine, dge_mode=dge)

    with invalid("only valid when dge_mode=hwdge"):
        k(x, nisa.engine.sync, nisa.dge_mode.unknown)
    with invalid("use sync or scalar"):
        k(x, nisa.engine.vector, nisa.dge_mode.hwdge)
    k(x, nisa.engine.scalar, nisa.dge_mode.hwdge)


# ---------------------------------------------------------------------------------------------
# From a sweep of the current dialect's less common ops against the STUB-R32 docstrings.

def test_nc_find_index8_pairs_duplicate_vals_with_ascending_positions():
    # "the opposite of nc_find_index8, which pairs duplicate vals with their matching positions
    # in ascending order across dst_idx columns" (nc_match_replace8 docstring): max8 of a row
    # with ties feeds nc_find_index8 8 distinct indices (nki-library's top-k does so)
    def body(d, v):
        idx = sb((1, 8), np.uint32)
        nisa.nc_find_index8(dst=idx, data=d, vals=v)
        return idx

    assert run(body, MR_DATA, MR_VALS)[0][0].tolist() == [2, 4, 5, 6, 7, 8, 9, 10]


def test_nc_find_index8_beta1_keeps_the_first_occurrence():
    # Beta 1's doc: "the indices ... of the first occurrence of each value"
    @b1.jit
    def k(a, v):
        idx = b1isa.nc_find_index8(data=b1.language.load(a), vals=b1.language.load(v))
        o = b1.language.ndarray((1, 8), dtype=np.uint32, buffer=b1.language.shared_hbm)
        b1.language.store(o, idx)
        return o

    assert b1.simulate_kernel(k, MR_DATA, MR_VALS)[0].tolist() == [2, 4, 4, 4, 4, 4, 4, 4]


BITS = np.array([[-1, -2, 5, 0x12345678, -0x12345678, 7, -7, 1]] * 4, np.int32)


@pytest.mark.parametrize("mask", [0x7FFFFFFF, 0x12345679, 0x01FFFFFF])
def test_tensor_scalar_bitvec_immediate_keeps_its_bits(mask):
    # "input elements are treated as bit patterns without any data type casting" (STUB-R32
    # tensor_scalar): 0x7FFFFFFF through fp32 would be 2**31, the sign bit
    def body(x):
        r = sb(x.shape, np.int32)
        nisa.tensor_scalar(dst=r, data=x, op0=ops.bitwise_and, operand0=mask)
        return r

    np.testing.assert_array_equal(run(body, BITS)[0], BITS & mask)


def test_tensor_scalar_bitvec_takes_an_int32_tile_operand():
    # the "operand0 and operand1 (if used) must be float32" sentence is the arithmetic
    # operators' (STUB-R32 tensor_scalar); an fp32 tile operand of an arithmetic op is kept
    masks = np.array([[0x7FFFFFFF], [0xFF], [0x0F0F0F0F], [1]], np.int32)

    def body(x, m):
        r = sb(x.shape, np.int32)
        nisa.tensor_scalar(dst=r, data=x, op0=ops.bitwise_xor, operand0=m)
        return r

    np.testing.assert_array_equal(run(body, BITS, masks)[0], BITS ^ masks)

    def arith(x, m):
        r = sb(x.shape, np.int32)
        nisa.tensor_scalar(dst=r, data=x, op0=ops.add, operand0=m)
        return r

    with invalid("operand0 must be float32 when it is a tile"):
        run(arith, BITS, masks)


@pytest.mark.parametrize("operand0", [0, None])
def test_tensor_scalar_invert_is_bitwise_not(operand0):
    # "Bitwise Not | nki.language.invert" (tbl-aluop); operand0 "Must be None or 0 when op0 is
    # a unary operator"
    def body(x):
        r = sb(x.shape, np.int32)
        nisa.tensor_scalar(dst=r, data=x, op0=ops.invert, operand0=operand0)
        return r

    np.testing.assert_array_equal(run(body, BITS)[0], ~BITS)


def test_tensor_reduce_logical_xor_is_the_parity_of_the_non_zero_elements():
    # tbl-aluop: "Logical Xor | nki.language.logical_xor | Y" (legal reduction op)
    x = (np.random.default_rng(3).random((4, 9)) > 0.5).astype(np.float32)

    def body(t):
        r = sb((4, 1))
        nisa.tensor_reduce(dst=r, op=ops.logical_xor, data=t, axis=(1,))
        return r

    np.testing.assert_array_equal(run(body, x)[0].ravel(), x.sum(axis=1) % 2)


INTS = np.array([[2**31 - 1, -2**31, 40000, -40000, 300, 1, -1, 0]], np.int32)


@pytest.mark.parametrize("dt", [np.int16, np.int8, np.uint8, np.uint16, np.uint32])
@pytest.mark.parametrize("how", ["tensor_copy", "dma_copy"])
def test_an_int_to_int_copy_goes_through_fp32(dt, how):
    # "(2) intermediate FP32 cast when input and output data types differ" (tensor_copy);
    # "first casting from src.dtype to float32, then from float32 to dst.dtype" (dma_copy):
    # rounded and saturated, not the low bits
    def body(x):
        r = sb(x.shape, dt)
        if how == "tensor_copy":
            nisa.tensor_copy(dst=r, src=x)
        else:
            nisa.dma_copy(dst=r, src=x)
        return r

    info = np.iinfo(dt)
    expect = np.clip(np.rint(INTS.astype(np.float32).astype(np.float64)), info.min, info.max)
    np.testing.assert_array_equal(run(body, INTS)[0], expect.astype(dt))


def test_an_int_copy_of_the_same_dtype_is_bit_exact():
    # "(1) bit-accurate copy when input and output data types are the same": 16777217 has no
    # fp32
    x = np.array([[16777217, -2**31, 2**31 - 1]], np.int32)

    def body(t):
        r = sb(t.shape, np.int32)
        nisa.tensor_copy(dst=r, src=t)
        return r

    np.testing.assert_array_equal(run(body, x)[0], x)


def test_a_direct_dma_transpose_refuses_swdge():
    # "DMA Direct Transpose Constraints: The only valid dge_mode s are unknown and hwdge"
    @nki.jit
    def k(a):
        t = sb((a.shape[1], a.shape[0]))
        nisa.dma_transpose(dst=t, src=a, dge_mode=nisa.dge_mode.swdge)
        return out_of(t)

    with invalid("takes dge_mode unknown or hwdge, got swdge"):
        k(np.ones((16, 32), np.float32))
