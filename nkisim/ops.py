"""``neuronxcc.nki.language`` (nl) on nkisim (ref §1.2–§1.9).

Every function validates its operands against the target's limits, computes in fp32 on NumPy
(ref §1.3: engines compute in fp32 and cast on output), writes a new tile (SBUF unless stated)
and records one instruction. Engine choice follows the lowering notes of ref §1.8: element-wise
binary ops and reductions on VectorE, unary math on ScalarE (``activation``), matmul/transpose
and partition broadcasts on TensorE, loads/stores on the DMA queues.
"""

from __future__ import annotations

import builtins
import math
import os
import sys

import ml_dtypes
import numpy as np

from . import context, dtypes, frontend, tensor
from .access import access_pattern, dynamic_select, vector_select  # noqa: F401 - Tensor.ap
from .context import Loop as _Loop
from .dstform import into_target
from .dtypes import (  # noqa: F401 - re-exported as nl.float32 etc.
    bfloat16,
    bool_,
    float8_e4m3,
    float8_e5m2,
    float16,
    float32,
    int8,
    int16,
    int32,
    tfloat32,
    uint8,
    uint16,
    uint32,
)
from .errors import _PKG_DIR, nki_error, shape_str
from .indexing import DynSlice, IndexExpr, MaskExpr, arange, ds, mgrid, par_dim, whole  # noqa: F401
from .indirect import (  # noqa: F401 - indirect_getitem: Tensor.__getitem__ (register_ops)
    dynamic_index,
    index_tiles,
    indirect_getitem,
)
from .tensor import (  # noqa: F401 - re-exported buffers
    Tensor,
    _free,
    _partitions,
    allocate,
    fit,
    hbm,
    private_hbm,
    psum,
    read,
    reduction_taint,
    region,
    sbuf,
    shared_hbm,
    values,
    write,
)
from .trace import DMA, GPSIMD, SCALAR, TENSOR, VECTOR

# ---------------------------------------------------------------------------------------------
# constants


class _TileSize:
    """``nl.tile_size``: per-target tile limits (ref §1.4)."""

    pmax = 128
    psum_fmax = 512
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    # Not documented (ref §1.4, §6.1); 4 bytes is what fp32 access needs.
    psum_min_align = 4
    sbuf_min_align = 4

    @property
    def total_available_sbuf_size(self):
        run = context.maybe_current()
        from .arch import get_arch
        return (run.arch if run else get_arch()).sbuf_usable_bytes


tile_size = _TileSize()


class _FloatConst:
    def __init__(self, minv, maxv):
        self.min, self.max = minv, maxv


def _from_bits(bits, dtype):
    return float(np.array([bits], dtype=np.uint32 if dtype == np.float32 else np.uint16)
                 .view(dtype)[0])


# ref §1.3: nl.fp32.min is the bit pattern 0xff7fffff (most negative finite fp32) and
# nl.bfp16.min is 0xff80, which in bf16 is -inf (the spec's bit pattern, kept as given).
fp32 = _FloatConst(_from_bits(0xFF7FFFFF, np.float32), float(np.finfo(np.float32).max))
bfp16 = _FloatConst(_from_bits(0xFF80, dtypes.bfloat16),
                    float(ml_dtypes.finfo(dtypes.bfloat16).max))


def static_cast(data, dtype):
    """Cast a host scalar/array (used to build bf16/fp8 NumPy inputs)."""
    return dtypes.cast(np.asarray(data, dtype=np.float32) if np.asarray(data).dtype.kind == "f"
                       else np.asarray(data), dtype)


# ---------------------------------------------------------------------------------------------
# operand helpers

def _tile(x, api, param, run=None) -> Tensor:
    """Check that ``x`` is an SBUF/PSUM tile whose first dimension is the partition dimension."""
    if not isinstance(x, Tensor):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"operand '{param}' must be an NKI tile, got {type(x).__name__}")
    if x.root.buffer == "hbm":
        raise nki_error("err_unsupported_memory", param=param, api=api, expected="psum|sbuf",
                        got="hbm")
    if x._slots is not None or x.paxis != 0:
        raise nki_error("err_failed_to_infer_tile_from_local_tensor", name=x.name)
    return x


def _tile_vals(x: Tensor, api, run) -> np.ndarray:
    """fp32 values of a tile; a 1-D partition vector (P,) is seen as (P, 1)."""
    v = read(x, api, run)
    if v.ndim == 1:
        v = v.reshape(v.shape[0], 1)
    return dtypes.to_f32(v)


def _tile_shape(x: Tensor) -> tuple:
    return x.shape if len(x.shape) >= 2 else (x.shape[0], 1)


def _detail(*tiles, inputs=None):
    psum_in, all_16bit, contiguous = False, True, True       # (plain loop: per instruction)
    for t in tiles:
        if t.root.buffer == "psum":
            psum_in = True
        if t.dtype not in dtypes.SIXTEEN_BIT:
            all_16bit = False
        if contiguous and not _contiguous(t):
            contiguous = False
    return {"inputs": len(tiles) if inputs is None else inputs, "psum_in": psum_in,
            "all_16bit": all_16bit, "contiguous": contiguous}


def _contiguous(t: Tensor) -> bool:
    a = t._arr
    return t._idx is None and a is not None and (a.ndim == 0 or a.strides[-1] == a.itemsize)


class _NoMask:
    """The default of the nl wrappers' ``mask`` parameter, telling "not passed" from an explicit
    ``mask=None``, which the nki 0.3+ signatures reject like any ``mask=`` (keywords_check).
    Shown as ``None``, the default Beta 1's signatures document."""

    __slots__ = ()

    def __repr__(self):
        return "None"


NO_MASK = _NoMask()


def _mask(mask, shape):
    if mask is None:
        return None
    if isinstance(mask, (bool, np.bool_)):
        # a condition on loop indices and constants only evaluates to a Python bool: all or
        # nothing (AWS's reference/allocated_fused_linear.py: `mask=(i * 128 < n)`)
        return None if mask else np.zeros(shape, bool)
    if not isinstance(mask, MaskExpr):
        raise nki_error("err_unsupported_expression_in_mask")
    try:
        return np.broadcast_to(mask.v, shape)
    except ValueError:
        raise nki_error("nkisim_invalid_argument", api="mask",
                        why=f"mask of shape {list(mask.v.shape)} does not broadcast to the "
                            f"instruction's shape {list(shape)}") from None


# False: an instruction of the current face always builds its result tile, which ``_into``
# then copies into its dst (tests compare both paths)
DIRECT_RESULTS = True


def direct_out(run, shape, dtype, engine, api, buffer=sbuf):
    """The array an op without a mask may compute its result into (``out=``): ``run.into``'s
    storage (``tensor.begin_direct``) where ``result_tile`` below writes the result there, else
    None (compute as usual). The op then passes that array to ``result_tile`` as its values,
    nothing raising in between."""
    into = run.into
    if into is None or not DIRECT_RESULTS or run.taint is not None or engine == TENSOR or (
            engine == GPSIMD and into.root.buffer == "psum"):
        return None
    return tensor.begin_direct(run, into, shape, dtype, buffer, api)


def apply_binary_into(name, a, b, out) -> None:
    """``apply_binary(name, a, b)`` computed into ``out`` (fp32, the inputs' shape), for a
    ``name`` in ``PLAIN_BINARY`` (a plain ufunc of the fp32 inputs: the same loop, so the
    same values)."""
    _PLAIN_BINARY_FN[name](a, b, out=out)


def result_tile(run, shape, dtype, vals, op, engine, reads, detail, buffer=sbuf, mask=None,
                name=None, fresh=False, site=None):
    """Create the instruction's output tile, write ``vals``, record the instruction.

    ``fresh``: ``vals`` was just computed by the op and nothing else references it, so it may
    become the tile's storage without a copy (``tensor.allocate(storage=)``). ``site``: the
    kernel's (file, line), when the op has it. ``run.into`` (set by ``dstform.call_into``: the
    current face's ``nki.isa._direct``, Beta 1's ``t[key] = op(...)``): the tile to write the
    result into instead, when it can go there directly (``tensor.write_into``); that tile is
    returned then."""
    if site is None:
        site = context.caller_location()       # (the op's caller's line: the kernel's)
    into = run.into
    if into is not None:
        run.into = None                        # (for this instruction's result only)
        if engine == GPSIMD and into.root.buffer == "psum":
            # Beta 1: an instruction's result "is a tile in SBUF, unless the returned value is
            # assigned to a pre-declared PSUM tile", and "GpSimd Engine cannot access PSUM"
            # (isa tensor_copy doc): `psum_t[...] = <a GpSimd instruction>` writes PSUM from
            # GpSimd (the current face checks its dst itself)
            raise nki_error("err_unsupported_memory", param="dst", api=f"{op} (on GpSimd)",
                            expected="sbuf", got="psum")
        if DIRECT_RESULTS and mask is None and run.taint is None and engine != TENSOR:
            instr = tensor.write_into(run, into, shape, dtype, buffer, vals, op, engine, reads,
                                      detail, site)
            if instr is not None:
                into._producer = instr         # (dstform.call_into restores it)
                return into
    storage = vals if fresh and mask is None else None
    t = allocate(shape, dtype, buffer, name or "", None, op, mask is not None, storage, run,
                 site)
    root = t.root
    if storage is not None and root.adopted and run.taint is None:
        root.adopted = False   # (write's adopted-storage case, inline: nothing left to do)
    else:
        write(t, vals, op, run=run, mask=mask)
    regs = tensor.read_regions(reads)
    if t.paxis == 0:            # (what _partitions and _free give for a tile, inline)
        p = t.shape[0]
        free = t._arr.size // p
    else:
        p, free = _partitions(t), _free(t)
    if mask is not None and not mask.all():
        p, free = _masked_extent(mask, p, free)
    t._producer = run.record(op, engine, regs, (region(t),), dtypes.name(t.dtype), p, free,
                             detail, site)
    return t


# ---------------------------------------------------------------------------------------------
# creation (ref §1.6)

def ndarray(shape, dtype, *, buffer=None, name="", **kwargs):
    if kwargs:
        ignored_keywords(ndarray, kwargs)
    return allocate(shape, dtype, buffer=buffer, name=name, api="nl.ndarray")


def _filled(shape, dtype, value, buffer, name, api):
    run = context.current()
    t = allocate(shape, dtype, buffer=buffer, name=name, fill=value, api=api)
    if t.root.buffer == "sbuf":
        # SBUF init is a memset instruction; a PSUM zeros before `+=` matmuls is folded into the
        # first matmul of the accumulation group by the compiler (ref §1.11), so no instruction.
        run.record("memset", VECTOR, (), (region(t),), dtypes.name(t.dtype), _partitions(t),
                   _free(t), {"inputs": 0, "value": float(value),
                              "all_16bit": t.dtype in dtypes.SIXTEEN_BIT})
    else:
        run.memory.filled(t.root)     # holds its value from here on (its lifetime starts)
    return t


def zeros(shape, dtype, *, buffer=None, name="", **kwargs):
    if kwargs:
        ignored_keywords(zeros, kwargs)
    return _filled(shape, dtype, 0, buffer, name, "nl.zeros")


def ones(shape, dtype, *, buffer=None, name="", **kwargs):
    if kwargs:
        ignored_keywords(ones, kwargs)
    return _filled(shape, dtype, 1, buffer, name, "nl.ones")


def full(shape, fill_value, dtype, *, buffer=None, name="", **kwargs):
    if kwargs:
        ignored_keywords(full, kwargs)
    return _filled(shape, dtype, fill_value, buffer, name, "nl.full")


def empty_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    if kwargs:
        ignored_keywords(empty_like, kwargs)
    return ndarray(a.shape, dtype or a.dtype, buffer=buffer, name=name)


def zeros_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    if kwargs:
        ignored_keywords(zeros_like, kwargs)
    return zeros(a.shape, dtype or a.dtype, buffer=buffer, name=name)


def ones_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    if kwargs:
        ignored_keywords(ones_like, kwargs)
    return ones(a.shape, dtype or a.dtype, buffer=buffer, name=name)


def full_like(a, fill_value, dtype=None, *, buffer=None, name="", **kwargs):
    if kwargs:
        ignored_keywords(full_like, kwargs)
    return full(a.shape, fill_value, dtype or a.dtype, buffer=buffer,
                name=name)


# ---------------------------------------------------------------------------------------------
# iterators (ref §1.9)

class LoopIndex(int):
    """A loop variable: an int that notices Python control flow depending on it.

    Arithmetic on it gives plain ints on purpose: values computed from loop variables are not
    watched. AWS's CI-tested flash attention kernels (nki-samples reference/attention.py) branch
    on them: `if i < n_tile_q:` with `i = i0 * size + i1`, `if multiplication_required_selection:`
    computed from `q_tile_idx * B_P_SIZE`, and a warning there would be a false alarm on valid
    code (tried and reverted; an `if` on the loop variable itself stays a warning)."""

    __slots__ = ()

    def _flow(self):
        run = context.maybe_current()
        if run is not None and run.loops:
            run.warn(("flow", context.caller_location()),
                     "Python control flow on an nl.*_range loop variable: the real NKI front end "
                     "traces the loop body once with a symbolic index, so `if` on it does not "
                     "do what it does here; use masks or nl.static_range")

    def __eq__(self, o):
        self._flow()
        return int(self) == o

    def __ne__(self, o):
        self._flow()
        return int(self) != o

    def __lt__(self, o):
        self._flow()
        return int(self) < o

    def __le__(self, o):
        self._flow()
        return int(self) <= o

    def __gt__(self, o):
        self._flow()
        return int(self) > o

    def __ge__(self, o):
        self._flow()
        return int(self) >= o

    def __bool__(self):
        self._flow()
        return int(self) != 0

    __hash__ = int.__hash__


def _loop(kind, args, make_index, api=None, watch=None):
    """The generator behind ``nl.*_range``: one activation (a ``context.Loop``), a new epoch
    per iteration (the race checks compare epochs), the tiles of an iteration out of scope
    when the next starts. Per activation and per iteration it does only attribute updates
    (issue 12: a 3x3 conv2d starts a loop every two matmuls)."""
    run = context.current()
    api = api or f"nl.{kind}_range"     # (the face's name for the loop, for messages)
    if len(args) == 1:
        r = range(whole(args[0], f"{api}'s stop"))
    elif len(args) == 0 or len(args) > 3:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why="expects (stop), (start, stop) or (start, stop, step)")
    else:
        bounds = [whole(a, f"{api}'s {what}") for a, what in zip(args, ("start", "stop", "step"))]
        if len(bounds) == 3 and bounds[2] == 0:
            raise nki_error("nkisim_invalid_argument", api=api, why="the step must not be zero")
        r = range(*bounds)
    f = sys._getframe(1)            # (context.caller_location: the kernel's line)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
    lid = run.next_loop_id
    loop = _Loop(lid, kind, f.f_code.co_filename, f.f_lineno) if f is not None else \
        _Loop(lid, kind, "", 0)
    run.next_loop_id = lid + 1
    loop.parent_epoch = parent = run.epoch
    stack = run.loops
    if not stack:
        outer = ()
    else:       # the enclosing loop's key for its current iteration (as Run.record uses it)
        outer = stack[-1].key
        if stack[-1].epoch != parent or len(outer) != len(stack):
            outer = tuple([(lp.id, lp.kind, lp.iteration) for lp in stack])
    stack.append(loop)
    memory = run.memory
    epochs, scope = run.epochs, loop.scope
    # Beta 1 traces the body once (frontend.carried_names): watch the Python numbers its
    # source carries from one iteration to the next, if any
    carried = frontend.carried_names(f.f_code, f.f_lineno) if (
        (make_index is LoopIndex if watch is None else watch) and f is not None) else None
    if carried is not None and not carried[0]:
        carried = None                 # (nothing to watch: one test per iteration)
    seen = None
    try:
        for i in r:
            if carried is not None:
                seen = _carried_values(loop, f, carried, seen, i, api)
            if scope:                          # (tiles allocated in the previous iteration)
                memory.end_iteration(loop)
            loop.iteration = i
            loop.key = outer + ((lid, kind, i),)      # for the trace (Run.record)
            e = run.next_epoch                 # (Run.new_epoch, inline)
            run.next_epoch = e + 1
            epochs[e] = (parent, lid, kind, i)
            if not loop.first_epoch:
                loop.first_epoch = e
            loop.epoch = run.epoch = e
            yield make_index(i)
    finally:
        if scope:
            memory.end_iteration(loop)
        stack = run.loops
        if stack and stack[-1] is loop:
            stack.pop()
        elif loop in stack:
            stack.remove(loop)
        run.epoch = loop.parent_epoch


def _carried_values(loop, frame, carried, seen, i, api) -> dict:
    """The numbers among the loop body's carried names (``frontend.carried_names``) as
    iteration ``i`` starts; raises ``nkisim_python_state_in_loop`` when one changed since the
    previous iteration started (the device's traced body sees its value from before the loop
    in every iteration).

    One exception, a warning: a number used only to pick a tile from a Python list or tuple
    of tiles (``bufs[k % 2]``, a hand-made double buffer). The device's traced body picks the
    same tile in every iteration, which computes the same values (its iterations do not
    overlap there)."""
    names, var, picks = carried
    local = frame.f_locals
    now = {}
    for name in names:
        v = local.get(name)
        if picks.get(name) is frontend.GROWN:
            if isinstance(v, list):
                now[name] = len(v)
                if seen is not None and name in seen and seen[name] != len(v):
                    raise nki_error("nkisim_python_list_in_loop", name=name, var=var or "?",
                                    kind=api, where=f"{os.path.basename(loop.file)}:"
                                    f"{loop.line}", before=seen[name], after=len(v))
            continue
        if isinstance(v, LoopIndex):
            v = int(v)                  # (a loop index's value, compared without a warning)
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            now[name] = v
            if seen is not None and name in seen and seen[name] != v:
                where = f"{os.path.basename(loop.file)}:{loop.line}"
                bases = picks.get(name)
                if bases is frontend.AFTER:
                    raise nki_error("nkisim_python_state_after_loop", name=name,
                                    var=var or "?", kind=api, where=where, before=seen[name],
                                    after=v)
                if bases and builtins.all(_tile_list(local.get(b, frame.f_globals.get(b)))
                                 for b in bases):
                    context.current().warn(
                        ("carried_pick", name),
                        f"Python variable `{name}` changes from one iteration of the `{var}` "
                        f"loop ({api} at {where}) to the next, and picks a tile from "
                        f"{', '.join(f'`{b}`' for b in sorted(bases))}: the NKI Beta 1 front "
                        "end runs the body once, so on the device every iteration uses the "
                        "tile it picks before the loop (the same values, without the "
                        "alternation); compute the pick from the loop variable",
                        site=(loop.file, loop.line))
                    continue
                raise nki_error("nkisim_python_state_in_loop", name=name, var=var or "?",
                                kind=api, where=where, before=seen[name], after=v)
    return now


def _tile_list(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and builtins.all(
        isinstance(x, Tensor) for x in value)


class TracedRange:
    """Python's ``range`` inside a Beta 1 kernel (``runtime.simulate`` serves it in the kernel
    module's globals while the kernel runs). "Neuron compiler transforms any usage of Python
    range() API into nl.sequential_range() under the hood" (Beta 1 programming model), and its
    body is traced once like any Beta 1 loop ("val += 1 in for i in range(8) will print 1 in
    NKI 0.1.0", migration guide): a ``for`` over it watches the Python numbers its body carries
    from one iteration to the next, as ``nl.sequential_range`` does (``_carried_values``).
    Everything else is the range's own (len, indexing, ``in``, reversed, ...)."""

    __slots__ = ("r",)

    def __init__(self, *args):
        self.r = builtins.range(*args)

    def __iter__(self):
        if context.maybe_current() is None:
            return iter(self.r)
        f = sys._getframe(1)        # (the kernel's frame, at its `for` statement)
        if f is None or not frontend.for_statement(f.f_code, f.f_lineno):
            return iter(self.r)     # (a comprehension, `list(range(n))`: Python's own)
        # a sequential loop of Python ints (its tiles go out of scope after it, as
        # nl.sequential_range's do: err_local_variable_used_out_of_scope), watched as one
        r = self.r
        return _loop("sequential", (r.start, r.stop, r.step), int, api="range", watch=True)

    def __len__(self):
        return len(self.r)

    def __getitem__(self, key):
        return self.r[key]

    def __contains__(self, value):
        return value in self.r

    def __reversed__(self):
        return reversed(self.r)

    def __eq__(self, other):
        return self.r == (other.r if isinstance(other, TracedRange) else other)

    def __hash__(self):
        return hash(self.r)

    def __repr__(self):
        return repr(self.r)

    def __getattr__(self, name):            # start, stop, step, count, index
        return getattr(self.r, name)


def affine_range(*args, **kwargs):
    """Parallel loop: no loop-carried dependencies allowed (checked by nkisim.checks)."""
    return _loop("affine", args, LoopIndex)


def sequential_range(*args, **kwargs):
    return _loop("sequential", args, LoopIndex)


def static_range(*args, **kwargs):
    """Fully unrolled at trace time: the loop variable is a plain Python int."""
    return _loop("static", args, int)


# ---------------------------------------------------------------------------------------------
# SPMD (ref §1.1)

def program_id(axis=0):
    run = context.current()
    _grid_axis(run, axis, "nl.program_id")
    if not run.grid:
        return 0
    return run.program_ids[int(axis)]


def _grid_axis(run, axis, api) -> None:
    """``axis`` must name a dimension of the launch grid; a launch without one is a grid of
    one dimension (``kernel(...)`` is ``kernel[1](...)``)."""
    n = len(run.grid) if run.grid else 1
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or \
            not 0 <= int(axis) < n:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"axis {axis!r} out of range for a grid of {n} dims")


def num_programs(axes=None):
    """Programs along ``axes`` of the launch grid; without ``axes``, the total number of
    programs (the 2.26 docstring: "If axes is not provided, returns the total number of
    programs")."""
    run = context.current()
    grid = run.grid or (1,)
    if axes is None:
        return math.prod(grid)
    if isinstance(axes, (tuple, list)):
        for a in axes:
            _grid_axis(run, a, "nl.num_programs")
        return tuple(grid[a] for a in axes)
    _grid_axis(run, axes, "nl.num_programs")
    return grid[int(axes)]


def program_ndim():
    return len(context.current().grid)


class spmd_dim(int):
    """``nl.spmd_dim(a, b)``: one launch-grid dimension of size ``a * b`` split in sub-dimensions,
    one of which may be an ``nl.nc(n)`` (instances spread over n physical NeuronCores).

    The AWS doc example (aws-neuron-sdk nki/api/nki/language/__init__.py, ``spmd_dim``/``nc``, and
    nki/test/test_nki_spmd_grid.py) launches ``kernel[nl.spmd_dim(nl.nc(2), 2), 2]`` over a (4, 2)
    grid: ``program_id(0)`` runs over 0..3 as with ``kernel[4, 2]``, only the core assignment
    differs. nkisim runs the instances serially, so the values are those of the plain grid;
    ``layout`` keeps the factors."""

    def __new__(cls, *dims):
        if not dims:
            raise nki_error("nkisim_invalid_argument", api="nl.spmd_dim",
                            why="expects at least one dimension size")
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or int(d) < 1:
                raise nki_error("nkisim_invalid_argument", api="nl.spmd_dim",
                                why=f"dimension sizes must be positive ints, got {d!r}")
        obj = super().__new__(cls, math.prod(int(d) for d in dims))
        obj.layout = tuple(d if isinstance(d, nc) else int(d) for d in dims)
        return obj

    def __repr__(self):
        return f"nl.spmd_dim({', '.join(map(repr, self.layout))})"


class nc(int):
    """``nl.nc(n)``: a logical NeuronCore dimension of size ``n`` in the launch grid;
    ``nl.nc(2) * 2`` and ``2 * nl.nc(2)`` are ``nl.spmd_dim(nl.nc(2), 2)`` and
    ``nl.spmd_dim(2, nl.nc(2))`` (aws-neuron-sdk nki/test/test_nki_spmd_grid.py)."""

    def __new__(cls, n):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or int(n) < 1:
            raise nki_error("nkisim_invalid_argument", api="nl.nc",
                            why=f"the number of NeuronCores must be a positive int, got {n!r}")
        obj = super().__new__(cls, int(n))
        obj.layout = (obj,)
        return obj

    def __mul__(self, other):
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return spmd_dim(self, other)
        return NotImplemented

    def __rmul__(self, other):
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return spmd_dim(other, self)
        return NotImplemented

    def __repr__(self):
        return f"nl.nc({int(self)})"


# ---------------------------------------------------------------------------------------------
# memory ops (ref §1.7)

def _dma_detail(dst: Tensor, src: Tensor, nbytes: int, dst_run=None, dst_buffer=None,
                mask=None) -> dict:
    """A DMA record's detail. ``dst_run``, ``dst_buffer``: the destination's contiguous run and
    buffer when the record describes another destination than ``dst`` (``_load_into``).
    ``mask``: the instruction's mask (of ``dst``'s shape; ``nbytes`` counts only its elements),
    whose masked-out elements are not moved, so they neither make nor break runs."""
    if dst_run is None:
        dst_run, dst_buffer = _contig_bytes(dst, mask), dst.root.buffer
    row = builtins.max(1, builtins.min(dst_run, _contig_bytes(src, mask)))
    return {"bytes": nbytes, "src": src.root.buffer, "dst": dst_buffer,
            "row_bytes": row, "rows": builtins.max(1, -(-nbytes // row))}


def _contig_bytes(t: Tensor, mask=None) -> int:
    a = t._arr
    masked = mask is not None and mask.size == t.size
    if a is not None and (masked or t._idx is not None):
        # an advanced-indexed view (``a[m*128 + i.p, i.x]`` with ``i = nl.mgrid[...]``) or a
        # masked one: its runs from its elements' addresses (``_offsets_run``), however the
        # kernel spelled the index (nkisim.cost: DMAs are costed by their contiguous runs)
        return _offsets_run(t, _offsets(t), mask if masked else None)
    if a is None:
        return t.dtype.itemsize
    run = a.itemsize
    limit = t.root.row_bytes if t.root.buffer != "hbm" else None
    for n, s in zip(reversed(a.shape), reversed(a.strides)):
        if n == 1:
            continue
        if s != run or (limit and run * n > limit):
            if s == run and limit:
                run = limit
            break
        run *= n
    return run


def _offsets(t: Tensor):
    """The byte offset of each element of view ``t`` in its storage (``t``'s element order), or
    None for an index form this does not understand."""
    a = t._arr
    try:
        if t._idx is None:
            off = np.zeros((), dtype=np.int64)
            for ax, (n, st) in enumerate(zip(a.shape, a.strides)):
                off = off + (np.arange(n, dtype=np.int64) * st).reshape(
                    (n,) + (1,) * (a.ndim - ax - 1))
            return np.broadcast_to(off, a.shape)
        idx = [np.asarray(i, dtype=np.int64) for i in t._idx]
        off = np.zeros(np.broadcast_shapes(*(i.shape for i in idx)), dtype=np.int64)
        for i, st in zip(idx, a.strides):
            off = off + i * st
        return off
    except Exception:                      # noqa: BLE001 - an index form this does not know
        return None


def _offsets_run(t: Tensor, off, mask=None) -> int:
    """Mean contiguous run (bytes) of the elements at byte offsets ``off`` (``_offsets``), of
    those ``mask`` keeps: each maximal run of consecutive addresses along the last axis is one
    descriptor; an SBUF run ends at its partition's end."""
    item = t._arr.itemsize
    if off is None or off.ndim == 0 or off.size <= 1:
        return item
    keep = None if mask is None else np.asarray(mask).reshape(-1, off.shape[-1])
    off = off.reshape(-1, off.shape[-1])
    limit = t.root.row_bytes if t.root.buffer != "hbm" else None
    cont = np.diff(off, axis=1) == item
    if limit:                              # an SBUF run ends at its partition's end
        cont &= (off[:, 1:] // limit) == (off[:, :-1] // limit)
    if keep is None:
        runs, n = off.shape[0] + int((~cont).sum()), off.size
    else:
        # an element starts a run unless it continues the element before it, both moved
        cont &= keep[:, 1:] & keep[:, :-1]
        n = int(keep.sum())
        runs = int(keep[:, 0].sum()) + int((keep[:, 1:] & ~cont).sum())
        if not runs:
            return item
    return builtins.max(item, int(item * n // runs))


def _dma(dst: Tensor, src: Tensor, src_vals, api: str, run, mask=None, accumulate_op=None):
    """Record and perform a DMA transfer (values already read and shaped)."""
    idx_tiles = index_tiles(src) + index_tiles(dst)
    if run.taint is not None and accumulate_op is None and not idx_tiles and \
            src_vals.size == dst.size:
        # a plain copy: exactly the elements copied from never-written ones are never-written
        tensor.elementwise_taint(run, src)
    if accumulate_op is not None:
        cur = dtypes.to_f32(read(dst, api, run))
        src_vals = accumulate_op(cur, dtypes.to_f32(src_vals))
    write(dst, dtypes.copy_values(np.asarray(src_vals), dst.dtype), api, run=run, mask=mask)
    if mask is not None and mask.all():
        mask = None
    # a masked DMA moves only the elements its mask keeps (ref §1.12: the instruction "only
    # processes" them): its bytes, and its runs, are theirs
    nbytes = (dst.size if mask is None else int(np.count_nonzero(mask))) * dst.dtype.itemsize
    idx = tuple(region(i) for i in idx_tiles)   # indirect DMA
    p, free = (_partitions(dst), _free(dst)) if dst.root.buffer != "hbm" else \
        (_partitions(src), _free(src))
    if mask is not None:
        p, free = _masked_extent(mask, p, free)
    run.record("dma_copy", DMA, (region(src),) + idx, (region(dst),), dtypes.name(dst.dtype),
               p, free, _dma_detail(dst, src, nbytes, mask=mask))


def _masked_extent(mask, p: int, free: int) -> tuple:
    """(partitions, free elements per partition) a masked instruction processes: the
    partitions with an element the mask keeps, and the most such elements in one (ref §1.12,
    "lowered into a hardware ISA instruction that only processes 64x256 elements" for the
    mask ``(i_p < 64) & (i_f < 256)`` of a 128x512 tile). ``p``, ``free``: the unmasked ones,
    kept when the mask's first axis is not the partition axis."""
    if mask.ndim < 1 or mask.shape[0] != p or mask.size != p * free:
        return p, free
    per = np.count_nonzero(mask.reshape(p, -1), axis=1)
    return builtins.max(1, int(np.count_nonzero(per))), builtins.max(1, int(per.max()))


def _load_into(dst: Tensor, src: Tensor, vals, run, spec, site) -> bool:
    """``dst[...] = nl.load(src)`` without the result tile (``tensor.write_into`` for a load):
    ``dst`` written, then the record the literal path leaves once the assignment has
    retargeted it: the result tile's allocation effects, partitions, free size, bytes and
    contiguous run (a fresh tile's whole partition row), ``dst`` as the written region. False
    (nothing done) when writing ``dst`` raises (``tensor.write_checked``)."""
    if not tensor.write_checked(dst, fit(vals, dst.shape, spec.shape), "dma_copy", run):
        return False
    tensor._unallocated_result(run, spec.buf.kind, site)
    p = spec.shape[0]
    nbytes = math.prod(spec.shape) * spec.dt.itemsize
    run.record("dma_copy", DMA, (region(src),), (region(dst),), dtypes.name(dst.dtype), p,
               math.prod(spec.phys_shape) // p,
               _dma_detail(dst, src, nbytes, spec.pbytes, spec.buf.kind), site)
    return True


@into_target
def load(src, *, mask=None, dtype=None, **kwargs):
    """HBM -> a new SBUF tile (``dtype`` casts)."""
    if kwargs:
        ignored_keywords(load, kwargs)
    run = context.current()
    if not isinstance(src, Tensor):
        raise nki_error("nkisim_invalid_argument", api="load",
                        why=f"src must be an HBM tensor, got {type(src).__name__}")
    if src.root.buffer != "hbm":
        raise nki_error("err_unsupported_memory", param="src", api="load", expected="hbm",
                        got=src.root.buffer)
    shape = src.shape if len(src.shape) >= 2 else (src.shape[0] if src.shape else 1, 1)
    if shape[0] > run.arch.pmax:
        raise nki_error("err_num_partition_exceed_arch_limit", n=shape[0], limit=run.arch.pmax)
    dt = dtype or src.dtype
    into = run.into
    vals = None
    if into is not None:
        run.into = None                 # (for this instruction's result only)
        root = src.root
        # `t[key] = nl.load(x[...])` (nkisim.dstform) straight into t[key], when reading the
        # source can neither fail nor carry never-written values (a kernel input, read-only,
        # a plain view): the read then touches nothing the allocation changes, so it may come
        # before the allocation's effects (and before the result tile's, when the write into
        # t[key] is refused and the tile is made after all)
        if DIRECT_RESULTS and mask is None and root.param and not root.mutable and \
                src._oob is None and src._idx is None and run.taint is None and \
                not index_tiles(src) and not index_tiles(into):
            spec = tensor.direct_spec(run, into, shape, dt, None)
            if spec is not None:
                vals = read(src, "load", run).reshape(shape)
                if _load_into(into, src, vals, run, spec, context.caller_location()):
                    return into
    t = allocate(shape, dt, api="load")
    if vals is None:
        vals = read(src, "load", run).reshape(shape)
    _dma(t, src, vals, "load", run, mask=_mask(mask, shape))
    t._producer = run.trace.instrs[-1]
    return t


def store(dst, value, *, mask=None, **kwargs):
    """SBUF (or PSUM, with an extra copy) tile -> HBM."""
    if kwargs:
        ignored_keywords(store, kwargs)
    run = context.current()
    if not isinstance(dst, Tensor) or dst.root.buffer != "hbm":
        raise nki_error("err_unsupported_memory", param="dst", api="store", expected="hbm",
                        got=getattr(getattr(dst, "root", None), "buffer", type(dst).__name__))
    if isinstance(value, (int, float)):
        vals = np.full(dst.shape, value, np.float32)
        src = None
    else:
        src = _tile(value, "store", "value")
        vals = read(src, "store", run)
        if src.root.buffer == "psum":
            # "an extra copy will be performed to move the tile to SBUF first" (ref §1.7)
            taint = run.taint
            run.record("tensor_copy", VECTOR, (region(src),), (), dtypes.name(src.dtype),
                       _partitions(src), _free(src), _detail(src))
            run.taint = taint
    if src is not None and (vals.size != dst.size or (
            len(dst.shape) >= 2 and vals.ndim >= 2 and vals.shape[0] != dst.shape[0])):
        # "Same partition rules" as nl.load (reference §1.7): a (64, 128) tile is no (128, 64)
        # destination (a forgotten transpose), as in `dst[...] = tile`; a 1-D destination
        # takes the tile's elements in order (the handouts' `out[m]` of a vector)
        vals = fit(vals, dst.shape, src.shape, "nl.store")
    vals = vals.reshape(dst.shape) if vals.size == dst.size else vals
    if src is None:
        write(dst, vals, "store", run=run, mask=_mask(mask, dst.shape))
        return
    _dma(dst, src, vals, "store", run, mask=_mask(mask, dst.shape))


def load_transpose2d(src, *, mask=None, dtype=None, **kwargs):
    """HBM [F, P] -> SBUF [P, F] transposed by the DMA (slow: ref §1.7, §3.5)."""
    if kwargs:
        ignored_keywords(load_transpose2d, kwargs)
    run = context.current()
    if not isinstance(src, Tensor) or src.root.buffer != "hbm":
        raise nki_error("err_unsupported_memory", param="src", api="load_transpose2d",
                        expected="hbm", got=getattr(getattr(src, "root", None), "buffer", "?"))
    if len(src.shape) != 2:
        raise nki_error("err_exceed_max_supported_dimension", param="src",
                        shape=shape_str(src.shape), api="load_transpose2d", limit=2)
    F, P = src.shape
    if P > run.arch.pmax:
        raise nki_error("err_num_partition_exceed_arch_limit", n=P, limit=run.arch.pmax)
    t = allocate((P, F), dtype or src.dtype, api="load_transpose2d")
    vals = read(src, "load_transpose2d", run).T
    write(t, vals, "load_transpose2d", run=run, mask=_mask(mask, (P, F)))
    d = _dma_detail(t, src, t.size * t.dtype.itemsize)
    d["transpose"] = True
    d["row_bytes"] = t.dtype.itemsize     # element-wise descriptors: DMA transpose is slow
    d["rows"] = t.size
    run.record("dma_copy", DMA, (region(src),), (region(t),), dtypes.name(t.dtype), P, F, d)
    t._producer = run.trace.instrs[-1]
    return t


@into_target
def copy(src, *rest, mask=NO_MASK, dtype=None, buffer=None, **kwargs):
    """SBUF/PSUM -> a new SBUF tile (e.g. PSUM evacuation with a cast)."""
    if rest:
        dtype, = positional_check("copy", 1, rest, ("dtype",), (dtype,))
    mask = keywords_check("copy", mask, kwargs, copy) if mask is not NO_MASK or kwargs else None
    run = context.current()
    x = _tile(src, "copy", "src")
    vals = read(x, "copy", run)
    if run.taint is not None:
        from .tensor import elementwise_taint
        elementwise_taint(run, x)
    d = _detail(x)
    d["auto_engine"] = True            # the compiler picks the engine (nkisim.cost)
    # nki 0.3-0.5: the result is in the source's buffer (ScalarE activation(copy)); Beta 1 and
    # nki 0.6+: always SBUF (spec nki-current.md §2.3)
    buf = buffer or (psum if run.rules.copy_same_buffer and x.root.buffer == "psum" else sbuf)
    if run.rules.copy_same_buffer and dtypes.is_int(x.dtype):
        # ... and its values pass through fp32: "casts through FP32, which may be lossy for
        # integer types with values exceeding FP32 precision" (0.3 nl.copy docstring); 0.6.0's
        # Vector Engine copy is bit-exact
        vals = dtypes.to_f32(vals)
    return result_tile(run, x.shape, dtype or x.dtype, vals, "tensor_copy", VECTOR, (x,),
                       d, buffer=buf, mask=_mask(mask, x.shape))


def broadcast_to(src, *, shape, dtype=None, **kwargs):
    if kwargs:
        ignored_keywords(broadcast_to, kwargs)
    run = context.current()
    x = _tile(src, "broadcast_to", "src")
    shape = tuple(int(s) for s in shape)
    vals = read(x, "broadcast_to", run)
    xs = _tile_shape(x)
    try:
        out = np.broadcast_to(vals.reshape(xs), shape)
    except ValueError:
        raise nki_error("nkisim_shape_mismatch", params=f"src{shape_str(x.shape)}",
                        api="broadcast_to",
                        why=f"cannot broadcast to {shape_str(shape)}") from None
    if shape[0] > run.arch.pmax:
        raise nki_error("err_num_partition_exceed_arch_limit", n=shape[0], limit=run.arch.pmax)
    engine = TENSOR if xs[0] != shape[0] else VECTOR   # partition broadcast = matmul with ones
    detail = _detail(x)
    if engine == TENSOR:
        detail.update(K=xs[0], M=shape[0], N=math.prod(shape[1:]), accumulate=False,
                      transpose=False, fp32=x.dtype.itemsize == 4, flops=0)
    return result_tile(run, shape, dtype or x.dtype, out, "broadcast_to", engine, (x,), detail)


class OpToken:
    """An op code that kernels pass to ISA instructions (``op=``, ``op0=``) and that is not an
    nl function itself: ``nl.average`` (0.5.0 stubs: ``tensor_partition_reduce``'s "add,
    average, max, bitwise_or, bitwise_and"), ``nl.bypass`` ("No-op operator that passes data
    through unchanged", activate2's op0/op1) and ``nl.prelu`` ("Parametric ReLU activation
    function", with ``relu_param``), both 0.4.0. Engines recognise it by ``__name__``."""

    def __init__(self, name):
        self.__name__ = name

    def __repr__(self):
        return f"nl.{self.__name__}"

    def __call__(self, *args, **kwargs):
        raise TypeError(f"nl.{self.__name__} is an op code for ISA instructions (op=nl."
                        f"{self.__name__}), not a function")


average = OpToken("average")
bypass = OpToken("bypass")
prelu = OpToken("prelu")


def expand_dims(data, axis):
    """``nl.expand_dims(data, axis)``: a view of ``data`` with a size-1 axis inserted at each
    ``axis`` (numpy.expand_dims positions), never the partition dimension (0). Beta 1 "currently
    only supports expanding dimensions after the last index of the tile" (its docstring); the
    0.3+ docstring states no such limit (``run.rules.expand_dims_last_only``)."""
    run = context.current()
    api = "expand_dims"
    x = _tile(data, api, "data")
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    nd = len(x.shape) + len(axes)
    try:
        pos = sorted(int(a) + nd if int(a) < 0 else int(a) for a in axes)
    except TypeError:
        raise nki_error("nkisim_invalid_argument", api=f"nl.{api}",
                        why=f"axis must be an int or a tuple of ints, got {axis!r}") from None
    if len(set(pos)) != len(pos) or not builtins.all(0 <= a < nd for a in pos):
        raise nki_error("nkisim_invalid_argument", api=f"nl.{api}",
                        why=f"axis {axis!r} is out of range for a {nd}-D result")
    if pos[0] == 0:
        raise nki_error("nkisim_invalid_argument", api=f"nl.{api}",
                        why="the new axis cannot be the partition dimension (0)")
    if run.rules.expand_dims_last_only and pos != list(range(len(x.shape), nd)):
        raise nki_error("nkisim_invalid_argument", api=f"nl.{api}",
                        why=f"axis {axis!r}: Beta 1 only inserts axes after the last index "
                            f"of the tile ({len(x.shape)} and up for a {len(x.shape)}-D tile)")
    out = x
    for a in pos:
        out = out.expand_dims(a)
    return out


def device_print(prefix, x, *, mask=None, **kwargs):
    """Print a tensor's values (works on nkisim as in the real CPU simulator)."""
    if kwargs:
        ignored_keywords(device_print, kwargs)
    run = context.current()
    if isinstance(x, Tensor):
        vals = read(x, "device_print", run)
        text = f"{prefix} {np.array2string(np.asarray(vals, dtype=np.float64) if dtypes.is_float(x.dtype) else vals, threshold=64)}"  # noqa: E501
    else:
        text = f"{prefix} {x}"
    run.taint = None                    # printing garbage is not an error
    run.device_prints.append(text)
    print(text, file=sys.stdout)


# ---------------------------------------------------------------------------------------------
# element-wise math (ref §1.8)

def partition_vectors(a, b):
    """A (P, 1) (or (P,)) operand broadcasts along every free dimension of the other operand,
    whatever its rank: NumPy would align (P, 1) with the *last* two axes of a (P, R, W) tile.
    CS149 solutions that passed on trn2 add a (P, 1) bias to (P, R, W) and (P, R, 2, W) tiles
    with nl.add / nisa.tensor_tensor (issue 8); the docs' tensor_scalar takes "a vector of
    shape (P, 1)" broadcast along the free dimensions (nki.isa.tensor_scalar)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.ndim != b.ndim and \
            a.ndim and b.ndim and a.shape[0] == b.shape[0]:
        if math.prod(a.shape[1:]) == 1 and a.ndim < b.ndim:
            a = a.reshape((a.shape[0],) + (1,) * (b.ndim - 1))
        elif math.prod(b.shape[1:]) == 1 and b.ndim < a.ndim:
            b = b.reshape((b.shape[0],) + (1,) * (a.ndim - 1))
    return a, b


def _bitvec_op(name):
    return name in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
                    "invert")


_BINARY_FN = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "power": np.power, "mod": np.mod,
    "fmod": np.fmod, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor, "left_shift": np.left_shift,
    "right_shift": np.right_shift, "equal": np.equal, "not_equal": np.not_equal,
    "greater": np.greater, "greater_equal": np.greater_equal, "less": np.less,
    "less_equal": np.less_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}
_COMPARE = {"equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
            "logical_and", "logical_or", "logical_xor"}
# the comparisons whose 0.6.0 docstrings default dtype to the input tile's (logical_and/or/xor
# give no default: they keep bool)
_COMPARE_INPUT_DTYPE = {"equal", "not_equal", "greater", "greater_equal", "less", "less_equal"}


# The ALU's one-input ops (ALU op table, nki.api.shared tbl-aluop: abs, reciprocal on
# Vector/Scalar, rsqrt on GpSimd/Scalar, logical_not): as op0/op1 of tensor_scalar & co. they
# apply to the first input and ignore the second (AWS's nki-library rmsnorm_quant.py:
# tensor_scalar_reduce(op0=nl.abs, operand0=0.0, reduce_op=nl.maximum), an abs-max)
_UNARY_ALU_FN = {
    "abs": np.abs, "reciprocal": lambda a: 1.0 / a, "rsqrt": lambda a: 1.0 / np.sqrt(a),
    "logical_not": lambda a: (a == 0).astype(np.float32),
}


# the binary ALU ops that are a plain NumPy ufunc of the fp32 inputs (not bit-vector ops)
_PLAIN_BINARY_FN = {k: v for k, v in _BINARY_FN.items() if not _bitvec_op(k) and
                    k not in _UNARY_ALU_FN}


PLAIN_BINARY = frozenset(_PLAIN_BINARY_FN)


def apply_binary(name, a, b):
    """fp32 (or raw-bit integer) element-wise op on engine inputs."""
    fn = _PLAIN_BINARY_FN.get(name)
    if fn is not None:
        return fn(a, b)           # (the commonest case first: one lookup)
    if name in _UNARY_ALU_FN:
        return _UNARY_ALU_FN[name](np.asarray(a, np.float32))
    if name == "invert":
        # the ALU's one-input bitvec op ("Bitwise Not", nki.api.shared tbl-aluop): the first
        # input's bits, the second (tensor_scalar's operand, "None or 0") ignored
        a = np.asarray(a)
        return np.invert(a) if a.dtype == np.bool_ else np.invert(a.astype(np.int64))
    fn = _BINARY_FN[name]
    # no np.errstate here: a run computes under np.errstate(all="ignore") (runtime.simulate)
    if _bitvec_op(name):
        a = np.asarray(a)
        if name == "right_shift" and a.dtype.kind == "i":
            # logical shift of the operand's bits (ref §1.10 ALU table: right_shift is
            # logical, arithmetic shift right is not supported)
            a = a.astype(np.dtype(f"u{a.dtype.itemsize}"))
        return fn(a.astype(np.int64), np.asarray(b).astype(np.int64))
    return fn(a, b)


def _operand_dtype(x):
    return x.dtype if isinstance(x, Tensor) else dtypes.scalar_dtype(x)


def _binary(name, x, y, dtype, mask):
    run = context.current()
    api = name
    if name in ("add", "subtract", "multiply") and builtins.any(
            isinstance(t, IndexExpr) for t in (x, y)):
        return dynamic_index(name, x, y, run)
    tiles = [t for t in (x, y) if isinstance(t, Tensor)]
    if not tiles:
        raise nki_error("nkisim_invalid_argument", api=api, why="needs at least one tile")
    for i, t in enumerate((x, y)):
        if isinstance(t, Tensor):
            _tile(t, api, "xy"[i])
        elif not isinstance(t, (int, float, np.integer, np.floating, bool)):
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"operand {'xy'[i]} must be a tile or a scalar, "
                                f"got {type(t).__name__}")
    bitvec = _bitvec_op(name)

    def vals(t):
        if isinstance(t, Tensor):
            v = read(t, api, run)
            v = v.reshape(_tile_shape(t))
            return v if bitvec else dtypes.to_f32(v)
        return t
    if len(tiles) == 2 and not run.rules.broadcast and x.shape != y.shape:
        # nki 0.3+ nl.add etc. do not broadcast (RN 2.29/2.30 known issue: "a (128, 1) +
        # (128, 512) add fails"; spec nki-current.md §2.3): the launching face's rule
        raise nki_error("nkisim_shape_mismatch", params=f"x{shape_str(x.shape)}, "
                        f"y{shape_str(y.shape)}", api=f"nl.{api}",
                        why="must have the same shape: nki.language element-wise ops do not "
                            "broadcast (use nisa.tensor_scalar with a (P, 1) operand)")
    a, b = partition_vectors(vals(x), vals(y))
    sa = a.shape if isinstance(a, np.ndarray) else ()
    sb = b.shape if isinstance(b, np.ndarray) else ()
    try:
        shape = np.broadcast_shapes(sa, sb)
    except ValueError:
        raise nki_error("nkisim_shape_mismatch", params=", ".join(
            f"{'xy'[i]}{shape_str(s)}" for i, s in enumerate((sa, sb))), api=api,
            why="could not be broadcast together") from None
    if bitvec and not builtins.all(dtypes.is_int(_operand_dtype(t)) for t in (x, y)):
        raise nki_error("nkisim_operand_dtype", param="x", api=api,
                        dtype=dtypes.name(_operand_dtype(x)), allowed="integer dtypes "
                        "(bitvec ops treat bits raw)")
    if dtype is None:
        if name in _COMPARE_INPUT_DTYPE and run.rules.compare_input_dtype:
            # nki 0.3+: "Defaults to the input tile dtype" (Rules.compare_input_dtype); 1/0
            dtype = tiles[0].dtype if len(tiles) == 1 else dtypes.promote(x.dtype, y.dtype)
        elif name in _COMPARE:
            dtype = np.dtype(np.bool_)
        else:
            dtype = dtypes.promote(_operand_dtype(x), _operand_dtype(y))
    engine = VECTOR
    op = "tensor_tensor" if len(tiles) == 2 else "tensor_scalar"
    out = None
    if run.into is not None and mask is None and len(shape) >= 2 and name in PLAIN_BINARY:
        # `t[...] = nl.add(...)`: computed straight into the destination (the same ufunc)
        out = direct_out(run, shape, dtype, engine, op)
        if out is not None:
            apply_binary_into(name, a, b, out)
    fresh = False
    if out is None:
        out = apply_binary(name, a, b)
        # the ufunc's own result becomes the tile's storage (no copy, issue 12), unless it is
        # broadcast or reshaped
        fresh = type(out) is np.ndarray and out.shape == shape and out.base is None and \
            out is not a and out is not b
        if not fresh:
            out = np.broadcast_to(out, shape)
    detail = _detail(*tiles, inputs=len(tiles))
    detail["alu"] = name
    if len(shape) < 2:
        shape = (shape[0] if shape else 1, 1)
        out = out.reshape(shape)
        fresh = False
    return result_tile(run, shape, dtype, out, op, engine, tiles, detail,
                       mask=_mask(mask, shape), fresh=fresh)


_PARAMS: dict = {}


def ignored_keywords(fn, kwargs, api=None) -> None:
    """Keywords a Beta 1 op's ``**kwargs`` swallowed: Beta 1's signatures end in ``**kwargs``
    (``nl.matmul(x, y, *, transpose_x=False, mask=None, **kwargs)``, spec §1.6-1.8), so
    ``nl.matmul(x, y, tranpose_x=True)`` runs as ``x @ y`` with no error: a suspicious-pattern
    warning naming the keyword and the parameter it is closest to. (The current dialect's
    signatures have none: Python's TypeError there, ``keywords_check``.) Only near misses of
    a named parameter warn. ``api``: the name to show, when not ``fn``'s."""
    run = context.maybe_current()
    if run is None or run.rules.strict_keywords:
        return
    params = _PARAMS.get(fn)
    if params is None:
        import inspect
        params = _PARAMS[fn] = tuple(
            n for n, p in inspect.signature(fn).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    import difflib
    if api is None:
        mod = getattr(fn, "__module__", "") or ""
        api = ("nisa." if mod.endswith(("engines", "gather")) else "nl.") + fn.__name__
    for key in kwargs:
        if key in params or key in _PASSTHROUGH:
            continue
        # only a near miss of a parameter the op names: AWS's kernels pass keywords no docstring
        # lists (nki-samples reference/attention.py: nl.full(..., lazy_initialization=True)),
        # which may mean something to the compiler
        close = difflib.get_close_matches(key, params, n=1, cutoff=0.6)
        if close:
            run.warn(("ignored_keyword", key),
                     f"{api}() has no parameter `{key}`; NKI Beta 1 takes it into **kwargs and "
                     f"ignores it: did you mean {close[0]}=?")


# keywords AWS's own Beta 1 kernels pass through **kwargs (no warning whatever they resemble)
_PASSTHROUGH = frozenset(("lazy_initialization", "perf_mode"))


def keywords_check(api, mask, kwargs, fn):
    """nki 0.3+ wrappers have no ``mask=`` ("no dtype= and no mask= on any ISA op", RN 2.27;
    the nl wrappers' 0.3.0+ signatures have none either) and, from 2.28, "unknown kwargs raise
    `unexpected keyword argument`" (spec nki-current §2.0 items 2 and 5): Python's TypeError
    under that face's rules (``Rules.strict_keywords``), for any ``mask=``, ``mask=None``
    included (a parameter the signature lacks). Beta 1's signatures take ``mask=`` and
    ``**kwargs``. Called only when the op got ``mask=`` (its default is ``NO_MASK``) or an
    extra keyword; returns the mask to apply (None when not passed). ``fn``: the op, whose
    signature names the keywords it takes (a Beta 1 near miss warns: ``ignored_keywords``)."""
    run = context.maybe_current()
    if run is None or not run.rules.strict_keywords:
        if kwargs:
            ignored_keywords(fn, kwargs, api=f"nl.{api}")
        return None if mask is NO_MASK else mask
    bad = "mask" if mask is not NO_MASK else sorted(kwargs)[0]
    raise TypeError(f"nl.{api}() got an unexpected keyword argument '{bad}'" +
                    (" (NKI 0.2.0 removed mask=: slice the operands to the region instead)"
                     if bad == "mask" else ""))


def positional_check(api, fixed, rest, names, given) -> tuple:
    """Positional arguments past an nl wrapper's fixed ones: nki 0.3+ signatures take them
    (``add(x, y, dtype=None)``, ``sum(x, axis, dtype=None, keepdims=False)``; STUB-R32), Beta
    1's are keyword-only (``add(x, y, *, dtype=None, mask=None, **kwargs)``), where Python
    raises its TypeError. Returns the values for ``names`` (``given`` where not passed)."""
    run = context.maybe_current()
    if run is None or not run.rules.strict_keywords or len(rest) > len(names):
        n = fixed + (len(names) if run is not None and run.rules.strict_keywords else 0)
        raise TypeError(f"{api}() takes {n} positional argument{'s' if n != 1 else ''} but "
                        f"{fixed + len(rest)} were given")
    out = list(given)
    for i, v in enumerate(rest):
        if given[i] is not None and given[i] is not False:
            raise TypeError(f"{api}() got multiple values for argument '{names[i]}'")
        out[i] = v
    return tuple(out)


def _make_binary(name):
    def op(x, y, *rest, dtype=None, mask=NO_MASK, **kwargs):
        if rest:
            dtype, = positional_check(name, 2, rest, ("dtype",), (dtype,))
        mask = keywords_check(name, mask, kwargs, op) if mask is not NO_MASK or kwargs else None
        return _binary(name, x, y, dtype, mask)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise ``{name}`` of two tiles (or a tile and a scalar), ref §1.8."
    return into_target(op)


add = _make_binary("add")
subtract = _make_binary("subtract")
multiply = _make_binary("multiply")
divide = _make_binary("divide")
maximum = _make_binary("maximum")
minimum = _make_binary("minimum")
power = _make_binary("power")
mod = _make_binary("mod")
fmod = _make_binary("fmod")
bitwise_and = _make_binary("bitwise_and")
bitwise_or = _make_binary("bitwise_or")
bitwise_xor = _make_binary("bitwise_xor")
left_shift = _make_binary("left_shift")
right_shift = _make_binary("right_shift")
equal = _make_binary("equal")
not_equal = _make_binary("not_equal")
greater = _make_binary("greater")
greater_equal = _make_binary("greater_equal")
less = _make_binary("less")
less_equal = _make_binary("less_equal")
logical_and = _make_binary("logical_and")
logical_or = _make_binary("logical_or")
logical_xor = _make_binary("logical_xor")


def _gelu(x):
    # In float64 whatever NumPy's promotion rules: NumPy 1.x keeps a float32 array float32
    # against the float64 scalar sqrt(2) (value-based casting), NumPy 2 promotes (NEP 50), and
    # 1 + erf(x/sqrt 2) cancels for x < 0, so in float32 the result was 3-4 ulp off on 1.26
    # (tests/nkisim/test_nl_ops.py::test_unary_float[gelu-float32]); the caller rounds once.
    from scipy.special import erf as _erf
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    from scipy.special import erf as _e
    return _e(x)


def _softplus(x):
    return np.logaddexp(0.0, x)


_UNARY_FN = {
    "copy": lambda x: x, "identity": lambda x: x,
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0), "gelu": _gelu, "gelu_apprx_tanh": _gelu_tanh,
    "silu": lambda x: x / (1.0 + np.exp(-x)), "erf": _erf, "softplus": _softplus,
    "mish": lambda x: x * np.tanh(_softplus(x)), "square": np.square, "abs": np.abs,
    "negative": np.negative, "sign": np.sign, "trunc": np.trunc, "floor": np.floor,
    "ceil": np.ceil, "sin": np.sin, "cos": np.cos, "tan": np.tan, "arctan": np.arctan,
    "reciprocal": lambda x: 1.0 / x, "logical_not": lambda x: (x == 0),
    "invert": None,
    # activation functions of the current nki.language that nki-library kernels pass to
    # nisa.activation (core/mlp, core/moe: gelu_apprx_sigmoid, silu_dx, gelu_apprx_sigmoid_dx).
    # The sigmoid approximation of GELU is x * sigmoid(1.702 x) (Hendrycks & Gimpel 2016,
    # "Gaussian Error Linear Units", §2); the _dx functions are the derivatives.
    "gelu_apprx_sigmoid": lambda x: x / (1.0 + np.exp(-1.702 * x)),
    "gelu_apprx_sigmoid_dx": lambda x: _sig(1.702 * x) * (1.0 + 1.702 * x *
                                                          (1.0 - _sig(1.702 * x))),
    "silu_dx": lambda x: _sig(x) * (1.0 + x * (1.0 - _sig(x))),
    "gelu_dx": lambda x: 0.5 * (1.0 + _erf(x / np.sqrt(2.0))) +
    x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi),
    # nl.erf_dx, "Derivative of the Error function (erf)" (Beta 1 and 0.3+ docstrings):
    # d/dx erf(x) = 2 / sqrt(pi) * exp(-x^2)
    "erf_dx": lambda x: (2.0 / np.sqrt(np.pi)) * np.exp(-x * x),
}


def apply_unary(name, x):
    with np.errstate(all="ignore"):
        return _UNARY_FN[name](x)


# The Scalar Engine's activation functions are "piecewise-polynomial approximations" whose
# output outside a documented input range is invalid (Beta 1 activation function table,
# nki.api.shared.rst tbl-act-func, reference §1.10): (lo, hi) of the input, of |x| for
# reciprocal. Every other function of the table takes [-inf, inf].
_ACT_RANGE = {"log": (2.0 ** -64, 2.0 ** 64), "sin": (-np.pi, np.pi),
              "arctan": (-np.pi / 2, np.pi / 2), "sqrt": (2.0 ** -116, 2.0 ** 118),
              "rsqrt": (2.0 ** -87, 2.0 ** 97), "reciprocal": (2.0 ** -42, 2.0 ** 42)}
_RANGE_TEXT = {"log": "[2^-64, 2^64]", "sin": "[-pi, pi]", "arctan": "[-pi/2, pi/2]",
               "sqrt": "[2^-116, 2^118]", "rsqrt": "[2^-87, 2^97]",
               "reciprocal": "+-[2^-42, 2^42]"}


def activation_range(run, name, x, where=None) -> None:
    """A suspicious-pattern warning when inputs ``x`` (fp32, the function's own input: after
    scale and bias) of the Scalar Engine function ``name`` fall outside its documented range;
    ``where``: the elements the instruction's mask keeps. nkisim computes NumPy's value there;
    the device's is invalid."""
    r = _ACT_RANGE.get(name)
    if r is None:
        return
    lo, hi = r
    a = np.abs(x) if name == "reciprocal" else x
    bad = (a < lo) | (a > hi)
    if where is not None:
        bad &= np.broadcast_to(where, bad.shape)
    n = int(np.count_nonzero(bad))
    if n:
        run.warn(("activation_range", name),
                 f"{name} on the Scalar Engine gets {n} of {bad.size} inputs outside its "
                 f"documented valid range {_RANGE_TEXT[name]} (e.g. {float(x[bad][0]):.6g}): "
                 "the engine's piecewise-polynomial approximation gives invalid output there "
                 "(activation function table); nkisim computes NumPy's value")


# the activation functions that are one NumPy ufunc of their fp32 input (or none: copy), which
# apply_unary_into computes in place
INPLACE_UNARY = frozenset(["copy", "identity"] + [
    k for k, v in _UNARY_FN.items() if isinstance(v, np.ufunc) and v.nin == 1])


def apply_unary_into(name, x) -> None:
    """``x[...] = apply_unary(name, x)`` for a ``name`` in ``INPLACE_UNARY`` (fp32 ``x``: the
    same ufunc loop, so the same values)."""
    fn = _UNARY_FN[name]
    if isinstance(fn, np.ufunc):
        with np.errstate(all="ignore"):
            fn(x, out=x)


def _unary(name, x, dtype, mask):
    run = context.current()
    t = _tile(x, name, "x")
    if name == "invert":
        if not dtypes.is_int(t.dtype):
            raise nki_error("nkisim_operand_dtype", param="x", api=name,
                            dtype=dtypes.name(t.dtype), allowed="integer dtypes")
        v = read(t, name, run).reshape(_tile_shape(t))
        out = np.invert(v.astype(np.int64)) if v.dtype != np.bool_ else ~v
        engine = VECTOR
    else:
        if run.allocated_kernel and run.rules.allocated_kernel_rules:
            # nl.exp & co. are ScalarE `activation` instructions, which need an explicit bias
            # tile in allocated kernels: use nisa.activation(..., bias=...) (ref §2.1)
            raise nki_error("err_bias_tensor_must_be_specified_in_allocation")
        v = _tile_vals(t, name, run)
        if name in _ACT_RANGE:
            activation_range(run, name, v, _mask(mask, v.shape))
        out = apply_unary(name, v)
        engine = SCALAR
    shape = _tile_shape(t)
    # logical_not: Beta 1 `dtype=bool`; nki 0.3+ "default to be the same as the data type of
    # the input tile" (Rules.compare_input_dtype)
    out_dt = dtype or (np.dtype(np.bool_) if name == "logical_not" and
                       not run.rules.compare_input_dtype else t.dtype)
    detail = _detail(t)
    detail["func"] = name
    return result_tile(run, shape, out_dt, out, "activation" if engine == SCALAR else
                       "tensor_scalar", engine, (t,), detail, mask=_mask(mask, shape))


def _make_unary(name):
    def op(x, *rest, dtype=None, mask=NO_MASK, **kwargs):
        if rest:
            dtype, = positional_check(name, 1, rest, ("dtype",), (dtype,))
        mask = keywords_check(name, mask, kwargs, op) if mask is not NO_MASK or kwargs else None
        return _unary(name, x, dtype, mask)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise ``{name}`` on ScalarE (ref §1.8)."
    return into_target(op)


exp = _make_unary("exp")
log = _make_unary("log")
sqrt = _make_unary("sqrt")
rsqrt = _make_unary("rsqrt")
tanh = _make_unary("tanh")
sigmoid = _make_unary("sigmoid")
relu = _make_unary("relu")
gelu = _make_unary("gelu")
gelu_apprx_tanh = _make_unary("gelu_apprx_tanh")
silu = _make_unary("silu")
erf = _make_unary("erf")
softplus = _make_unary("softplus")
mish = _make_unary("mish")
square = _make_unary("square")
abs = _make_unary("abs")  # noqa: A001 - NKI's name
negative = _make_unary("negative")
sign = _make_unary("sign")
trunc = _make_unary("trunc")
gelu_apprx_sigmoid = _make_unary("gelu_apprx_sigmoid")
gelu_apprx_sigmoid_dx = _make_unary("gelu_apprx_sigmoid_dx")
silu_dx = _make_unary("silu_dx")
gelu_dx = _make_unary("gelu_dx")
erf_dx = _make_unary("erf_dx")
floor = _make_unary("floor")
ceil = _make_unary("ceil")
sin = _make_unary("sin")
cos = _make_unary("cos")
tan = _make_unary("tan")
arctan = _make_unary("arctan")
reciprocal = _make_unary("reciprocal")
invert = _make_unary("invert")
logical_not = _make_unary("logical_not")


# ---------------------------------------------------------------------------------------------
# reductions (ref §1.8): any set of free axes (the compiler reorders free dims, ref §6.3)

_REDUCE_FN = {"add": np.sum, "sum": np.sum, "max": np.max, "maximum": np.max, "min": np.min,
              "minimum": np.min, "multiply": np.prod, "prod": np.prod, "mean": np.mean,
              "all": np.all, "any": np.any, "bitwise_and": np.bitwise_and.reduce,
              "bitwise_or": np.bitwise_or.reduce, "bitwise_xor": np.bitwise_xor.reduce,
              "logical_and": np.all, "logical_or": np.any, "var": np.var,
              # "Logical Xor ... Legal Reduction op: Y" (ALU table, nki.api.shared.rst): true
              # where an odd number of the elements is non-zero
              "logical_xor": lambda v, axis, keepdims, **kw: np.logical_xor.reduce(
                  np.asarray(v) != 0, axis=axis, keepdims=keepdims, **kw)}


def reduce_axes(t: Tensor, axis, api) -> tuple:
    nd = len(_tile_shape(t))
    if isinstance(axis, (int, np.integer)):
        axes = (int(axis),)
    elif isinstance(axis, (tuple, list)):
        axes = tuple(int(a) for a in axis)
    else:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"axis must be an int or a tuple/list of ints, got {axis!r}")
    axes = tuple(a + nd if a < 0 else a for a in axes)
    for a in axes:
        if a == 0:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why="axis must be free dimensions, not the partition dimension (0); "
                                "transpose first or matmul with a ones vector (ref §1.10)")
        if not 0 < a < nd:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"axis {a} out of range for a tile of {nd} dimensions")
    return axes


_BITVEC_INITIAL = {np.bitwise_and.reduce: -1, np.bitwise_or.reduce: 0, np.bitwise_xor.reduce: 0}


def reduce_values(opname, v, axes, keepdims, where=None):
    """Reduce ``v`` over ``axes``; ``where`` (a bool array of v's shape): only those elements
    take part (a masked reduction, see :func:`reduce_masks`)."""
    fn = _REDUCE_FN[opname]
    with np.errstate(all="ignore"):
        if fn in _BITVEC_INITIAL:
            out = v.astype(np.int64)
            kw = {} if where is None else {"initial": _BITVEC_INITIAL[fn]}
            for a in sorted(axes, reverse=True):
                if where is not None:
                    kw["where"] = where
                    where = np.logical_or.reduce(where, axis=a, keepdims=keepdims)
                out = fn(out, axis=a, keepdims=keepdims, **kw)
            return out
        if where is None:
            return fn(v, axis=axes, keepdims=keepdims)
        kw = {"where": where}
        if fn is np.max:
            kw["initial"] = -np.inf
        elif fn is np.min:
            kw["initial"] = np.inf
        return fn(v, axis=axes, keepdims=keepdims, **kw)


def reduce_masks(mask, in_shape, axes, out_shape):
    """``(input mask, output mask)`` of a reduction's ``mask=`` (None: all elements).

    A mask predicates the instruction's index space ("the instruction only processes the
    masked-in index region", ref §1.12), which for a reduction is its input's: AWS's
    tutorials/layernorm (v2) masks ``bn_stats`` on the input's free index
    (``mask=(j * bn_stats_fmax + i_f_bn < F)``, a [1, 512] mask for a [128, 6] result). So a mask
    that broadcasts to the input shape selects the input elements that take part, and an output
    element none of whose inputs is masked in is not written (our reading of "only processes");
    a mask that only fits the output shape masks the output."""
    if mask is None or isinstance(mask, (bool, np.bool_)):
        return None, _mask(mask, out_shape)
    if not isinstance(mask, MaskExpr):
        raise nki_error("err_unsupported_expression_in_mask")
    try:
        m = np.broadcast_to(mask.v, in_shape)
    except ValueError:
        return None, _mask(mask, out_shape)
    if m.all():
        return None, None
    done = np.logical_or.reduce(m, axis=tuple(axes), keepdims=True)
    if done.size == math.prod(out_shape):
        return m, done.reshape(out_shape)
    # an output of another shape than the reduced one (bn_stats: 6 values per partition)
    rows = np.logical_or.reduce(done.reshape(done.shape[0], -1), axis=1)
    return m, np.broadcast_to(rows.reshape((-1,) + (1,) * (len(out_shape) - 1)), out_shape)


def reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    out = tuple(s for i, s in enumerate(shape) if i not in axes)
    return out if len(out) >= 2 else (out[0], 1)   # a tile needs 2 dims: (P, 1)


def _last_axes_rule(run, t, axes, name):
    """nki 0.3+ (Rules.reduce_last_axes): axis "can only be the last contiguous dim(s) of the
    tile: [1], [1,2], [1,2,3], [1,2,3,4]" (the reductions' and softmax's 0.6.0 docstrings)."""
    nd = len(_tile_shape(t))
    if run.rules.reduce_last_axes and sorted(set(axes)) != list(range(nd - len(set(axes)), nd)):
        raise nki_error("nkisim_invalid_argument", api=f"nl.{name}",
                        why=f"axis {list(axes)} of a {nd}-D tile: the reduced axes must be the "
                            f"last contiguous free dimensions (e.g. {list(range(nd - 1, nd))} "
                            f"or {list(range(1, nd))}); permute the tile first")


def _reduce(name, x, axis, dtype, mask, keepdims):
    run = context.current()
    t = _tile(x, name, "x")
    axes = reduce_axes(t, axis, name)
    _last_axes_rule(run, t, axes, name)
    v = read(t, name, run).reshape(_tile_shape(t))
    if name not in ("all",):
        v = dtypes.to_f32(v)
    if name == "var" and run.rules.var_always_keepdims:
        keepdims = True     # nki 0.3+: "currently ignored; result always has keepdims=True shape"
    shape = reduced_shape(_tile_shape(t), axes, keepdims)
    reduction_taint(run, v.shape, axes, shape)
    in_mask, out_mask = reduce_masks(mask, v.shape, axes, shape)
    out = reduce_values(name, v, axes, keepdims, where=in_mask)
    out_dt = dtype or (np.dtype(np.float32) if name == "mean" and dtypes.is_int(t.dtype) and
                       not run.rules.mean_int_keeps_dtype   # Beta 1: fp32 for int inputs
                       else (np.dtype(np.bool_) if name == "all" else t.dtype))
    detail = _detail(t)
    detail["alu"] = name
    detail["in_free"] = _free(t)
    return result_tile(run, shape, out_dt, out.reshape(shape), "tensor_reduce", VECTOR, (t,),
                       detail, mask=out_mask)


def _make_reduce(name):
    def op(x, axis, *rest, dtype=None, mask=NO_MASK, keepdims=False, **kwargs):
        if rest:
            dtype, keepdims = positional_check(name, 2, rest, ("dtype", "keepdims"),
                                               (dtype, keepdims))
        mask = keywords_check(name, mask, kwargs, op) if mask is not NO_MASK or kwargs else None
        return _reduce(name, x, axis, dtype, mask, keepdims)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``{name}`` over free axes on VectorE (ref §1.8)."
    return into_target(op)


sum = _make_reduce("sum")  # noqa: A001
max = _make_reduce("max")  # noqa: A001
min = _make_reduce("min")  # noqa: A001
mean = _make_reduce("mean")
prod = _make_reduce("prod")
all = _make_reduce("all")  # noqa: A001
var = _make_reduce("var")


def where(condition, x, y, *rest, dtype=None, mask=NO_MASK, **kwargs):
    """Select ``x`` where ``condition`` else ``y`` (VectorE)."""
    if rest:
        dtype, = positional_check("where", 3, rest, ("dtype",), (dtype,))
    mask = keywords_check("where", mask, kwargs, where) if mask is not NO_MASK or kwargs else None
    run = context.current()
    c = _tile(condition, "where", "condition")
    cv = read(c, "where", run).reshape(_tile_shape(c)) != 0
    tiles = [c]
    parts = []
    for p, v in (("x", x), ("y", y)):
        if isinstance(v, Tensor):
            tiles.append(_tile(v, "where", p))
            parts.append(_tile_vals(v, "where", run))
        else:
            parts.append(v)
    try:
        out = np.where(cv, parts[0], parts[1])
    except ValueError:
        raise nki_error("nkisim_shape_mismatch", params="condition, x, y", api="where",
                        why="could not be broadcast together") from None
    dt = dtype or dtypes.promote(_operand_dtype(x), _operand_dtype(y))
    return result_tile(run, out.shape, dt, out, "select", VECTOR, tiles, _detail(*tiles),
                       mask=_mask(mask, out.shape))








def softmax(x, axis, *, dtype=None, mask=NO_MASK, **kwargs):
    mask = keywords_check("softmax", mask, kwargs, softmax) \
        if mask is not NO_MASK or kwargs else None
    run = context.current()
    t = _tile(x, "softmax", "x")
    axes = reduce_axes(t, axis, "softmax")
    _last_axes_rule(run, t, axes, "softmax")
    v = _tile_vals(t, "softmax", run)
    reduction_taint(run, v.shape, axes, v.shape)      # each value depends on its whole group
    m = _mask(mask, v.shape)
    if m is None:
        e = np.exp(v - v.max(axis=axes, keepdims=True))
        out = e / e.sum(axis=axes, keepdims=True)
    else:
        # a masked softmax normalizes over the masked-in elements, the only ones the
        # instruction processes (API masking: "only processes" the masked-in index region),
        # and writes only them (as nl.sum and nl.max under a mask)
        m = np.broadcast_to(m, v.shape)
        top = np.max(v, axis=axes, keepdims=True, where=m, initial=-np.inf)
        e = np.where(m, np.exp(v - np.where(np.isfinite(top), top, 0)), 0)
        out = e / e.sum(axis=axes, keepdims=True)
    return result_tile(run, v.shape, dtype or t.dtype, out, "activation", SCALAR, (t,),
                       _detail(t), mask=m)


def _unsupported(name):
    def fn(*args, **kwargs):
        raise nki_error("nkisim_unsupported", what=f"nl.{name}",
                        why="not part of the API surface nkisim simulates yet")
    fn.__name__ = name
    return fn


all_reduce = _unsupported("all_reduce")


# ---------------------------------------------------------------------------------------------
# constants, dtype info, random numbers, gathers (aws-neuron-sdk 1db4d74e
# nki/api/nki/language/__init__.py; each doc example's test is named below)

def finfo(dtype):
    """``nl.finfo(dtype)``: machine limits of a float dtype (``.min``, ``.max``, ``.eps``, ...).

    The Beta 1 docs list it without a docstring; nki-samples fc5c69f reference/vision.py fills a
    max-pool padding with ``nl.finfo(kernel_dtype).min`` (the most negative finite value), which is
    NumPy's / ml_dtypes' ``finfo`` meaning."""
    dt = dtypes.normalize(dtype)
    if dt == dtypes.TF32:
        dt = np.dtype(np.float32)
    if not dtypes.is_float(dt):
        raise nki_error("nkisim_invalid_argument", api="nl.finfo",
                        why=f"{dtypes.name(dt)} is not a float dtype")
    return ml_dtypes.finfo(dt)


def shared_constant(constant, dtype=None, **kwargs):
    """``nl.shared_constant(array, dtype=)``: an HBM tensor holding ``array`` cast to ``dtype``.

    A compile-time constant the kernel loads like an input (AWS nki/test/test_psum_modulo_alloc.py:
    ``identity = nl.shared_constant(np.identity(128, dtype=np.int8), dtype=nl.bfloat16)`` then
    ``nl.load(identity)``): read-only, no instruction to create it.

    ``constant`` may also be the path of a ``.npy`` file holding the array: AWS's nki-library
    (d2ad3a5, core/topk/rotational_topk.py) saves its rotation matrices with ``np.save`` and passes
    the file name to ``nl.shared_constant``."""
    if kwargs:
        ignored_keywords(shared_constant, kwargs)
    import os

    from .tensor import from_numpy
    context.current()
    if isinstance(constant, (str, os.PathLike)):
        try:
            constant = np.load(os.fspath(constant), allow_pickle=False)
        except (OSError, ValueError) as e:
            raise nki_error("nkisim_invalid_argument", api="shared_constant",
                            why=f"cannot read the constant file {os.fspath(constant)!r}: {e}") \
                from None
    arr = np.asarray(constant)
    dt = dtypes.normalize(dtype) if dtype is not None else arr.dtype
    vals = dtypes.cast(arr.astype(np.float32) if arr.dtype.kind in "iub" and
                       dtypes.is_float(dt) else arr, dt)
    return from_numpy(np.ascontiguousarray(vals), "shared_constant")


def shared_identity_matrix(n, dtype=np.uint8, **kwargs):
    """``nl.shared_identity_matrix(n, dtype)``: ``shared_constant(np.identity(n), dtype)``
    (its docstring: "the same behavior to nki.language.shared_constant")."""
    if kwargs:
        ignored_keywords(shared_identity_matrix, kwargs)
    return shared_constant(np.identity(int(n), dtype=np.int8), dtype=dtype)


def _rng(run) -> np.random.Generator:
    """The kernel's random number generator: seeded with 0 at kernel start (runs reproduce) and
    by ``nl.random_seed``."""
    if run.rng is None:
        run.rng = np.random.default_rng(0)
    return run.rng


def _seed_value(seed, api, run) -> int:
    if isinstance(seed, Tensor):
        v = read(seed, api, run)
        if v.size < 1:
            raise nki_error("nkisim_invalid_argument", api=api, why="the seed tile is empty")
        first = np.asarray(v).reshape(-1)[0]
        if dtypes.is_int(v.dtype):
            # "a [1,1] tensor ... with a 32-bit seed value" (0.6.0 stub): its bits, not
            # through fp32 (which keeps 24 bits: 2**24 and 2**24 + 1 were the same seed)
            return int(first) & 0xFFFFFFFF
        return int(np.float32(first)) & 0xFFFFFFFF
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed) & 0xFFFFFFFF
    raise nki_error("nkisim_invalid_argument", api=api,
                    why=f"seed must be a 32-bit int or a one-element tile, got {seed!r}")


def random_seed(seed, *, mask=None, **kwargs):
    """``nl.random_seed(seed)``: the same seed gives the same sequence of random numbers
    (docstring). The hardware generator is not documented, so nkisim's sequence is NumPy's
    PCG64 seeded with the value: reproducible, but not the device's bits."""
    if kwargs:
        ignored_keywords(random_seed, kwargs)
    run = context.current()
    reads = (region(seed),) if isinstance(seed, Tensor) else ()
    run.rng = np.random.default_rng(_seed_value(seed, "random_seed", run))
    run.record("random_seed", VECTOR, reads, (), "uint32", 1, 1, {"inputs": len(reads)})


def rand(shape, dtype=np.float32, *, buffer=None, name="", **kwargs):
    """``nl.rand(shape, dtype)``: a new SBUF tile of uniform random values in [0, 1) (docstring:
    "sampled from a uniform distribution between 0 and 1"). Recorded on VectorE, the engine of
    the hardware RNG's documented user ``nisa.dropout``."""
    if kwargs:
        ignored_keywords(rand, kwargs)
    run = context.current()
    shape = tuple(int(x) for x in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if len(shape) < 2:
        shape = (shape[0] if shape else 1, 1)
    if shape[0] > run.arch.pmax:
        raise nki_error("err_num_partition_exceed_arch_limit", n=shape[0], limit=run.arch.pmax)
    vals = _rng(run).random(shape, dtype=np.float32)
    return result_tile(run, shape, dtype, vals, "rand", VECTOR, (), {"inputs": 0},
                       buffer=buffer or sbuf, name=name or None)




def gather_flattened(data, indices, *, mask=None, dtype=None, **kwargs):
    """``nl.gather_flattened(data, indices)``: per partition, ``data`` flattened along its free
    dims, indexed by ``indices`` (docstring: ``np.take_along_axis(data.reshape(P, -1),
    indices.reshape(P, -1), axis=-1).reshape(indices.shape)``). Out-of-bound indices "return
    garbage values": nkisim returns NaN there (the poison value) so a result that uses them shows.
    """
    if kwargs:
        ignored_keywords(gather_flattened, kwargs)
    run = context.current()
    api = "gather_flattened"
    d = _tile(data, api, "data")
    ix = _tile(indices, api, "indices")
    if d.shape[0] != ix.shape[0]:
        raise nki_error("err_num_partition_mismatch",
                        params=f"data{shape_str(d.shape)}, indices{shape_str(ix.shape)}", api=api)
    if not dtypes.is_int(ix.dtype):
        raise nki_error("nkisim_operand_dtype", param="indices", api=api,
                        dtype=dtypes.name(ix.dtype), allowed="uint32 (integer indices)")
    dv = dtypes.to_f32(read(d, api, run)).reshape(d.shape[0], -1)
    iv = np.asarray(read(ix, api, run)).astype(np.int64).reshape(ix.shape[0], -1)
    bad = (iv < 0) | (iv >= dv.shape[1])
    out = np.take_along_axis(dv, np.clip(iv, 0, dv.shape[1] - 1), axis=-1)
    out = np.where(bad, np.float32(np.nan), out)
    shape = _tile_shape(ix)
    return result_tile(run, shape, dtype or d.dtype, out.reshape(shape), api, GPSIMD, (d, ix),
                       _detail(d, ix), mask=_mask(mask, shape))


tensor.register_ops(sys.modules[__name__])
