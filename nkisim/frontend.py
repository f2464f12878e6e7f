"""Source rewriting the real NKI front end does before tracing a kernel.

The real front end parses the kernel's source rather than running it as Python. AWS's CI-tested
doc example ``nki_nc_match_replace_indices8_mask`` (aws-neuron-sdk 1db4d74e,
nki/test/test_nki_isa_nc_match_replace8.py) writes a mask with Python ``and``::

    nisa.max8(src=inp_tile[ix, iy], mask=(ix < n // 2 and iy < m // 2))

Run as Python, ``and`` asks for the truth value of a mask expression (which nkisim rejects as
``err_control_flow_condition_depending_on_arange``, as ``if ix < 3:`` must be) and would drop one
of the two predicates. So, like the front end, nkisim rewrites ``and``/``or`` between comparisons
inside a ``mask=`` argument into ``&``/``|`` once, when the kernel is made. Only operands that
are comparisons (or such ``and``/``or`` groups) are rewritten, and only in ``mask=`` arguments;
kernels with closures are left as they are (their cells cannot be rebound to new code).
"""

from __future__ import annotations

import ast
import inspect
import textwrap


def _is_pred(node) -> bool:
    if isinstance(node, ast.Compare):
        return True
    return isinstance(node, ast.BoolOp) and all(_is_pred(v) for v in node.values)


class _MaskBoolOps(ast.NodeTransformer):
    changed = False

    def visit_Call(self, node):
        self.generic_visit(node)
        for kw in node.keywords:
            if kw.arg == "mask":
                kw.value = self._rewrite(kw.value)
        return node

    def _rewrite(self, node):
        if isinstance(node, ast.BoolOp) and _is_pred(node):
            self.changed = True
            op = ast.BitAnd() if isinstance(node.op, ast.And) else ast.BitOr()
            vals = [self._rewrite(v) for v in node.values]
            out = vals[0]
            for v in vals[1:]:
                out = ast.copy_location(ast.BinOp(left=out, op=op, right=v), node)
            return out
        return node


def rewrite_mask_boolops(func):
    """``func`` with ``and``/``or`` between comparisons in ``mask=`` arguments turned into
    ``&``/``|`` (module doc); ``func`` itself when there is nothing to rewrite."""
    code = getattr(func, "__code__", None)
    if code is None or code.co_freevars or getattr(func, "__nkisim_rewritten__", False):
        return func
    try:
        lines, first = inspect.getsourcelines(func)
    except (OSError, TypeError):
        return func
    src = "".join(lines)
    if "mask" not in src or (" and " not in src and " or " not in src):
        return func
    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:
        return func
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return func
    fn.decorator_list = []
    t = _MaskBoolOps()
    t.visit(fn)
    if not t.changed:
        return func
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, first - 1)
    ns = {}
    try:
        exec(compile(tree, code.co_filename, "exec"), func.__globals__, ns)
    except Exception:          # noqa: BLE001 - anything unusual: run the kernel as written
        return func
    new = ns.get(fn.name)
    if new is None:
        return func
    new.__defaults__ = func.__defaults__
    new.__kwdefaults__ = func.__kwdefaults__
    new.__nkisim_rewritten__ = True
    return new


# ---------------------------------------------------------------------------------------------
# Python state carried across the iterations of a traced loop (NKI Beta 1)
#
# The Beta 1 front end runs a loop body once, with a symbolic loop variable: "In NKI 0.1.0,
# range iterators were converted into special objects that allowed the eDSL to capture the
# loop body. Because of this, loops were only executed once by the Python evaluator" (NKI
# migration guide, "Consistent control flow behavior": `val += 1` in `for i in range(8)`
# "will print 1 in NKI 0.1.0"; reference §1.9). nkisim runs the body once per iteration, so a
# Python number the body reads and then changes (`off` in `a[off:off + 128]; off += 128`) takes
# a new value in every iteration here, and its value from before the loop in every iteration
# on the device. `carried_names` finds the candidates in the source; nkisim.ops._loop watches
# their values.

# code object -> ({line of a `for` statement's header: (names, loop variable, picks)}, the
# lines of every `for` statement's header)
_LOOPS: dict = {}


def _loops(code) -> tuple:
    loops = _LOOPS.get(code)
    if loops is None:
        loops = _LOOPS[code] = _loop_table(code)
    return loops


def carried_names(code, line) -> tuple:
    """``(names, variable, picks)``: the names the body of the ``for`` statement at ``line``
    of ``code`` reads before any assignment in the body (so their value comes from before the
    loop or from the previous iteration), assigns somewhere in the body, and reads other than
    to update them (``off += 128`` alone does not count; ``a[off:off + 128]`` does); the loop
    variable's source; and, per name, the names of the containers it only ever indexes
    (``bufs`` in ``bufs[k % 2]``), or None when it has another use. ``((), "", {})`` when the
    source is not available or nothing is carried."""
    return _loops(code)[0].get(line, ((), "", {}))


def for_statement(code, line) -> bool:
    """Is ``line`` of ``code`` in the header of a ``for`` statement (not a comprehension, nor a
    call such as ``list(range(n))``)? False when the source is not available."""
    return line in _loops(code)[1]


def _loop_table(code) -> tuple:
    """``_loops``'s entry of ``code``, from its source."""
    try:
        lines, first = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return {}, frozenset()
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}, frozenset()
    table, headers = {}, set()
    offset = (first or 1) - 1
    reads = None
    for node in _own_nodes(fn.body):
        if isinstance(node, ast.For):
            header = range(node.lineno + offset, node.iter.end_lineno + offset + 1)
            headers.update(header)
            if reads is None:
                reads = _uses(fn.body)
            names, picks = _carried(node, {n for ln, n in reads if ln > node.end_lineno})
            if names:
                entry = (names, ast.unparse(node.target), picks)
                for ln in header:
                    table[ln] = entry
    return table, frozenset(headers)


def _own_nodes(stmts):
    """Every node of ``stmts`` outside nested function, lambda and class bodies."""
    todo = list(stmts)
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                      ast.ClassDef)):
                todo.append(child)


# ``carried_names``'s picks entry of a name the body only updates and the code after the loop
# reads (``n += 1`` in the body, ``1.0 / n`` after it): on the device it holds its value after
# one iteration there ("`val += 1` in `for i in range(8)` will print 1")
AFTER = "after"


# ... of a list the body grows (``parts.append(t)``) and the code after the loop reads: on the
# device it holds one item per loop, not one per iteration
GROWN = "grown"
_GROW = {"append", "extend", "insert"}


def _carried(loop, after=frozenset()) -> tuple:
    """``after``: the names the function reads (other than to report them) after the loop."""
    exposed, stored, used = set(), set(), {}
    _scan(loop.body, set(_targets(loop.target)), exposed, stored, used)
    names = exposed & stored & (set(used) | set(after))
    picks = {n: AFTER if n not in used else None if None in used[n] else frozenset(used[n])
             for n in names}
    grown = {n.func.value.id for n in _own_nodes(loop.body)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
             n.func.attr in _GROW and isinstance(n.func.value, ast.Name)}
    for n in (grown & set(after)) - stored:
        picks[n] = GROWN
    return tuple(sorted(picks)), picks


def _uses(stmts) -> list:
    """``(line, name)`` of every read of a name in ``stmts`` other than a reporting one (a
    print, an f-string, an assert: as ``_loads`` counts them)."""
    harmless, out = set(), []
    for n in _own_nodes(stmts):
        if isinstance(n, ast.Call) and _called(n.func) in _REPORTING or \
                isinstance(n, (ast.JoinedStr, ast.Assert)):
            harmless.update(id(m) for m in ast.walk(n))
    for n in _own_nodes(stmts):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in harmless:
            out.append((n.lineno, n.id))
    return out


def _subscript_bases(node) -> dict:
    """{id of a Name node: the name of the innermost ``container[...]`` whose index holds it},
    for the subscripts of ``node`` whose container is a plain name."""
    bases = {}

    def walk(n, base):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return
        if isinstance(n, ast.Name) and base is not None:
            bases[id(n)] = base
        if isinstance(n, ast.Subscript):
            walk(n.value, base)
            walk(n.slice, n.value.id if isinstance(n.value, ast.Name) else None)
            return
        for child in ast.iter_child_nodes(n):
            walk(child, base)
    walk(node, None)
    return bases


def _targets(node) -> list:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]


def _loads(node, exposed, defined, used, stored=None, updated=()):
    """Record the names ``node`` reads: exposed when not yet defined in this iteration, used
    unless only to update themselves (``updated``: the statement's own targets) or to place a
    direct allocation. AWS's CI-tested reference/allocated_attention.py (nki-samples fc5c69f)
    bumps ``cur_addr`` after every ``ncc.sbuf.mod_alloc(base_addr=cur_addr)`` in an
    ``affine_range`` body, and nkisim already gives such an allocation the traced body's
    address, its first iteration's (``nkisim.tensor._traced_base``): those reads change
    nothing."""
    harmless = set()            # ids of the nodes whose reads are not uses
    bases = _subscript_bases(node)
    # `(lo := m * 64)`: bound before the rest of the statement reads it (nearly always: the
    # statement is read as a whole)
    walrus = {n.target.id for n in _own_nodes([node]) if isinstance(n, ast.NamedExpr)}
    outer = defined
    if walrus:
        defined = defined | walrus
    for n in _own_nodes([node]):
        if isinstance(n, ast.Call) and (_called(n.func).endswith("alloc") or
                                        _called(n.func) in _REPORTING) or \
                isinstance(n, (ast.JoinedStr, ast.Assert)):
            # (reporting reads - a debug print, an f-string name, an assert - change no
            # instruction either: `count += 1; print(count)` is harmless on the device)
            harmless.update(id(m) for m in ast.walk(n))
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            if n.id not in defined:
                exposed.add(n.id)
            if n.id not in updated and id(n) not in harmless:
                used.setdefault(n.id, set()).add(bases.get(id(n)))
    if walrus:
        outer.update(walrus)
        if stored is not None:
            stored.update(walrus)


_REPORTING = {"print", "repr", "str", "format", "debug", "info", "warning", "error", "log"}


def _called(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _scan(stmts, defined, exposed, stored, used):
    """One pass over a body in execution order. A name assigned in a branch of an ``if`` or
    in a nested ``for`` body counts as defined after it: the Beta 1 front end traces a nested
    loop's body once (an nl.static_range one is unrolled), and an ``if`` on trace-time values
    takes the same branch in every iteration (one on a carried number is caught through that
    number), so ``if pool == 2: row = r * 2`` / ``else: row = r`` defines ``row`` afresh in
    every iteration. A name assigned only in a ``while``, ``try`` or ``else`` block of a loop
    counts as assigned but not as defined after it (the block may not run)."""
    for s in stmts:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(s.name)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            _loads(s.iter, exposed, defined, used, stored)
            names = _targets(s.target)
            stored.update(names)
            inner = defined | set(names)
            _scan(s.body, inner, exposed, stored, used)
            _scan(s.orelse, set(defined), exposed, stored, used)
            defined.update(inner)
        elif isinstance(s, ast.While):
            _loads(s.test, exposed, defined, used, stored)
            _scan(s.body, set(defined), exposed, stored, used)
            _scan(s.orelse, set(defined), exposed, stored, used)
        elif isinstance(s, ast.If):
            _loads(s.test, exposed, defined, used, stored)
            then, other = set(defined), set(defined)
            _scan(s.body, then, exposed, stored, used)
            _scan(s.orelse, other, exposed, stored, used)
            defined.update(then | other)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                _loads(item.context_expr, exposed, defined, used, stored)
                if item.optional_vars is not None:
                    names = _targets(item.optional_vars)
                    stored.update(names)
                    defined.update(names)
            _scan(s.body, defined, exposed, stored, used)
        elif isinstance(s, ast.Try):
            _scan(s.body, set(defined), exposed, stored, used)
            for h in s.handlers:
                _scan(h.body, set(defined), exposed, stored, used)
            _scan(s.orelse, set(defined), exposed, stored, used)
            _scan(s.finalbody, set(defined), exposed, stored, used)
        elif isinstance(s, ast.AugAssign):
            names = _targets(s.target) if isinstance(s.target, ast.Name) else []
            _loads(s.value, exposed, defined, used, stored)
            _loads(s.target, exposed, defined, used, stored)   # (a subscript's own names)
            for name in names:                              # `x += ...` reads x to update it
                if name not in defined:
                    exposed.add(name)
            stored.update(names)
            defined.update(names)
        elif isinstance(s, (ast.Assign, ast.AnnAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if s.value is not None:
                _loads(s.value, exposed, defined, used, stored, updated=names)
            for t in targets:
                if not isinstance(t, ast.Name):
                    _loads(t, exposed, defined, used, stored)   # `a[i] = ...`, `x, y = ...`
                    for n in _targets(t):
                        if isinstance(t, (ast.Tuple, ast.List)):
                            stored.add(n)
                            defined.add(n)
            if s.value is not None or isinstance(s, ast.Assign):
                stored.update(names)
                defined.update(names)
        else:
            _loads(s, exposed, defined, used, stored)
            for n in _own_nodes([s]):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    stored.add(n.id)            # (walrus, import, ...)
                    defined.add(n.id)
