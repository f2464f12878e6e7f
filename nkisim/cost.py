"""Per-instruction costs on each target: the latency model's constants and formulas.

Every constant lives in :class:`CostParams` (one instance per target in :data:`COST_PARAMS`;
:func:`params_for` also gives the trn2 ``--disable-dge`` variant) with a comment citing
docs/nki-reference.md ("ref §x.y") or docs/cs149-assignment.md ("cs149 §x").

The model (``nkisim.schedule`` assembles the timeline from these pieces):

* Compute engines (TensorE, VectorE, ScalarE, GpSimdE) are in-order queues. An instruction
  occupies its engine for its initiation interval (II): the reference's per-ISA formulas, which
  are back-to-back averages (ref §1.10, §3.3, §3.4). A compute consumer sees a compute producer's
  result ``dep_latency_cycles`` (producer-engine cycles) after the producer's II ends: the
  static overhead and semaphore hand-off that make dependent instructions slower than independent
  back-to-back ones (ref §3.4). TensorE -> TensorE edges (PSUM accumulation groups) pay nothing.
* A DMA is ``rows`` descriptors (contiguous runs) of ``row_bytes``, spread over the 16 queues (a
  P=128 tile: 8 partitions per queue, ref §3.5). A queue spends ``(bytes + d) / bandwidth`` per
  contiguous HBM run it moves: its bytes plus one descriptor overhead ``d`` (~162 byte-times,
  :func:`descriptor_overhead_bytes`). Usually each descriptor is its own HBM run; when the HBM
  side of the transfer is one contiguous range, each queue's share is one run (:func:`dma_plan`).
  How the DMA gets started depends on the DMA path the kernel was compiled for:
  - hardware DGE (``dge=True``: trn2's default, e.g. ``nki.benchmark`` in CS149 Part 1). The
    DMA-issuing sequencer executes each DMA instruction for ``dge_issue_ns`` plus
    ``dge_descriptor_ns`` per descriptor (the DGE generates them in hardware), one at a time in
    readiness order. The queues work on the descriptors as they are generated.
  - descriptors (``dge=False``: trn1, and trn2 with ``--disable-dge`` as in CS149 Part 1
    profiling and every Part 2 harness run with ``--profile``). The data phase starts
    ``dma_fixed_ns`` after the DMA is ready; any number of DMAs in flight overlap this latency
    (it is descriptor fetch and semaphore hand-off, not queue occupancy), and they share the 16
    queues' bandwidth in readiness order.
  Either way the completion is visible to every engine at once.

What the compiler chooses (``nkisim.schedule``):

* Buffers. A tile is a name, not an address: unless the kernel pins it (direct allocation),
  the allocator places each *value* of a tile. The trn2 compiler (``rename_buffers``) gives a
  new value a fresh buffer when a write replaces everything the tile held (``t[...] = load``
  of the whole tile, an instruction's result) or a matmul starts a new PSUM accumulation group
  (accumulating into a tile already read since its last write, i.e. the kernel re-zeroed it),
  rotating over 8 buffers: PSUM's 8 banks (ref §3.1) are the hardware bound for accumulation
  groups, and the same count is used for SBUF (no documented figure; SBUF has room for far
  more). Evidence: seed 000's trn2 conv2d reloads one declared (128, 224) tile 2,664 times and
  is profiled at 90% MFU, impossible if each load waited for the matmuls reading the previous
  contents (one buffer: 4,878 us modeled against 824 measured; 4 buffers: 1,285; 8 or more:
  806). The trn1 compiler (no ``skip_middle_end_transformations``) gives tiles defined in an
  ``affine_range`` body ``AUTO_MULTI_BUFFER`` = 4 buffers (trn1 handout); a tile the kernel
  declares there and a DMA fills (``t[...] = nl.load``) keeps one (the trn1 tiled rows:
  1.07 / 0.96 us per iteration whether 1 or 128 descriptors, i.e. serialized iterations),
  while one that compute engines fill gets the 4 (the trn1 solution's X_tile: its author
  measured affine_range pipelining it, 1332 -> 1054 us). Open: the same trn1 author's
  ``vector_add_stream`` with ``a_tile[...] = nl.load`` measured 53 us, which this rule
  models as serialized (~118 us); our fixture uses the older ``a_tile = nl.load`` form.
* Engine order. With ``skip_middle_end_transformations`` (every trn2 course kernel) the
  engines run their instructions in trace order. Without it the compiler software-pipelines
  ``affine_range`` loops and list-schedules them, so an engine runs any later ready instruction
  in an idle gap (the trn1 solution's per-matmul weight transposes run ahead of the matmuls).
* Engine choice. A copy the kernel leaves to the compiler (``nl.copy``, ``t[...] = u``,
  ``tensor_copy`` without ``engine=``) runs on VectorE or ScalarE, whichever finishes it first
  ("the best engine will be selected", ``nki.isa`` docs; the trn1 solution's profile shows its
  SBUF copies on ScalarE). Activations are ScalarE's (ref §1.8 lowering table).
* ``nl.matmul(x, y)`` without ``transpose_x`` lowers to a PE transpose of ``x``, a copy back to
  SBUF and ``nc_matmul`` (ref §1.8: "matmul(x, y) lowers to nc_matmul(transpose(x), y)"); the
  transposes are independent of the moving data, so with gap filling they overlap.

Compute details: NC-v2 adds the trn1 arch guide's static tensor-access overhead (~60 cycles,
ref §3.4) to every VectorE/ScalarE/GpSimdE instruction past MIN_II (``access_overhead_cycles``;
no NC-v3 figure, so 0 on trn2). fp32 matmuls cost 4x bf16 on both targets (ref §1.10, §3.3:
92 / 23 TFLOPS trn1, 79 / 20 trn2); the trn1 solution's fp32 rows agree (-0% / -2%). The trn2
solution's fp32 rows are 21% above the model (3832 measured, 3042 modeled with the PE 98%
busy); nothing documented explains it, and no factor is fitted to those two rows. The 4 passes
are documented (nc_matmul's ``is_stationary_onezero`` / ``is_moving_onezero``: "2x better
performance" for a float32 operand of ones and zeros, i.e. each fp32 operand costs 2 passes).
Checked against that kernel and excluded (its 7,992 fp32 matmuls of N=222 would need ~1,145 PE
cycles each at 3832 us, against 888 for 4 passes and 243 measured for fp16): its 36 fp32 PE
transposes at 4x instead of 2x (+4 us); doubled DMA bytes (305 MB of input rows: the fp16 run
moves half of them with half-size descriptors at >= 186 GB/s, so fp32 needs <= 1.7 ms of DMA);
fp32 PSUM evacuations (444 copies of 222 elements, ~0.1 ms on VectorE even if serialized);
the NC-v3 fp32 rate (documented 20 vs 79 TFLOPS, 4x). The course's optimized reference kernel
(thresholds 4596 / 1002 us, cs149 §2, are 120% of its latency by the course README) has the
same fp32/fp16 ratio (4.59) on trn2, so the excess looks general to NC-v3 fp32 matmuls rather
than this kernel's; without a documented mechanism it stays unmodeled. MFU is
neuron-profile's ``mfu_estimated_percent`` (model FLOPs / (2 x 128 x 128 x PE clock x
total_time), ref §3.6): seed 000's fp16 90% is that formula at the measured 824 us (89.7%);
its fp32 "41%" matches no documented weighting (x1: 19.3%, adjusted x4: 77%) and is reported,
not modeled.

Which published figure informed which constant (cs149 §5, ref §3.7; ``python
benchmarks/calibrate.py`` prints the comparison, ``--derive`` re-derives the fitted constants).
The trn2 figures are p99 nc_latency of kernels compiled with ``skip_middle_end_transformations``,
so the buffers in the trace are the buffers the hardware used. The trn1 (2024) kernels were
compiled without it: tiles an instruction defines in an ``affine_range`` body get 4 buffers
(``nkisim.runtime.AUTO_MULTI_BUFFER``, from the trn1 handout), tiles the kernel declares and fills
(``t[...] = nl.load(...)``) keep one (``nkisim.tensor._site_key``).

* ``dge_issue_ns``/``dge_descriptor_ns``: "about 600 ns" per DGE DMA instruction on NC-v3
  (ref §3.5) for a P=128 transfer, split into a fixed part and 1 ns per descriptor, derived
  jointly from the trn2 tiled rows ROW_CHUNK=1 and 128 (see the field's comment).
  - Checks: ``vector_add_stream`` FREE_DIM=2, per iteration a chain of three 128-descriptor
    DMAs and one 64-cycle VectorE op: 1.87 us/iter modeled against 1.86 measured.
    ``matrix_transpose`` 1024^2, tile by tile (load, nc_transpose, tensor_copy, store): 93 us
    against 86 measured.
* ``d`` (descriptor overhead): least-squares fit to the chart of ref §3.5 where it is
  bandwidth-bound (4-16 KiB per partition), see :func:`descriptor_overhead_bytes`. The chart's
  flat part (up to 2 KiB per partition a P=128 transfer takes the same time at any size) is a
  transfer's fixed cost, charged as ``dma_fixed_ns`` / the DGE issue instead.
* ``dma_fixed_ns``, NC-v3 (trn2 ``--disable-dge``): 1300 ns, the documented cross-engine figure
  (ref §3.5, HEAD docs; [3P-RE] has the same number as the gen4 compiler's start latency), not
  fitted. Check: the profiled ``vector_add_stream`` n=256000 runs at FREE_DIM=2000 / 1000 model
  to 27.3 / 28.9 us, against profiler total_time 28.5 / 27.
* ``dma_fixed_ns``, NC-v2 (trn1): 930 ns, derived jointly from the two serialized trn1
  ``vector_add_tiled`` rows (the derivation is in the comment at :data:`COST_PARAMS`). The
  1300 ns figure is not for this generation: with it the ROW_CHUNK=1 chain alone would take
  1.37 us per iteration against 1.07 measured.
* ``launch_ns``: the per-launch overhead inside nc_latency / total_time (instruction fetch, queue
  and semaphore setup, end notification): per target, the mean of measured minus modeled body
  over the rows of one or two loop iterations (derivation at :data:`COST_PARAMS`).
* trn1 rows not used for any constant: ``vector_add_stream`` FREE_DIM=2 (100 iterations of three
  1 KiB DMAs, 4 buffers) models to 41 us against 53 (-22%): the largest residual. It is
  sensitive to the buffer count (2 buffers: 67 us, 3: 50 us) for which the handout's figure of 4
  is the only source.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field, replace

from . import dtypes
from .arch import TARGETS, Arch, get_arch
from .trace import DMA, GPSIMD, SCALAR, TENSOR, VECTOR, Instr

# Relative DMA throughput vs bytes per descriptor (bytes per partition of a P=128 transfer),
# digitized from the chart in nki-dma-intro-1.jpg (ref §3.5): fraction of the 32 KiB value.
DMA_EFFICIENCY_TABLE: tuple = (
    (32, 0.014), (64, 0.026), (128, 0.05), (256, 0.10), (512, 0.21), (1024, 0.42),
    (2048, 0.81), (4096, 0.97), (8192, 0.98), (16384, 0.99), (32768, 1.0),
)


@dataclass(frozen=True)
class CostParams:
    """All latency-model constants of one target. Cycles are in the executing engine's clock."""

    arch: Arch
    # --- compute engines (ref §1.10 "Common", §3.4) ---
    # MIN_II: "minimum instruction initiation interval for small input tiles" ~ 64 cycles (§1.10).
    min_ii_cycles: float = 64.0
    # Dependent-instruction latency: back-to-back *dependent* 1-element ScalarE activations issue
    # every 264 cycles on NC-v2 (ref §3.4, perf guide Opt #5) = MIN_II (64) + 200; the 200 is the
    # "static instruction overhead" (~100 cycles, §3.4) plus the semaphore hand-off. No NC-v3
    # figure exists; the same cycle count is assumed.
    dep_latency_cycles: float = 200.0
    # GpSimd start-up GPSIMD_START ~ 150 cycles: iota / affine_select cost 150 + N (§1.10, §3.4).
    gpsimd_start_cycles: float = 150.0
    # tensor_copy_dynamic_src/dst: MIN_II_DYNAMIC ~ 600 cycles (§1.10 "Other ISA ops").
    dynamic_min_ii_cycles: float = 600.0
    # trn2 VectorE perf modes (4x / 2x, §3.4): NC-v3 only.
    vector_perf_mode: bool = False
    # --- TensorE (ref §1.10 nc_matmul, §3.3) ---
    # MM II = max(min(64, N_stationary), N_moving); 64 = MM_INIT_LATENCY (§3.3).
    mm_init_cycles: float = 64.0
    # fp32 operands: 4x the bf16 cost (§1.10 nc_matmul, §3.3).
    fp32_matmul_factor: float = 4.0
    # PE transpose of fp32: 4x on NC-v2 (it is a matmul); NC-v3 transpose mode is "2x faster for
    # fp32" (§3.3), i.e. 2x the bf16 cost.
    fp32_transpose_factor: float = 4.0
    # Fast LoadStationary: "up to 4x faster than a MultiplyMoving with the same free axis size"
    # -> LS_II = N_stationary / 4 (§3.3); hidden behind the previous MM when back-to-back.
    ls_divisor: float = 4.0
    # --- DMA (ref §3.1, §3.5; 16 queues per NC and their bandwidths are in Arch) ---
    # Which DMA path the kernel was compiled for (module docstring): hardware DGE (NC-v3 only,
    # the compiler's default on trn2) or precomputed descriptors (trn1; ``--disable-dge``).
    dge: bool = False
    # Descriptor path: "descriptor setup, synchronization, and semaphore-to-start latency
    # (~1300 ns cross-engine)" (§3.5), a latency that DMAs in flight overlap. That is the HEAD
    # (NC-v3/v4 era) figure; NC-v2's (trn1) is derived from calibration rows (COST_PARAMS).
    dma_fixed_ns: float = 1300.0
    # DGE path: "a hardware-DGE DMA instruction takes about 600 ns to execute on NeuronCore-v3"
    # (§3.5). The DMA-issuing sequencer is busy that long per DMA, so DMA issues serialize.
    # The DGE generates the descriptors in hardware, one per partition row, so the time has a
    # fixed part and a per-descriptor part. Derived jointly from the two trn2 tiled rows
    # (cs149 §5; per iteration: three serialized DMA issues + one 64-cycle VectorE op, 67 ns):
    # ROW_CHUNK=1 (1 descriptor) (37318 - 14) us / 25600 = 1457 ns -> 463 ns per DMA;
    # ROW_CHUNK=128 (128 descriptors) (378 - 14) us / 200 = 1820 ns -> 584 ns per DMA:
    # 0.95 ns per descriptor. Rounded to 1 ns per descriptor, with the fixed part set so that a
    # P=128 DMA costs the documented 600 ns: 472 + 128 x 1. Check, not used: stream
    # FREE_DIM=2 (128 descriptors), 1.74 us/iter measured -> 558 ns per DMA (model 600, +5%).
    dge_issue_ns: float = 472.0
    dge_descriptor_ns: float = 1.0
    dma_efficiency: tuple = DMA_EFFICIENCY_TABLE
    # The per-descriptor overhead is fitted to the chart's points from this size up, where the
    # chart is bandwidth-bound ("≥4 KiB saturates", §3.5); see descriptor_overhead_bytes().
    dma_overhead_fit_min_bytes: float = 4096.0
    # dma_transpose: "HBM->SBUF up to 90%, SBUF->SBUF up to 50% of DMA throughput" (§3.5),
    # "given hardware-friendly tensor access patterns" (trn2 arch guide): the hardware-DGE
    # transpose, which takes 2-byte dtypes only (see dma_plan).
    dma_transpose_hbm_factor: float = 0.9
    dma_transpose_sbuf_factor: float = 0.5
    # The DMA transpose's unit: "these 16x DMA engines should write into a single
    # [nl.par_dim(128), 16] SBUF tile in parallel at a time, where the 16 elements along free
    # dimension must be contiguous" (trn2 arch guide, "DMA Transpose"). A transpose the
    # hardware DGE cannot take (4-byte dtypes; every dtype on NC-v2, which has no DGE) is
    # costed as one descriptor per partition per 16-element group (see dma_plan).
    dma_transpose_block_elems: int = 16
    # "Initiating a tensor access costs a static overhead approximately 60 cycles on
    # NeuronCore-v2" (trn1 arch guide, ref §3.4): added to every VectorE/ScalarE/GpSimdE
    # instruction past MIN_II (which already covers it for small tiles). No NC-v3 figure.
    access_overhead_cycles: float = 0.0
    # --- buffers (nkisim.schedule._Renamer) ---
    # Copies of a tile the compiler's allocator rotates over when a write ends the old value's
    # live range (1 = no renaming). See the module docstring, "buffers".
    rename_buffers: int = 1
    # --- kernel ---
    # Fixed per-launch overhead included in nc_latency / profiler total_time (module docstring).
    launch_ns: float = 0.0
    _row_ns_cache: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def dma_queues(self) -> int:
        return self.arch.dma_queues          # 16 DMA engines per NC (ref §3.1)

    def queue_bytes_per_ns(self, hbm_sides: int) -> float:
        """Per-queue bandwidth of a transfer touching HBM on ``hbm_sides`` (0, 1 or 2) sides.

        With all 16 queues streaming, each gets at most 1/16 of the NC's HBM bandwidth (ref §3.1:
        ~362 GB/s per NC on trn2 = 22.6 B/ns per queue, just below the 23 B/ns engine peak; 410 GB/s
        on trn1 is above 16 x 17); an HBM->HBM copy moves every byte over HBM twice.
        """
        bw = self.arch.dma_bytes_per_ns      # 17 B/ns (trn1) / 23 B/ns (trn2) (ref §3.1, §6.4)
        if hbm_sides:
            bw = min(bw, self.arch.hbm_bytes_per_ns / (self.dma_queues * hbm_sides))
        return bw

    def clock_ghz(self, engine: str) -> float:
        a = self.arch
        return {TENSOR: a.tensor_ghz, VECTOR: a.vector_ghz, SCALAR: a.scalar_ghz,
                GPSIMD: a.gpsimd_ghz}.get(engine, a.base_ghz)

    def dep_latency_ns(self, engine: str) -> float:
        """Latency after a compute producer's II before a dependent compute consumer may start."""
        if engine == DMA:
            return 0.0
        return self.dep_latency_cycles / self.clock_ghz(engine)


# Constants derived jointly from several calibration rows (cs149 §5; ``python
# benchmarks/calibrate.py --derive`` repeats this with the current model and checks these values):
#
# trn1 dma_fixed_ns. The trn1 vector_add_tiled declares its tiles (one buffer each), so iteration
# m+1's loads wait for iteration m's add: an iteration is one DMA latency F plus the rest of the
# chain, ``rest`` (data phases + the add's 64 VectorE cycles, 57 ns). Per iteration:
#   ROW_CHUNK=1:   (27404 - 14.6) us / 25600 = 1070 ns; rest = 68 ns (one 4-byte descriptor,
#                  (4 + 162) / 17 = 10 ns, + 57)                              -> F = 1002 ns
#   ROW_CHUNK=128: (206 - 14.6) us / 200 = 957 ns; rest = 96 ns (the store and the two loads
#                  share the 16 queues: 3 x (8 x 4 + 162) / 17 = 34 ns, + 57, + 5 for the last
#                  store's latency spread over the 200 iterations)            -> F =  861 ns
#   F = mean = 931 ns -> 930 (the two rows' relative errors are then -7% / +7%).
# launch_ns: measured - modeled body of the rows with one or two iterations,
#   trn1 (F = 930): stream FREE_DIM=200 19 - 3.43 = 15.57 us; FREE_DIM=2000 n=256000
#     34 - 16.81 = 17.19; FREE_DIM=1000 29 - 15.93 = 13.07; direct allocation 28.5 - 15.93 =
#     12.57 -> mean 14.60 us -> 14.6 (F and launch_ns depend on each other a little; the values
#     are the fixed point of the two means).
#   trn2: stream FREE_DIM=200 15 - 2.22 = 12.78 us; --disable-dge FREE_DIM=2000 n=256000
#     28.5 - 15.27 = 13.23; FREE_DIM=1000 27 - 12.04 = 14.96 (its two iterations overlap now
#     that the compiler renames the reloaded tiles) -> mean 13.66 us -> 13.7.
COST_PARAMS: dict = {
    "trn1": CostParams(arch=TARGETS["trn1"], dma_fixed_ns=930.0, launch_ns=14_600.0,
                       access_overhead_cycles=60.0),
    "trn2": CostParams(arch=TARGETS["trn2"], launch_ns=13_700.0, vector_perf_mode=True,
                       rename_buffers=8,
                       fp32_transpose_factor=2.0, dge=True),
}
_VARIANTS: dict = {}


def params_for(arch: Arch | str | None = None, *, dge: bool | None = None) -> CostParams:
    """The :class:`CostParams` of a target (an :class:`Arch`, a name, or ``$NKISIM_TARGET``).

    ``dge=False`` selects the descriptor DMA path on trn2, for kernels compiled with
    ``--disable-dge`` (``nki.benchmark(..., additional_compile_opt="--disable-dge")``, as the
    CS149 Part 2 harness and Part 1 profiling do). NC-v2 has no hardware DGE, so on trn1 it is
    always off.
    """
    a = arch if isinstance(arch, Arch) else get_arch(arch)
    base = COST_PARAMS[a.name]
    if dge is None or bool(dge) == base.dge or (dge and a.nc_version < 3):
        return base
    key = (a.name, bool(dge))
    p = _VARIANTS.get(key)
    if p is None:
        p = _VARIANTS[key] = replace(base, dge=bool(dge))
    return p


# ---------------------------------------------------------------------------------------------
# DMA
# ---------------------------------------------------------------------------------------------
def table_efficiency(row_bytes: float, table: tuple = DMA_EFFICIENCY_TABLE) -> float:
    """The digitized chart of ref §3.5, linearly interpolated (0 at 0 bytes, 1.0 from 32 KiB).
    (A reference: the model reads the chart only through :func:`descriptor_overhead_bytes`.)"""
    if row_bytes <= 0:
        return 0.0
    x0, y0 = table[0]
    if row_bytes <= x0:
        return y0 * row_bytes / x0
    j = bisect.bisect_left([x for x, _ in table], row_bytes)
    if j >= len(table):
        return table[-1][1]
    x1, y1 = table[j]
    xa, ya = table[j - 1]
    return ya + (y1 - ya) * (row_bytes - xa) / (x1 - xa)


@functools.cache
def _fit_overhead(table: tuple, min_bytes: float) -> float:
    """Least-squares ``d`` of ``r(b) = [b / (b + d)] / [B / (B + d)]`` against the chart points
    ``b >= min_bytes`` (B = the chart's last size, the chart's 1.0). Golden-section search."""
    pts = [(x, y) for x, y in table if x >= min_bytes]
    top = table[-1][0]

    def sse(d):
        norm = top / (top + d)
        return sum((x / (x + d) / norm - y) ** 2 for x, y in pts)

    lo, hi = 0.0, float(min_bytes)
    g = (5 ** 0.5 - 1) / 2
    for _ in range(100):
        m1, m2 = hi - g * (hi - lo), lo + g * (hi - lo)
        if sse(m1) <= sse(m2):
            hi = m2
        else:
            lo = m1
    return (lo + hi) / 2


def descriptor_overhead_bytes(params: CostParams | None = None) -> float:
    """Per-descriptor overhead of a DMA queue, in byte-times (~162 B: 9.5 ns at 17 B/ns on trn1,
    7.0 ns at 23 B/ns on trn2).

    With ``t(b) = (b + d) / bw`` per descriptor, efficiency is ``b / (b + d)``. ``d`` is the
    least-squares fit of that curve (normalized to the chart's 32 KiB value) to the digitized chart
    of ref §3.5 at 4, 8 and 16 KiB per partition: the points where the chart is bandwidth-bound
    ("≥4 KiB saturates"). Solving each point alone gives 145 / 224 / 334 B; the 16 KiB point is the
    least certain (0.99 read off an unlabeled axis: 0.995 would give 165 B), and least squares
    weighs the points by how much they constrain ``d``. The chart's points up to 2 KiB are not
    used: there a P=128 transfer takes the same ~1.1-1.2 us (trn1 scale) / ~0.8-0.9 us (trn2
    scale) at any size, i.e. they measure a transfer's fixed latency, which the schedule charges
    separately (``dma_fixed_ns`` / the DGE issue). (Anchoring ``d`` at the 2 KiB point, as an
    earlier version did, gave 480 B, which contradicts the chart's own 4 KiB point: 0.91 against
    0.97.)
    """
    p = params if params is not None else COST_PARAMS["trn2"]
    return _fit_overhead(tuple(p.dma_efficiency), float(p.dma_overhead_fit_min_bytes))


def dma_efficiency(row_bytes: float, params: CostParams | None = None) -> float:
    """Fraction of peak per-queue bandwidth reached with descriptors of ``row_bytes``:
    ``b / (b + d)``, ``d`` = :func:`descriptor_overhead_bytes` (ref §3.5). Monotone, below 1.
    (Each descriptor is its own contiguous HBM run; see :func:`dma_plan` for transfers whose HBM
    side is one contiguous run.)"""
    if row_bytes <= 0:
        return 0.0
    return row_bytes / (row_bytes + descriptor_overhead_bytes(params))


@dataclass(slots=True)
class DmaPlan:
    """How one DMA instruction is carried out (see module docstring)."""

    issue_ns: float         # DGE path: time the DMA-issuing sequencer spends on it (else 0)
    fixed_ns: float         # descriptor path: issue -> data phase latency (else 0)
    rows: int               # descriptors
    row_bytes: float
    row_ns: float           # queue occupancy of one descriptor
    queues: int             # queues used (descriptors spread evenly, 8 partitions each for P=128)
    nbytes: int
    hbm_sides: int

    def rows_on(self, j: int) -> int:
        """Descriptors on the j-th used queue (0 <= j < queues)."""
        base, extra = divmod(self.rows, self.queues)
        return base + (1 if j < extra else 0)

    @property
    def occupancy_ns(self) -> float:
        """Busiest queue's data phase."""
        return -(-self.rows // self.queues) * self.row_ns

    @property
    def latency_ns(self) -> float:
        """Isolated latency, ready to complete, with an idle sequencer and idle queues (on the DGE
        path the data phase overlaps the issue)."""
        if self.issue_ns > 0:
            return max(self.issue_ns, self.occupancy_ns)
        return self.fixed_ns + self.occupancy_ns


def _row_ns(params: CostParams, row_bytes: float, hbm_sides: int, factor: float,
            runs_per_row: float = 1.0) -> float:
    """Queue time of one descriptor: its bytes plus ``runs_per_row`` descriptor overheads."""
    key = (row_bytes, hbm_sides, factor, runs_per_row)
    v = params._row_ns_cache.get(key)
    if v is None:
        bw = params.queue_bytes_per_ns(hbm_sides) * factor
        d = descriptor_overhead_bytes(params)
        v = (row_bytes + d * runs_per_row) / bw if row_bytes > 0 else 0.0
        params._row_ns_cache[key] = v
    return v


def _itemsize(dtype: str) -> int:
    try:
        return dtypes.itemsize(dtype)
    except (TypeError, ValueError, KeyError):
        return 4


def _hbm_contiguous(instr: Instr, nbytes: float) -> bool:
    """Is every HBM side of the DMA one contiguous byte range? (An HBM region is the bounding
    range of the access, so it is contiguous exactly when it spans the bytes moved. A casting DMA
    moves a different byte count on its HBM side and is conservatively taken as not contiguous.)"""
    seen = False
    for regions in (instr.reads, instr.writes):
        for r in regions:
            if r.buffer == "hbm":
                if r.b1 - r.b0 != nbytes:
                    return False
                seen = True
    return seen


def dma_plan(instr: Instr, params: CostParams) -> DmaPlan:
    """Descriptor/queue plan of a DMA instruction.

    Uses ``detail["rows"]``, ``detail["row_bytes"]``, ``detail["bytes"]``, ``detail["src"]``,
    ``detail["dst"]`` (buffers "hbm"/"sbuf"); falls back to the instruction's regions. A transfer
    of P partitions is at least one descriptor per partition; the descriptors are spread over the
    16 queues, so a P=128 tile is 16 transfers of 8 partitions each (ref §3.5).

    Descriptor overhead (:func:`descriptor_overhead_bytes`) is paid once per contiguous HBM run
    a queue moves. Normally every descriptor is such a run. When the HBM side is one contiguous
    range (``tile[...] = nl.load(v[m*128:(m+1)*128])``, ``nl.load(v3d[m])``), each queue's
    consecutive partitions (8 for P=128, §3.5) are one contiguous HBM run, so the queue pays one
    overhead for all of them; the SBUF side takes its partitions in parallel (its port moves 128
    elements, one per partition, per cycle, ref §3.1), so splitting the run over partitions costs
    only the bytes. Calibration check (cs149 §5, trn1, serialized iterations): 128 x 4-byte
    partitions per DMA (ROW_CHUNK=128, 0.96-1.03 us/iter) cost no more than 1 x 4 bytes
    (ROW_CHUNK=1, 1.07 us/iter). One overhead per partition would add ~0.2 us per iteration to
    ROW_CHUNK=128 (3 DMAs x 8 descriptors x 9.8 ns on each queue); one per queue adds 0.03 us.
    """
    d = instr.detail
    nbytes = d.get("bytes")
    if nbytes is None:
        nbytes = sum((r.p1 - r.p0) * (r.b1 - r.b0) for r in instr.writes)
    rows = d.get("rows") or max(1, instr.partitions)
    row_bytes = d.get("row_bytes")
    if row_bytes is None:
        row_bytes = nbytes / rows if rows else 0
    src = d.get("src")
    dst = d.get("dst")
    if src is None:
        src = instr.reads[0].buffer if instr.reads else "hbm"
    if dst is None:
        dst = instr.writes[0].buffer if instr.writes else "hbm"
    hbm_sides = (src == "hbm") + (dst == "hbm")
    factor = 1.0
    runs_per_row = 1.0
    transpose = "transpose" in instr.op or bool(d.get("transpose"))
    hwdge = params.dge
    if transpose:
        rows = max(1, instr.partitions)
        item = _itemsize(instr.dtype)
        if item == 2 and params.arch.nc_version >= 3:
            # The hardware-DGE transpose ("src.dtype must be 2 bytes", nki-dge.rst "Hardware
            # DGE constraints for dma_transpose"): "up to 90%" (HBM->SBUF) / "50%" (SBUF->SBUF)
            # of DMA throughput (ref §3.5), one descriptor per SBUF partition at that rate.
            factor = (params.dma_transpose_hbm_factor if hbm_sides
                      else params.dma_transpose_sbuf_factor)
            row_bytes = nbytes / rows
        else:
            # No hardware-DGE transpose for this dtype: precomputed descriptors (the
            # descriptor path even where the kernel's other DMAs use the DGE), and the DMA
            # engines build the documented [128, 16] blocks, each partition's 16 contiguous
            # elements one write: one descriptor (with its overhead) per partition per group.
            # Check: a 4096x4096 fp32 transpose by load_transpose2d, 836 us on trn2 (cs149
            # §5), models to ~850 us; at the 90% rate it modeled to 436 us. The perf guide
            # (Opt #10): load_transpose2d "can degrade DMA bandwidth significantly".
            hwdge = False
            groups = -(-max(1, instr.free) // params.dma_transpose_block_elems)
            rows = rows * groups
            row_bytes = nbytes / rows
    queues = min(params.dma_queues, rows)
    if (hbm_sides and factor == 1.0 and not transpose and rows > queues
            and _hbm_contiguous(instr, nbytes)):
        runs_per_row = queues / rows            # one contiguous HBM run per queue
    row_ns = _row_ns(params, row_bytes, hbm_sides, factor, runs_per_row)
    if hwdge:
        issue, fixed = params.dge_issue_ns + params.dge_descriptor_ns * rows, 0.0
    else:
        issue, fixed = 0.0, params.dma_fixed_ns
    return DmaPlan(issue, fixed, rows, row_bytes, row_ns, queues, int(nbytes), hbm_sides)


# ---------------------------------------------------------------------------------------------
# TensorE
# ---------------------------------------------------------------------------------------------
def matmul_cycles(instr: Instr, params: CostParams) -> float:
    """MultiplyMoving II of an nc_matmul / PE transpose in TensorE cycles (ref §1.10, §3.3).

    ``max(min(64, N_stationary), N_moving)`` with N_stationary = ``detail["M"]`` (stationary
    free size) and N_moving = ``detail["N"]`` (moving free size); x4 with fp32 operands. A PE
    transpose of a (P, F) tile is ``nc_matmul(stationary=data, moving=identity)`` and is recorded
    that way (M = F, N = P: the (F, P) result is (M, N)), so the same formula gives the reference's
    transpose cost ``max(P, min(64, F))``; its fp32 factor is x4 on NC-v2 (a matmul) and x2 on
    NC-v3 (transpose mode, §3.3).
    """
    d = instr.detail
    m = d.get("M", instr.partitions)
    n = d.get("N", instr.free)
    cyc = max(min(params.mm_init_cycles, m), n)
    return cyc * _fp32_factor(d, params)


def _fp32_factor(d: dict, params: CostParams) -> float:
    if not d.get("fp32"):
        return 1.0
    return params.fp32_transpose_factor if d.get("transpose") else params.fp32_matmul_factor


def load_stationary_cycles(instr: Instr, params: CostParams) -> float:
    """Fast LoadStationary II, N_stationary / 4 TensorE cycles (ref §3.3); fp32 scaled as MM.
    For a PE transpose the stationary is the (P, F) data: F / 4."""
    d = instr.detail
    return d.get("M", instr.partitions) / params.ls_divisor * _fp32_factor(d, params)


def adjusted_flops_factor(instr: Instr, params: CostParams) -> float:
    """neuron-profile adjusted_hardware_flops weight (ref §3.6): FP32 x4; FP8 x1 on Trn1, x0.5 on
    Trn2; BF16/FP16/TF32 x1. FP8 is recognized from ``detail["dtype_in"]``."""
    d = instr.detail
    if d.get("fp32"):
        return params.fp32_matmul_factor
    if str(d.get("dtype_in", "")).startswith("float8") and params.arch.nc_version >= 3:
        return 0.5
    return 1.0


# ---------------------------------------------------------------------------------------------
# Vector / Scalar / GpSimd
# ---------------------------------------------------------------------------------------------
_CHEAP_TT_OPS = frozenset({"add", "multiply", "subtract", "mul", "sub"})
_HALF_REDUCE_OPS = frozenset({"add", "maximum", "max", "amax", "sum"})
_ONE_INPUT_OPS = frozenset({
    "tensor_copy", "tensor_scalar", "activation", "copy", "bn_stats", "nc_stream_shuffle",
    "tensor_scalar_reduce", "select_reduce", "tensor_copy_predicated", "max8", "nc_find_index8",
    "nc_match_replace8", "dropout", "nc_transpose", "tensor_partition_reduce", "range_select",
})


def _alu_name(d: dict, key: str = "alu") -> str:
    op = d.get(key)
    if op is None:
        return ""
    if isinstance(op, str):
        return op
    return getattr(op, "__name__", str(op))


def _is_zero(v) -> bool:
    try:
        return float(v) == 0.0
    except (TypeError, ValueError):
        return False


def engine_cycles(instr: Instr, params: CostParams, engine: str | None = None) -> float:
    """II in engine cycles of a VectorE/ScalarE/GpSimdE instruction: :func:`stream_cycles` plus,
    on NC-v2, the static tensor-access overhead (``access_overhead_cycles``) beyond MIN_II."""
    c = stream_cycles(instr, params, engine)
    ovh = params.access_overhead_cycles
    if ovh and c > params.min_ii_cycles:
        c += ovh
    return c


def stream_cycles(instr: Instr, params: CostParams, engine: str | None = None) -> float:
    """II in engine cycles of a VectorE/ScalarE/GpSimdE instruction (ref §1.10, §3.4).

    Reads ``detail`` keys ``inputs``, ``psum_in``, ``all_16bit``, ``contiguous`` and, when the
    interpreter records them, ``alu``/``alu1`` (ALU op names, e.g. "add"), ``in_free``
    (tensor_reduce input elements per partition), ``value`` (memset constant) and ``reduce``
    (activation with an accumulating reduction).
    """
    op = instr.op
    d = instr.detail
    n = float(instr.free)
    min_ii = params.min_ii_cycles
    eng = engine or instr.engine
    all16 = bool(d.get("all_16bit"))
    psum_in = bool(d.get("psum_in"))
    # GpSimd gathers added by the current dialect stream like local_gather (nkisim.gather)
    if op in ("iota", "affine_select", "local_gather", "nc_n_gather", "nonzero_with_count"):
        return params.gpsimd_start_cycles + n
    if op in ("tensor_copy_dynamic_src", "tensor_copy_dynamic_dst"):
        return max(params.dynamic_min_ii_cycles, n)
    if op in ("memset", "zeros", "ones", "full", "zeros_like"):
        half = all16 or instr.dtype in ("bfloat16", "float16")
        if half and _is_zero(d.get("value", 0.0 if op.startswith("zeros") else None)):
            n = n / 2
        return max(min_ii, n)
    if op == "tensor_reduce":
        n = float(d.get("in_free", n))          # N = input elements per partition
        if instr.dtype == "bfloat16" and all16 and (_alu_name(d) or op) in _HALF_REDUCE_OPS:
            n = n / 2
        return max(min_ii, n)
    if op == "reciprocal":
        return max(min_ii, 8 * n if eng == VECTOR else n)
    if op == "bn_aggr":
        return max(min_ii, 13 * n / 3)
    if op == "tensor_tensor_scan":
        return max(min_ii, 2 * n)
    if op in ("activation", "activation_reduce"):
        cyc = max(min_ii, n)
        if op == "activation_reduce" or d.get("reduce"):
            cyc += min_ii  # ActReadAccumulator ~ MIN_II (§1.10, §3.4)
        return cyc
    if op == "scalar_tensor_tensor":
        cheap = (all16 and instr.dtype == "bfloat16" and int(n) % 2 == 0
                 and {_alu_name(d), _alu_name(d, "alu1")} <= {"subtract", "multiply"})
        return max(min_ii, n if cheap else 2 * n)
    inputs = d.get("inputs", len(instr.reads))
    out_psum = bool(instr.writes) and instr.writes[0].buffer == "psum"
    perf = params.vector_perf_mode and eng == VECTOR and all16
    if op in _ONE_INPUT_OPS or inputs <= 1:
        # tensor_copy / tensor_scalar / activation: max(MIN_II, N) (§1.10); trn2 VectorE perf
        # mode 4x SBUF->SBUF 16-bit contiguous, 2x non-contiguous or one side PSUM (§3.4).
        if perf and op in ("tensor_copy", "tensor_scalar", "copy"):
            n = n / (4 if (d.get("contiguous", True) and not psum_in and not out_psum) else 2)
        return max(min_ii, n)
    # two-input tensor_tensor rules (§1.10): N with a PSUM input, N for all-16-bit SBUF
    # add/multiply/subtract, else 2N. trn2 perf mode: 2x for both-SBUF all-16-bit (§3.4).
    if psum_in:
        return max(min_ii, n)
    if all16 and (perf or ((_alu_name(d) or op) in _CHEAP_TT_OPS and d.get("contiguous", True))):
        return max(min_ii, n)
    return max(min_ii, 2 * n)


def compute_ns(instr: Instr, params: CostParams, engine: str | None = None) -> float:
    """Engine occupancy (ns) of a compute instruction (on ``engine``, default the recorded one);
    TensorE excludes LoadStationary."""
    eng = engine or instr.engine
    if eng == TENSOR:
        return matmul_cycles(instr, params) / params.arch.tensor_ghz
    return engine_cycles(instr, params, eng) / params.clock_ghz(eng)


def instr_cost_ns(instr: Instr, arch: Arch | str | CostParams | None = None) -> float:
    """Isolated cost (ns) of one instruction: its II on a compute engine; for a DMA its latency
    with idle queues (fixed latency + busiest queue's data phase)."""
    params = arch if isinstance(arch, CostParams) else params_for(arch)
    if instr.engine == DMA:
        return dma_plan(instr, params).latency_ns
    return compute_ns(instr, params)
