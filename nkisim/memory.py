"""SBUF/PSUM allocation accounting: live bytes per partition, PSUM banks, peaks.

An auto-allocated SBUF/PSUM tensor is live from its creation until the kernel can no longer
reach it (Python drops its last reference) or the loop iteration that allocated it ends (NKI
scoping: a tile defined in a loop body is out of scope afterwards, ref §1.9; ``static_range``
bodies are unrolled at trace time, so their tiles live on until unreachable). SBUF usage is
counted in bytes per partition (``prod(free dims) * itemsize``, ref §1.2); PSUM usage in 2 KiB
banks, one bank per tile at least, because a PSUM tile cannot span banks and each matmul
accumulation group owns a bank (ref §1.4, §1.11). Exceeding the target's usable SBUF per
partition (trn1 176 KiB; trn2 224 KiB, no reservation documented, see ``nkisim.arch``) or its
8 PSUM banks raises
``nkisim_sbuf_overflow``/``nkisim_psum_overflow`` naming the largest live tensors (the device
compiler reports these as GCA035 "couldn't be allocated in SB", ref §2.2); the real simulator
does not check capacity at all (ref §4.1, §4.2).

Result tiles of instructions are *provisional* until the next instruction: ``dst[...] =
nisa.op(...)`` retargets the instruction to write ``dst`` and releases the result tile (see
``nkisim.tensor.assign``), which then never existed on the device. A provisional tile is counted
when the next instruction is recorded, the next tensor is allocated, the loop iteration ends or
the tile dies, with the usage at the moment it was created (the instruction's operands are live
then). Direct-allocated tensors (``ncc.sbuf.mod_alloc``) are placed by the kernel and not
counted here.
"""

from __future__ import annotations

import os
import sys
import weakref

from .errors import nki_error, shape_str, where

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


class Memory:
    def __init__(self, run):
        tune_malloc()
        self.run = run
        self.sbuf_live = 0          # bytes per partition
        self.psum_live = 0          # banks
        self.peak_sbuf = 0
        self.peak_psum = 0
        self.live = {}              # alloc id -> Allocation
        self.site_counts = {}       # allocation-site counters (nkisim.tensor._site_key)
        self.pending = None         # provisional result tile (Allocation), see module doc
        self.pending_at = 0         # trace length when it was allocated
        self.pending_need = 0       # SBUF bytes / PSUM banks live when it was allocated
        self.refs = {}              # alloc id -> _TileRef of its tensor, while it is live

    # ---- allocation ----
    def allocate(self, alloc, tensor, provisional=False) -> None:
        """Account for a new SBUF/PSUM tensor; ``provisional``: an instruction's result tile."""
        run = self.run
        if self.pending is not None:
            self.commit()
        alloc.live = True
        self.live[alloc.id] = alloc
        if alloc.buffer == "sbuf":
            self.sbuf_live += alloc.pbytes
            need = self.sbuf_live
        else:
            self.psum_live += alloc.banks
            need = self.psum_live
        for lp in reversed(run.loops):
            if lp.kind != "static":
                alloc.loop = lp
                lp.scope.append(alloc)
                break
        ref = _TileRef(tensor, self._dead)
        ref.alloc = alloc
        self.refs[alloc.id] = ref
        if provisional:
            self.pending = alloc
            self.pending_at = len(run.trace.instrs)
            self.pending_need = need
        else:
            self._account(alloc, need)

    def _account(self, alloc, need) -> None:
        """Update the peak with ``need`` (usage when ``alloc`` was created); check capacity."""
        run = self.run
        if alloc.buffer == "sbuf":
            if need > self.peak_sbuf:
                self.peak_sbuf = need
                run.trace.peak_sbuf_bytes = need
            limit = run.arch.sbuf_usable_bytes
        else:
            if need > self.peak_psum:
                self.peak_psum = need
                run.trace.peak_psum_banks = need
            limit = run.arch.psum_banks
        if need <= limit or "capacity" not in run.checks:
            return
        largest = self._largest(alloc.buffer)
        self.release(alloc)
        if alloc.buffer == "sbuf":
            raise nki_error("nkisim_sbuf_overflow", need=need, limit=limit,
                            target=run.arch.name, largest=largest)
        raise nki_error("nkisim_psum_overflow", need=need, limit=limit, largest=largest)

    def commit(self) -> None:
        """Count the provisional result tile (it was not retargeted)."""
        alloc, self.pending = self.pending, None
        if alloc is not None and alloc.live:
            self._account(alloc, self.pending_need)

    def instruction_recorded(self) -> None:
        """Called by ``Run.record``: once a later instruction exists, the result tile of the
        previous one can no longer be retargeted."""
        if len(self.run.trace.instrs) > self.pending_at + 1:
            self.commit()

    # ---- release ----
    def release(self, alloc) -> None:
        """Free ``alloc`` now (a retargeted result tile never existed: not counted)."""
        if alloc is self.pending:
            self.pending = None
        if not alloc.live:
            return
        alloc.live = False
        self.live.pop(alloc.id, None)
        self.refs.pop(alloc.id, None)
        if alloc.buffer == "sbuf":
            self.sbuf_live -= alloc.pbytes
        elif alloc.buffer == "psum":
            self.psum_live -= alloc.banks

    def _dead(self, ref) -> None:
        # weakref callback: the kernel dropped its last reference to the tensor
        self._unreachable(ref.alloc)

    def _unreachable(self, alloc) -> None:
        if alloc is self.pending:
            self.commit()
        self.release(alloc)

    def end_iteration(self, loop) -> None:
        """The loop body's iteration ended: its tiles are out of scope."""
        if self.pending is not None:
            self.commit()
        for alloc in loop.scope:
            if alloc.live:
                self.release(alloc)
                alloc.live = None       # out of scope: nkisim.checks flags any later use
        loop.scope.clear()

    # ---- reporting ----
    def _largest(self, buffer, top=5) -> str:
        """The live tensors of ``buffer``, grouped by allocation site, largest first."""
        groups = {}
        for a in self.live.values():
            if a.buffer == buffer:
                key = (a.name, a.shape, a.dtype.name, a.file, a.line)
                groups.setdefault(key, []).append(a)
        size = (lambda a: a.pbytes) if buffer == "sbuf" else (lambda a: a.banks)
        ranked = sorted(groups.items(), key=lambda kv: sum(size(a) for a in kv[1]),
                        reverse=True)
        parts = []
        for (name, shape, dtype, file, line), allocs in ranked[:top]:
            one = size(allocs[0])
            unit = "B" if buffer == "sbuf" else ("bank" if one == 1 else "banks")
            n = len(allocs)
            amount = f"{one} {unit}" if n == 1 else f"{n} tiles x {one} {unit}"
            at = f" ({where(file, line)})" if line else ""
            parts.append(f"`{name}` {shape_str(shape)} {dtype}: {amount}{at}")
        more = len(ranked) - top
        return "; ".join(parts) + (f"; and {more} more allocation sites" if more > 0 else "")

    def summary(self) -> dict:
        """Peak usage of the kernel (per partition) against the target's capacity."""
        if self.pending is not None:
            self.commit()
        arch = self.run.arch
        return {"peak_sbuf_bytes_per_partition": self.peak_sbuf,
                "sbuf_usable_bytes_per_partition": arch.sbuf_usable_bytes,
                "peak_psum_banks": self.peak_psum, "psum_banks": arch.psum_banks}
