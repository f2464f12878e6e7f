"""Tensors on HBM, SBUF and PSUM; views; reads and writes with the hardware's numerics.

Layout (ref §1.2): SBUF/PSUM are 2-D memories of 128 partitions; a tile's partition dimension maps
to partitions and the free dimensions are laid out row-major inside each partition. nkisim stores
an auto-allocated SBUF/PSUM tensor as a NumPy array of shape ``(P, *free)`` in its own dtype (bf16
and fp8 through ml_dtypes), so every write rounds to the dtype (RNE). A tensor with block
dimensions before the partition dimension (``(B, par_dim(P), F)``) is stored ``(P, B, F)`` and
viewed transposed, as the hardware lays blocks out in the free space. Direct-allocated tensors
(``ncc.sbuf.mod_alloc``) are views into one byte array per SBUF, so tensors placed at overlapping
addresses really share storage. HBM tensors are linear NumPy arrays; ``reshape`` gives views.

Every tensor element also has a *shadow*: the epoch of its last write (0 = never written, see
``nkisim.context``). Reads check it (uninitialized memory, loop-carried dependencies) and writes
stamp it (races between ``affine_range`` iterations); ``nkisim.checks`` holds those rules.
"""

from __future__ import annotations

import linecache
import math
import re
import sys
import types
import weakref
from typing import NamedTuple

import numpy as np

from . import checks, context, dtypes, psum_init
from .errors import nki_error, shape_str
from .indexing import IndexExpr, MaskExpr, normalize_key, split_shape, whole
from .memory import TOUCHED
from .trace import TENSOR as TENSOR_ENGINE
from .trace import Region

# ---------------------------------------------------------------------------------------------
# buffers


class Buffer:
    """A memory: ``nl.sbuf``, ``nl.psum``, ``nl.hbm``/``nl.private_hbm``, ``nl.shared_hbm``."""

    __slots__ = ("name", "kind", "shared")

    def __init__(self, name, kind, shared=False):
        self.name, self.kind, self.shared = name, kind, shared

    def __repr__(self):
        return f"nl.{self.name}"

    @property
    def value(self):
        """As ``nl.MemoryRegion``'s Enum members have it: ``nl.sbuf.value == 'sbuf'`` (0.6.0
        stub: ``class MemoryRegion(Enum): sbuf = 'sbuf' ...``)."""
        return self.name

    # ``t.buffer == nl.sbuf`` (nki-library: `tensor.buffer in (nl.hbm, nl.shared_hbm,
    # nl.private_hbm)`): buffers are equal when they are the same kind of memory with the same
    # sharing (nl.hbm is nl.private_hbm, STUB-R32 language); a placed tensor's buffer equals
    # nl.sbuf. A buffer also equals its kind or name as a string (t.buffer == "sbuf").
    def __eq__(self, other):
        if isinstance(other, Buffer):
            return self.kind == other.kind and self.shared == other.shared
        if isinstance(other, str):
            return other in (self.kind, self.name)
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(self.kind)


class DirectAlloc(Buffer):
    """``ncc.sbuf.mod_alloc(base_addr=, base_partition=, num_par_tiles=, num_free_tiles=)``."""

    __slots__ = ("base_addr", "base_partition", "num_par_tiles", "num_free_tiles")

    def __init__(self, kind, base_addr=0, base_partition=0, num_par_tiles=(), num_free_tiles=()):
        super().__init__(f"{kind}.mod_alloc", kind)
        if int(base_addr) < 0 or int(base_partition) < 0:
            raise nki_error("nkisim_invalid_argument", api=f"ncc.{kind}.mod_alloc",
                            why="base_addr and base_partition must be >= 0")
        self.base_addr = int(base_addr)
        self.base_partition = int(base_partition)
        self.num_par_tiles = tuple(num_par_tiles)
        self.num_free_tiles = tuple(num_free_tiles)


sbuf = Buffer("sbuf", "sbuf")
psum = Buffer("psum", "psum")
hbm = Buffer("hbm", "hbm")
private_hbm = Buffer("private_hbm", "hbm")
shared_hbm = Buffer("shared_hbm", "hbm", shared=True)
_BY_KIND = {"sbuf": sbuf, "psum": psum, "hbm": hbm}


def buffer_of(buffer) -> Buffer:
    if buffer is None:
        return sbuf
    if isinstance(buffer, Buffer):
        return buffer
    raise nki_error("nkisim_invalid_argument", api="tensor creation",
                    why=f"buffer must be nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, "
                        f"nl.private_hbm or a direct allocation, not {buffer!r}")


# ---------------------------------------------------------------------------------------------
# allocations


class Allocation:
    """The storage behind a tensor and all its views."""

    __slots__ = ("id", "buffer", "name", "key", "row_bytes", "p_base", "shadow", "param",
                 "mutable", "live", "pbytes", "banks", "loop", "file", "line", "direct",
                 "dtype", "shape", "epoch", "hi", "gen", "version", "full", "uniform", "taint",
                 "adopted", "store", "buf", "base_off", "unpoisoned", "nparts", "rd", "pend",
                 "span", "born", "boxes", "garbage", "psum_set", "__weakref__")

    # (the fields an SBUF/PSUM tile sets are parameters: each is set once, issue 12)
    def __init__(self, buffer, name, dtype, shape, id=0, file="", line=0, epoch=0, buf=None,
                 key=None, pbytes=0, banks=0, nparts=128):
        self.buffer = buffer          # "hbm" | "sbuf" | "psum"
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.id = id
        self.key = key
        self.row_bytes = pbytes
        self.p_base = 0
        self.base_off = 0             # direct allocation: byte offset of its first element
        self.shadow = None
        self.param = False
        self.mutable = False
        self.live = False
        self.pbytes = pbytes
        self.nparts = nparts          # SBUF/PSUM: partitions the tile spans (nkisim.memory)
        self.banks = banks
        self.loop = None
        self.file = file
        self.line = line
        self.direct = False
        self.epoch = epoch            # epoch it was created in (nkisim.checks)
        self.hi = epoch               # upper bound of the epochs in its shadow (nkisim.checks)
        self.gen = 0                  # number of writes (nkisim.checks)
        self.version = 0              # number of writes, checked or not (_write_begin, _add_into)
        self.full = -1                # True once fully written, else `gen` of the last check
        self.uniform = None           # the epoch of every shadow element, when known
        self.taint = None             # the uninitialized read its never-written values came from
        self.garbage = None           # its elements written with garbage (checks.garbage_view)
        self.adopted = False          # storage adopted from an instruction, not yet "written"
        self.store = None             # a lazy shadow's tile storage (see checks.LAZY)
        self.boxes = None             # a lazy shadow written in parts (checks.BoxShadow)
        self.buf = buf                # the Buffer it was created in (None: by kind)
        # storage not yet filled with the poison (allocated lazily, see ``poisoned``)
        self.unpoisoned = None
        self.rd = 0                   # latest epoch it was read in, in a multi-instance launch
        self.pend = None              # program instances' pending overlapping writes (checks)
        self.span = None              # [first, last] touch while measured (nkisim.memory)
        self.born = 0                 # clock at its allocation (nkisim.memory)
        self.psum_set = None          # PSUM: the non-matmul op that last wrote it (_write_end)


_ids = iter(range(1, 1 << 62))
_NAME_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")


_NAMES: dict = {}        # (file, line) -> the variable assigned on that line, or None


def _infer_name(file: str, line: int, default: str) -> str:
    """The variable a tensor is assigned to on its source line (``a_tile = nl.ndarray(...)``).
    Looked up once per source line (a loop body allocates at the same lines every iteration)."""
    if not file:
        return default
    key = (file, line)
    name = _NAMES.get(key, False)
    if name is False:
        m = _NAME_RE.match(linecache.getline(file, line))
        name = _NAMES[key] = m.group(1) if m else None
    return name or default


def _site_key(run, buffer, file, line, result=False):
    """Physical key of an auto-allocated tile: its allocation site within the loop body.

    A tile allocated at the same place in a loop body reuses its buffer in every iteration
    (the compiler allocates one buffer per allocation site unless the kernel asks for more);
    allocations at one site within the same iteration get distinct buffers. Without
    ``skip_middle_end_transformations`` the compiler multi-buffers the tiles an instruction
    defines in an affine_range body (``x = nl.load(...)``; ``runtime.multi_buffer_factor``):
    iteration i then uses buffer ``i % factor``. A tile the kernel declares (``nl.ndarray``) and
    fills with ``x[...] = ...`` keeps the one buffer it declared. (Calibration, trn1 handout: the
    tiled kernel, which declares its tiles, costs ~1 us per iteration whether a DMA has 1 or 128
    descriptors, i.e. its iterations serialize; the stream kernel, `x = nl.load(...)`, overlaps
    them: 0.4 us per iteration.)
    """
    counts = run.memory.site_counts
    site = (buffer, file, line, run.epoch)
    n = counts.get(site, 0)
    counts[site] = n + 1
    mb = run.multi_buffer        # buffers per site in affine_range bodies (runtime.py)
    if mb > 1 and run.loops and run.loops[-1].kind == "affine":
        if result:
            return (buffer, file, line, n, run.loops[-1].iteration % mb)
        # a declared tile: multi-buffered too unless a DMA fills it (the scheduler decides,
        # nkisim.schedule._Renamer; evidence in nkisim.cost, "buffers")
        return (buffer, file, line, n, run.loops[-1].iteration % mb, "decl")
    return (buffer, file, line, n)


def _new_alloc(run, kind, name, dtype, shape, arr, file, line):
    return Allocation(kind, name, dtype, shape, next(_ids), file, line, run.epoch)


def allocate(shape, dtype, buffer=None, name="", fill=None, api="nl.ndarray",
             poison=True, storage=None, run=None, where=None) -> Tensor:
    """Create a tensor (``nl.ndarray``/``zeros``/``full``...) in the current kernel.

    ``poison=False`` is for an instruction's result tile that is written whole right away:
    filling it with NaN first would be wasted work. ``storage``: for such a tile, an array the
    instruction just computed and nobody else references; when it already has the tile's
    storage dtype and layout it becomes the tile's storage (no copy: ``write`` then only
    stamps the shadow), otherwise it is ignored. ``run``, ``where``: the current run and the
    kernel's (file, line), when the caller has them.
    """
    if run is None:
        run = context.current()
    nl_api = api.startswith("nl.")
    try:        # a tile shape/dtype/buffer this run has validated before (issue 12)
        spec = run.alloc_specs.get((shape, dtype, id(buffer), nl_api))
    except TypeError:           # an unhashable shape (a list): the general path
        spec = None
    if spec is not None:
        return _allocate_tile(run, spec, name, fill, api, poison, storage, nl_api, where)
    buf = buffer_of(buffer)
    dt = dtypes.normalize(dtype)
    if dt not in dtypes.SUPPORTED:
        raise nki_error("nkisim_operand_dtype", param="dtype", api=api, dtype=dt,
                        allowed=", ".join(sorted(dtypes.name(d) for d in dtypes.SUPPORTED)))
    orig_shape = shape
    shape, paxis = split_shape(shape)
    file, line = where if where is not None else context.caller_location()
    name = name or _infer_name(file, line, f"{buf.kind}_tensor")
    sdt = dtypes.storage(dt)
    if any(d <= 0 for d in shape):  # (region arithmetic divides by the free size: issue 9)
        raise nki_error("nkisim_empty_tensor", what=f"{buf.kind.upper()} tensor", name=name,
                        shape=shape_str(shape), kind="a negative dimension" if min(shape) < 0
                        else "an empty tensor")

    if buf.kind == "hbm":
        if fill is not None:
            raise nki_error("err_hbm_tensor_with_init_value_not_supported")
        if buf.shared and run.nesting == 0 and run.loops and not (
                run.rules.unrolled_loops and all(lp.kind == "static" for lp in run.loops)):
            raise nki_error("err_shared_hbm_must_in_kernel_level")
        if buf.shared and run.grid and run.program_ids != (0,) * len(run.grid):
            # SPMD instances share shared_hbm tensors: the n-th created is the same tensor.
            if run.shared_hbm_cursor < len(run.shared_hbm):
                t = run.shared_hbm[run.shared_hbm_cursor]
                run.shared_hbm_cursor += 1
                return t
        arr = np.full(shape, dtypes.poison(dt), dtype=sdt)
        a = _new_alloc(run, "hbm", name, dt, shape, arr, file, line)
        a.key = ("hbm", a.id)
        a.buf = buf
        shadow = None
        if run.checks:
            # a lazy shadow (nkisim.checks.LAZY), never written: an output written in boxes
            # (one store per tile) never gets an int32 per element (issue 12)
            a.store = arr
            a.uniform = 0
            shadow = checks.LAZY
        t = Tensor(arr, shadow, a, dt, shape, None, None)
        if len(run.hbm_made) < 4:       # (for runtime._no_return; the first few suffice)
            run.hbm_made.append(a)
        if buf.shared:
            run.shared_hbm.append(t)
            run.shared_hbm_cursor = len(run.shared_hbm)
        return t

    # --- SBUF / PSUM ---
    # A tile the kernel creates needs 2 dimensions (NKI known issues: "nl.zeros((128, ), ...)
    # this won't work"); an instruction's result may be a 1-D partition vector (P,): basic
    # indexing drops integer-indexed dimensions (`buf[:, 0]` is [P], programming model, "Basic
    # Tensor Indexing": `x[:, 1, 0:2].shape == [2, 2]`), and the known-issues page recommends
    # `my_sbuf[0:N, 0]`; AWS's flash attention does `nl.copy(m_buffer[:, 0])`.
    if not shape or (len(shape) < 2 and api.startswith("nl.")):
        raise nki_error("nkisim_insufficient_rank", buffer=buf.kind.upper(), name=name,
                        shape=shape_str(shape), n=shape[0] if shape else 1)
    P = shape[paxis]
    if P > run.arch.pmax:
        raise nki_error("err_num_partition_exceed_arch_limit", n=P, limit=run.arch.pmax)
    if paxis != 0:
        run.rule(("block", file, line), "block dimensions (dimensions before the partition "
                 "dimension) are deprecated in NKI: put them in the free dimensions or use "
                 "lists of tiles (warn_block_dimension_is_deprecated)",
                 "The SBUF/PSUM tensors in NKI used to allow block dimensions in front of the "
                 "partition dimension. The block dimension support has been removed",
                 "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/"
                 "nki_block_dimension_migration_guide.html")
    blocks, free = shape[:paxis], shape[paxis + 1:]
    nfree = math.prod(free)
    nblocks = math.prod(blocks)
    pbytes = nblocks * nfree * sdt.itemsize
    if buf.kind == "psum" and nfree * sdt.itemsize > run.arch.psum_bank_bytes:
        if not run.rules.psum_tile_spans_banks:
            raise nki_error("nkisim_psum_bank_overflow", name=name, shape=shape_str(shape),
                            dtype=dtypes.name(dt), nbytes=nfree * sdt.itemsize,
                            bank=run.arch.psum_bank_bytes, fmax=run.arch.psum_fmax)
        if nfree * sdt.itemsize > run.arch.psum_partition_bytes:
            raise nki_error("nkisim_psum_tile_overflow", name=name, shape=shape_str(shape),
                            dtype=dtypes.name(dt), nbytes=nfree * sdt.itemsize,
                            limit=run.arch.psum_partition_bytes)
    if isinstance(buf, DirectAlloc):
        if fill is not None:
            raise nki_error("err_tensor_creation_on_scratchpad_with_init_value_not_supported")
        return _allocate_direct(run, buf, name, dt, shape, paxis, file, line)

    if buf.kind == "sbuf" and "capacity" in run.checks and pbytes > run.arch.sbuf_usable_bytes:
        # Refuse before NumPy tries to allocate it: a (128, 1e9) tile is the SBUF overflow the
        # device compiler reports, not a host MemoryError (issue 9).
        raise nki_error("nkisim_sbuf_overflow", need=run.memory.sbuf_live + pbytes,
                        limit=run.arch.sbuf_usable_bytes, target=run.arch.name,
                        largest=f"`{name}` {shape_str(shape)} {dtypes.name(dt)}: {pbytes} B "
                                f"({context.where(file, line)})")
    if not paxis:
        # everything above depends on (shape, dtype, buffer, nl_api) and the run only
        spec = _TileSpec(buf, dt, sdt, shape, (P,) + free, pbytes,
                         -(-pbytes // run.arch.psum_bank_bytes) if buf.kind == "psum" else 0,
                         dtypes.poison(dt), f"{buf.kind}_tensor")
        try:
            run.alloc_specs[(orig_shape, dtype, id(buffer), nl_api)] = spec
        except TypeError:
            pass
        return _allocate_tile(run, spec, name, fill, api, poison, storage, nl_api, (file, line))
    # block dimensions before the partition axis (deprecated, warned above): stored partition
    # first, viewed in the kernel's order, with an element-wise shadow
    phys_shape = (P,) + blocks + free
    arr = _filled(phys_shape, dt, sdt, fill) if fill is not None else \
        np.full(phys_shape, dtypes.poison(dt), dtype=sdt) if poison else \
        np.empty(phys_shape, dtype=sdt)
    a = _new_alloc(run, buf.kind, name, dt, shape, arr, file, line)
    a.buf = buf
    a.key = _site_key(run, buf.kind, file, line, result=not nl_api)
    a.row_bytes = pbytes
    a.pbytes = pbytes
    a.nparts = P
    if buf.kind == "psum":
        a.banks = -(-pbytes // run.arch.psum_bank_bytes)
    perm = tuple(range(1, paxis + 1)) + (0,) + tuple(range(paxis + 1, len(shape)))
    arr = arr.transpose(perm)
    shadow = None
    if run.checks:
        if fill is not None:
            a.shadow = np.full(shape, run.epoch, np.int32)
            a.gen, a.full, a.uniform = 1, True, run.epoch     # written whole (nkisim.checks)
        else:
            a.shadow = np.zeros(shape, np.int32) if poison else np.empty(shape, np.int32)
        shadow = a.shadow
    t = Tensor(arr, shadow, a, dt, shape, paxis, None)
    run.memory.allocate(a, t)
    return t


def _filled(phys_shape, dt, sdt, fill) -> np.ndarray:
    """Tile storage holding ``fill`` everywhere (``nl.zeros``/``nl.full``), rounded to ``dt``."""
    if dt == dtypes.TF32:
        return dtypes.cast(np.full(phys_shape, fill, np.float32), dt)
    return np.full(phys_shape, fill, dtype=sdt)


class _TileSpec(NamedTuple):
    """What ``allocate`` derives from an SBUF/PSUM tile's (shape, dtype, buffer) after
    validating them: the same for every tile of a loop body (cached per run, issue 12)."""

    buf: Buffer
    dt: np.dtype
    sdt: np.dtype
    shape: tuple
    phys_shape: tuple
    pbytes: int
    banks: int
    poison: object
    default_name: str


def _allocate_tile(run, spec, name, fill, api, poison, storage, nl_api, where=None) -> Tensor:
    """The SBUF/PSUM part of ``allocate`` (partition axis first, automatic placement).
    ``where``: the kernel's (file, line) when the caller knows it (no frame walk)."""
    if where is None:
        where = context.caller_location()
    file, line = where
    if not name:            # (the variable's name is looked up once per source line)
        name = _NAMES.get(where, False)
        if not name:
            name = spec.default_name if name is None else \
                _infer_name(file, line, spec.default_name)
    dt, sdt, phys_shape = spec.dt, spec.sdt, spec.phys_shape
    adopted = False
    if storage is not None and fill is None and not poison and dt is sdt and \
            (storage.dtype is sdt or storage.dtype == sdt) and storage.shape == phys_shape:
        flags = storage.flags
        adopted = flags.c_contiguous and flags.writeable
    if adopted:
        arr = storage            # adopted: the instruction computed straight into the tile
    elif fill is None:
        arr = np.empty(phys_shape, dtype=sdt)
    else:
        arr = _filled(phys_shape, dt, sdt, fill)
    kind = spec.buf.kind
    epoch = run.epoch
    key = _site_key(run, kind, file, line, not nl_api)
    a = Allocation(kind, name, dt, spec.shape, next(_ids), file, line, epoch, spec.buf, key,
                   spec.pbytes, spec.banks, phys_shape[0])
    if adopted:
        # the instruction's values are the storage: its write (the next call, ``write(t,
        # storage)``) only has to stamp the shadow, done here with the summaries a whole-tile
        # write leaves (nkisim.checks.check_write), so that write returns at once
        a.adopted = True
    elif poison and fill is None:
        # poisoned lazily: at the first access that is not a whole-tile write (``poisoned``),
        # so a tile the next instruction writes whole is never filled (issue 12)
        a.unpoisoned = arr
    shadow = None
    if run.checks:
        # A lazy shadow (nkisim.checks.LAZY): every element has the epoch ``uniform`` until a
        # write covers part of the tile; most tiles are written whole (an instruction's result,
        # a PSUM accumulator), so their int32-per-element shadow is never filled (issue 12).
        a.store = arr
        shadow = checks.LAZY
        if adopted or fill is not None:
            a.gen, a.full, a.uniform = 1, True, epoch     # written whole
        else:
            a.uniform = 0                                 # never written
    t = Tensor(arr, shadow, a, dt, spec.shape, 0, None)
    # its region (``_region`` of a whole tile): partitions [0, P), bytes [0, pbytes)
    t._region = _new_region(Region, (kind, key, name, 0, phys_shape[0], 0, spec.pbytes))
    run.memory.allocate(a, t)
    return t


_new_region = tuple.__new__     # Region(...) without the NamedTuple's Python-level __new__


def _traced_base(run, buf, file, line) -> tuple:
    """The (partition, byte address) a direct allocation gets, as the real front end sees it.

    The front end traces a loop body once (ref §1.9), so an allocation site inside
    ``affine_range``/``sequential_range`` loops is placed once per activation of the outermost
    such loop, with the address the kernel's Python computed the first time. nkisim runs every
    iteration, and a kernel that bumps an address counter in the loop body (AWS's
    reference/allocated_attention.py: ``cur_addr += seqlen * ...`` after each ``mod_alloc`` in
    its ``affine_range`` over query tiles, CI-tested at seqlen 4096 on device) would otherwise
    walk out of the SBUF: later iterations reuse the first iteration's placement. Static loops
    are unrolled by the front end, so their iterations are told apart."""
    traced = [lp for lp in run.loops if lp.kind != "static"]
    if not traced:
        return buf.base_partition, buf.base_addr
    key = (file, line, traced[0].id,
           tuple((lp.id, lp.iteration) for lp in run.loops if lp.kind == "static"))
    return run.direct_sites.setdefault(key, (buf.base_partition, buf.base_addr))


def _allocate_direct(run, buf: DirectAlloc, name, dt, shape, paxis, file, line):
    """Direct allocation: views of the whole SBUF/PSUM byte array (real aliasing)."""
    run.allocated_kernel = True
    kind = buf.kind
    total = run.arch.sbuf_partition_bytes if kind == "sbuf" else run.arch.psum_partition_bytes
    attr = "sbuf_bytes" if kind == "sbuf" else "psum_bytes"
    mem = getattr(run, attr)
    if mem is None:
        mem = np.full((run.arch.pmax, total), 0xFF, np.uint8)    # poison: NaN for every float
        setattr(run, attr, mem)
    sdt = dtypes.storage(dt)
    blocks, free = shape[:paxis], shape[paxis + 1:]
    P = shape[paxis]
    tile_bytes = math.prod(free) * sdt.itemsize
    nft = buf.num_free_tiles or tuple(1 for _ in blocks) or ()
    if len(nft) < len(blocks):
        nft = tuple(nft) + (1,) * (len(blocks) - len(nft))
    nslots = math.prod(nft) if blocks else 1
    place = getattr(buf, "place", None)      # ncc.sbuf.alloc(func): a placement per block
    if place is not None:
        nft = tuple(blocks)
        nslots = math.prod(nft) if blocks else 1
        spots = [place(idx, P, tile_bytes, run.arch) for idx in np.ndindex(*nft)] \
            if blocks else [place((), P, tile_bytes, run.arch)]
    else:
        base_p, base = _traced_base(run, buf, file, line)
        spots = [(base_p, base + j * tile_bytes) for j in range(nslots)]
    for p0, lo in spots:
        if lo < 0 or lo + tile_bytes > total or p0 < 0 or p0 + P > run.arch.pmax:
            raise nki_error("nkisim_invalid_argument", api=f"ncc.{kind}.mod_alloc",
                            why=f"[NLA001] Allocated memory out of bound {{{name}}}@"
                                f"{'SB' if kind == 'sbuf' else 'PSUM'}<{p0},{lo}>"
                                f"({P}x{tile_bytes}): the {kind.upper()} has {total} bytes "
                                f"per partition")
    slots, offs = [], []
    for p0, lo in spots:
        v = mem[p0:p0 + P, lo:lo + tile_bytes].view(sdt).reshape((P,) + free)
        slots.append(v)
        offs.append(p0 * total + lo)
    a = Allocation(kind, name, dt, shape)
    a.id = next(_ids)
    a.file, a.line = file, line
    a.direct = True
    a.buf = buf
    a.key = (kind, "direct")
    a.row_bytes = total
    a.p_base = 0
    logical = tuple(blocks) + (P,) + tuple(free)
    a.shadow = np.zeros(logical, np.int32) if run.checks else None
    if not blocks:
        a.base_off = offs[0]
        return Tensor(slots[0], a.shadow, a, dt, logical, 0, None, offs[0])
    t = Tensor(None, a.shadow, a, dt, logical, paxis, None)
    t._slots = (slots, tuple(blocks), nft, offs)
    return t


def from_numpy(arr: np.ndarray, name: str, *, mutable: bool = False) -> Tensor:
    """Wrap a kernel argument (a NumPy array) as an HBM tensor; no copy."""
    run = context.current()
    arr = np.asarray(arr)
    dt = arr.dtype
    if dt not in dtypes.SUPPORTED:
        raise nki_error("nkisim_operand_dtype", param=name, api="kernel call", dtype=dt,
                        allowed="float32, float16, bfloat16, float8_e4m3, float8_e5m2, "
                                "float8_e4m3fn, float8_e8m0fnu, int8, int16, int32, uint8, "
                                "uint16, uint32, bool (cast the NumPy array first, e.g. "
                                "x.astype(np.float32))")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    elif mutable and not arr.flags.writeable:
        arr = arr.copy()          # the kernel may write it (nkisim.runtime writes it back)
    a = _new_alloc(run, "hbm", name, dt, arr.shape, arr, "", 0)
    a.key = ("hbm", a.id)
    a.param = True
    a.mutable = mutable
    shadow = None
    if mutable and run.checks:
        # Written by the host before the kernel: epoch 1 everywhere, a lazy shadow
        # (nkisim.checks.LAZY) that gets its int32 per element only if the kernel writes part
        # of the argument. The nki face makes every argument writable, and an int32 per
        # element doubled a bf16 input's bytes (nki-library's rmsnorm_quant at 2x23552x11776:
        # 2.2 GB of shadow for a 1.1 GB input).
        a.store = arr
        a.gen, a.full, a.uniform = 1, True, 1
        shadow = checks.LAZY
    return Tensor(arr, shadow, a, dt, arr.shape, None, None)


# ---------------------------------------------------------------------------------------------
# tensors


# The operations a tile's methods and operators issue (``t + u``, ``t.astype``, the copy of
# ``dst[...] = t``) are instructions defined one layer up, in nkisim.ops, which registers itself
# here when imported: this module imports nothing above it (DESIGN.md, "data flows one way").
_ops = None


def register_ops(module) -> None:
    global _ops
    _ops = module


def _view_primitive(fn):
    """A NkiTensor view primitive of nki 0.5.0+ (``context.Rules.view_primitives``): an
    AttributeError, as on the device, in a kernel of a dialect or version without it."""
    name = fn.__name__

    def method(self, *args, **kwargs):
        run = context.maybe_current()
        if run is not None and not run.rules.view_primitives:
            rules = run.rules
            if rules.dialect == "beta1":
                why = ("a view primitive of the current nki package (0.5.0+); Beta 1's "
                       "tensors have reshape, view, astype, broadcast_to and expand_dims")
            else:
                why = ("added in NKI 0.5.0; NKISIM_NKI_VERSION="
                       + ".".join(map(str, rules.version)))
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}' "
                                 f"({why})")
        return fn(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = fn.__doc__
    return method


class Tensor:
    """An NKI tensor or a view of one (``nki.tensor`` in the real API)."""

    __slots__ = ("_arr", "_ws", "root", "dtype", "shape", "paxis", "_idx", "_slots", "_producer",
                 "_inplace", "_off", "_oob", "_mask", "_reduce", "_region", "_views",
                 "_opmask", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, arr, shadow, root, dtype, shape, paxis, idx, off=0):
        self._off = off             # byte offset of the view's first element in the storage
        self._arr = arr
        self._ws = shadow           # the write-epoch shadow (``_w``), None, or checks.LAZY
        self.root = root
        self.dtype = dtype
        self.shape = shape if type(shape) is tuple else tuple(shape)
        self.paxis = paxis          # partition axis of this view (None: HBM or partition removed)
        self._idx = idx             # advanced index into _arr/_w, or None
        self._slots = None
        self._producer = None
        self._inplace = False
        self._oob = None            # (out-of-bound elements, error fields): see normalize_key
        self._mask = None           # the mask the last masked write of this view used
        self._reduce = None         # ALU op of a pending `dst[...] = nl.loop_reduce(...)`
        self._region = None         # region(self), once computed (a view's place is fixed)
        self._views = None          # on-chip: the views of common keys taken so far (_view)
        self._opmask = None         # a matmul operand's mask, `t[i_f < n]` (operand_masked)

    @property
    def _w(self):
        """The write epochs of the view's elements (nkisim.checks), None without checks: a
        writable array (a lazy shadow is materialized; the checks' reads use
        ``checks.shadow_view``, which does not)."""
        w = self._ws
        if w is checks.LAZY:
            checks.materialize(self.root)
            w = checks.lazy_view(self)
        return w

    @_w.setter
    def _w(self, value):
        self._ws = value

    # --- nki.tensor API (ref §1.2) ---
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def buffer(self):
        """The memory it lives in: ``nl.sbuf``, ``nl.psum``, ``nl.shared_hbm``... (a Buffer,
        which also equals its kind as a string: ``t.buffer == "hbm"``)."""
        root = self.root
        return root.buf if root.buf is not None else _BY_KIND[root.buffer]

    @property
    def name(self):
        return self.root.name

    def __repr__(self):
        return (f"<nki tensor '{self.name}' {shape_str(self.shape)} {dtypes.name(self.dtype)} "
                f"in {self.root.buffer}>")

    def __len__(self):
        return self.shape[0]

    def reshape(self, *shape, **kwargs):
        """A view with a new shape (no copy). Element counts must match. The shape may be given
        as ``shape=`` (AWS's nki-samples reference/vision.py: ``a.reshape(shape=(...))``)."""
        if not shape and ("shape" in kwargs or "newshape" in kwargs):
            shape = (kwargs.get("shape", kwargs.get("newshape")),)
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape, paxis = split_shape(shape)
        if math.prod(shape) != math.prod(self.shape):
            raise nki_error("nkisim_invalid_argument", api="reshape",
                            why=f"cannot reshape `{self.name}` {shape_str(self.shape)} "
                                f"({math.prod(self.shape)} elements) to {shape_str(shape)}")
        self._plain("reshape")
        if self.root.buffer != "hbm":
            if shape[0] != self.shape[0] and self.paxis == 0:
                raise nki_error("nkisim_invalid_argument", api="reshape",
                                why="reshaping an SBUF/PSUM tile must keep the partition "
                                    f"dimension ({self.shape[0]})")
        # A view, never a copy: Beta 1 "Return a new view of the tensor, no copy will occur";
        # 0.6.0 "Fails if the current memory layout is incompatible with the requested shape
        # (e.g. after a non-contiguous slice or permute)". (NumPy's reshape copies such a view
        # silently, and its copy's .base is the temporary, not None.)
        try:
            arr = reshape_nocopy(self._arr, shape)
            w = self._ws
            if w is not None and w is not checks.LAZY:
                w = reshape_nocopy(w, shape)
        except (ValueError, AttributeError):
            raise nki_error("nkisim_invalid_argument", api="reshape",
                            why=f"the memory layout of the view `{self.name}` "
                                f"{shape_str(self.shape)} (strides {self.strides}) is "
                                f"incompatible with the shape {shape_str(shape)}: it is not "
                                "contiguous (a slice or a permute); reshape the whole tensor, "
                                "then slice") from None
        return Tensor(arr, w, self.root, self.dtype, shape,
                      None if self.root.buffer == "hbm" else 0, None, self._off)

    def view(self, dtype):
        """The same bytes as another dtype (``tensor.view``, 2.28). A dtype of another size
        changes the last dimension, as NumPy's ``view`` does (the last dimension must be
        contiguous)."""
        dt = dtypes.normalize(dtype)
        self._plain("view")
        try:
            arr = self._arr.view(dtypes.storage(dt))
        except ValueError:
            raise nki_error("nkisim_invalid_argument", api="view",
                            why=f"cannot view `{self.name}` {shape_str(self.shape)} "
                                f"{dtypes.name(self.dtype)} as {dtypes.name(dt)}: the last "
                                "dimension must be contiguous and its byte size divisible by "
                                "the new itemsize") from None
        if arr.shape == self._arr.shape:
            return Tensor(arr, self._ws, self.root, dt, self.shape, self.paxis, None, self._off)
        t = Tensor(arr, None, self.root, dt, arr.shape, self.paxis, None, self._off)
        _coarse_shadow(self)
        return t

    # --- access patterns (nki 0.2+: NkiTensor.ap; spec nki-current.md §2.0 item 3) ---
    def ap(self, pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0,
           dtype=None):
        """A view given by an access pattern ``[[stride, count], ...]`` (elements of ``dtype``,
        outermost first) starting ``offset`` elements into the tensor's *storage*: ``.ap()``
        ignores the view it is called on (LG warning). On SBUF/PSUM the first pair is the
        partition dimension and its stride must equal the storage's free-element count
        (LG §ap). Strides may be 0 (a broadcast: NL ``core/max/cascaded_max.py``
        ``value.ap([[1, P], [0, 8]])``). ``scalar_offset`` (a register or a [1, 1] tile)
        adds ``value * stride`` of the tensor's dimension ``indirect_dim``; ``vector_offset``
        (a [n, 1] tile of indices) addresses the first pattern dimension indirectly: its i-th
        row starts at ``vector_offset[i] * stride(indirect_dim)`` (nki-library TensorView
        ``vector_select``)."""
        return _ops.access_pattern(self, pattern, offset, scalar_offset, vector_offset,
                                   indirect_dim, dtype)

    # --- 0.5.0 view primitives (RN 2.31: NkiTensor slice/select/permute/broadcast/...) ---
    @_view_primitive
    def permute(self, dims):
        dims = tuple(int(d) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise nki_error("nkisim_invalid_argument", api="permute",
                            why=f"{list(dims)} is not a permutation of {self.ndim} dimensions")
        if self.paxis == 0 and dims[0] != 0:
            raise nki_error("nkisim_invalid_argument", api="permute",
                            why="the partition dimension of an SBUF/PSUM tensor stays first")
        return self._derive("permute", lambda a: a.transpose(dims))

    @_view_primitive
    def broadcast(self, dim, size):
        dim = self._dim(dim, "broadcast")
        if self.shape[dim] != 1:
            raise nki_error("nkisim_invalid_argument", api="broadcast",
                            why=f"dimension {dim} has size {self.shape[dim]}, not 1")
        self._not_partition(dim, "broadcast")
        shape = self.shape[:dim] + (int(size),) + self.shape[dim + 1:]
        return self._derive("broadcast", lambda a: np.broadcast_to(a, shape))

    @_view_primitive
    def expand_dim(self, dim):
        d = int(dim)
        d = d + self.ndim + 1 if d < 0 else d
        if not 0 <= d <= self.ndim:
            raise nki_error("nkisim_invalid_argument", api="expand_dim",
                            why=f"position {int(dim)} out of range for {self.ndim} dimensions")
        self._not_partition(d, "expand_dim")
        return self._derive("expand_dim", lambda a: np.expand_dims(a, d))

    @_view_primitive
    def squeeze_dim(self, dim):
        dim = self._dim(dim, "squeeze_dim")
        if self.shape[dim] != 1:
            raise nki_error("nkisim_invalid_argument", api="squeeze_dim",
                            why=f"dimension {dim} has size {self.shape[dim]}, not 1")
        self._not_partition(dim, "squeeze_dim")
        return self._derive("squeeze_dim", lambda a: a.squeeze(axis=dim))

    def _not_partition(self, dim, api):
        """0.6.0 stub (broadcast, expand_dim, squeeze_dim): "On-chip tensors: ``dim`` must
        not be 0" (the partition dimension)."""
        if dim == 0 and self.root.buffer != "hbm" and self.paxis == 0:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why="dim must not be 0 (the partition dimension) for an SBUF/PSUM "
                                "tensor")

    @_view_primitive
    def slice(self, dim, start, end, step=1):
        """0.6.0 stub constraints: "``0 <= start < end <= t.shape[dim]``", "``step >= 1``"."""
        dim = self._dim(dim, "slice")
        start, end, step = (whole(v, f"the {n} of slice") for v, n in
                            ((start, "start"), (end, "end"), (step, "step")))
        if step < 1:
            raise nki_error("nkisim_invalid_argument", api="slice",
                            why=f"step must be >= 1, got {step}")
        if not 0 <= start < end <= self.shape[dim]:
            raise nki_error("nkisim_invalid_argument", api="slice",
                            why=f"needs 0 <= start < end <= {self.shape[dim]} (the size of "
                                f"dimension {dim}), got start={start}, end={end}")
        if step != 1 and dim == 0 and self.paxis == 0 and self.root.buffer != "hbm":
            raise nki_error("nkisim_partition_index", name=self.name,
                            what=f"steps through partitions (slice(0, {start}, {end}, {step}))")
        key = (slice(None),) * dim + (slice(start, end, step),)
        return self._derive("slice", lambda a: a[key])

    @_view_primitive
    def select(self, dim, index):
        dim = self._dim(dim, "select")
        if isinstance(index, Tensor):
            return _ops.dynamic_select(self, dim, index)
        i = int(index)
        if not 0 <= i < self.shape[dim]:
            raise nki_error("err_tensor_access_out_of_bound", name=self.name, dim=dim, lo=i,
                            hi=i, size=self.shape[dim])
        if self.paxis == 0 and dim == 0:
            raise nki_error("nkisim_invalid_argument", api="select",
                            why="cannot select on the partition dimension of an SBUF/PSUM "
                                "tensor (slice it to size 1)")
        key = (slice(None),) * dim + (i,)
        return self._derive("select", lambda a: a[key])

    @_view_primitive
    def reshape_dim(self, dim, shape):
        dim = self._dim(dim, "reshape_dim")
        shape = tuple(int(s) for s in shape)
        n = self.shape[dim]
        if shape.count(-1) > 1:
            raise nki_error("nkisim_invalid_argument", api="reshape_dim",
                            why=f"{list(shape)} has {shape.count(-1)} -1 entries; \"one "
                                "element of shape may be -1\"")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(n // known if s == -1 else s for s in shape)
        if math.prod(shape) != n:
            raise nki_error("nkisim_invalid_argument", api="reshape_dim",
                            why=f"cannot split dimension {dim} of size {n} into {list(shape)}")
        if self.paxis == 0 and dim == 0 and len(shape) != 1:
            raise nki_error("nkisim_invalid_argument", api="reshape_dim",
                            why="cannot split the partition dimension of an SBUF/PSUM tensor")
        new = self.shape[:dim] + shape + self.shape[dim + 1:]
        return self._derive("reshape_dim", lambda a: _view_reshape(a, new))

    @_view_primitive
    def flatten_dims(self, start_dim, end_dim):
        a, b = self._dim(start_dim, "flatten_dims"), self._dim(end_dim, "flatten_dims")
        if a > b:
            raise nki_error("nkisim_invalid_argument", api="flatten_dims",
                            why=f"start_dim {start_dim} comes after end_dim {end_dim}: "
                                "flatten_dims merges start_dim through end_dim")
        if self.paxis == 0 and a == 0 and b > 0:
            raise nki_error("nkisim_invalid_argument", api="flatten_dims",
                            why="cannot merge the partition dimension of an SBUF/PSUM tensor")
        new = self.shape[:a] + (math.prod(self.shape[a:b + 1]),) + self.shape[b + 1:]
        return self._derive("flatten_dims", lambda x: _view_reshape(x, new))

    @_view_primitive
    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None):
        """einops-style ``t.rearrange(('b', ('h', 'w'), 'c'), ('b', 'c', 'h', 'w'), {'h': 32})``:
        split the grouped source dimensions (sizes from ``fixed_sizes``, one per group may be
        inferred), permute by name, then merge the grouped destination dimensions. A view."""
        sizes = dict(fixed_sizes or {})
        src = [tuple(g) if isinstance(g, (tuple, list)) else (g,) for g in src_pattern]
        if len(src) != self.ndim:
            raise nki_error("nkisim_invalid_argument", api="rearrange",
                            why=f"source pattern has {len(src)} dimensions, the tensor "
                                f"{self.ndim}")
        names, split = [], []
        for g, n in zip(src, self.shape):
            unknown = [x for x in g if x not in sizes]
            known = math.prod(sizes[x] for x in g if x in sizes)
            if len(unknown) > 1 or (not unknown and known != n) or n % known:
                raise nki_error("nkisim_invalid_argument", api="rearrange",
                                why=f"cannot split a dimension of size {n} into {list(g)} "
                                    f"with sizes {sizes}")
            for x in unknown:
                sizes[x] = n // known
            names.extend(g)
            split.extend(sizes[x] for x in g)
        dst = [tuple(g) if isinstance(g, (tuple, list)) else (g,) for g in dst_pattern]
        order = [x for g in dst for x in g]
        if sorted(order) != sorted(names) or len(set(order)) != len(order):
            raise nki_error("nkisim_invalid_argument", api="rearrange",
                            why=f"destination {list(dst_pattern)} must name the source's "
                                f"dimensions {names} once each")
        perm = tuple(names.index(x) for x in order)
        merged = tuple(math.prod(sizes[x] for x in g) for g in dst)
        if self.paxis == 0 and (perm[0] != 0 or len(src[0]) != 1 or len(dst[0]) != 1):
            raise nki_error("nkisim_invalid_argument", api="rearrange",
                            why="the partition dimension of an SBUF/PSUM tensor stays first "
                                "and whole")
        return self._derive("rearrange", lambda a: _view_reshape(
            _view_reshape(a, tuple(split)).transpose(perm), merged))

    @_view_primitive
    def vector_select(self, dim, vector_offset):
        """Dimension ``dim`` (0) indexed by a tile of per-row indices: row i of the view is
        row ``vector_offset[i]`` of this view's dimension 0 (an indirect view of an HBM
        tensor; a gather on read, a scatter on write)."""
        return _ops.vector_select(self, self._dim(dim, "vector_select"), vector_offset)

    @_view_primitive
    def is_contiguous(self):
        """0.6.0 stub: "each non-size-1 dimension's stride must equal the product of the shape
        sizes of inner dimensions. For on-chip tensors (SBUF, PSUM), the partition dim (dim 0)
        is skipped ... evaluated per-partition over the free dims only"."""
        if self._idx is not None or self._arr is None:
            return False
        a = self._arr
        first = 1 if self.root.buffer != "hbm" and self.paxis == 0 else 0
        inner = a.itemsize
        for n, st in zip(reversed(a.shape[first:]), reversed(a.strides[first:])):
            if n != 1 and st != inner:
                return False
            inner *= n
        return True

    @_view_primitive
    def get_pattern(self):
        """"The view's access pattern as ``[[stride, count], ...]`` ... pairs each of the
        view's dimensions with its current stride, in the same order as shape / strides"
        (0.6.0 stub, NkiTensor.get_pattern)."""
        return [[st, n] for st, n in zip(self.strides, self.shape)]

    @_view_primitive
    def is_indirect(self):
        return self._idx is not None

    @property
    def strides(self):
        """Strides in elements (nki's NkiTensor.strides)."""
        self._plain("strides")
        return tuple(st // self._arr.itemsize for st in self._arr.strides)

    @property
    def offset(self):
        """Offset of the view's first element in its storage, in elements."""
        return self._off // self.itemsize

    def _dim(self, d, api):
        d = int(d)
        d = d + self.ndim if d < 0 else d
        if not 0 <= d < self.ndim:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"dimension {d} out of range for {self.ndim} dimensions")
        return d

    def _derive(self, api, fn):
        """A view made by the same NumPy view operation on the values and their shadow."""
        if self._idx is not None and self._slots is None:
            return _derive_indexed(self, api, fn)
        self._plain(api)
        arr = fn(self._arr)
        w = None if self._w is None else fn(self._w)
        off = self._off + (_addr(arr) - _addr(self._arr) if arr.size and self._arr.size else 0)
        return Tensor(arr, w, self.root, self.dtype, arr.shape, self.paxis, None, off)

    def astype(self, dtype):
        nl = _ops
        return nl.copy(self, dtype=dtype)

    def broadcast_to(self, shape):
        """A broadcast *view* of a tile: "Return a new view of the tensor, no copy will occur"
        (nki.tensor.broadcast_to docstring); no buffer, no instruction (AWS's
        tutorials/layernorm broadcasts gamma to [128, F] this way). ``nl.broadcast_to`` is the
        instruction that makes a new tile."""
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return self
        if self.root.buffer == "hbm" or self._idx is not None or self._slots is not None or \
                self.paxis != 0:
            nl = _ops
            return nl.broadcast_to(self, shape=shape)
        src = self.shape if len(self.shape) >= 2 else (self.shape[0], 1)
        try:
            arr = np.broadcast_to(self._arr.reshape(src), shape)
            w = self._ws if self._ws is None or self._ws is checks.LAZY else \
                np.broadcast_to(self._ws.reshape(src), shape)
        except ValueError:
            raise nki_error("nkisim_shape_mismatch", params=f"src{shape_str(self.shape)}",
                            api="broadcast_to",
                            why=f"cannot broadcast to {shape_str(shape)}") from None
        run = context.current()
        if shape[0] > run.arch.pmax:
            raise nki_error("err_num_partition_exceed_arch_limit", n=shape[0],
                            limit=run.arch.pmax)
        return Tensor(arr, w, self.root, self.dtype, shape, 0, None, self._off)

    def expand_dims(self, axis):
        self._plain("expand_dims")
        arr = np.expand_dims(self._arr, axis)
        w = self._ws if self._ws is None or self._ws is checks.LAZY else \
            np.expand_dims(self._ws, axis)
        return Tensor(arr, w, self.root, self.dtype, arr.shape, self.paxis, None, self._off)

    def assert_shape(self, shape):
        if tuple(shape) != self.shape:
            raise nki_error("err_annotation_shape_mismatch", name=self.name,
                            shape=shape_str(self.shape), expected=shape_str(shape))
        return self

    def _plain(self, api):
        if self._idx is not None or self._slots is not None:
            raise nki_error("nkisim_unsupported", what=f"{api} of an advanced-indexed view",
                            why="index the result instead")

    # --- indexing ---
    def __getitem__(self, key):
        if self._slots is None and self._idx is None:
            if type(key) is tuple:
                v = _view(self, key)
                if v is not None:
                    return v
            k = _fast_key(key, self.shape)
            if k is not None:                  # ints and in-bound unit-step slices
                return self._basic_view(k)
        if type(key) is MaskExpr:
            return operand_masked(self, key)
        if self._slots is not None:
            return self._block_getitem(key)
        if self._idx is not None:
            run = context.maybe_current()
            if run is not None and run.rules.view_primitives and not isinstance(key, MaskExpr):
                # the current dialect's views compose (a view of an indirect view, below)
                kind, k = normalize_key(key, self.shape, self.name, None,
                                        run.rules.negative_indices)
                if kind == "basic":
                    return _derive_indexed(self, "indexing", lambda a: a[k])
            raise nki_error("nkisim_unsupported", what="nested indexing of an indexed view",
                            why="index the tensor once (CS149: 'Do not use nested slicing')")
        if any(isinstance(k, Tensor) for k in (key if isinstance(key, tuple) else (key,))):
            return _ops.indirect_getitem(self, key)   # SBUF tiles of indices: indirect DMA
        oob = []
        run = context.maybe_current()
        kind, k = normalize_key(key, self.shape, self.name, oob,
                                run is not None and run.rules.negative_indices)
        tile = self.paxis == 0 and self.root.buffer != "hbm"
        if kind == "basic":
            if tile and k:
                _partition_index(self, k, None)
            return self._basic_view(k)
        try:
            ishape = np.broadcast_shapes(*(np.shape(x) for x in k))
        except ValueError:
            shapes = " and ".join(shape_str(np.shape(x)) for x in k if isinstance(x, np.ndarray))
            raise nki_error("nkisim_invalid_argument", api=f"indexing `{self.name}`",
                            why=f"index expressions of shapes {shapes} do not broadcast "
                                "together") from None
        if tile:
            _partition_index(self, k, ishape)
        shape = ishape
        if len(k) < len(self.shape):
            shape = shape + self.shape[len(k):]
        t = Tensor(self._arr, self._ws, self.root, self.dtype, shape,
                   None if self.paxis is None else 0, k, self._off)
        if oob:
            bad = np.zeros(ishape, bool)
            for b, _ in oob:
                bad |= np.broadcast_to(b, ishape)
            bad = bad.reshape(ishape + (1,) * (len(shape) - len(ishape)))
            t._oob = (np.broadcast_to(bad, shape), oob[0][1])
        return t

    def _basic_view(self, k):
        """The view of a normalized basic key (a tuple of ints and slices)."""
        tile = self.paxis == 0 and self.root.buffer != "hbm"
        if tile and k and type(k[0]) is not slice and _keep_partition():
            # nki 0.3+: "An integer on dim 0 keeps it at size 1" (spec nki-current.md §2.0
            # item 3, STUB-R32 NkiTensor.__getitem__); Beta 1 drops it
            k = (slice(k[0], k[0] + 1, 1),) + k[1:]
        if tile and k and type(k[0]) is slice and len(self.shape) >= 2 and \
                sum(type(x) is slice for x in k) + len(self.shape) - len(k) < 2:
            # An SBUF/PSUM tile keeps 2 dimensions (partition, free): `buf[:, i]` is a
            # [P, 1] tile. The known-issues page says tiles need 2 dimensions and recommends
            # `my_sbuf[0:N, 0]` to access an [N, 1] buffer; AWS's reference/attention.py passes
            # `l_buffer[:, i]` to a helper documented "l_buffer: (B_P_SIZE, 1)" that indexes it
            # `l_buffer[:, 0]`. (HBM tensors drop integer-indexed dimensions as in NumPy, as
            # the programming model's "Basic Tensor Indexing" shows.)
            j = max(i for i, x in enumerate(k) if type(x) is not slice)
            k = k[:j] + (slice(k[j], k[j] + 1, 1),) + k[j + 1:]
        elif not tile and len(k) == len(self.shape) and k and \
                all(type(x) is not slice for x in k) and _keep_partition():
            # nki 0.3+ HBM: "integer indexing removes the dimension. Result is at least 1D."
            # (0.6.0 stub, NkiTensor.__getitem__): `h[0, 0, 0]` is (1,), not 0-d. Beta 1's
            # docs are silent (the 0-d view stays).
            k = k[:-1] + (slice(k[-1], k[-1] + 1, 1),)
        src = self._arr
        ke = k + (Ellipsis,)
        arr = src[ke]                      # all-int keys: a 0-d view, not a NumPy scalar
        ws = self._ws
        w = ws if ws is None or ws is checks.LAZY else ws[ke]
        off = self._off
        for x, st in zip(k, src.strides):
            off += (x.start if type(x) is slice else x) * st
        paxis = self.paxis
        if paxis is not None:
            # axes removed by integer indices before/at the partition axis
            if paxis < len(k) and type(k[paxis]) is not slice:
                paxis = None
            elif paxis:
                paxis -= sum(1 for x in k[:paxis] if type(x) is not slice)
        return Tensor(arr, w, self.root, self.dtype, arr.shape, paxis, None, off)

    def _block_getitem(self, key):
        slots, blocks, nft, offs = self._slots
        key = key if isinstance(key, tuple) else (key,)
        nb = len(blocks)
        bidx = key[:nb]
        if len(bidx) < nb or not all(isinstance(b, (int, np.integer)) for b in bidx):
            raise nki_error("nkisim_unsupported", what="slicing the block dimensions of a "
                            "direct-allocated tensor", why="index each block with an integer")
        for d, (b, n) in enumerate(zip(bidx, blocks)):
            if not 0 <= int(b) < n:
                raise nki_error("err_tensor_access_out_of_bound", name=self.name, dim=d,
                                lo=int(b), hi=int(b), size=n)
        slot = int(np.ravel_multi_index(tuple(int(b) % n for b, n in zip(bidx, nft)), nft))
        w = None if self._w is None else self._w[tuple(int(b) for b in bidx)]
        tile = Tensor(slots[slot], w, self.root, self.dtype, slots[slot].shape, 0, None,
                      offs[slot])
        rest = key[nb:]
        return tile[rest] if rest else tile

    def __setitem__(self, key, value):
        # `dst[...] = nisa.op(...)` (a temporary) vs `dst[...] = t` (an existing tile): the
        # first retargets the instruction, the second is a copy (see assign). (Counted here:
        # _TEMP_REFS is a __setitem__'s count.)
        fresh = _TEMP_REFS is None or sys.getrefcount(value) <= _TEMP_REFS
        run = checks.ASSOC_STORE[0]
        if run is not None:
            # `acc[...] = acc + x` (nkisim.checks._accumulates_into): the store is part of the
            # accumulation, then the exemption ends
            checks.ASSOC_STORE[0] = None
            try:
                self._setitem(key, value, fresh)
            finally:
                run.assoc = None
            return
        self._setitem(key, value, fresh)

    def _setitem(self, key, value, fresh):
        if value is STORED:
            return          # the op wrote self[key] itself (nkisim.dstform)
        dst = self[key]
        if isinstance(value, Tensor) and value._inplace:
            value._inplace = False
            if value.root is dst.root and value.shape == dst.shape:
                return                   # `t[...] += x` already wrote in place
        assign(dst, value, fresh=fresh)

    # --- Python operators map to nl.* (ref §1.8) ---
    def _op(self, name, other, reverse=False):
        nl = _ops
        fn = getattr(nl, name)
        if type(other) is Tensor and name in _OPERATOR_SIGN and \
                self.paxis == 0 and other.paxis == 0 and self.shape and other.shape and \
                self.shape[0] != other.shape[0] and 1 in (self.shape[0], other.shape[0]) and \
                self.root.buffer != "hbm" and other.root.buffer != "hbm":
            # "Partition broadcasting is not supported for operator overloads (+ - * / << >>)"
            # (Beta 1 known issues, reference §1.7); nl.add & co. broadcast
            a, b = (other, self) if reverse else (self, other)
            raise nki_error("nkisim_shape_mismatch", params=f"{shape_str(a.shape)}, "
                            f"{shape_str(b.shape)}", api=f"operator {_OPERATOR_SIGN[name]}",
                            why="partition broadcasting is not supported for operator "
                                "overloads (+ - * / << >>; NKI known issues): call "
                                f"nl.{name}(...), or broadcast the row first")
        return fn(other, self) if reverse else fn(self, other)

    def __add__(self, o): return self._op("add", o)
    def __radd__(self, o): return self._op("add", o, True)
    def __sub__(self, o): return self._op("subtract", o)
    def __rsub__(self, o): return self._op("subtract", o, True)
    def __mul__(self, o): return self._op("multiply", o)
    def __rmul__(self, o): return self._op("multiply", o, True)
    def __truediv__(self, o): return self._op("divide", o)
    def __rtruediv__(self, o): return self._op("divide", o, True)
    def __pow__(self, o): return self._op("power", o)
    def __mod__(self, o): return self._op("mod", o)
    def __and__(self, o): return self._op("bitwise_and", o)
    def __or__(self, o): return self._op("bitwise_or", o)
    def __xor__(self, o): return self._op("bitwise_xor", o)
    def __lshift__(self, o): return self._op("left_shift", o)
    def __rshift__(self, o): return self._op("right_shift", o)
    def __lt__(self, o): return self._op("less", o)
    def __le__(self, o): return self._op("less_equal", o)
    def __gt__(self, o): return self._op("greater", o)
    def __ge__(self, o): return self._op("greater_equal", o)

    def __neg__(self):
        nl = _ops
        return nl.negative(self)

    def __abs__(self):
        nl = _ops
        return nl.abs(self)

    def __invert__(self):
        nl = _ops
        return nl.invert(self)

    __hash__ = object.__hash__

    def __iadd__(self, other):
        return inplace(self, other, "add")

    def __isub__(self, other):
        return inplace(self, other, "subtract")

    def __imul__(self, other):
        return inplace(self, other, "multiply")

    def __itruediv__(self, other):
        return inplace(self, other, "divide")

    def __bool__(self):
        run = context.maybe_current()
        if run is not None and run.rules.tensor_handle_truthy and \
                (self.root.buffer == "hbm" or math.prod(self.shape) != 1):
            return True                 # an object handle (nkisim.context.Rules)
        if math.prod(self.shape) == 1:
            raise nki_error("err_dynamic_control_flow_not_supported")
        raise nki_error("err_ambiguous_tensor_truth_value")

    def __index__(self):
        raise nki_error("err_dynamic_control_flow_not_supported")

    def __array__(self, dtype=None, copy=None):
        raise nki_error("nkisim_unsupported", what=f"converting NKI tensor `{self.name}` to a "
                        "NumPy array inside a kernel", why="use nl.device_print to inspect "
                        "values, or return the tensor from the kernel")

    def __iter__(self):
        raise nki_error("nkisim_unsupported", what=f"iterating over NKI tensor `{self.name}`",
                        why="index it with nl.affine_range loop variables")

    # --- data access (used by the ops) ---
    @property
    def size(self):
        return math.prod(self.shape)


# Views of an on-chip tile cached on the tile, by key (issue 12: conv2d takes the same
# stationary view wT[:, ci, tap, co] once per output row group and each input window row a few
# times; a cached view costs a dict lookup instead of normalizing the key, slicing the storage
# and its shadow, and computing its region). A cached view is returned only when it is as good
# as a fresh one:
# - nothing but the cache references it (the kernel dropped the one it was given, and no
#   instruction holds it): two names never share one view object, so the state a view carries
#   between statements (``_inplace``, the handshake of ``t[k] += x``) cannot leak from one to
#   the other;
# - its state is a fresh view's (``_producer``, ``_inplace``, ``_mask``, ``_reduce`` unset);
# - its other fields are fixed by the tile and the key (storage, shadow, offset, shape and
#   region never change; a lazy shadow that materializes keeps the epochs where a fresh view
#   finds them, ``checks.lazy_view``).
# Otherwise a fresh view replaces it. The cache lives on the tile it indexes and dies with it (a
# tile's lifetime is its Tensor's, nkisim.memory; views reference the Allocation, not the
# Tensor). HBM tensors are not cached (the runtime drops their shadows when the kernel
# returns). At most _VIEWS_MAX views per tile.
_VIEWS_MAX = 256


def _cached_refs() -> int:
    """``sys.getrefcount`` of a dict value fetched into a local, when only the dict holds it
    (the count differs between CPython versions: measured, as ``_view`` reads it)."""
    d = {0: Tensor.__new__(Tensor)}
    v = d.get(0)
    return sys.getrefcount(v)


_CACHED_REFS = _cached_refs()


def _view(t: Tensor, key):
    """``_fast_view(t, key)`` (``key`` a tuple), from ``t``'s cache of views when ``t`` is on
    chip. The cache's key is a hashable copy of ``key`` when every item is a Python int (an int
    subclass, such as a loop index, as its int: ``LoopIndex.__eq__`` warns) or a slice of such
    bounds and an int/None step; other keys are not cached."""
    views = t._views
    if views is None:
        views = t._views = False if t.root.buffer == "hbm" else {}
    if views is False:
        return _fast_view(t, key)
    hk = []
    for k in key:
        tk = type(k)
        if tk is slice:
            a, b, c = k.start, k.stop, k.step
            if a is not None and type(a) is not int:
                if isinstance(a, int) and type(a) is not bool:
                    a = int(a)          # (`x[:, j:j + n]`: a loop index)
                else:
                    return _fast_view(t, key)
            if b is not None and type(b) is not int:
                if isinstance(b, int) and type(b) is not bool:
                    b = int(b)
                else:
                    return _fast_view(t, key)
            if c is not None and type(c) is not int:
                return _fast_view(t, key)
            hk.append((a, b, c))
        elif tk is int:
            hk.append(k)
        elif isinstance(k, int) and tk is not bool:
            hk.append(int(k))           # (as _fast_key reads it)
        else:
            return _fast_view(t, key)
    hk = tuple(hk)
    v = views.get(hk)
    if v is not None and sys.getrefcount(v) <= _CACHED_REFS and v._producer is None and \
            not v._inplace and v._mask is None and v._reduce is None:
        return v
    v = _key_view(t, hk)
    if v is not None:
        if len(views) >= _VIEWS_MAX:
            views.clear()
        views[hk] = v
    return v


def _key_view(t: Tensor, hk):
    """``_fast_view(t, key)`` of the cache key ``hk`` of ``key`` (see ``_view``): ints, and
    (start, stop, step) triples of ints or None."""
    shape = t.shape
    if len(hk) > len(shape):
        return None
    src = t._arr
    off = t._off
    nslices = 0
    out = []
    for k, size, st in zip(hk, shape, src.strides):
        if type(k) is tuple:
            start, stop, step = k
            if step is not None and step != 1:
                return None
            if start is None:
                start = 0
            if stop is None:
                stop = size
            if start < 0 or stop > size or start > stop:
                return None
            out.append(slice(start, stop, 1))
            off += start * st
            nslices += 1
        else:
            if k < 0 or k >= size:
                return None
            out.append(k)
            off += k * st
    return _basic_fast_view(t, out, off, nslices + len(shape) - len(hk))


def _fast_view(t: Tensor, key):
    """``t[key]`` for the commonest index without the general path (issue 12): a key
    ``_fast_key`` takes (Python ints and unit-step slices within the shape), on an HBM tensor or
    on a tile whose first index is a slice and which keeps two dimensions (the rules
    ``_basic_view`` applies then change nothing). None for anything else (``_basic_view`` then
    does it)."""
    if type(key) is not tuple:
        return None
    shape = t.shape
    norm = _fast_key(key, shape)
    if norm is None:
        return None
    src = t._arr
    off = t._off
    nslices = 0
    for k, st in zip(norm, src.strides):
        if type(k) is slice:
            off += k.start * st
            nslices += 1
        else:
            off += k * st
    return _basic_fast_view(t, list(norm), off, nslices + len(shape) - len(key))


def _basic_fast_view(t: Tensor, out: list, off: int, ndim: int):
    """The view of ``t`` by the normalized index ``out`` (ints and unit-step slices, ``off``
    its byte offset, ``ndim`` the dimensions it keeps), or None when ``_basic_view``'s rules
    could change it: on a tile, the first index must be a slice and two dimensions must stay."""
    paxis = t.paxis
    if ndim == 0 and _keep_partition():
        return None                 # all ints: _basic_view's rules (nki 0.3+ HBM: 1-D)
    if paxis == 0:
        if t.root.buffer == "hbm" or not out or type(out[0]) is not slice or ndim < 2:
            return None
    elif paxis is not None:
        return None
    out.append(Ellipsis)
    ke = tuple(out)
    arr = t._arr[ke]
    ws = t._ws
    return Tensor(arr, ws if ws is None or ws is checks.LAZY else ws[ke], t.root, t.dtype,
                  arr.shape, paxis, None, off)


def _fast_key(key, shape):
    """``normalize_key`` of the common index (issue 12): Python ints (loop indices) and
    unit-step slices with int bounds, all within ``shape``; None for anything else (the general
    path then validates it and raises the errors)."""
    if type(key) is not tuple:
        if key is Ellipsis:                 # `t[...]`: the whole view
            return tuple([slice(0, n, 1) for n in shape])
        key = (key,)
    if len(key) > len(shape):
        return None
    out = []
    for k, size in zip(key, shape):
        if type(k) is slice:
            start, stop, step = k.start, k.stop, k.step
            if step is not None and (type(step) is not int or step != 1):
                return None
            if start is None:
                start = 0
            elif isinstance(start, int) and type(start) is not bool:
                start = int(start)          # (an int subclass: a loop index)
            else:
                return None
            if stop is None:
                stop = size
            elif isinstance(stop, int) and type(stop) is not bool:
                stop = int(stop)
            else:
                return None
            if start < 0 or stop > size or start > stop:
                return None
            out.append(slice(start, stop, 1))
        elif isinstance(k, int) and type(k) is not bool:
            k = int(k)
            if k < 0 or k >= size:
                return None
            out.append(k)
        else:
            return None
    return tuple(out)


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def reshape_nocopy(a: np.ndarray, shape) -> np.ndarray:
    """A view of ``a`` in ``shape``; ValueError (or AttributeError) where that needs a copy.
    NumPy >= 2.1: ``reshape(copy=False)``; before, setting a view's ``shape`` (which NumPy 2.5
    deprecates)."""
    try:
        return a.reshape(shape, copy=False)
    except TypeError:                      # NumPy < 2.1: no copy= keyword
        v = a.view()
        v.shape = shape
        return v


def _view_reshape(a: np.ndarray, shape) -> np.ndarray:
    """``a.reshape(shape)`` that never copies (NKI views share storage)."""
    try:
        return reshape_nocopy(a, shape)
    except (AttributeError, ValueError):
        # (only a merge of dimensions can need a copy: of a permuted or strided view)
        raise nki_error("nkisim_invalid_argument", api="reshape",
                        why=f"merging dimensions of a {list(a.shape)} view that are not "
                            "contiguous in memory would need a copy: \"the dimensions must "
                            "already be contiguous in memory (no permute ...)\" (flatten_dims "
                            "docs; views never copy); copy the data into a tile of the shape "
                            "first") from None


def _coarse_shadow(t: Tensor) -> None:
    """A view of another element size cannot carry a per-element shadow: its elements are
    counted written (the bytes it covers), so reads through either dtype never report an
    uninitialised read it caused (a false error would be worse than a missed one)."""
    if t._w is not None:
        run = context.maybe_current()
        t._w[...] = np.maximum(t._w, run.epoch if run is not None else 1)


def _keep_partition() -> bool:
    run = context.maybe_current()
    return run is not None and run.rules.onchip_keep_partition


# ---------------------------------------------------------------------------------------------
# reads, writes, regions


def poisoned(root: Allocation) -> None:
    """Fill a lazily poisoned tile's storage with the poison (what never-written memory holds:
    NaN for floats, ``dtypes.poison``) before anything reads it or writes part of it."""
    arr = root.unpoisoned
    if arr is not None:
        if root.boxes is not None:
            checks.poison_unwritten(root)     # written in boxes: the rest only
            return
        root.unpoisoned = None
        arr.fill(dtypes.poison(root.dtype))


def values(t: Tensor) -> np.ndarray:
    """The raw stored values of a view (no checks)."""
    root = t.root
    if root.unpoisoned is not None and (root.boxes is None or not checks.view_written(t)):
        poisoned(root)        # (a view of written boxes holds no poison: nothing to fill yet)
    if t._slots is not None:
        raise nki_error("err_failed_to_infer_tile_from_local_tensor", name=t.name)
    if t._idx is None:
        return t._arr
    return t._arr[t._idx]


# views whose first dimension is a vector_select's indirect one (nkisim.access.vector_select)
INDIRECT_ROWS: weakref.WeakSet = weakref.WeakSet()


def _derive_indexed(t: Tensor, api: str, fn) -> Tensor:
    """A view of an indirect (advanced-indexed) view ``t``: the same NumPy view operation
    ``fn`` on each of its index arrays. "View primitives return NkiTensor and every primitive
    accepts any NkiTensor, so they compose freely" (NKI language guide); the one restriction:
    "the dimension that participates in the indirection cannot be further sliced or
    selected" (NkiTensor.is_indirect stub), and after vector_select "dims[0] must be 0"
    (permute stub)."""
    shape = t.shape
    rows = t in INDIRECT_ROWS
    if rows:
        n = shape[0]
        probe = fn(np.broadcast_to(np.arange(n).reshape((n,) + (1,) * (len(shape) - 1)), shape))
        if probe.ndim == 0 or probe.shape[0] != n or not (
                probe == np.arange(n).reshape((n,) + (1,) * (probe.ndim - 1))).all():
            raise nki_error("nkisim_invalid_argument", api=f"{api} of `{t.name}`",
                            why="the dimension that participates in the indirection (dim 0 of "
                                "a vector_select) cannot be further sliced, selected or moved")
    # (the index arrays, compact: a reshape of them may need a copy, a view's never does)
    idx = tuple(fn(np.ascontiguousarray(np.broadcast_to(a, shape))) for a in t._idx)
    new = idx[0].shape if idx else ()
    v = Tensor(t._arr, t._ws, t.root, t.dtype, new, t.paxis if len(new) else None, idx, t._off)
    if rows:
        INDIRECT_ROWS.add(v)
    return v


def _partition_index(t: Tensor, k: tuple, shape) -> None:
    """A tile's partitions are indexed by one contiguous run, in order: the first index is an
    int, a unit-step slice, or an expression ``start + i`` along the result's first axis.
    "Flexible indexing is not supported along the partition dimension" (Beta 1 programming
    model, "Advanced Tensor Indexing"; its Case #2 transposes through nc_transpose, not an
    index); "the access on the partition dimension must be contiguous ... not allowed because
    it reads every other partition" (nki-aps.rst, which the current dialect's views are
    built on). HBM tensors take any row pattern (``a[2 * i_p + 1, i_f]``). ``k``: the
    normalized key; ``shape``: its index arrays' broadcast shape, None for a basic key."""
    p = k[0]
    if shape is None:
        if type(p) is slice and p.step != 1:
            raise nki_error("nkisim_partition_index", name=t.name,
                            what=f"steps through partitions ({p.start}:{p.stop}:{p.step})")
        return
    if not isinstance(p, np.ndarray):
        return
    v = np.broadcast_to(p, shape)
    n = shape[0] if shape else 1
    run = v.flat[0] + np.arange(n).reshape((n,) + (1,) * (len(shape) - 1)) if shape else v
    if not np.array_equal(v, np.broadcast_to(run, shape)):
        d = np.diff(v, axis=0) if shape and n > 1 else None
        if d is not None and (v == v.flat[0]).all():
            what = "reads one partition into many (a partition broadcast)"
        elif d is not None and (d == d.flat[0]).all() and \
                (v == v[(slice(None),) + (slice(0, 1),) * (v.ndim - 1)]).all():
            what = f"steps through partitions by {int(d.flat[0])}"
        else:
            what = "picks partitions other than one contiguous run along its first axis"
        raise nki_error("nkisim_partition_index", name=t.name, what=what)


def operand_masked(t: Tensor, mask: MaskExpr) -> Tensor:
    """``t[pred]``: Beta 1's "operand masking" of a matmul input (NKI API Masking, "we
    introduce 'operand masking' syntax for matmult APIs", ``nl.matmul(lhs_T[i_lhs_f <= 64],
    rhs[i_rhs_f <= 256], transpose_x=True)``; nki-samples contributed/conv.py indexes
    ``masked[i_p, i_img][i_img < K0*K1]``): the same view, whose masked-out elements the
    matmul neither reads nor multiplies (``nkisim.engines.nc_matmul``). Only matmul APIs take
    such a view ("currently only matmult APIs support operand masking", ``read``)."""
    if t.root.buffer == "hbm" or t._slots is not None:
        raise nki_error("nkisim_invalid_argument", api=f"indexing `{t.name}`",
                        why="a predicate as the index (operand masking) applies to an SBUF "
                            "tile passed to nl.matmul or nisa.nc_matmul")
    try:
        m = np.broadcast_to(mask.v, t.shape)
    except ValueError:
        raise nki_error("nkisim_invalid_argument", api=f"indexing `{t.name}`",
                        why=f"the operand mask of shape {list(mask.v.shape)} does not "
                            f"broadcast to the tile's shape {list(t.shape)}") from None
    v = Tensor(t._arr, t._ws, t.root, t.dtype, t.shape, t.paxis, t._idx, t._off)
    v._oob = t._oob
    v._opmask = m if t._opmask is None else m & t._opmask
    return v


# the APIs that take an operand-masked view (operand_masked): nl.matmul lowers to these two
_OPERAND_MASK_APIS = ("nc_matmul", "nc_transpose (nl.matmul)")


def _read_operand_masked(t: Tensor, api: str, run) -> np.ndarray:
    """``read`` of an operand-masked view: the checks concern its masked-in elements only."""
    if api not in _OPERAND_MASK_APIS:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"`{t.name}[<predicate>]` (operand masking) is supported by "
                            "nl.matmul and nisa.nc_matmul only (NKI API Masking: 'currently "
                            "only matmult APIs support operand masking'); pass mask= instead")
    m = t._opmask
    active = _active_mask(t.shape)
    if active is not None:
        m = m & active
    if t._oob is not None:
        _check_oob(t, m)
    if t._ws is not None:
        run = run or context.current()
        _check_or_taint(run, _masked_shadow_view(t, m, run), api)
    return values(t)


def _check_or_taint(run, view: Tensor, api: str) -> None:
    """``checks.check_read`` of ``view``, where a read of never-written elements marks the
    values computed from them (``_taint``) instead of raising."""
    try:
        checks.check_read(run, view, api)
    except ValueError as e:
        if getattr(e, "nki_code", "") != _UNINIT:
            raise
        _taint(run, view, e)
        checks.check_read(run, view, api, uninit=False)


def read(t: Tensor, api: str, run=None) -> np.ndarray:
    """Values of an operand, after the uninitialized-read and loop-carried-dependency checks.

    The checks only concern the elements the instruction's mask keeps (ref §1.12): masked-out
    elements are neither read nor out of bounds.
    """
    if t._opmask is not None:
        return _read_operand_masked(t, api, run)
    if t._oob is not None:
        _check_oob(t, _active_mask(t.shape))
    if t._ws is not None:
        run = run or context.current()
        try:
            checks.check_read(run, t, api)
        except ValueError as e:
            code = getattr(e, "nki_code", "")
            if code not in (_UNINIT, "nkisim_loop_carried_dependency"):
                raise
            m = _active_mask(t.shape)
            if m is not None:           # the checks again, on the masked-in elements only
                _check_or_taint(run, _masked_shadow_view(t, m, run), api)
            elif code == _UNINIT:
                _taint(run, t, e)
                checks.check_read(run, t, api, uninit=False)
            else:
                raise
    return values(t)


# ---------------------------------------------------------------------------------------------
# never-written values: an error where they become observable, not where they are read
#
# On the device a read of never-written SBUF/PSUM returns whatever the memory held; it only
# matters if those values reach a result. AWS's tutorials/layernorm (nrows not a multiple of
# 128) runs row-wise ops on the rows a masked load skipped and stores the result with the same
# mask, as do the masked kernels of the programming model ("NKI API Masking"). So an instruction
# that reads never-written elements (its mask aside) does not fail: the elements of its result
# computed from them are marked never-written too (the partitions they came from, for the
# partition-parallel engines; the whole result for the Tensor Engine, which mixes partitions).
# The read becomes `nkisim_uninitialized_read`, naming the first read of never-written memory,
# when such values are written to HBM (a store, a DMA), i.e. when garbage would leave the chip.

_UNINIT = "nkisim_uninitialized_read"
# instructions whose result partitions are not the partitions they read
_CROSS_PARTITION = frozenset({"nc_matmul", "nc_transpose", "broadcast_to", "load_transpose2d",
                              "matmul", "transpose"})


class ElementTaint:
    """The exact result elements computed from never-written values (``run.taint``'s first
    item for instructions that know them, e.g. ``nc_matmul``), instead of result partitions."""

    __slots__ = ("bad",)

    def __init__(self, bad):
        self.bad = bad


def elementwise_taint(run, src: Tensor) -> None:
    """The current instruction computes its result element by element from ``src`` alone (a
    copy): exactly the result elements whose ``src`` element holds a never-written value are
    never-written (AWS's reference/allocated_fused_linear.py copies a PSUM tile whose last
    columns are garbage to SBUF, then stores only the valid columns with a mask)."""
    if run.taint is None or src._ws is None:
        return
    bad = checks.shadow_view(src) == 0
    run.taint = (ElementTaint(np.ascontiguousarray(bad)), run.taint[1])


def reduction_taint(run, in_shape: tuple, axes, out_shape: tuple) -> None:
    """The current instruction reduces ``axes`` of its one operand (of ``in_shape``, as read):
    exactly the result elements whose reduced group holds a never-written value are
    never-written (of ``out_shape``: the reduced shape, with or without kept axes, or
    ``in_shape`` itself for a result that spreads each group's value back over it, as softmax
    does). A student's last band of an image loads only the rows that exist, max-pools the
    whole band tile (``nl.max`` / ``nisa.tensor_reduce`` over pool windows, ref §1.8, §1.10:
    free axes, so each result element reads its own group) and stores the pooled rows that
    came from loaded rows with a mask; a per-partition taint would spoil every row."""
    taint = run.taint
    if taint is None or not isinstance(taint[0], ReadTaint):
        return
    elems = taint[0].elems
    if elems is None or elems.size != math.prod(in_shape):
        return
    axes = tuple(axes)
    bad = elems.reshape(in_shape).any(axis=axes, keepdims=True)
    if math.prod(out_shape) == math.prod(in_shape):
        bad = np.broadcast_to(bad, in_shape)
    elif bad.size != math.prod(out_shape):
        return
    run.taint = (ElementTaint(np.ascontiguousarray(bad).reshape(out_shape)), taint[1])


# instructions each of whose result elements is computed from the operand elements at the same
# place (same partition, same index in the partition's free elements; a (P, 1) operand such as
# tensor_scalar's or activation's bias broadcast along the free dimension): exactly the result
# elements computed from never-written operand elements are never-written. nki-library's
# mlp_tkg_gate_up_projection adds the other core's partial sums into a [128, n, T] tile whose
# last I-tile is partly garbage (I not a multiple of 128) and later contracts only the valid
# partitions of each tile; a per-partition taint would spoil the valid tiles of those partitions.
# sendrecv too: its dst has src's partitions and elements per partition (nki.isa.sendrecv),
# and nkisim.collectives hands the receiver the sender's read taint.
_ELEMENTWISE = frozenset({"tensor_tensor", "tensor_scalar", "scalar_tensor_tensor", "activation",
                          "tensor_copy", "reciprocal", "dropout", "affine_select",
                          "tensor_copy_predicated", "sendrecv"})


class ReadTaint:
    """What the operands the current instruction read hold never-written (``run.taint``'s
    first item from ``read``): per partition (``rows``), and per element (``elems``, a
    [partitions, free elements] mask, None when the operands' layouts do not line up)."""

    __slots__ = ("rows", "elems")

    def __init__(self, rows, elems):
        self.rows = rows
        self.elems = elems


def _merge_elems(a, b):
    """Element masks of two operands ([P, F] each) as one [P, F] mask of the result, with a
    (P, 1) operand broadcast along the free dimension; None when they do not line up."""
    if a is None or b is None or a.shape[0] != b.shape[0]:
        return None
    if a.shape[1] == b.shape[1] or 1 in (a.shape[1], b.shape[1]):
        return a | b
    return None


def _taint(run, view, exc) -> None:
    """Note that the current instruction read never-written elements of ``view``."""
    w = checks.shadow_view(view)
    bad = w == 0
    origin = getattr(view.root, "taint", None) or exc
    rows = bad.reshape(bad.shape[0], -1).any(axis=1) if bad.ndim else bad.reshape(1)
    elems = bad.reshape(bad.shape[0], -1) if bad.ndim else bad.reshape(1, 1)
    prev = run.taint
    if prev is not None:
        prows, porigin = prev
        pelems = None
        if isinstance(prows, ReadTaint):
            prows, pelems = prows.rows, prows.elems
        rows = (rows | prows) if isinstance(prows, np.ndarray) and \
            prows.shape == rows.shape else None
        elems = _merge_elems(elems, pelems)
        origin = porigin
    run.taint = (ReadTaint(rows, elems), origin)


def _apply_taint(run, t: Tensor, api: str, mask) -> None:
    """Mark the elements of ``t`` just written from never-written values (see above).

    Written to HBM, they leave the chip: into a kernel argument, the read's error at once;
    into a tensor the kernel made, they are marked never-written there too, and the output
    check decides (``nkisim.checks.check_outputs``): an output all of whose elements are
    garbage raises the read's error, one partly garbage is a warning, because the caller may
    read back only the valid part (AWS's nki/test/test_nki_isa_nc_match_replace8.py stores a
    [128, 512] tile of which a masked nc_match_replace8 computed [0:64, 0:256] and compares
    just that region: the acceptance principle, shared/DESIGN.md)."""
    rows, origin = run.taint
    if t.root.buffer == "hbm" and (t.root.param or t._ws is None):
        run.taint = None
        raise origin
    if t._ws is None:
        return
    checks.materialize(t.root)
    shape = t.shape
    bad = np.ones(shape, bool)
    if isinstance(rows, ReadTaint):
        elems, rows = rows.elems, rows.rows
        if api in _ELEMENTWISE and elems is not None and shape and \
                elems.shape[0] == shape[0] and elems.shape[1] == math.prod(shape[1:]):
            rows = ElementTaint(elems)
    if isinstance(rows, ElementTaint):
        if rows.bad.size == math.prod(shape):
            bad = rows.bad.reshape(shape)
    elif rows is not None and api not in _CROSS_PARTITION and shape and rows.size == shape[0]:
        bad = np.broadcast_to(rows.reshape((-1,) + (1,) * (len(shape) - 1)), shape)
    if mask is not None:
        bad = bad & np.broadcast_to(mask, shape)
    g = checks.garbage_view(t, create=True)
    if t._idx is None:
        t._w[bad] = 0
        if g is not None:
            g[bad] = True
    else:
        sel = tuple(np.broadcast_to(i, shape)[bad] for i in _full_idx(t._idx, t))
        t._w[sel] = 0
        if g is not None:
            g[sel] = True
    if t.root.buffer == "hbm":
        # garbage on the device: the poison (NaN for floats), so that a result compared
        # whole fails even where the garbage was computed into plausible numbers
        p = dtypes.poison(t.dtype)
        with np.errstate(invalid="ignore"):
            if t._idx is None:
                t._arr[bad] = p
            else:
                t._arr[sel] = p
    root = t.root
    root.full = -1
    root.uniform = None
    if getattr(root, "taint", None) is None:
        root.taint = origin


def inherit_taint(dst: Tensor, src: Tensor) -> None:
    """``dst`` was written with ``src``'s values without a read (a retargeted instruction, the
    matmul accumulation): its never-written elements stay never-written."""
    if src._ws is None or dst._ws is None or getattr(src.root, "taint", None) is None:
        return            # (only a tensor that holds never-written values has a taint)
    w = checks.shadow_view(src)
    if w.size and int(w.min()) == 0:
        run = context.current()
        try:        # exactly the elements of src that hold never-written values
            rows = ElementTaint(np.ascontiguousarray(fit(w == 0, dst.shape, src.shape)))
        except Exception:          # noqa: BLE001 - shapes do not line up: the whole of dst
            rows = None
        run.taint = (rows, src.root.taint)
        try:
            _apply_taint(run, dst, "", None)
        finally:
            run.taint = None


def accumulator_garbage(run, t: Tensor, view: Tensor, api: str):
    """Before an instruction adds into accumulator ``t`` (``nc_matmul(dst, accumulate=...)``),
    reading the elements of ``view`` (those it adds to): the race checks, and, instead of an
    uninitialized-read error, the (elements of ``t`` that hold never-written values, origin)
    to pass to ``taint_elements`` after the write, or None. A partial sum computed from
    never-written inputs (an earlier matmul's taint, see above) stays never-written when more
    is added to it; like any garbage it is an error only if it reaches HBM."""
    try:
        checks.check_read(run, view, api, accumulate=True)
        return None
    except ValueError as e:
        if getattr(e, "nki_code", "") != _UNINIT:
            raise
        origin = getattr(t.root, "taint", None) or e
    bad = checks.shadow_view(view) == 0
    if view is not t:                   # a masked view: the shape of t, bad where it reads
        bad = np.broadcast_to(bad, t.shape)
    return np.ascontiguousarray(bad), origin


def taint_elements(run, t: Tensor, garbage) -> None:
    """Mark the ``garbage`` of ``accumulator_garbage`` never-written in ``t`` again (the
    write just stamped them)."""
    bad, origin = garbage
    prev, run.taint = run.taint, (ElementTaint(bad), origin)
    try:
        _apply_taint(run, t, "", None)
    finally:
        run.taint = prev


def _check_oob(t: Tensor, mask) -> None:
    """``err_tensor_access_out_of_bound`` unless ``mask`` excludes every out-of-bound element."""
    bad, fields = t._oob
    if mask is None or (bad & np.broadcast_to(mask, bad.shape)).any():
        if "error" in fields:               # a static .ap() outside the tensor (nkisim.access)
            raise fields["error"]
        if "indirect" in fields:            # a runtime index from an SBUF tile (nkisim.indirect)
            e = IndexError(fields["indirect"])
            e.nki_code = "nkisim_indirect_out_of_bound"
            raise e
        raise nki_error("err_tensor_access_out_of_bound", **fields)


def _masked_shadow_view(t: Tensor, mask, run) -> Tensor:
    """A view whose masked-out elements look freshly written, for the shadow checks."""
    w = checks.shadow_view(t)
    w = np.where(np.broadcast_to(mask, w.shape), w, run.epoch)
    return Tensor(None, w, t.root, t.dtype, w.shape, t.paxis, None, t._off)


def _active_mask(shape):
    """The ``mask=`` of the NKI call being executed, as the elements of a ``shape`` operand it
    needs (None: no mask). Found on the stack: every public op takes ``mask``."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(context._PKG_DIR):
        m = f.f_locals.get("mask")
        if isinstance(m, (bool, np.bool_)):          # a plain bool mask: all or nothing
            return None if m else np.zeros(tuple(shape), bool)
        if m is not None:
            m = getattr(m, "v", m)
            if not isinstance(m, np.ndarray) or m.dtype != np.bool_:
                return None
            return _needed(m, tuple(shape))
        f = f.f_back
    return None


def _needed(mask: np.ndarray, shape: tuple):
    """Elements of an operand of ``shape`` that the instruction mask ``mask`` uses."""
    ext = shape + (1,) * max(0, mask.ndim - len(shape))
    try:
        full = np.broadcast_shapes(ext, mask.shape)
    except ValueError:
        # an operand of another free shape (nc_match_replace8's `vals` [P, 8] under a mask of
        # `data` [P, F], AWS's doc example nki_nc_match_replace_indices8_mask): the engines are
        # partition-parallel, so the mask's partitions are the operand's partitions
        if shape and mask.ndim and mask.shape[0] == shape[0]:
            rows = mask.reshape(shape[0], -1).any(axis=1)
            return np.broadcast_to(rows.reshape((-1,) + (1,) * (len(shape) - 1)), shape)
        return None
    m = np.broadcast_to(mask, full)
    axes = tuple(i for i, (s, f) in enumerate(zip(ext, full)) if s == 1 and f != 1)
    if axes:
        m = m.any(axis=axes, keepdims=True)
    return m.reshape(shape) if m.size == math.prod(shape) else None


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _copy(dst: np.ndarray, vals) -> None:
    """``dst[...] = vals``. Same-dtype contiguous blocks are copied bit for bit through an
    integer ufunc rather than ``memmove``: glibc's ``rep movsb`` copy is 5-10x slower when
    source and destination are 4 KiB-aliased, as two fresh 256 KiB NumPy blocks (a 128x512
    fp32 tile) are (measured on the 2-core machine: 93 us against 9 us per 128x512 fp32 copy;
    issue 12). A strided source goes through NumPy's own copy, whose strided loops are 1.5-3x
    faster than the ufunc's (measured on the AVX-512 VM, tmp script, min of 7: a (128, 222)
    row window 3.6 us against 11.3, a [128, 2, 222] window 8.3 against 22.5, a transposed
    128x128 weight view with strides (72, 9216) 23 against 35; inside a trn1 solution's
    conv2d, where those weight views are cold, that copy took 181 us). The trn1 solution's
    conv2d B=1 224x224, min of 4 alternating runs: 3.16 s against 3.71; the trn2 one 2.08
    against 2.24; ours 1.71 against 1.69 (benchmarks/solution_speed.py's configuration)."""
    if vals is dst:
        return                    # adopted storage (``allocate(storage=)``): already in place
    if type(vals) is np.ndarray and vals.dtype == dst.dtype and vals.dtype.itemsize in _UINT \
            and vals.dtype.kind != "O" and vals.flags.c_contiguous:
        u = _UINT[vals.dtype.itemsize]
        np.positive(vals.view(u), out=dst.view(u))
    else:
        dst[...] = vals


def _same_values(t: Tensor, vals, mask, add) -> bool:
    """Would writing ``vals`` (under ``mask``) leave the view's stored bytes as they are?"""
    if add is not None or vals is None or t._slots is not None:
        return False
    try:
        cur = values(t)
        dt = t.dtype
        new = dtypes.cast(vals, dt) if dt == dtypes.TF32 or \
            (dt.kind in "iub" and dtypes.floating(np.asarray(vals).dtype)) else np.asarray(vals)
        new = np.broadcast_to(new.astype(cur.dtype, copy=False), cur.shape)
    except (ValueError, TypeError):
        return False
    eq = (new == cur) | ((new != new) & (cur != cur))
    if mask is not None:
        eq = eq | ~np.broadcast_to(mask, cur.shape)
    return bool(eq.all())


def write(t: Tensor, vals, api: str, *, accumulate=False, mask=None, run=None,
          add=None) -> None:
    """Write engine results into a view, rounding to its dtype; stamp the shadow.

    ``add`` (fp32 storage, whole view, no mask): add these values to the view in place
    instead of writing ``vals`` (``psum += nc_matmul``: one pass, no temporary)."""
    run = run or context.current()
    root = t.root
    if root.adopted:
        root.adopted = False
        if vals is t._arr and mask is None and add is None:
            # a result tile whose storage is these values (allocate(storage=)): in place,
            # shadow and summaries stamped when it was allocated
            if t._mask is not None:
                t._mask = None
            if run.taint is not None:
                _apply_taint(run, t, api, None)
            return
    state = _write_begin(t, vals, api, accumulate, mask, run, add)
    dt = t.dtype
    if dt == dtypes.TF32 or (dt.kind in "iub" and dtypes.floating(np.asarray(vals).dtype)):
        vals = dtypes.cast(vals, dt)
    idx = t._idx
    # (overflow to inf / NaN is silent: the run's np.errstate, nkisim.runtime.simulate)
    if add is not None:
        np.add(t._arr, add, out=t._arr)
    elif mask is None:
        if idx is None:
            _copy(t._arr, vals)
        else:
            t._arr[idx] = vals
    else:
        m = np.broadcast_to(mask, t.shape)
        v = np.broadcast_to(vals, t.shape)
        if idx is None:
            np.copyto(t._arr, v, where=m, casting="unsafe")
        else:
            sel = tuple(np.broadcast_to(i, t.shape)[m] for i in _full_idx(idx, t))
            t._arr[sel] = v[m]
    _write_end(t, api, mask, run, state)


def _write_begin(t: Tensor, vals, api, accumulate, mask, run, add):
    """``write``'s first half, before the values land: the checks (which raise with nothing
    written), the view's mask, and the poison of the elements the write leaves unwritten.
    Returns what ``_write_end`` needs. ``vals``: the values (None for none; ``write``'s
    checks may compare them with the stored ones), or ``DIRECT`` (computed into the view
    after this, ``begin_direct``)."""
    root = t.root
    if root.param and not root.mutable and "inputs" in run.checks:
        raise nki_error("err_cannot_update_immutable_parameter", name=root.name)
    root.version += 1       # (retires the kept operand copies: engines._kept, engines._f32)
    if t._slots is not None:
        raise nki_error("err_failed_to_infer_tile_from_local_tensor", name=t.name)
    if t._oob is not None:
        _check_oob(t, mask)
    if mask is not None:
        t._mask = np.broadcast_to(mask, t.shape)
    elif t._mask is not None:
        t._mask = None
    lazy = t._ws is checks.LAZY and root.shadow is None
    box = None
    if lazy and (mask is not None or not checks._covers(t)):
        # a partial write: its box in the root's boxes, else element-wise epochs from now on
        box = checks.view_box(t) if mask is None else None
        if box is None:
            checks.materialize(root)
            lazy = False
        elif root.boxes is None:
            checks.to_boxes(root)
    keep = False      # True: an accumulation keeps its group's first epoch (nkisim.checks)
    if t._ws is not None:
        direct = vals is DIRECT
        keep = checks.check_write(run, t if mask is None else _masked_shadow_view(t, t._mask,
                                                                                 run),
                                  api, accumulate,
                                  same_values=None if direct else
                                  lambda: _same_values(t, vals, mask, add),
                                  view=t if add is None and vals is not None and not direct
                                  else None,
                                  values_of=values)
        if lazy and root.shadow is not None:
            lazy = False                  # the checks materialized the boxes
    idx = t._idx
    unp = root.unpoisoned
    if unp is not None:
        arr = t._arr
        if add is None and mask is None and idx is None and vals is not None and (
                arr is unp or (arr.size == unp.size and arr.flags.c_contiguous and
                               _addr(arr) == _addr(unp))):
            root.unpoisoned = None        # written whole: no element keeps the poison
        elif not (lazy and box is not None and add is None):
            poisoned(root)    # (of a root written in boxes: the elements no box covers)
        # (a box of a root written in boxes, not read: the poison goes into the elements no
        # box covers when something reads them, ``poisoned``, or never if boxes cover the tile)
    return lazy, box, keep


def _write_end(t: Tensor, api, mask, run, state) -> None:
    """``write``'s second half, after the values landed: the view's write stamps (its box or
    its elements' epochs), the taint, the end of a PSUM accumulation group."""
    lazy, box, keep = state
    root = t.root
    idx = t._idx
    if lazy and box is not None and not keep:
        checks.stamp_box(root, box, run.epoch)
    elif t._ws is not None and not keep and not lazy:   # (lazy: check_write set `uniform`)
        if mask is None:
            if idx is None:
                t._w[...] = run.epoch
            else:
                t._w[idx] = run.epoch
        else:
            m = np.broadcast_to(mask, t.shape)
            if idx is None:
                t._w[m] = run.epoch
            else:
                sel = tuple(np.broadcast_to(i, t.shape)[m] for i in _full_idx(idx, t))
                t._w[sel] = run.epoch
    if run.taint is not None:
        _apply_taint(run, t, api, mask)
    if root.buffer == "psum":
        if api == "nc_matmul" or api == "nc_transpose":
            root.psum_set = None
        else:
            root.psum_set = api      # (psum_value_set: a `+=` matmul onto it is undefined)
            if psum_init.tracked(root):
                psum_init.clear(t, mask)     # a non-matmul write ends the accumulation group


def psum_value_set(run, t: Tensor) -> None:
    """``psum += nisa.nc_matmul(...)`` onto PSUM a non-matmul instruction wrote last: "On
    NeuronCore-v2 and NeuronCore-v3, matmul accumulating into a PSUM location that was
    value-initialized by a non-matmul instruction (e.g., memset, tensor_copy) is not supported
    and is undefined behavior on hardware" (nki.isa.nc_matmul, SDK 2.32); the Beta 1 compiler
    makes the first matmul of an `nl.zeros` + `+=` group overwrite (reference §1.11), so a bias
    copied in first is lost or garbage. nkisim adds onto it (what the kernel says) and warns."""
    root = t.root
    run.warn(("psum_value_set", root.id),
             f"`{t.name} += nisa.nc_matmul(...)` accumulates onto PSUM that a non-matmul "
             f"instruction ({root.psum_set}) wrote: on NeuronCore-v2/v3 \"matmul accumulating "
             "into a PSUM location that was value-initialized by a non-matmul instruction (e.g., "
             "memset, tensor_copy) is not supported and is undefined behavior on hardware\" "
             "(nki.isa.nc_matmul docs); start the group from nl.zeros and add a bias after the "
             "matmuls")
    root.psum_set = None


def _full_idx(idx, t):
    shp = np.broadcast_shapes(*(np.shape(x) for x in idx))
    return tuple(np.broadcast_to(i, shp) for i in idx)


def region(t: Tensor) -> Region:
    """The physical region a view touches (bounding box: partitions x bytes in a partition).
    Computed once per view: a tile used by every iteration of a loop costs one lookup."""
    r = t._region
    if r is None:
        r = t._region = _region(t)
    if r.buffer != "hbm":
        TOUCHED.append(t.root)        # its lifetime (nkisim.memory)
    return r


def _region(t: Tensor) -> Region:
    root = t.root
    arr = t._arr
    if arr is None:
        return Region(root.buffer, root.key, root.name, 0, 128, 0, root.pbytes or 1)
    off = t._off                      # an advanced-indexed view: the whole view it indexes
    item = arr.itemsize
    if root.buffer == "hbm":
        ext = item
        for n, s in zip(arr.shape, arr.strides):
            if n == 0:
                return Region("hbm", root.key, root.name, 0, 1, off, off)
            ext += (n - 1) * s
        return Region("hbm", root.key, root.name, 0, 1, off, off + ext)
    R = root.row_bytes
    p_start, f_start = divmod(off, R)
    p_count, ext = 1, item
    for n, s in zip(arr.shape, arr.strides):
        if n == 0:
            return Region(root.buffer, root.key, root.name, p_start, p_start, f_start, f_start)
        if n == 1:
            continue        # spans nothing (a (128, 1) tile's last stride is the row size)
        if s >= R and s % R == 0:
            p_count = (n - 1) * (s // R) + 1
        else:
            ext += (n - 1) * s
    return Region(root.buffer, root.key, root.name, p_start, p_start + p_count, f_start,
                  f_start + ext)


# ---------------------------------------------------------------------------------------------
# assignment: `dst[...] = value`


def fit(vals: np.ndarray, dst_shape, src_shape=None, api="a = b") -> np.ndarray:
    """Shape ``vals`` to ``dst_shape``: equal, same partitions and element count, or broadcast.
    Otherwise NKI's err_store_dst_shape_smaller_than_other_shape when the destination has fewer
    elements, and a shape mismatch naming ``api`` when it has as many or more (the documented
    message says "smaller", which would be wrong there)."""
    src_shape = vals.shape if src_shape is None else src_shape
    dst_shape = tuple(dst_shape)
    if vals.shape == dst_shape:
        return vals
    if vals.size == math.prod(dst_shape) and vals.ndim and dst_shape and \
            vals.shape[0] == dst_shape[0]:
        return vals.reshape(dst_shape)
    try:
        if np.broadcast_shapes(dst_shape, vals.shape) == dst_shape:
            return np.broadcast_to(vals, dst_shape)
    except ValueError:
        pass
    if math.prod(dst_shape) < math.prod(src_shape):
        raise nki_error("err_store_dst_shape_smaller_than_other_shape",
                        dst=shape_str(dst_shape), src=shape_str(src_shape))
    raise nki_error("nkisim_shape_mismatch", params="destination, value", api=api,
                    why=f"the destination is {shape_str(dst_shape)}, the value "
                        f"{shape_str(src_shape)}: neither the same partitions and element count "
                        "nor a broadcast of the value")


def _temp_refs():
    """``sys.getrefcount`` of a temporary right-hand side inside ``__setitem__`` when it is
    smaller than that of a named one (CPython <= 3.13); None when the two cannot be told apart
    (then every ``dst[...] = t`` whose ``t`` came from the last instruction retargets it)."""
    class Probe:
        def __setitem__(self, key, value):
            self.n = sys.getrefcount(value)

    def probe():
        p = Probe()
        p[...] = object()
        temp = p.n
        named = object()
        p[...] = named
        return temp, p.n
    temp, named = probe()
    return temp if named > temp else None


_TEMP_REFS = _temp_refs()


def assign(dst: Tensor, value, fresh: bool = True) -> None:
    """``dst[...] = value``: retarget the producing instruction, or copy.

    ``dst[...] = nisa.op(...)`` (``fresh``: the value is a temporary) makes the instruction
    write ``dst``. ``dst[...] = t`` of an existing tile ``t`` is a copy, whichever instruction
    was issued last. A Tensor Engine result (``nc_matmul``, ``nc_transpose``) assigned to an
    SBUF tile lands there through PSUM: the compiler adds the PSUM -> SBUF copy (AWS's
    tutorials/sd_attention and reference/double_row_matmul.py do ``sbuf_tile[...] =
    nisa.nc_transpose(...)``; both pass AWS's CI)."""
    run = context.current()
    if isinstance(value, IndexExpr):
        raise nki_error("err_cannot_assign_to_index")
    if isinstance(value, Tensor) and value._reduce is not None:
        _loop_reduce_into(run, dst, value)
        return
    if isinstance(value, Tensor):
        producer = value._producer
        via_psum = producer is not None and producer.engine == "tensor" and \
            producer.op in ("nc_matmul", "nc_transpose") and dst.root.buffer != "psum"
        if fresh and not via_psum and producer is not None and run.trace.instrs and \
                run.trace.instrs[-1] is producer and value.root.buffer != "hbm":
            # `dst[...] = nisa.op(...)`: the instruction writes straight into dst (only the
            # elements its mask computed, ref §1.12).
            vals = fit(values(value), dst.shape, value.shape)
            m = None if value._mask is None else fit(value._mask, dst.shape, value.shape)
            write(dst, vals, producer.op, run=run, mask=m)
            inherit_taint(dst, value)
            producer.writes = (region(dst),)
            producer.dtype = dtypes.name(dst.dtype)
            run.memory.release(value.root)
            value._producer = None
            return
        nl = _ops
        src_vals = fit(read(value, "assignment", run), dst.shape, value.shape)
        if value.root.buffer == "hbm" or dst.root.buffer == "hbm":
            nl._dma(dst, value, src_vals, "assignment", run)
        else:
            write(dst, src_vals, "tensor_copy", run=run)
            run.record("tensor_copy", "vector", (region(value),), (region(dst),),
                       dtypes.name(dst.dtype), _partitions(dst), _free(dst),
                       {"inputs": 1, "psum_in": value.root.buffer == "psum",
                        "auto_engine": True})      # the compiler picks the engine (nkisim.cost)
        return
    if isinstance(value, (int, float, np.integer, np.floating, bool)):
        write(dst, np.full(dst.shape, value, dtype=np.float32 if isinstance(
            value, (float, np.floating)) else np.asarray(value).dtype), "memset", run=run)
        run.record("memset", "vector", (), (region(dst),), dtypes.name(dst.dtype),
                   _partitions(dst), _free(dst), {"inputs": 0, "value": float(value)})
        return
    raise nki_error("nkisim_invalid_argument", api="assignment",
                    why=f"cannot assign a {type(value).__name__} to NKI tensor `{dst.name}`")


def _loop_reduce_into(run, dst: Tensor, value: Tensor) -> None:
    """``dst[idx] = nl.loop_reduce(x, op=...)``: ``dst[idx] = op(x, dst[idx])``, an associative
    reduction across the loop (exempt from the race checks, like ``acc += x``)."""
    nl = _ops
    name, value._reduce = value._reduce, None
    if dst._ws is not None:
        checks.check_read(run, dst, "loop_reduce", accumulate=True)
    a = dtypes.to_f32(read(value, "loop_reduce", run))
    b = dtypes.to_f32(values(dst))
    out = nl.apply_binary(name, fit(a, dst.shape, value.shape), b)
    write(dst, out, "loop_reduce", accumulate=True, run=run)
    run.record("tensor_tensor", "vector", (region(value), region(dst)), (region(dst),),
               dtypes.name(dst.dtype), _partitions(dst), _free(dst),
               {"inputs": 2, "alu": name})


# ---------------------------------------------------------------------------------------------
# ``acc += nisa.nc_matmul(...)`` without the intermediate result tile (issue 12)
#
# ``acc += nc_matmul(a, b)`` is ONE Tensor Engine instruction accumulating into acc's PSUM bank;
# simulated literally it built a whole result tile (allocation in the memory model, shadow,
# record, lifetime) that ``inplace`` added and released at once: 25-30% of the interpreter's
# time on a 224x224 conv2d. When ``nc_matmul`` sees that its caller's very next bytecode is an
# in-place add (``engines._iadd_follows``: nothing can run in between), it returns a
# ``PendingMatmul`` holding the computed values and what ``ops.result_tile`` needs;
# ``inplace`` consumes it, making the same record, clock ticks, allocation-site count and
# allocation id as the result tile would have, and the same checks, writes, warnings and
# errors. Anything else that touches it (a non-PSUM or non-fp32 accumulator, a shape that
# needs ``fit``, a NumPy array on the left of ``+=``...) materializes it first: the result tile
# is built exactly as ``nc_matmul`` builds it otherwise, then the general code runs.

# [(the PendingMatmul, run, values, stationary, moving, detail, site, build)]; ``build``
# (nkisim.engines) makes the result tile with those arguments as nc_matmul does
PENDING: list = []


class PendingMatmul(Tensor):
    """An ``nc_matmul`` result about to be added by ``+=``; its slots stay unset until
    something other than ``inplace`` looks at it (``__getattr__`` then materializes it)."""

    __slots__ = ()

    # named as the tile it stands for: a message naming an operand's type reads the same
    __name__ = __qualname__ = "Tensor"

    def __getattr__(self, name):
        if not (PENDING and PENDING[0][0] is self):
            raise AttributeError(name)
        materialize_pending()
        return getattr(self, name)


def _materializing(method):
    """``method`` of a Tensor, for a PendingMatmul: materialize first (``x += pending`` with
    an ``x`` that is not a Tensor reaches ``pending.__radd__``, which may check ``x`` before
    touching ``self``: the instruction is recorded first, as for the result tile)."""
    def call(self, *args, **kwargs):
        if PENDING and PENDING[0][0] is self:
            materialize_pending()
        return method(self, *args, **kwargs)
    call.__name__ = call.__qualname__ = method.__name__
    call.__doc__ = method.__doc__
    return call


for _name, _method in list(Tensor.__dict__.items()):
    if isinstance(_method, types.FunctionType) and _name != "__init__":
        setattr(PendingMatmul, _name, _materializing(_method))


def materialize_pending() -> None:
    """Build the pending matmul's result tile as ``nc_matmul`` does (``ops.result_tile``) and
    turn the PendingMatmul into that Tensor (same slots; the memory model's weak reference,
    which ends the tile's lifetime when the kernel drops it, follows the object)."""
    from .memory import _TileRef
    obj, run, out, st, mv, detail, site, build = PENDING.pop()
    t = build(run, out.copy(), st, mv, detail, site)      # (out: gemm's scratch buffer)
    for name in _TENSOR_SLOTS:
        setattr(obj, name, getattr(t, name))
    obj.__class__ = Tensor
    memory = run.memory
    ref = memory.live.get(t.root.id)
    if ref is not None and ref() is t:
        new = _TileRef(obj, memory._dead_cb)
        new.alloc = ref.alloc
        memory.live[t.root.id] = new
        del ref                 # (dropped before t: its callback never fires)
    if _ARGS_DIE_LAST_FIRST:
        del mv          # (then st, when this returns: see record_pending)


_TENSOR_SLOTS = tuple(n for n in Tensor.__slots__ if n != "__weakref__")


def pending_allocatable(run, out) -> bool:
    """The result tile of a pending matmul has a shape this run allocated before: its
    allocation could not fail (``allocate``'s checks ran and were cached in ``alloc_specs``),
    so leaving it out changes nothing but its lifetime (discarded by ``release`` anyway)."""
    return (out.shape, dtypes.F32, id(psum), False) in run.alloc_specs


def same_elements(ds, rs) -> bool:
    """Shapes ``ds`` (a destination) and ``rs`` (a result) have the same partitions and the same
    element count: the result can be written into the destination (the ISA writes its output
    access pattern; no broadcast)."""
    return (ds[0] if ds else 1) == (rs[0] if rs else 1) and math.prod(ds) == math.prod(rs)


def read_regions(reads) -> tuple:
    """The regions of an instruction's operand tiles, in order (``region``)."""
    if len(reads) == 2:             # (the commonest: two operands, without a list)
        return region(reads[0]), region(reads[1])
    return tuple([region(r) for r in reads])


def _unallocated_result(run, kind, site) -> None:
    """What allocating an instruction's result tile at ``site`` changes that can be observed,
    for a result that goes without its tile (``write_into``, ``record_pending``): an allocation
    id, the count of its allocation site (as ``_site_key`` counts it), a clock tick."""
    memory = run.memory
    next(_ids)
    counts = memory.site_counts
    key = (kind, site[0], site[1], run.epoch)
    counts[key] = counts.get(key, 0) + 1
    memory.clock += 1


class _DirectValues:
    """``_write_begin``'s ``vals`` for a write whose values are computed into the view after
    its checks (``begin_direct``)."""

    __slots__ = ()

    def __repr__(self):
        return "<values computed in place>"


DIRECT = _DirectValues()


class _Stored:
    """What an op called as ``t[key] = op(...)`` returns when it wrote ``t[key]`` itself."""

    __slots__ = ()

    def __repr__(self):
        return "<result already stored>"


STORED = _Stored()


def direct_spec(run, dst: Tensor, shape, dtype, buffer):
    """The allocation spec of a result tile of (``shape``, ``dtype``, ``buffer``) that may go
    straight into ``dst`` instead (``write_into``, ``ops.load``), or None where the literal
    path is needed: a result shape this run has not allocated before (its allocation could
    fail), another dtype, an HBM or block-list ``dst``, or one the result does not fit (the
    assignment then raises its error)."""
    try:
        spec = run.alloc_specs.get((shape, dtype, id(buffer), False))
    except TypeError:
        return None
    if spec is None or spec.dt != dst.dtype or dst._slots is not None or \
            dst.root.buffer == "hbm" or not same_elements(dst.shape, spec.shape):
        return None
    return spec


def write_checked(dst: Tensor, vals, api: str, run) -> bool:
    """``write(dst, vals, api)``; False, with nothing written, when its checks refuse it (a
    race, a tile out of scope, an out-of-bounds view): the caller takes the literal path, which
    meets the same refusal where the literal path meets it."""
    try:
        write(dst, vals, api, run=run)
    except Exception:       # noqa: BLE001 - raised again by the literal path, in its place
        return False
    return True


def begin_direct(run, dst: Tensor, shape, dtype, buffer, api):
    """``dst``'s storage for an instruction to compute its result into (NumPy ``out=``), with
    ``dst``'s write checks made (``_write_begin``: before the values land), or None (nothing
    done; compute as usual): where the result is ``dst`` whole as fp32 into fp32 (no rounding
    to do), a plain view, no launch grid, and ``write_into`` would write it there
    (``direct_spec``); where the checks refuse the write (the literal path then raises their
    error). The caller computes into the array, nothing raising, and hands it to
    ``ops.result_tile`` as the values: ``write_into`` finishes the write (``_write_end``) and
    records it. (Issue 12: the result's fresh array and its copy into ``dst`` cost ~25 of a
    ``t[...] = nisa.tensor_tensor(...)``'s ~70 us on a 128x512 fp32 tile.)"""
    if run.spmd is not None or dst._idx is not None or dst.root.adopted or \
            dst.dtype is not dtypes.F32 or dst.shape != shape or dst._arr.shape != shape or \
            (dtype is not dtypes.F32 and dtypes.normalize(dtype) is not dtypes.F32):
        return None
    spec = direct_spec(run, dst, shape, dtypes.F32, buffer)
    if spec is None:
        return None
    try:
        state = _write_begin(dst, DIRECT, api, False, None, run, None)
    except Exception:       # noqa: BLE001 - raised again by the literal path, in its place
        return None
    run.direct = (dst, state, spec)
    return dst._arr


def write_into(run, dst: Tensor, shape, dtype, buffer, vals, op, engine, reads, detail,
               site):
    """An instruction's result written straight into ``dst`` (the current face's
    destination-passing ISA, ``nkisim.nki.isa._direct``, and Beta 1's ``dst[key] = op(...)``,
    ``nkisim.dstform``): what ``ops.result_tile`` followed by ``_into``/``assign(dst, result)``
    do, without the result tile that ``assign`` discards (issue 12: its allocation, write,
    region and release were a third of a ``tensor_tensor``'s interpreter time). The same
    observable effects: the result tile's allocation id, the count of its allocation site and
    its clock tick (as ``record_pending``), the write of ``dst`` with the result's values cast
    to its dtype (the result tile has ``dst``'s dtype: one rounding either way), one record
    whose written region is ``dst`` and whose shape is the result's. Returns the Instr, or None
    (nothing done) where ``direct_spec`` finds none or writing ``dst`` raises: the literal path
    then records the instruction and raises that error when it writes ``dst`` (a refused write
    changes nothing observable: the checks raise before the values land)."""
    direct = run.direct
    if direct is not None and direct[0] is dst and vals is dst._arr:
        run.direct = None           # computed in place after begin_direct's checks
        spec, rs = direct[2], direct[2].shape
        _write_end(dst, op, None, run, direct[1])
    else:
        spec = direct_spec(run, dst, shape, dtype, buffer)
        if spec is None:
            return None
        ds, rs = dst.shape, spec.shape
        if getattr(vals, "shape", None) != rs:
            vals = np.broadcast_to(vals, rs)
        if not write_checked(dst, fit(vals, ds, rs), op, run):
            return None
    _unallocated_result(run, spec.buf.kind, site)
    p = rs[0]
    return run.record(op, engine, read_regions(reads), (region(dst),), dtypes.name(dst.dtype),
                      p, math.prod(spec.phys_shape) // p, detail, site)


def record_pending(t: Tensor):
    """Pop the pending matmul and record it as writing ``t``, with the effects the result
    tile's allocation would have had on what is observable: an allocation id, the count of
    its allocation site (what ``_site_key`` counts), a clock tick. Returns (the Instr, the
    values). The caller writes ``t`` and then stamps the operands described since
    (``Memory.release`` of the result tile did)."""
    _, run, out, st, mv, detail, site, _ = PENDING.pop()     # (the last reference to it)
    _unallocated_result(run, "psum", site)
    M = out.shape[0]
    instr = run.record("nc_matmul", TENSOR_ENGINE, (region(st), region(mv)), (region(t),),
                       "float32", M, out.size // M, detail, site)
    if _ARGS_DIE_LAST_FIRST:
        del mv          # (then st, when this returns: the order the call released them in)
    return instr, out


# The order a finished call releases its arguments in, which the operand tiles' deaths (their
# lifetimes' order in the trace) follow: CPython 3.10's call_function pops them off the stack,
# the last first; 3.11+ release them first to last (as record_pending's locals are).
_ARGS_DIE_LAST_FIRST = sys.version_info < (3, 11)


def _accumulate_check(run, t: Tensor):
    """The read check of ``t += matmul`` (the associative accumulation is exempt from race
    checks): (the mask of ``t``'s never-written elements, which start the accumulation: only
    the others are read; the mask of its elements computed from never-written values, which
    stay so when more is added: ``taint_elements`` after the write), each None when empty."""
    root = t.root
    # every element written (the tensor's summaries, nkisim.checks): no scan
    if root.full is True or (root.uniform is not None and root.uniform > 0):
        checks.check_read(run, t, "nc_matmul (accumulate)", accumulate=True)
        return None, None
    unwritten = checks.shadow_view(t) == 0
    if not unwritten.any():
        checks.check_read(run, t, "nc_matmul (accumulate)", accumulate=True)
        return None, None
    # A partial sum computed from never-written SBUF (the rows a student's last band of an
    # image did not load) is garbage on the device, not a fresh PSUM location: an earlier
    # matmul of the group wrote it. Adding to it keeps it garbage; it neither starts the group
    # nor breaks the nl.zeros rule (the tile was zeroed, then written with garbage).
    fresh, garbage = unwritten, checks.garbage_view(t)
    if garbage is not None:
        garbage = unwritten & (garbage if t._idx is None else garbage[t._idx])
        fresh = unwritten & ~garbage
        garbage = garbage if garbage.any() else None
    if not fresh.any():
        fresh = None
    else:
        _psum_ndarray_rule(run, t)
    checks.check_read(run, _masked_shadow_view(t, ~unwritten, run),
                      "nc_matmul (accumulate)", accumulate=True)
    return fresh, garbage


def _consume_pending(t: Tensor, p: PendingMatmul) -> bool:
    """``t += p`` for a pending matmul, when ``t`` is a whole-values fp32 PSUM accumulator of
    the result's shape: what ``result_tile`` + ``inplace`` do, without the result tile. False
    (nothing done) otherwise."""
    pend = PENDING[0]
    run, out = pend[1], pend[2]
    root = t.root
    if root.buffer != "psum" or t.dtype != dtypes.F32 or t._slots is not None or \
            out.shape != t.shape or p is not pend[0] or not pending_allocatable(run, out):
        return False
    pend[5]["accumulate"] = True
    # (no reference to the tuple past record_pending: the operand tiles it holds die when
    # record_pending returns, in the order they did when nc_matmul returned)
    del pend
    if root.psum_set is not None:
        psum_value_set(run, t)
    instr, out = record_pending(t)
    fresh, garbage = (None, None) if t._ws is None else _accumulate_check(run, t)
    if fresh is not None:
        acc = values(t).astype(np.float32) + out
        write(t, np.where(fresh, out, acc), "nc_matmul", accumulate=True, run=run)
    else:
        _add_into(run, t, out)
    if garbage is not None:
        taint_elements(run, t, (garbage, t.root.taint))
    _accumulated(run, t, instr)
    return True


def _accumulated(run, t, instr) -> None:
    """What ``inplace`` does after the accumulation: the lifetimes of the operands described
    since the record (``Memory.release`` of the result tile stamps them), ``t._inplace``."""
    if TOUCHED:
        run.memory._stamp(run.memory.clock)
    t._inplace = True


def _psum_ndarray_rule(run, t) -> None:
    # The first matmul of an accumulation group overwrites the PSUM bank, later
    # ones accumulate (arch guide, "Near-memory accumulation in PSUM"; nki 0.3
    # nc_matmul accumulate=None: "the first write to a PSUM location overwrites
    # and later writes accumulate, this matches NKI 0.2.0 behavior"). AWS's
    # tutorials/attention_fwd_performance and reference/allocated_fused_linear.py
    # accumulate into nl.ndarray PSUM tiles: not an uninitialized read. The docs'
    # pattern starts from nl.zeros: a tolerated rule.
    run.rule(("psum_ndarray_acc", t.root.id),
             f"`{t.name} += nisa.nc_matmul(...)` into a PSUM tile created without "
             "zeros (nl.ndarray): the first matmul overwrites it",
             "condition 1: a psum buffer with zeros",
             "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/"
             "arch/trainium_inferentia2_arch.html#near-memory-accumulation-in-psum")


def _add_into(run, t, inc) -> None:
    """``t += inc`` for an fp32 PSUM accumulator whose elements a matmul wrote."""
    if t._idx is None and t.dtype == dtypes.F32 and t._slots is None and \
            t._arr.dtype == dtypes.F32:
        # fp32 PSUM: accumulate in place (one pass over the tile, no temporary)
        root = t.root
        ws = t._ws
        if t._oob is None and t._mask is None and root.unpoisoned is None and \
                not root.adopted and not root.param and \
                (ws is None or (ws is checks.LAZY and root.shadow is None and
                                checks._covers(t))):
            # what ``write(add=inc)`` does for a whole tile with no element-wise shadow
            # (one call layer less on the commonest instruction, issue 12)
            if ws is not None:
                checks.check_write(run, t, "nc_matmul", True)
            root.version += 1
            np.add(t._arr, inc, out=t._arr)
            if run.taint is not None:
                _apply_taint(run, t, "nc_matmul", None)
        else:
            write(t, None, "nc_matmul", accumulate=True, run=run, add=inc)
    else:
        write(t, values(t).astype(np.float32) + inc, "nc_matmul", accumulate=True, run=run)


def inplace(t: Tensor, other, opname: str) -> Tensor:
    """``t += x`` etc. ``psum += nisa.nc_matmul(...)`` is the PSUM accumulation pattern."""
    if type(other) is PendingMatmul:
        if opname == "add" and _consume_pending(t, other):
            return t
        materialize_pending()       # then as for any result tile
    run = context.current()
    instr = other._producer if isinstance(other, Tensor) else None
    if instr is not None and opname == "add" and instr.op == "nc_matmul" and \
            run.trace.instrs and run.trace.instrs[-1] is instr:
        if t.root.buffer != "psum":
            raise nki_error("err_unsupported_memory", param="dst", api="nc_matmul",
                            expected="psum", got=t.root.buffer)
        if t.dtype is not dtypes.F32 and t.dtype != dtypes.F32:
            run.warn(("psum_dtype", t.root.id),
                     f"PSUM accumulator `{t.name}` is {dtypes.name(t.dtype)}: matmul accumulates "
                     "in fp32 PSUM; keep accumulators float32 (CS149 forum) or every partial sum "
                     "is rounded")
        if t._slots is not None:
            values(t)            # err_failed_to_infer_tile_from_local_tensor
        if t.root.psum_set is not None:
            psum_value_set(run, t)
        fresh, garbage = (None, None) if t._ws is None else _accumulate_check(run, t)
        if other.root.unpoisoned is not None:
            poisoned(other.root)
        inc = other._arr if other._idx is None and other._slots is None and \
            other._arr.shape == t.shape else fit(values(other), t.shape, other.shape,
                                                 f"{t.name} += nc_matmul(...)")
        if other._mask is not None:
            # `psum += nisa.nc_matmul(..., mask=m)` is one accumulating matmul instruction
            # (ref §1.11), and a masked instruction "only processes" the masked-in elements
            # (§1.12): the masked-out ones of `psum` keep their values, as `mask=(i * 128 <
            # n)` in AWS's reference/allocated_fused_linear.py relies on for its last tile.
            m = fit(other._mask, t.shape, other.shape)
            if fresh is not None:
                fresh = fresh & m
            if garbage is not None:
                garbage = garbage & m
                garbage = garbage if garbage.any() else None
            old = values(t).astype(np.float32)
            new = old + inc
            if fresh is not None:
                new = np.where(fresh, inc, new)
            write(t, new, "nc_matmul", accumulate=True, run=run, mask=m)
        elif fresh is not None:
            acc = values(t).astype(np.float32) + inc
            write(t, np.where(fresh, inc, acc), "nc_matmul", accumulate=True, run=run)
        else:
            _add_into(run, t, inc)
        if garbage is not None:
            taint_elements(run, t, (garbage, t.root.taint))
        if other._ws is not None and t._ws is not None and other.root.taint is not None:
            inherit_taint(t, other)
        instr.writes = (region(t),)
        instr.detail["accumulate"] = True
        run.memory.release(other.root)
        other._producer = None
        t._inplace = True
        return t
    nl = _ops
    # `acc[...] += x` (or *=) is an associative reduction: "associative reductions are not
    # considered loop carried dependencies" in affine_range (nl.affine_range docstring,
    # programming model "NKI iterators"; AWS's tutorials/fused_mamba v1 accumulates
    # `scanC_accum += ...` into an SBUF tile across affine_range iterations). The accumulation
    # is exempt from the race checks like the PSUM matmul accumulation; reading the partial
    # result inside the loop still is a loop-carried dependency (nkisim.checks). -= and /= are
    # not associative: checked as usual.
    assoc = opname in ("add", "multiply")
    prev, run.assoc = run.assoc, (t.root if assoc else None)
    try:
        res = getattr(nl, opname)(t, other)
        assign(t, res)
    finally:
        run.assoc = prev
    t._inplace = True
    return t


# the operators whose overloads do not broadcast along partitions (Tensor._op), as written
_OPERATOR_SIGN = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/",
                  "left_shift": "<<", "right_shift": ">>"}


def _partitions(t: Tensor) -> int:
    if t.root.buffer == "hbm" or t.paxis is None or not t.shape:
        return 1
    return int(t.shape[t.paxis])


def _free(t: Tensor) -> int:
    p = _partitions(t)
    return max(1, t.size // max(p, 1))

