"""Per-instruction costs on each target: the latency model's constants and formulas.

Every constant lives in :class:`CostParams` (one instance per target in :data:`COST_PARAMS`;
:func:`params_for` also gives the trn2 ``--disable-dge`` variant) with a comment citing
shared/spec/nki-reference.md ("ref §x.y") or shared/spec/cs149-assignment.md ("cs149 §x").

The model (``nkisim.schedule`` assembles the timeline from these pieces):

* Compute engines (TensorE, VectorE, ScalarE, GpSimdE) are in-order queues. An instruction
  occupies its engine for its initiation interval (II): the reference's per-ISA formulas, which
  are back-to-back averages (ref §1.10, §3.3, §3.4). A compute consumer sees a compute producer's
  result ``dep_latency_cycles`` (producer-engine cycles) after the producer's II ends: the
  static overhead and semaphore hand-off that make dependent instructions slower than independent
  back-to-back ones (ref §3.4). TensorE -> TensorE edges (PSUM accumulation groups) pay nothing.
* A DMA is ``rows`` descriptors (contiguous runs) of ``row_bytes``, spread over the 16 queues (a
  P=128 tile: 8 partitions per queue, ref §3.5). Each descriptor takes
  ``row_bytes / (bandwidth * dma_efficiency(row_bytes))`` of its queue's time. How the DMA gets
  started depends on the DMA path the kernel was compiled for:
  - hardware DGE (``dge=True``: trn2's default, e.g. ``nki.benchmark`` in CS149 Part 1). The
    DMA-issuing sequencer executes each DMA instruction for ``dge_issue_ns`` plus
    ``dge_descriptor_ns`` per descriptor, one at a time in readiness order. The queues work on
    the descriptors as they are generated.
  - descriptors (``dge=False``: trn1, and trn2 with ``--disable-dge`` as in CS149 Part 1
    profiling and the Part 2 harness). The data phase starts ``dma_fixed_ns`` after the DMA is
    ready; DMAs in flight overlap this latency.
  Either way the completion is visible to every engine at once.

Which published figure informed which constant (cs149 §5, ref §3.7). All trn2 figures are p99
nc_latency of kernels compiled with ``skip_middle_end_transformations``, so the buffers in the
trace are the buffers the hardware used.

* ``dge_issue_ns``/``dge_descriptor_ns``: "about 600 ns" per DGE DMA instruction on NC-v3
  (ref §3.5), taken as the figure for a 128-descriptor (P=128) transfer.
  - Checks of the 600 ns: ``vector_add_tiled`` ROW_CHUNK=128 and ``vector_add_stream``
    FREE_DIM=2 are, per iteration, a chain of three 128-descriptor DMAs and one 64-cycle VectorE
    op: 1.87 us/iter modeled against 1.89 / 1.86 measured. ``matrix_transpose`` 1024^2, tile by
    tile (load, nc_transpose, tensor_copy, store; one buffer each): 94 us against 86 measured. The
    descriptor path would give 164 us here, because it chains a 1.3 us latency per tile.
  - Fitted: ROW_CHUNK=1 is three 1-descriptor DMAs per iteration, 1.458 us/iter measured, so
    about 460 ns per DMA. That gives the 460 ns base; the 1.1 ns per descriptor then follows from
    (600 - 460) / 128.
* ``dma_fixed_ns`` = 1300 ns: the documented cross-engine figure, not fitted. Check: the profiled
  (``--disable-dge``) ``vector_add_stream`` n=256000 runs at FREE_DIM=2000 / 1000 model to
  28.2 / 29.7 us, against profiler total_time 28.5 / 27.
* ``dma_efficiency``: the digitized chart of ref §3.5, except below ~2 KiB per descriptor. There
  the chart's time is flat (about 850 ns for any P=128 transfer up to 2 KiB/partition), which is
  the transfer's own fixed cost, already charged above. Reading that part as bandwidth doubled
  the tiny-descriptor kernels (ROW_CHUNK=128: 3.8 against 1.89 us/iter). Below 2 KiB the model
  uses a per-descriptor overhead instead. Its size comes from the chart's 2 KiB point, the
  "minimum recommended" payload: 2048 * (1/0.81 - 1) = 480 byte-times, i.e. 21 ns (trn2) and
  28 ns (trn1).
* ``launch_ns``: ``vector_add_stream`` FREE_DIM=200 is one (128,200) fp32 tile per input: two
  loads, one tensor_tensor and one store. It measures 15 us (trn2) / 19 us (trn1). The modeled
  body is 2.2 / 4.8 us, so the per-launch overhead inside nc_latency (instruction fetch, queue and
  semaphore setup, end notification) is taken as 12.8 / 14 us.
* trn1 Part 1 loop figures are not used. The 2024 kernels were compiled without
  ``skip_middle_end_transformations`` (cs149 §3), so the compiler may multi-buffer loops that
  the trace shows single-buffered. Stream FREE_DIM=2 ran at 0.53 us/iter on trn1 against 1.86
  on trn2. The model overestimates these trn1 loops by 1.3x (ROW_CHUNK=1) to 4x (FREE_DIM=2).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

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
    # (~1300 ns cross-engine)" (§3.5), a latency that DMAs in flight overlap.
    dma_fixed_ns: float = 1300.0
    # DGE path: "a hardware-DGE DMA instruction takes about 600 ns to execute on NeuronCore-v3"
    # (§3.5). The DMA-issuing sequencer is busy that long per DMA, so DMA issues serialize.
    # 600 ns is taken for a 128-descriptor (P=128) transfer. A 1-descriptor one costs about
    # 460 ns (ROW_CHUNK=1, module docstring), hence 460 ns + 1.1 ns per descriptor.
    dge_issue_ns: float = 460.0
    dge_descriptor_ns: float = 140.0 / 128
    dma_efficiency: tuple = DMA_EFFICIENCY_TABLE
    # Descriptor size where the chart is read as a per-descriptor overhead: 2 KiB, the "minimum
    # recommended" payload per partition (ref §3.5); see dma_efficiency().
    dma_efficiency_anchor_bytes: float = 2048.0
    # dma_transpose: "HBM->SBUF up to 90%, SBUF->SBUF up to 50% of DMA throughput" (§3.5).
    dma_transpose_hbm_factor: float = 0.9
    dma_transpose_sbuf_factor: float = 0.5
    # --- kernel ---
    # Fixed per-launch overhead included in nc_latency / profiler total_time (module docstring).
    launch_ns: float = 0.0
    _row_ns_cache: dict = field(default_factory=dict, compare=False, repr=False)

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


COST_PARAMS: dict = {
    # launch_ns: vector_add_stream FREE_DIM=200 measured 19 us, modeled body 4.8 us (docstring)
    "trn1": CostParams(arch=TARGETS["trn1"], launch_ns=14_000.0),
    # launch_ns: the same kernel measured 15 us, modeled body 2.2 us
    "trn2": CostParams(arch=TARGETS["trn2"], launch_ns=12_800.0, vector_perf_mode=True,
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
    """The digitized chart of ref §3.5, linearly interpolated (0 at 0 bytes, 1.0 from 32 KiB)."""
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


def descriptor_overhead_bytes(params: CostParams | None = None) -> float:
    """Per-descriptor overhead, in byte-times, implied by the chart at the anchor size.

    With ``t(b) = d + b/bw`` per descriptor, efficiency is ``b / (b + d*bw)``; the chart's
    2 KiB point (0.81) gives ``d*bw = 2048 * (1/0.81 - 1) = 480 B`` (20.9 ns at 23 B/ns).
    """
    p = params if params is not None else COST_PARAMS["trn2"]
    b = p.dma_efficiency_anchor_bytes
    return b * (1.0 / table_efficiency(b, p.dma_efficiency) - 1.0)


def dma_efficiency(row_bytes: float, params: CostParams | None = None) -> float:
    """Fraction of peak per-queue bandwidth reached with descriptors of ``row_bytes`` (ref §3.5).

    ``max(chart, b / (b + overhead))``: the digitized chart, except where a per-descriptor overhead
    anchored at the chart's 2 KiB point is higher. Below ~2 KiB the chart's transfer time is flat
    (~850 ns for a P=128 transfer: it is the transfer's own fixed cost, which the schedule
    already charges as ``dma_fixed_ns`` or the DGE issue), so reading it as throughput would count
    it twice (it doubles the estimate of ROW_CHUNK=128 / stream FREE_DIM=2, cs149 §5). Monotone.
    """
    p = params if params is not None else COST_PARAMS["trn2"]
    if row_bytes <= 0:
        return 0.0
    chart = table_efficiency(row_bytes, p.dma_efficiency)
    desc = row_bytes / (row_bytes + descriptor_overhead_bytes(p))
    return chart if chart > desc else desc


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


def _row_ns(params: CostParams, row_bytes: float, hbm_sides: int, factor: float) -> float:
    key = (row_bytes, hbm_sides, factor)
    v = params._row_ns_cache.get(key)
    if v is None:
        bw = params.queue_bytes_per_ns(hbm_sides) * factor
        v = row_bytes / (bw * dma_efficiency(row_bytes, params)) if row_bytes > 0 else 0.0
        params._row_ns_cache[key] = v
    return v


def dma_plan(instr: Instr, params: CostParams) -> DmaPlan:
    """Descriptor/queue plan of a DMA instruction.

    Uses ``detail["rows"]``, ``detail["row_bytes"]``, ``detail["bytes"]``, ``detail["src"]``,
    ``detail["dst"]`` (buffers "hbm"/"sbuf"); falls back to the instruction's regions. A transfer
    of P partitions is at least one descriptor per partition; the descriptors are spread over the
    16 queues, so a P=128 tile is 16 transfers of 8 partitions each (ref §3.5).
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
    if "transpose" in instr.op or d.get("transpose"):
        # A DMA transpose (load_transpose2d, dma_transpose) runs on the DMA engines' transpose
        # support at "up to 90%" (HBM->SBUF) / "50%" (SBUF->SBUF) of DMA throughput (ref §3.5);
        # it is costed as one descriptor per SBUF partition at that rate, not element by element.
        factor = params.dma_transpose_hbm_factor if hbm_sides else params.dma_transpose_sbuf_factor
        rows = max(1, instr.partitions)
        row_bytes = nbytes / rows
    row_ns = _row_ns(params, row_bytes, hbm_sides, factor)
    queues = min(params.dma_queues, rows)
    if params.dge:
        issue, fixed = params.dge_issue_ns + params.dge_descriptor_ns * rows, 0.0
    else:
        issue, fixed = 0.0, params.dma_fixed_ns
    return DmaPlan(issue, fixed, rows, row_bytes, row_ns, queues, int(nbytes), hbm_sides)


# ---------------------------------------------------------------------------------------------
# TensorE
# ---------------------------------------------------------------------------------------------
def matmul_cycles(instr: Instr, params: CostParams) -> float:
    """MultiplyMoving II of an nc_matmul / PE transpose in TensorE cycles (ref §1.10, §3.3).

    matmul: ``max(min(64, N_stationary), N_moving)`` with N_stationary = ``detail["M"]``,
    N_moving = ``detail["N"]``; x4 with fp32 operands.
    PE transpose (``detail["transpose"]``) of a (P, F) input: ``max(P, min(64, F))``, the same
    formula with the data as stationary and the identity (P columns) as moving; fp32 x4 (NC-v2) /
    x2 (NC-v3 transpose mode). P is ``detail["K"]``; F is read from the instruction's partitions
    (the (F, P) result's), which does not depend on how M/N were assigned for a transpose.
    """
    d = instr.detail
    if d.get("transpose"):
        p = d.get("K", instr.free)
        cyc = max(p, min(params.mm_init_cycles, instr.partitions))
        return cyc * (params.fp32_transpose_factor if d.get("fp32") else 1.0)
    m = d.get("M", instr.partitions)
    n = d.get("N", instr.free)
    cyc = max(min(params.mm_init_cycles, m), n)
    return cyc * (params.fp32_matmul_factor if d.get("fp32") else 1.0)


def load_stationary_cycles(instr: Instr, params: CostParams) -> float:
    """Fast LoadStationary II, N_stationary / 4 TensorE cycles (ref §3.3); fp32 scaled as MM.
    For a PE transpose the stationary is the (P, F) data: F / 4."""
    d = instr.detail
    if d.get("transpose"):
        return instr.partitions / params.ls_divisor * (
            params.fp32_transpose_factor if d.get("fp32") else 1.0)
    m = d.get("M", instr.partitions)
    return m / params.ls_divisor * (params.fp32_matmul_factor if d.get("fp32") else 1.0)


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


def engine_cycles(instr: Instr, params: CostParams) -> float:
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
    eng = instr.engine
    all16 = bool(d.get("all_16bit"))
    psum_in = bool(d.get("psum_in"))
    if op in ("iota", "affine_select", "local_gather"):
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


def compute_ns(instr: Instr, params: CostParams) -> float:
    """Engine occupancy (ns) of a compute instruction; TensorE excludes LoadStationary."""
    if instr.engine == TENSOR:
        return matmul_cycles(instr, params) / params.arch.tensor_ghz
    return engine_cycles(instr, params) / params.clock_ghz(instr.engine)


def instr_cost_ns(instr: Instr, arch: Arch | str | CostParams | None = None) -> float:
    """Isolated cost (ns) of one instruction: its II on a compute engine; for a DMA its latency
    with idle queues (fixed latency + busiest queue's data phase)."""
    params = arch if isinstance(arch, CostParams) else params_for(arch)
    if instr.engine == DMA:
        return dma_plan(instr, params).latency_ns
    return compute_ns(instr, params)
