"""Language operations that lower to engine instructions (ref §1.8): ``nl.matmul`` and
``nl.transpose`` to TensorE ``nc_matmul``/``nc_transpose``, ``nl.dropout`` to the ISA's dropout,
``nl.loop_reduce`` and ``nl.atomic_rmw`` to a tensor_tensor / DMA read-modify-write whose op codes
the engines resolve. Dialect-free: both faces take these as they are.
"""

from __future__ import annotations

import builtins
import linecache
import re
import sys

import numpy as np

from . import context, dtypes, engines
from .errors import nki_error, shape_str
from .indexing import MaskExpr
from .ops import _detail, _mask, _tile, _tile_shape, _tile_vals, apply_binary, copy
from .ops import ignored_keywords as _ignored_keywords
from .tensor import (
    Tensor,
    _free,
    _partitions,
    allocate,
    fit,
    operand_masked,
    read,
    region,
    sbuf,
    values,
    write,
)
from .trace import DMA, VECTOR

_SUBSCRIPT_RE = re.compile(r"^\s*[A-Za-z_][\w.]*\s*\[.*\]\s*=(?!=)")


def loop_reduce(x, op, loop_indices, *, dtype=None, mask=None, **kwargs):
    """``b = nl.loop_reduce(a, op=np.add, loop_indices=[k])``: ``b = op(a, b)`` where ``b`` is
    the variable the result is assigned to (the destination is also op's right input)."""
    if kwargs:
        _ignored_keywords(loop_reduce, kwargs)
    run = context.current()
    t = _tile(x, "loop_reduce", "x")
    name = engines._alu_name(op, "loop_reduce")
    f = sys._getframe(1)
    from .tensor import _infer_name
    target = _infer_name(f.f_code.co_filename, f.f_lineno, "")
    prev = f.f_locals.get(target) if target else None
    if not isinstance(prev, Tensor) and _SUBSCRIPT_RE.match(
            linecache.getline(f.f_code.co_filename, f.f_lineno)):
        # `acc[idx] = nl.loop_reduce(x, ...)` (AWS's reference/attention.py flash_attn_bwd):
        # the subscripted destination is the accumulator; the assignment performs
        # `acc[idx] = op(x, acc[idx])` (nkisim.tensor.assign)
        res = copy(t, dtype=dtype, mask=mask)
        res._reduce = engines._alu_name(op, "loop_reduce")
        return res
    if not isinstance(prev, Tensor):
        raise nki_error("nkisim_unsupported", what="nl.loop_reduce without an accumulator",
                        why="write `acc = nl.loop_reduce(x, op=..., loop_indices=[i])` with "
                            "`acc` a tile created before the loop")
    a = _tile_vals(t, "loop_reduce", run)
    # The destination is the accumulator itself, updated in place across the loop: an
    # associative reduction, not a loop-carried dependency (ref §1.9), so no race check.
    _tile(prev, "loop_reduce", "dst")
    if prev._w is not None:
        from . import checks
        checks.check_read(run, prev, "loop_reduce", accumulate=True)
    b = dtypes.to_f32(values(prev)).reshape(_tile_shape(prev))
    out = apply_binary(name, a, fit(b, a.shape))
    write(prev, fit(out, prev.shape), "loop_reduce", accumulate=True, run=run)
    run.record("tensor_tensor", VECTOR, (region(t), region(prev)), (region(prev),),
               dtypes.name(prev.dtype), _partitions(prev), _free(prev), _detail(t, prev))
    return prev


def transpose(x, *, dtype=None, mask=None, **kwargs):
    """Transpose a 2-D tile between partition and free dimension (TensorE, result in PSUM)."""
    if kwargs:
        _ignored_keywords(transpose, kwargs)
    t = _tile(x, "transpose", "x")
    if len(t.shape) > 2:
        raise nki_error("err_exceed_max_supported_dimension", param="x",
                        shape=shape_str(t.shape), api="transpose", limit=2)
    for d, s in enumerate(_tile_shape(t)):
        if s > 128:
            raise nki_error("err_size_of_dimension_exceed_arch_limit", dim=d, param="x",
                            shape=shape_str(t.shape), api="transpose", limit=128)
    return engines.nc_transpose(t, dtype=dtype, engine=engines.engine.tensor, mask=mask)


def matmul(x, y, *, transpose_x=False, mask=None, **kwargs):
    """``x @ y`` (or ``x.T @ y``); lowers to ``nc_matmul(transpose(x), y)`` (ref §1.8)."""
    if kwargs:
        _ignored_keywords(matmul, kwargs)
    context.current()                  # outside a kernel: err_nki_api_outside_of_nki_kernel
    for p, t in (("x", x), ("y", y)):
        # x, y: SBUF (ref §1.8). A PSUM tile (an nl.transpose result) is a tolerated rule,
        # reported by nc_matmul: AWS's tutorials/attention_fwd_performance v1 does
        # `nl.matmul(scores, nl.transpose(v_sbuf))`.
        if isinstance(t, Tensor) and t.root.buffer not in ("sbuf", "psum"):
            raise nki_error("err_unsupported_memory", param=p, api="matmul", expected="sbuf",
                            got=t.root.buffer)
    xt = _tile(x, "matmul", "x")
    yt = _tile(y, "matmul", "y")
    xs, ys = _tile_shape(xt), _tile_shape(yt)
    # in nl.matmul's own terms (reference §1.8: "x's free dim must equal y's partition dim (for
    # transpose_x=False)"), not the nc_matmul it lowers to
    if not transpose_x and len(xs) == 2 and xs[1] != ys[0]:
        hint = " (x.T @ y: transpose_x=True)" if xs[0] == ys[0] else ""
        raise nki_error("nkisim_nl_matmul_shapes", x=shape_str(xs), y=shape_str(ys), tx="",
                        why=f"x @ y contracts x's free size {xs[1]} with y's partition size "
                            f"{ys[0]}, which differ{hint}")
    if transpose_x and xs[0] != ys[0]:
        raise nki_error("nkisim_nl_matmul_shapes", x=shape_str(xs), y=shape_str(ys),
                        tx=", transpose_x=True",
                        why=f"x.T @ y contracts x's partition size {xs[0]} with y's partition "
                            f"size {ys[0]}, which differ")
    if not transpose_x:
        # the extra TensorE transpose the compiler inserts, then a copy back to SBUF; an
        # operand mask of x (`x[pred]`, tensor.operand_masked) goes with it, transposed
        xm = xt._opmask
        tp = engines.nc_transpose(xt, engine=engines.engine.tensor,
                                  _api=None if xm is None else "nc_transpose (nl.matmul)")
        xt = copy(tp, dtype=xt.dtype, buffer=sbuf)
        del tp
        if xm is not None:
            xt = operand_masked(xt, MaskExpr(xm.T))
    # (the mask is the result's, (M, N): "the Neuron Compiler cannot distinguish the two input
    # axes" of a matmul in a mask= expression, NKI API Masking)
    return engines.nc_matmul(xt, yt, mask=mask)


def dropout(x, rate, *, dtype=None, mask=None, **kwargs):
    """``nl.dropout(x, rate)``: zero each element with probability ``rate`` (a scalar or a tile
    with one value per partition); no rescaling (docstring: "Randomly zeroes some of the elements
    of the input tile given a probability rate"; nki-samples reference/attention.py rescales by
    1 / (1 - p) itself)."""
    if kwargs:
        _ignored_keywords(dropout, kwargs)
    return engines.dropout(x, rate, dtype=dtype, mask=mask)


def rms_norm(x, w, axis, n, epsilon=1e-06, *, dtype=None, compute_dtype=None, mask=None,
             **kwargs):
    """``nl.rms_norm(x, w, axis, n, epsilon)``: ``x / RMS(x) * w`` (Beta 1 and 0.3+ docstrings),
    RMS over ``axis`` with ``n`` "the total number of values to calculate rms":
    ``RMS(x) = sqrt(sum(x**2, axis) / n + epsilon)`` (epsilon "to avoid divide-by-zero", added
    to the mean square as in the usual RMSNorm). ``w`` broadcasts against ``x``. "Currently
    dtype and compute_dtype behave the same, both set internal compute and return dtype"
    (Beta 1 docstring): the result has ``dtype or compute_dtype or x.dtype``; the engines compute
    in fp32. nki 0.3+ (Rules.rms_norm_compute_internal): the result has ``dtype or x.dtype``
    ("if not specified, it will default to be the same as the data type of the input tile")
    and ``compute_dtype`` is "dtype for the internal computation" only: the two intermediate
    SBUF columns (sum of squares, 1/RMS) are held in it. No document gives the lowering; it
    is costed as the instructions it takes:
    ScalarE ``activation(square)`` reducing into the sum of squares, ScalarE ``rsqrt`` with
    scale 1/n and bias epsilon on that column, VectorE ``x * rstd * w``."""
    if kwargs:
        _ignored_keywords(rms_norm, kwargs)
    from .ops import reduce_axes, result_tile
    from .trace import SCALAR
    run = context.current()
    api = "rms_norm"
    t = _tile(x, api, "x")
    wt = _tile(w, api, "w") if isinstance(w, Tensor) else None
    if wt is None:
        raise nki_error("nkisim_invalid_argument", api=f"nl.{api}",
                        why=f"w must be a tile, got {type(w).__name__}")
    axes = reduce_axes(t, axis, f"nl.{api}")
    try:
        n = float(n)
    except (TypeError, ValueError):
        raise nki_error("nkisim_invalid_argument", api=f"nl.{api}",
                        why=f"n must be a number, got {n!r}") from None
    if n <= 0:
        raise nki_error("nkisim_invalid_argument", api=f"nl.{api}",
                        why=f"n (the count of values in the mean square) must be > 0, got {n:g}")
    xv = _tile_vals(t, api, run)
    wv = _tile_vals(wt, api, run)
    shape = _tile_shape(t)
    try:
        if np.broadcast_shapes(wv.shape, shape) != shape:
            raise ValueError
    except ValueError:
        raise nki_error("nkisim_shape_mismatch", params=f"x{shape_str(t.shape)}, "
                        f"w{shape_str(wt.shape)}", api=f"nl.{api}",
                        why="w must broadcast to the shape of x") from None
    internal = run.rules.rms_norm_compute_internal
    inter = dtypes.normalize(compute_dtype) if internal and compute_dtype is not None else \
        np.dtype(np.float32)

    def held(v):            # an intermediate column as its SBUF tile holds it
        return v if inter == np.float32 else dtypes.to_f32(dtypes.cast(v, inter))
    m = _mask(mask, shape)
    # under a mask the sum of squares takes the masked-in elements only, the ones the
    # instructions process (API masking), as the masked nl.sum does
    inside = None if m is None else np.broadcast_to(m, shape)
    with np.errstate(all="ignore"):
        ss = held(np.sum(np.square(xv), axis=axes, keepdims=True, dtype=np.float32,
                         where=True if inside is None else inside))
        rstd = held((np.float32(1.0) / np.sqrt(ss / np.float32(n) + np.float32(epsilon))
                     ).astype(np.float32))
        out = (xv * rstd * wv).astype(np.float32)
    # the two ScalarE steps write SBUF columns the final multiply reads (their own tiles,
    # so the schedule orders the three instructions as the data does)
    sst = allocate(ss.shape, inter, sbuf, "", None, api, False, None, run)
    write(sst, ss, api, run=run)
    run.record("activation", SCALAR, (region(t),), (region(sst),), dtypes.name(inter),
               _partitions(t), _free(t), dict(_detail(t), func="square", reduce="add"))
    rst = allocate(ss.shape, inter, sbuf, "", None, api, False, None, run)
    write(rst, rstd, api, run=run)
    run.record("activation", SCALAR, (region(sst),), (region(rst),), dtypes.name(inter),
               _partitions(sst), _free(sst), dict(_detail(sst), func="rsqrt"))
    d = _detail(t, rst, wt, inputs=2)
    d["alu"] = "multiply"
    out_dt = dtype or (t.dtype if internal else compute_dtype or t.dtype)
    return result_tile(run, shape, out_dt, out, "tensor_tensor",
                       VECTOR, (t, rst, wt), d, mask=m)


def atomic_rmw(dst, value, op, *, mask=None, **kwargs):
    """``nl.atomic_rmw(dst, value, op)``: ``dst = op(dst, value)`` on HBM, atomically ("only
    supports np.add currently"; aws-neuron-sdk nki/test/test_nki_nl_atomic_rmw.py indexes ``dst``
    with an SBUF index tile). Indices that repeat accumulate every contribution (atomic)."""
    if kwargs:
        _ignored_keywords(atomic_rmw, kwargs)
    from .indirect import accumulate_at
    run = context.current()
    api = "atomic_rmw"
    if not isinstance(dst, Tensor) or dst.root.buffer != "hbm":
        raise nki_error("err_unsupported_memory", param="dst", api=api, expected="hbm",
                        got=getattr(getattr(dst, "root", None), "buffer", type(dst).__name__))
    name = engines._alu_name(op, api)
    if name != "add":
        raise nki_error("nkisim_unsupported", what=f"atomic_rmw with {name}",
                        why="the docs: 'only supports np.add currently'")
    if isinstance(value, Tensor):
        src = _tile(value, api, "value")
        vals = fit(dtypes.to_f32(read(src, api, run)), dst.shape, src.shape)
        reads = (region(src),)
    else:
        vals = np.full(dst.shape, np.float32(value))
        reads = ()
    accumulate_at(dst, vals, api, run, mask=_mask(mask, dst.shape))
    nbytes = dst.size * dst.dtype.itemsize
    run.record("dma_copy", DMA, reads + (region(dst),), (region(dst),), dtypes.name(dst.dtype),
               _partitions(src) if isinstance(value, Tensor) else 1,
               _free(src) if isinstance(value, Tensor) else dst.size,
               {"bytes": nbytes, "src": "sbuf", "dst": "hbm", "rmw": True,
                "row_bytes": nbytes // builtins.max(1, dst.shape[0]),
                "rows": builtins.max(1, dst.shape[0])})
