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

The flags live beside the storage, one byte per element of the allocation, and a view of any
tensor (basic, strided, ``.ap()``, advanced-indexed) finds its flags at the same offsets as its
values: views of one allocation share its flags. Only allocations a
destination-passing matmul touched carry flags, so the Beta 1 face (``psum +=
nisa.nc_matmul(...)``) pays nothing.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from . import dtypes
from .errors import nki_error

# Allocation -> uint8 flags, one per element of its partitions' storage
_FLAGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Allocations whose every flag is set: an accumulator after the first matmul of its group,
# the commonest state, answered (``state``) and kept (``mark``) without a pass over the flags
# (issue 12: the passes cost the current dialect's nc_matmul about 15 us of its overhead)
_FULL: weakref.WeakSet = weakref.WeakSet()


def _flags_view(t, create: bool):
    """The uint8 flags of view ``t`` (shape ``t._arr.shape``), or None when untracked.

    The flags of an allocation are one byte per element of its own partitions: (P, elements per
    partition), row-major like the storage. A view finds its flags from its byte offset
    (``_off``, counted from the start of the memory the storage lives in: the tile itself, or
    the whole SBUF/PSUM for a direct ``address=`` allocation, whose partitions are
    ``row_bytes`` apart there): a partition and a byte inside the row; its strides map the same
    way. One flag per element (not per byte) keeps a whole-tile view contiguous, so testing it
    is one fast pass."""
    root = t.root
    flags = _FLAGS.get(root)
    if flags is None and not create:
        return None
    arr = t._arr
    isz = dtypes.storage(root.dtype).itemsize
    nbytes = math.prod(root.shape) * isz
    R = root.row_bytes or nbytes
    rowlen = nbytes // max(1, int(root.shape[0])) if getattr(root, "direct", False) else R
    if flags is None:
        flags = np.zeros(nbytes // isz, np.uint8)
        _FLAGS[root] = flags
    p, f = divmod(t._off - getattr(root, "base_off", 0), R)
    strides = tuple((s // R) * rowlen + s % R if s >= R else s for s in arr.strides)
    try:
        if f % isz or any(st % isz for st in strides) or arr.itemsize != isz:
            raise ValueError
        return np.ndarray(arr.shape, np.uint8, buffer=flags, offset=(p * rowlen + f) // isz,
                          strides=tuple(st // isz for st in strides))
    except (ValueError, TypeError):
        raise nki_error("nkisim_unsupported", what=f"PSUM accumulation state of view of "
                        f"`{root.name}`", why="the view's layout is not a partition x row "
                        "view of its allocation's elements") from None


def tracked(root) -> bool:
    return root in _FLAGS


def get(t) -> np.ndarray:
    """Per element of view ``t``: did a matmul initialise it (bool array of ``t.shape``)? A view
    of the flags where it can be (no copy): read it before ``mark``/``clear`` change them."""
    f = _flags_view(t, create=False)
    if f is None:
        return np.zeros(t.shape, bool)
    f = f.view(np.bool_)
    f = f[t._idx] if t._idx is not None else f
    return f.reshape(t.shape)


def state(t):
    """(every element of view ``t`` matmul-initialised, any of them, the flags of ``get`` or
    None when every one is set)."""
    if t.root in _FULL:
        return True, True, None
    f = get(t)
    every = bool(f.all())
    return every, every or bool(f.any()), f


def _whole(t) -> bool:
    """View ``t`` is every element of its allocation, each once."""
    return t._idx is None and t._arr is not None and t._arr.size == math.prod(t.root.shape)


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
    root = t.root
    if root in _FULL:
        return
    _set(t, 1, create=True)
    if _whole(t):
        _FULL.add(root)


def clear(t, mask=None) -> None:
    """A non-matmul instruction wrote ``t`` (under ``mask``): its elements are no longer
    matmul-initialised."""
    _FULL.discard(t.root)
    _set(t, 0, where=mask)
