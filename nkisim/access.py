"""Access-pattern views: ``tensor.ap(pattern=[[stride, count], ...], offset=...)`` (nki 0.2+).

The pattern addresses the tensor's *storage*, not the view it is called on (nki-current.md §2.0
item 3, LG warning). Strides and the offset count elements of the view's dtype (the tensor's, or
``dtype=`` to reinterpret the bytes). On SBUF/PSUM the first pair walks partitions: its stride
must equal the storage's free-element count (one partition row), the offset splits into a start
partition and an offset inside the row, and the rest must stay inside the row. On HBM the
storage is linear. A plain pattern is a strided NumPy view of the storage (writes land in it);
``vector_offset`` makes the first dimension indirect, which is an advanced-indexed view (a gather
on read, a scatter on write).
"""

from __future__ import annotations

import math
import weakref

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import checks, context, dtypes
from .errors import nki_error
from .indexing import whole
from .tensor import INDIRECT_ROWS, Tensor, _addr, _coarse_shadow, read

# an indirect view -> the shape of the vector_offset tile it was made with (dma_transpose reads
# a 2-D one column-major: column_major_rows)
VECTOR_OFFSET_SHAPE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def column_major_rows(v: Tensor) -> Tensor:
    """An indirect ``.ap(vector_offset=idx)`` view whose rows follow ``idx.T.flatten()``
    instead of ``idx.flatten()`` when ``idx`` is 2-D with several columns: dma_transpose's
    "Hardware uses column-major flattening: flat_indices = indices.T.flatten()" (0.6.0
    docstring, gather_transpose_2d_kernel; "Indirect transpose effectively performs ...
    flat_indices = indices.T.flatten()[:src.shape[0]]"). Other views are returned as they are;
    dma_copy's gathers keep the row-major order (their docs state none)."""
    shape = VECTOR_OFFSET_SHAPE.get(v) if v._idx is not None else None
    if shape is None or len(shape) != 2 or shape[1] <= 1:
        return v
    perm = np.arange(shape[0] * shape[1]).reshape(shape).T.reshape(-1)
    w = Tensor(v._arr, v._ws, v.root, v.dtype, v.shape, v.paxis, (v._idx[0][perm],), v._off)
    if v._oob is not None:
        w._oob = (np.asarray(v._oob[0])[perm], v._oob[1])
    return w


def _owner(a: np.ndarray) -> np.ndarray:
    """The array that owns the memory ``a`` views. A view made by ``as_strided`` (an earlier
    ``.ap()``: nki-library's TensorView calls ``.ap()`` on the result of ``.ap()``) has a
    ``numpy.lib.stride_tricks.DummyArray`` as its base, which keeps the array it views as its
    own ``base``: follow it too, or the storage looks like the strided view."""
    while True:
        b = a.base
        if not isinstance(b, np.ndarray):
            b = getattr(b, "base", None)
            if not isinstance(b, np.ndarray):
                return a
        a = b


def _bytes_of(owner: np.ndarray, name: str) -> np.ndarray:
    """The memory owner's bytes from its first to its last, as a view (never a copy: writes
    must land). A contiguous owner is its bytes in memory order; a strided one (its elements
    spread over a larger block) spans the block from its first element's address, which the
    pattern's own geometry (partition stride, checked bounds) then addresses."""
    if owner.flags.c_contiguous or owner.flags.f_contiguous:
        flat = owner.ravel(order="K")
        if np.shares_memory(flat[:1], owner):
            return flat.view(np.uint8)
    if owner.size == 0 or any(s < 0 for s in owner.strides):
        raise nki_error("nkisim_unsupported", what=f"ap() of `{name}`",
                        why="its storage has negative strides (a reversed NumPy view)")
    span = sum((n - 1) * s for n, s in zip(owner.shape, owner.strides)) + owner.itemsize
    first = owner[(slice(0, 1),) * owner.ndim].view(np.uint8).reshape(-1)
    return as_strided(first, shape=(span,), strides=(1,))


def _pattern(pattern, api):
    try:
        pairs = [(whole(s, f"{api}'s stride"), whole(c, f"{api}'s count"))
                 for s, c in pattern]
    except (TypeError, ValueError) as e:
        if getattr(e, "nki_code", None):
            raise       # (a fractional stride: `pattern: list[list[int]]`, not truncated)
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"pattern must be a list of [stride, count] pairs, got "
                            f"{pattern!r}") from None
    if not pairs:
        raise nki_error("nkisim_invalid_argument", api=api, why="pattern is empty")
    for s, c in pairs:
        if s < 0 or c < 1:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"strides must be >= 0 and counts >= 1, got {[s, c]}")
    return pairs


def _merged(pairs) -> list:
    """``pairs`` with each level whose stride is the next level's stride times its count
    merged into that one (the same elements in the same order)."""
    out = [list(pairs[0])]
    for s, c in pairs[1:]:
        if out[-1][0] == s * c and len(out) > 1:     # (never into the partition level)
            out[-1] = [s, out[-1][1] * c]
        else:
            out.append([s, c])
    return out


def _offsets(t: Tensor, api) -> np.ndarray:
    """The values of a tile of offsets or indices, flat. One never written is no garbage value
    to carry on: it picks the address read now (the uninitialized-read error, not the
    placeholder value 4 as an index)."""
    if t._ws is not None:
        checks.check_read(context.current(), t, api)
    return np.asarray(read(t, api)).reshape(-1)


def _index_value(x, api) -> int:
    """A dynamic offset's value now (nkisim runs eagerly): a [1, 1] tile, a register or int."""
    if isinstance(x, Tensor):
        v = _offsets(x, api)
        if v.size != 1:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"scalar_offset must hold one value, got {list(x.shape)}")
        return int(v[0])
    for attr in ("value", "_value"):
        v = getattr(x, attr, None)
        if isinstance(v, (int, np.integer)):
            return int(v)
    return int(x)


def access_pattern(t: Tensor, pattern, offset=0, scalar_offset=None, vector_offset=None,
                   indirect_dim=0, dtype=None) -> Tensor:
    api = f"{t.name}.ap"
    root = t.root
    checks.materialize(root)        # the views below index the element-wise shadow
    if t._slots is not None or t._arr is None or (t.paxis not in (0, None)):
        raise nki_error("nkisim_unsupported", what=f"ap() of `{t.name}`",
                        why="tensors with block dimensions have no flat storage to address")
    pairs = _pattern(pattern, api)
    if root.buffer != "hbm" and len(_merged(pairs)) > 5:
        # "a view on top of that storage (a strided access pattern with up to 5 dimensions)"
        # (NKI language guide, NkiTensor): levels that merge (stride = next stride x count)
        # count once
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{len(pairs)} levels, {len(_merged(pairs))} after merging "
                            "contiguous ones: an on-chip access pattern has at most 5 "
                            "dimensions")
    dt = dtypes.normalize(dtype) if dtype is not None else root.dtype
    sdt = dtypes.storage(dt)
    isz = sdt.itemsize
    rsz = dtypes.storage(root.dtype).itemsize
    onchip = root.buffer != "hbm"
    # the storage tensor's logical shape (what trivial strides and indirect_dim refer to)
    rshape = tuple(root.shape)
    off = int(offset)
    dynamic = None
    # "indirect_dim: dimension in ``self.shape`` whose stride scales the indirect scalar/
    # vector offset" (nki.language NkiTensor.ap docs, aws-neuron-sdk @81ce03ae): a view
    # spanning the whole storage (a reshape) counts in its own shape; nki-library's
    # indexed_flatten calls `row_offsets.reshape((1, N)).ap(..., indirect_dim=1)` on a 1-D [N]
    # tensor, and router_topk `expert_affinities.reshape((T * E,)).ap(..., vector_offset=idx,
    # indirect_dim=0)` on a [T, E] one, with element indices
    dshape = tuple(t.shape) if math.prod(t.shape) == math.prod(rshape) and \
        t._idx is None else rshape
    if scalar_offset is not None:
        d = int(indirect_dim)
        if not 0 <= d < len(dshape):
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"indirect_dim {d} out of range for {list(dshape)}")
        dynamic = _index_value(scalar_offset, api)
        off += dynamic * math.prod(dshape[d + 1:]) * rsz // isz
    shape = tuple(c for _, c in pairs)
    if dynamic is not None and root.buffer == "hbm" and not _inside(off, pairs, rshape, rsz,
                                                                    isz):
        # a runtime offset outside the tensor: an error when the DMA moves it, or no move
        # with oob_mode=skip (nki-library indexed_flatten: "a large negative value for invalid
        # offsets to ensure all indices are OOB and skipped"; dma_copy docs, oob_mode)
        return _out_of_bounds(t, pairs, shape, off, dt, sdt, isz, rshape, rsz, dynamic, api)
    if off < 0:
        raise nki_error("nkisim_invalid_argument", api=api, why=f"offset {off} < 0")
    # storage geometry, in bytes
    owner = _owner(t._arr)
    # address of the storage's first byte: a view's _off counts from the start of the memory it
    # lives in, which for a direct allocation (address=) is the whole SBUF/PSUM byte array
    start = _addr(t._arr) - t._off + root.base_off
    if onchip:
        P = rshape[0]
        row_bytes = math.prod(rshape[1:]) * rsz   # the tensor's bytes per partition
        R = root.row_bytes                        # storage bytes between partitions
        ps = pairs[0][0]
        if ps * isz != row_bytes and not (pairs[0][1] == 1):
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"the partition stride must equal the storage's free-element "
                                f"count ({row_bytes // isz} {dtypes.name(dt)} elements of "
                                f"`{t.name}`), got {ps}")
        p0, f0 = divmod(off * isz, row_bytes)
        inner = sum((c - 1) * s * isz for s, c in pairs[1:])
        if p0 + pairs[0][1] > P or f0 + inner + isz > row_bytes:
            return _unusable(t, shape, dt, 0, nki_error(
                "nkisim_invalid_argument", api=api,
                why=f"pattern {[list(p) for p in pairs]} at offset {offset} reaches "
                    f"outside `{t.name}` {list(rshape)} (partitions "
                    f"{p0}..{p0 + pairs[0][1] - 1}, bytes {f0}..{f0 + inner + isz - 1}"
                    f" of {row_bytes} per partition)"))
        byte0 = p0 * R + f0
        strides = (R,) + tuple(s * isz for s, _ in pairs[1:])
    else:
        total = math.prod(rshape) * rsz
        byte0 = off * isz
        ext = sum((c - 1) * s * isz for s, c in pairs)
        if byte0 + ext + isz > total:
            return _unusable(t, shape, dt, None, nki_error(
                "nkisim_invalid_argument", api=api,
                why=f"pattern {[list(p) for p in pairs]} at offset {offset} reaches "
                    f"byte {byte0 + ext + isz} of `{t.name}`, which has {total}"))
        strides = tuple(s * isz for s, _ in pairs)
    base = _bytes_of(owner, t.name)
    first = start - _addr(owner) + byte0
    if vector_offset is not None:
        return _indirect(t, pairs, shape, strides, first, base, sdt, dt, vector_offset,
                         indirect_dim, dshape, rsz, isz, onchip, api)
    arr = as_strided(base[first:first + isz].view(sdt), shape=shape, strides=strides)
    # the shadow (epoch of the last write per element of the storage tensor's dtype)
    w = None
    if root.shadow is not None:
        if isz == rsz or all(st % rsz == 0 for st in strides[onchip:]) and byte0 % rsz == 0:
            sh = root.shadow
            flat = sh.reshape(-1)
            if onchip:
                e0 = p0 * (row_bytes // rsz) + f0 // rsz
                wst = (row_bytes // rsz * 4,) + tuple(st // rsz * 4 for st in strides[1:])
            else:
                e0 = byte0 // rsz
                wst = tuple(st // rsz * 4 for st in strides)
            w = as_strided(flat[e0:e0 + 1], shape=shape, strides=wst)
    # _off counts from the memory the storage lives in, as for every other view (a direct
    # allocation's views count from the whole SBUF/PSUM byte array: regions, .ap() of a view)
    v = Tensor(arr, w, root, dt, shape, 0 if onchip else None, None, byte0 + root.base_off)
    if w is None and root.shadow is not None:
        v._w = _bytes_shadow(root, byte0, strides, shape, rsz, onchip, row_bytes if onchip
                             else 0)
        _coarse_shadow(v)
        v._w = None
    return v


def _unusable(t, shape, dt, paxis, error) -> Tensor:
    """A static pattern that reaches outside the tensor: a view every instruction that reads or
    writes it rejects with ``error`` (nkisim.tensor._check_oob), not an error when it is made.
    ``.ap()`` only describes an access; AWS's CI-tested output_projection_tkg.py
    (_output_projection_tkg_transpose_out_impl, nki-library d2ad3a5) builds its ``stationary``
    view for an h_2 index one past the end and then skips the matmul under
    ``if h_2_idx < cfg.h_2_size`` ("the last psum tile may be 'incomplete'"), as
    attention_block_tkg's model configs with H_actual=2880 do."""
    v = Tensor(np.zeros(shape, dtypes.storage(dt)), None, t.root, dt, shape, paxis, None, 0)
    v._oob = (np.ones(shape, bool), {"error": error})
    return v


def _inside(off, pairs, rshape, rsz, isz) -> bool:
    """Does an HBM pattern starting ``off`` elements in stay inside the storage?"""
    ext = sum((c - 1) * st for st, c in pairs)
    return off >= 0 and (off + ext + 1) * isz <= math.prod(rshape) * rsz


def _out_of_bounds(t, pairs, shape, off, dt, sdt, isz, rshape, rsz, dynamic, api):
    """An HBM ``.ap()`` view some of whose elements a runtime offset put outside the storage:
    an advanced-indexed view (out-of-bound elements read element 0) flagged with them, as an
    indirect DMA's out-of-bound rows are (nkisim.tensor._check_oob: an error unless the
    DMA's oob_mode=skip drops them)."""
    total = math.prod(rshape) * rsz
    if total % isz:
        raise nki_error("nkisim_unsupported", what="an unaligned dynamic access",
                        why=f"the storage is not a whole number of {isz}-byte elements")
    elem = np.full((), off, np.int64)
    for st, c in pairs:
        elem = elem[..., None] + np.arange(c, dtype=np.int64) * st
    bad = (elem < 0) | (elem >= total // isz)
    base = _bytes_of(_owner(t._arr), t.name)
    lo = _addr(t._arr) - t._off - _addr(base)        # the storage's first byte inside `base`
    storage = base[lo:lo + total].view(sdt)
    w = t.root.shadow.reshape(-1) if t.root.shadow is not None and isz == rsz else None
    v = Tensor(storage, w, t.root, dt, shape, None, (np.where(bad, 0, elem),), 0)
    v._oob = (bad, {"indirect": f"{api}: scalar_offset {dynamic} puts {int(bad.sum())} of "
                                f"{bad.size} elements outside `{t.name}` {list(rshape)} "
                                "(pass oob_mode=nisa.oob_mode.skip to skip them)"})
    return v


def _bytes_shadow(root, byte0, strides, shape, rsz, onchip, row_bytes):
    """The storage tensor's shadow elements a reinterpreting view covers (bounding range)."""
    flat = root.shadow.reshape(-1)
    if onchip:
        p0, f0 = divmod(byte0, root.row_bytes)
        lo = f0 // rsz
        hi = (f0 + sum((c - 1) * s for s, c in zip(strides[1:], shape[1:]))) // rsz + 1
        per = row_bytes // rsz
        return root.shadow.reshape(root.shadow.shape[0], -1)[p0:p0 + shape[0], lo:hi] \
            if per else None
    lo = byte0 // rsz
    hi = (byte0 + sum((c - 1) * s for s, c in zip(strides, shape))) // rsz + 1
    return flat[lo:hi]


def _indirect(t, pairs, shape, strides, first, base, sdt, dt, vector_offset, indirect_dim,
              rshape, rsz, isz, onchip, api):
    """``vector_offset``: row i of the first pattern dimension starts ``vector_offset[i] *
    stride(indirect_dim)`` elements further. An advanced-indexed view of the storage."""
    if not isinstance(vector_offset, Tensor):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why="vector_offset must be an SBUF tile of indices")
    if onchip:
        raise nki_error("nkisim_unsupported", what="vector_offset on an SBUF/PSUM tensor",
                        why="nkisim gathers/scatters HBM tensors only")
    idx = _offsets(vector_offset, api).astype(np.int64)
    if idx.size != shape[0]:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"vector_offset has {idx.size} indices for a first dimension of "
                            f"{shape[0]}")
    d = int(indirect_dim)
    total = math.prod(rshape) * rsz
    lo = _addr(t._arr) - t._off - _addr(base)        # the storage's first byte inside `base`
    byte = (first - lo) + idx * (math.prod(rshape[d + 1:]) * rsz)
    for st, c in zip(strides[1:], shape[1:]):
        byte = byte[..., None] + np.arange(c) * st
    bad = (byte < 0) | (byte + isz > total)
    if (np.where(bad, 0, byte) % isz).any() or total % isz:
        raise nki_error("nkisim_unsupported", what="an unaligned indirect access",
                        why=f"offsets must be multiples of {isz} bytes")
    storage = base[lo:lo + total].view(sdt)
    w = t.root.shadow.reshape(-1) if t.root.shadow is not None and isz == rsz else None
    v = Tensor(storage, w, t.root, dt, shape, None, (np.where(bad, 0, byte) // isz,), 0)
    VECTOR_OFFSET_SHAPE[v] = tuple(vector_offset.shape)
    if bad.any():
        # Out-of-bound rows are flagged, not raised here: the DMA that moves the view raises
        # (oob_mode.error, the default) or leaves them unmoved (oob_mode.skip): "oob_mode.skip:
        # Silently skips any operations involving out-of-bounds indices ... when using indirect
        # gather/scatter operations" (nki.isa.dma_copy docs, aws-neuron-sdk 1db4d74
        # nki/api/nki/isa/__init__.py). AWS's kernels rely on it: nki-library's
        # attention_block_tkg _update_block_cache_batched scatters K/V rows with
        # `vector_offset=idx_tile, ..., oob_mode=oob_mode.skip  # skip writes for invalid batch
        # (position_id = uint32_max)`, and moe_cte gathers hidden_states rows with token indices
        # of -1 for padding under `oob_mode.skip if skip_dma.skip_token`.
        row = int(np.argwhere(bad.reshape(bad.shape[0], -1).any(axis=1))[0, 0])
        msg = str(nki_error("err_tensor_access_out_of_bound", name=t.name, dim=d,
                            lo=int(idx[row]), hi=int(idx[row]), size=rshape[d]))
        v._oob = (bad, {"indirect": f"{msg} (vector_offset row {row}; pass "
                                    "oob_mode=nisa.oob_mode.skip to skip such rows)"})
    return v


def vector_select(t: Tensor, dim: int, vector_offset) -> Tensor:
    """``t.vector_select(0, idx)``: an advanced-indexed view whose row i is row ``idx[i]`` of
    ``t``'s first dimension (HBM tensors: the DMA engine's indirect rows)."""
    api = f"{t.name}.vector_select"
    if dim != 0:
        raise nki_error("nkisim_unsupported", what="vector_select on a dimension other than 0",
                        why="the indirect DMA indexes rows (nki-library TensorView: 'dim=0')")
    if t.root.buffer != "hbm":
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"`{t.name}` is an {t.root.buffer.upper()} tensor: vector_select "
                            "is \"only supported on HBM tensors\" (NkiTensor.vector_select)")
    if t._idx is not None or t._arr is None:
        raise nki_error("nkisim_unsupported", what=f"vector_select of `{t.name}`",
                        why="nkisim gathers/scatters rows of plain HBM views only")
    if not isinstance(vector_offset, Tensor):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why="vector_offset must be an SBUF tile of indices")
    idx = _offsets(vector_offset, api).astype(np.int64)
    n = t.shape[0]
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        i = int(idx[bad][0])
        raise nki_error("err_tensor_access_out_of_bound", name=t.name, dim=0, lo=i, hi=i,
                        size=n)
    rest = tuple(np.arange(c) for c in t.shape[1:])
    key = np.ix_(idx, *rest) if rest else (idx,)
    v = Tensor(t._arr, t._w, t.root, t.dtype, (idx.size,) + tuple(t.shape[1:]), None,
               tuple(key), t._off)
    INDIRECT_ROWS.add(v)
    return v


def dynamic_select(t: Tensor, dim: int, index) -> Tensor:
    """``t.select(dim, idx)`` with ``idx`` an NkiTensor holding one integer (0.5+ stub: "performs
    dynamic indirect selection where the index is resolved at runtime"; "only one dynamic
    select per tensor (no chaining)"; "Dynamic on-chip: dim must not be 0"): the view with
    dimension ``dim`` removed at the index's value now (nkisim runs eagerly), an indirect
    (advanced-indexed) view, so ``is_indirect()`` is True. An index outside the dimension is
    the out-of-bound access the DMA would report."""
    api = f"{t.name}.select"
    if t._idx is not None or t._arr is None:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why="only one dynamic select per tensor (no chaining): this view is "
                            "already indirect (check is_indirect())")
    if t.root.buffer != "hbm" and dim == 0:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why="a dynamic select on an on-chip tensor cannot take the partition "
                            "dimension (0)")
    v = _index_value(index, api)
    n = t.shape[dim]
    if not 0 <= v < n:
        raise nki_error("err_tensor_access_out_of_bound", name=t.name, dim=dim, lo=v, hi=v,
                        size=n)
    if len(t.shape) <= 2 and t.root.buffer != "hbm":
        # an on-chip view keeps 2 dimensions: the selected one stays, at size 1, as a static
        # select and an integer index keep it (nki-current.md §2.0, "an integer on dim 0 keeps
        # it at size 1"; SBUF and PSUM tensors "are always at least 2-D", language guide)
        key = list(np.ix_(*[np.arange(c) if i != dim else np.array([v])
                            for i, c in enumerate(t.shape)]))
        shape = tuple(c if i != dim else 1 for i, c in enumerate(t.shape))
    else:
        others = [np.arange(c) for i, c in enumerate(t.shape) if i != dim]
        grids = list(np.ix_(*others)) if others else []
        key = grids[:dim] + [np.int64(v)] + grids[dim:]
        shape = tuple(c for i, c in enumerate(t.shape) if i != dim)
    return Tensor(t._arr, t._w, t.root, t.dtype, shape, t.paxis if dim != 0 else None,
                  tuple(key), t._off)
