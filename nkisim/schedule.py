"""Turn a :class:`~nkisim.trace.Trace` into an engine schedule: when each instruction runs.

The engines are asynchronous queues synchronized by semaphores (ref §3.2). TensorE, VectorE,
ScalarE and GpSimdE each run their instructions in the compiler's order: trace order for kernels
compiled with ``skip_middle_end_transformations``, otherwise the earliest idle gap after the
instruction is ready (the compiler's list schedule). An instruction starts when its engine is
free and every instruction it depends on is done (plus the dependent-instruction latency,
``nkisim.cost``). Copies the kernel leaves to the compiler go to VectorE or ScalarE, whichever
finishes first; tile values are renamed into other buffers as the compiler would
(:class:`_Renamer`; both in the module docstring of ``nkisim.cost``). A DMA becomes ready when
its dependencies are done. On the hardware-DGE path (trn2's default) the DMA-issuing sequencer
then executes it, one DMA at a time.
On the descriptor path (trn1, ``--disable-dge``) the fixed DMA latency elapses instead. The DMA
then shares the 16 queues' bandwidth with the other transfers in flight. Both the sequencer and
the queues serve DMAs in the order they become ready (:class:`_DmaPool`).

Dependencies come from the regions the instructions touch (``Region.overlaps``):
read-after-write, write-after-read and write-after-write against earlier instructions. Region
keys encode buffer reuse: a tile re-allocated every loop iteration in one buffer serializes the
iterations through WAR/WAW edges, and two buffers let them overlap. Consecutive matmuls into one
PSUM region add no delay beyond TensorE's in-order issue. Writes by DMA to HBM are not ordered
against each other (see the comment in :func:`schedule`).

:func:`schedule` is a single pass in trace order (list scheduling). For each buffer key it keeps
only the live accesses: a later write that covers an earlier access supersedes it, and reads of
the same region are merged. The pass is therefore linear in practice (benchmarks/
schedule_speed.py).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

import numpy as np

from .arch import Arch
from .cost import (
    FP32_DOC_FACTOR,
    CostParams,
    adjusted_flops_factor,
    compute_ns,
    dma_plan,
    params_for,
)
from .trace import DMA, GPSIMD, SCALAR, TENSOR, VECTOR, Region, Trace

COMPUTE_ENGINES = (TENSOR, VECTOR, SCALAR, GPSIMD)
DGE = "dge"             # the DMA-issuing sequencer (hardware DGE path), in engine_busy_ns

# Columns of an access entry: (b0, b1, p0, p1, t_for_dma, t_for_tensor, t_for_other)
_T_DMA, _T_TENSOR, _T_OTHER = 4, 5, 6


class _Accesses:
    """Live accesses of one buffer key, sorted by b0 (byte offset inside the partition).

    An item is ``(b0, b1, p0, p1, t_dma, t_tensor, t_other)``: the region and when a consumer on
    a DMA queue / TensorE / another compute engine may start after it. Most keys (a tile
    re-allocated every iteration) hold one or two items, so those cases skip the bisection.
    """

    __slots__ = ("b0s", "items", "maxlen", "nmax")
    SCAN = 16    # max items examined when pruning (pruning is only an optimization)

    def __init__(self):
        self.b0s = []
        self.items = []
        self.maxlen = 0     # longest byte range among items (an upper bound)
        self.nmax = 0       # how many items have that length

    def latest(self, b0, b1, p0, p1, col):
        """Latest time (column ``col``) among items overlapping the region, or 0."""
        items = self.items
        t = 0.0
        if len(items) <= 4:
            for it in items:
                if it[0] < b1 and it[1] > b0 and it[2] < p1 and p0 < it[3]:
                    v = it[col]
                    if v > t:
                        t = v
            return t
        b0s = self.b0s
        lo = bisect_right(b0s, b0 - self.maxlen)
        hi = bisect_left(b0s, b1)
        for j in range(lo, hi):
            it = items[j]
            if it[1] > b0 and it[2] < p1 and p0 < it[3]:
                v = it[col]
                if v > t:
                    t = v
        return t

    def _recount(self):
        self.maxlen = 0
        self.nmax = 0
        for it in self.items:
            ln = it[1] - it[0]
            if ln > self.maxlen:
                self.maxlen, self.nmax = ln, 1
            elif ln == self.maxlen:
                self.nmax += 1

    def prune(self, b0, b1, p0, p1, dom=None):
        """Drop items inside the region; with ``dom`` (an item) only those it dominates (all
        three times no later), so that ``dom`` stands in for them."""
        items = self.items
        b0s = self.b0s
        lo = bisect_left(b0s, b0)
        hi = bisect_left(b0s, b1)
        if hi - lo > self.SCAN:
            # the bounding range of a long strided HBM access can span thousands of others
            hi = lo + self.SCAN
        dead = None
        for j in range(lo, hi):
            it = items[j]
            if it[1] <= b1 and it[2] >= p0 and it[3] <= p1 and (
                    dom is None or (it[4] <= dom[4] and it[5] <= dom[5] and it[6] <= dom[6])):
                if dead is None:
                    dead = [j]
                else:
                    dead.append(j)
        if dead:
            maxlen = self.maxlen
            for j in reversed(dead):
                it = items[j]
                if it[1] - it[0] == maxlen:
                    self.nmax -= 1
                del items[j]
                del b0s[j]
            if self.nmax <= 0:
                self._recount()

    def put(self, entry, dom=False):
        """Add ``entry`` after pruning what it covers (``dom``: only what it dominates)."""
        items = self.items
        b0s = self.b0s
        b0, b1, p0, p1 = entry[0], entry[1], entry[2], entry[3]
        n = len(items)
        if n == 1:
            it = items[0]
            if (it[0] >= b0 and it[1] <= b1 and it[2] >= p0 and it[3] <= p1 and (
                    not dom or (it[4] <= entry[4] and it[5] <= entry[5]
                                and it[6] <= entry[6]))):
                items[0] = entry
                b0s[0] = b0
                self.maxlen = b1 - b0
                self.nmax = 1
                return
            lo = 0 if it[0] >= b0 else 1
        elif n == 0:
            lo = 0
        else:
            lo = bisect_left(b0s, b0)
            hi = lo + self.SCAN
            if hi > n:
                hi = n
            dead = None
            j = lo
            while j < hi:
                it = items[j]
                if it[0] >= b1:
                    break
                if it[1] <= b1 and it[2] >= p0 and it[3] <= p1 and (
                        not dom or (it[4] <= entry[4] and it[5] <= entry[5]
                                    and it[6] <= entry[6])):
                    if dead is None:
                        dead = [j]
                    else:
                        dead.append(j)
                j += 1
            if dead is not None:
                if len(dead) == 1:
                    j = dead[0]
                    old = items[j]
                    if j == lo:          # replace in place (keeps the order: same slot)
                        items[j] = entry
                        b0s[j] = b0
                        ln = b1 - b0
                        oln = old[1] - old[0]
                        if ln != oln:
                            if oln == self.maxlen:
                                self.nmax -= 1
                            if ln > self.maxlen:
                                self.maxlen, self.nmax = ln, 1
                            elif ln == self.maxlen:
                                self.nmax += 1
                            if self.nmax <= 0:
                                self._recount()
                        return
                maxlen = self.maxlen
                for j in reversed(dead):
                    it = items[j]
                    if it[1] - it[0] == maxlen:
                        self.nmax -= 1
                    del items[j]
                    del b0s[j]
                if self.nmax <= 0:
                    self._recount()
        b0s.insert(lo, b0)
        items.insert(lo, entry)
        ln = b1 - b0
        if ln > self.maxlen:
            self.maxlen, self.nmax = ln, 1
        elif ln == self.maxlen:
            self.nmax += 1


class _DmaPool:
    """A bandwidth resource served in readiness order: disjoint booked intervals, sorted.

    Used for the 16 DMA queues (a transfer of ``rows`` descriptors over k queues books its share
    ``rows*row_ns/16`` and completes when its busiest queue is done) and for the DGE issue
    sequencer. Requests arrive in trace order but are served in the order they become ready:
    the hardware keeps several rings per DMA engine, and the compiler orders DMA triggers by
    readiness, so a store waiting on a compute result does not hold up the next tile's prefetch
    that comes after it in program order (which is what makes multi-buffering pay off).

    A request ready at ``t0`` takes the earliest gap that fits. When the resource is idle at
    ``t0`` but the gap before the next booking is too short, that booking's request became
    ready later, so this one goes first. It starts at ``t0``, and the time it takes from the
    later booking is booked after it. Capacity is conserved, and that later request (already
    scheduled) is optimistic by at most this one's duration.
    """

    __slots__ = ("starts", "ends")
    # Beyond this many intervals the two oldest are merged (their gap is given up): booking stays
    # O(1) amortized, and a transfer that becomes ready that far in the past is implausible.
    MAX_INTERVALS = 512

    def __init__(self):
        self.starts = []
        self.ends = []

    def book(self, t0: float, dur: float) -> float:
        """Book ``dur`` ns for a request ready at ``t0``; return when it starts."""
        if dur <= 0.0:
            return t0
        starts = self.starts
        j = bisect_right(self.ends, t0)          # first interval ending after t0
        if j < len(starts) and t0 < starts[j] < t0 + dur:
            gap = starts[j] - t0
            self._insert(t0, gap)
            self._insert(self._earliest(t0, dur - gap), dur - gap)
            return t0
        c = self._earliest(t0, dur)
        self._insert(c, dur)
        return c

    def _earliest(self, t0: float, dur: float) -> float:
        starts = self.starts
        ends = self.ends
        n = len(starts)
        j = bisect_right(ends, t0)
        c = t0
        while j < n and starts[j] < c + dur:
            if ends[j] > c:
                c = ends[j]
            j += 1
        return c

    def _insert(self, c: float, dur: float) -> None:
        """Mark [c, c+dur) busy (it is free)."""
        starts = self.starts
        ends = self.ends
        n = len(starts)
        j = bisect_right(ends, c)
        e = c + dur
        eps = 1e-6
        if j > 0 and ends[j - 1] >= c - eps:          # touches the previous interval
            if j < n and starts[j] <= e + eps:          # and the next one
                ends[j - 1] = ends[j]
                del starts[j]
                del ends[j]
            else:
                ends[j - 1] = e
        elif j < n and starts[j] <= e + eps:
            starts[j] = c
        else:
            starts.insert(j, c)
            ends.insert(j, e)
            if n + 1 > self.MAX_INTERVALS:
                ends[0] = ends[1]
                del starts[1]
                del ends[1]


@dataclass
class Schedule:
    """When every instruction of a trace runs, and what that adds up to.

    Times are ns from the start of the kernel body; ``total_ns`` adds the launch overhead.
    A DMA's ``start_ns`` is its issue (on the DGE path: when the sequencer starts executing it,
    for ``dma_plans[i][2].issue_ns``), ``end_ns`` its completion; its per-queue data phases are
    in :meth:`dma_segments`.
    """

    arch: Arch
    params: CostParams
    start_ns: np.ndarray
    end_ns: np.ndarray
    engine: list                      # engine (or "dma") per instruction
    dma_plans: dict                   # DMA index -> (data start ns, queues or None=all, DmaPlan)
    makespan_ns: float
    launch_ns: float
    engine_busy_ns: dict              # compute engines: sum of IIs; "dma": queue time / 16;
                                      # "dge" (DGE path): DMA issue time
    dma_count: int
    dma_bytes: int
    matmul_count: int
    model_flops: float                # 2*K*M*N over matmuls, transposes excluded
    adjusted_flops: float             # x4 fp32, x0.5 fp8 on trn2 (adjusted_hardware_flops)
    fp32_model_flops: float = 0.0     # the part of model_flops done by fp32 matmuls
    kernel: str = ""
    trace: Trace | None = field(default=None, repr=False)

    # --- DMA queues --------------------------------------------------------------------------
    def dma_segments(self, i: int) -> tuple:
        """Data phases of DMA instruction ``i``: ((queue, start_ns, end_ns), ...), one per queue
        it uses (all 16 when it has >= 16 descriptors)."""
        rec = self.dma_plans.get(i)
        if rec is None:
            return ()
        c, qs, plan = rec
        if qs is None:
            qs = range(self.params.dma_queues)
        return tuple((q, c, c + plan.rows_on(j) * plan.row_ns) for j, q in enumerate(qs))

    @property
    def dma_queue_busy_ns(self) -> list:
        """Per queue: the sum of its data phases."""
        busy = [0.0] * self.params.dma_queues
        for i in self.dma_plans:
            for q, s, e in self.dma_segments(i):
                busy[q] += e - s
        return busy

    # --- derived figures ---------------------------------------------------------------------
    @property
    def total_ns(self) -> float:
        return self.makespan_ns + self.launch_ns

    @property
    def total_us(self) -> float:
        return self.total_ns / 1e3

    @property
    def engine_busy_pct(self) -> dict:
        """Busy time as % of the kernel body (``makespan_ns``).

        DMA busy is the queues' mean utilization (sum of data phases / 16): 100% means all 16
        queues moved data the whole time.
        """
        span = self.makespan_ns or 1.0
        return {e: 100.0 * b / span for e, b in self.engine_busy_ns.items()}

    @property
    def peak_ops_per_ns(self) -> float:
        """neuron-profile tensor_engine_max_ops_per_sec = 2 x PEs x TensorE clock (ref §3.6)."""
        return 2.0 * self.arch.pmax * self.arch.gemm_stationary_fmax * self.arch.tensor_ghz

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization as neuron-profile defines mfu_estimated_percent (ref §3.6).

        ``2*MAC_count / (tensor_engine_max_ops_per_sec * total_time)`` with transposes excluded and
        no dtype factor: the profile schema defines it from MAC counts, and the fp32 x4 appears only
        in the separate ``adjusted_hardware_flops`` field, so an fp32 kernel tops out at
        1 / fp32_matmul_factor here (25% on trn1, 21.8% on trn2; nkisim.cost).
        See :attr:`mfu_adjusted` for the x4 view. A fraction in [0, 1].
        """
        t = self.total_ns
        return self.model_flops / (self.peak_ops_per_ns * t) if t > 0 else 0.0

    @property
    def mfu_adjusted(self) -> float:
        """As :attr:`mfu` with the adjusted_hardware_flops weights (ref §3.6: fp32 x4, fp8 x0.5 on
        trn2): the fraction of the PE array's time the model's matmuls need at their dtype's
        rate."""
        t = self.total_ns
        return self.adjusted_flops / (self.peak_ops_per_ns * t) if t > 0 else 0.0

    @property
    def mfu_profile_gui(self) -> float:
        """MFU as the CS149-era neuron-profile GUI (2.25, "Estimated MFU", "Cumulative
        Utilization") showed it: :attr:`mfu` with every fp32 matmul counted twice. A fraction.

        Why twice: "each FP32 matmul lowers to two FP32_LO_HI instructions" and, in the current
        schema, "each FP32_LO_HI matmul records half the logical FLOPs"
        (profile-schema-reference.rst, raw_flops); the two published fp32 readings of that era
        fit each instruction counted at the full FLOPs. Seed 004 (trn1): fp16 61.65%, fp32
        41.88% are profile times of 1028 and (x2) 3026 us, ratio 2.94, against its measured
        1203 / 3530 us, ratio 2.93 (x1 would give 1.47, x4 5.9). Seed 000 (trn2): fp16 90% and
        fp32 41% are 821 and (x2) 3606 us, ratio 4.39 against 3832 / 824 = 4.65 (x1: 2.2, x4:
        8.8). Equal to :attr:`mfu` for kernels without fp32 matmuls (seed 000's fp16 90% is
        the MAC-based formula at 824 us).
        """
        t = self.total_ns
        f = self.model_flops + self.fp32_model_flops
        return f / (self.peak_ops_per_ns * t) if t > 0 else 0.0

    @property
    def bottleneck(self) -> str:
        """The busiest engine ("tensor", "vector", "scalar", "gpsimd" or "dma"), or "latency"
        when nothing is more than 50% busy (dependency chains and fixed latencies dominate).
        "dma" covers both the queues' bandwidth and, on the DGE path, DMA issue ("dge" in
        ``engine_busy_ns``)."""
        pct = self.engine_busy_pct
        if not pct:
            return "latency"
        eng = max(pct, key=pct.get)
        if pct[eng] <= 50.0:
            return "latency"
        return DMA if eng == DGE else eng

    def hotspots(self, n: int = 10) -> list:
        """Source lines with the most engine time: [(file:line, op, engine, count, busy_ns)].
        A DMA's busy time is its queue time / 16, as in ``engine_busy_ns["dma"]``."""
        if self.trace is None:
            return []
        nq = self.params.dma_queues
        acc = {}
        for i, ins in enumerate(self.trace.instrs):
            key = (f"{ins.file}:{ins.line}", ins.op, self.engine[i])
            if ins.engine == DMA:
                busy = sum(e - s for _, s, e in self.dma_segments(i)) / nq
            else:
                busy = float(self.end_ns[i] - self.start_ns[i])
            c = acc.get(key)
            acc[key] = (1, busy) if c is None else (c[0] + 1, c[1] + busy)
        rows = sorted(acc.items(), key=lambda kv: -kv[1][1])[:n]
        return [(k[0], k[1], k[2], v[0], v[1]) for k, v in rows]

    def summary(self) -> dict:
        """The headline figures, JSON-ready (times in us, MFU as a fraction)."""
        return {
            "kernel": self.kernel,
            "target": self.arch.name,
            "instructions": len(self.engine),
            "total_us": self.total_ns / 1e3,
            "body_us": self.makespan_ns / 1e3,
            "launch_us": self.launch_ns / 1e3,
            "engine_busy_us": {e: b / 1e3 for e, b in self.engine_busy_ns.items()},
            "engine_busy_pct": self.engine_busy_pct,
            "dma_count": self.dma_count,
            "dma_bytes": self.dma_bytes,
            "dma_path": "dge" if self.params.dge else "descriptors",
            "matmul_count": self.matmul_count,
            "model_flops": self.model_flops,
            "mfu": self.mfu,
            "mfu_adjusted": self.mfu_adjusted,
            "mfu_profile_gui": self.mfu_profile_gui,
            "bottleneck": self.bottleneck,
        }

    def format_summary(self) -> str:
        """:meth:`summary` as a few lines of text."""
        s = self.summary()
        lines = [
            f"kernel {s['kernel'] or '?'} on {s['target']}: {s['instructions']} instructions",
            f"  estimated latency {s['total_us']:.2f} us "
            f"(body {s['body_us']:.2f} us + launch {s['launch_us']:.2f} us)",
            f"  bottleneck: {s['bottleneck']}",
            "  engine busy:  " + "  ".join(
                f"{e} {s['engine_busy_us'][e]:.2f} us ({s['engine_busy_pct'][e]:.0f}%)"
                for e in s["engine_busy_us"]),
            f"  DMA: {s['dma_count']} transfers, {s['dma_bytes']} bytes ({s['dma_path']} path)",
            f"  matmuls: {s['matmul_count']}, {s['model_flops'] / 1e9:.3f} GFLOP, "
            f"MFU {100 * s['mfu']:.2f}% (fp32-adjusted {100 * s['mfu_adjusted']:.2f}%)",
        ]
        if s["mfu_profile_gui"] > s["mfu"] * 1.001:
            lines[-1] += f", as the CS149 profiler GUI shows it {100 * s['mfu_profile_gui']:.2f}%"
        return "\n".join(lines)


# PE tiling (ref §1.10 nc_matmul; aws-neuron-sdk nki.isa.nc_matmul docstring: "the Tensor Engine
# allows PE tiling, i.e., multiple small nc_matmul instructions to execute in parallel on the
# PE array, to improve compute throughput"; tile_position and tile_size are multiples of 32).
# The 128x128 array is modelled as 4x4 cells of 32x32 PEs: a matmul holds the cells of its
# tile (all 16 without tile_position) for its MultiplyMoving time, and matmuls whose cells are
# disjoint overlap. Instructions still issue in order (a later one never starts before an
# earlier one). No document gives the timing of concurrent tiles beyond "in parallel"; each
# keeps the cost of its own shape.
_PE_CELL = 32
_PE_CELLS = 16
_PE_ALL = tuple(range(_PE_CELLS))


def _pe_cells(tile) -> tuple:
    """The 32x32 cells (row-major indices of the 4x4 grid) a (row, col, rows, cols) PE tile
    covers; the whole array for None."""
    if not tile:
        return _PE_ALL
    r, c, rows, cols = (int(v) // _PE_CELL for v in tile)
    return tuple(i * 4 + j for i in range(r, min(4, r + rows)) for j in range(c, min(4, c + cols)))


def _pe_book(cells, dep, dur, ls, reorder, pools, free, issue):
    """Start and duration of a TensorE instruction on ``cells``: the earliest time at or after
    ``dep`` (and, in trace order, the previous TensorE start) when every cell is free for
    ``dur``; LoadStationary (``ls``) is hidden only behind a matmul that ends just then on the
    same cells. Books the cells."""
    if reorder:
        s = _cells_earliest(pools, cells, dep, dur)
        if not any(_busy_before(pools[c], s) for c in cells):
            dur += ls
            s = _cells_earliest(pools, cells, s, dur)
        for c in cells:
            pools[c]._insert(s, dur)
    else:
        ef = max(free[c] for c in cells)
        if issue > ef:
            ef = issue
        if dep > ef or not any(free[c] >= ef - 1e-6 and free[c] > 0.0 for c in cells):
            dur += ls
        s = dep if dep > ef else ef
        for c in cells:
            free[c] = s + dur
    return s, dur


def _cells_earliest(pools, cells, s, dur):
    """The earliest time at or after ``s`` when every one of ``cells`` is free for ``dur``."""
    for _ in range(64):
        s2 = max(pools[c]._earliest(s, dur) for c in cells)
        if s2 == s:
            break
        s = s2
    return s


def _busy_before(pool: _DmaPool, t: float) -> bool:
    """Is ``pool`` busy right up to ``t`` (an instruction ending at ``t``)?"""
    j = bisect_left(pool.ends, t - 1e-6)
    return j < len(pool.ends) and pool.starts[j] < t


# Engines that can run a copy the kernel leaves to the compiler (cost.py, "engine choice").
AUTO_ENGINES = (VECTOR, SCALAR)


class _Renamer:
    """Which physical copy of a tile each access touches (``nkisim.cost``, "buffers").

    Two mechanisms, each a property of the compiler that built the kernel (``CostParams``):

    * ``rename_buffers`` > 1 (the trn2 compiler, ``skip_middle_end_transformations`` kernels):
      a write that overwrites everything the tile has held, or the first matmul of a new PSUM
      accumulation group (a matmul accumulating into a tile already read since its last write:
      the kernel re-zeroed it), ends the old value's live range, so the allocator may put the
      new value in another buffer; the copies rotate over ``rename_buffers`` buffers. Tiles
      the kernel pins with direct allocation are never renamed.
    * trn1's declared tiles (``nl.ndarray`` in an ``affine_range`` body, tagged ``"decl"`` by
      ``nkisim.tensor._site_key`` with the automatic buffer index) that a DMA fills keep a
      single buffer: every iteration maps to the untagged site key.
    """

    __slots__ = ("nbuf", "single", "state", "active")

    def __init__(self, instrs, params):
        self.nbuf = int(params.rename_buffers)
        single = set()
        tagged = False
        for ins in instrs:
            for w in ins.writes:
                k = w.key
                if isinstance(k, tuple) and k and k[-1] == "decl":
                    tagged = True
                    if ins.engine == DMA:
                        single.add(k[:4])
        self.single = single if tagged else None
        self.state = {}
        self.active = self.nbuf > 1 or tagged

    def regions(self, ins):
        """(reads, writes) of ``ins`` with physical keys."""
        if not self.active:
            return ins.reads, ins.writes
        reads = tuple(self._map(r, False, ins) for r in ins.reads)
        writes = tuple(self._map(w, True, ins) for w in ins.writes)
        return reads, writes

    def _map(self, r, write, ins):
        k = r.key
        if r.buffer == "hbm":
            return r
        tup = isinstance(k, tuple)
        if tup and self.single is not None and k and k[-1] == "decl":
            k = k[:4] if k[:4] in self.single else k[:5]
            if self.nbuf <= 1:
                return Region(r.buffer, k, r.name, r.p0, r.p1, r.b0, r.b1)
        if self.nbuf <= 1 or (tup and len(k) > 1 and k[1] == "direct"):
            return r
        st = self.state.get(k)
        if st is None:
            st = self.state[k] = [0, r.p0, r.p1, r.b0, r.b1, False]
        elif write:
            covers = r.p0 <= st[1] and r.p1 >= st[2] and r.b0 <= st[3] and r.b1 >= st[4]
            if covers and (st[5] or not ins.detail.get("accumulate")):
                st[0] += 1
                st[1], st[2], st[3], st[4] = r.p0, r.p1, r.b0, r.b1
                st[5] = False
            else:
                st[1], st[2] = min(st[1], r.p0), max(st[2], r.p1)
                st[3], st[4] = min(st[3], r.b0), max(st[4], r.b1)
        else:
            st[5] = True
            st[1], st[2] = min(st[1], r.p0), max(st[2], r.p1)
            st[3], st[4] = min(st[3], r.b0), max(st[4], r.b1)
        return Region(r.buffer, (k, st[0] % self.nbuf), r.name, r.p0, r.p1, r.b0, r.b1)


class _KeyState:
    """Accesses of one buffer key: the live writes, and the reads since them.

    Reads go to ``rlog``, a dict region -> (t_dma, t_tensor, t_other) that merges reads of the
    same region (elementwise max: exact for WAR), so re-reading a tile costs O(1); past ``LOG``
    distinct regions they are folded into a sorted :class:`_Accesses`.
    """

    __slots__ = ("w", "rlog", "racc")
    LOG = 48

    def __init__(self):
        self.w = _Accesses()
        self.rlog = {}
        self.racc = None

    def compact_reads(self):
        racc = self.racc
        if racc is None:
            racc = self.racc = _Accesses()
        for k, v in self.rlog.items():
            racc.put(k + v, True)
        self.rlog = {}

    def prune_reads(self, b0, b1, p0, p1):
        log = self.rlog
        if log:
            dead = [k for k in log if k[0] >= b0 and k[1] <= b1 and k[2] >= p0 and k[3] <= p1]
            if len(dead) == len(log):
                self.rlog = {}
            else:
                for k in dead:
                    del log[k]
        racc = self.racc
        if racc is not None and racc.items:
            racc.prune(b0, b1, p0, p1)


def schedule(trace: Trace, arch: Arch | str | None = None,
             params: CostParams | None = None) -> Schedule:
    """Schedule ``trace`` on ``arch`` (default: the trace's target). See the module docstring."""
    if params is None:
        params = params_for(arch if arch is not None else (trace.target or None))
    a = params.arch
    instrs = trace.instrs
    n = len(instrs)
    start = [0.0] * n
    end = [0.0] * n
    engines = [""] * n
    free = {}                                  # compute engine -> time its queue frees
    busy = {TENSOR: 0.0, VECTOR: 0.0, SCALAR: 0.0, GPSIMD: 0.0}
    nq = params.dma_queues
    pool = _DmaPool()
    dma_busy = 0.0
    rr = 0                                     # round-robin pointer for transfers using < 16 queues
    qlast = [0.0] * nq                         # when each queue's last data phase ends
    qlast_max = 0.0
    full_end = 0.0                             # end of the last transfer using every queue
    dma_plans = {}
    dma_count = 0
    dma_bytes = 0
    mm_count = 0
    flops = 0.0
    adj_flops = 0.0
    f32_flops = 0.0
    lat = {e: params.dep_latency_ns(e) for e in COMPUTE_ENGINES}
    tensor_ghz = a.tensor_ghz
    fp32_factor = params.fp32_matmul_factor
    tr_factor = params.fp32_transpose_factor
    fp8_half = a.nc_version >= 3               # fp8 counts x0.5 in adjusted FLOPs on trn2
    states = {}
    states_get = states.get
    fixed = params.dma_fixed_ns
    dge = params.dge
    dge_pool = _DmaPool()
    dge_busy = 0.0
    log_max = _KeyState.LOG
    mm_init = params.mm_init_cycles
    ls_div = params.ls_divisor
    renamer = _Renamer(instrs, params)
    # Compute engines run their queues in the compiler's order. Without
    # skip_middle_end_transformations the compiler software-pipelines affine_range loops and
    # list-schedules their instructions, so an engine fills an idle gap with any later ready
    # instruction (a pool served in readiness order, like the DMA queues); with it, trace order.
    reorder = not (trace.compiler or {}).get("skip_middle_end_transformations")
    epools = {e: _DmaPool() for e in COMPUTE_ENGINES}
    rename = renamer.regions
    # PE tiling: matmuls on disjoint tiles of the PE array run at the same time (_pe_cells).
    # Only a trace with a tiled matmul pays for the per-cell bookkeeping.
    pe_tiled = any(ins.engine == TENSOR and ins.detail.get("pe_tile") for ins in instrs)
    if pe_tiled:
        cell_pools = [_DmaPool() for _ in range(_PE_CELLS)]
        cell_free = [0.0] * _PE_CELLS
        pe_issue = 0.0                        # the last TensorE start (in-order issue)

    for i in range(n):
        ins = instrs[i]
        eng = ins.engine
        reads, writes = rename(ins)
        is_dma = eng == DMA
        col = _T_DMA if is_dma else (_T_TENSOR if eng == TENSOR else _T_OTHER)
        vcol = col - 4
        dep = 0.0
        for r in reads:                                        # RAW
            st = states_get(r.key)
            if st is not None:
                wa = st.w                                      # RAW
                if wa.items:
                    t = wa.latest(r.b0, r.b1, r.p0, r.p1, col)
                    if t > dep:
                        dep = t
        for w in writes:
            st = states_get(w.key)
            if st is None:
                continue
            b0 = w.b0
            b1 = w.b1
            p0 = w.p0
            p1 = w.p1
            for k, v in st.rlog.items():                       # WAR
                if k[0] < b1 and k[1] > b0 and k[2] < p1 and p0 < k[3]:
                    t = v[vcol]
                    if t > dep:
                        dep = t
            racc = st.racc
            if racc is not None and racc.items:
                t = racc.latest(b0, b1, p0, p1, col)
                if t > dep:
                    dep = t
            if is_dma and w.buffer == "hbm":
                # WAW between DMA writes to HBM is not an edge: only DMAs write HBM, and an HBM
                # region is the flat bounding byte range of a possibly strided access, so tiles
                # stored to disjoint rows of one output (e.g. out[:, j*F:(j+1)*F]) would appear to
                # overlap and serialize every store. Writing the same HBM bytes twice is a race the
                # checkers report; here it only loses the ordering of the two completions.
                continue
            wa = st.w                                          # WAW
            if wa.items:
                t = wa.latest(b0, b1, p0, p1, col)
                if t > dep:
                    dep = t

        if is_dma:
            plan = dma_plan(ins, params)
            k = plan.queues
            row_ns = plan.row_ns
            rows = plan.rows
            work = rows * row_ns
            base_rows, extra_rows = divmod(rows, k)
            if dge:
                # The DMA-issuing sequencer executes the DGE instruction (in readiness order);
                # the queues start on the descriptors as they are generated, so the data phase
                # overlaps the issue, and the DMA completes when both are done.
                issue = plan.issue_ns
                dep = dge_pool.book(dep, issue)
                dge_busy += issue
                c = pool.book(dep, work / nq)
                e = c + -(-rows // k) * row_ns                # busiest queue's data phase
                if e < dep + issue:
                    e = dep + issue
            else:
                c = pool.book(dep + fixed, work / nq)
                e = c + -(-rows // k) * row_ns
            if k == nq:
                qs = None                                      # all queues
                if e > full_end:
                    full_end = e
                if e > qlast_max:
                    qlast_max = e
            else:
                # k of the queues idle at c, round-robin from the last choice (the pool already
                # guarantees the bandwidth; this only names the queues, for the timeline)
                qs = []
                if qlast_max > c:
                    if full_end <= c + 1e-6:
                        for j in range(nq):
                            q = (rr + j) % nq
                            if qlast[q] <= c + 1e-6:
                                qs.append(q)
                                if len(qs) == k:
                                    break
                    if len(qs) < k:
                        qs += sorted(set(range(nq)) - set(qs),
                                     key=lambda q: max(qlast[q], full_end))[:k - len(qs)]
                else:
                    qs = [(rr + j) % nq for j in range(k)]
                rr = (qs[-1] + 1) % nq
                for j, q in enumerate(qs):
                    qe = c + (base_rows + (1 if j < extra_rows else 0)) * row_ns
                    qlast[q] = qe
                    if qe > qlast_max:
                        qlast_max = qe
                qs = tuple(qs)
            dma_plans[i] = (c, qs, plan)
            dma_busy += work
            s = dep
            dma_count += 1
            dma_bytes += plan.nbytes
            tt = eo = e
        else:
            if eng == TENSOR:
                d = ins.detail
                tr = d.get("transpose")
                fp32 = d.get("fp32")
                # max(min(64, N_stationary), N_moving), LoadStationary N_stationary / 4; a PE
                # transpose is recorded as the matmul it is (M = F, N = P), x4 / x2 for fp32
                m = d.get("M")
                if m is None:
                    m = ins.partitions
                nm = d.get("N")
                if nm is None:
                    nm = ins.free
                cyc = m if m < mm_init else mm_init
                if nm > cyc:
                    cyc = nm
                ls = m / ls_div
                if fp32:
                    if tr:
                        cyc *= tr_factor
                        ls *= tr_factor
                    else:
                        cyc *= fp32_factor
                        ls *= FP32_DOC_FACTOR
                dur = cyc / tensor_ghz
                if pe_tiled:
                    cells = _pe_cells(d.get("pe_tile"))
                    s, dur = _pe_book(cells, dep, dur, ls / tensor_ghz, reorder, cell_pools,
                                      cell_free, pe_issue)
                    pe_issue = s
                    # the array's busy time counts the share of it the tile holds
                    busy_share = dur * len(cells) / _PE_CELLS
                elif reorder:
                    pe = epools[TENSOR]
                    s = pe._earliest(dep, dur)
                    if not _busy_before(pe, s):    # idle before it: LoadStationary not hidden
                        dur += ls / tensor_ghz
                        s = pe._earliest(dep, dur)
                    pe._insert(s, dur)
                else:
                    ef = free.get(eng)
                    if ef is None or dep > ef:
                        # LoadStationary is hidden behind the previous MM only when back-to-back
                        dur += ls / tensor_ghz
                        s = dep
                    else:
                        s = ef
                if not tr:
                    f = d.get("flops")
                    if f is None:
                        f = 2.0 * d.get("K", ins.partitions) * d.get("M", 0) * d.get("N", ins.free)
                    if f:           # (a partition broadcast is a matmul with ones: no model FLOPs)
                        mm_count += 1
                        flops += f
                        if fp32:
                            f32_flops += f
                        adj_flops += f * (FP32_DOC_FACTOR if fp32 else
                                          adjusted_flops_factor(ins, params) if fp8_half else 1.0)
                e = s + dur
                tt = e
                eo = e + lat[TENSOR]
            else:
                dur = compute_ns(ins, params, eng)
                if reorder:
                    s = epools[eng]._earliest(dep, dur) if eng in epools else dep
                else:
                    ef = free.get(eng, 0.0)
                    s = dep if dep > ef else ef
                e = s + dur
                if eng == VECTOR and ins.detail.get("auto_engine"):
                    # The compiler picks the engine of a copy the kernel left to it
                    # (``engine=unknown``, ``nl.copy``, ``t[...] = u``): the one that finishes
                    # it first (module docstring of nkisim.cost, "engine choice").
                    for alt in AUTO_ENGINES:
                        if alt == eng:
                            continue
                        d2 = compute_ns(ins, params, alt)
                        if reorder:
                            s2 = epools[alt]._earliest(dep, d2)
                        else:
                            f2 = free.get(alt, 0.0)
                            s2 = dep if dep > f2 else f2
                        if s2 + d2 < e:
                            eng, dur, s, e = alt, d2, s2, s2 + d2
                if reorder and eng in epools:
                    epools[eng]._insert(s, dur)
                tt = eo = e + lat.get(eng, 0.0)
            free[eng] = e
            if pe_tiled and eng == TENSOR:
                busy[eng] += busy_share
            elif eng in busy:
                busy[eng] += dur
            else:
                busy[eng] = dur
        start[i] = s
        end[i] = e
        engines[i] = eng
        for r in reads:
            st = states_get(r.key)
            if st is None:
                st = states[r.key] = _KeyState()
            log = st.rlog
            k = (r.b0, r.b1, r.p0, r.p1)
            v = log.get(k)
            if v is None:
                log[k] = (e, tt, eo)
                if len(log) > log_max:
                    st.compact_reads()
            elif e >= v[0] and tt >= v[1] and eo >= v[2]:
                log[k] = (e, tt, eo)
            else:
                log[k] = (max(e, v[0]), max(tt, v[1]), max(eo, v[2]))
        for w in writes:
            st = states_get(w.key)
            if st is None:
                st = states[w.key] = _KeyState()
            if is_dma and w.buffer == "hbm":
                # no WAW edge was taken (above), so this write stands in only for the older
                # writes it dominates, and the reads it covers stay
                st.w.put((w.b0, w.b1, w.p0, w.p1, e, tt, eo), True)
                continue
            if st.rlog or st.racc is not None:
                st.prune_reads(w.b0, w.b1, w.p0, w.p1)
            st.w.put((w.b0, w.b1, w.p0, w.p1, e, tt, eo))

    busy[DMA] = dma_busy / nq
    if dge:
        busy[DGE] = dge_busy
    makespan = max(end) if n else 0.0
    return Schedule(
        arch=a, params=params, start_ns=np.array(start), end_ns=np.array(end), engine=engines,
        dma_plans=dma_plans, makespan_ns=makespan, launch_ns=params.launch_ns,
        engine_busy_ns=busy, dma_count=dma_count, dma_bytes=dma_bytes,
        matmul_count=mm_count, model_flops=flops, adjusted_flops=adj_flops,
        fp32_model_flops=f32_flops, kernel=trace.kernel,
        trace=trace,
    )
