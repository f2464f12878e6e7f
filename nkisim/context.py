"""The state of the kernel being executed: trace, loops, epochs, options.

One :class:`Run` exists per top-level kernel call (``nki.simulate_kernel``, ``nki.baremetal``, a
``@nki.jit`` kernel called with NumPy arrays, ``nki.benchmark``). NKI API calls made while no run
is active raise ``err_nki_api_outside_of_nki_kernel``.

Epochs. Every loop iteration gets a fresh *epoch* id; code outside loops runs in the kernel's
epoch 1. Each tensor element remembers the epoch of its last write (its *shadow*, see
``nkisim.tensor``). Epoch 0 means "never written" (uninitialized-read check); comparing the writer's
epoch with the reader's tells whether two iterations of one ``affine_range`` loop touch the same
element (race checks, ``nkisim.checks``). Ids grow monotonically, so everything written since the
current iteration began has an epoch >= the current one: the common case is a single comparison.

SPMD. ``kernel[g0, g1](...)`` runs its program instances one after the other; each instance gets
its own epoch under a pseudo-loop of kind ``"spmd"``, so the race rules treat the grid like an
``affine_range`` over program ids: two instances writing the same ``shared_hbm`` location is
``err_unexpected_output_dependencies`` ("In affine_range/SPMD, writing the same location from
different iterations", ref §1.5), and an instance reading what another wrote is a dependency the
device does not order (instances run on different NeuronCores).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import errors
from .arch import Arch, get_arch
from .errors import _PKG_DIR, caller_location, where  # noqa: F401 - used by checks, tensor
from .memory import TOUCHED
from .trace import Instr, Trace

# The checks nkisim runs by default; each can be turned off (NKISIM_CHECKS=-races,-uninit or
# `checks=` on simulate_kernel / the pytest option):
#   uninit    reads of memory never written (nkisim_uninitialized_read)
#   races     affine_range/SPMD loop-carried and output dependencies (nkisim.checks)
#   outputs   returned HBM tensors not fully written (err_tensor_output_not_written_to)
#   capacity  SBUF bytes per partition and PSUM banks of live tiles (nkisim.memory)
#   warnings  suspicious patterns reported as nkisim.errors.NKIWarning
#   inputs    writes into kernel inputs (err_cannot_update_immutable_parameter)
#   scope     tiles used after the loop iteration that allocated them
#             (err_local_variable_used_out_of_scope)
ALL_CHECKS = ("uninit", "races", "outputs", "capacity", "warnings", "inputs", "scope")



def parse_checks(spec: str | None) -> frozenset:
    """``"all"``, ``"none"``, ``"uninit,races"`` or ``"-races"`` (all but races)."""
    if spec is None or spec.strip() in ("", "all"):
        return frozenset(ALL_CHECKS)
    spec = spec.strip()
    if spec == "none":
        return frozenset()
    items = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [s.lstrip("-+") for s in items if s.lstrip("-+") not in ALL_CHECKS]
    if unknown:
        raise ValueError(f"unknown nkisim check(s) {unknown}; known: {', '.join(ALL_CHECKS)}")
    if all(s.startswith("-") for s in items):
        return frozenset(ALL_CHECKS) - {s[1:] for s in items}
    return frozenset(s.lstrip("+") for s in items if not s.startswith("-"))


@dataclass(slots=True, eq=False)
class Loop:
    """One activation of an ``nl.*_range`` loop (or the SPMD grid, kind ``"spmd"``)."""

    id: int
    kind: str                 # "affine" | "sequential" | "static" | "spmd"
    file: str
    line: int
    iteration: int = -1
    epoch: int = 0            # epoch of the current iteration
    first_epoch: int = 0      # epoch of iteration 0 (epochs of this activation are >= it)
    parent_epoch: int = 1     # epoch of the context the loop runs in
    scope: list = field(default_factory=list)   # allocations made in the current iteration
    key: tuple = ()           # ((loop id, kind, iteration), ...) of the stack, outermost first


@dataclass(frozen=True)
class Rules:
    """The language rules of the dialect whose face launched the kernel, where the dialects
    differ in what one machine operation means (the core follows them; it knows no dialect).
    The defaults are Beta 1's (``neuronxcc.nki``); ``nkisim.nki`` sets those of ``nki`` 0.3+
    (shared/spec/nki-current.md §2.0, §2.3)."""

    dialect: str = "beta1"              # for messages only
    version: tuple = ()                 # (major, minor) of the dialect, () for Beta 1
    # An integer index on an on-chip tensor's partition dim keeps it at size 1, and an integer
    # on a free dim drops it unless the view would fall below 2-D (nki §2.0 item 3). Beta 1:
    # the partition dim is dropped, and a single remaining free dim is kept at size 1.
    onchip_keep_partition: bool = False
    # nl.add etc. broadcast their operands (Beta 1); nki 0.3+ "no broadcasting" (§2.3).
    broadcast: bool = True
    # Returned HBM tensors must have been created with buffer=nl.shared_hbm (nki 0.3+, §2.0/6).
    outputs_shared_hbm: bool = False
    # nl.copy's result is in the buffer of its source (nki 0.3-0.5), not always SBUF (§2.3).
    copy_same_buffer: bool = False
    # nl.affine_range & co. are Python ranges, unrolled (nki 0.3+, §2.0 item 4): a tensor
    # created in such a loop body is created at kernel level (shared_hbm outputs included).
    unrolled_loops: bool = False
    # nl.max / nl.sum ... reduce "the last contiguous free dims" only ([1], [1, 2], ...;
    # STUB-R32 nl.max, §2.3); Beta 1 reduces any free axes.
    reduce_last_axes: bool = False
    # Beta 1's catalogue restricts "allocated NKI kernels" (direct allocation): activation needs
    # an explicit bias tile, no transpose on TensorE (err_bias_tensor_must_be_specified_in_
    # allocation, err_transpose_on_tensor_engine_not_allowed_in_allocated_kernel; reference
    # §4). nki 0.3+ has neither rule: 2.27 removed that catalogue (nki-current §4), every kernel
    # is allocated by the compiler, and `address=` placement is ordinary (AWS's nki-library
    # places tensors with address= through its SbufManager and calls activation without bias
    # and nc_transpose on TensorE in the same kernels, e.g. attention_tkg).
    allocated_kernel_rules: bool = True
    # activation's bias tile: Beta 1's catalogue allows float32, float16, bfloat16
    # (err_activation_bias_invalid_type, reference §4); 2.27 removed that catalogue and the nki
    # 0.3+ docs give no dtype rule for bias (nki-current §2.4 `activation`). AWS's nki-library
    # qkv_cte with QuantizationType.STATIC passes a float8_e4m3 zero bias to activation_reduce
    # (compute_mm_dtype; tested through attention_block_tkg): nki 0.3+ takes any float dtype.
    activation_bias_any_float: bool = False
    # `if t:` on a tensor of several elements: Beta 1's err_ambiguous_tensor_truth_value
    # (reference §4). In nki 0.3+ a tensor is an object handle and tests true: AWS's
    # nki-library (mlp_tkg_constants.py) tests an optional tensor argument with
    # `if params.expert_params and params.expert_params.expert_index:` (an HBM input). A
    # one-element SBUF/PSUM tile still cannot steer Python (err_dynamic_control_flow_not_
    # supported, both dialects): its value is what such a test would mean.
    tensor_handle_truthy: bool = False
    # A PSUM tensor larger than one 2 KiB bank per partition: Beta 1 refuses it ("a PSUM tile
    # cannot span multiple PSUM banks", reference §1). nki 0.3+ allocates it over consecutive
    # banks: AWS's nki-library core/topk/rotational_topk.py (CI-tested in simulation and on
    # trn2) allocates `rotated_index` [128, 1024] fp32 (4 KiB per partition) in nl.psum and
    # fills it with one nc_matmul per 512-column slice, each inside one bank (a matmul still
    # writes one bank: nkisim_matmul_crosses_psum_bank).
    psum_tile_spans_banks: bool = False
    # The NkiTensor view primitives (slice, select, permute, broadcast, expand_dim, squeeze_dim,
    # reshape_dim, flatten_dims, rearrange, vector_select, is_contiguous, is_indirect) came
    # with nki 0.5.0 (RN 2.31; nki-current §1's table). Beta 1's nki.tensor has shape, dtype,
    # ndim, itemsize, reshape, view, astype, broadcast_to, expand_dims, assert_shape (reference
    # §1, nki/api/nki/__init__.py class tensor): there they raise AttributeError.
    view_primitives: bool = False
    # activation's reduce_op: "NC-v2 reduce op must be add" (Beta 1, reference §1.10); nki 0.3+:
    # "`reduce_op` must be `nl.add`" on every target (nki-current §2.4, STUB-R32).
    activation_reduce_add_only: bool = False
    # nl.expand_dims: Beta 1 "currently only supports expanding dimensions after the last index
    # of the tile" (its docstring, aws-neuron-sdk 1db4d74e); the 0.3+ docstring (STUB-R32)
    # inserts the axis "at the axis position" with no such limit.
    expand_dims_last_only: bool = True
    # The nl wrappers' keywords: Beta 1 takes mask= and **kwargs; nki 0.3+ has no mask= and
    # unknown keywords raise TypeError from 2.28 (nkisim.ops.keywords_check).
    strict_keywords: bool = False
    # tensor_tensor on integers. nki 0.3+ (STUB-R32 tensor_tensor): "When all input/output
    # tiles are int32 or uint32, the operation defaults to GpSimd Engine, which uses native
    # integer arithmetic. This ensures exact results for all 32-bit integer values" (the
    # automatic dispatch "falls back to Vector Engine when any operand resides in PSUM"). Beta 1
    # (nki/api/nki/isa/__init__.py tensor_tensor, aws-neuron-sdk 1db4d74e) names only "``power``
    # or integer ``add``, ``multiply``, or ``subtract`` which run on the GpSimd Engine" and says
    # arithmetic is fp32 "unless it is one of the supported integer ops": Beta 1 computes those
    # three exactly on int32/uint32 inputs, everything else in fp32.
    tensor_tensor_int32_all_ops: bool = False
    # nc_match_replace8 with duplicate vals: the 0.6.0 docstring (STUB-R32) "processes vals in
    # reverse order (i = 7, 6, ..., 0)", so the first match goes to the highest column ("the
    # opposite of nc_find_index8"); the simulator's tie-breaks were "fixed in 0.6.0" to match
    # the hardware (RN 2.32, spec nki-current §3). Beta 1's NumPy equivalent loops ``for j in
    # range(vals_2d.shape[1])`` forward (aws-neuron-sdk 1db4d74e).
    match_replace8_reverse: bool = False
    # nc_find_index8 with duplicate vals: the same docstring pairs them "with their matching
    # positions in ascending order across dst_idx columns" ([3, 8, 8, ...] in [1, 2, 3, 4, 8, 8,
    # ...] gives [2, 4, 5, ...]: max8 + find_index8, AWS's top-k, gets 8 distinct indices);
    # Beta 1's doc gives "the first occurrence of each value" (aws-neuron-sdk 1db4d74e).
    find_index8_distinct: bool = False
    # Beta 1 indirect indexing (reference §1.5, §2.1): an SBUF index tile indexes an HBM tensor
    # on its partition or block dimension only ("err_indirect_indices_free_dim"), never an
    # SBUF/PSUM tile ("err_copy_dynamic_indirect_indices_not_natively_supported": use
    # nisa.tensor_copy_dynamic_src). The current dialect indexes indirectly through
    # .ap(vector_offset=...) instead, whose own rules nkisim.access applies.
    indirect_hbm_partition_only: bool = True
    # Negative indices and negative slice bounds count from the end, as in Python/NumPy: the
    # 0.6.0 stub (NkiTensor.__getitem__) "Supports integers (select), slices, ``Ellipsis``,
    # negative indices, and nl.ds"; loops are Python ranges there (§2.0 item 4), so `t[i - 1]`
    # is an ordinary Python int. Beta 1's docs are silent (programming_model.rst "Basic Tensor
    # Indexing" shows non-negative indices only) and its loop variables are symbolic
    # (reference §1.5, migration guide: "loops were only executed once"): `t[i - 1]` at i = 0
    # is the static index range [-1, ...], err_tensor_access_out_of_bound (reference §1.5), so
    # a negative index stays an error there.
    negative_indices: bool = False
    # Comparisons (equal, less, ...) and logical_not: Beta 1's signatures default
    # ``dtype=bool`` ("a tile with boolean result", nki/api/nki/language/__init__.py); the 0.6.0
    # stub: "Defaults to the input tile dtype. Use dtype=nl.uint8 for a boolean-like result"
    # (comparisons, "a tile with 1 where equal, 0 otherwise") and, for logical_not, "if not
    # specified, it will default to be the same as the data type of the input tile".
    compare_input_dtype: bool = False
    # nl.mean of an integer tile: Beta 1 "``float32`` intermediate and return values are used
    # for integer inputs"; the 0.6.0 stub: dtype "if not specified, it will default to be the
    # same as the data type of the input tile" ("Float32 intermediate values are used for the
    # computation": the return value is not).
    mean_int_keeps_dtype: bool = False
    # nl.var: Beta 1 has no keepdims ("a shape of the input tile's shape with the specified
    # axes removed"); the 0.6.0 stub: "keepdims: currently ignored; result always has
    # keepdims=True shape."
    var_always_keepdims: bool = False
    # nl.rms_norm's compute_dtype: Beta 1 "currently `dtype` and `compute_dtype` behave the
    # same, both sets internal compute and return dtype"; the 0.6.0 stub: dtype "if not
    # specified, it will default to be the same as the data type of the input tile",
    # compute_dtype "(optional) dtype for the internal computation".
    rms_norm_compute_internal: bool = False


BETA1 = Rules()


@dataclass(slots=True, eq=False)
class Run:
    arch: Arch
    checks: frozenset
    trace: Trace
    kernel_name: str = ""
    loops: list = field(default_factory=list)       # active Loop stack, outermost first
    epoch: int = 1
    next_epoch: int = 2
    next_loop_id: int = 1
    # epoch -> (parent epoch, loop id, loop kind, iteration); epoch 1 is the kernel body
    epochs: dict = field(default_factory=lambda: {1: (0, 0, "kernel", 0)})
    grid: tuple = ()
    program_ids: tuple = ()
    shared_hbm: list = field(default_factory=list)   # shared_hbm tensors, in creation order
    shared_hbm_cursor: int = 0
    hbm_made: list = field(default_factory=list)     # its first HBM allocations (until it ends)
    nesting: int = 0                                   # depth of kernel-calls-kernel
    memory: object = None                             # nkisim.memory.Memory
    sbuf_bytes: object = None                         # np.ndarray (P, bytes) for direct alloc
    psum_bytes: object = None
    allocated_kernel: bool = False                    # uses direct allocation
    direct_sites: dict = field(default_factory=dict)  # traced placements (tensor._traced_base)
    warned: set = field(default_factory=set)
    last_fresh: object = None                         # result tile of the latest instruction
    device_prints: list = field(default_factory=list)
    # buffers per allocation site in affine_range loops (1: iterations serialize on one buffer)
    multi_buffer: int = 1
    spmd: object = None                               # the grid's pseudo-Loop (kind "spmd")
    par_cache: tuple = (0, ())                        # (epoch, parallel loops): nkisim.checks
    assoc: object = None                              # Allocation under `acc += x` (checks)
    alu: object = None                  # tensor_tensor's ALU op while it reads (checks)
    into: object = None                               # the dst the next result is written
    #                                                   into (ops.result_tile, nki.isa._direct)
    direct: object = None                             # into's write begun by tensor.begin_direct
    #                                                   (its result computed in place)
    stationaries: dict = field(default_factory=dict)  # kept operand copies (stationaries,
    #                                                   transposes: nkisim.engines._kept)
    mirrors: dict = field(default_factory=dict)       # fp32 mirrors of fp16 tiles (engines._f32)
    mirror_bytes: int = 0                             # the bytes of those mirrors
    kept: dict = field(default_factory=dict)          # kind -> copies made (the two caches are
    #                                                   emptied when the run ends; this stays)
    strict: bool = False                              # NKISIM_STRICT=1: tolerated rules raise
    taint: object = None                              # uninitialized values read by the current
    #                                                   instruction (nkisim.tensor.read/write)
    rng: object = None                                # nl.rand / dropout generator (nl._rng)
    no_reorder: int = 0                               # depth of `with nl.no_reorder():`
    vector_acc: dict = field(default_factory=dict)    # VectorE accumulators (isa._accumulate)
    rules: Rules = BETA1                              # the launching face's language rules
    # (shape, dtype, buffer, nl api) -> tensor._TileSpec: tile shapes validated (issue 12)
    alloc_specs: dict = field(default_factory=dict)
    lnc: object = None                                # nkisim.lnc.Instances of a multi-
    #                                                   instance launch (None: one instance)
    # program instances' overlapping writes of other values, decided at the end of the phase
    # (nkisim.checks.settle_spmd_writes)
    spmd_pending: list = field(default_factory=list)

    # ---- loops and epochs ----
    def new_epoch(self, loop: Loop, iteration: int) -> int:
        e = self.next_epoch
        self.next_epoch += 1
        self.epochs[e] = (loop.parent_epoch, loop.id, loop.kind, iteration)
        return e

    def begin_program(self, program_id: tuple, func=None) -> None:
        """Start SPMD instance ``program_id`` (``kernel[grid]``): a fresh epoch under the grid's
        pseudo-loop, so instances are checked like iterations of an ``affine_range``."""
        lp = self.spmd
        if lp is None:
            code = getattr(func, "__code__", None)
            lp = self.spmd = Loop(id=self.next_loop_id, kind="spmd",
                                  file=code.co_filename if code else "",
                                  line=code.co_firstlineno if code else 0)
            self.next_loop_id += 1
        lp.iteration = tuple(program_id)
        e = self.new_epoch(lp, lp.iteration)
        if lp.first_epoch == 0:
            lp.first_epoch = e
        lp.epoch = e
        self.epoch = e

    def record(self, op, engine, reads, writes, dtype, partitions, free, detail=None,
               site=None) -> Instr:
        """Append an instruction to the trace. ``site``: its (file, line) when the caller
        already knows the kernel's line (the result tile's allocation site)."""
        file, line = caller_location() if site is None else site
        stack = self.loops
        if not stack:
            loops = ()
        else:           # the innermost loop keeps the stack's tuple for its current iteration
            loops = stack[-1].key
            if stack[-1].epoch != self.epoch or len(loops) != len(stack):
                loops = tuple((lp.id, lp.kind, lp.iteration) for lp in stack)
        instrs = self.trace.instrs
        instr = Instr(op, engine, reads if type(reads) is tuple else tuple(reads),
                      writes if type(writes) is tuple else tuple(writes), dtype, partitions,
                      free, detail if detail is not None else {}, loops, file, line,
                      len(instrs))
        instrs.append(instr)               # (Trace.append, inline)
        self.taint = None                  # the instruction is complete (nkisim.tensor.read)
        # lifetimes of the tiles it touches: a clock tick, then Memory._stamp (nkisim.memory)
        memory = self.memory
        memory.clock += 1
        if TOUCHED:
            memory._stamp(memory.clock)
        return instr

    def warn(self, key, message: str, site=None) -> None:
        """A suspicious-pattern warning, once per kind of pattern per source line per run.

        ``key`` is a tuple whose first item names the pattern (``"psum_dtype"``, ``"flow"``...);
        the rest is ignored for deduplication: a loop body warns once, not once per iteration.
        ``site``: the kernel's (file, line) when it is not the caller's (a deferred check).
        """
        self._warn_once(key, errors.SUSPICIOUS_PREFIX + message, errors.NKIWarning, site)

    def rule(self, key, what: str, rule: str, link: str, site=None) -> None:
        """A documented NKI rule the device is known to tolerate: an ``NKIRuleWarning`` quoting
        the rule and its link (once per pattern per source line), or, in strict mode
        (``NKISIM_STRICT=1``), the error ``nkisim_strict_rule``. ``site``: the kernel's (file,
        line) when it is not the caller's (a check made when the kernel ends)."""
        if self.strict:
            raise errors.nki_error("nkisim_strict_rule", what=what, rule=rule, link=link)
        self._warn_once(key, errors.rule_text(what, rule, link), errors.NKIRuleWarning, site)

    def _warn_once(self, key, text: str, category, site=None) -> None:
        """Warn at the kernel's source line, once per pattern (``key``'s first item) and line."""
        if "warnings" not in self.checks:
            return
        file, line = caller_location() if site is None else site
        site = (key[0] if isinstance(key, tuple) else key, file, line)
        if site in self.warned:
            return
        self.warned.add(site)
        import warnings
        # (one registry for every run: under Python's default filter a script that runs the
        # same kernel twice, baremetal then benchmark, sees each warning once)
        warnings.warn_explicit(text, category, file or "<kernel>", line or 0,
                               registry=_WARNING_REGISTRY)


_WARNING_REGISTRY: dict = {}


_current: list = []          # stack of active Runs (a kernel may simulate another: rare)


def current() -> Run:
    if not _current:
        raise errors.nki_error("err_nki_api_outside_of_nki_kernel")
    return _current[-1]


def maybe_current() -> Run | None:
    return _current[-1] if _current else None


def push(run: Run) -> None:
    _current.append(run)


def pop() -> None:
    _current.pop()


def strict_from_env() -> bool:
    """``NKISIM_STRICT=1`` (also set by ``nkisim run --strict`` and ``pytest --nki-strict``)."""
    return os.environ.get("NKISIM_STRICT", "").strip().lower() not in ("", "0", "false", "no")


def new_run(target: str | None = None, checks=None, kernel_name: str = "",
            strict: bool | None = None) -> Run:
    arch = get_arch(target)
    if checks is None:
        checks = parse_checks(os.environ.get("NKISIM_CHECKS"))
    elif isinstance(checks, str):
        checks = parse_checks(checks)
    else:
        checks = frozenset(checks)
    from .memory import Memory
    run = Run(arch=arch, checks=checks, trace=Trace(target=arch.name, kernel=kernel_name),
              kernel_name=kernel_name)
    run.memory = Memory(run)
    run.strict = strict_from_env() if strict is None else bool(strict)
    return run
