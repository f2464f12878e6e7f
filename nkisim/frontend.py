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
