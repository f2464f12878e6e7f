"""SBUF/PSUM allocation accounting: the live bytes per partition, PSUM banks, peaks.

Capacity is judged on *lifetimes*, as the device compiler's allocator sees them: an
auto-allocated SBUF/PSUM tile occupies its buffer from the first instruction that touches it
(reads or writes it) to the last one, not from its ``nl.ndarray`` to the end of the Python
scope. A kernel whose tiles are never all needed at once is not rejected because its Python
variables keep them reachable (the brief of issue 8 / conformance repro r15: AWS's
tutorials/layernorm keeps its input tile and a broadcast gamma in variables while the result is
computed). At one instruction, its outputs may take the place of inputs it reads for the last
time (in-place elementwise ops are legal on the engines: ``x[...] = nisa.tensor_scalar(x, ...)``
writes x in place); so the usage is counted at two points per instruction: before it writes
(the tiles live before it and needed by it or later) and after (the tiles needed later, and its
outputs). A tile never touched by an instruction occupies its buffer at its allocation only.
Loop iterations are executed for real, so a tile allocated in a loop body is one allocation per
iteration, live for that iteration's accesses (NKI scoping, ref §1.9); a tile used across
iterations is live until its last access. nkisim measures the lifetimes while the kernel runs
and checks the peak when it ends.

SBUF usage is counted in bytes per partition (``prod(free dims) * itemsize``, ref §1.2) on the
partitions a tile spans (see ``Memory._usage``); PSUM
usage in 2 KiB banks, one bank per tile at least, because a PSUM tile cannot span banks and each
matmul accumulation group owns a bank (ref §1.4, §1.11). A peak above the target's usable SBUF
per partition (trn1 176 KiB; trn2 224 KiB, no reservation documented, see ``nkisim.arch``) or its
8 PSUM banks is a tolerated rule (``Memory._spilled``): the compiler spills live data to the
next memory tier (AWS's programming model) and AWS's CI-tested nki-library kernels go over, so it
is a warning naming the largest tensors live at the peak, an error in strict mode. What cannot be
spilled is an error: one tensor larger than a partition (``nkisim_sbuf_overflow``, at its
allocation in ``nkisim.tensor``), one instruction whose SBUF operands exceed a partition
(``nkisim_instruction_sbuf_overflow``, GCA035 "couldn't be allocated in SB", ref §2.2), and any
overflow in a kernel under ``@nki.compiler.enable_stack_allocator``
(``nkisim_stack_overflow_sbuf``/``_psum``). The real simulator does not check capacity at all (ref
§4.1, §4.2). The peak is a lower bound of what the real allocator needs (it also pays for
fragmentation and alignment).

The result tile of an instruction that ``dst[...] = nisa.op(...)`` retargets to write ``dst``
never existed on the device (see ``nkisim.tensor.assign``): ``release`` discards it.
Direct-allocated tensors (``ncc.sbuf.mod_alloc``) are placed by the kernel and not counted here.
"""

from __future__ import annotations

import os
import sys
import weakref

import numpy as np

from .errors import nki_error, shape_str, where


def _bound(sizes, parts, pmax) -> int:
    """The bytes any placement of tiles live at once needs on its fullest partition (the
    partition-aware lower bound of ``Memory._usage``, for one set of tiles)."""
    full = sum(s for s, p in zip(sizes, parts) if p >= pmax)
    rest = [(s, p) for s, p in zip(sizes, parts) if p < pmax]
    if not rest:
        return full
    wide = sum(s for s, p in rest if 2 * p > pmax)
    spread = -(-sum(s * p for s, p in rest) // pmax)
    return full + max(wide, spread, max(s for s, _ in rest))

_MALLOC_TUNED = []


def tune_malloc() -> None:
    """Keep freed tile-sized blocks in the process heap (glibc only; once per process).

    Every instruction allocates and frees tile-sized arrays (a 128x512 fp32 tile and its int32
    shadow are 256 KiB each). glibc returns such blocks to the OS when they are mmapped or sit
    at the top of the heap above ``M_TRIM_THRESHOLD`` (dynamically about 2x the largest freed
    block), so the next instruction page-faults its memory back in: measured on the 2-core
    machine, ``nisa.tensor_tensor`` on 128x512 fp32 took 390 us with checks on against 104 us
    once the heap keeps 128 MiB (issue 12). Blocks below 32 MiB come from the heap
    (``M_MMAP_THRESHOLD``, glibc's maximum), so freed tiles are reused. ``NKISIM_MALLOC=0``
    leaves malloc alone.
    """
    if _MALLOC_TUNED or os.environ.get("NKISIM_MALLOC", "1") == "0":
        return
    _MALLOC_TUNED.append(True)
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return                  # not glibc (musl has no mallopt)
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # <malloc.h>
    mallopt(M_MMAP_THRESHOLD, 32 << 20)
    mallopt(M_TRIM_THRESHOLD, 128 << 20)


class _TileRef(weakref.ref):
    """A weak reference to a tile that knows its allocation (4x cheaper than
    ``weakref.finalize``, which every allocation paid; issue 12)."""

    __slots__ = ("alloc",)


# Allocations touched by the instruction being built: ``nkisim.tensor.region`` appends the root
# of every operand it describes, ``Run.record`` advances the clock and stamps them (``_stamp``).
TOUCHED: list = []


_DT_NAMES: dict = {}


class Memory:
    def __init__(self, run):
        tune_malloc()
        self.run = run
        self.sbuf_live = 0          # bytes per partition of the allocations still reachable
        self.psum_live = 0          # banks
        self.peak_sbuf = 0          # lifetime peaks, set by finish()
        self.peak_psum = 0
        # alloc id -> the _TileRef of its tensor, for the allocations reachable and in scope;
        # an allocation being measured has ``alloc.span`` = [first touch, last touch] (clock,
        # -1: none) and ``alloc.born`` = the clock at its allocation (attributes, not dicts
        # keyed by id: stamped by every instruction, issue 12)
        self.live = {}
        self.site_counts = {}       # allocation-site counters (nkisim.tensor._site_key)
        self.clock = 0              # ticks at every allocation and every instruction
        self.dead = []              # lifetimes: (first, last, size, buffer, site)
        self.sites = {}             # (name, shape, dtype, file, line) -> site number
        self.finished = False
        self._dead_cb = self._dead  # (one bound method, not one per allocation)
        TOUCHED.clear()

    # ---- allocation ----
    def allocate(self, alloc, tensor) -> None:
        """Account for a new SBUF/PSUM tensor."""
        alloc.live = True
        if alloc.buffer == "sbuf":
            self.sbuf_live += alloc.pbytes
        else:
            self.psum_live += alloc.banks
        self.clock = alloc.born = self.clock + 1
        alloc.span = [-1, -1]
        loops = self.run.loops
        if loops:
            lp = loops[-1]
            if lp.kind == "static":
                lp = next((x for x in reversed(loops) if x.kind != "static"), None)
            if lp is not None:
                alloc.loop = lp
                lp.scope.append(alloc)
        ref = _TileRef(tensor, self._dead_cb)
        ref.alloc = alloc
        self.live[alloc.id] = ref

    def _stamp(self, now) -> None:
        need = 0                    # bytes per partition of the buffers it touches (any buffer:
        for root in TOUCHED:        # cheap; SBUF only in _operands, when the sum is too big)
            s = root.span
            if s is not None:
                if s[1] != now:
                    need += root.pbytes
                    s[1] = now
                if s[0] < 0:
                    s[0] = now
        if need > self.run.arch.sbuf_partition_bytes:
            self._operands(now)
        TOUCHED.clear()

    def _operands(self, now) -> None:
        """The instruction at clock ``now`` touches more than a partition of bytes: its SBUF
        operands must be in SBUF at once (the allocator can spill other tensors, not the
        operands of the instruction that reads them), and one more than a partition is GCA035
        (aws-neuron-sdk #1060: "Instruction: I-21-0 with opcode: TensorTensor couldn't be
        allocated in SB ... Total Accessed Bytes per partition by instruction: 198024 Total SB
        Partition Size: 196608"; that limit is the whole partition, not the usable bytes). The
        need is the larger of its inputs' and its outputs' (an output may take the place of an
        input, in-place ops are legal), each a lower bound over placements (``_bound``)."""
        run = self.run
        instrs = run.trace.instrs
        if "capacity" not in run.checks or not instrs:
            return
        instr = instrs[-1]
        roots = {id(r): r for r in TOUCHED if r.span is not None and r.buffer == "sbuf"}
        reads = {r.key for r in instr.reads if r.buffer == "sbuf"}
        writes = {r.key for r in instr.writes if r.buffer == "sbuf"}
        ins = [r for r in roots.values() if r.key in reads]
        outs = [r for r in roots.values() if r.key in writes]
        pmax = run.arch.pmax
        need = max(_bound([r.pbytes for r in ins], [r.nparts for r in ins], pmax),
                   _bound([r.pbytes for r in outs], [r.nparts for r in outs], pmax))
        limit = run.arch.sbuf_partition_bytes
        if need <= limit:
            return
        ops = sorted({id(r): r for r in ins + outs}.values(), key=lambda r: -r.pbytes)
        largest = "; ".join(f"`{r.name}` {shape_str(r.shape)} {r.dtype.name}: {r.pbytes} B"
                            + (f" ({where(r.file, r.line)})" if r.line else "") for r in ops)
        raise nki_error("nkisim_instruction_sbuf_overflow", api=instr.op,
                        where=where(instr.file, instr.line), need=need, limit=limit,
                        target=run.arch.name, largest=largest)

    def filled(self, alloc) -> None:
        """``alloc`` holds a value since its allocation (a PSUM ``nl.zeros``: no instruction)."""
        s = alloc.span
        if s is not None and s[0] < 0:
            s[0] = s[1] = alloc.born

    # ---- release ----
    def release(self, alloc) -> None:
        """Discard ``alloc``: a retargeted result tile never existed (not counted). Operands
        described since the last instruction belong to it (``producer.writes = ...``)."""
        if TOUCHED:
            self._stamp(self.clock)
        if alloc.live:
            self._free(alloc)
            scope = alloc.loop.scope if alloc.loop is not None else None
            if scope and scope[-1] is alloc:
                scope.pop()         # (nothing left for end_iteration: the commonest case)
        alloc.span = None

    def _free(self, alloc) -> bool:
        if not alloc.live:
            return False
        alloc.live = False
        self.live.pop(alloc.id, None)
        if alloc.buffer == "sbuf":
            self.sbuf_live -= alloc.pbytes
        elif alloc.buffer == "psum":
            self.psum_live -= alloc.banks
        return True

    def _die(self, alloc) -> None:
        """``alloc`` can no longer be touched: its lifetime is final."""
        if self._free(alloc):
            self._stamp(self.clock)
            self._record(alloc)

    def _record(self, alloc) -> None:
        s = alloc.span
        alloc.span = None
        first, last = s if s is not None else (-1, -1)
        if first < 0:
            first = last = alloc.born   # never touched: occupies its buffer when allocated
        dt = alloc.dtype
        dname = _DT_NAMES.get(dt)
        if dname is None:           # (np.dtype.name is a slow Python property)
            dname = _DT_NAMES[dt] = dt.name
        key = (alloc.name, alloc.shape, dname, alloc.file, alloc.line)
        site = self.sites.setdefault(key, len(self.sites))
        size = alloc.pbytes if alloc.buffer == "sbuf" else alloc.banks
        self.dead.append((first, last, size, alloc.buffer == "sbuf", site, alloc.nparts))

    def _dead(self, ref) -> None:
        # weakref callback: the kernel dropped its last reference to the tensor
        self._die(ref.alloc)

    def end_iteration(self, loop) -> None:
        """The loop body's iteration ended: its tiles are out of scope."""
        scope = loop.scope
        if scope:
            for alloc in scope:
                if alloc.live:
                    self._die(alloc)
                    alloc.live = None       # out of scope: nkisim.checks flags any later use
            scope.clear()

    # ---- the peak ----
    def _usage(self, sbuf: bool):
        """(usage per clock point, lifetimes) of one buffer: point ``2c`` is before the
        instruction at clock ``c`` writes, ``2c + 1`` after (see the module doc).

        SBUF usage is partition-aware: a tile of ``p`` partitions occupies bytes on ``p``
        partitions only (NKI 0.3 places tensors at a (start partition, byte) address; the
        allocator can put a (64, F) tile beside another on partitions [64, 128)). AWS's own
        rope test filter keeps shapes with four 64 KiB/partition tiles live at once, three of
        them on 64 partitions: 256 KiB if every tile spanned all 128 partitions, but they fit
        in trn2's 224 KiB. The usage at a point is the lower bound of what any placement
        needs on its fullest partition: the bytes of the tiles spanning all partitions (on
        every partition), plus, for the other tiles, the largest of:
        - the bytes of those spanning more than half the partitions: two of them always
          share a partition, and intervals that pairwise intersect share one point (Helly's
          theorem in one dimension), so one partition holds them all;
        - their total ``partitions x bytes`` spread evenly over the partitions;
        - the bytes of the largest of them (its partitions hold it).
        This is the plain sum when every tile spans all partitions."""
        life = np.array([d[:3] + (d[4], d[5]) for d in self.dead if d[3] == sbuf],
                        dtype=np.int64).reshape(-1, 5)
        n = 2 * (self.clock + 2)
        if not len(life):
            return np.zeros(n, np.int64), life[:, :4]
        first, last, size, parts = life[:, 0], life[:, 1], life[:, 2], life[:, 4]
        # before instruction c: live from before (first < c) and needed (c <= last)
        # after instruction c: written at or before it and needed later, or born at it
        lo = 2 * first + 1
        hi = np.where(first < last, 2 * last, 2 * first + 1)   # inclusive

        def timeline(amount):
            use = np.zeros(n + 1, np.int64)
            np.add.at(use, lo, amount)
            np.add.at(use, hi + 1, -amount)
            return np.cumsum(use[:-1])

        if not sbuf:
            return timeline(size), life[:, :4]
        pmax = self.run.arch.pmax
        full = parts >= pmax
        rest = ~full
        wide = timeline(np.where(rest & (2 * parts > pmax), size, 0))
        spread = -(-timeline(np.where(rest, parts * size, 0)) // pmax)
        largest = np.zeros(n, np.int64)
        for s in np.unique(size[rest]):     # one timeline per distinct size (a few)
            live = timeline(np.where(rest & (size == s), 1, 0)) > 0
            np.maximum(largest, np.where(live, s, 0), out=largest)
        use = timeline(np.where(full, size, 0)) + np.maximum(np.maximum(wide, spread), largest)
        return use, life[:, :4]

    def finish(self) -> None:
        """The kernel ended: every lifetime is final; compute the peaks, check capacity."""
        if self.finished:
            return
        self.finished = True
        self._stamp(self.clock)
        for ref in list(self.live.values()):
            alloc = ref.alloc
            self._free(alloc)
            self._record(alloc)
        run = self.run
        for sbuf in (True, False):
            use, life = self._usage(sbuf)
            peak = int(use.max()) if len(use) else 0
            if sbuf:
                self.peak_sbuf = run.trace.peak_sbuf_bytes = peak
                limit = run.arch.sbuf_usable_bytes
            else:
                self.peak_psum = run.trace.peak_psum_banks = peak
                limit = run.arch.psum_banks
            if peak <= limit or "capacity" not in run.checks:
                continue
            at = int(np.argmax(use))
            first, last = life[:, 0], life[:, 1]
            lo = 2 * first + 1
            hi = np.where(first < last, 2 * last, 2 * first + 1)
            here = life[(lo <= at) & (at <= hi)]
            largest = self._largest(here, sbuf)
            if (run.trace.compiler or {}).get("enable_stack_allocator"):
                # the stack allocator keeps every tile for its whole scope (at least our
                # lifetimes) and reports the overflow ("stack overflow: required sbuf size ...
                # exceeds available sbuf size", nki-reference §2.2)
                raise nki_error("nkisim_stack_overflow_sbuf" if sbuf else
                                "nkisim_stack_overflow_psum", need=peak, limit=limit,
                                target=run.arch.name, largest=largest)
            self._spilled(sbuf, peak, limit, largest, here)

    def _spilled(self, sbuf, peak, limit, largest, here) -> None:
        """The tensors live at once overflow a buffer: the compiler spills, a tolerated rule.

        AWS's programming model (aws-neuron-sdk 1db4d74e nki/programming_model.rst, "Memory
        hierarchy"): "When the cumulative size of live data defined by the NKI kernel overflows
        the capacity of any on-chip memory, the Neuron compiler inserts the necessary spills or
        refills between that memory and the next-tier memory in the hierarchy" (SBUF's is HBM,
        PSUM's is SBUF); the perf guide measures those spills (``spill_save_bytes``,
        ``qSyncSpillReload``). AWS's CI-tested nki-library compiles kernels over the limit:
        core/moe/moe_cte/bwmm_shard_on_I.py (SHARD_ON_INTERMEDIATE, I=3072 at LNC 2) keeps 12
        [128, 512] fp32 PSUM accumulators until all are evacuated (12 banks of 8), and
        bwmm_shard_on_block.py (SHARD_ON_BLOCK, B=512, I=1536) needs at least 245840 of trn2's
        229376 bytes per partition; both are `pytest.mark.fast` vectors of test_moe_cte.py,
        which nki-library compiles (default mode compile-and-infer, test/README.md). So a kernel
        that keeps too much live is slower, not wrong: a warning quoting the documented advice
        (an error in strict mode). What the allocator cannot spill stays an error: one tensor
        larger than a partition (``nkisim.tensor``) and one instruction's operands
        (``_operands``, GCA035); and kernels under ``enable_stack_allocator`` (above)."""
        run = self.run
        names = {v: k for k, v in self.sites.items()}
        total = {}
        for _, _, size, site in here.tolist():
            total[site] = total.get(site, 0) + size
        site = max(total, key=total.get)        # the site listed first (``_largest``)
        _, _, _, file, line = names[site]
        if sbuf:
            what = (f"SBUF overflow: live tensors need {peak} bytes per partition at once, more "
                    f"than the {limit} usable bytes per partition of {run.arch.name}; the "
                    f"compiler spills some to HBM and reloads them (slower). Largest live "
                    f"tensors: {largest}")
        else:
            what = (f"PSUM overflow: live tensors need {peak} PSUM banks at once, more than the "
                    f"{limit} banks of 2 KiB per partition; the compiler spills some to SBUF "
                    f"and reloads them (slower). Live PSUM tensors: {largest}")
        run.rule(("sbuf_overflow" if sbuf else "psum_overflow",), what,
                 "When the cumulative size of live data defined by the NKI kernel overflows the "
                 "capacity of any on-chip memory, the Neuron compiler inserts the necessary "
                 "spills or refills between that memory and the next-tier memory in the "
                 "hierarchy",
                 "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/"
                 "programming_model.html", site=(file, line))

    # ---- reporting ----
    def _largest(self, here, sbuf, top=5) -> str:
        """The tensors live at the peak, grouped by allocation site, largest first."""
        names = {v: k for k, v in self.sites.items()}
        groups = {}
        for _, _, size, site in here.tolist():
            groups.setdefault(site, []).append(size)
        ranked = sorted(groups.items(), key=lambda kv: sum(kv[1]), reverse=True)
        parts = []
        for site, sizes in ranked[:top]:
            name, shape, dtype, file, line = names[site]
            one = sizes[0]
            unit = "B" if sbuf else ("bank" if one == 1 else "banks")
            n = len(sizes)
            amount = f"{one} {unit}" if n == 1 else f"{n} tiles x {one} {unit}"
            at = f" ({where(file, line)})" if line else ""
            parts.append(f"`{name}` {shape_str(shape)} {dtype}: {amount}{at}")
        more = len(ranked) - top
        return "; ".join(parts) + (f"; and {more} more allocation sites" if more > 0 else "")

    def summary(self) -> dict:
        """Peak usage of the kernel (per partition) against the target's capacity."""
        arch = self.run.arch
        return {"peak_sbuf_bytes_per_partition": self.peak_sbuf,
                "sbuf_usable_bytes_per_partition": arch.sbuf_usable_bytes,
                "peak_psum_banks": self.peak_psum, "psum_banks": arch.psum_banks}
