"""``t[key] = op(...)``: the instruction's result written straight into ``t[key]`` (issue 12).

Beta 1 returns every result as a new tile; ``t[key] = nl.load(...)`` (the handout's tiled vector
add) or ``res[m] = nisa.tensor_tensor(...)`` then retargets the instruction to ``t[key]``
(``tensor.assign``): nkisim built the result tile, wrote it, copied it into ``t[key]`` and
discarded it. The current face's ``nisa.op(dst=...)`` already writes ``dst`` directly
(``tensor.write_into``, ``nkisim.nki.isa._direct``); this module gives the Beta 1 form the same
path. Measured on the handout's ROW_CHUNK=1 tiled kernel shape (two ``x[...] = nl.load(...)``
per iteration): 267 us per iteration against 196 for the same loads spelled
``nisa.dma_copy(dst=...)`` (tmp script, min of 5); with this module the Beta 1 form runs in
0.81-0.91 of the time it took (``benchmarks/dst_form.py``).

An op decorated with :func:`into_target`, called by kernel code (not by nkisim itself), looks at
its caller's bytecode: when the call's value goes straight into a ``STORE_SUBSCR`` whose target
and key are plain loads, constants, slices, tuples, int arithmetic and list items (the forms
above, ``ot[:, co, r:r + nr, :] = ...``, ``tiles[k][...] = ...``), on the call's line, it
evaluates target and key itself (pure: names, int arithmetic and list or tuple items only;
anything else and the op runs as before) and hands ``target[key]`` to the op as
``run.into``. Where the op can write there directly (``ops.result_tile`` ->
``tensor.write_into``, ``ops.load``) it returns :data:`tensor.STORED`, which
``Tensor.__setitem__`` takes as done; otherwise it returns its result tile as before and the
assignment retargets it. Both paths leave the same trace, errors, warnings, lifetimes and clock
(tests/nkisim/test_lazy_matmul.py runs kernels both ways and compares them;
benchmarks/dst_form.py times them).

The analysis is cached per code object; a call that is not such an assignment costs two dict
lookups (about 0.7-1.2 us per call with the wrapper, measured).
"""

from __future__ import annotations

import dis
import functools
import operator
import sys

from . import checks, context
from .errors import _PKG_DIR
from .tensor import STORED, Tensor

# False: every op builds its result tile and the assignment retargets it (tests compare both)
ENABLED = True

_BINOPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
           "%": operator.mod,
           # CPython 3.10's opcodes
           "BINARY_ADD": operator.add, "BINARY_SUBTRACT": operator.sub,
           "BINARY_MULTIPLY": operator.mul, "BINARY_FLOOR_DIVIDE": operator.floordiv,
           "BINARY_MODULO": operator.mod}
# the int methods an operator may call (an int subclass that overrides none is plain arithmetic)
_METHODS = {operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
            operator.mul: ("__mul__", "__rmul__"),
            operator.floordiv: ("__floordiv__", "__rfloordiv__"),
            operator.mod: ("__mod__", "__rmod__"), operator.neg: ("__neg__", "__neg__")}
_LOCAL = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CLASSDEREF")
_SKIP = ("NOP", "EXTENDED_ARG", "CACHE")

_SITES: dict = {}       # code object -> {f_lasti of a call: (its store target's steps, names)}


def _steps(ins, lines, i):
    """The steps that compute (target, key) of the ``STORE_SUBSCR`` that stores the value of
    call ``ins[i]``, when everything between them only pushes names, constants, slices, tuples
    and arithmetic above that value, on the call's line; else None. (On another line, as in
    ``t[...] = \\`` + newline + ``nl.load(x)``, the assignment's checks name the store's line,
    which the op cannot name.)"""
    steps = []
    depth = 0                   # values above the call's
    for j in range(i + 1, len(ins)):
        x = ins[j]
        if lines[j] != lines[i]:
            return None
        op = x.opname
        if op in _SKIP:
            continue
        if op == "LOAD_CONST":
            steps.append(("const", x.argval))
            depth += 1
        elif op in _LOCAL:
            steps.append(("local", x.argval))
            depth += 1
        elif op == "LOAD_FAST_LOAD_FAST":            # (3.13)
            steps += [("local", n) for n in x.argval]
            depth += 2
        elif op == "LOAD_NAME":
            steps.append(("name", x.argval))
            depth += 1
        elif op == "LOAD_GLOBAL":
            if sys.version_info >= (3, 11) and x.arg & 1:
                return None                          # (pushes NULL first: a call follows)
            steps.append(("global", x.argval))
            depth += 1
        elif op in ("BUILD_SLICE", "BUILD_TUPLE"):
            n = x.arg
            if depth < n:
                return None
            steps.append(("slice" if op == "BUILD_SLICE" else "tuple", n))
            depth -= n - 1
        elif op == "BINARY_OP" or op in _BINOPS:
            fn = _BINOPS.get(x.argrepr if op == "BINARY_OP" else op)
            if fn is None or depth < 2:
                return None
            steps.append(("binary", fn))
            depth -= 1
        elif op == "BINARY_SUBSCR":                  # (`tiles[k][...] = ...`: a list's item)
            if depth < 2:
                return None
            steps.append(("item", None))
            depth -= 1
        elif op == "UNARY_NEGATIVE":
            if depth < 1:
                return None
            steps.append(("unary", operator.neg))
        elif op == "STORE_SUBSCR":                   # TOS1[TOS] = TOS2 (the call's value)
            return tuple(steps) if depth == 2 else None
        elif op == "STORE_SLICE":                    # (3.12+) TOS2[TOS1:TOS] = TOS3
            return tuple(steps) + (("slice", 2),) if depth == 3 else None
        else:
            return None
    return None


def _assigned_calls(code) -> dict:
    """{line: names} of the calls that are the whole value of a ``t[key] = name(...)`` or
    ``t[key] = obj.name(...)`` statement in ``code``'s source (the line the call starts on).
    While an op runs, its caller's frame says which call instruction is running, not which
    function that call called: ``t[...] = functools.reduce(nl.add, tiles)`` runs ``nl.add``
    from C at the call of ``reduce``, whose value is stored. The op's name must be the
    callee's. {} without the source (nothing is written straight into a target then)."""
    import ast
    import inspect
    import textwrap
    try:
        lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return {}
    shift = start - 1 if start > 0 else 0           # (a module's code: start 0, line 1 first)
    found: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Subscript) and isinstance(node.value, ast.Call):
            f = node.value.func
            name = f.attr if isinstance(f, ast.Attribute) else \
                f.id if isinstance(f, ast.Name) else None
            if name is not None:
                found.setdefault(node.value.lineno + shift, set()).add(name)
    return found


def _instructions(code):
    """(``code``'s instructions without caches, each one's line), or None for nkisim's own
    code and code objects ``dis`` cannot read (3.11+: positions; 3.10: line starts)."""
    if code.co_filename.startswith(_PKG_DIR):
        return None
    try:
        ins = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    except Exception:           # noqa: BLE001 - an unusual code object: the general path
        return None
    lines, line = [], None
    for x in ins:
        pos = getattr(x, "positions", None)
        if pos is not None and pos.lineno is not None:
            line = pos.lineno
        elif x.starts_line is not None:
            line = x.starts_line
        lines.append(line)
    return ins, lines


def _analyse(code) -> dict:
    """{f_lasti: (steps, names)} of the calls of ``code`` whose value a ``STORE_SUBSCR``
    stores, ``names`` the callee names such statements have on the call's line
    (``_assigned_calls``). While the callee runs, ``f_lasti`` is the call's offset or, with
    inline caches (3.11, 3.12), its last cache unit's: both are keys (as
    ``engines._iadd_calls``). Nothing for nkisim's own code (an op nkisim calls for itself
    builds its result as always)."""
    found = _instructions(code)
    if found is None:
        return {}
    ins, lines = found
    sites = {}
    assigned = None
    for i, x in enumerate(ins[:-1]):
        if x.opname.startswith("CALL"):
            steps = _steps(ins, lines, i)
            if steps is not None:
                if assigned is None:
                    assigned = _assigned_calls(code)
                names = assigned.get(lines[i])
                if names:
                    sites[x.offset] = sites[ins[i + 1].offset - 2] = (steps, frozenset(names))
    return sites


def _plain_int(x) -> bool:
    return type(x) is int or (isinstance(x, int) and type(x) is not bool)


def _int_arith(fn, a, b) -> bool:
    """``fn(a, b)`` is int arithmetic with no side effect (a loop index is an int subclass that
    keeps int's arithmetic)."""
    names = _METHODS[fn]
    for x in (a, b):
        t = type(x)
        if t is int:
            continue
        if not isinstance(x, int) or t is bool or \
                any(getattr(t, n) is not getattr(int, n) for n in names):
            return False
    return True


def _key_ok(key) -> bool:
    for k in key if type(key) is tuple else (key,):
        if k is Ellipsis or _plain_int(k):
            continue
        if type(k) is slice and all(v is None or _plain_int(v)
                                    for v in (k.start, k.stop, k.step)):
            continue
        return False
    return True


def code_sites(cache: dict, code, analyse):
    """``analyse(code)``, computed once per code object in ``cache`` (bounded: kernels compiled
    anew, e.g. exec'd, do not grow it without end). Also ``engines._iadd_follows``'s cache."""
    sites = cache.get(code)
    if sites is None:
        if len(cache) >= 4096:
            cache.clear()
        sites = cache[code] = analyse(code)
    return sites


def _evaluate(frame, steps):
    """The view ``t[key]`` that the call ``frame`` is making stores its value into, from the
    call site's ``steps`` (``t`` an on-chip tile, ``key`` ints, slices and ``...``), or None."""
    stack = []
    local = None
    try:
        for kind, arg in steps:
            if kind == "const":
                stack.append(arg)
            elif kind == "local":
                if local is None:
                    local = frame.f_locals
                stack.append(local[arg])
            elif kind == "global":
                g = frame.f_globals
                stack.append(g[arg] if arg in g else frame.f_builtins[arg])
            elif kind == "name":
                if local is None:
                    local = frame.f_locals
                stack.append(local[arg] if arg in local else frame.f_globals[arg]
                             if arg in frame.f_globals else frame.f_builtins[arg])
            elif kind == "slice" or kind == "tuple":
                items = stack[len(stack) - arg:]
                del stack[len(stack) - arg:]
                stack.append(slice(*items) if kind == "slice" else tuple(items))
            elif kind == "item":
                k = stack.pop()
                seq = stack.pop()
                if type(seq) not in (list, tuple) or not _plain_int(k):
                    return None
                stack.append(seq[k])
            elif kind == "binary":
                b = stack.pop()
                a = stack.pop()
                if not _int_arith(arg, a, b):
                    return None
                stack.append(arg(a, b))
            else:
                a = stack.pop()
                if not _int_arith(arg, a, 0):
                    return None
                stack.append(arg(a))
    except (KeyError, IndexError, ArithmeticError):    # (CPython raises it, after the op)
        return None
    t, key = stack
    if type(t) is not Tensor or t.root.buffer == "hbm" or not _key_ok(key):
        return None
    try:
        return t[key]
    except Exception:           # noqa: BLE001 - the assignment raises it, after the op as before
        return None


def into_target(fn=None, *, unless=()):
    """Decorate a core op whose result ``ops.result_tile`` (or ``ops.load``) can write into
    ``run.into``: called by kernel code as ``t[key] = op(...)``, it writes ``t[key]`` and returns
    ``STORED`` when it can. ``unless``: keyword arguments that, when given, keep the general
    path (``activation``'s ``reduce_res``: a second written region)."""
    if fn is None:
        return functools.partial(into_target, unless=unless)
    name = fn.__name__

    @functools.wraps(fn)
    def op(*args, **kwargs):
        # (every call of the op pays for this: the common miss is two dict lookups)
        frame = sys._getframe(1)
        sites = _SITES.get(frame.f_code)
        if sites is None:
            sites = code_sites(_SITES, frame.f_code, _analyse)
        site = sites.get(frame.f_lasti) if sites else None
        if site is None or name not in site[1] or not ENABLED or \
                (unless and any(kwargs.get(k) is not None for k in unless)):
            return fn(*args, **kwargs)
        view = _evaluate(frame, site[0])
        del frame
        if view is None:
            return fn(*args, **kwargs)
        run = context.current()
        if run.into is not None:
            return fn(*args, **kwargs)
        res, _ = call_into(run, view, fn, args, kwargs)
        return STORED if res is view else res
    return op


def call_into(run, dst, fn, args, kwargs):
    """``fn(*args, **kwargs)`` with ``run.into = dst`` (the op's result goes straight into
    ``dst`` if it can): (its result, which is ``dst`` when it did, and the record it made
    writing ``dst``, else None). ``dst``'s own ``_producer`` is left as it was. Also the
    current face's ``nki.isa._direct``."""
    prev = dst._producer
    run.into = dst
    try:
        res = fn(*args, **kwargs)
    finally:
        run.into = run.direct = None
        instr, dst._producer = dst._producer, prev      # (a record of dst's own, if any)
    return res, instr if res is dst else None


_STORES: dict = {}      # code object -> {f_lasti: steps of the store its value goes into}


def _store_sites(code) -> dict:
    """{f_lasti: steps} of ``code``'s calls and binary operators whose value a
    ``STORE_SUBSCR`` on the same line stores (``_steps``), whatever the callee."""
    found = _instructions(code)
    if found is None:
        return {}
    ins, lines = found
    sites = {}
    for i, x in enumerate(ins[:-1]):
        if x.opname.startswith("CALL") or x.opname == "BINARY_OP" or x.opname in _BINOPS:
            steps = _steps(ins, lines, i)
            if steps is not None:
                sites[x.offset] = sites[ins[i + 1].offset - 2] = steps
    return sites


def stored_into():
    """The view the kernel's current call or operator stores its value into (``t[key] =
    nl.add(t, x)``, ``t[key] = t + x``), an on-chip tile view, or None. For the race checks,
    which exempt ``t[...] = t + x`` as they exempt ``t += x`` (reference §1.11: "psum_tile
    += X is psum_tile[...] = psum_tile + X"); called only when an access would race."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
    if f is None:
        return None
    steps = code_sites(_STORES, f.f_code, _store_sites).get(f.f_lasti)
    return None if steps is None else _evaluate(f, steps)


checks.STORED_INTO = stored_into
