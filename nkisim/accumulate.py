"""Current-dialect ``nki.isa`` instructions that run through an engine's accumulator registers:
``tensor_scalar_cumulative`` and ``exponential`` (Vector Engine), ``activate2`` (Scalar Engine)
(STUB-R32 isa; the docstrings' pseudocode is quoted where it decides a choice).

The Vector Engine's registers are those of select_reduce and range_select
(``nkisim.engines._accumulate``: one fp32 value per lane, ``Run.vector_acc[P]``): "The
accumulator registers are shared across Vector Engine accumulation instructions including
nki.isa.exponential, nki.isa.range_select, nki.isa.select_reduce, and
nki.isa.tensor_scalar_reduce" (tensor_scalar_cumulative docs). The Scalar Engine's ("one FP32
value per lane, 128 total", activate2 docs) are kept beside them under ``("scalar", P)``. A
register no instruction set yet reads as the reset value of the operation, as in
``_accumulate``.
"""

from __future__ import annotations

import numpy as np

from . import context, dtypes
from . import ops as nl
from .engines import (
    _ACT,
    _alu_name,
    _scalar_operand,
    _write_reduce_res,
    require_nc_version,
)
from .errors import nki_error, shape_str
from .ops import _detail, _tile, apply_binary
from .tensor import Tensor, region, write
from .trace import SCALAR, VECTOR

F32 = dtypes.F32
_FP8 = {dtypes.float8_e4m3, dtypes.float8_e5m2}
_IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf,
             "minimum": np.inf, "abs_max": 0.0, "abs_min": np.inf}
_CANON = {"max": "maximum", "min": "minimum"}


def _same_elements(api, a_name, a, b_name, b):
    """"``a`` and ``b`` must have the same partition dimension size" and "the same number of
    elements in the free dimensions"."""
    if a.shape[0] != b.shape[0] or a.size != b.size:
        raise nki_error("nkisim_shape_mismatch", params=f"{a_name}{shape_str(a.shape)}, "
                        f"{b_name}{shape_str(b.shape)}", api=api,
                        why="they must have the same partitions and the same number of "
                            "elements per partition")


def _dtype_in(api, param, t, allowed, text):
    if t.dtype not in allowed:
        raise nki_error("nkisim_operand_dtype", param=param, api=api,
                        dtype=dtypes.name(t.dtype), allowed=text)


def _vector(run, api, param, x, data, fp32=False):
    """A scalar or (P, 1) operand as a (P, 1) (or scalar) fp32 array, and its tile or None."""
    if fp32 and isinstance(x, Tensor) and x.dtype != F32:
        raise nki_error("nkisim_operand_dtype", param=param, api=api, dtype=dtypes.name(x.dtype),
                        allowed="float32")
    v, t = _scalar_operand(x, data, api, param, run)
    return (np.asarray(v, np.float32).reshape(-1, 1) if t is not None else np.float32(v)), t


def _rows(vals, P):
    return np.asarray(vals, np.float32).reshape(P, -1)


def _start(run, P, cmd, identity):
    """The (P, 1) register a Vector Engine accumulation starts from under ``cmd`` (other than
    load_reduce): its value for ``reduce`` (the identity while no instruction has set it), the
    identity for the other commands."""
    prev = run.vector_acc.get(P) if cmd == "reduce" else None
    if prev is None:
        return np.full((P, 1), identity, np.float32)
    return np.asarray(prev, np.float32).reshape(P, 1)


def _fold(name, acc, vals):
    """The register after ``acc = reduce_op(acc, x)`` for each x of a row, in order, in fp32:
    (P, 1) from (P, 1) and (P, F)."""
    both = np.concatenate([acc, vals], axis=1)
    if name in ("add", "multiply"):
        # sequential, as the pseudocode's loop ("accumulator += dst[i]"): ufunc.accumulate
        # adds left to right (np.sum would pair)
        return getattr(np, name).accumulate(both, axis=1, dtype=np.float32)[:, -1:]
    if name in ("maximum", "minimum"):
        return getattr(np, name).reduce(both, axis=1, keepdims=True)
    # abs_max / abs_min: "returns the original (signed) value of whichever input has the larger
    # absolute value" (nl.abs_max docs); a tie keeps the register (nkisim's choice: the first)
    pick = np.argmax if name == "abs_max" else np.argmin
    i = pick(np.abs(both), axis=1)
    return np.take_along_axis(both, i[:, None], axis=1)


# ---------------------------------------------------------------------------------------------
# tensor_scalar_cumulative (Vector Engine)

# "Input / output dtypes are restricted to BF16, FP16, FP32, FP8, UINT8, UINT16, INT8, INT16";
# "INT32/UINT32 are not supported as input/output dtypes (ISA limitation)"
_CUMULATIVE_DTYPES = {dtypes.bfloat16, np.dtype(np.float16), F32, np.dtype(np.uint8),
                      np.dtype(np.uint16), np.dtype(np.int8), np.dtype(np.int16)} | _FP8
_CUMULATIVE_TEXT = "bfloat16, float16, float32, float8, uint8, uint16, int8, int16"
# "Scalar operation (op0) must be an arithmetic op (e.g., add, mult, max)"
_ARITH = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "mod", "fmod"}
# "Reduction operation (op1) is limited to add, subtract, mult, max, min"
_CUMULATIVE_OP1 = {"add", "subtract", "multiply", "maximum", "minimum"}


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd="reset_reduce"):
    """Per partition, along the free elements (flattened, row-major) of ``src``:
    ``reg = op1(op0(src[i], imm0), reg); dst[i] = reg`` in fp32 on the Vector Engine, the
    register starting as ``reduce_cmd`` says: ``reset_reduce`` the identity of ``op1`` (0 for
    add and subtract, 1 for mult, -inf for max, +inf for min), ``reduce`` its current value,
    ``load_reduce`` ``imm1``. The register keeps the last value for the next accumulation
    instruction.

    Choices where the docstring is not explicit: ``op1``'s operands are in the pseudocode's
    order, ``reg = op1(op0(in_tensor[i], imm0), reg)``, so with subtract each output is the
    element minus the previous output (add, mult, max and min commute). The pseudocode's
    ``reverse0`` branch has no parameter in the signature, so there is none. ``idle`` and
    ``reset`` are not among the commands the docstring defines ("reset_reduce", "load_reduce",
    "reduce"): not supported."""
    run = context.current()
    api = "tensor_scalar_cumulative"
    d = _tile(dst, api, "dst")
    s = _tile(src, api, "src")
    _dtype_in(api, "src", s, _CUMULATIVE_DTYPES, _CUMULATIVE_TEXT)
    _dtype_in(api, "dst", d, _CUMULATIVE_DTYPES, _CUMULATIVE_TEXT)
    _same_elements(api, "dst", d, "src", s)
    n0 = _CANON.get(_alu_name(op0, api), _alu_name(op0, api))
    if n0 not in _ARITH:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"op0 must be an arithmetic op (e.g. add, multiply, maximum), got "
                            f"{n0}")
    n1 = _CANON.get(_alu_name(op1, api), _alu_name(op1, api))
    if n1 not in _CUMULATIVE_OP1:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"op1 is limited to add, subtract, multiply, maximum, minimum, got "
                            f"{n1}")
    if reduce_cmd not in ("reset_reduce", "reduce", "load_reduce"):
        raise nki_error("nkisim_unsupported", what=f"{api} reduce_cmd={reduce_cmd}",
                        why="the docstring defines reset_reduce, reduce and load_reduce only")
    P = s.shape[0]
    x = _rows(nl._tile_vals(s, api, run), P)
    # "imm0: Scalar or vector value for tensor-scalar operation. Must be FP32 datatype"
    i0, t0 = _vector(run, api, "imm0", imm0, s, fp32=True)
    tiles = [s] + ([t0] if t0 is not None else [])
    t = np.asarray(apply_binary(n0, x, i0), np.float32)
    if reduce_cmd == "load_reduce":
        if imm1 is None:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why="reduce_cmd=load_reduce loads imm1 into the accumulator: pass "
                                "imm1 (a scalar or a (P, 1) float32 tile)")
        i1, t1 = _vector(run, api, "imm1", imm1, s, fp32=True)
        reg = np.broadcast_to(i1, (P, 1)).astype(np.float32)
        if t1 is not None:
            tiles.append(t1)
    else:
        reg = _start(run, P, reduce_cmd, _IDENTITY[n1])
    if n1 == "subtract":
        out = np.empty_like(t)
        for i in range(t.shape[1]):
            reg = t[:, i:i + 1] - reg
            out[:, i:i + 1] = reg
    else:
        out = getattr(np, n1).accumulate(np.concatenate([reg, t], axis=1), axis=1,
                                         dtype=np.float32)[:, 1:]
    run.vector_acc[P] = np.ascontiguousarray(out[:, -1:])
    write(d, out.reshape(d.shape), api, run=run)
    detail = _detail(*tiles)
    detail.update(alu=n0, alu1=n1, inputs=1)
    run.record(api, VECTOR, tuple(region(tt) for tt in tiles), (region(d),),
               dtypes.name(d.dtype), P, t.shape[1], detail)


# ---------------------------------------------------------------------------------------------
# exponential (Vector Engine, NeuronCore-v4+)

_EXP_DST = {dtypes.float8_e4m3, dtypes.float8_e5m2, np.dtype(np.float16), dtypes.bfloat16, F32,
            dtypes.TF32, np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32),
            np.dtype(np.uint8), np.dtype(np.uint16)}
_EXP_SRC = (_EXP_DST - {dtypes.TF32}) | {np.dtype(np.uint32)}
_EXP_RES = {dtypes.float8_e4m3, dtypes.float8_e5m2, np.dtype(np.float16), dtypes.bfloat16, F32,
            dtypes.TF32}


def _names(ts):
    return ", ".join(sorted(dtypes.name(t) for t in ts))


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd="idle", reduce_init=0.0):
    """``dst = exp(src - max_value)`` in fp32 on the Vector Engine, cast to ``dst.dtype``;
    ``max_value`` a scalar or a (P, 1) float32 tile. With ``reduce_cmd`` ``reset_reduce``
    ("Reset accumulators to 0"), ``reduce`` (continue) or ``load_reduce`` (start from
    ``reduce_init``) the register adds up the exponentials ("accumulator += dst[i]"), and
    ``reduce_res`` (P, 1), if given, receives it. NeuronCore-v4+.

    Choices: the register adds the fp32 exponentials, before the cast to ``dst.dtype`` (the
    engine "performs the computation in float32 precision internally"), one after the other.
    ``idle`` ("No accumulation performed, accumulator state unknown"; "Even when reduce_cmd is
    set to idle, the accumulator state may still be modified") leaves this instruction's own
    sum in the register and in ``reduce_res``, as nkisim's select_reduce and range_select do
    for idle. ``reset`` is not among the "Supported: idle, reset_reduce, reduce, load_reduce"."""
    run = context.current()
    api = "exponential"
    require_nc_version(run, "nki.isa.exponential", 4)
    d = _tile(dst, api, "dst")
    s = _tile(src, api, "src")
    _dtype_in(api, "dst", d, _EXP_DST, _names(_EXP_DST))
    _dtype_in(api, "src", s, _EXP_SRC, _names(_EXP_SRC))
    _same_elements(api, "src", s, "dst", d)
    for param, t in (("src", s), ("dst", d)):       # "src, dst can be up to 4D tensor"
        if len(t.shape) > 4:
            raise nki_error("err_exceed_max_supported_dimension", param=param,
                            shape=shape_str(t.shape), api=api, limit=4)
    if reduce_cmd not in ("idle", "reset_reduce", "reduce", "load_reduce"):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"reduce_cmd {reduce_cmd} is not supported; use idle, reset_reduce, "
                            "reduce or load_reduce")
    if reduce_cmd != "load_reduce" and (isinstance(reduce_init, Tensor) or (
            reduce_init is not None and float(reduce_init) != 0.0)):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"reduce_init should be unset or set to 0.0 when reduce_cmd is not "
                            f"load_reduce (reduce_cmd={reduce_cmd})")
    P = s.shape[0]
    m, mt = _vector(run, api, "max_value", max_value, s, fp32=True)
    tiles = [s] + ([mt] if mt is not None else [])
    x = _rows(nl._tile_vals(s, api, run), P)
    out = np.exp(x - m).astype(np.float32, copy=False)
    if reduce_res is not None:
        _dtype_in(api, "reduce_res", _tile(reduce_res, api, "reduce_res"), _EXP_RES,
                  _names(_EXP_RES))
    if reduce_cmd == "load_reduce":
        init, it = _vector(run, api, "reduce_init", 0.0 if reduce_init is None else reduce_init,
                           s, fp32=True)
        start = np.broadcast_to(init, (P, 1)).astype(np.float32)
        if it is not None:
            tiles.append(it)
    else:                    # reset_reduce, idle (its own sum), reduce
        start = _start(run, P, reduce_cmd, 0.0)
    acc = _fold("add", start, out)
    run.vector_acc[P] = acc
    write(d, out.reshape(d.shape), api, run=run)
    detail = _detail(*tiles)
    detail.update(func="exp", inputs=1, reduce=False)
    instr = run.record(api, VECTOR, tuple(region(t) for t in tiles), (region(d),),
                       dtypes.name(d.dtype), P, out.shape[1], detail)
    _write_reduce_res(run, reduce_res, acc, api, instr)


# ---------------------------------------------------------------------------------------------
# activate2 (Scalar Engine, NeuronCore-v4+)

# "The tensor-scalar stage supports six (op0, op1) combinations" (None: nl.bypass)
_ACTIVATE2_PAIRS = {("multiply", "add"), ("multiply", "subtract"), ("multiply", None),
                    ("add", None), ("subtract", None), (None, None)}
# "Supported: nl.add, nl.maximum, nl.minimum, nl.abs_max, nl.abs_min"
_ACTIVATE2_REDUCE = {"add", "maximum", "minimum", "abs_max", "abs_min"}


def _token_name(op):
    return op if isinstance(op, str) else getattr(op, "__name__", None)


def _bypass(op) -> bool:
    """``nl.bypass`` ("No-op operator that passes data through unchanged"): the token, its
    name, or None."""
    return op is None or _token_name(op) == "bypass"


def _activation_name(op, api):
    if _token_name(op) == "prelu":
        return "prelu"
    if op in _ACT:
        return _ACT[op]
    if isinstance(op, str) and op in nl._UNARY_FN:
        return op
    raise nki_error("nkisim_invalid_argument", api=api,
                    why=f"unsupported activation {_token_name(op) or op!r} (nki-act-func)")


def _reduce_op_name(op, api):
    name = _token_name(op)
    if name not in ("abs_max", "abs_min"):
        name = _CANON.get(_alu_name(op, api), _alu_name(op, api))
    if name not in _ACTIVATE2_REDUCE:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"reduce_op {name} is not supported; use nl.add, nl.maximum, "
                            "nl.minimum, nl.abs_max or nl.abs_min")
    return name


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False,
              reverse1=False, reduce_op=None, reduce_res=None, reduce_cmd="idle"):
    """Per element in fp32 on the Scalar Engine: ``val = (data <op0> imm0) <op1> imm1`` (each
    stage skipped for ``nl.bypass``, operands swapped by ``reverse0``/``reverse1``), ``dst =
    op(val)`` (``prelu``: ``val`` if ``val >= 0`` else ``relu_param * val``), cast to
    ``dst.dtype``; the accumulator ``reduce_op``-reduces the results under ``reduce_cmd``
    (``reset_reduce``: from the identity; ``reduce``: from its value; ``reset``: identity only;
    ``idle``: unchanged) and ``reduce_res`` (P, 1) receives it. NeuronCore-v4+.

    Choices: the register reduces the fp32 activation results ("Stage 3 ...
    accumulator = reduce_op(accumulator, dst[i])"; the Scalar Engine computes "in float32
    precision", casting "to the output dtype" at the end). ``load_reduce`` is not among the
    commands the docs describe for activate2, and it has no value to load: not supported. The
    device reads the accumulator into ``reduce_res`` with "an additional instruction"; nkisim
    records one instruction (its ``reduce`` detail set)."""
    run = context.current()
    api = "activate2"
    require_nc_version(run, "nki.isa.activate2", 4)
    d = _tile(dst, api, "dst")
    x = _tile(data, api, "data")
    _same_elements(api, "data", x, "dst", d)
    fname = _activation_name(op, api)
    n0 = None if _bypass(op0) else _CANON.get(_alu_name(op0, api), _alu_name(op0, api))
    n1 = None if _bypass(op1) else _CANON.get(_alu_name(op1, api), _alu_name(op1, api))
    if n0 is None and n1 is not None:
        raise nki_error("nkisim_invalid_argument", api=api, why="op1 requires op0 to be set")
    if (n0, n1) not in _ACTIVATE2_PAIRS:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"(op0, op1) = ({n0 or 'bypass'}, {n1 or 'bypass'}) is not one of "
                            "the supported combinations (multiply, add), (multiply, subtract), "
                            "(multiply, bypass), (add, bypass), (subtract, bypass), (bypass, "
                            "bypass)")
    if reverse0 and n0 is None:
        raise nki_error("nkisim_invalid_argument", api=api, why="reverse0 requires op0 to be set")
    if reverse1 and n1 is None:
        raise nki_error("nkisim_invalid_argument", api=api, why="reverse1 requires op1 to be set")
    if isinstance(imm0, Tensor) and isinstance(imm1, Tensor) and imm0.dtype != imm1.dtype:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"all immediates (imm0, imm1) must have the same dtype when both "
                            f"are tensors, got {dtypes.name(imm0.dtype)} and "
                            f"{dtypes.name(imm1.dtype)}")
    if reduce_cmd not in ("idle", "reset", "reset_reduce", "reduce"):
        raise nki_error("nkisim_unsupported", what=f"{api} reduce_cmd={reduce_cmd}",
                        why="the docs describe reset_reduce, reduce, reset and idle for "
                            "activate2, which has no value to load")
    P = x.shape[0]
    v = _rows(nl._tile_vals(x, api, run), P)
    tiles = [x]
    # a bypassed stage reads no immediate
    if n0 is not None:
        i0, t0 = _vector(run, api, "imm0", imm0, x)
        v = apply_binary(n0, i0, v) if reverse0 else apply_binary(n0, v, i0)
        tiles += [t0] if t0 is not None else []
    if n1 is not None:
        i1, t1 = _vector(run, api, "imm1", imm1, x)
        v = apply_binary(n1, i1, v) if reverse1 else apply_binary(n1, v, i1)
        tiles += [t1] if t1 is not None else []
    v = np.asarray(v, np.float32)
    if fname == "prelu":
        alpha, ta = _vector(run, api, "relu_param", relu_param, x)
        out = np.where(v >= 0, v, alpha * v).astype(np.float32)
        tiles += [ta] if ta is not None else []
    else:
        nl.activation_range(run, fname, v)
        out = np.asarray(nl.apply_unary(fname, v), np.float32)
    key = ("scalar", P)
    rname = None
    if reduce_op is not None:
        rname = _reduce_op_name(reduce_op, api)
    elif reduce_cmd in ("reset_reduce", "reduce", "reset") or reduce_res is not None:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"reduce_cmd={reduce_cmd}" + (" with reduce_res" if reduce_res
                                                          is not None else "") +
                            " needs reduce_op (nl.add, nl.maximum, nl.minimum, nl.abs_max or "
                            "nl.abs_min)")
    acc = run.vector_acc.get(key)
    if rname is not None:
        ident = np.full((P, 1), _IDENTITY[rname], np.float32)
        if reduce_cmd in ("reset", "reset_reduce") or acc is None:
            acc = ident
        if reduce_cmd in ("reset_reduce", "reduce"):
            acc = _fold(rname, np.asarray(acc, np.float32).reshape(P, 1), out)
        if reduce_cmd != "idle":
            run.vector_acc[key] = acc
    write(d, out.reshape(d.shape), api, run=run)
    detail = _detail(*tiles)
    detail.update(func=fname, alu=n0, alu1=n1, inputs=1, reduce=False)
    instr = run.record(api, SCALAR, tuple(region(t) for t in tiles), (region(d),),
                       dtypes.name(d.dtype), P, out.shape[1], detail)
    if reduce_res is not None:
        _write_reduce_res(run, reduce_res, np.asarray(acc, np.float32).reshape(P, 1), api,
                          instr)
