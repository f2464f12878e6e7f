"""``neuronxcc.nki.isa`` (nisa) on nkisim (ref §1.10, §1.11).

Most ops return a new tile (SBUF by default; ``nc_matmul``/PE ``nc_transpose`` return PSUM);
``dma_copy`` is dst-style. ``dst[...] = nisa.op(...)`` writes straight into ``dst`` and
``psum += nisa.nc_matmul(...)`` accumulates in fp32 PSUM (see ``nkisim.tensor.assign``/``inplace``).
Ops may be given as ``nl.*`` functions or NumPy ufuncs (``np.add``, ``np.max``), as real code does.
"""

from __future__ import annotations

import enum
import math

import numpy as np

from . import context, dtypes
from . import language as nl
from .errors import nki_error, shape_str
from .indexing import IndexExpr, MaskExpr
from .language import (
    _detail,
    _mask,
    _partitions,
    _tile,
    _tile_shape,
    _tile_vals,
    apply_binary,
    reduce_axes,
    reduce_values,
    reduced_shape,
    result_tile,
)
from .tensor import Tensor, fit, read, region
from .trace import GPSIMD, SCALAR, TENSOR, VECTOR

# ---------------------------------------------------------------------------------------------
# enums (ref §1.10)


class engine(enum.IntEnum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    vector = 5
    sync = 6


tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


class dge_mode(enum.IntEnum):
    none = 0
    swdge = 1
    hwdge = 2
    unknown = 3


class oob_mode(enum.IntEnum):
    error = 0
    skip = 1


class reduce_cmd(enum.IntEnum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3


fp32 = nl.fp32


def get_nc_version():
    return nc_version(context.current().arch.nc_version)


_ENGINE_NAME = {engine.tensor: TENSOR, engine.vector: VECTOR, engine.scalar: SCALAR,
                engine.gpsimd: GPSIMD}

# ---------------------------------------------------------------------------------------------
# op codes: nl.* functions or NumPy functions -> ALU op name (ref §1.10 ALU table)

_ALU = {}
for _name in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "mod",
              "fmod", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
              "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
              "logical_and", "logical_or", "logical_xor"):
    _ALU[getattr(nl, _name)] = _name
    if hasattr(np, _name):
        _ALU[getattr(np, _name)] = _name
_ALU.update({nl.max: "max", nl.min: "min", nl.sum: "add", nl.prod: "multiply", np.max: "max",
             np.amax: "max", np.min: "min", np.amin: "min", np.sum: "add", np.prod: "multiply",
             np.true_divide: "divide", nl.invert: "invert", np.invert: "invert",
             nl.abs: "abs", np.abs: "abs", nl.rsqrt: "rsqrt", nl.reciprocal: "reciprocal",
             np.reciprocal: "reciprocal", nl.logical_not: "logical_not",
             np.logical_not: "logical_not"})
_BITVEC = {"bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "invert"}
_REDUCIBLE = {"add", "subtract", "multiply", "maximum", "minimum", "max", "min", "bitwise_and",
              "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor"}

_ACT = {}
for _name in ("copy", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu",
              "gelu_apprx_tanh", "silu", "erf", "softplus", "mish", "square", "abs", "sign",
              "sin", "arctan", "reciprocal", "negative"):
    if hasattr(nl, _name):
        _ACT[getattr(nl, _name)] = _name
_ACT.update({np.copy: "copy", np.exp: "exp", np.log: "log", np.sqrt: "sqrt", np.tanh: "tanh",
             np.square: "square", np.abs: "abs", np.sign: "sign", np.sin: "sin",
             np.arctan: "arctan", np.reciprocal: "reciprocal", np.negative: "negative"})


def _alu_name(op, api) -> str:
    if isinstance(op, str) and op in _ALU.values():
        return op
    try:
        return _ALU[op]
    except (KeyError, TypeError):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"unsupported op {getattr(op, '__name__', op)!r}: pass an nl.* op "
                            "code such as nl.add or nl.maximum (CS149 tip)") from None


def _unary_alu(name, x):
    with np.errstate(all="ignore"):
        if name == "abs":
            return np.abs(x)
        if name == "rsqrt":
            return 1.0 / np.sqrt(x)
        if name == "reciprocal":
            return 1.0 / x
        if name == "logical_not":
            return (x == 0).astype(np.float32)
        if name == "invert":
            return np.invert(x.astype(np.int64))
    raise AssertionError(name)


def _engine(eng, default, api, allowed=(VECTOR, SCALAR, GPSIMD)):
    if eng is None or eng == engine.unknown:
        return default
    name = _ENGINE_NAME.get(engine(eng))
    if name not in allowed:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"engine {engine(eng).name} is not supported; use one of "
                            f"{', '.join(allowed)}")
    return name


def _scalar_operand(op, data_tile, api, param, run):
    """A tensor_scalar operand: a compile-time scalar or a (P, 1) tile (ref §1.10)."""
    if isinstance(op, Tensor):
        t = _tile(op, api, param)
        s = _tile_shape(t)
        if s[0] != data_tile.shape[0] or math.prod(s[1:]) != 1:
            raise nki_error("nkisim_shape_mismatch", params=f"data{shape_str(data_tile.shape)}, "
                            f"{param}{shape_str(t.shape)}", api=api,
                            why=f"{param} must be a scalar or a ({data_tile.shape[0]}, 1) vector")
        v = _tile_vals(t, api, run).reshape((s[0],) + (1,) * (len(_tile_shape(data_tile)) - 1))
        return v, t
    if isinstance(op, (int, float, np.integer, np.floating)):
        return np.float32(op), None
    raise nki_error("nkisim_invalid_argument", api=api,
                    why=f"{param} must be a scalar or a tile, got {type(op).__name__}")


# ---------------------------------------------------------------------------------------------
# data movement

def dma_copy(*, dst, src, mask=None, dst_rmw_op=None, oob_mode=oob_mode.error,
             dge_mode=dge_mode.unknown, **kwargs):
    """DMA ``src`` -> ``dst`` (HBM or SBUF, never PSUM); casts if dtypes differ."""
    run = context.current()
    for p, t in (("src", src), ("dst", dst)):
        if not isinstance(t, Tensor):
            raise nki_error("nkisim_invalid_argument", api="dma_copy",
                            why=f"{p} must be an NKI tensor, got {type(t).__name__}")
        if t.root.buffer == "psum":
            raise nki_error("err_unsupported_memory", param=p, api="dma_copy",
                            expected="hbm|sbuf", got="psum")
        if t._slots is not None:
            raise nki_error("err_failed_to_infer_tile_from_local_tensor", name=t.name)
    if src.size != dst.size:
        raise nki_error("nkisim_shape_mismatch", params=f"dst{shape_str(dst.shape)}, "
                        f"src{shape_str(src.shape)}", api="dma_copy",
                        why=f"element counts differ ({dst.size} vs {src.size})")
    vals = read(src, "dma_copy", run).reshape(dst.shape)
    acc = None
    if dst_rmw_op is not None:
        name = _alu_name(dst_rmw_op, "dma_copy")
        acc = lambda a, b: apply_binary(name, a, b)  # noqa: E731
    nl._dma(dst, src, vals, "dma_copy", run, mask=_mask(mask, dst.shape), accumulate_op=acc)


def tensor_copy(src, *, mask=None, dtype=None, engine=engine.unknown, **kwargs):
    run = context.current()
    x = _tile(src, "tensor_copy", "src")
    eng = _engine(engine, VECTOR, "tensor_copy")
    if eng == GPSIMD and x.root.buffer == "psum":
        raise nki_error("err_unsupported_memory", param="src", api="tensor_copy (gpsimd)",
                        expected="sbuf", got="psum")
    vals = read(x, "tensor_copy", run)
    return result_tile(run, x.shape, dtype or x.dtype, vals, "tensor_copy", eng, (x,),
                       _detail(x), mask=_mask(mask, x.shape))


# ---------------------------------------------------------------------------------------------
# element-wise

def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  *, dtype=None, mask=None, engine=engine.unknown, **kwargs):
    """``(data <op0> operand0) <op1> operand1`` with scalar or (P, 1) operands."""
    run = context.current()
    api = "tensor_scalar"
    x = _tile(data, api, "data")
    n0 = _alu_name(op0, api)
    if (op1 is None) != (operand1 is None):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why="op1 and operand1 must both be given or both be None")
    n1 = _alu_name(op1, api) if op1 is not None else None
    if n1 is not None and ((n0 in _BITVEC) != (n1 in _BITVEC)):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why="op0 and op1 must both be bitvec or both arithmetic ops")
    bitvec = n0 in _BITVEC
    if bitvec and not dtypes.is_int(x.dtype):
        raise nki_error("nkisim_operand_dtype", param="data", api=api,
                        dtype=dtypes.name(x.dtype), allowed="integer dtypes (bitvec ops)")
    eng = _engine(engine, VECTOR, api)
    v = read(x, api, run).reshape(_tile_shape(x))
    v = v if bitvec else dtypes.to_f32(v)
    o0, t0 = _scalar_operand(operand0, x, api, "operand0", run)
    out = apply_binary(n0, o0, v) if reverse0 else apply_binary(n0, v, o0)
    tiles = [x] + ([t0] if t0 is not None else [])
    if n1 is not None:
        o1, t1 = _scalar_operand(operand1, x, api, "operand1", run)
        out = apply_binary(n1, o1, out) if reverse1 else apply_binary(n1, out, o1)
        if t1 is not None:
            tiles.append(t1)
    shape = _tile_shape(x)
    detail = _detail(x)
    detail.update(alu=n0, alu1=n1)
    return result_tile(run, shape, dtype or x.dtype, np.broadcast_to(out, shape), api, eng,
                       tiles, detail, mask=_mask(mask, shape))


def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=engine.unknown, **kwargs):
    """Element-wise ``data1 <op> data2``; both tiles have the same partitions."""
    run = context.current()
    api = "tensor_tensor"
    a = _tile(data1, api, "data1")
    b = _tile(data2, api, "data2")
    name = _alu_name(op, api)
    if a.shape[0] != b.shape[0]:
        raise nki_error("err_num_partition_mismatch",
                        params=f"data1{shape_str(a.shape)}, data2{shape_str(b.shape)}", api=api)
    if a.root.buffer == "psum" and b.root.buffer == "psum":
        raise nki_error("nkisim_both_inputs_psum", api=api)
    eng = _engine(engine, VECTOR, api)
    if eng == GPSIMD and (a.root.buffer == "psum" or b.root.buffer == "psum"):
        raise nki_error("err_unsupported_memory", param="data1", api="tensor_tensor (gpsimd)",
                        expected="sbuf", got="psum")
    bitvec = name in _BITVEC
    va = read(a, api, run).reshape(_tile_shape(a))
    vb = read(b, api, run).reshape(_tile_shape(b))
    if not bitvec:
        va, vb = dtypes.to_f32(va), dtypes.to_f32(vb)
    va, vb = nl.partition_vectors(va, vb)
    sa, sb = va.shape, vb.shape
    if math.prod(sa) == math.prod(sb) and sa != sb:
        vb = vb.reshape(sa)                       # same elements per partition, other shape
    try:
        out = apply_binary(name, va, vb)
    except ValueError:
        raise nki_error("nkisim_shape_mismatch", params=f"data1{shape_str(a.shape)}, "
                        f"data2{shape_str(b.shape)}", api=api,
                        why="the tiles must have the same number of elements per partition "
                            "(or one of them broadcast along the free dimensions)") from None
    detail = _detail(a, b)
    detail["alu"] = name
    return result_tile(run, out.shape, dtype or dtypes.promote(a.dtype, b.dtype), out, api,
                       eng, (a, b), detail, mask=_mask(mask, out.shape))


def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         dtype=None, mask=None, engine=engine.unknown, **kwargs):
    """``(data <op0> operand0) <op1> operand1`` with operand0 scalar/(P,1), operand1 a tile."""
    run = context.current()
    api = "scalar_tensor_tensor"
    x = _tile(data, api, "data")
    t1 = _tile(operand1, api, "operand1")
    if t1.shape[0] != x.shape[0]:
        raise nki_error("err_num_partition_mismatch",
                        params=f"data{shape_str(x.shape)}, operand1{shape_str(t1.shape)}",
                        api=api)
    n0, n1 = _alu_name(op0, api), _alu_name(op1, api)
    v = _tile_vals(x, api, run)
    o0, t0 = _scalar_operand(operand0, x, api, "operand0", run)
    tmp = apply_binary(n0, o0, v) if reverse0 else apply_binary(n0, v, o0)
    w = _tile_vals(t1, api, run)
    if w.size == tmp.size:
        w = w.reshape(tmp.shape)
    out = apply_binary(n1, w, tmp) if reverse1 else apply_binary(n1, tmp, w)
    tiles = [x, t1] + ([t0] if t0 is not None else [])
    detail = _detail(x, t1)
    detail.update(alu=n0, alu1=n1)
    return result_tile(run, out.shape, dtype or dtypes.promote(x.dtype, t1.dtype), out, api,
                       _engine(engine, VECTOR, api), tiles, detail, mask=_mask(mask, out.shape))


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *,
                       dtype=None, mask=None, **kwargs):
    """``res[:, i] = op1(op0(data0[:, i], res[:, i-1]), data1[:, i])`` along the free axis."""
    run = context.current()
    api = "tensor_tensor_scan"
    a = _tile(data0, api, "data0")
    b = _tile(data1, api, "data1")
    n0, n1 = _alu_name(op0, api), _alu_name(op1, api)
    va = _tile_vals(a, api, run).reshape(a.shape[0], -1)
    vb = _tile_vals(b, api, run).reshape(b.shape[0], -1)
    if va.shape != vb.shape:
        raise nki_error("nkisim_shape_mismatch", params=f"data0{shape_str(a.shape)}, "
                        f"data1{shape_str(b.shape)}", api=api, why="shapes differ")
    init, ti = _scalar_operand(initial, a, api, "initial", run)
    prev = np.broadcast_to(np.asarray(init, np.float32).reshape(-1), (va.shape[0],))
    out = np.empty_like(va)
    for i in range(va.shape[1]):
        t = apply_binary(n0, prev, va[:, i]) if reverse0 else apply_binary(n0, va[:, i], prev)
        prev = apply_binary(n1, vb[:, i], t) if reverse1 else apply_binary(n1, t, vb[:, i])
        out[:, i] = prev
    tiles = [a, b] + ([ti] if ti is not None else [])
    detail = _detail(a, b)
    detail["scan"] = True
    return result_tile(run, _tile_shape(a), dtype or dtypes.promote(a.dtype, b.dtype),
                       out.reshape(_tile_shape(a)), api, VECTOR, tiles, detail,
                       mask=_mask(mask, _tile_shape(a)))


def tensor_reduce(op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False,
                  **kwargs):
    """Reduce free axes with ``op`` on VectorE; ``negate`` multiplies the result by -1."""
    run = context.current()
    api = "tensor_reduce"
    x = _tile(data, api, "data")
    name = _alu_name(op, api)
    if name == "subtract":       # legal per the ALU table, but its order is not documented
        raise nki_error("nkisim_unsupported", what="tensor_reduce with subtract",
                        why="the order of a subtract reduction is not documented")
    if name not in _REDUCIBLE:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"op {name} is not legal as a reduction (ref §1.10 ALU table)")
    bitvec = name in _BITVEC
    if bitvec and not dtypes.is_int(x.dtype):
        raise nki_error("nkisim_operand_dtype", param="data", api=api,
                        dtype=dtypes.name(x.dtype), allowed="integer dtypes (bitvec ops)")
    if negate and bitvec:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why="negate is only supported for arithmetic ops")
    axes = reduce_axes(x, axis, api)
    v = read(x, api, run).reshape(_tile_shape(x))
    if not bitvec:
        v = dtypes.to_f32(v)
    out = reduce_values(name, v, axes, keepdims)
    if negate:
        out = -out
    shape = reduced_shape(_tile_shape(x), axes, keepdims)
    detail = _detail(x)
    detail.update(alu=name, in_free=math.prod(_tile_shape(x)[1:]))
    return result_tile(run, shape, dtype or x.dtype, np.asarray(out).reshape(shape), api,
                       VECTOR, (x,), detail, mask=_mask(mask, shape))


def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, mask=None, dtype=None, **kwargs):
    """ScalarE ``op(data * scale + bias)`` in fp32, cast to ``dtype`` (ref §1.10)."""
    run = context.current()
    api = "activation"
    x = _tile(data, api, "data")
    if op in _ACT:
        fname = _ACT[op]
    elif isinstance(op, str) and op in nl._UNARY_FN:
        fname = op
    else:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"unsupported activation {getattr(op, '__name__', op)!r} "
                            "(ref §1.10 activation table)")
    v = _tile_vals(x, api, run)
    tiles = [x]
    P = x.shape[0]
    if isinstance(scale, Tensor):
        s = _tile(scale, api, "scale")
        if s.dtype != np.dtype(np.float32):
            raise nki_error("err_activation_scale_invalid_type")
        if _tile_shape(s) != (P, 1):
            raise nki_error("err_activation_scale_scalar_or_vector")
        v = v * _tile_vals(s, api, run).reshape((P,) + (1,) * (v.ndim - 1))
        tiles.append(s)
    elif isinstance(scale, (int, float, np.integer, np.floating)):
        v = v * np.float32(scale)
    else:
        raise nki_error("err_activation_scale_scalar_or_vector")
    if bias is not None:
        if isinstance(bias, Tensor):
            bt = _tile(bias, api, "bias")
            if bt.dtype not in (np.dtype(np.float32), np.dtype(np.float16), dtypes.bfloat16):
                raise nki_error("err_activation_bias_invalid_type")
            if _tile_shape(bt) != (P, 1):
                raise nki_error("nkisim_shape_mismatch", params=f"data{shape_str(x.shape)}, "
                                f"bias{shape_str(bt.shape)}", api=api,
                                why=f"bias must be a ({P}, 1) vector")
            v = v + _tile_vals(bt, api, run).reshape((P,) + (1,) * (v.ndim - 1))
            tiles.append(bt)
        elif isinstance(bias, (int, float)) and run.arch.nc_version >= 3:
            v = v + np.float32(bias)          # scalar bias allowed from NC-v3 (ref §1.10)
        else:
            raise nki_error("err_activation_bias_invalid_type")
    elif run.allocated_kernel:
        raise nki_error("err_bias_tensor_must_be_specified_in_allocation")
    out = nl.apply_unary(fname, v)
    shape = _tile_shape(x)
    detail = _detail(x)
    detail["func"] = fname
    res = result_tile(run, shape, dtype or x.dtype, out, api, SCALAR, tiles, detail,
                      mask=_mask(mask, shape))
    if reduce_res is not None:
        if reduce_op is None or _alu_name(reduce_op, api) != "add" and run.arch.nc_version < 3:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why="reduce_op must be nl.add on NeuronCore-v2")
        rn = _alu_name(reduce_op, api)
        red = reduce_values(rn, out.reshape(P, -1), (1,), True)
        from .tensor import write as _write
        _write(reduce_res, fit(red, reduce_res.shape), api, run=run)
        res._producer.writes = res._producer.writes + (region(reduce_res),)
        res._producer.detail["reduce"] = True
    return res


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None,
                      dtype=None, **kwargs):
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op,
                      reduce_res=reduce_res, mask=mask, dtype=dtype)


def reciprocal(data, *, dtype=None, mask=None, engine=engine.unknown, **kwargs):
    run = context.current()
    x = _tile(data, "reciprocal", "data")
    v = _tile_vals(x, "reciprocal", run)
    with np.errstate(all="ignore"):
        out = 1.0 / v
    detail = _detail(x)
    detail["alu"] = "reciprocal"
    return result_tile(run, v.shape, dtype or x.dtype, out, "reciprocal",
                       _engine(engine, VECTOR, "reciprocal"), (x,), detail,
                       mask=_mask(mask, v.shape))


# ---------------------------------------------------------------------------------------------
# constants

def iota(expr, dtype, *, mask=None, **kwargs):
    """Constants from an affine ``nl.arange`` expression, computed in int32 on GpSimd."""
    run = context.current()
    if not isinstance(expr, IndexExpr):
        raise nki_error("nkisim_invalid_argument", api="iota",
                        why="expr must be an affine expression of nl.arange()")
    v = expr.v.astype(np.int32)
    shape = v.shape if v.ndim >= 2 else (v.shape[0], 1)
    if shape[0] > run.arch.pmax:
        raise nki_error("err_num_partition_exceed_arch_limit", n=shape[0], limit=run.arch.pmax)
    out = v.reshape(shape).astype(np.float32) if dtypes.is_float(dtype) else v.reshape(shape)
    return result_tile(run, shape, dtype, out, "iota", GPSIMD, (), {"inputs": 0},
                       mask=_mask(mask, shape))


def memset(shape, value, dtype, *, mask=None, engine=engine.unknown, **kwargs):
    """A tile filled with a constant (VectorE or GpSimd)."""
    run = context.current()
    shape = tuple(int(s) for s in shape)
    eng = _engine(engine, VECTOR, "memset", (VECTOR, GPSIMD))
    out = np.full(shape, value, np.float32 if isinstance(value, float) else np.int64)
    detail = {"inputs": 0, "value": float(value),
              "all_16bit": dtypes.normalize(dtype) in dtypes.SIXTEEN_BIT}
    return result_tile(run, shape, dtype, out, "memset", eng, (), detail,
                       mask=_mask(mask, shape))


def affine_select(pred, on_true_tile, on_false_value, *, mask=None, dtype=None, **kwargs):
    """``pred ? on_true : on_false_value`` with an affine predicate of indices (GpSimd)."""
    run = context.current()
    api = "affine_select"
    if not isinstance(pred, MaskExpr):
        raise nki_error("err_unsupported_expression_in_mask")
    x = _tile(on_true_tile, api, "on_true_tile")
    v = _tile_vals(x, api, run)
    try:
        p = np.broadcast_to(pred.v, v.shape)
    except ValueError:
        raise nki_error("nkisim_shape_mismatch", params=f"pred{shape_str(pred.v.shape)}, "
                        f"on_true_tile{shape_str(x.shape)}", api=api,
                        why="could not be broadcast together") from None
    out = np.where(p, v, np.float32(on_false_value))
    return result_tile(run, v.shape, dtype or x.dtype, out, api, GPSIMD, (x,), _detail(x),
                       mask=_mask(mask, v.shape))


# ---------------------------------------------------------------------------------------------
# Tensor Engine (ref §1.10 nc_matmul / nc_transpose, §1.11, §3.3)

_MATMUL_DTYPES = {np.dtype(np.float32), np.dtype(np.float16), dtypes.bfloat16,
                  dtypes.float8_e4m3, dtypes.float8_e5m2, dtypes.TF32}


_DOUBLE_ROW = ("double_row", "double_row_gen3")


def _psum_operand(run, t, api, param):
    """A PSUM tile as a Tensor Engine input. The docs: "The nc_matmul instruction *must* read
    inputs from SBUF ... the stationary and moving must be SBUF tiles" (nki.isa.nc_matmul); yet
    AWS's reference/attention.py (flash_attn_bwd, which passes AWS's CI) feeds an nc_transpose
    result (PSUM) as the stationary: the compiler copies it to SBUF first. A tolerated rule;
    nkisim records the copy."""
    run.rule(("psum_matmul_operand", t.root.id),
             f"{param} operand `{t.name}` of '{api}' is in PSUM (the compiler copies it to SBUF)",
             "The nc_matmul instruction *must* read inputs from SBUF and write outputs to PSUM. "
             "Therefore, the stationary and moving must be SBUF tiles",
             "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/api/"
             "generated/nki.isa.nc_matmul.html")
    run.record("tensor_copy", VECTOR, (region(t),), (), dtypes.name(t.dtype), _partitions(t),
               max(1, t.size // max(1, t.shape[0])), _detail(t))


def nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, tile_position=(), tile_size=(), mask=None, perf_mode=None,
              **kwargs):
    """``stationary.T @ moving`` on the Tensor Engine; fp32 result in a PSUM tile.

    ``perf_mode='double_row_gen3'`` (trn2 fp8 double-row): stationary [K, 2, M] and moving
    [K, 2, N], contracting over (K, 2): AWS's SDK test test_nki_isa_nc_matmul.py::
    test_double_row_gen3 checks ``einsum("kli,klj->ij")`` (ref §1.10)."""
    run = context.current()
    api = "nc_matmul"
    for p, t in (("stationary", stationary), ("moving", moving)):
        if isinstance(t, Tensor) and t.root.buffer == "psum":
            _psum_operand(run, t, api, p)
        elif isinstance(t, Tensor) and t.root.buffer != "sbuf":      # inputs must be SBUF
            raise nki_error("err_unsupported_memory", param=p, api=api, expected="sbuf",
                            got=t.root.buffer)
    st = _tile(stationary, api, "stationary")
    mv = _tile(moving, api, "moving")
    if perf_mode is not None and str(getattr(perf_mode, "name", perf_mode)) != "none":
        return _double_row(run, st, mv, str(getattr(perf_mode, "name", perf_mode)), mask)
    for p, t in (("stationary", st), ("moving", mv)):
        if t.dtype not in _MATMUL_DTYPES:
            raise nki_error("nkisim_operand_dtype", param=p, api=api,
                            dtype=dtypes.name(t.dtype), allowed="float8_e4m3, float8_e5m2, "
                            "bfloat16, float16, tfloat32, float32")
    ss, ms = _tile_shape(st), _tile_shape(mv)
    K, M = ss[0], math.prod(ss[1:])
    N = math.prod(ms[1:])
    if K > run.arch.pmax or M > run.arch.gemm_stationary_fmax or len(ss) > 2:
        raise nki_error("nkisim_matmul_stationary_limit", name=st.name, shape=shape_str(st.shape),
                        api=api, limit=run.arch.gemm_stationary_fmax)
    if N > run.arch.gemm_moving_fmax:
        raise nki_error("nkisim_matmul_moving_limit", name=mv.name, shape=shape_str(mv.shape),
                        api=api, free=N, limit=run.arch.gemm_moving_fmax)
    if ms[0] != K:
        raise nki_error("nkisim_matmul_contraction_mismatch", stat=shape_str(st.shape),
                        mov=shape_str(mv.shape), api=api)
    if tile_position or tile_size:
        if not (tile_position and tile_size):
            raise nki_error("nkisim_invalid_argument", api=api,
                            why="tile_position and tile_size must both be set")
        if any(int(v) % 32 for v in tuple(tile_position) + tuple(tile_size)):
            raise nki_error("nkisim_invalid_argument", api=api,
                            why="tile_position and tile_size must be multiples of 32")
    a = _tile_vals(st, api, run).reshape(K, M)
    b = _tile_vals(mv, api, run).reshape(K, N)
    out = (a.T @ b).reshape((M,) + ms[1:])
    fp32 = st.dtype.itemsize == 4 or mv.dtype.itemsize == 4
    detail = {"K": K, "M": M, "N": N, "accumulate": False, "transpose": bool(is_transpose),
              "fp32": fp32, "flops": 0 if is_transpose else 2 * K * M * N,
              "dtype_in": dtypes.name(st.dtype)}
    return result_tile(run, (M,) + ms[1:], np.float32, out, api, TENSOR, (st, mv), detail,
                       buffer=nl.psum, mask=_mask(mask, (M,) + ms[1:]))


def _double_row(run, st, mv, mode, mask):
    api = "nc_matmul"
    if mode not in _DOUBLE_ROW:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"perf_mode must be one of {', '.join(_DOUBLE_ROW)}, got {mode!r}")
    ss, ms = st.shape, mv.shape
    if len(ss) != 3 or len(ms) != 3 or ss[1] != 2 or ms[1] != 2 or ss[0] != ms[0]:
        raise nki_error("nkisim_shape_mismatch", params=f"stationary{shape_str(ss)}, "
                        f"moving{shape_str(ms)}", api=api,
                        why=f"perf_mode={mode!r} needs stationary [K, 2, M] and moving "
                            "[K, 2, N] with the same K")
    K, M, N = ss[0], ss[2], ms[2]
    if K > run.arch.pmax or M > run.arch.gemm_stationary_fmax:
        raise nki_error("nkisim_matmul_stationary_limit", name=st.name, shape=shape_str(ss),
                        api=api, limit=run.arch.gemm_stationary_fmax)
    if N > run.arch.gemm_moving_fmax:
        raise nki_error("nkisim_matmul_moving_limit", name=mv.name, shape=shape_str(ms),
                        api=api, free=N, limit=run.arch.gemm_moving_fmax)
    a = _tile_vals(st, api, run).reshape(K * 2, M)
    b = _tile_vals(mv, api, run).reshape(K * 2, N)
    detail = {"K": K, "M": M, "N": N, "accumulate": False, "transpose": False,
              "fp32": st.dtype.itemsize == 4 or mv.dtype.itemsize == 4,
              "flops": 2 * 2 * K * M * N, "dtype_in": dtypes.name(st.dtype),
              "perf_mode": mode}
    return result_tile(run, (M, N), np.float32, a.T @ b, api, TENSOR, (st, mv), detail,
                       buffer=nl.psum, mask=_mask(mask, (M, N)))


def nc_transpose(data, *, mask=None, dtype=None, engine=engine.unknown, **kwargs):
    """Swap partition and (flattened) free axes: TensorE <= (128,128) into PSUM, VectorE
    <= (32,32) in SBUF/PSUM (ref §1.10)."""
    run = context.current()
    api = "nc_transpose"
    x = _tile(data, api, "data")
    s = _tile_shape(x)
    P, F = s[0], math.prod(s[1:])
    # default engine by shape: VectorE handles <= 32x32, TensorE the rest (ref §1.10)
    eng = _engine(engine, VECTOR if (P <= 32 and F <= 32) else TENSOR, api, (TENSOR, VECTOR))
    limit = 128 if eng == TENSOR else 32
    for d, n in enumerate((P, F)):
        if n > limit:
            raise nki_error("err_size_of_dimension_exceed_arch_limit", dim=d, param="data",
                            shape=shape_str(x.shape), api=f"{api} ({eng} engine)", limit=limit)
    if eng == TENSOR:
        if x.root.buffer != "sbuf":
            raise nki_error("err_unsupported_memory", param="data", api=api, expected="sbuf",
                            got=x.root.buffer)
        if run.allocated_kernel:
            raise nki_error("err_transpose_on_tensor_engine_not_allowed_in_allocated_kernel")
    v = read(x, api, run).reshape(P, F).T
    detail = _detail(x)
    # the PE transpose is nc_matmul(stationary=data (P, F), moving=identity (P, P)): contraction
    # K = P, stationary free M = F, moving free N = P, result (M, N) = (F, P) (ref §1.10, §3.3)
    detail.update(K=P, M=F, N=P, accumulate=False, transpose=True,
                  fp32=x.dtype.itemsize == 4, flops=0)
    buf = nl.psum if eng == TENSOR else nl.sbuf
    return result_tile(run, (F, P), dtype or x.dtype, v, api, eng, (x,), detail, buffer=buf,
                       mask=_mask(mask, (F, P)))


def _unsupported(name):
    def fn(*args, **kwargs):
        raise nki_error("nkisim_unsupported", what=f"nisa.{name}",
                        why="not part of the API surface nkisim simulates yet")
    fn.__name__ = name
    return fn


dma_transpose = _unsupported("dma_transpose")
bn_stats = _unsupported("bn_stats")
bn_aggr = _unsupported("bn_aggr")
local_gather = _unsupported("local_gather")
dropout = _unsupported("dropout")
max8 = _unsupported("max8")
nc_find_index8 = _unsupported("nc_find_index8")
nc_match_replace8 = _unsupported("nc_match_replace8")
nc_stream_shuffle = _unsupported("nc_stream_shuffle")
select_reduce = _unsupported("select_reduce")
range_select = _unsupported("range_select")
tensor_copy_predicated = _unsupported("tensor_copy_predicated")
tensor_copy_dynamic_src = _unsupported("tensor_copy_dynamic_src")
tensor_copy_dynamic_dst = _unsupported("tensor_copy_dynamic_dst")
tensor_scalar_reduce = _unsupported("tensor_scalar_reduce")
tensor_partition_reduce = _unsupported("tensor_partition_reduce")
