"""SBUF/PSUM allocation accounting: live bytes per partition, PSUM banks, peaks.

An auto-allocated SBUF/PSUM tensor is live from its creation until the kernel can no longer
reach it (Python drops its last reference) or the loop iteration that allocated it ends (NKI
scoping: a tile defined in a loop body is out of scope afterwards, ref §1.9). SBUF usage is
counted in bytes per partition; PSUM usage in 2 KiB banks, one bank per tile at least, because a
PSUM tile cannot span banks and each matmul accumulation group owns a bank (ref §1.4, §1.11).
Exceeding the target's usable SBUF per partition or its 8 PSUM banks raises an error naming the
largest live tensors (the device compiler reports these as GCA035 "couldn't be allocated in SB").
"""

from __future__ import annotations

import weakref

from .errors import nki_error, shape_str


class Memory:
    def __init__(self, run):
        self.run = run
        self.sbuf_live = 0          # bytes per partition
        self.psum_live = 0          # banks
        self.peak_sbuf = 0
        self.peak_psum = 0
        self.live = {}              # alloc id -> Allocation
        self.site_counts = {}       # allocation-site counters (nkisim.tensor._site_key)

    def allocate(self, alloc, tensor) -> None:
        run = self.run
        alloc.live = True
        self.live[alloc.id] = alloc
        if alloc.buffer == "sbuf":
            self.sbuf_live += alloc.pbytes
            if self.sbuf_live > self.peak_sbuf:
                self.peak_sbuf = self.sbuf_live
                run.trace.peak_sbuf_bytes = self.peak_sbuf
        else:
            self.psum_live += alloc.banks
            if self.psum_live > self.peak_psum:
                self.peak_psum = self.psum_live
                run.trace.peak_psum_banks = self.peak_psum
        if run.loops:
            lp = run.loops[-1]
            alloc.loop = lp
            lp.scope.append(alloc)
        weakref.finalize(tensor, self.release, alloc)
        if "capacity" in run.checks:
            if alloc.buffer == "sbuf" and self.sbuf_live > run.arch.sbuf_usable_bytes:
                need = self.sbuf_live
                self.release(alloc)
                raise nki_error("nkisim_sbuf_overflow", need=need,
                                limit=run.arch.sbuf_usable_bytes, target=run.arch.name,
                                largest=self._largest("sbuf", alloc))
            if alloc.buffer == "psum" and self.psum_live > run.arch.psum_banks:
                need = self.psum_live
                self.release(alloc)
                raise nki_error("nkisim_psum_overflow", need=need,
                                limit=run.arch.psum_banks, largest=self._largest("psum", alloc))

    def release(self, alloc) -> None:
        if not alloc.live:
            return
        alloc.live = False
        self.live.pop(alloc.id, None)
        if alloc.buffer == "sbuf":
            self.sbuf_live -= alloc.pbytes
        elif alloc.buffer == "psum":
            self.psum_live -= alloc.banks

    def end_iteration(self, loop) -> None:
        for alloc in loop.scope:
            self.release(alloc)
        loop.scope.clear()

    def _largest(self, buffer, extra) -> str:
        allocs = [a for a in self.live.values() if a.buffer == buffer] + [extra]
        allocs.sort(key=lambda a: a.pbytes, reverse=True)
        parts = []
        for a in allocs[:5]:
            where = f" (line {a.line})" if a.line else ""
            parts.append(f"`{a.name}` {shape_str(a.shape)} {a.dtype.name}: {a.pbytes} B"
                         f"{where}")
        more = len(allocs) - 5
        return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")

    def summary(self) -> dict:
        return {"peak_sbuf_bytes_per_partition": self.peak_sbuf,
                "sbuf_usable_bytes_per_partition": self.run.arch.sbuf_usable_bytes,
                "peak_psum_banks": self.peak_psum, "psum_banks": self.run.arch.psum_banks}
