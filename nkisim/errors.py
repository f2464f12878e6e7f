"""NKI errors: one table of codes, exception classes and messages.

Messages follow the format observed on a real neuronx-cc 2.26 run (ref §2.1):
``<message>. Info on how to fix: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/api/nki.errors.html#<code-with-hyphens>``.
Exception classes follow ref §2.1 (observed ValueError for the partition limit; the others per the
third-party notes the reference lists). Raised exceptions are the built-in classes (so ``except
ValueError`` works as with the real compiler) carrying ``nki_code``.

Limits the docs give no code for (PSUM bank size, matmul tile limits, buffers of operands, dtypes,
tile rank, SBUF/PSUM capacity) use nkisim's own codes prefixed ``nkisim_``; their messages quote the
documented rule and have no docs link.
"""

from __future__ import annotations

import os
import sys

DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/api/nki.errors.html"


class NKISyntaxError(SyntaxError):
    """The NKI front end's syntax error class (ref §2.1, "NKISyntaxError")."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.msg = msg

    def __str__(self) -> str:
        return self.msg


# code -> (exception class, message template). Templates use str.format fields.
ERRORS: dict[str, tuple[type[Exception], str]] = {
    # --- documented codes (ref §2.1) ---
    "err_1d_arange_not_supported": (
        NKISyntaxError, "indexing tensor `{name}` with 1d arange is not supported"),
    "err_activation_bias_invalid_type": (
        TypeError, "Bias parameter of activation or activation_reduce must be a vector of type "
        "float32, float16, or bfloat16"),
    "err_activation_scale_invalid_type": (
        TypeError, "Scale parameter of activation or activation_reduce must be a scalar or "
        "vector of type float32"),
    "err_activation_scale_scalar_or_vector": (
        NKISyntaxError, "Scale parameter of activation must be either a scalar value or a 1D "
        "vector spanning the partition dimension"),
    "err_ambiguous_tensor_truth_value": (
        ValueError, "Cannot evaluate truth value of a multi-element tensor/array"),
    "err_annotation_shape_mismatch": (
        TypeError, "shape of `{name}{shape}` does not match the expected shape of {expected}"),
    "err_bias_tensor_must_be_specified_in_allocation": (
        NKISyntaxError, "Bias tensor of an activation op must be specified in allocated NKI "
        "kernels"),
    "err_cannot_assign_to_index": (TypeError, "'index' tensor does not support item assignment"),
    "err_cannot_update_immutable_parameter": (
        TypeError, "Cannot update immutable parameter `{name}`"),
    "err_control_flow_condition_depending_on_arange": (
        NKISyntaxError, "Control-flow depending on `nl.arange` or `nl.mgrid` is not supported"),
    "err_dynamic_control_flow_not_supported": (
        NKISyntaxError, "dynamic control-flow depending on tensor value is not supported"),
    "err_exceed_max_supported_dimension": (
        ValueError, "parameter '{param}{shape}' of '{api}' exceed max supported number of "
        "dimensions of {limit}"),
    "err_failed_to_infer_tile_from_local_tensor": (
        TypeError, "Failed to infer tile from tensor '{name}', the first dimension of a tile "
        "must be the partition dimension"),
    "err_hbm_tensor_with_init_value_not_supported": (
        NKISyntaxError, "Creating HBM tensor with init value is not supported"),
    "err_copy_dynamic_indirect_indices_not_natively_supported": (
        # (the docs give no message: nkisim's, with the documented remedy)
        NKISyntaxError, "Indexing {buffer} tile '{name}' with a tile of runtime indices is not "
        "natively supported: indirect indexing reads HBM tensors in nl.load, nl.store and "
        "nisa.dma_copy; within SBUF use nisa.tensor_copy_dynamic_src"),
    "err_indirect_indices_free_dim": (
        NKISyntaxError, "Dynamic indexing for load/store only supports the indirect indexing "
        "to be on the partition or block dimension"),
    "err_leading_dimension_of_tensor_must_be_partition": (
        NKISyntaxError, "The leading dimension of SBUF/PSUM tensors must be the partition "
        "dimension"),
    "err_local_variable_used_out_of_scope": (
        NKISyntaxError, "Local variable '{name}' is referenced outside of its parent scope "
        "(loop at line {line}); a tile allocated in a loop body lives for one iteration: "
        "allocate it before the loop and update it with `{name}[...] = ...`"),
    "err_mutable_parameter_not_returned": (
        NKISyntaxError, "Mutable kernel parameter `{name}` not returned by `return` statement"),
    "err_nested_kernel_with_spmd_grid": (
        NKISyntaxError, "Calling kernel with spmd grid ({name}{grid}) inside another kernel is "
        "not supported"),
    "err_nki_api_outside_of_nki_kernel": (
        RuntimeError, "Calling NKI API outside of NKI kernels is not supported"),
    "err_num_partition_exceed_arch_limit": (
        ValueError, "number of partitions {n} exceed architecture limitation of {limit}"),
    "err_num_partition_mismatch": (
        ValueError, "number of partitions (dimension 0 size of a tile) mismatch in parameters "
        "({params}) of '{api}'"),
    "err_shared_hbm_must_in_kernel_level": (
        RuntimeError, "shared_hbm buffer can only be created top level kernel scope"),
    "err_size_of_dimension_exceed_arch_limit": (
        ValueError, "size of dimension {dim} in '{param}{shape}' of '{api}' exceed architecture "
        "limitation of {limit}"),
    "err_store_dst_shape_smaller_than_other_shape": (
        ValueError, "Illegal assignment destination shape in 'a = b': shape {dst} of parameter "
        "'a' is smaller than other parameter shapes b{src}"),
    "err_tensor_access_out_of_bound": (
        IndexError, "Out-of-bound access for tensor `{name}` on dimension {dim}: index range "
        "[{lo}, {hi}] exceed dimension size of {size}"),
    "err_tensor_creation_on_scratchpad_with_init_value_not_supported": (
        NKISyntaxError, "Creating SBUF/PSUM tensor with init value is not supported in "
        "allocated NKI kernels"),
    "err_tensor_output_not_written_to": (
        ValueError, "Output tensor `{name}` was never written to: {region} of shape {shape} "
        "holds no value written by the kernel (unwritten outputs hold garbage on device)"),
    "err_transpose_on_tensor_engine_not_allowed_in_allocated_kernel": (
        NKISyntaxError, "Transpose on tensor engine is not allowed in allocated NKI kernels"),
    "err_unexpected_output_dependencies": (
        NKISyntaxError, "Unexpected output dependencies, different iterations of {loop} "
        "write to `{name}{region}`{detail}"),
    "err_unsupported_expression_in_mask": (
        ValueError, "NKI mask expressions must be affine expressions of static loop indices"),
    "err_unsupported_memory": (
        TypeError, "Expected operand '{param}' of '{api}' to be in address space '{expected}', "
        "but got a tile in '{got}' instead"),
    "err_unsupported_mixing_basic_advanced_tensor_indexing": (
        NKISyntaxError, "Mixing basic tensor indexing and advanced tensor indexing is not "
        "supported"),
    "err_while_loop_requires_unconditional_entry": (
        ValueError, "Traditional while loops are not supported - use do-while pattern instead"),
    # --- limits with no documented code (nkisim_*; the rule quoted from the reference) ---
    "nkisim_insufficient_rank": (
        ValueError, "Insufficient rank: {buffer} tensor '{name}' of shape {shape} must have at "
        "least 2 dimensions (partition, free); use ({n}, 1) instead (ref: NKI known issues)"),
    "nkisim_psum_bank_overflow": (
        ValueError, "PSUM tile '{name}{shape}' ({dtype}) needs {nbytes} bytes per partition, "
        "more than one {bank} byte PSUM bank; a PSUM tile cannot span multiple PSUM banks "
        "(at most {fmax} fp32 elements per partition)"),
    "nkisim_psum_tile_overflow": (
        ValueError, "PSUM tile '{name}{shape}' ({dtype}) needs {nbytes} bytes per partition, "
        "more than PSUM's {limit} bytes per partition"),
    "nkisim_matmul_crosses_psum_bank": (
        ValueError, "'{api}' writes bytes {start}-{end} of each partition of PSUM tile "
        "'{name}', across a {bank} byte bank boundary: one matmul writes inside one PSUM bank"),
    "nkisim_matmul_stationary_limit": (
        ValueError, "stationary operand '{name}{shape}' of '{api}' exceeds the Tensor Engine "
        "limit: partitions <= 128 and free size <= {limit} (gemm_stationary_fmax)"),
    "nkisim_matmul_moving_limit": (
        ValueError, "moving operand '{name}{shape}' of '{api}' has free size {free}, more than "
        "{limit} (gemm_moving_fmax): each nc_matmul writes one 2 KiB PSUM bank"),
    "nkisim_matmul_contraction_mismatch": (
        ValueError, "contraction (partition) sizes of stationary {stat} and moving {mov} of "
        "'{api}' differ"),
    "nkisim_nl_matmul_shapes": (
        # (err_param_shape_incompatible_with_matmul has no documented message: reference §1.8)
        ValueError, "nl.matmul(x{x}, y{y}{tx}): {why}"),
    "nkisim_operand_dtype": (
        TypeError, "operand '{param}' of '{api}' has dtype {dtype}; expected one of the "
        "following dtypes: {allowed}"),
    "nkisim_both_inputs_psum": (
        TypeError, "'{api}' cannot read both inputs from PSUM; legal input buffers are "
        "SBUF+SBUF, SBUF+PSUM and PSUM+SBUF"),
    "nkisim_shape_mismatch": (
        ValueError, "Parameter shapes ({params}) of '{api}' has mismatched shapes: {why}"),
    "nkisim_empty_tensor": (
        ValueError, "{what} '{name}' has shape {shape}: {kind} (every dimension of an NKI tensor "
        "must be at least 1; skip the kernel call for empty inputs)"),
    "nkisim_sbuf_overflow": (
        RuntimeError, "SBUF overflow: live tensors need {need} bytes per partition, more than "
        "the {limit} usable bytes per partition of {target} (the device compiler would fail "
        "with \"couldn't be allocated in SB\"). Largest live tensors: {largest}"),
    # one instruction's SBUF operands: the allocator cannot spill an operand of the instruction
    # that reads it (GCA035, aws-neuron-sdk #1060: "Instruction: I-21-0 with opcode: TensorTensor
    # couldn't be allocated in SB ... Total Accessed Bytes per partition by instruction: 198024
    # Total SB Partition Size: 196608")
    "nkisim_instruction_sbuf_overflow": (
        RuntimeError, "SBUF overflow: '{api}' at {where} needs its SBUF operands at once, "
        "{need} bytes per partition, more than the {limit} bytes of an SBUF partition of "
        "{target} (the device compiler fails with GCA035 \"couldn't be allocated in SB\"). "
        "Its SBUF operands: {largest}"),
    # kernels under @nki.compiler.enable_stack_allocator: that allocator reports an overflow
    # instead of spilling (the messages of err_stack_overflow_sbuf/_psum, which nki-reference
    # §2.2 lists as unofficial templates, not on the error docs page)
    "nkisim_stack_overflow_sbuf": (
        RuntimeError, "stack overflow: required sbuf size {need} exceeds available sbuf size "
        "{limit} (bytes per partition of {target}; @nki.compiler.enable_stack_allocator does "
        "not spill). Largest live tensors: {largest}"),
    "nkisim_stack_overflow_psum": (
        RuntimeError, "required psum banks {need} exceeds available psum banks {limit} "
        "(@nki.compiler.enable_stack_allocator does not spill). Live PSUM tensors: {largest}"),
    "nkisim_uninitialized_read": (
        ValueError, "read of uninitialized memory: '{api}' at {where} reads `{name}{region}` "
        "({count} of {total} elements never written)"),
    "nkisim_loop_carried_dependency": (
        ValueError, "loop-carried dependency in {loop}: '{api}' at {where} in {it} reads "
        "`{name}{region}`, written by {other}; the iterations may run in any order on the "
        "device: give each iteration its own tile or slice, or use nl.sequential_range"),
    # a Python number a Beta 1 loop body reads and changes (nkisim.frontend.carried_names):
    # the front end runs the body once, so the device's every iteration sees its value from
    # before the loop (NKI migration guide, "Consistent control flow behavior")
    "nkisim_python_state_in_loop": (
        ValueError, "Python variable `{name}` changes from one iteration of the `{var}` loop "
        "({kind} at {where}) to the next ({before!r}, then {after!r}): the NKI Beta 1 front end "
        "runs a loop body once, with a symbolic `{var}` (\"loops were only executed once by the "
        "Python evaluator\", NKI migration guide), so on the device every iteration sees `{name}` "
        "as it was before the loop; compute it from `{var}` (e.g. `{var} * 128`), or unroll the "
        "loop with nl.static_range"),
    # the same, for a number the body only updates and the code after the loop reads
    "nkisim_python_state_after_loop": (
        ValueError, "Python variable `{name}` changes from one iteration of the `{var}` loop "
        "({kind} at {where}) to the next ({before!r}, then {after!r}) and is read after the "
        "loop: the NKI Beta 1 front end runs a loop body once (\"`val += 1` in `for i in "
        "range(8)` will print 1\", NKI migration guide), so on the device `{name}` after the "
        "loop holds its value after one iteration; compute it from the loop bounds (e.g. "
        "`n = len(range(...))`), or unroll the loop with nl.static_range"),
    # ... and a Python list the body grows (`parts.append(t)`) and the code after the loop reads
    "nkisim_python_list_in_loop": (
        ValueError, "Python list `{name}` grows from one iteration of the `{var}` loop ({kind} "
        "at {where}) to the next ({before} items, then {after}) and is read after the loop: "
        "the NKI Beta 1 front end runs a loop body once, so on the device `{name}` gets the "
        "body's items once, not once per iteration; keep the results in one tile indexed by "
        "the loop variable (e.g. `buf[:, {var}, :]`), or unroll the loop with nl.static_range"),
    "nkisim_unsupported": (NotImplementedError, "{what} is not supported by nkisim: {why}"),
    # a documented rule the device tolerates, made an error by strict mode (see NKIRuleWarning)
    "nkisim_strict_rule": (
        ValueError, "strict mode (NKISIM_STRICT=1): documented NKI rule broken (the device "
        "tolerates it; without strict mode this is a warning): {what}; the rule: \"{rule}\" "
        "({link})"),
    "nkisim_invalid_argument": (ValueError, "{api}: {why}"),
    # an on-chip tile indexed with anything but a contiguous run of partitions (Beta 1
    # programming model, "Advanced Tensor Indexing"; nki-aps.rst, "Restriction on SBUF/PSUM
    # Tensors"; nkisim.tensor._partition_index)
    "nkisim_partition_index": (
        ValueError, "`{name}[...]` {what}: flexible indexing is not supported along the "
        "partition dimension (programming model, \"Advanced Tensor Indexing\"; \"the access on "
        "the partition dimension must be contiguous\", NKI access patterns); index partitions "
        "with a unit-step slice or `start + i_p`, and move data across partitions with "
        "nisa.nc_transpose or a DMA"),
    # a size, loop bound or index that is not an integer: Python's range and slicing and
    # NumPy's shapes raise TypeError for a float (`M / 128` where `M // 128` was meant) or a
    # tuple; nkisim used to truncate the float silently
    "nkisim_not_an_integer": (TypeError, "{what} must be an integer, got {value!r}{hint}"),
    # the logical cores of an LNC 2 launch (nkisim.lnc, nkisim.collectives): a barrier or
    # sendrecv no other instance ever joins would hang the device
    "nkisim_lnc_deadlock": (
        RuntimeError, "deadlock between the program instances of the launch: {detail}; every "
        "instance must reach the same core_barrier / sendrecv calls (same pipe_id) in the "
        "same order"),
    "nkisim_lnc_mismatch": (ValueError, "{what}: {detail}"),
    # nki 0.3+ (shared/spec/nki-current.md §2.0 item 6: MIG 0.2->0.3 "Output tensors must use
    # nl.shared_hbm"; nl.hbm outputs "will cause compilation failures")
    "nkisim_output_not_shared_hbm": (
        ValueError, "kernel output `{name}` is not an nl.shared_hbm tensor: output tensors must "
        "use nl.shared_hbm (nl.ndarray(..., buffer=nl.shared_hbm)); nl.hbm/nl.private_hbm "
        "outputs cause compilation failures from NKI 0.3.0"),
}


def _docs_suffix(code: str) -> str:
    if code.startswith("nkisim_"):
        return ""
    return f" Info on how to fix: {DOCS}#{code.replace('_', '-')}"


def nki_error(code: str, **fields) -> Exception:
    """Build the exception for ``code`` with its documented class and message."""
    cls, template = ERRORS[code]
    msg = template.format(**fields) + "." + _docs_suffix(code)
    exc = cls(msg)
    exc.nki_code = code
    return exc


def shape_str(shape) -> str:
    """Format a shape as NKI messages do: ``[128, 512]``."""
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


class NKIWarning(UserWarning):
    """Suspicious-but-legal patterns nkisim reports (PSUM accumulator dtype, += on SBUF, ...)."""


class NKIRuleWarning(NKIWarning):
    """A documented NKI rule that the device is known to tolerate (its kernels compile and
    compute the right numbers): reported as a warning quoting the rule and its doc link; strict
    mode (``NKISIM_STRICT=1``, ``nkisim run --strict``, ``pytest --nki-strict``) raises
    ``nkisim_strict_rule`` instead (shared/DESIGN.md, "The acceptance principle")."""


# The three kinds of diagnostics (every message says which one it is):
#   error        an exception: the real compiler rejects the code, or the device would compute
#                garbage (race, read of never-written memory, overflowing allocation)
#   rule         NKIRuleWarning "NKI rule the device tolerates: ..." (an error in strict mode)
#   suspicious   NKIWarning "suspicious pattern: ..." (legal code that is often a bug)
RULE_PREFIX = "NKI rule the device tolerates (an error with NKISIM_STRICT=1): "
SUSPICIOUS_PREFIX = "suspicious pattern: "


def rule_text(what: str, rule: str, link: str) -> str:
    """The message of a tolerated-rule warning: what the kernel does, the rule quoted, its link."""
    return f"{RULE_PREFIX}{what}; the rule: \"{rule}\" ({link})"


# The user's line for a diagnostic: the innermost frame outside the nkisim package.
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def caller_location() -> tuple[str, int]:
    """(file, line) of the innermost frame outside the nkisim package: the kernel's line."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
    if f is None:
        return "", 0
    return f.f_code.co_filename, f.f_lineno


def where(file: str, line: int) -> str:
    return f"{os.path.basename(file)}:{line}" if file else "<unknown>"
