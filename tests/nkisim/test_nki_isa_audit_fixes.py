"""Fixes from the audit of nkisim's current-dialect ``nki.isa`` against AWS's NKI 0.6.0 API stub
docstrings (STUB-R32 isa). Each test asserts against the docstring sentence it quotes or NumPy;
where Beta 1's docs (aws-neuron-sdk 1db4d74e nki/api/nki/isa/__init__.py) say otherwise, the
Beta 1 face keeps its behaviour and a test says so.
"""

import ml_dtypes
import numpy as np
import pytest

import nkisim.nki as nki
from nkisim import beta1 as b1
from nkisim import ops
from nkisim.beta1 import isa as b1isa
from nkisim.nki import isa as nisa
from nkisim.runtime import last_run

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(606)


def sb(shape, dtype=np.float32):
    return ops.ndarray(shape, dtype, buffer=ops.sbuf)


def ps(shape, dtype=np.float32):
    return ops.ndarray(shape, dtype, buffer=ops.psum)


def load(x, dtype=None):
    t = sb(x.shape, dtype or x.dtype)
    nisa.dma_copy(dst=t, src=x)
    return t


def out_of(t, dtype=None):
    if t.root.buffer == "psum":
        s = sb(t.shape, t.dtype)
        nisa.tensor_copy(dst=s, src=t)
        t = s
    o = ops.ndarray(t.shape, dtype or t.dtype, buffer=ops.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o


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


def test_activation_beta1_keeps_the_instructions_own_reduction():
    # Beta 1 face: reduce_res receives this instruction's own sum (nkisim's behaviour before;
    # Rules.activation_reduce_regs)
    @b1.jit
    def k(a):
        r = b1.language.ndarray((2, 1), dtype=np.float32, buffer=b1.language.sbuf)
        b1isa.activation(ops.copy, b1.language.load(a), reduce_op=ops.add, reduce_res=r)
        o = b1.language.ndarray((2, 1), dtype=np.float32, buffer=b1.language.shared_hbm)
        b1.language.store(o, r)
        return o

    assert b1.simulate_kernel(k, X)[:, 0].tolist() == [10, 26]


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
