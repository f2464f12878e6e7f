"""What the course's kernels must handle, and the hardware limits drawn cases respect, without
hypothesis (nkiverify.strategies draws from them; ``nki-verify`` marks the cases beyond the
course's contract with them and starts faster without importing hypothesis).

Limits come from ``nkisim.arch``; the contract is docs/course-contract.md (cs149-assignment
§1, §2).
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import dtype_of

COURSE_STREAM_FREE_DIM = 200     # the handout's largest FREE_DIM for n = 25600 (cs149 §1)


@dataclass(frozen=True)
class Limits:
    """The hardware limits a kernel case must respect, from ``nkisim.arch``."""

    target: str
    pmax: int                  # partitions (tile_size.pmax)
    gemm_moving_fmax: int      # widest matmul moving operand = max conv output width
    sbuf_usable_bytes: int     # per partition

    def weights_fit(self, c_in: int, c_out: int, k: int, dtype="float32") -> bool:
        """Do the conv weights (C_out x C_in x K x K) fit in SBUF, spread over the partitions?

        The course guarantees "weights fit in SBUF" (cs149-assignment §2): C_out*C_in*K*K
        elements of ``dtype`` over ``pmax`` partitions within the usable bytes per partition.
        """
        per_partition = c_out * c_in * k * k * dtype_of(dtype).itemsize / self.pmax
        return per_partition <= self.sbuf_usable_bytes


def limits(target: str | None = None) -> Limits:
    from nkisim.arch import get_arch
    a = get_arch(target)
    return Limits(a.name, a.pmax, a.gemm_moving_fmax, a.sbuf_usable_bytes)


def in_course_contract(kernel: str, params: dict, target: str | None = None) -> bool:
    """Whether ``params`` are within what the course's ``kernel`` (naive, tiled, stream,
    transpose, conv2d) must handle: the "course" contract the strategies draw from
    (docs/course-contract.md; cs149-assignment §1, §2). Cases beyond it (a tiled n that is not
    a multiple of 128, a 5x5 filter, pool 3...) test robustness the course does not ask for."""
    lim = limits(target)
    if kernel == "naive":
        return params["n"] <= lim.pmax
    if kernel == "tiled":
        return params["n"] % lim.pmax == 0
    if kernel == "stream":
        return params["n"] % (lim.pmax * COURSE_STREAM_FREE_DIM) == 0
    if kernel == "transpose":
        return params["m"] % lim.pmax == 0 and params["n"] % lim.pmax == 0
    if kernel == "conv2d":
        k, pool = params["k"], params.get("pool", 1)
        out_h, out_w = params["height"] - k + 1, params["width"] - k + 1
        return (k == 3 and pool in (1, 2) and out_h % pool == 0
                and params["c_in"] % lim.pmax == 0 and params["c_out"] % lim.pmax == 0
                and out_w <= lim.gemm_moving_fmax)
    return True
