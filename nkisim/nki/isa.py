"""``nki.isa`` (nisa) of NKI 0.3-0.7: destination-passing engine instructions (spec
nki-current.md §2.4): every op writes ``dst`` (its first parameter) and returns nothing usable;
no ``dtype=``/``mask=``; the output dtype is ``dst.dtype``.

A thin face over the machine core (nkisim.engines): each op checks the current dialect's rules
(memory types, dtypes, shapes; spec §7), computes through the core instruction with
``dtype=dst.dtype`` and retargets it into ``dst`` (``tensor.assign(..., fresh=True)``), so the
trace holds exactly one instruction per call, writing ``dst``, as for Beta 1's
``dst[...] = nisa.op(...)``: the cost model, the checks and the timeline see the same thing.

Signatures are the "Current" column of spec §2.4 (STUB-R32 isa), positional and keyword: an
unknown keyword such as ``dtype=`` or ``mask=`` is Python's own ``TypeError: ... got an
unexpected keyword argument`` (RN 2.28: "unknown kwargs now raise unexpected keyword argument").
Where releases differ, the face follows ``NKISIM_NKI_VERSION`` (nkisim.nki._version).
"""

from __future__ import annotations

import enum
import functools
import operator

import numpy as np

from .. import accumulate as _accumulate
from .. import collectives as _collectives
from .. import context, dtypes, psum_init
from .. import dma_compute as _dma_compute
from .. import engines as _core
from .. import gather as _gather
from .. import ops as _ops
from .. import prng as _prng
from .. import registers as _registers
from .. import topk as _topk
from ..dstform import call_into
from ..errors import nki_error, shape_str
from ..memory import TOUCHED
from ..tensor import (
    PENDING,
    PendingMatmul,
    Tensor,
    _add_into,
    _masked_shadow_view,
    accumulator_garbage,
    assign,
    fit,
    inherit_taint,
    materialize_pending,
    pending_allocatable,
    record_pending,
    region,
    same_elements,
    taint_elements,
    values,
    write,
)
from . import _version
from ._version import at_least

# ---------------------------------------------------------------------------------------------
# errors


class NkiValidationError(Exception):
    """Raised when hardware constraints are violated (STUB-R29+ ``nki.isa.NkiValidationError``)."""


class _Violation(NkiValidationError, AssertionError):
    """A hardware-constraint violation. The simulator docs show these as ``AssertionError:
    tensor_tensor data1 partition dimension 256 exceeds maximum 128`` (SIM §What it checks) and
    the stubs name the class ``NkiValidationError``: both ``except`` clauses catch it, and a
    traceback names it so."""


_Violation.__name__ = _Violation.__qualname__ = "NkiValidationError"


def _invalid(msg: str) -> _Violation:
    exc = _Violation(msg)
    exc.nki_code = "nki_validation"
    return exc


# The core's errors that are hardware-constraint violations (shapes, partitions, dtypes, memory
# types, engine limits): raised through this face, they are NkiValidationErrors (and
# AssertionErrors, as the simulator shows them) while keeping their own class, code and message.
# The kernel checks (uninitialised reads, races, scopes) and nkisim's own limits are left alone.
_CONSTRAINT_CODES = frozenset({
    "err_activation_bias_invalid_type", "err_activation_scale_invalid_type",
    "err_activation_scale_scalar_or_vector", "err_exceed_max_supported_dimension",
    "err_num_partition_exceed_arch_limit", "err_num_partition_mismatch",
    "err_size_of_dimension_exceed_arch_limit", "err_unsupported_memory",
    "err_store_dst_shape_smaller_than_other_shape", "nkisim_matmul_stationary_limit",
    "nkisim_matmul_moving_limit", "nkisim_matmul_contraction_mismatch",
    "nkisim_matmul_crosses_psum_bank", "nkisim_operand_dtype",
    "nkisim_both_inputs_psum", "nkisim_shape_mismatch", "nkisim_invalid_argument"})
_AS_VALIDATION: dict = {}


def _as_validation(exc: Exception) -> Exception:
    cls = type(exc)
    new_cls = _AS_VALIDATION.get(cls)
    if new_cls is None:
        try:
            new_cls = type("NkiValidationError", (_Violation, cls), {"__module__": __name__})
        except TypeError:            # incompatible layouts: the plain validation error
            new_cls = _Violation
        _AS_VALIDATION[cls] = new_cls
    new = new_cls(*exc.args)
    if isinstance(new, SyntaxError):          # NKISyntaxError's message lives in .msg
        new.msg = getattr(exc, "msg", str(exc))
    new.nki_code = exc.nki_code
    return new


def _validated(fn):
    """Run a face op, turning the core's constraint errors into NkiValidationErrors."""
    @functools.wraps(fn)
    def op(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError, SyntaxError) as e:
            if getattr(e, "nki_code", None) not in _CONSTRAINT_CODES:
                raise
            raise _as_validation(e).with_traceback(e.__traceback__) from None
    return op


# ---------------------------------------------------------------------------------------------
# enums (spec §2.4: "Enums: engine{unknown,tensor,vector,scalar,gpsimd,dma,sync}, ..."). Plain
# Enums, not ints: from NKI 0.3.0 "integer enum values (for example dge_mode=2) are rejected"
# (MIG 0.2->0.3).


class engine(enum.Enum):
    unknown = "unknown"
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    dma = "dma"
    sync = "sync"


class reduce_cmd(enum.Enum):
    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"
    load_reduce = "load_reduce"


class dge_mode(enum.Enum):
    unknown = "unknown"
    swdge = "swdge"
    hwdge = "hwdge"
    none = "none"


class oob_mode(enum.Enum):
    error = "error"
    skip = "skip"


class matmul_perf_mode(enum.Enum):
    none = "none"
    double_row = "double_row"


def _generation(v):
    """The generation number ``v`` stands for (a member or a plain int), or None."""
    if isinstance(v, nc_version):
        return v.value
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    return None


class nc_version(enum.Enum):
    """Ordered by generation, against members and plain ints alike: nki-library compares them
    both ways (core/topk/rotational_topk_utils.py ``if nisa.get_nc_version() <=
    nisa.nc_version.gen2:``; experimental/collectives/fgcc.py ``if nisa.get_nc_version() >=
    3:`` and fg_allgather.py ``2 if nisa.get_nc_version() >= 3 else 4``, in kernels AWS's CI
    simulates). Equality stays the Enum's (no kernel compares a version to an int with ==)."""
    gen2 = 2
    gen3 = 3
    gen4 = 4

    def _cmp(self, other, op):
        g = _generation(other)
        return NotImplemented if g is None else op(self.value, g)

    def __lt__(self, other):
        return self._cmp(other, operator.lt)

    def __le__(self, other):
        return self._cmp(other, operator.le)

    def __gt__(self, other):
        return self._cmp(other, operator.gt)

    def __ge__(self, other):
        return self._cmp(other, operator.ge)


class dma_engine(enum.Enum):
    dma = "dma"
    gpsimd_dma = "gpsimd_dma"


# deprecated module-level aliases (STUB-R32 isa lines 11-24)
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


def get_nc_version() -> nc_version:
    """The NeuronCore version of the simulated target (NEURON_PLATFORM_TARGET_OVERRIDE /
    NKISIM_TARGET): gen2 (trn1) or gen3 (trn2)."""
    run = context.maybe_current()
    if run is not None:
        return nc_version(run.arch.nc_version)
    from ..arch import get_arch
    return nc_version(get_arch().nc_version)


def get_nc_sub_version() -> int:
    """The silicon revision within the target's ``nc_version`` (new in the 0.5.0 stubs): "0 —
    first revision (default)", "1 — second revision". No revision of trn1 or trn2 is documented
    beyond the first, so 0 on both simulated targets."""
    return 0


class NkiInstruction:
    """What an ISA call returns (STUB-R32 isa ``class NkiInstruction``): an opaque handle, not a
    tile. ``depends_on`` adds a scheduling edge on the device; nkisim runs calls in program
    order, so it only records it."""

    __slots__ = ("instr", "name", "deps")

    def __init__(self, instr, name=None):
        self.instr = instr
        self.name = name
        self.deps = ()

    def depends_on(self, *others):
        self.deps = self.deps + tuple(others)
        return self

    def __repr__(self):
        op = getattr(self.instr, "op", "?")
        return f"<NkiInstruction {op}{' ' + repr(self.name) if self.name else ''}>"


# ---------------------------------------------------------------------------------------------
# helpers


# An integer dge_mode is a documented rule the device tolerates, not an error: AWS's nki-library
# (d2ad3a5, core/subkernels/norm_tkg_utils.py `_DGE_MODE_NONE = 3`, used by rmsnorm_tkg and
# layernorm_tkg, whose simulation tests are AWS's CI) passes dge_mode=3 to nisa.dma_copy, and 3 is
# `none` in the documented order {unknown, swdge, hwdge, none} (spec nki-current §2.4). Other
# enums have no such evidence and keep the documented rejection.
_INT_TOLERATED = {"dge_mode": ("unknown", "swdge", "hwdge", "none")}
# Likewise a perf_mode string naming a member: AWS's nki-library (d2ad3a5, core/qkv/qkv_cte.py,
# static-quantization fp8 path, simulated by AWS's attention_block_tkg model tests) passes
# nc_matmul(perf_mode="double_row").
_STR_TOLERATED = {"matmul_perf_mode"}


def _enum(cls, value, api, param):
    if isinstance(value, cls):
        return value
    member = kind = None
    order = _INT_TOLERATED.get(cls.__name__)
    if order and isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
            and 0 <= int(value) < len(order):
        member, kind, value = cls[order[int(value)]], "an integer", int(value)
    elif cls.__name__ in _STR_TOLERATED and isinstance(value, str) and value in cls.__members__:
        member, kind = cls[value], "a string"
    if member is None:
        raise TypeError(f"{api}() {param} must be a nki.isa.{cls.__name__} member, got "
                        f"{value!r} (integer enum values and strings are rejected from NKI 0.3.0)")
    context.current().rule(
        (f"{kind}_enum", cls.__name__), f"{api}() {param}={value!r} is {kind}, read as "
        f"nki.isa.{cls.__name__}.{member.name}",
        "Integer enum values (for example dge_mode=2) and strings ... are rejected",
        "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.32.0/nki/migration/index.html")
    return member


def _core_engine(value, api, allowed=("vector", "scalar", "gpsimd")):
    """The core's engine for ``engine=``; unknown lets the core pick."""
    e = _enum(engine, value, api, "engine")
    if e is engine.unknown:
        return _core.engine.unknown
    if e.name not in allowed:
        raise _invalid(f"{api} engine {e.name} is not supported; use one of "
                       f"{', '.join(allowed)}")
    return getattr(_core.engine, e.name)


def _tensor(t, api, param):
    if not isinstance(t, Tensor):
        raise TypeError(f"{api}() {param} must be an NKI tensor, got {type(t).__name__}")
    return t


def _onchip(t, api, param, buffers=("sbuf", "psum")):
    """An SBUF/PSUM operand: at most pmax partitions (RN 2.32: "a clear verification error when
    an SBUF or PSUM operand exceeds the 128-partition hardware limit"), in ``buffers``."""
    _tensor(t, api, param)
    buf = t.root.buffer
    if buf not in buffers:
        raise _invalid(f"{api} {param} must be in {' or '.join(b.upper() for b in buffers)}, "
                       f"got {buf.upper()} tensor '{t.name}'")
    run = context.current()
    if t.shape and t.shape[0] > run.arch.pmax:
        raise _invalid(f"{api} {param} partition dimension {t.shape[0]} exceeds maximum "
                       f"{run.arch.pmax}")
    return t


def _no_gpsimd_psum(api, eng, **tiles):
    """"GpSimd cannot access PSUM" (STUB-R32 tensor_copy / tensor_tensor; spec §7)."""
    if eng == _core.engine.gpsimd:
        for param, t in tiles.items():
            if isinstance(t, Tensor) and t.root.buffer == "psum":
                raise _invalid(f"{api} on the GpSimd engine cannot access PSUM ({param} "
                               f"'{t.name}')")


def _same_elements(dst, res, api):
    """``dst`` receives the instruction's result: same partitions, same elements per
    partition (the ISA writes its output access pattern; no broadcast)."""
    ds, rs = dst.shape, res.shape
    if not same_elements(ds, rs):
        raise _invalid(f"{api} dst shape {shape_str(ds)} does not match the result shape "
                       f"{shape_str(rs)}")


def _into(dst, res, api, name):
    """Retarget the instruction that produced the fresh tile ``res`` so it writes ``dst``
    (one instruction in the trace, its written region ``dst``)."""
    _same_elements(dst, res, api)
    instr = res._producer
    extra = tuple(instr.writes[1:])          # reduce_res, dst_idx: written as well
    assign(dst, res, fresh=True)
    if extra:
        instr.writes = tuple(instr.writes) + extra
    return _handle(instr, name)


def _direct(dst, api, name, core, *args, **kwargs):
    """``core(*args, **kwargs)`` (an engine op of nkisim.engines that returns what
    ``ops.result_tile`` makes, untouched) with its result written straight into ``dst``
    (``tensor.write_into``: no result tile, issue 12), or through ``_into`` when the result
    cannot go there directly (the literal path decides: same trace, same errors)."""
    res, instr = call_into(context.current(), dst, core, args, kwargs)
    if res is dst:
        return _handle(instr, name)
    return _into(dst, res, api, name)


def _handle(instr, name):
    if name is not None:
        instr.detail["name"] = name
    return NkiInstruction(instr, name)


def _last(name):
    run = context.current()
    return _handle(run.trace.instrs[-1], name)


def _tok(op):
    """An op token (``nl.add``, ``nl.maximum``, ``nl.exp``, NumPy ufuncs) as the core knows it:
    the core's own function, or the core function of the same name when the language face
    defines its own token objects."""
    if op is None or isinstance(op, str):
        return op
    try:
        if op in _core._ALU or op in _core._ACT:
            return op
    except TypeError:
        return op
    core = getattr(_ops, getattr(op, "__name__", ""), None)
    return core if callable(core) else op


_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.32.0/nki/api/generated/"


def _dtype_rule(api, param, t, allowed, text):
    """``t.dtype`` must be one of ``allowed`` (the docstring's rule, quoted in ``text``)."""
    if isinstance(t, Tensor) and t.dtype not in allowed:
        raise _invalid(f"{api} {param} dtype {dtypes.name(t.dtype)} is not allowed: {text}")


_U_PRED = {np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.bool_)}
_SELECT_PRED = {np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16),
                np.dtype(np.bool_)}
_FP8 = {dtypes.float8_e4m3, dtypes.float8_e5m2}
_F32ISH = {np.dtype(np.float32), dtypes.TF32}


def _unary_operand(op0, operand0, api):
    """operand0 of a unary op0: "Must be None or 0 when op0 is a unary operator (e.g.,
    nl.abs)" (STUB-R32 tensor_scalar, tensor_scalar_reduce); the core takes the 0."""
    name = _core._alu_name(_tok(op0), api)
    if name in _ops._UNARY_ALU_FN or name == "invert":
        if operand0 is None:
            return 0
        if isinstance(operand0, Tensor) or operand0 != 0:
            raise _invalid(f"{api} operand0 must be None or 0 when op0 is the unary {name} "
                           f"(\"Must be None or 0 when op0 is a unary operator\"), got "
                           f"{'a tile' if isinstance(operand0, Tensor) else repr(operand0)}")
    return operand0


def _fp32_operand(op, api, param):
    """tensor_scalar's (P, 1) tile operands "must be fp32" (STUB-R32 tensor_scalar). Only
    tensor_scalar documents it: scalar_tensor_tensor and tensor_scalar_reduce are not held to
    it (nki-library passes them operand0 tiles of the weights' scale dtype)."""
    if isinstance(op, Tensor) and op.dtype != np.dtype(np.float32):
        raise _invalid(f"{api} {param} must be float32 when it is a tile, got "
                       f"{dtypes.name(op.dtype)}")


# ---------------------------------------------------------------------------------------------
# data movement


def _priority(priority, api) -> None:
    """A DMA "quality-of-service priority level 0-3 where lower is higher priority" (0.6.0
    stub): a scheduling hint nkisim does not model, but a value outside 0-3 is no level."""
    if priority is not None and (isinstance(priority, bool) or
                                 not isinstance(priority, (int, np.integer)) or
                                 not 0 <= int(priority) <= 3):
        raise _invalid(f"{api} priority must be a level 0-3 (\"priority level 0-3 where lower "
                       f"is higher priority\"), got {priority!r}")


@_validated
def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown,
             engine=engine.unknown, name=None):
    """``dst = src`` on a DMA queue; HBM or SBUF on each side, never PSUM (MIG 0.2->0.3:
    "nisa.dma_copy - reading from PSUM" removed); dtype conversion through fp32, except that
    ``dge_mode=hwdge`` needs identical dtypes from 0.3.0. ``priority`` is new in 0.4.0."""
    api = "dma_copy"
    if priority is not None and not at_least("0.4"):
        raise TypeError(f"{api}() got an unexpected keyword argument 'priority'")
    _priority(priority, api)
    om = _enum(globals()["oob_mode"], oob_mode, api, "oob_mode")
    dm = _enum(globals()["dge_mode"], dge_mode, api, "dge_mode")
    e = _enum(globals()["engine"], engine, api, "engine")
    # "engine: the engine to use for HWDGE descriptor generation: nki.isa.engine.sync or
    # nki.isa.engine.scalar. Only valid when dge_mode=nisa.dge_mode.hwdge"
    if e is not globals()["engine"].unknown:
        if e.name not in ("sync", "scalar"):
            raise _invalid(f"{api} engine {e.name} is not supported; use sync or scalar (with "
                           "dge_mode=hwdge)")
        if dm is not globals()["dge_mode"].hwdge:
            raise _invalid(f"{api} engine={e.name} is only valid when dge_mode=hwdge, got "
                           f"dge_mode={dm.name}")
    for param, t in (("dst", dst), ("src", src)):
        _tensor(t, api, param)
        if t.root.buffer == "psum":
            raise _invalid(f"{api} {param} cannot be in PSUM (tensor '{t.name}'); copy PSUM to "
                           "SBUF with nisa.tensor_copy first")
    if dm is globals()["dge_mode"].hwdge and dst.dtype != src.dtype:
        raise _invalid(f"{api} with dge_mode=hwdge needs identical dtypes, got dst "
                       f"{dtypes.name(dst.dtype)} and src {dtypes.name(src.dtype)}")
    _core.dma_copy(dst=dst, src=src, oob_mode=getattr(_core.oob_mode, om.name),
                   dge_mode=getattr(_core.dge_mode, dm.name))
    return _last(name)


@_validated
def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown,
                  oob_mode=oob_mode.error, name=None):
    """Transpose ``src`` (HBM or SBUF) into ``dst`` on the DMA engines. From 0.4.0 ``dst`` must
    have exactly the transposed rank and shape (RN 2.30); 0.6.0 relaxed it (RN 2.32, details
    undocumented: nkisim then asks for the same partitions and element count). ``priority``
    (the 0.6.0 signature's fourth parameter) is a "DMA quality-of-service priority level 0-3
    where lower is higher priority (NeuronCore-v4+ only)": a scheduling hint with no effect on
    values, accepted and ignored (nkisim models no DMA queue priorities)."""
    api = "dma_transpose"
    _priority(priority, api)
    dm = _enum(globals()["dge_mode"], dge_mode, api, "dge_mode")
    _enum(globals()["oob_mode"], oob_mode, api, "oob_mode")
    _tensor(dst, api, "dst")
    _tensor(src, api, "src")
    if dst.root.buffer != "sbuf":
        raise _invalid(f"{api} dst must be in SBUF, got {dst.root.buffer.upper()} tensor "
                       f"'{dst.name}' (\"dst: the destination of transpose, must be a tile in "
                       "SBUF\")")
    if src.dtype != dst.dtype:
        raise _invalid(f"{api} src dtype {dtypes.name(src.dtype)} differs from dst "
                       f"{dtypes.name(dst.dtype)} (\"src.dtype == dst.dtype\")")
    if dm is globals()["dge_mode"].hwdge:
        # "If hwdge, this instruction will be lowered to a Hardware DGE transpose"
        nd, s0 = len(src.shape), src.shape[0]
        why = None
        if nd == 2 and s0 != 16:
            why = f"for 2-d input tiles, src.shape[0] == 16 (got {s0})"
        elif nd in (3, 4) and (s0 not in (1, 2, 4, 8, 16) or (s0 * src.shape[-2]) % 16):
            why = ("for 3-d/4-d input tiles, src.shape[0] must be in {1, 2, 4, 8, 16} and "
                   f"(src.shape[0] * src.shape[-2]) % 16 == 0 (got {list(src.shape)})")
        elif src.shape[-1] > 128:
            why = f"src.shape[-1] <= 128 (got {src.shape[-1]})"
        elif dtypes.itemsize(src.dtype) != 2:
            why = f"src.dtype is 2 bytes (got {dtypes.name(src.dtype)})"
        if why:
            raise _invalid(f"{api} with dge_mode=hwdge needs {why}")
    elif dm is globals()["dge_mode"].swdge and src._idx is None:
        # swdge only for an indirect (.ap(vector_offset=...)) source: "DMA Direct Transpose
        # Constraints: The only valid dge_modes are unknown and hwdge" (STUB-R32); AWS's
        # swdge transposes (nki-library attention_tkg) are indirect
        raise _invalid(f"{api} of a direct (not indirect) src takes dge_mode unknown or hwdge, "
                       "got swdge (\"The only valid dge_mode s are unknown and hwdge\"; swdge "
                       "is for an indirect src, .ap(vector_offset=...))")
    elif dm is globals()["dge_mode"].none:
        # "The only valid dge_modes are unknown and hwdge" (direct) / "unknown and swdge"
        # (indirect); AWS's nki-library mlp_tkg_gate_up_projection (CI-tested) passes
        # dge_mode=_DGE_MODE_NONE (3) to dma_transpose: a tolerated rule
        context.current().rule(
            ("dma_transpose_dge_none",), f"{api}() dge_mode=none",
            "The only valid dge_mode s are unknown and hwdge", _DOCS + "nki.isa.dma_transpose.html")
    res = _core.dma_transpose(_tensor(src, api, "src"), axes=axes, dtype=dst.dtype)
    if not at_least("0.6") and tuple(dst.shape) != tuple(res.shape):
        raise _invalid(f"{api} dst shape {shape_str(dst.shape)} must be the transposed shape "
                       f"{shape_str(res.shape)}")
    return _into(dst, res, api, name)


@_validated
def tensor_copy(dst, src, engine=engine.unknown, name=None):
    """``dst = src`` cast to ``dst.dtype`` on the Vector, Scalar or GpSimd engine: the PSUM ->
    SBUF eviction. GpSimd cannot touch PSUM; "no Scalar-Engine tensor_copy on v2" (STUB-R32)."""
    api = "tensor_copy"
    eng = _core_engine(engine, api)
    _onchip(dst, api, "dst")
    _onchip(src, api, "src")
    _no_gpsimd_psum(api, eng, dst=dst, src=src)
    if eng == _core.engine.scalar and context.current().arch.nc_version < 3:
        raise _invalid(f"{api} on the Scalar engine is not available on gen2; use "
                       "nisa.activation(op=nl.copy)")
    return _direct(dst, api, name, _core.tensor_copy, src, dtype=dst.dtype, engine=eng)


# ---------------------------------------------------------------------------------------------
# element-wise


@_validated
def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """``dst = data1 <op> data2``: same partitions and elements per partition, no implicit
    broadcast ("use tensor_scalar"); ``data1`` and ``data2`` cannot both be in PSUM."""
    api = "tensor_tensor"
    # "engine: nki.isa.engine.vector, nki.isa.engine.gpsimd or nki.isa.engine.unknown"
    eng = _core_engine(engine, api, ("vector", "gpsimd"))
    _onchip(dst, api, "dst")
    _onchip(data1, api, "data1")
    _onchip(data2, api, "data2")
    if eng == _core.engine.unknown:
        # "nl.power runs on GpSimd (no PSUM)"; "When all input/output tiles are int32 or
        # uint32, the operation defaults to GpSimd Engine, which uses native integer
        # arithmetic", falling "back to Vector Engine when any operand resides in PSUM"
        # (STUB-R32 tensor_tensor): the engine, hence the no-PSUM rule (the core computes
        # the integers exactly there: engines._int_exact)
        ints = {np.dtype(np.int32), np.dtype(np.uint32)}
        if _core._alu_name(_tok(op), api) == "power" or (
                {data1.dtype, data2.dtype, dst.dtype} <= ints and "psum" not in
                (dst.root.buffer, data1.root.buffer, data2.root.buffer)):
            eng = _core.engine.gpsimd
    _no_gpsimd_psum(api, eng, dst=dst, data1=data1, data2=data2)
    if data1.root.buffer == "psum" and data2.root.buffer == "psum":
        raise _invalid(f"{api} data1 and data2 cannot both be in PSUM")
    if _core._alu_name(_tok(op), api) in _core._BITVEC:
        # "For bitvec operators, the input/output data types must be integer types"
        for param, t in (("data1", data1), ("data2", data2), ("dst", dst)):
            if not dtypes.is_int(t.dtype):
                raise _invalid(f"{api} with a bitvec operator needs integer tiles: {param} is "
                               f"{dtypes.name(t.dtype)} (\"For bitvec operators, the "
                               "input/output data types must be integer types\")")
    if data1.shape[0] != data2.shape[0] or data1.size != data2.size:
        raise _invalid(f"{api} data1 {shape_str(data1.shape)} and data2 "
                       f"{shape_str(data2.shape)} must have the same partitions and elements "
                       "per partition (no broadcast: use tensor_scalar)")
    return _direct(dst, api, name, _core.tensor_tensor, data1, data2, _tok(op), dtype=dst.dtype,
                   engine=eng)


@_validated
def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None,
                  reverse1=False, engine=engine.unknown, name=None):
    """``dst = (data <op0> operand0) <op1> operand1``; each operand a scalar or a (P, 1) fp32
    tile broadcast along the free dims; ``data`` in SBUF or PSUM (STUB-R32 tensor_scalar)."""
    api = "tensor_scalar"
    eng = _core_engine(engine, api)
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    # "arithmetic operators ... the operand0 and operand1 (if used) must be float32"; bitvec
    # operators treat everything as bit patterns (STUB-R32 tensor_scalar)
    bitvec = _core._alu_name(_tok(op0), api) in _core._BITVEC
    for param, o in (("operand0", operand0), ("operand1", operand1)):
        if isinstance(o, Tensor):
            _onchip(o, api, param)
        if not bitvec:
            _fp32_operand(o, api, param)
    _no_gpsimd_psum(api, eng, dst=dst, data=data, operand0=operand0, operand1=operand1)
    if eng == _core.engine.scalar and context.current().arch.nc_version == 3:
        # "On trn2 the Scalar Engine only accepts (mul, add), (mul, None) and (add, None)"
        # (STUB-R32 tensor_scalar; spec §2.4)
        pair = (_core._alu_name(_tok(op0), api),
                None if op1 is None else _core._alu_name(_tok(op1), api))
        if pair not in (("multiply", "add"), ("multiply", None), ("add", None)):
            raise _invalid(f"{api} on the Scalar engine of gen3 supports (multiply, add), "
                           f"(multiply, None) and (add, None) as (op0, op1), got {pair}")
    return _direct(dst, api, name, _core.tensor_scalar, data, _tok(op0),
                   _unary_operand(op0, operand0, api), reverse0, _tok(op1), operand1, reverse1,
                   dtype=dst.dtype, engine=eng)


@_validated
def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False,
                         reverse1=False, name=None, *, engine=engine.unknown):
    """``dst = (data <op0> operand0) <op1> operand1``, operand0 a scalar or (P, 1) tile,
    operand1 a tile like ``data``. The 0.6.0 signature ends ``reverse1=False, name=None`` and
    has no ``engine`` ("using Vector Engine"): nkisim keeps ``engine=`` as a keyword only, so a
    positional ``name`` binds to ``name``."""
    api = "scalar_tensor_tensor"
    eng = _core_engine(engine, api)
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    _onchip(operand1, api, "operand1")
    _no_gpsimd_psum(api, eng, dst=dst, data=data, operand0=operand0, operand1=operand1)
    if data.root.buffer == "psum" and operand1.root.buffer == "psum":
        raise _invalid(f"{api} data and operand1 cannot both be in PSUM")
    if operand1.shape[0] != data.shape[0] or operand1.size != data.size:
        raise _invalid(f"{api} operand1 {shape_str(operand1.shape)} must have the shape of data "
                       f"{shape_str(data.shape)} (\"The operand1 tile must have the same shape "
                       "as data for element-wise operation\")")
    for param, op in (("op0", op0), ("op1", op1)):
        if _core._alu_name(_tok(op), api) in _core._BITVEC:
            raise _invalid(f"{api} {param} must be an arithmetic operator (\"Bitvec operators "
                           "are not supported\")")
    return _direct(dst, api, name, _core.scalar_tensor_tensor, data=data, op0=_tok(op0),
                   operand0=operand0, op1=_tok(op1), operand1=operand1, reverse0=reverse0,
                   reverse1=reverse1, dtype=dst.dtype, engine=eng)


@_validated
def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False,
                       name=None):
    """``dst[:, i] = (data0[:, i] <op0> dst[:, i-1]) <op1> data1[:, i]`` along the free axis,
    starting from ``initial``."""
    api = "tensor_tensor_scan"
    _onchip(dst, api, "dst")
    _onchip(data0, api, "data0")
    _onchip(data1, api, "data1")
    if data0.root.buffer == "psum" and data1.root.buffer == "psum":
        raise _invalid(f"{api} data0 and data1 cannot both be in PSUM (\"The two input tiles, "
                       "data0 and data1 cannot both reside in PSUM\")")
    res = _core.tensor_tensor_scan(data0, data1, initial, _tok(op0), _tok(op1), reverse0, reverse1,
                                   dtype=dst.dtype)
    return _into(dst, res, api, name)


@_validated
def reciprocal(dst, data, name=None, *, engine=engine.unknown):
    """``dst = 1 / data``. The 0.6.0 signature is ``reciprocal(dst, data, name=None)``: nkisim
    keeps ``engine=`` as a keyword only, so a positional ``name`` binds to ``name``."""
    api = "reciprocal"
    eng = _core_engine(engine, api)
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    _no_gpsimd_psum(api, eng, dst=dst, data=data)
    return _direct(dst, api, name, _core.reciprocal, data, dtype=dst.dtype, engine=eng)


@_validated
def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, name=None):
    """``dst = op(data * scale + bias)`` in fp32 on the Scalar Engine; ``scale`` a scalar or a
    (P, 1) fp32 tile, ``bias`` a (P, 1) tile ("2.28 added a check that the bias free dim is
    1"). ``reduce_cmd`` drives the Scalar Engine's ``reduce_regs`` (reset, reduce,
    reset_reduce; idle leaves them) with the sum along the free dims (``reduce_op`` nl.add),
    and ``reduce_res`` reads them out (nkisim.engines._activation_regs): with the default idle,
    ``reduce_res`` receives what earlier instructions left there, as the docs' pseudocode says."""
    api = "activation"
    rc = _enum(globals()["reduce_cmd"], reduce_cmd, api, "reduce_cmd")
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    for param, t in (("bias", bias), ("scale", scale), ("reduce_res", reduce_res)):
        if isinstance(t, Tensor):
            _onchip(t, api, param)
    if rc is globals()["reduce_cmd"].load_reduce:
        # the docs define reset, idle, reduce and reset_reduce for activation (its pseudocode:
        # nkisim.engines._activation_regs); load_reduce has no value to load here
        raise nki_error("nkisim_unsupported", what=f"{api} reduce_cmd=load_reduce",
                        why="activation's docs define reset, idle, reduce and reset_reduce")
    cmd = getattr(_core.reduce_cmd, rc.name)
    if reduce_res is None:        # (with reduce_res, dst is written after it, as before)
        return _direct(dst, api, name, _core.activation, _tok(op), data, bias=bias, scale=scale,
                       reduce_op=_tok(reduce_op), reduce_cmd=cmd, dtype=dst.dtype)
    res = _core.activation(_tok(op), data, bias=bias, scale=scale, reduce_op=_tok(reduce_op),
                           reduce_res=reduce_res, reduce_cmd=cmd, dtype=dst.dtype)
    return _into(dst, res, api, name)


@_validated
def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation`` that also reduces its result along the free dims into ``reduce_res``:
    "equivalent to calling nisa.activation with reduce_cmd=nisa.reduce_cmd.reset_reduce and
    passing in reduce_res" (STUB-R32 activation_reduce)."""
    return activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op,
                      reduce_res=reduce_res, reduce_cmd=reduce_cmd.reset_reduce, name=name)


# ---------------------------------------------------------------------------------------------
# reductions


@_validated
def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce free axes of ``data`` with ``op`` into ``dst``. The axes must be the last
    contiguous free dims ending at the final dim (``(3,)``, ``(2, 3)``, ``(1, 2, 3)`` for 4-D;
    STUB-R32 tensor_reduce): permute with ``.ap()`` first for any other set."""
    api = "tensor_reduce"
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    nd = max(2, len(data.shape))
    if isinstance(axis, (int, np.integer)):
        axes = (int(axis),)
    elif isinstance(axis, (tuple, list)) and axis:
        axes = tuple(int(a) for a in axis)
    else:
        raise _invalid(f"{api} axis must be an int or a non-empty tuple of ints, got {axis!r}")
    norm = sorted(a + nd if a < 0 else a for a in axes)
    if norm != list(range(nd - len(norm), nd)) or norm[0] < 1:
        raise _invalid(f"{api} axis {tuple(axes)} must be the last contiguous free dimensions "
                       f"of the {nd}-D data (e.g. ({nd - 1},) or {tuple(range(1, nd))})")
    return _direct(dst, api, name, _core.tensor_reduce, _tok(op), data, tuple(norm),
                   negate=negate, keepdims=keepdims, dtype=dst.dtype)


@_validated
def tensor_partition_reduce(dst, op, data, name=None):
    """Reduce across the partitions of ``data`` (GpSimd): ``dst`` is (1, free...)."""
    api = "tensor_partition_reduce"
    _onchip(dst, api, "dst", ("sbuf",))
    _onchip(data, api, "data", ("sbuf",))
    res = _core.tensor_partition_reduce(_tok(op), data, dtype=dst.dtype)
    return _into(dst, res, api, name)


@_validated
def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None,
                         reduce_res_negate=False, name=None):
    """``dst = data <op0> operand0`` and its reduction over the free dims through the Vector
    Engine accumulators (``reduce_cmd`` reset_reduce, reduce or load_reduce from
    ``reduce_init``) into ``reduce_res`` (P, 1), negated with ``reduce_res_negate`` (the 0.6.0
    signature; nkisim.engines.tensor_scalar_reduce). ``reduce_res`` is optional from 0.6.0
    (RN 2.32), required before. The release that added reduce_cmd, reduce_init and
    reduce_res_negate is not documented: nkisim accepts them in every release it serves."""
    api = "tensor_scalar_reduce"
    cmd = _cmd(reduce_cmd, api)
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    if reduce_res is None:
        if not at_least("0.6"):
            raise TypeError(f"{api}() missing 1 required argument: 'reduce_res'")
    else:
        _onchip(reduce_res, api, "reduce_res")
    _onchip_operands(api, reduce_init=reduce_init)
    res = _core.tensor_scalar_reduce(data=data, op0=_tok(op0),
                                     operand0=_unary_operand(op0, operand0, api),
                                     reduce_op=_tok(reduce_op), reduce_res=reduce_res,
                                     reverse0=reverse0, dtype=dst.dtype, reduce_cmd=cmd,
                                     reduce_init=reduce_init,
                                     reduce_res_negate=bool(reduce_res_negate))
    return _into(dst, res, api, name)


@_validated
def max8(dst, src, name=None):
    """The 8 largest values of each partition of ``src``, descending, into ``dst`` (P, 8)."""
    api = "max8"
    _onchip(dst, api, "dst")
    _onchip(src, api, "src")
    return _into(dst, _core.max8(src=src, dtype=dst.dtype), api, name)


@_validated
def nc_find_index8(dst, data, vals, name=None):
    """Index of the first occurrence of each of the 8 ``vals`` in each partition of ``data``;
    ``dst`` uint16 or uint32."""
    api = "nc_find_index8"
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    _onchip(vals, api, "vals")
    return _into(dst, _core.nc_find_index8(data=data, vals=vals, dtype=dst.dtype), api, name)


@_validated
def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """``dst`` = ``data`` with the first occurrence of each of the 8 ``vals`` replaced by
    ``imm``; the indices of the matches into ``dst_idx``."""
    api = "nc_match_replace8"
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    _onchip(vals, api, "vals")
    if dst_idx is not None:
        _onchip(dst_idx, api, "dst_idx")
    res = _core.nc_match_replace8(data=data, vals=vals, imm=imm, dst_idx=dst_idx,
                                  dtype=dst.dtype)
    return _into(dst, res, api, name)


def _core_reduce_cmd(value, api):
    rc = _enum(reduce_cmd, value, api, "reduce_cmd")
    if rc is reduce_cmd.load_reduce:
        raise nki_error("nkisim_unsupported", what=f"{api} reduce_cmd=load_reduce",
                        why="loading the accumulator registers is not simulated")
    return getattr(_core.reduce_cmd, rc.name)


@_validated
def select_reduce(dst, predicate, on_true, on_false, reduce_res=None,
                  reduce_cmd=reduce_cmd.idle, reduce_op=_ops.maximum, reverse_pred=False,
                  name=None):
    """``dst = where(predicate, on_true, on_false)`` with an optional max reduction per
    partition into ``reduce_res`` through the Vector Engine accumulators."""
    api = "select_reduce"
    for param, t in (("dst", dst), ("predicate", predicate), ("on_true", on_true)):
        _onchip(t, api, param)
    _dtype_rule(api, "on_true", on_true, dtypes.SUPPORTED - {dtypes.TF32, np.dtype(np.int32),
                                                             np.dtype(np.uint32)},
                "\"on_true can be any supported dtype except tfloat32, int32, uint32\"")
    _dtype_rule(api, "predicate", predicate, _SELECT_PRED, "\"predicate dtype can be any "
                "supported integer type int8, uint8, int16, uint16\"")
    if isinstance(reduce_res, Tensor) and not dtypes.is_float(reduce_res.dtype):
        raise _invalid(f"{api} reduce_res dtype {dtypes.name(reduce_res.dtype)} is not allowed: "
                       "\"reduce_res dtype must of float type\"")
    _core.select_reduce(dst=dst, predicate=predicate, on_true=on_true, on_false=on_false,
                        reduce_res=reduce_res, reduce_cmd=_core_reduce_cmd(reduce_cmd, api),
                        reduce_op=_tok(reduce_op), reverse_pred=reverse_pred)
    return _last(name)


@_validated
def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1,
                 reduce_cmd=reduce_cmd.idle, reduce_res=None, reduce_op=_ops.maximum,
                 range_start=0, on_false_value=_ops.fp32.min, name=None):
    """Keep the elements whose free index + ``range_start`` satisfies both comparisons, others
    become ``on_false_value``; max-reduce per partition (NeuronCore-v3+)."""
    api = "range_select"
    _onchip(dst, api, "dst")
    _onchip(on_true_tile, api, "on_true_tile")
    if not dtypes.is_float(on_true_tile.dtype):
        raise _invalid(f"{api} on_true_tile dtype {dtypes.name(on_true_tile.dtype)} is not "
                       "allowed: \"on_true_tile must be one of the FP dtypes\"")
    for param, b in (("bound0", bound0), ("bound1", bound1)):
        if isinstance(b, Tensor) and b.dtype != np.dtype(np.float32):
            raise _invalid(f"{api} {param} dtype {dtypes.name(b.dtype)} is not allowed: "
                           "\"bound0/bound1 must be FP32 types\"")
    if isinstance(on_false_value, Tensor) or np.float32(on_false_value) != _ops.fp32.min:
        raise _invalid(f"{api} on_false_value must be FP32_MIN (-3.4028235e+38), got "
                       f"{on_false_value!r} (\"Due to hardware constraints, this must be "
                       "FP32_MIN\")")
    res = _core.range_select(on_true_tile=on_true_tile, comp_op0=_tok(comp_op0),
                             comp_op1=_tok(comp_op1),
                             bound0=bound0, bound1=bound1,
                             reduce_cmd=_core_reduce_cmd(reduce_cmd, api),
                             reduce_res=reduce_res, reduce_op=_tok(reduce_op),
                             range_start=range_start, on_false_value=on_false_value,
                             dtype=dst.dtype)
    return _into(dst, res, api, name)


# ---------------------------------------------------------------------------------------------
# constants and selection


@_validated
def memset(dst, value, engine=engine.unknown, name=None):
    """Fill ``dst`` with ``value`` (Vector or GpSimd). From 0.3.0 "the value's type must match
    dst.dtype" (MIG 0.2->0.3: ``2`` not ``2.0`` for int32). nkisim rejects a non-integral float
    value for an integer dtype and tolerates an integral one with a rule warning; an int value
    for a float dtype is accepted (AWS's nki-library, CI-tested, memsets float tiles with
    ``value=0``)."""
    api = "memset"
    eng = _core_engine(engine, api, ("vector", "gpsimd"))
    _onchip(dst, api, "dst")
    _no_gpsimd_psum(api, eng, dst=dst)
    if isinstance(value, Tensor) or not isinstance(value, (int, float, np.integer,
                                                           np.floating)):
        raise TypeError(f"{api}() value must be a Python or NumPy number, got "
                        f"{type(value).__name__}")
    if dtypes.is_int(dst.dtype) and isinstance(value, (float, np.floating)):
        if not (np.isfinite(value) and float(value).is_integer()):
            raise _invalid(f"{api} value {value!r} is a float but dst is "
                           f"{dtypes.name(dst.dtype)}: pass an int")
        # an integral float is tolerated: AWS's CI-tested nki-library (router_topk) memsets
        # uint32 tiles with value=0.0; the value is exact, so nothing is lost
        context.current().rule(
            ("memset_float_int",), f"{api}() value={value!r} is a float for a "
            f"{dtypes.name(dst.dtype)} dst, read as {int(value)}",
            "the value's type must match dst.dtype",
            "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.32.0/nki/migration/index.html")
        value = int(value)
    return _direct(dst, api, name, _core.memset, dst.shape, value, dst.dtype, engine=eng)


@_validated
def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[p, ...] = offset + p * channel_multiplier + sum(step_i * idx_i)`` for ``pattern =
    [[step, num], ...]`` (up to 4 free dims), int32 arithmetic cast to ``dst.dtype``; dst in
    SBUF (STUB-R32 iota; ``offset`` defaults to 0 from 0.3.0)."""
    api = "iota"
    _onchip(dst, api, "dst", ("sbuf",))
    res = _core.iota_pattern(dst.shape[0], pattern, dst.dtype, offset, channel_multiplier)
    return _into(dst, res, api, name)


@_validated
def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value,
                  cmp_op=_ops.equal, offset=0, name=None):
    """``dst = on_true_tile`` where ``cmp_op(offset + p * channel_multiplier + sum(step_i *
    idx_i), 0)``, else ``on_false_value``; dst and on_true_tile in SBUF (0.3.0+ order: ``offset``
    is a keyword, default 0; STUB-R29/R32)."""
    api = "affine_select"
    _onchip(dst, api, "dst", ("sbuf",))
    _onchip(on_true_tile, api, "on_true_tile", ("sbuf",))
    if isinstance(on_false_value, Tensor) or not isinstance(
            on_false_value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{api}() on_false_value must be a number, got "
                        f"{type(on_false_value).__name__}")
    res = _core.affine_select_pattern(pattern, channel_multiplier, on_true_tile,
                                      on_false_value, cmp_op=_tok(cmp_op), offset=offset,
                                      dtype=dst.dtype)
    return _into(dst, res, api, name)


@_validated
def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """Copy ``src`` (a tile or a number) into ``dst`` where ``predicate`` is true (false with
    ``reverse_pred``); other elements of ``dst`` keep their values."""
    api = "tensor_copy_predicated"
    _onchip(dst, api, "dst")
    _onchip(predicate, api, "predicate")
    if isinstance(src, Tensor):
        _onchip(src, api, "src")
        if src.dtype != dst.dtype:
            raise _invalid(f"{api} src dtype {dtypes.name(src.dtype)} differs from dst "
                           f"{dtypes.name(dst.dtype)} (\"src and dst must share the same data "
                           "type\")")
    # "predicate must be of type uint8, uint16, or uint32" (bool, one byte as uint8, is kept:
    # AWS's Beta 1 doc test passes np.less_equal's bool array)
    _dtype_rule(api, "predicate", predicate, _U_PRED,
                "\"predicate must be of type uint8, uint16, or uint32\"")
    _core.tensor_copy_predicated(src=src, dst=dst, predicate=predicate,
                                 reverse_pred=reverse_pred)
    return _last(name)


@_validated
def dropout(dst, data, prob, name=None):
    """Zero each element of ``data`` with probability ``prob`` (a scalar or a (P, 1) tile)."""
    api = "dropout"
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    if dst.dtype != data.dtype:
        raise _invalid(f"{api} dst dtype {dtypes.name(dst.dtype)} must match the data dtype "
                       f"{dtypes.name(data.dtype)} (\"The output data type dst.dtype must match "
                       "the input data type data.dtype\")")
    if isinstance(prob, Tensor):
        _onchip(prob, api, "prob")
        if dtypes.is_int(data.dtype) and prob.dtype != np.dtype(np.float32):
            raise _invalid(f"{api} prob dtype {dtypes.name(prob.dtype)} must be float32 for "
                           f"{dtypes.name(data.dtype)} data (\"If data type of data is any of "
                           "the integer types ..., prob data type must be float32\")")
        if not dtypes.is_int(data.dtype) and not dtypes.is_float(prob.dtype):
            raise _invalid(f"{api} prob dtype {dtypes.name(prob.dtype)} must be a float type")
    return _into(dst, _core.dropout(data, prob, dtype=dst.dtype), api, name)


# ---------------------------------------------------------------------------------------------
# statistics, gathers, shuffles


@_validated
def bn_stats(dst, data, name=None):
    """Per partition (count, mean, variance*count) of the even then odd elements: dst (P, 6)."""
    api = "bn_stats"
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    return _into(dst, _core.bn_stats(data, dtype=dst.dtype), api, name)


@_validated
def bn_aggr(dst, data, name=None):
    """Aggregate bn_stats triples into (mean, variance) per partition: dst (P, 2)."""
    api = "bn_aggr"
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    return _into(dst, _core.bn_aggr(data, dtype=dst.dtype), api, name)


@_validated
def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None,
                 name=None):
    """GpSimd gather inside each group of 16 partitions (SBUF only)."""
    api = "local_gather"
    _onchip(dst, api, "dst", ("sbuf",))
    _onchip(src_buffer, api, "src_buffer", ("sbuf",))
    _onchip(index, api, "index", ("sbuf",))
    res = _core.local_gather(src_buffer, index, num_elem_per_idx, num_valid_indices)
    return _into(dst, res, api, name)


@_validated
def sequence_bounds(dst, segment_ids, name=None):
    """[start, end) of the segment of each element of a (1, n) tile of ids: dst (1, 2, n)."""
    api = "sequence_bounds"
    _onchip(dst, api, "dst")
    _onchip(segment_ids, api, "segment_ids")
    return _into(dst, _core.sequence_bounds(segment_ids=segment_ids, dtype=dst.dtype), api,
                 name)


@_validated
def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Move partitions inside each 32-partition quadrant: ``dst[q*32 + i] = src[q*32 +
    shuffle_mask[i]]``, 255 leaves ``dst[q*32 + i]`` unchanged. ``dst`` comes first since NKI
    0.2.0 ("nc_stream_shuffle swapped src/dst", RN27)."""
    api = "nc_stream_shuffle"
    _onchip(dst, api, "dst")
    _onchip(src, api, "src")
    # "num_active_partitions = ceil(max(src_num_partitions, dst_num_partitions)/32) * 32";
    # "If num_active_partitions is 96/128, src_start_partition/dst_start_partition must be 0";
    # 64: "must be 0/64"; 32: "must be 0/32/64/96"
    active = -(-max(src.shape[0], dst.shape[0]) // 32) * 32
    starts = {96: (0,), 128: (0,), 64: (0, 64)}.get(active, (0, 32, 64, 96))
    for param, t in (("src", src), ("dst", dst)):
        p0 = region(t).p0
        if p0 not in starts:
            raise _invalid(f"{api} {param} starts at partition {p0}; with "
                           f"{active} active partitions the start partition must be "
                           f"{'/'.join(map(str, starts))}")
    _core.nc_stream_shuffle(src, dst, shuffle_mask)
    return _last(name)


# ---------------------------------------------------------------------------------------------
# Tensor Engine


@_validated
def nc_transpose(dst, data, engine=engine.unknown, name=None):
    """Swap the partition and (flattened) free axes. Tensor Engine: SBUF -> PSUM, <= [128, 128];
    Vector Engine: <= [32, 32], SBUF or PSUM on either side; ``engine=unknown`` picks by shape.
    "dst.dtype must equal data.dtype" (STUB-R32). Before 0.4.0 an explicit engine was silently
    ignored (RN 2.30)."""
    api = "nc_transpose"
    eng = _core_engine(engine, api, ("tensor", "vector"))
    if not at_least("0.4"):
        eng = _core.engine.unknown
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    if dst.dtype != data.dtype:
        raise _invalid(f"{api} dst dtype {dtypes.name(dst.dtype)} must equal the data dtype "
                       f"{dtypes.name(data.dtype)}")
    P, F = data.shape[0], max(1, data.size // max(1, data.shape[0]))
    on_pe = eng == _core.engine.tensor or (eng == _core.engine.unknown and
                                            not (P <= 32 and F <= 32))
    if on_pe and dst.root.buffer != "psum":
        raise _invalid(f"{api} on the Tensor Engine writes PSUM; dst '{dst.name}' is in "
                       f"{dst.root.buffer.upper()}")
    res = _core.nc_transpose(data, dtype=dst.dtype, engine=eng)
    return _into(dst, res, api, name)


def _one_bank(run, dst, api):
    """A PSUM tensor may span several banks in this dialect (Rules.psum_tile_spans_banks), but
    one matmul writes inside one 2 KiB bank ("each nc_matmul writes one PSUM bank":
    gemm_moving_fmax is 512 fp32, one bank; STUB-R32 nc_matmul §Tile size). PSUM tensors
    start on a bank boundary (MIG "PSUM addresses must start on a 2 KB bank boundary")."""
    bank = run.arch.psum_bank_bytes
    if (dst.root.pbytes or 0) <= bank:
        return
    r = region(dst)
    if r.b1 > r.b0 and r.b0 // bank != (r.b1 - 1) // bank:
        raise nki_error("nkisim_matmul_crosses_psum_bank", api=api, start=r.b0, end=r.b1,
                        name=dst.root.name, bank=bank)


@_validated
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=matmul_perf_mode.none, name=None):
    """``dst (+)= stationary.T @ moving`` on the Tensor Engine: K on partitions; inputs in SBUF,
    ``dst`` in PSUM, float32 on gen2/gen3 (STUB-R32 nc_matmul).

    ``accumulate`` (new in 0.3.0): ``False`` overwrites; ``True`` adds ("only valid after the
    location was initialised by a matmul"; from 0.5.0 the simulator warns when it was not,
    RN 2.31); ``None`` (default) "auto-detects: the first write to a PSUM location overwrites
    and later writes accumulate". nkisim tracks, per PSUM element, whether a matmul initialised
    it (nkisim.psum_init; spec §6 item 5): ``None`` adds where set and overwrites elsewhere."""
    api = "nc_matmul"
    pm = _enum(matmul_perf_mode, perf_mode, api, "perf_mode")
    if accumulate is not None and not isinstance(accumulate, (bool, np.bool_)):
        raise TypeError(f"{api}() accumulate must be None, True or False, got {accumulate!r}")
    run = context.current()
    _onchip(dst, api, "dst", ("psum",))
    _onchip(stationary, api, "stationary", ("sbuf",))
    _onchip(moving, api, "moving", ("sbuf",))
    _one_bank(run, dst, api)
    if not is_transpose and (stationary.dtype in _F32ISH) != (moving.dtype in _F32ISH):
        raise _invalid(f"{api} stationary {dtypes.name(stationary.dtype)} and moving "
                       f"{dtypes.name(moving.dtype)}: \"if one of the input tiles is "
                       "tfloat32/float32, the other tile must also be tfloat32/float32\"")
    if pm is matmul_perf_mode.double_row and run.arch.nc_version >= 3:
        if stationary.dtype not in _FP8 or moving.dtype not in _FP8:
            raise _invalid(f"{api} with perf_mode=double_row needs float8_e4m3/float8_e5m2 "
                           f"tiles, got stationary {dtypes.name(stationary.dtype)} and moving "
                           f"{dtypes.name(moving.dtype)}")
        if tile_size and len(tile_size) == 2 and int(tile_size[1]) < 128:
            raise _invalid(f"{api}: \"double_row performance mode cannot be combined with "
                           f"Tensor Engine column tiling mode\" (tile_size={tuple(tile_size)})")
    if is_transpose:
        # a PE transpose (stationary.T @ identity) keeps the data's dtype, as nc_transpose
        # does ("dst.dtype must equal data.dtype"); AWS's nki-library core/max/cascaded_max.py
        # transposes into a PSUM tile of the value's dtype with is_transpose=True
        if dst.dtype != stationary.dtype:
            raise _invalid(f"{api} with is_transpose=True: dst dtype {dtypes.name(dst.dtype)} "
                           f"must equal the stationary dtype {dtypes.name(stationary.dtype)}")
    elif dst.dtype != np.dtype(np.float32):
        gen = nc_version(run.arch.nc_version).name
        raise _invalid(f"{api} dst dtype must be float32 on {gen}, got "
                       f"{dtypes.name(dst.dtype)}")
    res = _core.nc_matmul(stationary, moving, is_stationary_onezero=is_stationary_onezero,
                          is_moving_onezero=is_moving_onezero, is_transpose=is_transpose,
                          tile_position=tile_position, tile_size=tile_size,
                          perf_mode=None if pm is matmul_perf_mode.none else pm.name,
                          _defer=True)
    pending = type(res) is PendingMatmul
    if pending:
        # no result tile unless something needs it (nkisim.tensor.PendingMatmul, issue 12)
        out = PENDING[0][2]
        ds = dst.shape
        if same_elements(ds, out.shape) and pending_allocatable(run, out):
            instr, out = record_pending(dst)
            inc = fit(out, ds, out.shape)
        else:
            materialize_pending()       # then as for any result tile (and its errors)
            pending = False
    if not pending:
        _same_elements(dst, res, api)
        instr = res._producer
        inc = fit(values(res), dst.shape, res.shape)
    # per element: did a matmul initialise it? (init: None when every one was)
    init_all, init_any, init = psum_init.state(dst)
    if accumulate is None:
        add_all, add_any = init_all, init_any
    elif accumulate:
        add_all = add_any = True
        if not init_all and at_least("0.5"):
            run.warn(("nc_matmul_accumulate_uninit", dst.root.id),
                     f"nc_matmul(accumulate=True) into PSUM `{dst.name}` that no matmul "
                     "initialised: the result is undefined on hardware; start the group with "
                     "accumulate=False (nki.isa.nc_matmul docs)")
    else:
        add_all = add_any = False
    if add_any:
        # the accumulation reads the partial sums a matmul wrote (where no matmul did, True
        # adds garbage and was warned about): exempt from the race checks, as for
        # `psum += nisa.nc_matmul(...)` (an associative reduction)
        garbage = None
        # (_w would materialize a lazy shadow.) accumulate=True reads every element: where no
        # instruction ever wrote one, the sum is garbage like any never-written read (an
        # error if it reaches HBM), whatever the version's warning says
        if dst._ws is not None and (init_any or add_all):
            garbage = accumulator_garbage(
                run, dst, dst if init_all or add_all else _masked_shadow_view(dst, init, run),
                "nc_matmul (accumulate)")
        if add_all and dst._idx is None and values(dst).dtype == np.float32:
            _add_into(run, dst, inc)        # in place, one pass (as Beta 1's `psum += ...`)
        else:
            cur = np.asarray(values(dst), np.float32)
            vals = cur + inc if add_all else np.where(init, cur + inc, inc)
            write(dst, vals, api, accumulate=True, run=run)
        if garbage is not None:
            taint_elements(run, dst, garbage)
    else:
        write(dst, inc, api, run=run)
    if not pending:
        inherit_taint(dst, res)         # (a pending result holds no never-written value)
    if not init_all:
        psum_init.mark(dst)
    instr.writes = (region(dst),)
    instr.detail["accumulate"] = add_any
    if pending:
        if TOUCHED:                     # (what releasing the result tile stamps)
            run.memory._stamp(run.memory.clock)
    else:
        run.memory.release(res.root)
        res._producer = None
    return _handle(instr, name)


# ---------------------------------------------------------------------------------------------
# DMA compute (nkisim.dma_compute)


@_validated
def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True,
                oob_mode=oob_mode.error, name=None):
    """``dst = srcs[0] + srcs[1] + ...`` in fp32 on the DMA engines (HBM or SBUF; only
    ``nl.add``, scales all 1.0); a read-modify-write scatter/gather with an indirect source.
    Replaces ``dma_copy(dst_rmw_op=)`` (MIG 0.2->0.3); ``oob_mode`` is new in 0.4.0 (RN
    2.30)."""
    api = "dma_compute"
    if oob_mode is not globals()["oob_mode"].error and not at_least("0.4"):
        raise TypeError(f"{api}() got an unexpected keyword argument 'oob_mode'")
    om = _enum(globals()["oob_mode"], oob_mode, api, "oob_mode")
    _tensor(dst, api, "dst")
    if isinstance(srcs, (list, tuple)):
        for i, s in enumerate(srcs):
            _tensor(s, api, f"srcs[{i}]")
    _dma_compute.dma_compute(dst, srcs, reduce_op=_tok(reduce_op), scales=scales,
                             unique_indices=unique_indices,
                             oob_skip=om is globals()["oob_mode"].skip)
    return _last(name)


# ---------------------------------------------------------------------------------------------
# GpSimd gathers of the current dialect (nkisim.gather)


@_validated
def nc_n_gather(dst, data, indices, name=None):
    """Per partition, gather elements of ``data``'s flattened free dims at the uint32
    ``indices``; ``dst`` has the indices' elements and the data's dtype (SBUF only)."""
    api = "nc_n_gather"
    _onchip(dst, api, "dst", ("sbuf",))
    _onchip(data, api, "data", ("sbuf",))
    _onchip(indices, api, "indices", ("sbuf",))
    if dst.dtype != data.dtype:
        raise _invalid(f"{api} dst dtype {dtypes.name(dst.dtype)} must equal the data dtype "
                       f"{dtypes.name(data.dtype)}")
    return _into(dst, _gather.nc_n_gather(data, indices, dtype=dst.dtype), api, name)


@_validated
def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """Indices of the nonzero elements of partitions 0, 16, ..., 112 of ``src`` (+
    ``index_offset``), ``padding_val`` after them, the count last (NeuronCore-v3+)."""
    api = "nonzero_with_count"
    _onchip(dst, api, "dst", ("sbuf",))
    _onchip(src, api, "src", ("sbuf",))
    _gather.nonzero_with_count(dst, src, index_offset=index_offset, padding_val=padding_val)
    return _last(name)


# ---------------------------------------------------------------------------------------------
# engine-sequencer registers (nkisim.registers)

VirtualRegister = _registers.VirtualRegister


def register_alloc(x=None):
    """A virtual register, initialised with the int ``x`` (or a one-element tensor's value), or
    uninitialised (None). From NKI 0.7 (the tracer front end) a register cannot steer Python
    control flow (VirtualRegister docs)."""
    return _registers.register_alloc(x, tracer=at_least("0.7"))


def register_move(dst, src):
    """``dst = src`` (a compile-time int or a register)."""
    _registers.register_move(dst, src)


def register_load(dst, src):
    """Load the one value of tensor ``src`` (HBM or SBUF, [1] or [1, 1]) into ``dst``."""
    _registers.register_load(dst, src)


def register_store(dst, src):
    """Store register ``src`` into the one element of tensor ``dst`` (HBM or SBUF)."""
    _registers.register_store(dst, src)


# ---------------------------------------------------------------------------------------------
# between the logical cores of an LNC 2 launch (nkisim.collectives, nkisim.lnc)

# the trace engine of each `engine=` a barrier may run on; the Sync engine (SP) issues DMAs,
# so its instructions go to the DMA queues' timeline
_BARRIER_ENGINES = {"gpsimd": "gpsimd", "vector": "vector", "scalar": "scalar",
                    "tensor": "tensor", "sync": "dma", "unknown": "gpsimd"}


@_validated
def core_barrier(data, cores, engine=engine.gpsimd, name=None):
    """Every core in ``cores`` waits here until all of them arrive; ``data`` is the shared HBM
    tensor they synchronise on (nki.isa.core_barrier docs; nkisim.collectives)."""
    api = "core_barrier"
    e = _enum(globals()["engine"], engine, api, "engine")
    if e.name not in _BARRIER_ENGINES:
        raise _invalid(f"{api} engine {e.name} is not supported; use one of "
                       f"{', '.join(k for k in _BARRIER_ENGINES if k != 'unknown')}")
    _tensor(data, api, "data")
    _collectives.core_barrier(data, cores, engine=_BARRIER_ENGINES[e.name])
    return _last(name)


@_validated
def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma,
             name=None):
    """Send ``src`` to core ``send_to_rank``'s ``dst`` while receiving core
    ``recv_from_rank``'s ``src`` into ``dst`` (both SBUF, same dtype and layout); the only
    nisa op whose ``src`` comes before ``dst`` (spec §2.0 item 1). ``dma_engine`` is new in
    0.3.0 (RN 2.29: "sendrecv(dma_engine=)")."""
    api = "sendrecv"
    de = _enum(globals()["dma_engine"], dma_engine, api, "dma_engine")
    _onchip(src, api, "src", ("sbuf",))
    _onchip(dst, api, "dst", ("sbuf",))
    _collectives.sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id,
                          gpsimd_dma=de is globals()["dma_engine"].gpsimd_dma)
    return _last(name)


# ---------------------------------------------------------------------------------------------
# accumulating instructions (nkisim.accumulate), top-k (nkisim.topk)


def _cmd(value, api):
    """The core's name of a ``reduce_cmd`` member."""
    return _enum(reduce_cmd, value, api, "reduce_cmd").name


def _onchip_operands(api, **operands):
    for param, t in operands.items():
        if isinstance(t, Tensor):
            _onchip(t, api, param)


@_validated
def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None,
                             reduce_cmd=reduce_cmd.reset_reduce, name=None):
    """Per partition along the free elements: ``reg = op1(op0(src[i], imm0), reg); dst[i] =
    reg`` on the Vector Engine (nkisim.accumulate), the register reset (``reset_reduce``),
    kept (``reduce``) or loaded with ``imm1`` (``load_reduce``); ``imm0``/``imm1`` scalars or
    (P, 1) float32 tiles. In every 0.2+ stub."""
    api = "tensor_scalar_cumulative"
    cmd = _cmd(reduce_cmd, api)
    _onchip(dst, api, "dst")
    _onchip(src, api, "src")
    _onchip_operands(api, imm0=imm0, imm1=imm1)
    _accumulate.tensor_scalar_cumulative(dst, src, _tok(op0), _tok(op1), imm0, imm1,
                                         reduce_cmd=cmd)
    return _last(name)


@_validated
def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                reduce_init=0.0, name=None):
    """``dst = exp(src - max_value)`` on the Vector Engine, optionally adding the results up in
    its accumulators into ``reduce_res`` (nkisim.accumulate). New in 0.2.0 (RN 2.28);
    "Available only on NeuronCore-v4 and newer": an error on trn1 and trn2."""
    api = "exponential"
    _core.require_nc_version(context.current(), "nki.isa.exponential", 4)
    cmd = _cmd(reduce_cmd, api)
    _onchip(dst, api, "dst")
    _onchip(src, api, "src")
    _onchip_operands(api, max_value=max_value, reduce_res=reduce_res, reduce_init=reduce_init)
    _accumulate.exponential(dst, src, max_value=max_value, reduce_res=reduce_res,
                            reduce_cmd=cmd, reduce_init=reduce_init)
    return _last(name)


@_validated
def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False,
              reverse1=False, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
              name=None):
    """``dst = op((data <op0> imm0) <op1> imm1)`` on the Scalar Engine with an optional
    reduction in its accumulators (nkisim.accumulate). New in 0.4.0 (RN 2.30, "activate2
    (trn3)"); "Available only on NeuronCore-v4 and newer": an error on trn1 and trn2."""
    api = "activate2"
    _core.require_nc_version(context.current(), "nki.isa.activate2", 4)
    cmd = _cmd(reduce_cmd, api)
    _onchip(dst, api, "dst")
    _onchip(data, api, "data")
    _onchip_operands(api, imm0=imm0, imm1=imm1, relu_param=relu_param, reduce_res=reduce_res)
    _accumulate.activate2(dst, _tok(op), data, imm0, imm1, _tok(op0), _tok(op1),
                          relu_param=relu_param, reverse0=reverse0, reverse1=reverse1,
                          reduce_op=_tok(reduce_op), reduce_res=reduce_res, reduce_cmd=cmd)
    return _last(name)


@_validated
def topk(val_dst, idx_dst, src, n, name=None):
    """The K (``val_dst``'s free size) largest values of each 16-partition group's
    ``n``-element snake of ``src``, ascending, and their indices, on GpSimd (nkisim.topk).
    New in 0.6.0 (RN 2.32)."""
    api = "topk"
    _onchip(val_dst, api, "val_dst", ("sbuf",))
    _onchip(idx_dst, api, "idx_dst", ("sbuf",))
    _onchip(src, api, "src", ("sbuf",))
    _topk.topk(val_dst, idx_dst, src, n)
    return _last(name)


# ---------------------------------------------------------------------------------------------
# the engines' random number generators (nkisim.prng: a deterministic XORWOW per engine and
# lane; the values are not the device's, the shapes, dtypes, ranges and reproducibility by seed
# follow the docs). In every 0.2+ stub.


def _rng_engine(value, api, default, fn="engine"):
    e = _enum(engine, value, api, fn)
    if e is engine.unknown:
        return default
    if e.name not in ("vector", "gpsimd"):
        raise _invalid(f"{api} engine {e.name} is not supported; use vector or gpsimd")
    return e.name


@_validated
def rng(dst, engine=engine.vector, name=None):
    """``dst`` (an integer dtype, SBUF or PSUM) = the low bits of 32 random bits per element,
    from the Vector (default) or GpSimd (NeuronCore-v3+, SBUF only) engine's generator."""
    api = "rng"
    eng = _rng_engine(engine, api, "vector")
    _onchip(dst, api, "dst")
    _prng.rng(dst, engine=eng)
    return _last(name)


@_validated
def rand2(dst, min, max, name=None):     # (min, max: the documented parameter names)
    """``dst`` = uniform random values in [``min``, ``max``] (scalars or (P, 1) float32 tiles)
    from the Vector Engine's generator, cast to ``dst.dtype``. "Available only on
    NeuronCore-v4 and newer": an error on trn1 and trn2."""
    api = "rand2"
    _core.require_nc_version(context.current(), "nki.isa.rand2", 4)
    _onchip(dst, api, "dst")
    _onchip_operands(api, min=min, max=max)
    _prng.rand2(dst, min, max)
    return _last(name)


@_validated
def set_rng_seed(src_seeds, name=None):
    """Seed the Vector Engine's generator with the 32-bit value of the [1, 1] SBUF/PSUM tensor
    ``src_seeds``: the same seed, the same numbers (``rng``, ``rand2`` and ``dropout``)."""
    api = "set_rng_seed"
    _onchip(src_seeds, api, "src_seeds")
    _prng.set_rng_seed(src_seeds)
    return _last(name)


@_validated
def rand_set_state(src_seeds, engine=engine.gpsimd, name=None):
    """Load the XORWOW state of each lane from the uint32 SBUF tile ``src_seeds`` (6 words per
    partition for GpSimd, 24 for Vector). NeuronCore-v3+ (Vector: v4+)."""
    api = "rand_set_state"
    eng = _rng_engine(engine, api, "gpsimd")
    _core.require_nc_version(context.current(), "nki.isa.rand_set_state", 3)
    _onchip(src_seeds, api, "src_seeds", ("sbuf",))
    _prng.rand_set_state(src_seeds, engine=eng)
    return _last(name)


@_validated
def rand_get_state(dst, engine=engine.gpsimd, name=None):
    """Store the XORWOW state of each lane into the uint32 tile ``dst`` (6 or 24 words per
    partition). NeuronCore-v3+ (Vector: v4+)."""
    api = "rand_get_state"
    eng = _rng_engine(engine, api, "gpsimd")
    _core.require_nc_version(context.current(), "nki.isa.rand_get_state", 3)
    _onchip(dst, api, "dst")
    _prng.rand_get_state(dst, engine=eng)
    return _last(name)


# ---------------------------------------------------------------------------------------------
# names added after 0.3 (the oldest release the face serves): present from their release on,
# an AttributeError before it, as a module without them is (the stubs of each release: 0.4.0
# adds activate2, RN 2.30; the 0.5.0 stubs add get_nc_sub_version; 0.6.0 adds topk, RN 2.32)

_ADDED = {"activate2": (0, 4), "get_nc_sub_version": (0, 5), "topk": (0, 6)}
_LATER = {attr: globals().pop(attr) for attr in _ADDED}


# ---------------------------------------------------------------------------------------------
# the current API's ops nkisim does not simulate yet: a clear error at the call, not an
# AttributeError (STUB-R32 isa; spec §1 "New ISA ops")

_NOT_SIMULATED = ("quantize_mx", "nc_matmul_mx")


def __getattr__(attr):
    if attr in _LATER:
        if at_least(*_ADDED[attr]):
            return _LATER[attr]
        have = ".".join(map(str, _version.current()))
        major, minor = _ADDED[attr]
        raise AttributeError(f"module 'nki.isa' has no attribute '{attr}' (added in NKI "
                             f"{major}.{minor}.0; NKISIM_NKI_VERSION={have})")
    if attr in ("tensor_copy_dynamic_src", "tensor_copy_dynamic_dst"):
        if at_least("0.4"):      # "removed in 0.4.0 (use tensor_copy + .ap(scalar_offset=...))"
            raise AttributeError(f"module 'nki.isa' has no attribute '{attr}' (removed in NKI "
                                 "0.4.0: use nisa.tensor_copy with .ap(scalar_offset=...))")
        return _dynamic_copy(attr)
    if attr in _NOT_SIMULATED:
        def fn(*args, **kwargs):
            raise nki_error("nkisim_unsupported", what=f"nki.isa.{attr}",
                            why="not part of the API surface nkisim simulates yet")
        fn.__name__ = attr
        return fn
    raise AttributeError(f"module 'nki.isa' has no attribute '{attr}'")


def _dynamic_copy(attr):
    """NKI 0.3's deprecated ``tensor_copy_dynamic_src/dst(dst, src, engine, name)``."""
    def fn(dst, src, engine=engine.unknown, name=None):
        eng = _core_engine(engine, attr)
        _onchip(dst, attr, "dst")
        _onchip(src, attr, "src")
        if attr.endswith("src"):
            return _into(dst, _core.tensor_copy_dynamic_src(src, dtype=dst.dtype, engine=eng),
                         attr, name)
        _core.tensor_copy_dynamic_dst(dst=dst, src=src, engine=eng)
        return _last(name)
    fn.__name__ = fn.__qualname__ = attr
    return _validated(fn)
