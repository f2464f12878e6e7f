"""The kernel registry: for each kernel, where it lives and how to check it.

A :class:`KernelSpec` ties a kernel name (``naive``, ``tiled``, ``stream``, ``transpose``,
``conv2d``; the names ``fixtures/configs.py`` and ``nki-verify`` use) to

* the kernel's import path (``kernels.conv2d:fused_conv2d_maxpool``), imported lazily by a
  backend (``nkiverify.backends``) so the right ``neuronxcc.nki`` serves it;
* the input maker: ``(params, dtype, seed, dist) -> Inputs`` (positional args and keyword args
  of the kernel call, in the kernel's dtype);
* the float64 golden model, the low-precision baseline and the reduction length
  (``reference/``), and the magnitude scale the comparator's accumulation allowance grows with.

:func:`run_case` is the pipeline a test and ``nki-verify`` share: inputs -> backend -> golden,
baseline -> ``nkiverify.compare.compare``.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np

DISTS = ("uniform", "normal", "tiny", "large")
TINY = 1e-3
LARGE = 1e3


def dtype_of(name) -> np.dtype:
    """``np.dtype`` for a dtype or a name (``"bfloat16"`` through ml_dtypes)."""
    if isinstance(name, str) and name in ("bfloat16", "bf16"):
        return np.dtype(ml_dtypes.bfloat16)
    if isinstance(name, str) and name in ("fp16", "fp32"):
        return np.dtype({"fp16": np.float16, "fp32": np.float32}[name])
    return np.dtype(name)


def dtype_name(dtype) -> str:
    return dtype_of(dtype).name


def values(rng: np.random.Generator, shape, dtype, dist: str = "uniform", scale: float = 1.0):
    """An array of ``dtype`` drawn as ``dist`` (times ``scale``).

    * ``uniform``: [0, 1), the course harness's ``np.random.rand``;
    * ``normal``: signed N(0, 1);
    * ``tiny``: N(0, 1) x 1e-3 (fp16 subnormals start at 6.1e-5);
    * ``large``: N(0, 1) x 1e3, scaled down if that would not fit the dtype's range with
      headroom for sums.

    Drawn in float32 (for speed, and so every value is exact in float64), then rounded to
    ``dtype`` with round-to-nearest-even.
    """
    dt = dtype_of(dtype)
    if dist == "uniform":
        x = rng.random(shape, dtype=np.float32)
    elif dist in ("normal", "tiny", "large"):
        x = rng.standard_normal(shape, dtype=np.float32)
        if dist == "tiny":
            x *= np.float32(TINY)
        elif dist == "large":
            x *= np.float32(min(LARGE, float(ml_dtypes.finfo(dt).max) / 64))
    else:
        raise ValueError(f"unknown value distribution {dist!r}; known: {', '.join(DISTS)}")
    if scale != 1.0:
        x *= np.float32(scale)
    return x.astype(dt)


def case_seed(case_id: str, dtype) -> int:
    """Deterministic seed of a stored case, independent across cases and dtypes."""
    return zlib.crc32(f"{case_id}:{dtype_name(dtype)}".encode())


@dataclass
class Inputs:
    args: tuple
    kwargs: dict

    @property
    def all_nonnegative(self) -> bool:
        return all(not (a < 0).any() for a in self.args if isinstance(a, np.ndarray))


# ---- vector add ---------------------------------------------------------------------------

def _vector_inputs(params, dtype, seed, dist):
    rng = np.random.default_rng(seed)
    n = int(params["n"])
    return Inputs((values(rng, (n,), dtype, dist), values(rng, (n,), dtype, dist)), {})


def _vector_golden(a, b):
    from reference.vector_add import vector_add
    return vector_add(a, b)


def _vector_baseline(a, b, dtype=None):
    from reference.vector_add import vector_add_baseline
    return vector_add_baseline(a, b, dtype=dtype)


def _vector_scale(inputs, expected):
    a, b = inputs.args
    return np.abs(a.astype(np.float64)) + np.abs(b.astype(np.float64))


# ---- transpose ----------------------------------------------------------------------------

def _transpose_inputs(params, dtype, seed, dist):
    rng = np.random.default_rng(seed)
    return Inputs((values(rng, (int(params["m"]), int(params["n"])), dtype, dist),), {})


def _transpose_golden(a):
    from reference.transpose import matrix_transpose
    return matrix_transpose(a)


def _transpose_baseline(a, dtype=None):
    from reference.transpose import matrix_transpose_baseline
    return matrix_transpose_baseline(a, dtype=dtype)


# ---- conv2d -------------------------------------------------------------------------------

def _conv_inputs(params, dtype, seed, dist):
    """X (B, C_in, H, W), W (C_out, C_in, K, K), bias (C_out,) as the harness draws them.

    For signed distributions the weights are N(0, 1/(C_in*K*K)) so outputs stay O(|X|) and
    fp16 cannot overflow; with ``uniform`` everything is [0, 1) exactly like the harness, and
    ``bias=False`` gives zeros as the harness does.
    """
    rng = np.random.default_rng(seed)
    b, ci, co, h, w, k = (int(params[key]) for key in
                          ("batch", "c_in", "c_out", "height", "width", "k"))
    x = values(rng, (b, ci, h, w), dtype, dist)
    if dist == "uniform":
        wt = values(rng, (co, ci, k, k), dtype, "uniform")
        bias = values(rng, (co,), dtype, "uniform")
    else:
        wt = values(rng, (co, ci, k, k), dtype, "normal", scale=(ci * k * k) ** -0.5)
        bias = values(rng, (co,), dtype, dist)
    if not params.get("bias", False):
        bias = np.zeros((co,), dtype=dtype_of(dtype))
    return Inputs((x, wt, bias), {"pool_size": int(params.get("pool", 1))})


def _conv_golden(X, W, bias, pool_size=1):
    from reference.conv2d import conv2d_maxpool
    # float64 for fp32 kernels, float32 for 16-bit ones (reference.conv2d.golden_dtype)
    return conv2d_maxpool(X, W, bias, pool_size=pool_size, dtype="auto")


def _conv_baseline(X, W, bias, pool_size=1, dtype=None):
    from reference.conv2d import conv2d_maxpool_baseline
    return conv2d_maxpool_baseline(X, W, bias, pool_size=pool_size, dtype=dtype)


def _conv_scale(inputs, expected):
    # With non-negative inputs the golden is its own magnitude scale (sum of |terms|): no need
    # to run the reference a second time on |inputs|.
    if inputs.all_nonnegative:
        return expected
    from reference.conv2d import conv2d_maxpool_scale
    return conv2d_maxpool_scale(*inputs.args, dtype="auto", **inputs.kwargs)


def _conv_reduction(params):
    from reference.conv2d import conv2d_reduction_length
    return conv2d_reduction_length(int(params["c_in"]), int(params["k"]))


# ---- the registry -------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelSpec:
    """How to run and check one kernel (see the module docstring)."""

    name: str
    family: str
    import_path: str
    make_inputs: Callable
    golden: Callable
    baseline: Callable
    reduction_length: Callable     # params -> products summed per output (0: exact copy)
    scale: Callable | None = None  # (inputs, expected) -> magnitude scale, None: max|expected|

    def inputs(self, params, dtype, seed=0, dist="uniform") -> Inputs:
        return self.make_inputs(params, dtype_of(dtype), seed, dist)


KERNELS: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    KERNELS[spec.name] = spec
    return spec


for _name, _attr in (("naive", "vector_add_naive"), ("tiled", "vector_add_tiled"),
                     ("stream", "vector_add_stream")):
    register(KernelSpec(_name, "vector_add", f"kernels.vector_add:{_attr}", _vector_inputs,
                        _vector_golden, _vector_baseline, lambda p: 1, _vector_scale))
register(KernelSpec("transpose", "transpose", "kernels.transpose:matrix_transpose",
                    _transpose_inputs, _transpose_golden, _transpose_baseline, lambda p: 0))
register(KernelSpec("conv2d", "conv2d", "kernels.conv2d:fused_conv2d_maxpool", _conv_inputs,
                    _conv_golden, _conv_baseline, _conv_reduction, _conv_scale))


DTYPE_ORDER = ("float32", "float16", "bfloat16")


def sort_records(records) -> list:
    """Report records in registry kernel order, then float32, float16, bfloat16."""
    kernels = list(KERNELS)

    def key(rec):
        return (kernels.index(rec.kernel) if rec.kernel in kernels else len(kernels), rec.kernel,
                DTYPE_ORDER.index(rec.dtype) if rec.dtype in DTYPE_ORDER else 9, rec.dtype)

    return sorted(records, key=key)


def get(name: str) -> KernelSpec:
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(KERNELS)}") from None


# ---- the pipeline -------------------------------------------------------------------------

@dataclass
class Outcome:
    """What :func:`run_case` produced: the comparison and the times it took."""

    comparison: object             # nkiverify.compare.Comparison
    output: object
    kernel_s: float                # the backend run
    check_s: float                 # golden, baseline, comparison

    @property
    def passed(self) -> bool:
        return bool(self.comparison.passed)

    @property
    def elapsed_s(self) -> float:
        return self.kernel_s + self.check_s


def expected_for(spec: KernelSpec, params, dtype, inputs: Inputs):
    """(golden float64, baseline in ``dtype``, scale) for ``inputs``."""
    golden = spec.golden(*inputs.args, **inputs.kwargs)
    baseline = spec.baseline(*inputs.args, dtype=dtype_of(dtype), **inputs.kwargs)
    scale = spec.scale(inputs, golden) if spec.scale is not None else None
    return golden, baseline, scale


def check_output(spec: KernelSpec, params, dtype, inputs: Inputs, actual, k: float = 4.0):
    """Compare a kernel output with the golden model: a ``Comparison``."""
    from .compare import compare
    golden, baseline, scale = expected_for(spec, params, dtype, inputs)
    return compare(actual, golden, dtype_of(dtype),
                   reduction_length=spec.reduction_length(params), scale=scale,
                   baseline=baseline, k=k)


def run_case(spec: KernelSpec | str, params: dict, dtype, backend, *, seed: int = 0,
             dist: str = "uniform", k: float = 4.0) -> Outcome:
    """Make inputs, run the kernel on ``backend``, compare with the golden model."""
    if isinstance(spec, str):
        spec = get(spec)
    inputs = spec.inputs(params, dtype, seed, dist)
    kernel = backend.load(spec.import_path)
    t0 = time.perf_counter()
    out = backend.run(kernel, *inputs.args, **inputs.kwargs)
    t1 = time.perf_counter()
    comparison = check_output(spec, params, dtype, inputs, out, k=k)
    return Outcome(comparison, out, t1 - t0, time.perf_counter() - t1)
