"""The simulated targets: trn1 (NeuronCore-v2) and trn2 (NeuronCore-v3).

Every number cites docs/nki-reference.md ("ref §x.y"). Select a target with the
``NKISIM_TARGET`` environment variable (``trn1``/``trn2``, also ``gen2``/``gen3``) or with
``platform_target=`` on ``nki.jit``; the default is trn2, the course's instance (ref §0, CS149-25).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

KiB = 1024


@dataclass(frozen=True)
class Arch:
    name: str                 # "trn1" | "trn2"
    nc_version: int           # nisa.nc_version: gen2 = 2, gen3 = 3 (ref §1.10 enums)
    # --- on-chip memories (ref §1.4, §3.1) ---
    pmax: int                 # partitions of SBUF/PSUM (tile_size.pmax)
    sbuf_partition_bytes: int  # physical SBUF bytes per partition
    sbuf_usable_bytes: int     # usable per partition after the compiler's reservation
    psum_partition_bytes: int  # 16 KiB per partition
    psum_bank_bytes: int       # 2 KiB per bank (512 fp32)
    psum_banks: int            # 8
    psum_fmax: int             # 512
    gemm_stationary_fmax: int  # 128
    gemm_moving_fmax: int      # 512
    # --- clocks in GHz (ref §3.1) ---
    tensor_ghz: float
    vector_ghz: float
    scalar_ghz: float
    gpsimd_ghz: float
    base_ghz: float            # profiler "NeuronCore base clock" (ref §3.6)
    # --- peak TensorE throughput per NC, FLOP/s (ref §3.1) ---
    peak_flops_bf16: float
    peak_flops_fp32: float
    # --- DMA (ref §3.1, §3.5) ---
    dma_queues: int            # 16 DMA engines per NC
    dma_bytes_per_ns: float    # per engine: 17 B/ns (trn1), 23 B/ns (trn2) -> 272 / 368 GB/s
    hbm_bytes_per_ns: float    # HBM bandwidth per NC (chip figure / NCs)

    @property
    def vector_elems_per_cycle_16bit(self) -> int:
        # trn2 VectorE: "512 BF16/FP16 input/output; 256 for other types"; trn1: 128 (ref §3.1)
        return 512 if self.nc_version >= 3 else 128


TRN1 = Arch(
    name="trn1", nc_version=2, pmax=128,
    sbuf_partition_bytes=192 * KiB,          # 24 MiB / 128 (ref §3.1; GCA035 message: 196608)
    sbuf_usable_bytes=176 * KiB,             # 192 - 16 KiB compiler-reserved (ref §1.4)
    psum_partition_bytes=16 * KiB, psum_bank_bytes=2 * KiB, psum_banks=8,
    psum_fmax=512, gemm_stationary_fmax=128, gemm_moving_fmax=512,
    tensor_ghz=2.8, vector_ghz=1.12, scalar_ghz=1.4, gpsimd_ghz=1.4, base_ghz=1.4,
    peak_flops_bf16=92e12, peak_flops_fp32=23e12,
    dma_queues=16, dma_bytes_per_ns=17.0,    # 17 B/ns x 16 = 272 GB/s (ref §3.1, §6.4)
    hbm_bytes_per_ns=410.0,                  # 820 GB/s per chip / 2 NCs (ref §3.1)
)

TRN2 = Arch(
    name="trn2", nc_version=3, pmax=128,
    sbuf_partition_bytes=224 * KiB,          # 28 MiB / 128 (ref §3.1)
    # No trn2 reservation is documented (ref §1.4: "Trn2 value not documented (physical
    # 224 KiB)"), and a kernel using 215,572 B per partition (more than 224 - 16 KiB) ran on a
    # trn2 (issue 8, a CS149 solution measured on device): the usable size is the documented
    # physical size until a reservation is documented.
    sbuf_usable_bytes=224 * KiB,
    psum_partition_bytes=16 * KiB, psum_bank_bytes=2 * KiB, psum_banks=8,
    psum_fmax=512, gemm_stationary_fmax=128, gemm_moving_fmax=512,
    tensor_ghz=2.4, vector_ghz=0.96, scalar_ghz=1.2, gpsimd_ghz=1.2, base_ghz=1.2,
    peak_flops_bf16=79e12, peak_flops_fp32=20e12,
    dma_queues=16, dma_bytes_per_ns=23.0,    # 23 B/ns x 16 = 368 GB/s (ref §3.1, §6.4)
    hbm_bytes_per_ns=362.0,                  # 2.9 TB/s per chip / 8 NCs (ref §3.1)
)

TARGETS = {"trn1": TRN1, "gen2": TRN1, "trn2": TRN2, "gen3": TRN2}


def get_arch(name: str | None = None) -> Arch:
    """The Arch for ``name``, else ``$NKISIM_TARGET``, else trn2."""
    key = (name or os.environ.get("NKISIM_TARGET") or "trn2").lower()
    try:
        return TARGETS[key]
    except KeyError:
        raise ValueError(
            f"unknown target {name or key!r}: nkisim simulates {sorted(set(TARGETS))}"
        ) from None
