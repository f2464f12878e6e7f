"""The instruction trace: one record per executed NKI instruction.

The interpreter appends an :class:`Instr` for every ``nl.*``/``nisa.*`` call that does work on an
engine. The cost model (``cost``), the scheduler (``schedule``), the checkers (``checks``) and the
timeline export (``timeline``) read the trace after the kernel has run; nothing in the trace is
needed to compute values, so recording is kept cheap.

Regions are *physical*: ``key`` identifies the buffer the bytes live in (for an auto-allocated
SBUF/PSUM tile, the allocation site inside its loop body, so a tile re-allocated every iteration
reuses one buffer; for a direct-allocated tile, the SBUF/PSUM itself; for HBM, the tensor's
storage), ``p0:p1`` is the partition range and ``b0:b1`` the byte range inside each partition
(for HBM: ``p0:p1`` is ``0:1`` and ``b0:b1`` the flat byte range). Two regions conflict when they
have the same key and both ranges intersect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# Engine names (the values of nisa.engine, plus the DMA queues)
TENSOR = "tensor"   # TensorE (PE array): nc_matmul, nc_transpose (PE), partition broadcast
VECTOR = "vector"   # VectorE (DVE)
SCALAR = "scalar"   # ScalarE (ACT)
GPSIMD = "gpsimd"   # GpSimdE (POOL)
DMA = "dma"         # the 16 DMA queues
ENGINES = (TENSOR, VECTOR, SCALAR, GPSIMD, DMA)


class Region(NamedTuple):
    # A NamedTuple, not a frozen dataclass: every instruction records about four regions and a
    # frozen dataclass is 3x slower to build (issue 12: "record cheaply"). Same value semantics
    # (immutable, equality and hash by value), attribute access by name.
    buffer: str    # "hbm" | "sbuf" | "psum"
    key: object    # physical buffer identity (see module doc)
    name: str      # tensor name, for messages
    p0: int
    p1: int
    b0: int
    b1: int

    def overlaps(self, other: Region) -> bool:
        return (self.key == other.key and self.p0 < other.p1 and other.p0 < self.p1
                and self.b0 < other.b1 and other.b0 < self.b1)

    @property
    def partitions(self) -> int:
        return self.p1 - self.p0

    @property
    def bytes_per_partition(self) -> int:
        return self.b1 - self.b0


@dataclass(slots=True, eq=False)
class Instr:
    """One executed instruction.

    ``free`` is N of the reference's cost formulas: elements per partition processed by the
    instruction (for matmul: the moving operand's free size; for DMA: elements per partition of
    the destination). ``detail`` carries op-specific facts:

    - nc_matmul: ``K`` (contraction = partitions), ``M`` (stationary free), ``N`` (moving free),
      ``accumulate`` (bool), ``transpose`` (bool, nc_transpose on the PE), ``fp32`` (bool: either
      operand 4-byte), ``flops`` (2*K*M*N, 0 for transposes).
    - dma_copy: ``bytes`` (total), ``src``/``dst`` buffers, ``rows`` (number of contiguous runs
      the transfer is split into, i.e. descriptors), ``row_bytes`` (bytes per contiguous run).
    - vector/scalar/gpsimd ops: ``psum_in`` (an input in PSUM), ``all_16bit`` (all operands
      bf16/fp16), ``contiguous`` (innermost free dim contiguous), ``inputs`` (number of tensor
      inputs).
    """

    op: str                       # NKI API name: "nc_matmul", "dma_copy", "tensor_tensor", ...
    engine: str                   # one of ENGINES
    reads: tuple                  # tuple[Region, ...]
    writes: tuple                 # tuple[Region, ...]
    dtype: str                    # output dtype name ("float32", "bfloat16", ...)
    partitions: int               # P of the instruction
    free: int                     # N: elements per partition
    detail: dict = field(default_factory=dict)
    loops: tuple = ()             # ((loop_id, kind, iteration), ...) outermost first
    file: str = ""
    line: int = 0
    index: int = -1               # position in the trace


@dataclass(slots=True)
class Trace:
    """Everything recorded while one kernel ran."""

    target: str
    instrs: list = field(default_factory=list)
    kernel: str = ""
    # compiler decorators on the kernel (nki.compiler.*), e.g. {"skip_middle_end_transformations":
    # True}: without it the compiler may pipeline affine_range iterations (multi-buffering)
    compiler: dict = field(default_factory=dict)
    # memory accounting filled by nkisim.memory: peak bytes per partition
    peak_sbuf_bytes: int = 0
    peak_psum_banks: int = 0

    def append(self, instr: Instr) -> Instr:
        instr.index = len(self.instrs)
        self.instrs.append(instr)
        return instr

    def __len__(self) -> int:
        return len(self.instrs)
