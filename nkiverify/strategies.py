"""Hypothesis strategies for kernel cases within the hardware's limits.

Limits come from ``nkisim.arch`` (the partition count, the matmul moving free size, the usable
SBUF per partition), not restated here, so a strategy for trn1 and one for trn2 differ exactly
where the targets do. Shapes are kept small enough that a drawn case simulates in well under a
second; every size bound is a keyword argument.

Values: a case carries a ``seed`` and a ``dist`` (``uniform`` [0, 1) as the course harness,
signed ``normal``, ``tiny`` ~1e-3, ``large`` ~1e3) and ``nkiverify.registry`` draws the arrays
from them, which is fast for the 100k-element inputs a conv needs. For small arrays where
shrinking element values matters, :func:`float_arrays` draws every element with hypothesis,
including bfloat16 (:func:`bf16_arrays`), which ``hypothesis.extra.numpy`` cannot infer.

    @given(case=strategies.kernel_cases("conv2d", dtype="float16", contract="course"))
    def test_conv(case): ...

Contracts. ``contract="hardware"`` draws every shape the hardware allows (what our kernels
handle: 1x1 to 5x5 filters, pool 3, vector lengths that are no multiple of 128);
``contract="course"`` only what the course's kernels must handle (cs149-assignment §1, §2;
docs/course-contract.md): a 3x3 filter, pool 1 or 2 dividing the output height, C_in/C_out
multiples of 128, output width <= 512; vector add naive n <= 128, tiled n a multiple of 128,
stream n a multiple of 128*200 (the handout's FREE_DIM=200 must divide n/128); transpose M, N
multiples of 128.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .contract import COURSE_STREAM_FREE_DIM, Limits, in_course_contract, limits  # noqa: F401
from .registry import DISTS, dtype_of

DTYPES = ("float32", "float16", "bfloat16")
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class KernelCase:
    """A drawn case: run ``kernel`` on ``params`` in ``dtype`` with inputs from (seed, dist)."""

    kernel: str
    params: dict = field(hash=False)
    dtype: str
    seed: int
    dist: str

    @property
    def id(self) -> str:
        p = ",".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kernel}[{p}]-{self.dtype}-{self.dist}-seed{self.seed}"


# ---- scalars ------------------------------------------------------------------------------

def dtypes(allowed=DTYPES) -> st.SearchStrategy[str]:
    return st.sampled_from(tuple(allowed))


def dists(allowed=DISTS) -> st.SearchStrategy[str]:
    return st.sampled_from(tuple(allowed))


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


# ---- shapes per kernel family -------------------------------------------------------------

CONTRACTS = ("course", "hardware")


def _check_contract(contract: str) -> str:
    if contract not in CONTRACTS:
        raise ValueError(f"contract must be one of {CONTRACTS}, got {contract!r}")
    return contract


def vector_add_params(kernel: str = "stream", *, target: str | None = None,
                      max_tiles: int = 24, max_stream_cols: int = 4200,
                      contract: str = "hardware") -> st.SearchStrategy[dict]:
    """``{"n": n}`` for a vector-add kernel.

    ``naive`` holds one element per partition: 1..pmax. ``tiled`` takes any length (its last
    chunk may be short): 1..max_tiles*pmax. ``stream`` views the vector as (pmax, n/pmax): any
    multiple of pmax up to ``max_stream_cols`` columns, wider than a kernel's free-dim tile
    usually is, so partial last tiles are drawn too.
    """
    lim = limits(target)
    if _check_contract(contract) == "course" and kernel in ("tiled", "stream"):
        step = lim.pmax * (COURSE_STREAM_FREE_DIM if kernel == "stream" else 1)
        top = max(1, (max_tiles * lim.pmax if kernel == "tiled"
                      else max(max_stream_cols * lim.pmax, 10 * step)) // step)
        return st.builds(lambda t: {"n": t * step}, st.integers(1, top))
    if kernel == "naive":
        n = st.integers(1, lim.pmax)
    elif kernel == "tiled":
        n = st.integers(1, max_tiles * lim.pmax)
    elif kernel == "stream":
        n = st.integers(1, max_stream_cols).map(lambda t: t * lim.pmax)
    else:
        raise ValueError(f"not a vector-add kernel: {kernel!r}")
    return st.builds(lambda v: {"n": v}, n)


def transpose_params(*, target: str | None = None, max_tiles: int = 4) -> st.SearchStrategy[dict]:
    """``{"m": M, "n": N}``, both multiples of pmax (the kernel's contract), square or not."""
    lim = limits(target)
    tiles = st.integers(1, max_tiles)
    return st.builds(lambda a, b: {"m": a * lim.pmax, "n": b * lim.pmax}, tiles, tiles)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# Output widths just past where 512 // out_w (rows per 2 KiB fp32 PSUM bank) drops: 4 -> 3, 3 ->
# 2, 2 -> 1, and the widest row (hypothesis's integers favour small values, so these are drawn
# by name as well)
_ROW_GROUP_EDGES = (129, 171, 257, 512)


@st.composite
def conv2d_params(draw, *, dtype="float32", target: str | None = None, max_channel_tiles=2,
                  filters=None, max_out_h=10, max_out_w=20, max_batch=2,
                  max_pool=None, contract: str = "hardware", wide=None) -> dict:
    """Parameters of ``fused_conv2d_maxpool`` within the kernel's contract (cs149 §2):

    C_in, C_out multiples of pmax with the weights fitting in SBUF; a square K x K filter; stride
    1, no padding; output width at most ``gemm_moving_fmax``; a pool size dividing the output
    height (and at most the output width); bias or zeros.

    ``wide`` (default: for the course contract): the output width is drawn, as often as not,
    from ``max_out_w`` .. ``gemm_moving_fmax`` too (1-4 rows, one image). A student's kernel
    groups output rows per PSUM tile by ``512 // out_w``: widths past 128, 170 and 256 leave 3,
    2 and 1 rows per tile,
    which is where row-grouping bugs live (a property run found three in valid-looking student
    kernels: zero rows per tile at widths 131 and 259, two 258-column rows in one 2 KiB bank);
    below 20 they never show.
    """
    course = _check_contract(contract) == "course"
    if filters is None:
        filters = (3,) if course else (1, 2, 3, 5)
    if max_pool is None:
        max_pool = 2 if course else 3
    lim = limits(target)
    ks = [k for k in filters if lim.weights_fit(lim.pmax, lim.pmax, k, dtype)]
    if not ks:
        raise ValueError(f"no filter size in {filters} fits SBUF on {lim.target}")
    k = draw(st.sampled_from(ks))
    c_in = draw(st.sampled_from([t * lim.pmax for t in range(1, max_channel_tiles + 1)
                                 if lim.weights_fit(t * lim.pmax, lim.pmax, k, dtype)]))
    fitting = [t * lim.pmax for t in range(1, max_channel_tiles + 1)
               if lim.weights_fit(c_in, t * lim.pmax, k, dtype)]
    c_out = draw(st.sampled_from(fitting))
    top = min(max_out_w, lim.gemm_moving_fmax)
    if (course if wide is None else wide) and top < lim.gemm_moving_fmax and \
            draw(st.booleans()):
        # wide: 1 or 2 rows per PSUM bank, so a few rows reach every row-group remainder
        # (and keep a drawn case cheap: about 0.1 s of simulation)
        edges = [w for w in _ROW_GROUP_EDGES if top < w <= lim.gemm_moving_fmax]
        out_w = draw(st.one_of(st.sampled_from(edges), st.integers(top + 1,
                                                                   lim.gemm_moving_fmax))
                     if edges else st.integers(top + 1, lim.gemm_moving_fmax))
        out_h = draw(st.integers(1, min(max_out_h, 4)))
        max_batch = 1
    else:
        out_w = draw(st.integers(1, top))
        out_h = draw(st.integers(1, max_out_h))
    pools = [p for p in _divisors(out_h) if p <= min(out_w, max_pool)]
    pool = draw(st.sampled_from(pools))
    return {"batch": draw(st.integers(1, max_batch)), "c_in": c_in, "c_out": c_out,
            "height": out_h + k - 1, "width": out_w + k - 1, "k": k,
            "bias": draw(st.booleans()), "pool": pool}


def kernel_params(kernel: str, *, dtype="float32", target: str | None = None,
                  contract: str = "hardware", **bounds) -> st.SearchStrategy[dict]:
    if kernel in ("naive", "tiled", "stream"):
        return vector_add_params(kernel, target=target, contract=contract, **bounds)
    if kernel == "transpose":
        _check_contract(contract)       # the course asserts multiples of 128, as the hardware
        return transpose_params(target=target, **bounds)
    if kernel == "conv2d":
        return conv2d_params(dtype=dtype, target=target, contract=contract, **bounds)
    raise ValueError(f"unknown kernel {kernel!r}")


@st.composite
def kernel_cases(draw, kernel: str, *, dtype: str | None = None, target: str | None = None,
                 dist: str | None = None, contract: str = "course", **bounds) -> KernelCase:
    """A whole case: parameters within ``contract`` ("course": what the course's kernels must
    handle, the default; "hardware": every shape the hardware allows), a dtype (fixed or
    drawn), a seed, a magnitude."""
    dt = dtype if dtype is not None else draw(dtypes())
    params = draw(kernel_params(kernel, dtype=dt, target=target, contract=contract, **bounds))
    d = dist if dist is not None else draw(dists())
    return KernelCase(kernel, params, dt, draw(seeds()), d)


# ---- element-wise arrays ------------------------------------------------------------------

def _bf16_round(x: float) -> float:
    return float(ml_dtypes.bfloat16(x))


def bf16_arrays(shape, *, min_value: float = -1e3, max_value: float = 1e3,
                allow_subnormal: bool = True) -> st.SearchStrategy[np.ndarray]:
    """bfloat16 arrays of ``shape`` with finite elements in [min_value, max_value].

    hypothesis cannot build ``ml_dtypes.bfloat16`` elements itself; we draw float32 elements,
    round each to the nearest bf16 (exactly representable in float32, so
    ``hypothesis.extra.numpy`` accepts it) and cast the array.
    """
    info = ml_dtypes.finfo(BFLOAT16)
    lo = max(min_value, -float(info.max))
    hi = min(max_value, float(info.max))
    elements = st.floats(lo, hi, width=32, allow_nan=False, allow_infinity=False,
                         allow_subnormal=allow_subnormal).map(_bf16_round).filter(
        lambda v: lo <= v <= hi)
    return hnp.arrays(np.float32, shape, elements=elements).map(lambda a: a.astype(BFLOAT16))


def float_arrays(dtype, shape, *, min_value: float = -1e3, max_value: float = 1e3,
                 allow_subnormal: bool = True) -> st.SearchStrategy[np.ndarray]:
    """Finite float arrays of ``dtype`` (float32, float16 or bfloat16), elements in range."""
    dt = dtype_of(dtype)
    if dt == BFLOAT16:
        return bf16_arrays(shape, min_value=min_value, max_value=max_value,
                           allow_subnormal=allow_subnormal)
    info = np.finfo(dt)
    # bounds must be representable at the dtype's width: round them inward-safe
    lo = float(dt.type(max(min_value, -float(info.max))))
    hi = float(dt.type(min(max_value, float(info.max))))
    elements = st.floats(lo, hi, width=8 * dt.itemsize, allow_nan=False, allow_infinity=False,
                         allow_subnormal=allow_subnormal)
    return hnp.arrays(dt, shape, elements=elements)
