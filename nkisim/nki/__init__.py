"""``nki`` (NKI 0.3-0.7, Neuron SDK 2.29-2.33), the current dialect, as the shim serves it: a thin
face over the machine core, beside the Beta 1 face (nkisim.beta1). Spec: shared/spec/nki-current.md.

- ``nki.jit(fn=None, **kwargs)`` returns a :class:`Kernel`; ``kernel[lnc]`` takes the LNC degree
  (one number: 1 or 2); ``kernel.with_schedule(...)`` is accepted (scheduling does not change
  values); ``platform_target=`` is an error and ``mode=`` a deprecation warning (§2.1).
- ``nki.simulate(kernel)(*arrays)`` runs the kernel on nkisim and returns NumPy arrays; inputs
  the kernel wrote are updated in place (§3). A ``@nki.jit`` kernel called directly runs the
  same way: with or without ``NKI_SIMULATOR=1`` nkisim has no device to route it to.
- ``nki.baremetal``/``benchmark``/``profile`` exist and raise "not available" (RN 2.28);
  ``nki.simulate_kernel`` does not exist (AttributeError, as on 2.32: NS issue #134).

Where versions differ, the face follows ``NKISIM_NKI_VERSION`` (default: the newest it knows).
"""

from __future__ import annotations

import inspect
import os
import types
import warnings

import numpy as np

from .. import context as _context
from .. import runtime as _runtime
from ..errors import NKIRuleWarning as _NKIRuleWarning
from ..errors import nki_error as _nki_error
from ..errors import rule_text as _rule_text
from ..tensor import Tensor as tensor  # noqa: F401 - annotations: `x: nki.tensor`
from . import _version, collectives, isa, language, typing  # noqa: F401

__all__ = ["jit", "simulate", "Kernel", "language", "isa", "typing", "collectives", "tensor",
           "dtype", "baremetal", "benchmark", "profile"]

# `dtype: nki.dtype = nl.bfloat16` (nki-library annotations); the stubs' DType
dtype = language.dtype


def __getattr__(name):
    if name == "__version__":
        return _version.version_string()
    raise AttributeError(f"module 'nki' has no attribute '{name}'")


def rules() -> _context.Rules:
    """The language rules of the release the face follows now (nkisim.context.Rules)."""
    return _context.Rules(
        dialect="nki", version=_version.current(),
        onchip_keep_partition=True, broadcast=False, outputs_shared_hbm=True,
        unrolled_loops=True, reduce_last_axes=True, allocated_kernel_rules=False,
        activation_bias_any_float=True,
        tensor_handle_truthy=True, psum_tile_spans_banks=True,
        # nl.copy: 0.3-0.5 ScalarE activation(copy), result in the source's buffer; 0.6.0 VectorE
        # tensor_copy, "result always in SBUF" (STUB-R29 vs STUB-R32, RN 2.32; spec §2.3)
        copy_same_buffer=not _version.at_least(0, 6),
        view_primitives=_version.at_least(0, 5), activation_reduce_add_only=True,
        expand_dims_last_only=False, strict_keywords=True,
        tensor_tensor_int32_all_ops=True, match_replace8_reverse=True,
        find_index8_distinct=True, indirect_hbm_partition_only=False,
        negative_indices=True, compare_input_dtype=True,
        mean_int_keeps_dtype=True, var_always_keepdims=True, rms_norm_compute_internal=True)


# ---------------------------------------------------------------------------------------------
# kernels

_LNC_DEGREES = (1, 2)


class Kernel(_runtime.Kernel):
    """A ``@nki.jit`` kernel of the current dialect. Call it (or ``nki.simulate(kernel)``) with
    NumPy arrays to simulate it; ``kernel[2]`` runs it with LNC 2 (two program instances,
    ``nl.program_id(0)`` 0 and 1)."""

    inputs_writable = True          # §3: input arrays are updated in place

    def __init__(self, func, **options):
        super().__init__(func, "auto", **options)
        self.lnc = None
        self.schedule = ()

    @property
    def rules(self):
        return rules()

    @property
    def input_buffer(self):
        """SIM §Execution: "Array arguments become NkiTensors with buffer=nl.hbm, or
        shared_hbm for LNC2"."""
        return language.shared_hbm if self.lnc == 2 else language.hbm

    @property
    def platform_target(self):
        # NEURON_PLATFORM_TARGET_OVERRIDE selects the target (trn1|gen2, trn2|gen3, trn3|gen4;
        # SIM §Target Platform, STUB-R32 jit); nkisim simulates trn1 and trn2, default trn2
        # (the course's instance) rather than the real simulator's trn3 (spec §6 item 11).
        return os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or None

    def _copy(self):
        k = type(self)(self.func, **self.options)
        k.lnc, k.grid, k.schedule = self.lnc, self.grid, self.schedule
        return k

    def __getitem__(self, lnc):
        # "The bracket syntax must contain only one number, the number of cores" (LNC; §2.1)
        if isinstance(lnc, tuple):
            raise _nki_error("nkisim_invalid_argument", api=f"{self.__name__}[...]",
                             why="the bracket syntax must contain only one number, the number "
                                 f"of cores (the LNC degree, 1 or 2), got {list(lnc)}: NKI "
                                 "0.2+ has no multi-dimensional SPMD launch grid")
        if isinstance(lnc, bool) or not isinstance(lnc, (int, np.integer)) or \
                int(lnc) not in _LNC_DEGREES:
            raise _nki_error("nkisim_invalid_argument", api=f"{self.__name__}[...]",
                             why=f"the LNC degree must be 1 or 2, got {lnc!r}")
        k = self._copy()
        k.lnc = int(lnc)
        k.grid = (int(lnc),)
        return k

    def with_schedule(self, *edges, **kwargs):
        """``kernel.with_schedule([...])``: scheduling edges between named instructions. They
        order instructions, which nkisim already runs one by one in program order: accepted,
        no effect on values (how-to-scheduling-apis.rst)."""
        k = self._copy()
        k.schedule = edges
        return k

    def __call__(self, *args, **kwargs):
        run = _context.maybe_current()
        if run is not None:
            # "Decorators on sub-kernels must be removed" (RN27); MIG: sub-kernels must not
            # carry @nki.jit. A documented rule: the call is inlined and a warning quotes it.
            run.rule(("nki_subkernel_jit", self.__name__),
                     f"`{self.__name__}` is an @nki.jit kernel called from inside a kernel",
                     "sub-kernels must not carry @nki.jit; remove the decorator",
                     "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/"
                     "migration/index.html")
            run.nesting += 1
            try:
                return self.func(*args, **kwargs)
            finally:
                run.nesting -= 1
        return _launch(self, args, kwargs)

    def __repr__(self):
        lnc = f"[{self.lnc}]" if self.lnc else ""
        return f"<nki kernel {self.__name__}{lnc}>"


def jit(fn=None, **kwargs):
    """``@nki.jit`` / ``@nki.jit(**kwargs)`` (``jit(fn=None, **kwargs)`` from 0.4.0)."""
    if "platform_target" in kwargs:
        # RN 2.29 / MIG 0.2->0.3: passing platform_target to nki.jit is an error
        raise _nki_error("nkisim_invalid_argument", api="nki.jit",
                         why="platform_target is no longer supported (an error since NKI "
                             "0.3.0): set NEURON_PLATFORM_TARGET_OVERRIDE=trn1|trn2 instead")
    if "mode" in kwargs:
        mode = kwargs.pop("mode")
        warnings.warn(f"nki.jit(mode={mode!r}): the mode parameter is deprecated and ignored "
                      "since NKI 0.3.0 (the framework is detected from the arguments); remove "
                      "it", DeprecationWarning, stacklevel=2)
    if fn is None:
        return lambda f: jit(f, **kwargs)
    if isinstance(fn, Kernel):
        k = fn._copy()
        k.options.update(kwargs)
        return k
    if isinstance(fn, _runtime.Kernel):       # a Beta 1 kernel object: wrap its function
        fn = fn.func
    if not callable(fn):
        raise _nki_error("nkisim_invalid_argument", api="nki.jit",
                         why=f"expects a function, got {type(fn).__name__}")
    return Kernel(fn, **kwargs)


# ---------------------------------------------------------------------------------------------
# running


def _as_kernel(kernel) -> Kernel:
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, _runtime.Kernel):
        return jit(kernel.func)
    if callable(kernel):        # SIM: "a plain function passed in is wrapped in jit"
        return Kernel(kernel)
    raise TypeError(f"nki.simulate expects an NKI kernel or a function, got "
                    f"{type(kernel).__name__}")


def simulate(kernel):
    """``nki.simulate(kernel)(*args, **kwargs)``: run on nkisim, return NumPy (or torch, for
    torch inputs) results; inputs the kernel wrote are updated in place (SIM §How It Works)."""
    k = _as_kernel(kernel)

    def run(*args, **kwargs):
        return _launch(k, args, kwargs)
    run.__name__ = getattr(k, "__name__", "kernel")
    run.__wrapped_kernel__ = k
    return run


def _launch(k: Kernel, args, kwargs):
    _check_no_beta1(k.func)
    _check_language_restrictions(k.func, args, kwargs)
    torch_in = [a for a in (*args, *kwargs.values()) if _is_torch(a)]
    if torch_in:
        args = tuple(_from_torch(a) for a in args)
        kwargs = {n: _from_torch(a) for n, a in kwargs.items()}
    try:
        out = _runtime.simulate(k, args, kwargs, target=k.platform_target)
    finally:
        back, _TORCH_BACK[:] = list(_TORCH_BACK), []
    if torch_in:
        _write_back_torch(back)
        out = _to_torch(out, torch_in[0])
    return out


# --- torch tensors (accepted by NKI_SIMULATOR=1 from 0.4.0, SIM) ---------------------------
_TORCH_BACK: list = []       # (torch tensor, the NumPy array the kernel saw)


def _is_torch(a) -> bool:
    return type(a).__module__.split(".")[0] == "torch" and hasattr(a, "detach")


def _from_torch(a):
    """A torch tensor's values as NumPy (sharing memory for CPU tensors); bf16 through its bits,
    as NumPy has no bfloat16 of its own (ml_dtypes')."""
    if not _is_torch(a):
        return a
    import torch
    t = a.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        arr = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        arr = t.numpy()
    _TORCH_BACK.append((a, arr))
    return arr


def _np_to_torch(arr):
    import torch
    arr = np.ascontiguousarray(arr)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _write_back_torch(pairs):
    import torch
    for t, arr in pairs:
        with torch.no_grad():
            t.copy_(_np_to_torch(arr).to(t.device))


def _to_torch(out, like):
    if isinstance(out, np.ndarray):
        return _np_to_torch(out).to(like.device)
    if isinstance(out, (tuple, list)):
        return type(out)(_to_torch(o, like) for o in out)
    return out


# --- neuronxcc.nki inside an nki kernel (0.4.0: a compile error; RN 2.30, spec §1, §4) -------

def _check_no_beta1(func, seen=None, depth=0) -> None:
    """The names a kernel's code (and the plain functions of its module it calls, a few levels
    deep) reads from its module globals must not be ``neuronxcc.nki`` modules or objects: from
    NKI 0.4.0 "use of neuronxcc.nki.* inside NKI kernels is a compile error" (0.3: a warning).
    A name is neuronxcc's when the module's source binds it with an ``import neuronxcc...`` /
    ``from neuronxcc... import`` statement (the shim serves those from nkisim.beta1, so the
    objects alone cannot tell), or when it is a real neuronxcc module. An ``import neuronxcc...``
    written inside the function's body is one too (its source's AST)."""
    seen = set() if seen is None else seen
    code = getattr(func, "__code__", None)
    if code is None or id(code) in seen or depth > 3:
        return
    seen.add(id(code))
    # an import in the function's own body (0.4.0: "Using the deprecated neuronxcc.nki.*
    # namespace inside NKI kernels now raises a compilation error", MIG 0.3->0.4)
    for name, modname in _local_neuronxcc_imports(func).items():
        _beta1_used(func, name, modname)
    glb = getattr(func, "__globals__", {})
    beta1 = _neuronxcc_names(glb.get("__file__"))
    for name in set(_code_names(code)):
        obj = glb.get(name)
        if obj is None:
            continue
        if name in beta1:
            _beta1_used(func, name, beta1[name])
        elif isinstance(obj, types.ModuleType) and obj.__name__.startswith("neuronxcc"):
            _beta1_used(func, name, obj.__name__)
        elif isinstance(obj, types.FunctionType) and obj.__module__ == func.__module__:
            _check_no_beta1(obj, seen, depth + 1)


_SOURCE_NAMES: dict = {}


def _neuronxcc_names(path) -> dict:
    """{bound name: module} of the ``neuronxcc`` imports in the source file ``path``."""
    if not path or not str(path).endswith(".py"):
        return {}
    try:
        key = (path, os.path.getmtime(path))
    except OSError:
        return {}
    if key not in _SOURCE_NAMES:
        import ast
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            tree = None
        _SOURCE_NAMES[key] = _neuronxcc_imports(tree) if tree is not None else {}
    return _SOURCE_NAMES[key]


def _neuronxcc_imports(tree) -> dict:
    """{bound name: module} of the ``import neuronxcc...`` / ``from neuronxcc... import``
    statements anywhere in the AST ``tree``."""
    import ast
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "neuronxcc":
                    names[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and \
                (node.module or "").split(".")[0] == "neuronxcc":
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


_LOCAL_IMPORTS: dict = {}


def _local_neuronxcc_imports(func) -> dict:
    """{bound name: module} of the ``neuronxcc`` imports written inside ``func``'s own body
    (nested functions included), from the AST of its source; {} without source."""
    code = func.__code__
    if code not in _LOCAL_IMPORTS:
        names = {}
        if any(n.split(".")[0] == "neuronxcc" for n in _code_names(code)):
            found = _function_ast(func)
            names = _neuronxcc_imports(found[0]) if found is not None else {}
        _LOCAL_IMPORTS[code] = names
    return _LOCAL_IMPORTS[code]


def _code_names(code):
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _code_names(c)


def _beta1_used(func, name, modname) -> None:
    where = f"{inspect.getsourcefile(func) or '?'}:{func.__code__.co_firstlineno}"
    if _version.at_least(0, 4):
        raise _nki_error("nkisim_invalid_argument", api=f"nki kernel {func.__name__} ({where})",
                         why=f"`{name}` is {modname}: using neuronxcc.nki inside an NKI kernel "
                             "is a compile error since NKI 0.4.0; use nki.language / nki.isa")
    # a FutureWarning (shown by default: the kernel's author is the user; a DeprecationWarning
    # is hidden outside __main__), at the kernel's own line
    code = func.__code__
    warnings.warn_explicit(
        f"nki kernel {func.__name__} ({where}) uses `{name}` ({modname}): neuronxcc.nki inside "
        "NKI kernels is deprecated (an error from NKI 0.4.0)", FutureWarning,
        code.co_filename, code.co_firstlineno, module=func.__module__,
        registry=func.__globals__.setdefault("__warningregistry__", {}))


_FUNCTION_ASTS: dict = {}


def _function_ast(func):
    """``(node, first)``: the ``ast.FunctionDef`` of ``func``'s source and the file line of its
    first source line (node line numbers count from 1 there), or None without source. Cached
    per code object."""
    code = func.__code__
    if code not in _FUNCTION_ASTS:
        import ast
        import textwrap
        found = None
        try:
            lines, first = inspect.getsourcelines(func)
            tree = ast.parse(textwrap.dedent("".join(lines)))
        except (OSError, TypeError, SyntaxError, ValueError):
            tree = None
        node = tree.body[0] if tree is not None and tree.body else None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found = (node, max(first, 1))
        _FUNCTION_ASTS[code] = found
    return _FUNCTION_ASTS[code]


# --- the 0.3-0.6 compiler's language restrictions (MIG 0.2->0.3, "Language restrictions") ------
#
# "The NKI 0.3.0 compiler has stricter validation": it "does not support the * separator in
# kernel function signatures", "does not support Python's is / is not operators" and "does not
# support list as a kernel argument type" (sdk232 nki/migration/index.rst, "Language
# restrictions"; spec nki-current.md §1 row 0.3.0 and §2.0 item 5). That is the parser front end
# of 0.3-0.6. 0.7.0's front end specializes kernels by Python tracing, where "meta-programming
# gets full Python semantics" (spec §1, row 0.7.0); no document says 0.7 keeps these three
# restrictions, so under 0.7 they are accepted.
# What AWS's own code does: nki-library d2ad3a5 (2026-04-13, written for NKI 0.3.0, the release
# benchmarks/conformance.py runs it under) has no `*` separator and no list default in any
# function, and its transformer_tkg test passes `replica_groups` as a tuple of tuples although
# the parameter is annotated List[List[int]]; but its CI-tested @nki.jit kernels test
# `x is None` / `x is not None` throughout (core/attention/attention_cte.py: `if sliding_window
# is None:`, `if k_prior is not None:`), and never `is` with another operand. So `is` against
# None is a rule the compiler tolerates (a warning quoting it; an error with NKISIM_STRICT=1)
# and any other `is` / `is not` is the error.

_MIG_LINK = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/migration/index.html"
_IS_RULE = ("The NKI 0.3.0 compiler does not support Python's is / is not operators. These "
            "operators check object identity, which is not meaningful during NKI compilation "
            "tracing. Use == / != instead.")


def _check_language_restrictions(func, args, kwargs) -> None:
    """Under NKI 0.3-0.6: no ``*`` separator in the kernel's signature, no list argument, no
    ``is`` / ``is not`` in the kernel's own body (against ``None``: a tolerated rule)."""
    if _version.at_least(0, 7):
        return
    code = getattr(func, "__code__", None)
    if code is None:
        return
    if code.co_kwonlyargcount and not code.co_flags & inspect.CO_VARARGS:
        kwonly = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
        raise _nki_error("nkisim_invalid_argument", api=_kernel_where(func),
                         why=f"the keyword-only separator `*` before {', '.join(kwonly)}: the "
                             "NKI 0.3.0 compiler does not support the * separator in kernel "
                             "function signatures (NKI 0.3-0.6); move all parameters with "
                             "defaults to the end of the signature")
    for name, value in _kernel_arguments(func, args, kwargs):
        if isinstance(value, list):
            raise _nki_error("nkisim_invalid_argument", api=_kernel_where(func),
                             why=f"argument `{name}` is a list ({value!r}): the NKI 0.3.0 "
                                 "compiler does not support list as a kernel argument type "
                                 "(NKI 0.3-0.6); convert list arguments to tuples at the call "
                                 "site")
    other, against_none = _identity_tests(func)
    if other:
        line, text = other[0]
        raise _nki_error("nkisim_invalid_argument", api=_kernel_where(func),
                         why=f"{text} at line {line}: the NKI 0.3.0 compiler does not support "
                             "Python's is / is not operators (NKI 0.3-0.6); use == / != "
                             "instead")
    if against_none:
        line, text = against_none[0]
        more = f" (and {len(against_none) - 1} more)" if len(against_none) > 1 else ""
        what = f"nki kernel {func.__name__} tests {text} at line {line}{more}"
        if _context.strict_from_env():
            raise _nki_error("nkisim_strict_rule", what=what, rule=_IS_RULE, link=_MIG_LINK)
        if "warnings" in _context.parse_checks(os.environ.get("NKISIM_CHECKS")):
            warnings.warn_explicit(
                _rule_text(what, _IS_RULE, _MIG_LINK), _NKIRuleWarning, code.co_filename, line,
                module=func.__module__,
                registry=func.__globals__.setdefault("__warningregistry__", {}))


def _kernel_where(func) -> str:
    code = func.__code__
    return f"nki kernel {func.__name__} " \
           f"({inspect.getsourcefile(func) or code.co_filename}:{code.co_firstlineno})"


def _kernel_arguments(func, args, kwargs):
    """(parameter name, value) of a launch's arguments, the defaults it leaves included."""
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except (TypeError, ValueError):       # the call itself raises Python's TypeError later
        return [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    bound.apply_defaults()
    return list(bound.arguments.items())


_IDENTITY_TESTS: dict = {}


def _identity_tests(func) -> tuple:
    """``(others, against_none)``: the ``is`` / ``is not`` comparisons in ``func``'s own body
    (its source's AST; nested functions included), each ``(file line, source text)`` in line
    order, those with a ``None`` operand apart. Cached per code object."""
    code = func.__code__
    if code not in _IDENTITY_TESTS:
        import ast
        others, against_none = [], []
        found = _function_ast(func)
        for c in ast.walk(found[0]) if found is not None else ():
            if not isinstance(c, ast.Compare):
                continue
            operands = [c.left, *c.comparators]
            for op, a, b in zip(c.ops, operands, operands[1:]):
                if isinstance(op, (ast.Is, ast.IsNot)):
                    text = f"`{ast.unparse(a)} {'is' if isinstance(op, ast.Is) else 'is not'} " \
                           f"{ast.unparse(b)}`"
                    none = any(isinstance(n, ast.Constant) and n.value is None for n in (a, b))
                    (against_none if none else others).append((found[1] + c.lineno - 1, text))
        _IDENTITY_TESTS[code] = (sorted(others), sorted(against_none))
    return _IDENTITY_TESTS[code]


# ---------------------------------------------------------------------------------------------
# removed runners (RN 2.28: "not available" instead of NotImplementedError)

def _not_available(name, instead):
    def fn(*args, **kwargs):
        raise NotImplementedError(
            f"nki.{name} is not available in this release of NKI ({instead})")
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


baremetal = _not_available(
    "baremetal", "call the @nki.jit kernel with NumPy arrays; on nkisim, or nki.simulate(kernel)")
benchmark = _not_available(
    "benchmark", "there is no public replacement")
profile = _not_available(
    "profile", "set NEURON_FRAMEWORK_DEBUG=1, run on a device, then `neuron-explorer capture`")
