"""Which PSUM elements a matmul initialised: the state behind ``nc_matmul(accumulate=None)``.

NKI 0.3+ ``nc_matmul(dst, ..., accumulate=None)`` "auto-detects: the first write to a PSUM
location overwrites and later writes accumulate, this matches NKI 0.2.0 behavior"; ``True`` adds
("only valid after the location was initialised by a matmul with False"); ``False`` overwrites
(STUB-R32 ``nc_matmul``; shared/spec/nki-current.md §2.4). The docs leave the granularity and
what counts as a "first write" open; the simulator fixed "accumulation into overlapping PSUM
regions (the convolution pattern)" in 0.6.0 (RN 2.32), which suggests per-element tracking. The
policy nkisim follows (spec §6 item 5):

- every PSUM allocation has a per-element "matmul-initialised" flag, clear when it is created;
- a matmul write sets the flags of the elements it writes (``mark``);
- any other write to PSUM (memset, tensor_copy, activation, ...) clears them (``tensor.write``
  calls ``clear``), as does a new ``nl.ndarray``.

The flags live beside the storage, one byte per storage byte, and a view of any tensor (basic,
strided, advanced-indexed) finds its flags at the same byte offsets as its values: aliasing views
share their flags as they share their values. Only allocations a destination-passing matmul
touched carry flags, so the Beta 1 face (``psum += nisa.nc_matmul(...)``) pays nothing.
"""

from __future__ import annotations

import weakref

import numpy as np

# Allocation -> (lowest byte address of its storage, uint8 flags, one per storage byte)
_FLAGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _owner(arr: np.ndarray) -> np.ndarray:
    """The array that owns ``arr``'s memory (through views and ``as_strided`` wrappers)."""
    a = arr
    while True:
        b = a.base
        if isinstance(b, np.ndarray):
            a = b
            continue
        inner = getattr(b, "base", None)          # as_strided's DummyArray keeps the array
        if isinstance(inner, np.ndarray):
            a = inner
            continue
        return a


def _addr(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


def _bounds(arr: np.ndarray) -> tuple[int, int]:
    """The byte range ``arr`` spans (``np.byte_bounds``, which NumPy 2 moved)."""
    lo = hi = _addr(arr)
    for n, s in zip(arr.shape, arr.strides):
        if n == 0:
            return lo, lo
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + arr.itemsize


def _flags_view(t, create: bool):
    """The uint8 flags of view ``t`` (shape ``t._arr.shape``), or None when untracked."""
    root = t.root
    entry = _FLAGS.get(root)
    if entry is None:
        if not create:
            return None
        owner = _owner(t._arr)
        lo, hi = _bounds(owner)
        entry = (lo, np.zeros(hi - lo, np.uint8))
        _FLAGS[root] = entry
    lo, flags = entry
    arr = t._arr
    return np.ndarray(arr.shape, np.uint8, buffer=flags, offset=_addr(arr) - lo,
                      strides=arr.strides)


def tracked(root) -> bool:
    return root in _FLAGS


def get(t) -> np.ndarray:
    """Per element of view ``t``: did a matmul initialise it (bool array of ``t.shape``)?"""
    f = _flags_view(t, create=False)
    if f is None:
        return np.zeros(t.shape, bool)
    f = f.view(np.bool_)
    f = f[t._idx] if t._idx is not None else f.copy()
    return f.reshape(t.shape)


def _set(t, value: int, where=None, create=False) -> None:
    f = _flags_view(t, create=create)
    if f is None:
        return
    if t._idx is None:
        if where is None:
            f[...] = value
        else:
            f[np.broadcast_to(where, f.shape)] = value
        return
    if where is None:
        f[t._idx] = value
    else:
        shp = np.broadcast_shapes(*(np.shape(i) for i in t._idx))
        idx = tuple(np.broadcast_to(i, shp) for i in t._idx)
        m = np.broadcast_to(where, shp)
        f[tuple(i[m] for i in idx)] = value


def mark(t) -> None:
    """A matmul wrote every element of ``t``: they are matmul-initialised."""
    _set(t, 1, create=True)


def clear(t, mask=None) -> None:
    """A non-matmul instruction wrote ``t`` (under ``mask``): its elements are no longer
    matmul-initialised."""
    _set(t, 0, where=mask)
