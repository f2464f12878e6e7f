"""``nki.language`` (nl) of NKI 0.3-0.7: allocation, buffers, dtypes, iteration, views, and the
experimental convenience wrappers (spec nki-current.md §2.2, §2.3).

The op tokens ISA calls take (``op=nl.add``, ``op0=nl.maximum``, ``op=nl.exp``, ``op=nl.copy``)
are the machine core's own functions (nkisim.ops), so the core's op-code tables accept them; called
as wrappers they follow the rules of the release the face imitates (``nkisim.nki.rules``: no
broadcasting, ``nl.copy``'s result buffer), which the core reads from the running kernel. One is
this face's own function, ``nl.rsqrt`` (0.5.0's PSUM rule): as an op code nki.isa takes it as
the core's function of that name (``nki.isa._tok``).
Everything else is defined here with the current signatures.
"""

from __future__ import annotations

import builtins
import inspect
import math
import os
import warnings

import numpy as np

from .. import context, dtypes
from .. import ops as _ops
from ..dstform import into_target
from ..engines import require_nc_version
from ..errors import nki_error
from ..indexing import DynSlice, whole
from ..lowering import dropout as _dropout
from ..lowering import matmul as _matmul
from ..lowering import rms_norm as _rms_norm
from ..lowering import transpose as _transpose

# ---------------------------------------------------------------------------------------------
# op tokens and element-wise wrappers: the core's objects (see the module docstring)
from ..ops import (  # noqa: E402,F401
    abs,
    add,
    arctan,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    ceil,
    copy,
    cos,
    divide,
    equal,
    erf,
    erf_dx,
    exp,
    floor,
    fmod,
    gelu,
    gelu_apprx_sigmoid,
    gelu_apprx_sigmoid_dx,
    gelu_apprx_tanh,
    gelu_dx,
    greater,
    greater_equal,
    invert,
    left_shift,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    max,
    maximum,
    mean,
    min,
    minimum,
    mish,
    mod,
    multiply,
    negative,
    not_equal,
    power,
    prod,
    reciprocal,
    relu,
    right_shift,
    sigmoid,
    sign,
    silu,
    silu_dx,
    sin,
    softplus,
    sqrt,
    square,
    subtract,
    sum,
    tan,
    tanh,
    trunc,
    var,
    where,
)
from ..tensor import Buffer, Tensor
from ..tensor import DirectAlloc as _DirectAlloc
from ..tensor import allocate as _allocate
from . import _version
from .isa import _invalid

bitwise_not = invert


@into_target
def rsqrt(x, dtype=None):
    """``1 / sqrt(x)`` element-wise. From NKI 0.5.0 it "now runs on the GpSimd Engine for higher
    numerical precision and no longer accepts PSUM inputs. If you need a PSUM input or Scalar
    Engine throughput, call nki.isa.activation directly with the reciprocal-square-root op
    instead" (migration guide 0.4 -> 0.5, "nki.language.rsqrt — PSUM inputs no longer
    supported"; spec nki-current.md §1, 0.5.0: "`nl.rsqrt` no longer takes PSUM"): a PSUM ``x``
    is then an ``NkiValidationError``, as GpSimd's "cannot access PSUM" is in nki.isa. 0.3 and
    0.4 take it. As an op code (``nisa.activation(op=nl.rsqrt)``) it is the core's rsqrt
    (nki.isa._tok), which takes PSUM."""
    if _version.at_least(0, 5) and isinstance(x, Tensor) and x.root.buffer == "psum":
        raise _invalid(f"nl.rsqrt x must be in SBUF, got PSUM tensor '{x.name}': since NKI "
                       "0.5.0 nl.rsqrt runs on the GpSimd Engine and no longer accepts PSUM "
                       "inputs; copy x to SBUF first (nl.copy), or call nisa.activation(dst, "
                       "op=nl.rsqrt, data=x) for a PSUM input")
    return _ops.rsqrt(x, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# dtypes (STUB-R32 language: ``DType`` constants). nkisim's dtypes are NumPy's (bf16/fp8 from
# ml_dtypes), which compare equal to their names (np.dtype("float32") == "float32").

# As dtype *instances* (not NumPy scalar types): the real constants are strings, and
# nki-library compares ``str(dtype) == str(nl.float32)`` (core/utils/allocator.py sizeinbytes)
# and keys dicts by them (kernel_helpers.py) with a tensor's dtype: str(np.dtype("float32")) is
# "float32" and np.dtype hashes alike, as a string constant would.
bool_ = np.dtype(dtypes.bool_)
int8, int16, int32 = np.dtype(dtypes.int8), np.dtype(dtypes.int16), np.dtype(dtypes.int32)
uint8, uint16, uint32 = np.dtype(dtypes.uint8), np.dtype(dtypes.uint16), np.dtype(dtypes.uint32)
float16, float32 = np.dtype(dtypes.float16), np.dtype(dtypes.float32)
bfloat16 = dtypes.bfloat16
tfloat32 = dtypes.tfloat32
float8_e4m3 = dtypes.float8_e4m3
float8_e5m2 = dtypes.float8_e5m2
# float8_e4m3fn (2.28) and float8_e8m0fnu (0.5.0): ml_dtypes' types of those names
float8_e4m3fn = dtypes.float8_e4m3fn
float8_e8m0fnu = dtypes.float8_e8m0fnu
DType = dtype = np.dtype          # annotations: `dtype: nki.dtype = nl.bfloat16`
# `nl.bool` (nki-library core/utils/kernel_helpers.py returns it for 'bool')
globals()["bool"] = bool_
# MX packed types (4 values in 32 bits, 2.27; quantize_mx / nc_matmul_mx): named so kernels
# import; nkisim does not simulate them, so allocating one is nkisim_operand_dtype.
float8_e5m2_x4 = np.dtype([("float8_e5m2_x4", "u1", (4,))])
float8_e4m3fn_x4 = np.dtype([("float8_e4m3fn_x4", "u1", (4,))])
float4_e2m1fn_x4 = np.dtype([("float4_e2m1fn_x4", "u1", (4,))])

fp32, bfp16 = _ops.fp32, _ops.bfp16
finfo = _ops.finfo


class NKIObject:
    """``nl.NKIObject``: the base class of user classes a kernel may use (nki-library's
    configuration dataclasses and TensorView derive from it). On nkisim kernels are plain Python.

    One difference from a plain Python base: a ``@dataclass`` subclass's class attributes without
    an annotation are fields too (with that default), so ``SectionParams(section_idx=i, ...)``
    works for ``@dataclass class SectionParams(nl.NKIObject): section_idx = None`` (AWS's
    nki-library attention_cte.py builds its SectionParams that way; plain ``dataclasses`` would
    raise "unexpected keyword argument"). They are added after the annotated fields. Every field
    may be left out and is then None (nki-library leaves out a field it declares without a
    default, see __init_subclass__), so the field order stays valid. A mutable default
    (unhashable: a list, dict, set,
    dataclass instance) is left a plain class attribute: dataclasses rejects it as a default, and
    the class may not be a dataclass at all."""

    __slots__ = ()

    def __init__(self, *args, **kwargs):
        """Without @dataclass, too, a subclass is built from its fields by keyword (or by
        position, in annotation order): AWS's nki-library moe_cte builds
        ``DimensionSizes(T=T, H=H, B=B, E=E, N=N, I_TP=i)`` and ``Configs(...)``, plain
        ``NKIObject`` subclasses with annotated attributes, leaving the fields it derives later
        unset. A name that is not a field (annotated or a class attribute) is a TypeError."""
        fields = _nkiobject_fields(type(self))
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__}() takes at most {len(fields)} positional "
                            f"arguments ({len(args)} given)")
        for name, value in zip(fields, args):
            setattr(self, name, value)
        for name, value in kwargs.items():
            if name not in fields and not hasattr(type(self), name):
                raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument "
                                f"'{name}'")
            setattr(self, name, value)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        import dataclasses

        own = cls.__dict__.get("__annotations__")
        if own is None:
            own = {}
            cls.__annotations__ = own
        for name, value in list(cls.__dict__.items()):
            if name.startswith("_") or name in own or callable(value) or \
                    hasattr(value, "__get__") or isinstance(value, dataclasses.Field) or \
                    type(value).__hash__ is None:      # what dataclasses calls mutable
                continue
            own[name] = "typing.Any"
        # every field may be left out (None): AWS's nki-library builds its @dataclass
        # MLPTKGConstantsDimensionSizes(...) without `remainderIFused: int`, which it declares
        # with no default (core/mlp/mlp_tkg/mlp_tkg_constants.py, used by mlp_tkg and moe_tkg)
        for name, ann in list(own.items()):
            if name not in cls.__dict__ and not name.startswith("__") and \
                    "ClassVar" not in str(ann) and "InitVar" not in str(ann):
                setattr(cls, name, None)


def _nkiobject_fields(cls) -> list:
    """The annotated attribute names of an NKIObject subclass, base classes first."""
    out = []
    for klass in reversed(cls.__mro__):
        for name in klass.__dict__.get("__annotations__", {}):
            if name not in out and not name.startswith("__"):
                out.append(name)
    return out


# ---------------------------------------------------------------------------------------------
# buffers (STUB-R32 language: MemoryRegion members; ``nl.hbm`` is an alias of ``private_hbm``)

sbuf = _ops.sbuf
psum = _ops.psum
private_hbm = _ops.private_hbm
hbm = private_hbm
shared_hbm = _ops.shared_hbm


def _buffer_of(x):
    return x.buffer if isinstance(x, Tensor) else x


def is_sbuf(buffer) -> bool:
    b = _buffer_of(buffer)
    return isinstance(b, Buffer) and b.kind == "sbuf"


def is_psum(buffer) -> bool:
    b = _buffer_of(buffer)
    return isinstance(b, Buffer) and b.kind == "psum"


def is_hbm(buffer) -> bool:
    b = _buffer_of(buffer)
    return isinstance(b, Buffer) and b.kind == "hbm"


def is_on_chip(buffer) -> bool:
    return is_sbuf(buffer) or is_psum(buffer)


class _MemoryRegionType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, Buffer) and obj.kind in ("sbuf", "psum", "hbm")

    def __iter__(cls):
        return iter((cls.sbuf, cls.psum, cls.private_hbm, cls.shared_hbm))

    def __call__(cls, value):
        """``nl.MemoryRegion('psum')``: the member of that value, as an Enum looks it up."""
        if isinstance(value, Buffer) and value in tuple(cls):
            return value
        for member in cls:
            if member.value == value:
                return member
        raise ValueError(f"{value!r} is not a valid MemoryRegion")


class MemoryRegion(metaclass=_MemoryRegionType):
    """``nl.MemoryRegion`` (0.3.0 stubs: an Enum of ``sbuf``, ``psum``, ``private_hbm``,
    ``shared_hbm``; 0.6.0: ``sbuf = 'sbuf'`` ... the values are their names): its members are
    the buffer objects ``nl.sbuf`` etc. (``.value`` and ``.name`` as an Enum member has), so
    ``buffer=nl.MemoryRegion.sbuf``, ``nl.MemoryRegion('psum')`` and
    ``isinstance(nl.psum, nl.MemoryRegion)`` work."""

    sbuf = sbuf
    psum = psum
    private_hbm = private_hbm
    shared_hbm = shared_hbm


def _check_buffer(buffer, api) -> Buffer:
    # 0.3.0: "string buffers ('sbuf') are rejected" (MIG 0.2->0.3, spec §2.0 item 5)
    if not isinstance(buffer, Buffer):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or "
                            f"nl.shared_hbm, not {buffer!r}" +
                            (" (string buffers are rejected since NKI 0.3.0)"
                             if isinstance(buffer, str) else ""))
    return buffer


# ---------------------------------------------------------------------------------------------
# allocation (§2.2)

def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """A new tensor; its memory is uninitialised: nkisim fills it with NaN (4 for integers), as
    the real simulator does (SIM), and its uninitialised-read check reports reads of elements
    never written. ``address=(partition_offset, byte_offset)`` places an SBUF/PSUM tensor there
    (0.3.0): tensors placed at overlapping addresses share storage."""
    buf = _check_buffer(buffer, "nl.ndarray")
    if address is not None:
        buf = _placed(buf, address, shape, dtype)
    t = _allocate(_shape(shape, "nl.ndarray"), dtype, buffer=buf, name=name, api="nl.ndarray")
    if address is not None:
        _share_shadow(t, buf)
    return t


def _share_shadow(t, buf):
    """Placed tensors share storage; they must share what nkisim knows of it too (which
    elements were written). The same placement (address, shape, dtype) shares the shadow; a
    partial overlap counts the overlapping tensors as written (no false uninitialised-read
    error; a missed one is possible)."""
    run = context.current()
    if t._w is None:
        return
    placed = run.direct_sites.setdefault(("nki.language placed tensors",), [])
    nbytes = math.prod(t.shape[1:]) * t._arr.itemsize
    me = (buf.kind, buf.base_partition, buf.base_partition + t.shape[0], buf.base_addr,
          buf.base_addr + nbytes, t.shape, t.dtype)
    for other, root in placed:
        if other[0] != me[0] or other[2] <= me[1] or me[2] <= other[1] or \
                other[4] <= me[3] or me[4] <= other[3]:
            continue
        if other[1:] == me[1:]:
            t.root.shadow = t._w = root.shadow
            return
        for sh in (root.shadow, t._w):
            if sh is not None:
                np.maximum(sh, run.epoch, out=sh)
    placed.append((me, t.root))


def _shape(shape, api):
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        items = tuple(shape)
    except TypeError:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"shape must be a tuple of ints, got {shape!r}") from None
    return tuple(whole(s, f"dimension {i} of {api}'s shape {items!r}")
                 for i, s in enumerate(items))


def _placed(buf, address, shape, dtype):
    """``address=(partition_offset, free_offset)``: the free offset in bytes within a partition
    (MIG §"Translate from the NKI 0.1.0 direct allocation API": ``address=(0, base + (i % k) *
    F * itemsize)``); PSUM addresses start on a 2 KiB bank boundary (same guide)."""
    if buf.kind not in ("sbuf", "psum"):
        raise nki_error("nkisim_invalid_argument", api="nl.ndarray",
                        why="address= places SBUF/PSUM tensors only")
    try:
        p0, off = (int(a) for a in address)
    except (TypeError, ValueError):
        raise nki_error("nkisim_invalid_argument", api="nl.ndarray",
                        why=f"address must be (partition_offset, free_offset), got "
                            f"{address!r}") from None
    if buf.kind == "psum" and off % 2048:
        raise nki_error("nkisim_invalid_argument", api="nl.ndarray",
                        why=f"a PSUM address must start on a 2 KiB bank boundary, got "
                            f"free offset {off}")
    return _DirectAlloc(buf.kind, base_addr=off, base_partition=p0)


def zeros(shape, dtype, buffer=sbuf, name=""):
    """Experimental (STUB-R32). A new tensor filled with zeros (an SBUF memset)."""
    _check_buffer(buffer, "nl.zeros")
    return _ops.zeros(_shape(shape, "nl.zeros"), dtype, buffer=buffer, name=name)


def ones(shape, dtype, buffer=sbuf, name=""):
    _check_buffer(buffer, "nl.ones")
    return _ops.ones(_shape(shape, "nl.ones"), dtype, buffer=buffer, name=name)


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    _check_buffer(buffer, "nl.full")
    return _ops.full(_shape(shape, "nl.full"), fill_value, dtype, buffer=buffer, name=name)


def zeros_like(x, dtype=None, buffer=None, name=""):
    """Zeros of ``x``'s shape (and dtype, unless given) in ``buffer``, "defaults to sbuf"
    (STUB-R32 zeros_like)."""
    return zeros(x.shape, dtype or x.dtype, buffer=sbuf if buffer is None else buffer, name=name)


def empty_like(x, dtype=None, buffer=None, name=""):
    """A new tensor of ``x``'s shape; dtype and buffer "default: same as x" (STUB-R32
    empty_like)."""
    return ndarray(x.shape, dtype or x.dtype, buffer=x.buffer if buffer is None else buffer,
                   name=name)


def ndarray_like(a, dtype=None, buffer=sbuf, name=""):
    return ndarray(a.shape, dtype or a.dtype, buffer=buffer, name=name)

def shared_constant(constant, dtype=None):
    """An HBM tensor holding ``constant`` (an array or a ``.npy`` path): "Create a tensor in
    shared HBM ... :return: an NkiTensor in shared_hbm" (0.6.0 stub), so its buffer is
    ``nl.shared_hbm``. (``dtype=``, Beta 1's cast, is still taken.)"""
    t = _ops.shared_constant(constant, dtype)
    t.root.buf = shared_hbm
    return t



def shared_identity_matrix(n, dtype=uint8, dst=None):
    """An ``(n, n)`` identity matrix in SBUF. nki-library's kernels (AWS-tested on device) use
    the result as an on-chip operand: ``identity_sb = nl.shared_identity_matrix(d_head, ...)``
    then ``identity_sb.ap(...)`` as a tensor_copy source (core/embeddings/rope.py) and as a
    matmul operand (moe_tkg/all_expert_impl.py). The constant reaches SBUF by a DMA. ``dst``
    (in the 0.6.0 signature, undocumented): an (n, n) SBUF tensor to put it in, returned."""
    n = int(n)
    hbm_const = _ops.shared_identity_matrix(n, dtype=dtype)
    if dst is not None:
        if not isinstance(dst, Tensor) or dst.root.buffer != "sbuf" or \
                tuple(dst.shape) != (n, n):
            raise nki_error("nkisim_invalid_argument", api="nl.shared_identity_matrix",
                            why=f"dst must be an ({n}, {n}) SBUF tensor, got "
                                f"{getattr(dst, 'shape', dst)!r} in "
                                f"{getattr(getattr(dst, 'root', None), 'buffer', '?')}")
        t = dst
    else:
        t = _allocate((n, n), hbm_const.dtype, buffer=sbuf, name="identity",
                      api="nl.shared_identity_matrix")
    run = context.current()
    _ops._dma(t, hbm_const, _ops.read(hbm_const, "shared_identity_matrix", run),
              "shared_identity_matrix", run)
    return t

# ---------------------------------------------------------------------------------------------
# tile sizes (nki/api/nki.language.tile_size.rst @R32; RN 2.30, 2.31)


class _TileSize(type(_ops.tile_size)):
    """``nl.tile_size``: Beta 1's constants plus the 0.4.0 byte-aware ones and 0.5.0's
    ``psum_num_banks``. ``psum_fmax`` and ``total_available_sbuf_size`` are deprecated in 0.4.0
    and still work (spec §2.2)."""

    # (each constant new in 0.4.0 or 0.5.0 is an AttributeError under an older
    # NKISIM_NKI_VERSION, as the older stubs lack it: _need)

    @property
    def psum_bank_fmax(self):
        """One PSUM bank: 2 KiB per partition = 512 fp32 (the arch guide's PSUM bank)."""
        _need(0, 4, "psum_bank_fmax", "'tile_size'")
        return 512

    @property
    def psum_bank_fmax_bytes(self):
        _need(0, 4, "psum_bank_fmax_bytes", "'tile_size'")
        return 2048

    @property
    def sbuf_fmax_bytes(self):
        """Bytes of one partition a tile may use (the target's usable SBUF per partition)."""
        _need(0, 4, "sbuf_fmax_bytes", "'tile_size'")
        return self._arch().sbuf_usable_bytes

    @property
    def sbuf_fmax(self):
        """``sbuf_fmax_bytes`` in fp32 elements."""
        _need(0, 4, "sbuf_fmax", "'tile_size'")
        return self.sbuf_fmax_bytes // 4

    @property
    def sbuf_size_bytes(self):
        """"Total SBUF capacity in bytes (all partitions combined)" (0.6.0 stub; its
        total_available_sbuf_size note: "Use sbuf_size_bytes for the total SBUF capacity across
        all partitions"): the target's SBUF bytes per partition times its partitions (trn2:
        224 KiB x 128 = 28 MiB)."""
        _need(0, 4, "sbuf_size_bytes", "'tile_size'")
        arch = self._arch()
        return arch.sbuf_partition_bytes * arch.pmax

    @property
    def psum_num_banks(self):
        _need(0, 5, "psum_num_banks", "'tile_size'")
        # "7 when NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true, else 8" (tile_size rst @R32)
        flag = os.environ.get("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "").strip().lower()
        return self._arch().psum_banks - (1 if flag in ("1", "true", "yes") else 0)

    @staticmethod
    def _arch():
        run = context.maybe_current()
        from ..arch import get_arch
        return run.arch if run else get_arch(os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
                                             or None)



tile_size = _TileSize()

# ---------------------------------------------------------------------------------------------
# iteration (§2.2, §2.0 item 4): every loop unrolls; the range iterators are `range` with the
# signature (start, stop=None, step=1) — extra keywords are a TypeError, as on the device
# (NS #134: "affine_range() got an unexpected keyword argument 'precise_schedule'").


def _range(kind, start, stop, step):
    args = (start,) if stop is None else (start, stop, step)
    # the core's unrolled loop: the loop variable is a plain int, no parallel-loop checks
    return _ops._loop("static", args, int,
                      api="nl.range" if kind == "range" else f"nl.{kind}_range")


def affine_range(start, stop=None, step=1):
    """Deprecated alias of ``range`` (0.3-0.5: "fully unrolled"; 0.6: "an alias for Python's
    range()")."""
    return _range("affine", start, stop, step)


def sequential_range(start, stop=None, step=1):
    """Deprecated alias of ``range``."""
    return _range("sequential", start, stop, step)


def static_range(start, stop=None, step=1):
    """Fully unrolled loop (an alias of ``range`` from 0.6)."""
    return _range("static", start, stop, step)


def _int_value(x, api):
    """The value of a loop bound: an int, or a register read at run time (nki.isa's
    VirtualRegister; nkisim runs eagerly, so its value is known)."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, builtins.bool):
        return int(x)
    for attr in ("value", "_value"):
        v = getattr(x, attr, None)
        if isinstance(v, (int, np.integer)):
            return int(v)
    if isinstance(x, (float, np.floating)):
        return whole(x, f"{api}'s bound")
    try:
        return int(x)
    except (TypeError, ValueError):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"loop bounds must be ints or registers, got "
                            f"{type(x).__name__}") from None


def range(start, stop=None, step=1):  # noqa: A001 - NKI's name
    """``nl.range``: nki-library's mxfp_load_utils loops with it (a kernel AWS tests on
    device); an unrolled loop like the other iterators."""
    return _range("range", start, stop, step)


def dynamic_range(start, stop=None, step=1):
    """A loop the device runs at run time (bounds may be registers). Deprecated in 0.6.0
    (use ``nl.fori_loop``), removed in 0.7.0 (RN 2.32, 2.33; spec §1, §2.2)."""
    if _version.at_least(0, 7):
        raise AttributeError("module 'nki.language' has no attribute 'dynamic_range': it was "
                             "removed in NKI 0.7.0; use nl.fori_loop(lower, upper, body_fun)")
    if _version.at_least(0, 6):
        warnings.warn("nl.dynamic_range is deprecated since NKI 0.6.0: use "
                      "nl.fori_loop(lower, upper, body_fun, step=1)", DeprecationWarning,
                      stacklevel=2)
    s = _int_value(start, "nl.dynamic_range")
    if stop is None:
        return _ops._loop("sequential", (0, s), int)
    return _ops._loop("sequential", (s, _int_value(stop, "nl.dynamic_range"),
                                     _int_value(step, "nl.dynamic_range")), int)


def fori_loop(lower, upper, body_fun, step=1):
    """``nl.fori_loop(lower, upper, body_fun, step=1)`` (0.6.0): calls ``body_fun(i)`` for each
    ``i`` in ``range(lower, upper, step)``, in order (a run-time loop on the device; nkisim runs
    it eagerly). Bounds may be registers."""
    _need(0, 6, "fori_loop")
    _not_in_no_reorder("nl.fori_loop")
    lo = _int_value(lower, "nl.fori_loop")
    hi = _int_value(upper, "nl.fori_loop")
    st = _int_value(step, "nl.fori_loop")
    if st == 0:        # (jax's fori_loop takes init_val 4th: here it is the step)
        raise nki_error("nkisim_invalid_argument", api="nl.fori_loop",
                        why="the step (4th argument; nl.fori_loop(lower, upper, body_fun, "
                            "step=1) has no init_val) must not be zero")
    for i in _ops._loop("sequential", (lo, hi, st), int, api="nl.fori_loop"):
        body_fun(i)


def while_loop(init, body_fun):
    """``nl.while_loop(init, body_fun)`` (0.6.0, replaces bare ``while reg:``): runs
    ``body_fun`` while the condition is non-zero; the condition starts as ``init`` (a register
    or an int) and is what ``body_fun`` returns, or, when it returns None, ``init`` re-read (a
    register the body updates). The stub's exact contract is not in the spec: this is nkisim's
    reading of the signature."""
    _need(0, 6, "while_loop")
    _not_in_no_reorder("nl.while_loop")
    cond = init
    takes_arg = _n_positional(body_fun) >= 1
    for _ in _ops._loop("sequential", (0, 1 << 62), int):
        if not _int_value(cond, "nl.while_loop"):
            break
        r = body_fun(cond) if takes_arg else body_fun()
        cond = init if r is None else r


def _n_positional(fn) -> int:
    try:
        return builtins.sum(1 for p in inspect.signature(fn).parameters.values()
                            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    except (TypeError, ValueError):
        return 0


def _need(major, minor, name, owner="module 'nki.language'"):
    """``name`` of ``owner`` exists from NKI ``major.minor`` on: an AttributeError naming the
    release under an older NKISIM_NKI_VERSION, as the older stubs lack it."""
    if not _version.at_least(major, minor):
        now = ".".join(map(str, _version.current()))
        raise AttributeError(f"{owner} has no attribute '{name}' (added in NKI "
                             f"{major}.{minor}.0; NKISIM_NKI_VERSION={now})")


def ds(start, size):
    """``nl.ds(start, size)``: the slice ``start:start + size``."""
    return DynSlice(start, size)


# ---------------------------------------------------------------------------------------------
# SPMD / LNC (§2.1): ``kernel[lnc]`` launches lnc program instances along axis 0


def program_id(axis=0):
    return _ops.program_id(axis)


def num_programs(axes=0):
    return _ops.num_programs(axes)


def program_ndim():
    return _ops.program_ndim()


# ---------------------------------------------------------------------------------------------
# convenience wrappers (0.3.0+, experimental; §2.3)


def load(src, dtype=None):
    """HBM -> a new SBUF tile."""
    return _ops.load(src, dtype=dtype)


def store(dst, value):
    """An SBUF tile -> HBM. A PSUM ``value`` is not supported (RN 2.29 known issue: copy it to
    SBUF with nisa.tensor_copy first); Beta 1 inserted that copy itself."""
    if isinstance(value, Tensor) and value.root.buffer == "psum":
        raise nki_error("err_unsupported_memory", param="value", api="nl.store",
                        expected="sbuf", got="psum")
    return _ops.store(dst, value)


def matmul(x, y, transpose_x=False):
    """``x.T @ y`` (``transpose_x=True``) or ``x @ y`` into a new PSUM tile. It cannot
    accumulate into an existing tile: use nisa.nc_matmul (STUB-R32). In 0.3 and 0.4 it "fails
    unless transpose_x=True" (RN 2.29/2.30 known issue; spec §2.3)."""
    if not transpose_x and not _version.at_least(0, 5):
        raise NotImplementedError(
            "nl.matmul fails unless transpose_x=True in NKI "
            f"{'.'.join(map(str, _version.current()))} (known issue, release notes 2.29/2.30): "
            "pass x already transposed with transpose_x=True, or use nisa.nc_matmul")
    return _matmul(x, y, transpose_x=transpose_x)


def transpose(x, dtype=None):
    """A 2-D tile transposed into a new PSUM tile (STUB-R32)."""
    return _transpose(x, dtype=dtype)


def softmax(x, axis=-1, dtype=None):
    """Softmax over ``axis`` ("def softmax(x, axis=-1, dtype=None)", 0.6.0 stub), which "can
    only be the last contiguous dim(s) of the tile" (Rules.reduce_last_axes)."""
    return _ops.softmax(x, axis, dtype=dtype)


# The rest of the 0.3.0 wrappers (aws-neuron-sdk 03323f7a, SDK 2.29, nki/api/nki/language/
# __init__.py; unchanged through 0.6.0's a3247f5b), in their current signatures.

def all(x, axis, dtype=None):  # noqa: A001 - NKI's name
    """Logical AND over the last free axes; the result has ``x``'s dtype unless ``dtype`` is
    given ("if not specified, it will default to be the same as the data type of the input
    tile"; Beta 1's ``nl.all`` defaulted to bool)."""
    return _ops.all(x, axis, dtype=dtype if dtype is not None else getattr(x, "dtype", None))


def broadcast_to(x, shape, dtype=None):
    """``x`` (SBUF or PSUM) broadcast to ``shape``, which "must have the same rank as x"; "if
    x.shape is already the same as shape, returns x unchanged (or a dtype-cast copy if dtype
    differs)". A partition broadcast is a TensorE matmul with ones (ref §1.8)."""
    shape = _shape(shape, "nl.broadcast_to")
    if isinstance(x, Tensor):
        if len(shape) != len(x.shape):
            raise nki_error("nkisim_shape_mismatch", params=f"x{list(x.shape)}",
                            api="nl.broadcast_to",
                            why=f"the target shape {list(shape)} must have the same rank as x")
        if shape == x.shape:
            if dtype is None or np.dtype(dtype) == x.dtype:
                return x
            return _ops.copy(x, dtype=dtype)
    return _ops.broadcast_to(x, shape=shape, dtype=dtype)


def dropout(x, rate, dtype=None):
    """Zero each element of ``x`` with probability ``rate`` (a scalar or a (P, 1) tile); no
    rescaling. nkisim's random stream is NumPy's, not the device's bits."""
    return _dropout(x, rate, dtype=dtype)


def expand_dims(x, axis):
    """A view of ``x`` with a size-1 axis at ``axis`` (any free position in 0.3+)."""
    return _ops.expand_dims(x, axis)


def gather_flattened(data, indices, axis=0, dtype=None):
    """Per partition, the elements of ``data``'s flattened free dims at ``indices``. The
    docstring does not say what another ``axis`` than the default 0 selects, so only 0 is
    taken (anything else is an error, never a guess)."""
    if axis != 0:
        raise nki_error("nkisim_unsupported", what=f"nl.gather_flattened(axis={axis!r})",
                        why="the docs define only the default axis=0 (gather along the "
                            "flattened free dimensions of each partition)")
    return _ops.gather_flattened(data, indices, dtype=dtype)


def load_transpose2d(src, dtype=None):
    """HBM [F, P] -> a new SBUF tile [P, F], transposed by the DMA."""
    return _ops.load_transpose2d(src, dtype=dtype)


def rand(shape, dtype, buffer=sbuf, name=""):
    """A new tensor of uniform random values in [0, 1) (NumPy's stream, not the device's)."""
    return _ops.rand(_shape(shape, "nl.rand"), dtype, buffer=_check_buffer(buffer, "nl.rand"),
                     name=name)


def random_seed(seed):
    """Seed ``nl.rand``/``nl.dropout``: "a [1,1] tensor on SBUF or PSUM with a 32-bit seed
    value"; the same seed gives the same values."""
    return _ops.random_seed(seed)


def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None):
    """``x / RMS(x) * w`` over ``axis``, ``n`` the count of values (nkisim.lowering.rms_norm)."""
    return _rms_norm(x, w, axis, n, epsilon, dtype=dtype, compute_dtype=compute_dtype)


class no_reorder:
    """``with nl.no_reorder():`` keeps the instructions of the block in program order on the
    device. nkisim runs every instruction in program order anyway, so values are the same; the
    latency estimate does not model the constraint. "Register-based dynamic loops
    (nl.fori_loop, nl.while_loop) are not supported inside a no_reorder block" (0.6.0
    docstring): they are an error there."""

    def __enter__(self):
        run = context.current()
        run.no_reorder += 1
        return self

    def __exit__(self, *exc):
        run = context.maybe_current()
        if run is not None and run.no_reorder:
            run.no_reorder -= 1
        return False


def _not_in_no_reorder(api):
    run = context.maybe_current()
    if run is not None and run.no_reorder:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why="register-based dynamic loops are not supported inside a "
                            "`with nl.no_reorder():` block (nl.no_reorder docstring)")


# 0.4.0 (aws-neuron-sdk 3afa0fdf, SDK 2.30): element-wise abs_max / abs_min, "available only
# on NeuronCore-v4 (trn3) and newer": nkisim simulates trn1 and trn2, where they are an error.

def _nc_v4_only(name):
    def fn(x, y, dtype=None):
        _need(0, 4, name)
        require_nc_version(context.current(), f"nl.{name}", 4)
        raise nki_error("nkisim_unsupported", what=f"nl.{name}",
                        why="nkisim simulates no NeuronCore-v4 target")
    fn.__name__ = fn.__qualname__ = name
    return fn


abs_max = _nc_v4_only("abs_max")
abs_min = _nc_v4_only("abs_min")

# op codes that are not functions (nkisim.ops.OpToken): 0.4.0's bypass and prelu (activate2),
# 0.5.0's average (tensor_partition_reduce)
average = _ops.average
bypass = _ops.bypass
prelu = _ops.prelu


def device_print(print_prefix, tensor):
    """Print ``tensor`` with ``print_prefix`` to stdout, as the simulator does (SIM; on a device
    it goes to $NEURON_RT_DEBUG_OUTPUT_DIR). The prefix must be a string."""
    if not isinstance(print_prefix, str):
        raise nki_error("nkisim_invalid_argument", api="nl.device_print",
                        why=f"print_prefix must be a compile-time string, got "
                            f"{type(print_prefix).__name__}")
    return _ops.device_print(print_prefix, tensor)


# `x: nl.tensor` annotations in nki-library docstrings/signatures; `nl.NkiTensor` (0.3.0 stubs)
tensor = NkiTensor = Tensor


# ---------------------------------------------------------------------------------------------
# names added after 0.3: an AttributeError naming the release under an older
# NKISIM_NKI_VERSION, as the older stubs lack them (spec nki-current §1: 0.4.0 "prelu/bypass",
# 0.5.0 "float8_e8m0fnu"; nki.isa does the same for its ops)

_ADDED = {"bypass": (0, 4), "prelu": (0, 4), "float8_e8m0fnu": (0, 5)}
_LATER = {name: globals().pop(name) for name in _ADDED}


def __getattr__(name):
    if name in _LATER:
        _need(*_ADDED[name], name)
        return _LATER[name]
    raise AttributeError(f"module 'nki.language' has no attribute '{name}'")
