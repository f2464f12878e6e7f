"""Checks the real simulator lacks: uninitialized reads, races between ``affine_range``
iterations and SPMD instances, tiles used out of scope, outputs never written (ref §1.5, §1.9,
§1.11, §2.1, §4.3).

They read the per-element shadow of every tensor: the epoch of its last write (``nkisim.context``;
0 = never written). Each check can be turned off (``NKISIM_CHECKS=-races``, ``checks=``); see
``nkisim.context.ALL_CHECKS``.

- **uninit** (``nkisim_uninitialized_read``): an operand element whose shadow is 0 was never
  written. nkisim poisons new memory (NaN), the device returns whatever the SBUF held.
- **races**. ``affine_range`` promises independent iterations (ref §1.9): the compiler may
  reorder and pipeline them, so a real dependency computes garbage on the device while the
  eager simulator computes it in order (aws-neuron-sdk #1051, ref §4.3).

  - *loop-carried dependency* (``nkisim_loop_carried_dependency``): an iteration reads an element
    written by another iteration of the same ``affine_range`` loop activation.
  - *output dependency* (``err_unexpected_output_dependencies``, ref §1.5): two iterations write
    the same element (``a[0] = ...`` in the loop body).
  - ``psum += nisa.nc_matmul(...)`` is the associative accumulation the compiler allows (ref
    §1.9, §1.11): exempt. An element accumulated by several iterations keeps the epoch of the
    iteration that started its accumulation group, so *reading* the accumulator inside the loop
    (a partial sum) is still a loop-carried dependency, while reading it after the loop is fine.
  - ``sequential_range``/``static_range`` loops order their iterations: exempt. Loops that run
    one after the other, and code before/after a loop, are ordered by program order.
  - SPMD (``kernel[grid](...)``): program instances are checked like iterations of an
    ``affine_range`` over the program ids; the real front end raises
    ``err_unexpected_output_dependencies`` for "affine_range/SPMD" alike (ref §1.5). Writing the
    same ``shared_hbm`` location from two instances is flagged; so is an instance reading what
    another wrote (the instances run concurrently on different NeuronCores).

  Rule: with the loop's current activation starting at epoch ``f`` and its current iteration at
  epoch ``e``, every epoch in ``[f, e)`` belongs to an earlier iteration of it (ids grow
  monotonically). An access races iff a touched element's epoch falls in ``[f, e)`` of an active
  parallel loop.

  Cost: each tensor keeps summaries on its allocation (``epoch`` it was created in, ``hi`` an
  upper bound of its shadow's epochs, ``full`` once every element was written, ``uniform`` the
  epoch of all elements when they share one, ``gen`` its write count), so most accesses are
  decided in O(1): tiles allocated in the current iteration, tensors written before the loops,
  accumulators. A tile or kernel-created HBM tensor written in parts keeps its epochs as a few
  disjoint boxes while every write is a box of its storage (see "box shadows" below), so a check
  looks at the boxes a view meets. The element shadow is scanned (min/max, then element-wise)
  only when neither can rule a race or an uninitialized element out.
- **scope** (``err_local_variable_used_out_of_scope``): a tile allocated in a loop body used after
  that iteration ended (outside the loop, or by the next iteration through a Python variable, as
  in ``acc = nl.add(acc, x)``; the real front end traces the body once, ref §1.9).
- **outputs** (``err_tensor_output_not_written_to``): a returned HBM tensor no element of which
  was written when the kernel returns (the handout's FREE_DIM=1000 at n=25600 runs zero
  iterations) is the error; a partly written one is a suspicious-pattern warning (AWS's
  indirect-store doc examples return partly written outputs).
"""

from __future__ import annotations

import re

import numpy as np

from . import dtypes
from .context import caller_location, where
from .errors import nki_error, shape_str

# ---------------------------------------------------------------------------------------------
# regions in messages


def _bbox(coords) -> str:
    """``[lo:hi, lo:hi]`` bounding box of index arrays (one per axis)."""
    if not coords or not coords[0].size:
        return ""
    return "[" + ", ".join(f"{int(a.min())}:{int(a.max()) + 1}" for a in coords) + "]"


def region_str(mask: np.ndarray) -> str:
    """Bounding box of the True elements of ``mask`` in its own coordinates."""
    if mask.ndim == 0:
        return ""
    return _bbox(np.nonzero(mask))


def _root_coords(t, mask):
    """Indices in the *tensor's* coordinates (its root shadow) of the True elements of ``mask``,
    a boolean array over the view ``t``; None when the view cannot be mapped back."""
    materialize(t.root)             # a lazy shadow: messages name the tensor's coordinates
    root_w = t.root.shadow
    w = t._w
    if root_w is None or w is None or not root_w.flags.c_contiguous or \
            not np.may_share_memory(w, root_w):
        return None                 # e.g. a masked copy of the shadow
    nz = np.nonzero(mask)
    if t._idx is not None:
        # advanced index: coordinates in the indexed (base) view, then as for a basic view
        idx = t._idx
        bshape = np.broadcast_shapes(*(np.shape(i) for i in idx))
        nb = len(bshape)
        base = [np.broadcast_to(i, bshape)[nz[:nb]] for i in idx]
        base += list(nz[nb:])
        nz = tuple(base)
    item = root_w.itemsize
    off = w.__array_interface__["data"][0] - root_w.__array_interface__["data"][0]
    if off % item or len(nz) != w.ndim:
        return None
    flat = np.full(nz[0].shape if nz else (), off // item, dtype=np.int64)
    for k, st in zip(nz, w.strides):
        if st % item:
            return None
        flat = flat + k.astype(np.int64) * (st // item)
    if flat.size and (flat.min() < 0 or flat.max() >= root_w.size):
        return None
    return np.unravel_index(flat, root_w.shape)


def tensor_region(t, mask) -> str:
    """``name[lo:hi, ...]`` of the True elements of ``mask`` (over view ``t``), in the tensor's
    own coordinates when possible."""
    coords = _root_coords(t, mask)
    if coords is None:
        return f"{t.name}{region_str(mask)}"
    return f"{t.name}{_bbox(coords)}"


def shadow_view(t):
    """The write epochs of the elements view ``t`` touches, for reading (a lazy shadow stays
    lazy: a read-only broadcast of its epoch)."""
    w = t._ws
    if w is LAZY:
        w = lazy_view(t)
    return w if t._idx is None else w[t._idx]


# ---------------------------------------------------------------------------------------------
# lazy shadows
#
# An SBUF/PSUM tile (partition dimension first) starts with a *lazy* shadow: no array, every
# element has the epoch ``root.uniform`` (0: never written). Its views carry ``LAZY`` instead of
# a shadow view. Reads see a broadcast of that epoch; a write that covers the whole tile only
# sets ``uniform``; the first write to part of it (or a masked one) *materializes* the shadow
# (``root.shadow``), and from then on every view, old or new, derives its element-wise epochs
# from its place in the tile's storage (``lazy_view``). Most tiles (instruction results, PSUM
# accumulators) are only ever written whole: no int32 per element is allocated or filled.

class _Lazy:
    __slots__ = ()

    def __repr__(self):
        return "<lazy shadow>"


LAZY = _Lazy()
_INT32 = np.dtype(np.int32)


_CELLS: dict = {}


def _epoch_cell(epoch):
    """A read-only one-element int32 array holding ``epoch`` (np.broadcast_to is 5x slower)."""
    cell = _CELLS.get(epoch)
    if cell is None:
        if len(_CELLS) > 4096:
            _CELLS.clear()
        cell = _CELLS[epoch] = np.array([epoch], np.int32)
        cell.flags.writeable = False
    return cell


def materialize(root) -> None:
    """Give a lazy root its element-wise shadow (all ``root.uniform``, or its boxes')."""
    if root.shadow is None and root.store is not None:
        bs = root.boxes
        if bs is None:
            root.shadow = np.full(root.shape, root.uniform, np.int32)
            return
        store = root.store
        poison_unwritten(root)      # (the boxes say which elements keep the poison)
        sh = np.full(store.shape, bs.base, np.int32)
        for box, e in bs.items:
            sh[tuple([slice(lo, hi) for lo, hi in box])] = e
        root.boxes = None
        root.shadow = sh.reshape(root.shape)


def lazy_view(t):
    """The shadow of view ``t`` of a lazy root: a broadcast of the root's epoch, or once
    materialized the view of ``root.shadow`` at the view's place in the storage."""
    root = t.root
    if root.boxes is not None:      # element-wise epochs wanted: give up the boxes
        materialize(root)
    shadow = root.shadow
    arr = t._arr
    if shadow is None:           # every element has the root's epoch: a read-only broadcast
        return np.ndarray(arr.shape, _INT32, buffer=_epoch_cell(root.uniform),
                          strides=(0,) * arr.ndim)
    item = arr.itemsize
    off = arr.__array_interface__["data"][0] - root.store.__array_interface__["data"][0]
    w = np.ndarray(arr.shape, _INT32, buffer=shadow, offset=off // item * 4,
                   strides=tuple(st // item * 4 for st in arr.strides))
    t._ws = w                  # the shadow exists now: the view keeps its own
    return w


def garbage_view(t, create: bool = False):
    """Which elements of view ``t`` (before its advanced index, as ``t._w``) were written with
    values computed from never-written ones (``nkisim.tensor._apply_taint``): for every check
    they are never-written (epoch 0) like the elements no instruction wrote, and only the
    matmul accumulation tells them apart (a PSUM location an earlier matmul of the group wrote
    garbage into is not a fresh one). A bool view of ``root.garbage`` (the tile storage's
    shape, made by the first ``create``) at the view's place, as ``lazy_view`` finds it; None
    when nothing was marked, or for a tile without that storage (an HBM tensor). An element
    written again keeps its mark, but its epoch is no longer 0: marks only count where the
    epoch is 0, and an element gets epoch 0 back only by being marked again."""
    root = t.root
    g = root.garbage
    if g is None:
        if not create or root.store is None:
            return None
        g = root.garbage = np.zeros(root.store.shape, np.bool_)
    arr = t._arr
    item = arr.itemsize
    off = arr.__array_interface__["data"][0] - root.store.__array_interface__["data"][0]
    return np.ndarray(arr.shape, np.bool_, buffer=g, offset=off // item,
                      strides=tuple(st // item for st in arr.strides))


# ---------------------------------------------------------------------------------------------
# box shadows
#
# A lazy root written in parts keeps its epochs as *boxes* while every write is a box of its
# storage (``a[:, ci, :, :]``, ``ot[:, co, r:r + nr, :]``: basic views with unit steps, the
# writes of real kernels): disjoint boxes, each with the epoch of its last write, and ``base``,
# the epoch of the elements in none (the root's ``uniform`` before). A check then decides from
# the few boxes a view meets instead of scanning an int32 per element (issue 12); any access
# that is not a box (a mask, an advanced index, another element size), and any race or
# uninitialized element found (the messages name element regions), materializes the
# element-wise shadow the boxes stand for, and the general path takes over.

# More boxes than that and the element-wise shadow is cheaper to scan: a box costs about 1 us
# of Python per check, an element about 1 ns of NumPy per pass (measured on the 2-core
# machine), so a root keeps at most size / 2048 boxes, within [8, 256] (256: the B=4 conv2d's
# output, stored in 224 boxes, keeps no 200 MB shadow).
MAX_BOXES = 256
MIN_BOXES = 8


class BoxShadow:
    """The write epochs of a lazy root as disjoint boxes (see above)."""

    __slots__ = ("base", "items", "vol", "size", "cap")

    def __init__(self, base, size):
        self.base = base        # epoch of the elements in no box
        self.items = []         # [(box, epoch)]; box: ((lo, hi), ...) per storage dimension
        self.vol = 0            # elements in the boxes
        self.size = size        # elements of the root
        self.cap = min(MAX_BOXES, max(MIN_BOXES, size // 2048))    # boxes kept at most


def view_box(t):
    """The elements of view ``t`` as a box of its root's storage (``((lo, hi), ...)`` per
    storage dimension), or None when they are not one (a strided, transposed or merged view,
    an advanced index, another element size) or the root has no lazy storage. The view's
    place is its byte offset ``t._off`` in the storage (what its region is computed from)."""
    root = t.root
    store = root.store
    arr = t._arr
    if store is None or arr is None or t._idx is not None:
        return None
    item = store.itemsize
    if arr.itemsize != item:
        return None
    off, rem = divmod(t._off, item)
    shape = store.shape
    geo = _GEOMETRY.get(shape)
    if geo is None:
        geo = _geometry(shape)
    es, dim_of, size = geo
    if rem or off < 0 or off >= size:
        return None
    coords = [off // s % n for s, n in zip(es, shape)]
    ends = list(coords)
    for n, st in zip(arr.shape, arr.strides):
        if n == 1:
            continue
        if n == 0 or st <= 0 or st % item:
            return None
        j = dim_of.get(st // item)
        if j is None or ends[j] != coords[j]:
            return None
        ends[j] += n
        if ends[j] > shape[j]:
            return None
    for j, n in enumerate(ends):
        if n == coords[j]:
            ends[j] = n + 1
    return tuple(zip(coords, ends))


_GEOMETRY: dict = {}


def _geometry(shape):
    """(element stride per dimension, {stride: dimension} of the dimensions longer than 1,
    elements) of a C-contiguous array of ``shape``."""
    es = [0] * len(shape)
    dim_of = {}
    s = 1
    for j in range(len(shape) - 1, -1, -1):
        es[j] = s
        if shape[j] > 1:
            dim_of[s] = j
        s *= shape[j]
    if len(_GEOMETRY) > 1024:
        _GEOMETRY.clear()
    geo = _GEOMETRY[shape] = (tuple(es), dim_of, s)
    return geo


def _box_size(box) -> int:
    v = 1
    for lo, hi in box:
        v *= hi - lo
    return v


def to_boxes(root) -> None:
    """A lazy root (every element ``root.uniform``) about to be written in part: box mode."""
    root.boxes = BoxShadow(root.uniform, root.store.size)
    root.uniform = None


def box_epochs(bs, box):
    """(epochs, covered): the epochs of the elements of ``box`` (with repeats), and whether
    every element of it is in some box (else ``bs.base`` is among the epochs)."""
    eps = []
    vol = 0
    for b, e in bs.items:
        v = 1
        for (l, h), (L, H) in zip(b, box):
            lo = l if l > L else L
            hi = h if h < H else H
            if hi <= lo:
                break
            v *= hi - lo
        else:
            eps.append(e)
            vol += v
    covered = vol == _box_size(box)
    if not covered:
        eps.append(bs.base)
    return eps, covered


def _subtract(b, box):
    """The parts of box ``b`` outside ``box`` (which meets it), as disjoint boxes."""
    out = []
    rest = list(b)
    for j, ((l, h), (L, H)) in enumerate(zip(b, box)):
        if l < L:
            piece = list(rest)
            piece[j] = (l, L)
            out.append(tuple(piece))
        if H < h:
            piece = list(rest)
            piece[j] = (H, h)
            out.append(tuple(piece))
        rest[j] = (max(l, L), min(h, H))
    return out


def stamp_box(root, box, epoch) -> None:
    """Record a write of ``box`` at ``epoch`` in the root's boxes (the element-wise shadow
    instead once there would be too many)."""
    bs = root.boxes
    items = []
    vol = 0
    for b, e in bs.items:
        for (l, h), (L, H) in zip(b, box):
            if h <= L or H <= l:
                items.append((b, e))        # disjoint: kept
                vol += _box_size(b)
                break
        else:
            for piece in _subtract(b, box):  # overwritten in part (or whole: no piece)
                items.append((piece, e))
                vol += _box_size(piece)
    items.append((box, epoch))
    bs.items = items
    bs.vol = vol + _box_size(box)
    if bs.vol == bs.size:
        root.unpoisoned = None      # every element written: none keeps the poison
    if len(items) > bs.cap:
        materialize(root)
    elif bs.vol == bs.size or bs.base > 0:
        root.full = True


def _meets(a, b) -> bool:
    for (l, h), (L, H) in zip(a, b):
        if h <= L or H <= l:
            return False
    return True


def unwritten_boxes(root) -> list:
    """The elements of a box-mode root in none of its boxes, as disjoint boxes."""
    rest = [tuple((0, n) for n in root.store.shape)]
    for b, _e in root.boxes.items:
        rest = [p for r in rest for p in (_subtract(r, b) if _meets(r, b) else (r,))]
    return rest


def poison_unwritten(root) -> None:
    """A lazily poisoned tile written in boxes (``nkisim.tensor.poisoned``): the poison into
    the elements no box covers, the only ones that never held a written value."""
    arr = root.unpoisoned
    if arr is None or root.boxes is None:
        return
    root.unpoisoned = None
    p = dtypes.poison(root.dtype)
    for box in unwritten_boxes(root):
        arr[tuple([slice(lo, hi) for lo, hi in box])] = p


def view_written(t) -> bool:
    """Every element of view ``t`` of a box-mode root is in a box (was written)."""
    box = view_box(t)
    return box is not None and box_epochs(t.root.boxes, box)[1]


def _box_decides(run, t, racy, uninit) -> bool:
    """True when the boxes of ``t``'s root show that reading view ``t`` is fine (no
    uninitialized element if ``uninit``, no race with the ``racy`` loops); False when the
    general path must decide (and name what it finds)."""
    box = view_box(t)
    if box is None:
        return False
    eps, covered = box_epochs(t.root.boxes, box)
    lo = min(eps)
    if uninit and lo == 0:
        return False
    return not racy or lo >= run.epoch or _no_race_in(run, eps, racy)


def _no_race_in(run, eps, racy) -> bool:
    """No epoch of ``eps`` (a list) belongs to an earlier iteration of a ``racy`` loop."""
    return _find_race(run, np.array(eps), min(eps), max(eps), racy) is None


# ---------------------------------------------------------------------------------------------
# loops


def _iteration_of(run, epoch: int, loop) -> object:
    """The iteration of ``loop`` in which ``epoch`` ran (walks the epoch's parent chain)."""
    epochs = run.epochs
    e = epoch
    while e:
        parent, loop_id, _kind, it = epochs[e]
        if loop_id == loop.id:
            return it
        e = parent
    return "?"


_FOR_RE = re.compile(r"^\s*for\s+([A-Za-z_]\w*)\s+in\b")


def loop_name(loop) -> str:
    """``the `i` loop (affine_range at k.py:12)`` for messages."""
    if loop.kind == "spmd":
        return f"the SPMD grid (program instances of the kernel at {where(loop.file, loop.line)})"
    var = ""
    if loop.file:
        import linecache
        m = _FOR_RE.match(linecache.getline(loop.file, loop.line))
        if m:
            var = f"`{m.group(1)}` "
    return f"the {var}loop ({loop.kind}_range at {where(loop.file, loop.line)})"


def _iter_str(loop, it) -> str:
    return f"program id {it}" if loop.kind == "spmd" else f"iteration {it}"


def _find_race(run, w, lo, hi, pl):
    """(loop, writer epoch) of the first parallel loop in ``pl`` (outermost first) such that
    some epoch in ``w`` (whose min and max are ``lo`` and ``hi``) lies in
    ``[loop.first_epoch, loop.epoch)``; None when there is none."""
    for lp in pl:
        f, e = lp.first_epoch, lp.epoch
        if lo >= e:
            continue
        if hi < f:
            return None             # inner loops start later still
        if lo >= f and hi < e:
            return lp, hi
        sel = w[(w >= f) & (w < e)]
        if sel.size:
            return lp, int(sel.max())
    return None


# ---------------------------------------------------------------------------------------------
# reads and writes (called by nkisim.tensor.read/write for tensors with a shadow)


def _scope_error(run, t):
    root = t.root
    lp = root.loop
    line = where(lp.file, lp.line) if lp is not None else "?"
    return nki_error("err_local_variable_used_out_of_scope", name=root.name, line=line)


def _racy_loops(run, root):
    """The active parallel loops whose earlier iterations may have written ``root``: the
    SPMD grid first, then ``affine_range`` loops, outermost first.

    Every epoch in ``root``'s shadow is 0 or lies in ``[root.epoch, root.hi]`` (a tensor is
    written in the context that created it or in loops started later), so only loops whose
    ``[first_epoch, epoch)`` meets that interval need an element-wise look. The loops of the
    stack are nested, so both their ``epoch`` and their ``first_epoch`` grow from the outermost
    to the innermost: those loops are a slice of them.
    """
    epoch = run.epoch
    if epoch == 1 or "races" not in run.checks:
        return ()
    cache = run.par_cache
    pl = cache[1] if cache[0] == epoch else _par_loops(run, epoch)
    a, h = root.epoch, root.hi
    sp = run.spmd
    if sp is not None and a < sp.epoch and h >= sp.first_epoch:
        return (sp,) + _nested_slice(pl, a, h)
    if not pl or a >= pl[-1].epoch or h < pl[0].first_epoch:
        return ()                       # (the commonest answer, without a call)
    i = 0                               # (_nested_slice, inline)
    while pl[i].epoch <= a:
        i += 1
    if pl[i].first_epoch > h:
        return ()
    j = len(pl)
    while pl[j - 1].first_epoch > h:
        j -= 1
    return pl[i:j]


def _par_loops(run, epoch):
    """The active ``affine_range`` loops, outermost first, cached in ``run.par_cache`` as
    (epoch, loops, (innermost loop, depth)): they only change with the loop stack."""
    cache = run.par_cache
    if cache[0] != epoch:
        loops = run.loops
        key = (loops[-1] if loops else None, len(loops))
        if len(cache) < 3 or cache[2] != key:
            cache = (epoch, tuple([lp for lp in loops if lp.kind == "affine"]), key)
        else:
            cache = (epoch, cache[1], key)
        run.par_cache = cache
    return cache[1]


def _nested_slice(pl, a, h):
    """The loops of ``pl`` (nested, outermost first) with ``a < epoch`` and
    ``h >= first_epoch``."""
    if not pl or a >= pl[-1].epoch or h < pl[0].first_epoch:
        return ()
    i = 0
    while pl[i].epoch <= a:             # (pl[-1].epoch > a: stops)
        i += 1
    if pl[i].first_epoch > h:
        return ()                       # (so do the loops inside it: j <= i)
    j = len(pl)
    while pl[j - 1].first_epoch > h:    # (pl[i].first_epoch <= h: stops at i + 1 at least)
        j -= 1
    return pl[i:j]


def _accumulates_in_group(run, root, epoch) -> bool:
    """True when ``check_write`` of an accumulation onto ``root`` (no SPMD grid) would find
    a race, i.e. keep the group's first epoch: its shadow has one epoch ``u`` (``uniform``)
    that an earlier iteration of an active affine loop wrote. Only the innermost active affine
    loop started at or before ``u`` can hold it (the current iteration of an enclosing loop
    began before that loop started); it is one of ``_racy_loops`` if its current epoch is past
    the tensor's creation and it started at or before the tensor's last write, and then
    ``_find_race`` on the uniform epoch returns it or an enclosing loop. False when this does
    not decide (the general path then does)."""
    u = root.uniform
    if u is None or u >= epoch:
        return False
    if epoch == 1 or "races" not in run.checks:
        return False
    cache = run.par_cache
    for lp in reversed(cache[1] if cache[0] == epoch else _par_loops(run, epoch)):
        f = lp.first_epoch
        if f <= u:
            e = lp.epoch
            return u < e and root.epoch < e and f <= root.hi
    return False


def _covers(t) -> bool:
    """True when view ``t`` is the whole tensor (each element once, not a masked copy)."""
    root = t.root
    shadow = root.shadow if root.shadow is not None else root.store
    return t._arr is not None and t._idx is None and shadow is not None and \
        t._arr.size == shadow.size


def _bounds(t, w):
    """(min, max) epoch of the view's shadow ``w``; O(1) when the tensor's shadow is known to
    be uniform (a tile written as a whole, an accumulator), which it then remembers."""
    root = t.root
    u = root.uniform
    if u is not None:
        return u, u
    lo, hi = int(w.min()), int(w.max())
    if lo == hi and _covers(t):
        root.uniform = lo
    return lo, hi


def _check_initialized(run, t, w, api) -> None:
    """``nkisim_uninitialized_read`` if an element of the view was never written.

    Once the whole tensor is known to be written (``root.full``) reads cost nothing. The first
    read after a write checks its view; a second read with no write in between checks the whole
    tensor, once (``root.full``: True, else ``gen`` after one read, ``-gen - 1`` after a failed
    whole-tensor check), so a tile written once and read many times costs two passes.
    """
    root = t.root
    if root.full is True or (root.uniform is not None and root.uniform > 0):
        return
    g = root.gen
    shadow = root.shadow
    if root.full == g and shadow is not None:
        if shadow.min() > 0:
            root.full = True
            return
        root.full = -g - 1
    elif root.full != -g - 1:
        root.full = g
    if w.min() > 0:
        return
    unwritten = w == 0
    file, line = caller_location()
    raise nki_error("nkisim_uninitialized_read", api=api, where=where(file, line),
                    name=t.name, region=_strip_name(tensor_region(t, unwritten), t),
                    count=int(unwritten.sum()), total=int(w.size))


# the ops whose `t[...] = op(t, x)` is an associative accumulation, as `t += x` (add, *=) is:
# "associative reductions are not considered loop carried dependencies" (nl.affine_range), and
# a running max or min gives the same result in any order too (the ALU table lists maximum and
# minimum as reduction ops)
_ASSOCIATIVE = frozenset(("add", "multiply", "maximum", "minimum"))
# nkisim.dstform.stored_into (set when dstform loads: it reads the kernel's bytecode)
STORED_INTO = None
# the run whose `acc[...] = acc + x` the next Tensor.__setitem__ stores (_accumulates_into)
ASSOC_STORE: list = [None]


def _accumulates_into(run, root) -> bool:
    """An ``add``/``multiply`` reading ``root`` whose value the kernel stores straight back
    into ``root`` (``acc[...] = acc + x``, ``acc[...] = nl.add(acc, x)``: what AWS advises
    instead of ``+=``, aws-neuron-sdk #1051, and what ``acc += x`` is, reference §1.11): the
    associative reduction affine_range allows, exempt as ``acc += x`` is. The assignment's
    write is then exempt too (``run.assoc`` until ``Tensor.__setitem__`` has stored it)."""
    dst = STORED_INTO() if STORED_INTO is not None else None
    if dst is None or dst.root is not root:
        return False
    run.assoc = root
    ASSOC_STORE[0] = run
    return True


def check_read(run, t, api: str, accumulate: bool = False, uninit: bool = True) -> None:
    """Before an instruction reads view ``t``: uninitialized elements, out-of-scope tiles and
    loop-carried dependencies (not for an associative accumulation, ``accumulate``: the ``+=``
    matmul accumulation, or ``acc += x`` while ``run.assoc`` is its tensor). ``uninit=False``
    skips the uninitialized-read check (the caller tracks those values instead, see
    ``nkisim.tensor.read``)."""
    root = t.root
    if root.live is None and "scope" in run.checks:
        raise _scope_error(run, t)
    if run.spmd is not None:
        if root.pend is not None:
            check_pending_read(run, t)
        if root.rd < run.epoch:
            root.rd = run.epoch
    racy = () if accumulate or root is run.assoc else _racy_loops(run, root)
    uninit = uninit and "uninit" in run.checks
    if not racy and (not uninit or root.full is True or
                     (root.uniform is not None and root.uniform > 0)):
        return                                  # (the summaries decide: no shadow needed)
    if root.boxes is not None and _box_decides(run, t, racy, uninit):
        return                                  # (the boxes decide)
    w = shadow_view(t)
    if not w.size:
        return
    if not racy:
        _check_initialized(run, t, w, api)
        return
    lo, hi = _bounds(t, w)
    if lo >= run.epoch:
        return                                  # written in this iteration (or nested loops)
    if lo == 0 and uninit:
        _check_initialized(run, t, w, api)
    hit = _find_race(run, w, lo, hi, racy)
    if hit is None:
        return
    if (api in _ASSOCIATIVE or api == "tensor_tensor" and run.alu in _ASSOCIATIVE) and \
            _accumulates_into(run, root):
        return
    lp, e = hit
    file, line = caller_location()
    raise nki_error("nkisim_loop_carried_dependency", loop=loop_name(lp),
                    it=_iter_str(lp, lp.iteration), name=t.name,
                    region=_strip_name(tensor_region(t, w == e), t),
                    other=_iter_str(lp, _iteration_of(run, e, lp)), api=api,
                    where=where(file, line))


def check_write(run, t, api: str, accumulate: bool, same_values=None, view=None,
                values_of=None) -> bool:
    """Before an instruction writes view ``t``: output dependencies between iterations of a
    parallel loop, writes to out-of-scope tiles. Returns True when the write must *not* restamp
    the shadow (an accumulation onto a group started by an earlier iteration, see module doc).
    Also keeps the tensor's summaries (``hi``, ``gen``, ``full``, ``uniform``) up to date.
    ``view``: the written view whose values (``values_of(view)``: nkisim.tensor.values) a
    program instance's overlapping write is judged on at the end of the phase
    (``settle_spmd_writes``)."""
    root = t.root
    if root.live is None and "scope" in run.checks:
        raise _scope_error(run, t)
    root.gen += 1
    epoch = run.epoch
    if (accumulate or root is run.assoc) and run.spmd is None and _accumulates_in_group(
            run, root, epoch) and t.size:
        # what the general path below decides, found from the loop stack alone: the
        # accumulation continues a group an earlier iteration started
        if root.full is not True and _covers(t):
            root.full = True
        return True
    covers = _covers(t)
    racy = _racy_loops(run, root)
    if racy:
        u = root.uniform
        box = view_box(t) if root.boxes is not None else None
        if u is not None and t.size:
            # one epoch everywhere: _find_race decides from it alone (no shadow view)
            w, lo, hi = None, u, u
        elif box is not None and t.size and _no_race_in(run, box_epochs(root.boxes, box)[0],
                                                        racy):
            w, lo, hi = None, epoch, epoch      # the boxes show no race
        else:
            w = shadow_view(t)
            lo, hi = _bounds(t, w) if w.size else (epoch, epoch)
        hit = _find_race(run, w, lo, hi, racy) if lo < epoch else None
        if hit is not None:
            if accumulate or root is run.assoc:
                if covers:
                    root.full = True
                return True                     # keep the group's first epoch (module doc)
            lp, e = hit
            file, line = caller_location()
            if lp.kind == "spmd" and same_values is not None and same_values():
                # Program instances writing the very bytes another instance wrote: the result
                # does not depend on their order, so no garbage; a warning. AWS's CI-tested
                # test_resize_nearest.py launches resize_nearest_fixed_dma_kernel on a grid of
                # in_b instances while the kernel loops over every batch itself (nki-samples
                # fc5c69f, reference/vision.py).
                run.warn(("spmd_same_values",),
                         f"program instances write the same values to `{t.name}`: "
                         f"{_iter_str(lp, lp.iteration)} ('{api}' at {where(file, line)}) "
                         f"rewrites what {_iter_str(lp, _iteration_of(run, e, lp))} wrote "
                         "(redundant work: offset the destination by nl.program_id)")
                hit = None
            elif lp.kind == "spmd" and view is not None and root.rd < lp.first_epoch:
                # other values: decided at the end of the phase (settle_spmd_writes)
                if w is None:
                    w = shadow_view(t)
                _defer_spmd_write(run, lp, t, w, view, values_of, api, (file, line))
                hit = _find_race(run, w, lo, hi, [p for p in racy if p is not lp])
        if hit is not None:
            lp, e = hit
            file, line = caller_location()
            if w is None:
                w = shadow_view(t)
            raise nki_error(
                "err_unexpected_output_dependencies", loop=loop_name(lp), name=t.name,
                region=_strip_name(tensor_region(t, w == e), t),
                detail=f": {_iter_str(lp, lp.iteration)} ('{api}' at {where(file, line)}) "
                       f"writes what {_iter_str(lp, _iteration_of(run, e, lp))} wrote; "
                       + ("offset the destination by nl.program_id" if lp.kind == "spmd"
                          else "index the destination with the loop variable, or use "
                               "nl.sequential_range if the order matters"))
    # the write stamps `epoch` on the view
    _bump(root, epoch)
    if covers:
        root.full = True
        root.uniform = epoch
        root.boxes = None
    elif root.uniform != epoch:
        root.uniform = None
    return False


# ---------------------------------------------------------------------------------------------
# program instances writing the same HBM bytes with other values
#
# Two instances of a launch (the two cores of LNC 2) that write the same bytes without a
# synchronisation between them race: their DMA writes land in any order. What the device leaves
# is then each byte's *last* write, and that is the last write of one of the instances, any of
# them (each instance's own writes to a byte are ordered: the compiler orders a core's
# dependent DMAs, which every kernel relies on at LNC 1). So the result does not depend on the
# order iff every instance's last write of the byte in the phase has the same value; meanwhile
# any value either instance wrote may be there, so no instance may read those bytes before the
# instances synchronise. AWS's router_topk (nki-library d2ad3a5, `use_indirect_dma_scatter`
# without `shard_on_tokens` on LNC 2) has both cores zero-fill the output rows and then scatter
# the same top-k values into them (indirect DMA): core 1's zero-fill may land after core 0's
# scatter, but core 1's own scatter comes after it, so every byte ends with the scattered value,
# and nothing reads the output before the kernel ends.
#
# nkisim runs the instances one after the other, each to its synchronisation point: when an
# instance overwrites bytes another one wrote in this phase, the old values are that
# instance's last ones. The write is recorded with a copy of them (``run.spmd_pending``); when
# the phase ends (all instances meet, or the writing instance ends) the bytes must hold those
# values again
# (else err_unexpected_output_dependencies, at the first such write), and a read of the tensor
# in between is the error at once. A tensor read in this phase before the overlapping write is
# the error at that write (``Allocation.rd``: an instance read what another instance may
# overwrite at any time).


def _defer_spmd_write(run, lp, t, w, view, values, api, site) -> None:
    mine = (w >= lp.first_epoch) & (w < lp.epoch)       # written by other instances this phase
    if not mine.any():
        return
    m = np.array(np.broadcast_to(mine, view.shape))
    root = t.root
    run.spmd_pending.append((root, view, m, np.array(values(view)[m]), values, api, site,
                             lp.iteration, _iteration_of(run, int(w[mine].max()), lp)))
    root.pend = lp.first_epoch


def _pending_error(run, lp, p, detail, m=None):
    root, view, mine, old, _values, api, site, it, other = p
    m = mine if m is None else m
    return nki_error("err_unexpected_output_dependencies", loop=loop_name(lp), name=root.name,
                     region=_strip_name(tensor_region(view, m), view),
                     detail=f": {_iter_str(lp, it)} ('{api}' at {where(*site)}) writes what "
                            f"{_iter_str(lp, other)} wrote, other values with no "
                            f"synchronisation between them: {detail}; offset the destination "
                            "by nl.program_id")


def check_pending_read(run, t) -> None:
    """A read (by any instance) of a tensor instances wrote with other values this phase."""
    lp = run.spmd
    root = t.root
    for p in run.spmd_pending:
        if p[0] is root:
            raise _pending_error(run, lp, p, "the cores' writes land in any order, so what "
                                 "this read sees is not determined (nisa.core_barrier first)")


def settle_spmd_writes(run) -> None:
    """The phase ended (all instances met, or the launch ended): every recorded overlapping
    write must have left the values the earlier instance wrote (see above)."""
    pending, run.spmd_pending = run.spmd_pending, []
    if not pending:
        return
    lp = run.spmd
    for p in pending:
        p[0].pend = None
    for p in pending:
        root, view, m, old, values, api, site, it, other = p
        now = np.asarray(values(view)[m])
        same = (now == old) | ((now != now) & (old != old))
        if not same.all():
            bad = m.copy()
            bad[m] = ~same
            raise _pending_error(run, lp, p, "they end with other values, so the result "
                                 "depends on which core writes last", bad)
        run.warn(("spmd_order_independent",),
                 f"program instances write `{root.name}` without synchronisation: "
                 f"{_iter_str(lp, it)} ('{api}' at {where(*site)}) overwrites what "
                 f"{_iter_str(lp, other)} wrote with other values, then both end with the same "
                 "values (the result does not depend on their order; redundant work: offset "
                 "the destination by nl.program_id)", site=site)


def _bump(root, epoch) -> None:
    """Keep ``root.hi`` an upper bound of the epochs in the tensor's shadow."""
    if root.hi < epoch:
        root.hi = epoch


def _strip_name(s: str, t) -> str:
    return s[len(t.name):] if s.startswith(t.name) else s


# ---------------------------------------------------------------------------------------------
# outputs


def check_outputs(run, outputs) -> None:
    """``err_tensor_output_not_written_to`` for any returned HBM tensor never written; the
    uninitialized read for one whose every element was computed from never-written memory
    (``nkisim.tensor._apply_taint``); a warning for one partly written or partly garbage."""
    outputs_check = "outputs" in run.checks
    if not outputs_check and "uninit" not in run.checks:
        return
    for t in outputs:
        if t._ws is None or t.root.param:
            continue
        origin = getattr(t.root, "taint", None)     # stored from never-written memory
        if origin is None and not outputs_check:
            continue
        root = t.root
        if root.shadow is None and (root.uniform or (root.boxes is not None and (
                root.boxes.base or root.boxes.vol == root.boxes.size))):
            continue                # every element written (the summaries say so)
        w = shadow_view(t)
        unwritten = w == 0
        if not unwritten.any():
            continue
        n = int(unwritten.sum())
        coords = _root_coords(t, unwritten)
        root_shape = t.root.shadow.shape if t.root.shadow is not None else t.shape
        if coords is not None:
            region, shape = _bbox(coords), shape_str(root_shape)
            if tuple(root_shape) != tuple(t.shape):
                shape += f" (returned as {shape_str(t.shape)})"
        else:
            region, shape = region_str(unwritten), shape_str(t.shape)
        if n == w.size and origin is not None:
            raise origin            # all of it computed from never-written memory
        if n < w.size:
            # Partly written: a warning, not the error. The documented error is for an output
            # "never written to" (a dead loop; nki.errors.rst err_tensor_output_not_written_to),
            # and AWS's CI-tested doc examples `example_indirect_save_1/2`
            # (aws-neuron-sdk nki/test/test_nki_nl_load_store_indirect.py) return a [128, 512]
            # output whose rows 0, 2, ..., 126 only are written by an indirect store, the
            # test reading back just those rows. The unwritten elements keep nkisim's poison
            # (NaN for floats), so a result compared whole still fails.
            came = "" if origin is None else f"; the first came from this {origin}"
            # (at the output's allocation in the kernel: the check runs after the kernel
            # returned, and the caller's line would name the tool that called it)
            run.warn(("output_partly_written",),
                     f"output tensor `{t.name}` is only partly written: {n} of {w.size} "
                     f"elements (region {region}) of shape {shape} hold no value written by the "
                     f"kernel (garbage on device): a loop bound or tail that misses part of "
                     f"the output, unless the caller reads back only the written part{came}",
                     site=(root.file, root.line) if root.file else None)
            continue
        desc = f"all {n} elements"
        raise nki_error("err_tensor_output_not_written_to", name=t.name,
                        region=f"{desc} (region {region})", shape=shape)

