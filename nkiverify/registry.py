"""The kernel registry: for each kernel, where it lives and how to check it.

A :class:`KernelSpec` ties a kernel name (``naive``, ``tiled``, ``stream``, ``transpose``,
``conv2d``; the names ``fixtures/configs.py`` and ``nki-verify`` use) to

* the kernel's import path (``nkiverify.kernels.conv2d:fused_conv2d_maxpool``, or a file
  ``part2/conv2d.py:fused_conv2d_maxpool``), imported lazily by a
  backend (``nkiverify.backends``) so the right ``neuronxcc.nki`` / ``nki`` serves it;
* for the shipped kernels, the import path of the twin written in the current ``nki`` dialect
  (``nki_path``: ``nkiverify.kernels.conv2d_nki:fused_conv2d_maxpool``); :func:`for_dialect`
  picks the one a test or ``nki-verify --dialect`` asks for. ``DIALECTS``: ``beta1`` (Beta 1,
  ``import neuronxcc.nki``, up to Neuron SDK 2.27) and ``nki`` (``import nki``, NKI 0.3+);
* the input maker: ``(params, dtype, seed, dist) -> Inputs`` (positional args and keyword args
  of the kernel call, in the kernel's dtype);
* the float64 golden model, the low-precision baseline and the reduction length
  (``reference/``), and the magnitude scale the comparator's accumulation allowance grows with.

:func:`run_case` is the pipeline a test and ``nki-verify`` share: inputs -> backend -> golden,
baseline -> ``nkiverify.compare.compare``.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np

DISTS = ("uniform", "normal", "tiny", "large")
DIALECTS = ("beta1", "nki")
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
    from .reference.vector_add import vector_add
    return vector_add(a, b)


def _vector_baseline(a, b, dtype=None):
    from .reference.vector_add import vector_add_baseline
    return vector_add_baseline(a, b, dtype=dtype)


def _vector_scale(inputs, expected):
    a, b = inputs.args
    return np.abs(a.astype(np.float64)) + np.abs(b.astype(np.float64))


# ---- transpose ----------------------------------------------------------------------------

def _transpose_inputs(params, dtype, seed, dist):
    rng = np.random.default_rng(seed)
    return Inputs((values(rng, (int(params["m"]), int(params["n"])), dtype, dist),), {})


def _transpose_golden(a):
    from .reference.transpose import matrix_transpose
    return matrix_transpose(a)


def _transpose_baseline(a, dtype=None):
    from .reference.transpose import matrix_transpose_baseline
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
    from .reference.conv2d import conv2d, conv2d_maxpool, golden_dtype
    # float64 for fp32 kernels, float32 for 16-bit ones (reference.conv2d.golden_dtype)
    if _CONV_MEMO is None:
        return conv2d_maxpool(X, W, bias, pool_size=pool_size, dtype="auto")
    X, W, bias = np.asarray(X), np.asarray(W), np.asarray(bias)
    precision = golden_dtype(X, W, bias)
    key = (_array_digest(X), _array_digest(W), precision.str)
    entry, y = _CONV_MEMO.get("entry"), None
    if entry is not None and entry.key == key:
        if np.array_equal(entry.bias, bias):
            y = entry.conv
        elif not entry.bias.any() and sys.getrefcount(entry.conv) <= 2:
            # conv + 0 is the bias-free sum itself (one addition of +0.0), so (conv + 0) + bias
            # is conv + bias as reference.conv2d adds it, one rounding, the same bits. In place
            # only when nothing else holds the array (the earlier case's golden is gone).
            entry.conv.flags.writeable = True
            entry.conv += np.asarray(bias, dtype=precision)[:, None, None]
            entry.conv.flags.writeable = False
            entry.bias, y = bias.copy(), entry.conv
    if y is None:
        _CONV_MEMO.pop("entry", None)           # free it before the next one is computed
        y = conv2d(X, W, bias, pool_size=pool_size, dtype="auto")
        y.flags.writeable = False               # a golden (pool 1: this array) is read only
        _CONV_MEMO["entry"] = _ConvEntry(key, bias.copy(), y)
    return conv2d_maxpool(X, W, bias, pool_size=pool_size, dtype="auto", conv=y)


# ---- one convolution for the cases that share their inputs (issue 12) -----------------------
# conv2d cases that differ only in the bias and the pool size draw the same inputs (fixtures:
# Case.inputs_of; the course's three B=4 224x224 cases) and nki-verify runs them in one job:
# inside ``shared_goldens()`` the float64 convolution before the pool (404 MB, 5.9 s of CPU for
# B=4 256 -> 256 224x224) is computed once and each case's golden is derived from it exactly as
# reference.conv2d would compute it: the same bias added once (with the bias-free case first,
# in place), then that case's pool. Kept: the last one, keyed by the SHA-256 of X and W (their
# dtype, shape and bytes) and the precision; the bias is compared element by element.
_CONV_MEMO: dict | None = None


@dataclass
class _ConvEntry:
    key: tuple
    bias: np.ndarray
    conv: np.ndarray


def _array_digest(a, extra: str = "") -> bytes:
    """SHA-256 of an array's dtype, shape and bytes (and ``extra``)."""
    import hashlib
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}{extra}".encode())
    h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return h.digest()


class shared_goldens:
    """``with registry.shared_goldens():`` conv2d cases run inside the block whose inputs are
    those of the case before (another bias or pool size) reuse its convolution; it is
    forgotten at the block's end."""

    def __enter__(self):
        global _CONV_MEMO
        self.saved, _CONV_MEMO = _CONV_MEMO, {}
        return self

    def __exit__(self, *exc):
        global _CONV_MEMO
        _CONV_MEMO = self.saved


def _conv_baseline(X, W, bias, pool_size=1, dtype=None):
    from .reference.conv2d import conv2d_maxpool_baseline
    return conv2d_maxpool_baseline(X, W, bias, pool_size=pool_size, dtype=dtype)


# The baseline on a part of the output first (nkiverify.compare's baseline_sample): a band of
# output rows of the first image, all channels, about BASELINE_SAMPLE elements. Its max error
# is at most the whole baseline's, so a kernel within k x of it passes the baseline check as
# with the whole (computed only when the part does not decide). "At most" up to BLAS's
# summation order: the band's fp32 GEMMs have fewer columns, which moved 0.4-1.9% of the
# elements by one fp32 ulp against the whole image's (measured, 1e6 outputs); the baseline is
# defined up to that order anyway (it changes with the OpenBLAS build and thread count), and
# the band's max stays below the whole's (measured: 0.89x the whole's for B=4 uniform, where
# the kernel's max error is 0.8x the band's, far within k=4; 1.0x for B=1 signed, pool 2).
# 1Mi elements: a 0.1 s float32 conv instead of 4 s for B=4 256->256 224x224 (issue 12).
BASELINE_SAMPLE = 1 << 20


def _conv_baseline_sample(X, W, bias, pool_size=1, dtype=None):
    """(baseline of a band of rows, the golden's index of that band), or None when the band
    would be the whole output."""
    from .reference.conv2d import conv2d_maxpool_baseline
    batch, _, height, _ = X.shape
    c_out, _, k, _ = W.shape
    p = int(pool_size)
    pooled_rows, pooled_w = (height - k + 1) // p, (X.shape[3] - k + 1) // p
    rows = max(1, BASELINE_SAMPLE // max(1, c_out * pooled_w))
    if batch == 1 and rows >= pooled_rows:
        return None
    rows = min(rows, pooled_rows)
    band = X[:1, :, : rows * p + k - 1, :]
    values = conv2d_maxpool_baseline(band, W, bias, pool_size=p, dtype=dtype)
    return values, (slice(0, 1), slice(None), slice(0, rows), slice(None))


def _conv_scale(inputs, expected):
    # With non-negative inputs the golden is its own magnitude scale (sum of |terms|): no need
    # to run the reference a second time on |inputs|.
    if inputs.all_nonnegative:
        return expected
    from .reference.conv2d import conv2d_maxpool_scale
    return conv2d_maxpool_scale(*inputs.args, dtype="auto", **inputs.kwargs)


def _conv_reduction(params):
    from .reference.conv2d import conv2d_reduction_length
    return conv2d_reduction_length(int(params["c_in"]), int(params["k"]))


# ---- the registry -------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelSpec:
    """How to run and check one kernel (see the module docstring).

    ``import_path`` is ``module:function`` or ``path/to/file.py:function``; ``kernel`` a kernel
    object given directly (it wins over ``import_path``); ``source`` says where the kernel came
    from ("shipped": ours, else the reference the user gave).
    """

    name: str
    family: str
    import_path: str
    make_inputs: Callable
    golden: Callable
    baseline: Callable
    reduction_length: Callable     # params -> products summed per output (0: exact copy)
    scale: Callable | None = None  # (inputs, expected) -> magnitude scale, None: max|expected|
    kernel: object = field(default=None, compare=False)
    source: str = "shipped"
    nki_path: str = ""             # shipped kernels: the twin in the current `nki` dialect
    dialect: str = "beta1"         # the dialect of the kernel `import_path`/`kernel` gives
    # (*args, dtype=, **kwargs) -> (baseline values, golden index) of a part of the output, or
    # None; see nkiverify.compare's baseline_sample
    baseline_sample: Callable | None = None
    # parameters whose cases (with the same inputs) can share the golden's costly part inside
    # ``shared_goldens()`` (conv2d: the bias and the pool size; nki-verify runs them in one job)
    shared_golden_params: tuple = ()

    def inputs(self, params, dtype, seed=0, dist="uniform") -> Inputs:
        inputs = self.make_inputs(params, dtype_of(dtype), seed, dist)
        if isinstance(inputs, Inputs):
            return inputs
        if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[1], dict):
            return Inputs(tuple(inputs[0]), dict(inputs[1]))
        return Inputs(tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,), {})

    def for_dialect(self, dialect: str) -> KernelSpec:
        """This family's kernel written in ``dialect`` ("beta1" or "nki").

        Shipped kernels have both; a user's kernel (``--nki-kernel``, ``register``) is in one
        dialect, detected from its imports: asking for the other raises
        :class:`DialectMismatch` (a test skips with its message)."""
        if dialect not in DIALECTS:
            raise ValueError(f"unknown NKI dialect {dialect!r}; known: {', '.join(DIALECTS)}")
        if self.source == "shipped" and self.kernel is None:
            if dialect == "beta1":
                return replace(self, dialect="beta1")
            if self.nki_path:
                return replace(self, import_path=self.nki_path, dialect="nki")
            raise DialectMismatch(f"kernel {self.name} has no twin in the {dialect} dialect")
        own = kernel_dialect(self.kernel if self.kernel is not None else self.import_path)
        if own is None or own == dialect:
            return replace(self, dialect=dialect)
        raise DialectMismatch(f"{self.label} is written in the {own} dialect "
                              f"({DIALECT_IMPORTS[own]}), not {dialect}")

    @property
    def label(self) -> str:
        """What runs: the user's reference, or ours."""
        if self.kernel is not None:
            return getattr(self.kernel, "__name__", repr(self.kernel))
        return self.import_path


class DialectMismatch(LookupError):
    """A kernel asked for in a dialect it is not written in (one line, says which it is)."""


DIALECT_IMPORTS = {"beta1": "import neuronxcc.nki", "nki": "import nki"}


def _source_dialect(path: str) -> str | None:
    """"nki" or "beta1" from a Python file's imports (None: neither, or unreadable)."""
    import ast
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for n in names:
            top = n.split(".")[0]
            if top == "nki":
                found.add("nki")
            elif top == "neuronxcc":
                found.add("beta1")
    return found.pop() if len(found) == 1 else None


def kernel_dialect(kernel) -> str | None:
    """The dialect a kernel is written in: "nki" (``import nki``), "beta1" (``import
    neuronxcc.nki``) or None when it cannot be told (then it is run as asked).

    ``kernel``: an import path (``module:function`` or ``path/file.py:function``) or a kernel
    object (a jit kernel of either face, or a plain function)."""
    if isinstance(kernel, str):
        location = kernel.rpartition(":")[0] or kernel
        if is_path(location):
            return _source_dialect(location)
        import importlib.util
        try:
            spec = importlib.util.find_spec(location)
        except (ImportError, ValueError):
            return None
        return _source_dialect(spec.origin) if spec is not None and spec.origin else None
    cls_module = type(kernel).__module__ or ""
    top = cls_module.split(".")
    if top[0] == "nki" or top[:2] == ["nkisim", "nki"]:
        return "nki"
    # Beta 1 jit kernels of nkisim are nkisim.runtime.Kernel (the nki face subclasses it)
    if top[0] == "neuronxcc" or top[:2] in (["nkisim", "beta1"], ["nkisim", "runtime"]):
        return "beta1"
    func = getattr(kernel, "func", kernel)
    import inspect
    try:
        path = inspect.getsourcefile(func)
    except TypeError:
        path = None
    return _source_dialect(path) if path else None


KERNELS: dict[str, KernelSpec] = {}
SHIPPED: dict[str, KernelSpec] = {}


def register_spec(spec: KernelSpec) -> KernelSpec:
    """Add or replace a :class:`KernelSpec` (the low-level form of :func:`register`)."""
    KERNELS[spec.name] = spec
    return spec


def _shipped(spec: KernelSpec) -> None:
    SHIPPED[spec.name] = register_spec(spec)


for _name, _attr in (("naive", "vector_add_naive"), ("tiled", "vector_add_tiled"),
                     ("stream", "vector_add_stream")):
    _shipped(KernelSpec(_name, "vector_add", f"nkiverify.kernels.vector_add:{_attr}",
                        _vector_inputs, _vector_golden, _vector_baseline, lambda p: 1,
                        _vector_scale, nki_path=f"nkiverify.kernels.vector_add_nki:{_attr}"))
_shipped(KernelSpec("transpose", "transpose", "nkiverify.kernels.transpose:matrix_transpose",
                    _transpose_inputs, _transpose_golden, _transpose_baseline, lambda p: 0,
                    nki_path="nkiverify.kernels.transpose_nki:matrix_transpose"))
_shipped(KernelSpec("conv2d", "conv2d", "nkiverify.kernels.conv2d:fused_conv2d_maxpool",
                    _conv_inputs, _conv_golden, _conv_baseline, _conv_reduction, _conv_scale,
                    nki_path="nkiverify.kernels.conv2d_nki:fused_conv2d_maxpool",
                    baseline_sample=_conv_baseline_sample,
                    shared_golden_params=("bias", "pool")))


# ---- a new kernel family: the user's own golden model ---------------------------------------

def _default_baseline(golden):
    def baseline(*args, dtype=None, **kwargs):
        out = np.asarray(golden(*args, **kwargs), dtype=np.float64)
        return out.astype(dtype) if dtype is not None else out
    baseline.rounds_golden = True
    return baseline


def _baseline_applies(spec: KernelSpec, reduction: int) -> bool:
    """The default baseline (the golden rounded once) is what hardware computes only for an
    output rounded once from exact operands (reduction length 0 or 1). After a reduction the
    fp32 sum's own rounding errors come first: a correct fp32 matmul of K=128 uniform [0, 1)
    values is off by 5 fp32 ulps at max|golden| (in channel order; BLAS: 6), more than 4x the
    half-ulp baseline, and was failed (measured 2026-11-28). With no baseline of its own such a
    family is judged by the tolerance alone, which bounds the fp32 sum's error."""
    return not (getattr(spec.baseline, "rounds_golden", False) and reduction > 1)


def register(name: str, *, kernel, inputs: Callable, golden: Callable | None = None,
             baseline: Callable | None = None, reduction_length=1,
             scale: Callable | None = None):
    """Register a kernel family with your own golden model; usable as a decorator.

    ``kernel``: ``"path/to/file.py:function"``, ``"module:function"`` or the kernel object.
    ``inputs(params, dtype, seed, dist)``: the kernel's arguments, a tuple (positional) or
    ``(args_tuple, kwargs_dict)``; draw them with ``nkiverify.registry.values``.
    ``golden(*args, **kwargs)``: the exact result (computed in float64 from the inputs).
    ``baseline(*args, dtype=, **kwargs)``: what correct hardware computes (default: the golden
    rounded once to ``dtype``, used only where the reduction length is at most 1: after a
    longer fp32 sum the tolerance alone judges, see ``_baseline_applies``).
    ``reduction_length``: products summed per output element (an int, or ``params -> int``; 0
    for a bit-exact copy); ``scale``: see ``nkiverify.compare``.

        nkiverify.register("softmax", kernel="part3/softmax.py:softmax",
                           inputs=lambda p, dt, seed, dist: (values(rng(seed), (128, p["n"]), dt),),
                           golden=softmax64)

        @nkiverify.register("scale2", kernel="mine.py:scale2", inputs=...)
        def scale2_golden(x):
            return 2.0 * x.astype(np.float64)

    Then ``nki_verify("softmax", {"n": 512}, "float16")`` and ``nki-verify`` (with
    ``--kernel``) check it like a shipped kernel.
    """
    if not name or not isinstance(name, str):
        raise ValueError(f"register: the kernel name must be a non-empty string, got {name!r}")
    if golden is None:
        def decorator(fn):
            register(name, kernel=kernel, inputs=inputs, golden=fn, baseline=baseline,
                     reduction_length=reduction_length, scale=scale)
            return fn
        return decorator
    n = reduction_length
    reduction = n if callable(n) else (lambda params, _n=int(n): _n)
    obj, path = (None, kernel) if isinstance(kernel, str) else (kernel, "")
    if path:
        path = _normalize_location(path)
    register_spec(KernelSpec(name, name, path, inputs, golden,
                             baseline or _default_baseline(golden), reduction, scale,
                             kernel=obj, source="user",
                             dialect=kernel_dialect(obj if obj is not None else path) or
                             "beta1"))
    return golden


# ---- kernels by reference: NAME=PATH:FUNC -----------------------------------------------------

# The course's function names (cs149-assignment §1, §2: part1/kernels.py, part2/conv2d.py) and
# the family each is checked as, so `--kernel part2/conv2d.py:fused_conv2d_maxpool` needs no
# NAME=. trn1's direct-allocation kernels compute a vector add on their own fixed sizes: name
# them explicitly (e.g. stream=part1/kernels.py:vector_add_direct_allocation).
COURSE_FUNCTIONS = {
    "vector_add_naive": "naive",
    "vector_add_tiled": "tiled",
    "vector_add_stream": "stream",
    "matrix_transpose": "transpose",
    "fused_conv2d_maxpool": "conv2d",
}


class KernelRefError(ValueError):
    """A kernel reference that names no kernel (one line, says what to write instead)."""


def is_path(location: str) -> bool:
    """``part2/conv2d.py`` (a file) rather than ``package.module`` (an import)."""
    return location.endswith(".py") or "/" in location or os.sep in location


def _normalize_location(location: str) -> str:
    """Absolute file paths (so xdist workers and other directories see the same file)."""
    module, sep, attr = location.rpartition(":")
    if not sep:
        module, attr = location, ""
    if is_path(module):
        module = os.path.abspath(os.path.expanduser(module))
    return f"{module}:{attr}" if attr else module


def parse_kernel_ref(text: str) -> tuple[str, str]:
    """``"NAME=PATH:FUNC"`` (or ``PATH:FUNC``, ``module:FUNC``, ``NAME=PATH``) ->
    ``(name, "location:function")`` with file paths made absolute.

    Without NAME the family comes from the course's function name (``COURSE_FUNCTIONS``);
    without FUNC the family's course function name is used. Raises :class:`KernelRefError`.
    """
    raw = text
    name, eq, rest = text.partition("=")
    if not eq:
        name, rest = "", text
    name, rest = name.strip(), rest.strip()
    if not rest:
        raise KernelRefError(f"kernel reference {raw!r} names no kernel; write NAME=PATH:FUNCTION "
                             "e.g. conv2d=part2/conv2d.py:fused_conv2d_maxpool")
    location, sep, func = rest.rpartition(":")
    if not sep or (not is_path(location) and "/" in func) or func.endswith(".py"):
        location, func = rest, ""
    if not func:
        if not name:
            raise KernelRefError(
                f"kernel reference {raw!r}: say which function, PATH:FUNCTION (e.g. "
                "part2/conv2d.py:fused_conv2d_maxpool)")
        if name not in KERNELS:
            raise KernelRefError(f"kernel reference {raw!r}: unknown kernel {name!r}; known: "
                                 f"{', '.join(KERNELS)}")
        func = KERNELS[name].import_path.rpartition(":")[2]
    if not name:
        name = COURSE_FUNCTIONS.get(func, "")
        if not name:
            raise KernelRefError(
                f"kernel reference {raw!r}: {func!r} is not one of the course's functions "
                f"({', '.join(COURSE_FUNCTIONS)}); say what it computes with NAME=, e.g. "
                f"conv2d={rest}")
    if name not in KERNELS:
        raise KernelRefError(f"kernel reference {raw!r}: unknown kernel {name!r}; known: "
                             f"{', '.join(KERNELS)} (a new family: nkiverify.register)")
    if is_path(location):
        path = os.path.abspath(os.path.expanduser(location))
        if not os.path.isfile(path):
            raise KernelRefError(f"kernel reference {raw!r}: no such file {location!r}")
        location = path
    return name, f"{location}:{func}"


def use_kernel(ref) -> KernelSpec:
    """Make a family run the user's kernel: ``use_kernel("conv2d=part2/conv2d.py:f")``.

    The golden model, inputs and tolerances stay the family's; only the kernel changes.
    Returns the new spec (also in ``KERNELS``).
    """
    name, location = parse_kernel_ref(ref)
    return register_spec(replace(KERNELS[name], import_path=location, kernel=None,
                                 source=location, nki_path="",
                                 dialect=kernel_dialect(location) or "beta1"))


def spec_for(kernel, family: str | None = None) -> KernelSpec:
    """The spec to run for ``kernel``: a registered name, a reference (``NAME=PATH:FUNC``,
    ``PATH:FUNC``) or a kernel object (its family from ``family`` or its function name)."""
    if isinstance(kernel, KernelSpec):
        return kernel
    if isinstance(kernel, str):
        if kernel in KERNELS and family is None:
            return KERNELS[kernel]
        ref = kernel if (family is None or "=" in kernel) else f"{family}={kernel}"
        name, location = parse_kernel_ref(ref)
        return replace(KERNELS[name], import_path=location, kernel=None, source=location,
                       nki_path="", dialect=kernel_dialect(location) or "beta1")
    if callable(kernel) or hasattr(kernel, "func"):
        fname = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "func", None),
                                                             "__name__", "")
        name = family or COURSE_FUNCTIONS.get(fname)
        if name is None:
            raise KernelRefError(f"kernel {fname or kernel!r}: cannot tell which kernel family it "
                                 f"is; pass family= (one of {', '.join(KERNELS)})")
        if name not in KERNELS:
            raise KernelRefError(f"unknown kernel family {name!r}; known: {', '.join(KERNELS)}")
        return replace(KERNELS[name], kernel=kernel, source=fname or "kernel object",
                       nki_path="", dialect=kernel_dialect(kernel) or "beta1")
    raise KernelRefError(f"not a kernel: {kernel!r} (a name, NAME=PATH:FUNC, or a kernel)")


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


class Expected:
    """What every output of one case is compared with, whichever kernel or dialect made it:
    the golden model's output for the case's inputs, its magnitude scale and the low-precision
    baseline (computed on first use: ``nkiverify.compare`` asks for it only when it could
    change the verdict)."""

    def __init__(self, spec: KernelSpec, dtype, inputs: Inputs):
        self.golden = spec.golden(*inputs.args, **inputs.kwargs)
        self.scale = spec.scale(inputs, self.golden) if spec.scale is not None else None
        self._make_baseline = functools.partial(spec.baseline, *inputs.args,
                                                dtype=dtype_of(dtype), **inputs.kwargs)
        self._baseline = None
        self.baseline_sample = None          # see nkiverify.compare's baseline_sample
        if spec.baseline_sample is not None:
            self.baseline_sample = functools.partial(spec.baseline_sample, *inputs.args,
                                                     dtype=dtype_of(dtype), **inputs.kwargs)

    def baseline(self):
        if self._baseline is None:
            self._baseline = self._make_baseline()
        return self._baseline

    @property
    def nbytes(self) -> int:
        arrays = (self.golden, self._baseline,
                  None if self.scale is self.golden else self.scale)
        return sum(int(getattr(a, "nbytes", 0)) for a in arrays)


def expected_for(spec: KernelSpec, params, dtype, inputs: Inputs):
    """(golden float64, baseline in ``dtype``, scale) for ``inputs``."""
    expected = Expected(spec, dtype, inputs)
    return expected.golden, expected.baseline(), expected.scale


def check_output(spec: KernelSpec, params, dtype, inputs: Inputs, actual, k: float = 4.0,
                 expected: Expected | None = None):
    """Compare a kernel output with the golden model: a ``Comparison``. ``expected``: the
    case's :class:`Expected` when already computed (another dialect's run of the case)."""
    from .compare import compare
    if expected is None:
        expected = Expected(spec, dtype, inputs)
    reduction = spec.reduction_length(params)
    return compare(actual, expected.golden, dtype_of(dtype),
                   reduction_length=reduction, scale=expected.scale,
                   baseline=expected.baseline if _baseline_applies(spec, reduction) else None,
                   k=k,
                   baseline_sample=None if expected._baseline is not None else
                   expected.baseline_sample)


# ---- nothing computed twice: one golden per case --------------------------------------------
# Every case runs in both dialects (and a hypothesis example may repeat) with the same inputs:
# the inputs, the golden, its scale and the baseline of the last cases run in this process are
# kept (at most SHARED_BYTES of them) and reused by the next run of the same case, whatever
# kernel it runs. The kernel gets a copy of the inputs (an nki-dialect kernel may write its
# inputs, nki-current.md §3), so every run, and the golden, see the inputs as drawn.
# `sharing(max_bytes)` raises the limit for a block (nki-verify runs a case's dialects in one
# job, large cases included) and forgets the cases at its end.
SHARED_BYTES = 64 << 20


@dataclass
class _Case:
    """One shared case: its inputs as drawn, what outputs are compared with, the bytes both
    hold, and the comparisons already made (by ``_output_digest``)."""
    inputs: Inputs
    expected: Expected | None = None
    nbytes: int = 0
    comparisons: dict = field(default_factory=dict)


_SHARED: dict = {}         # key -> _Case, oldest first


def _case_key(spec: KernelSpec, params, dtype, seed, dist):
    try:
        key = (spec.make_inputs, spec.golden, spec.baseline, spec.scale,
               tuple(sorted(params.items())), dtype_name(dtype), int(seed), dist)
        hash(key)
    except TypeError:           # unhashable parameters: not shared
        return None
    return key


def _output_digest(out, k):
    """SHA-256 of an output's dtype, shape and bytes, with ``k``: equal digests, equal
    comparisons. None for what is not a NumPy array."""
    if not isinstance(out, np.ndarray):
        return None
    return _array_digest(out, repr(float(k)))


def _input_bytes(inputs: Inputs) -> int:
    return sum(int(a.nbytes) for a in (*inputs.args, *inputs.kwargs.values())
               if isinstance(a, np.ndarray))


def _copy_inputs(inputs: Inputs) -> Inputs:
    def copy(a):
        return a.copy() if isinstance(a, np.ndarray) else a
    return Inputs(tuple(copy(a) for a in inputs.args),
                  {n: copy(a) for n, a in inputs.kwargs.items()})


def _evict(limit) -> None:
    total = sum(case.nbytes for case in _SHARED.values())
    while _SHARED and limit is not None and total > limit:
        oldest = next(iter(_SHARED))
        total -= _SHARED.pop(oldest).nbytes


class sharing:
    """``with registry.sharing(max_bytes=None):`` keep up to ``max_bytes`` (None: no limit) of
    shared cases inside the block; they are forgotten at its end."""

    def __init__(self, max_bytes: int | None = None):
        self.max_bytes = max_bytes

    def __enter__(self):
        global SHARED_BYTES
        self.saved = SHARED_BYTES
        SHARED_BYTES = self.max_bytes
        return self

    def __exit__(self, *exc):
        global SHARED_BYTES
        SHARED_BYTES = self.saved
        _SHARED.clear()


class KernelReturnedNone(AssertionError):
    """The kernel returned nothing, so there is no output to check."""


# The trn1 course's Part 1 runner reads a vector add's output as ``out.reshape(a.shape)``
# before its np.allclose (asst4-trainium part1/vec_add.py; cs149-assignment §1 "vec_add.py
# flow"), and its handout's direct-allocation kernel returns ``out.reshape((M, 1))``: on trn1
# an output of the golden's size is judged in the golden's shape. The trn2 runner compares
# ``np.allclose(out, a + b)`` as returned, so there a shape mismatch stays a failure.
HARNESS_RESHAPES = {"trn1": frozenset({"vector_add"})}    # families


def _as_harness_reads(spec: KernelSpec, backend, out, golden):
    """``out`` as the course's harness for ``backend``'s target reads it (see above)."""
    families = HARNESS_RESHAPES.get(getattr(backend, "target", None), ())
    shape = getattr(golden, "shape", None)
    if spec.family in families and shape is not None and getattr(out, "shape", shape) != shape \
            and getattr(out, "size", None) == math.prod(shape):
        return np.asarray(out).reshape(shape)
    return out


COURSE_FAMILIES = ("naive", "tiled", "stream", "transpose", "conv2d")     # (KernelSpec.name)


def _check_output_dtype(spec, kernel, out, dtype) -> None:
    """A course kernel returns its inputs' dtype (the handout allocates ``X_out`` with
    ``dtype=X.dtype``). A wider output passes the comparison (it judges the values, and the
    course's np.allclose would too) but moves more bytes than the kernel the course times: a
    suspicious-pattern warning at the kernel's definition."""
    got = getattr(out, "dtype", None)
    if spec.name not in COURSE_FAMILIES or got is None or got == dtype_of(dtype):
        return
    import warnings

    from nkisim.errors import SUSPICIOUS_PREFIX, NKIWarning
    func = getattr(kernel, "func", kernel)
    code = getattr(func, "__code__", None)
    warnings.warn_explicit(
        f"{SUSPICIOUS_PREFIX}the kernel returns {got} for a {dtype_of(dtype)} case: a course "
        f"kernel returns its inputs' dtype (the handout's X_out = nl.ndarray(..., "
        f"dtype=X.dtype)): the output's {got.itemsize}-byte elements, where the course's "
        f"kernel writes {dtype_of(dtype).itemsize}-byte ones, change what the device moves",
        NKIWarning, code.co_filename if code else "<kernel>", code.co_firstlineno if code else 0)


def read_output(spec: KernelSpec, backend, kernel, out, dtype, expected: Expected):
    """The kernel's output as the course's harness reads it, with the output-dtype warning;
    ``KernelReturnedNone`` for a kernel that returned nothing. (run_case and ``nki-verify
    bench`` judge what they ran the same way.)"""
    if out is None:
        raise KernelReturnedNone(
            f"kernel {spec.label} returned None: a kernel must return its output tensor "
            "(a missing `return out`?)")
    out = _as_harness_reads(spec, backend, out, expected.golden)
    _check_output_dtype(spec, kernel, out, dtype)
    return out


def run_case(spec: KernelSpec | str, params: dict, dtype, backend, *, seed: int = 0,
             dist: str = "uniform", k: float = 4.0) -> Outcome:
    """Make inputs, run the kernel on ``backend``, compare with the golden model."""
    if not isinstance(spec, KernelSpec):
        spec = spec_for(spec)
    key = _case_key(spec, params, dtype, seed, dist)
    case = _SHARED.pop(key, None) if key is not None else None
    if case is None:
        inputs = spec.inputs(params, dtype, seed, dist)
        case = _Case(inputs, nbytes=_input_bytes(inputs))
    inputs = case.inputs
    shared = key is not None and (SHARED_BYTES is None or case.nbytes <= SHARED_BYTES)
    kernel = spec.kernel if spec.kernel is not None else backend.load(spec.import_path)
    run_inputs = _copy_inputs(inputs) if shared else inputs
    t0 = time.perf_counter()
    out = backend.run(kernel, *run_inputs.args, **run_inputs.kwargs)
    t1 = time.perf_counter()
    del run_inputs
    if case.expected is None and out is not None:
        case.expected = Expected(spec, dtype, inputs)
    out = read_output(spec, backend, kernel, out, dtype, case.expected)
    # The other dialect's kernel (or a repeated example) usually returns the same bits: the
    # comparison is a function of the output, the golden and k, so it is not redone (a B=4
    # 224x224 fp32 conv2d: 0.13 s of SHA-256 instead of a 1-2 s comparison; issue 12).
    digest = _output_digest(out, k) if shared else None
    comparison = case.comparisons.get(digest) if digest is not None else None
    if comparison is not None:
        comparison = replace(comparison, reasons=list(comparison.reasons))
    else:
        comparison = check_output(spec, params, dtype, inputs, out, k=k,
                                  expected=case.expected)
        if digest is not None:
            case.comparisons[digest] = comparison
    if shared:
        case.nbytes = _input_bytes(inputs) + case.expected.nbytes
        if SHARED_BYTES is None or case.nbytes <= SHARED_BYTES:
            _SHARED[key] = case             # the newest last
            _evict(SHARED_BYTES)
    return Outcome(comparison, out, t1 - t0, time.perf_counter() - t1)
