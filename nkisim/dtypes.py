"""NKI data types, the promotion table, and casts (ref §1.3).

NKI dtypes are NumPy dtypes (as in the 2.26 stubs): ``nl.float32 is np.float32``, bf16 and fp8 come
from ml_dtypes. tfloat32 is an opaque 4-byte type in the stubs; nkisim stores it as float32 with the
mantissa rounded to 10 bits (1S, 8E, 10M) on every write.

Casts round to nearest even (ref §1.3 "RNE on all NeuronCores"). Float -> integer casts round to
nearest even and saturate at the integer range: the reference is silent; saturating RNE is what
accelerator conversion units do (and what keeps a poisoned NaN from becoming an arbitrary integer,
NaN converts to 0).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

float32 = np.float32
float16 = np.float16
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
# nki 2.28 / 0.5.0 (0.6.0 stub: "float8_e4m3fn ... Extended range: no inf, NaN represented by
# 0bS111'1111"; "float8_e8m0fnu ... (0S,8E,0M) - unsigned, NaN represented by 0xFF"; both in
# shared_constant's "Supported element types"): ml_dtypes' types of those names. Storable and
# castable like the other fp8 types (engines read them as fp32); nc_matmul does not take them
# (its dtype table is nkisim.engines').
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
tfloat32 = np.dtype("V4")
int8, int16, int32 = np.int8, np.int16, np.int32
uint8, uint16, uint32 = np.uint8, np.uint16, np.uint32
bool_ = np.bool_

F32 = np.dtype(np.float32)
TF32 = np.dtype("V4")

FLOATS = {np.dtype(t) for t in (np.float32, np.float16, bfloat16, float8_e4m3, float8_e5m2,
                                 float8_e4m3fn, float8_e8m0fnu)}
FP8 = {float8_e4m3, float8_e5m2, float8_e4m3fn, float8_e8m0fnu}
FLOATS.add(TF32)
INTS = {np.dtype(t) for t in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32)}
SUPPORTED = FLOATS | INTS | {np.dtype(np.bool_)}
SIXTEEN_BIT = {np.dtype(np.float16), bfloat16}

_NAMES = {TF32: "tfloat32"}


def normalize(dtype) -> np.dtype:
    """``np.dtype`` of an NKI dtype given as a type, a dtype, or a name ("bfloat16")."""
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, str):
        named = {"bfloat16": bfloat16, "float8_e4m3": float8_e4m3, "float8_e5m2": float8_e5m2,
                 "tfloat32": TF32, "tf32": TF32, "bf16": bfloat16, "fp16": np.dtype(np.float16),
                 "fp32": F32, "fp8_e4m3": float8_e4m3, "fp8_e5m2": float8_e5m2,
                 "float8_e4m3fn": float8_e4m3fn, "float8_e8m0fnu": float8_e8m0fnu}
        if dtype in named:
            return named[dtype]
        try:
            return np.dtype(dtype)
        except TypeError:
            import difflib
            close = difflib.get_close_matches(
                dtype, ["float32", "float16", "int32", "int16", "int8", "uint32", "uint16",
                        "uint8", "bool"] + list(named), n=1, cutoff=0.6)
            e = TypeError(f"data type {dtype!r} is not an NKI dtype"
                          + (f": did you mean {close[0]!r} (nl.{close[0]})?" if close else
                             " (use nl.float32, nl.bfloat16, ...)"))
            e.nki_code = "nkisim_unknown_dtype"     # (a user error: nkisim run's short trace)
            raise e from None
    return np.dtype(dtype)


def name(dtype) -> str:
    try:
        return _NAMES[dtype]
    except (KeyError, TypeError):
        d = normalize(dtype)
        n = _NAMES.get(d) or d.name
        try:
            _NAMES[dtype] = n
        except TypeError:
            pass
        return n


def storage(dtype) -> np.dtype:
    """The NumPy dtype the bytes are stored in (tfloat32 is stored as float32)."""
    d = normalize(dtype)
    return F32 if d == TF32 else d


def itemsize(dtype) -> int:
    return normalize(dtype).itemsize


def is_float(dtype) -> bool:
    return normalize(dtype) in FLOATS


def floating(dt: np.dtype) -> bool:
    """Is an array dtype a floating-point one (NumPy's, or ml_dtypes' bfloat16/fp8, whose kind
    is "V")? For the casts to integers, which round to nearest and saturate."""
    return dt.kind == "f" or dt in FLOATS


def is_int(dtype) -> bool:
    d = normalize(dtype)
    return d in INTS or d == np.dtype(np.bool_)


def poison(dtype):
    """The value new (never written) memory holds: NaN for floats, a sentinel for ints.

    The sentinel 4 matches the new NKI simulator's choice (ref §4.2); nkisim's uninitialized-read
    check does not depend on it (it tracks writes separately).
    """
    return np.nan if is_float(dtype) else 4


def _round_tf32(x: np.ndarray) -> np.ndarray:
    """Round float32 to tfloat32 precision (10 mantissa bits), nearest even."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0xFFF + lsb) >> 13) << 13
    out = (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), out, x)


def cast(values, dtype) -> np.ndarray:
    """Cast engine results (normally float32) to ``dtype`` with the hardware's rounding."""
    d = normalize(dtype)
    arr = np.asarray(values)
    if d == TF32:
        return _round_tf32(arr.astype(np.float32))
    if arr.dtype == d:
        return arr
    if d in INTS and floating(arr.dtype):
        # (ml_dtypes' bfloat16 and fp8 have kind "V": without the FLOATS test a bf16 value was
        # truncated and wrapped, 300.0 -> int8 44; the engines widen to fp32 exactly first, "an
        # intermediate FP32 cast when input and output data types differ", Beta 1 isa docs)
        info = np.iinfo(d)
        a = np.rint(arr.astype(np.float64))
        a = np.nan_to_num(a, nan=0.0, posinf=info.max, neginf=info.min)
        return np.clip(a, info.min, info.max).astype(d)
    if d == np.dtype(np.bool_):
        return arr != 0
    with np.errstate(over="ignore", invalid="ignore"):
        return arr.astype(d)


def copy_values(vals: np.ndarray, dst_dtype) -> np.ndarray:
    """What a copy (DMA or an engine's tensor_copy) hands ``dtypes.cast`` for ``dst_dtype``:
    between two different integer dtypes, the values as fp32, so the cast rounds and saturates
    ("bit-accurate copy when input and output data types are the same or ... intermediate FP32
    cast when input and output data types differ", isa tensor_copy; "first casting from
    src.dtype to float32, then from float32 to dst.dtype", isa dma_copy): int32 40000 is int16
    32767, not the low bits' -25536. Anything else unchanged."""
    if vals.dtype.kind in "iu":
        d = normalize(dst_dtype)
        if d.kind in "iu" and d != vals.dtype:
            return vals.astype(np.float32)
    return vals


def to_f32(arr: np.ndarray) -> np.ndarray:
    """Engines compute in fp32 (ref §1.3): upcast an operand."""
    if arr.dtype == F32:
        return arr
    return arr.astype(np.float32)


# ---- type promotion (ref §1.3 "NKI Type Promotion") ----
_FLOAT_RANK = {  # width order used for (float, float) promotion
    np.dtype(float8_e4m3): 1, np.dtype(float8_e5m2): 1, float8_e4m3fn: 1, float8_e8m0fnu: 1,
    bfloat16: 2,
    np.dtype(np.float16): 2, TF32: 3, F32: 4,
}


def promote(a, b) -> np.dtype:
    """The NKI promoted dtype of two tile dtypes (ref §1.3)."""
    if a is b and isinstance(a, np.dtype):
        return a                      # (the common case: one dtype, no lookups)
    a, b = normalize(a), normalize(b)
    if a == b:
        return a
    af, bf = a in FLOATS, b in FLOATS
    if af and not bf:
        return a
    if bf and not af:
        return b
    if af and bf:
        pair = {a, b}
        if pair == {np.dtype(np.float16), bfloat16}:
            return F32                                  # (fp16, bf16) -> fp32
        if pair <= FP8:
            # (fp8_e4m3, fp8_e5m2) -> bf16 (ref §1.3); two other fp8 types alike (nkisim's
            # choice: the table predates float8_e4m3fn / float8_e8m0fnu)
            return bfloat16
        return a if _FLOAT_RANK[a] >= _FLOAT_RANK[b] else b
    # (int, int)
    if a == np.dtype(np.bool_):
        return b
    if b == np.dtype(np.bool_):
        return a
    if {a, b} == {np.dtype(np.int32), np.dtype(np.uint32)}:
        return F32                                      # (int32, uint32) -> float32
    r = np.promote_types(a, b)
    if r.itemsize > 4:
        return F32
    return r


def scalar_dtype(value) -> np.dtype:
    """Weakly-typed Python scalars: bool -> uint8, int -> int32, float -> float32 (ref §1.3)."""
    if isinstance(value, (bool, np.bool_)):
        return np.dtype(np.uint8)
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.generic):
        return np.dtype(np.int32)
    if isinstance(value, np.generic):
        return value.dtype
    return F32
