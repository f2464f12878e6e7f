"""Indirect (dynamic) indexing: an HBM tensor indexed by an SBUF tile of integers.

``nl.load(data[idx_tile, i_f])``, ``nl.store(data[idx_tile[i_p, 0], i_f], ...)``,
``nisa.dma_copy(src=t[idx_tile, iy], dst=..., oob_mode=...)``, ``nl.atomic_rmw(t[idx_tile, ix],
...)`` (aws-neuron-sdk 1db4d74e nki/test/test_nki_nl_load_store_indirect.py,
test_nki_isa_dma_copy.py, test_nki_nl_atomic_rmw.py; nki/api/nki/isa dma_copy's ``oob_mode``).

The index tile's values are read when the view is made, which in an eager interpreter is when the
DMA that uses it runs. The view is an ordinary advanced-index view; the index tiles it read are
remembered (weakly) so the DMA's trace instruction lists them among the regions it reads.

Out of bounds: with ``oob_mode.error`` (the default, and for nl.load/nl.store) the access raises
``IndexError`` with the message AWS's doc tests expect, NumPy's for the flattened tensor: ``index
66048 is out of bounds for axis 0 with size 65536`` (row 129 of a (128, 512) tensor; the first
out-of-bound element in the index order); an element outside its axis but inside the tensor gets
NumPy's message for that axis. With ``oob_mode.skip`` those elements are not moved.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import checks, context, dtypes
from .errors import nki_error, shape_str
from .indexing import IndexExpr
from .tensor import Tensor, _check_oob, _full_idx, poisoned, read, values, write

# view -> the index tiles it was made with
INDEX_TILES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _index_values(t, run) -> np.ndarray:
    if not dtypes.is_int(t.dtype) or t.dtype == np.dtype(np.bool_):
        raise nki_error("nkisim_operand_dtype", param="index", api="indirect indexing",
                        dtype=dtypes.name(t.dtype), allowed="integer dtypes (int32, uint32...)")
    if t.root.buffer == "hbm":
        raise nki_error("err_unsupported_memory", param="index", api="indirect indexing",
                        expected="sbuf", got="hbm")
    v = np.asarray(read(t, "indirect indexing", run)).astype(np.int64)
    if v.ndim == 1:
        v = v.reshape(v.shape[0], 1)
    return v


def indirect_getitem(tensor, key):
    """``tensor[key]`` where some index is an SBUF tile of integers."""
    run = context.current()
    key = key if isinstance(key, tuple) else (key,)
    if run.rules.indirect_hbm_partition_only and any(
            isinstance(k, Tensor) and k.size > 1 for k in key):
        # (one runtime integer is a dynamic offset, not an indirection: AWS's
        # test_nki_isa_tensor_copy_dynamic.py reads `src_sbuf[ix, offsets_sbuf[0, idx], iz]`)
        if tensor.root.buffer != "hbm":
            raise nki_error("err_copy_dynamic_indirect_indices_not_natively_supported",
                            buffer=tensor.root.buffer.upper(), name=tensor.name)
        if len(tensor.shape) >= 2 and len(key) == len(tensor.shape) and \
                isinstance(key[-1], Tensor) and key[-1].size > 1:
            # the last axis of a 2-D+ tensor is a free one (the partition or block axis
            # comes first)
            raise nki_error("err_indirect_indices_free_dim")
    tiles = []
    raw = []
    new = []
    others = [np.shape(k.v) for k in key if isinstance(k, IndexExpr)]
    for k in key:
        if isinstance(k, Tensor):
            try:
                np.broadcast_shapes(tuple(k.shape), *others)
            except ValueError:
                raise nki_error("nkisim_invalid_argument", api=f"indexing `{tensor.name}`",
                                why=f"the index tile `{k.name}`{shape_str(k.shape)} does not "
                                    f"broadcast with the other indices "
                                    f"({', '.join(shape_str(o) for o in others)}): an indirect "
                                    "index tile holds one index per partition ([P, 1], or "
                                    f"`{k.name}[i_p, j]` for its column j)") from None
            v = _index_values(k, run)
            tiles.append(k)
            raw.append(v)
            new.append(IndexExpr(v))
        else:
            raw.append(k.v if isinstance(k, IndexExpr) else None)
            new.append(k)
    view = tensor[tuple(new)]
    INDEX_TILES[view] = tuple(tiles)
    if view._oob is not None:
        bad, _ = view._oob
        view._oob = (bad, {"indirect": _oob_message(tensor, new, bad)})
    return view


def _oob_message(tensor, key, bad) -> str:
    """NumPy's message for the first out-of-bound element of the flattened tensor."""
    arr = tensor._arr
    vals = [k.v if isinstance(k, IndexExpr) else np.asarray(k) for k in key]
    shp = np.broadcast_shapes(*(np.shape(v) for v in vals if not isinstance(v, slice)))
    unclipped = [np.broadcast_to(v, shp) for v in vals]
    item = arr.itemsize
    flat = np.zeros(shp, np.int64)
    for v, st in zip(unclipped, arr.strides):
        flat = flat + v * (st // item)
    b = np.asarray(bad).reshape(bad.shape[:len(shp)] + (-1,)).any(axis=-1) \
        if bad.ndim > len(shp) else np.broadcast_to(bad, shp)
    if not b.any():
        return f"index {int(flat.max())} is out of bounds for axis 0 with size {arr.size}"
    pos = tuple(np.argwhere(b)[0])
    first = int(flat[pos])
    if 0 <= first < arr.size:
        # Outside its axis but inside the tensor (a row index past the rows of one batch of a
        # (B, rows, cols) tensor: nki-samples' resize_nearest, whose rounded source row is one
        # too many): NumPy's message for that axis, not the flattened one, which would name an
        # index below the size it says it exceeds
        for j, v in enumerate(unclipped[:arr.ndim]):
            x = int(v[pos])
            if not 0 <= x < arr.shape[j]:
                return (f"index {x} is out of bounds for axis {j} with size {arr.shape[j]} "
                        f"(element {first} of the flattened tensor, which has {arr.size})")
    return f"index {first} is out of bounds for axis 0 with size {arr.size}"


def index_tiles(view) -> tuple:
    try:
        return INDEX_TILES.get(view, ())
    except TypeError:
        return ()


def accumulate_at(dst, vals, api, run, mask=None) -> None:
    """``dst += vals`` element by element, every contribution of a repeated index counted (an
    atomic read-modify-write)."""
    if dst._oob is not None:
        _check_oob(dst, mask)
    if dst._w is not None:
        checks.check_read(run, dst, api, accumulate=True)
    cur = dtypes.to_f32(values(dst))
    vals = np.broadcast_to(vals, dst.shape)
    if mask is not None:
        vals = np.where(np.broadcast_to(mask, dst.shape), vals, 0)
    if dst._idx is None:
        write(dst, cur + vals, api, run=run, accumulate=True)
        return
    # repeated indices: sum every contribution into the root, then write the view
    full = _full_idx(dst._idx, dst)
    poisoned(dst.root)                  # (a lazily poisoned tile: its poison first)
    root_vals = dtypes.to_f32(dst._arr).copy()
    np.add.at(root_vals, full, vals)
    write(dst, root_vals[full], api, run=run, accumulate=True)


def dynamic_index(name, x, y, run):
    """``tile[0, i] + iy``: a runtime offset (one integer from an SBUF tile) plus an affine index
    expression is an index expression whose values are known when the instruction runs
    (aws-neuron-sdk nki/test/test_nki_isa_tensor_copy_dynamic.py:
    ``src_sbuf[ix, offsets_sbuf[0, idx] + iy]``)."""
    vals = []
    for t in (x, y):
        if isinstance(t, IndexExpr):
            vals.append(t.v)
        elif isinstance(t, Tensor):
            if t.size != 1 or t.root.buffer == "hbm" or not dtypes.is_int(t.dtype):
                raise nki_error("nkisim_invalid_argument", api="dynamic index",
                                why=f"an index expression can only be combined with one integer "
                                    f"element of an SBUF tile, got `{t.name}` "
                                    f"{list(t.shape)} {dtypes.name(t.dtype)}")
            vals.append(int(np.asarray(read(t, "dynamic index", run)).reshape(-1)[0]))
        elif isinstance(t, (int, np.integer)) and not isinstance(t, bool):
            vals.append(int(t))
        else:
            raise nki_error("err_unsupported_expression_in_mask")
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}[name]
    return IndexExpr(fn(np.asarray(vals[0]), np.asarray(vals[1])))
