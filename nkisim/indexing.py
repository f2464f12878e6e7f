"""Index expressions: ``nl.arange``/``nl.mgrid`` affine expressions, masks, ``nl.ds``, ``par_dim``.

Semantics (ref §1.5): basic indexing (ints, loop variables, ``start:stop[:step]`` slices,
``nl.ds(start, size)``, ``...``) gives a view; advanced indexing broadcasts affine index
expressions NumPy-style and the result has the broadcast shape. Mixing slices with index
expressions is ``err_unsupported_mixing_basic_advanced_tensor_indexing``; a bare 1-D ``arange``
is ``err_1d_arange_not_supported``; any static index range outside the dimension is
``err_tensor_access_out_of_bound`` (NumPy would silently clip a slice; NKI refuses). Negative
indices are out of bound too in Beta 1 (a symbolic loop index minus one is an address below the
tensor); nki 0.3+ counts them from the end, as Python does (``normalize_key(negative=True)``).
"""

from __future__ import annotations

import numpy as np

from .errors import nki_error


class IndexExpr:
    """An affine index expression: an int array with NumPy broadcasting semantics.

    Immutable. ``form()`` (what ``normalize_key`` needs of it: its bounds, and whether it picks
    a line) is computed once per expression: kernels index with the same ``nl.mgrid`` grids in
    every iteration, and a grid's analysis is a pass over all its elements (issue 12: a trn1
    course conv2d indexing every matmul operand with 128x444 ``nl.mgrid`` grids spent 220 us
    per index on it, 1.9 s of a 5.2 s simulation). An expression made of one with a known form
    and an int (``m * 128 + i_p``) gets its form without a pass (``_bin``).
    """

    __slots__ = ("v", "_form")
    __array_priority__ = 100

    def __init__(self, v, form=None):
        self.v = np.asarray(v, dtype=np.int64)
        self._form = form           # None: not computed yet; see form()

    def form(self):
        """``(axis, start, step)`` when the values are ``start + step * i`` along ``axis`` (i
        the index along it) and constant along every other axis (``axis`` None, ``step`` 0:
        one value everywhere); False for any other expression, and for an empty one."""
        f = self._form
        if f is None:
            f = self._form = _affine_form(self.v)
        return f

    def bounds(self):
        """(min, max) of a non-empty expression."""
        f = self.form()
        if not f:
            return int(self.v.min()), int(self.v.max())
        axis, start, step = f
        last = start if axis is None else start + step * (self.v.shape[axis] - 1)
        return min(start, last), max(start, last)

    @property
    def shape(self):
        return self.v.shape

    @property
    def ndim(self):
        return self.v.ndim

    def __getitem__(self, key):
        return IndexExpr(self.v[key])

    def __setitem__(self, key, value):
        raise nki_error("err_cannot_assign_to_index")

    def _bin(self, other, fn, form_of=None, nonaffine=False):
        """``fn(self, other)``; ``form_of(axis, start, step, c)`` gives the result's form from
        this one's when ``other`` is an int ``c`` (None: computed when asked)."""
        o = other.v if isinstance(other, IndexExpr) else other
        if isinstance(other, MaskExpr) or isinstance(o, float):
            raise nki_error("err_unsupported_expression_in_mask")
        if nonaffine or isinstance(self, NonAffine) or isinstance(other, NonAffine):
            return NonAffine(fn(self.v, o))
        form = None
        f = self._form
        if f and form_of is not None and isinstance(o, (int, np.integer)) \
                and not isinstance(o, bool):
            form = form_of(*f, int(o))
            if form[2] == 0:
                form = (None, form[1], 0)       # times 0: one value everywhere
        return IndexExpr(fn(self.v, o), form)

    def __add__(self, o): return self._bin(o, np.add, lambda a, s, d, c: (a, s + c, d))
    def __radd__(self, o): return self._bin(o, lambda a, b: b + a,
                                            lambda a, s, d, c: (a, s + c, d))
    def __sub__(self, o): return self._bin(o, np.subtract, lambda a, s, d, c: (a, s - c, d))
    def __rsub__(self, o): return self._bin(o, lambda a, b: b - a,
                                            lambda a, s, d, c: (a, c - s, -d))
    def __mul__(self, o): return self._bin(o, np.multiply, lambda a, s, d, c: (a, s * c, d * c),
                                           isinstance(o, IndexExpr))
    def __rmul__(self, o): return self._bin(o, lambda a, b: b * a,
                                            lambda a, s, d, c: (a, s * c, d * c))
    # (`i // 2`, `i % 4` and `i * j` are not affine: NonAffine)
    def __floordiv__(self, o): return self._bin(o, np.floor_divide, nonaffine=True)
    def __rfloordiv__(self, o): return self._bin(o, lambda a, b: b // a, nonaffine=True)
    def __mod__(self, o): return self._bin(o, np.mod, nonaffine=True)
    def __rmod__(self, o): return self._bin(o, lambda a, b: b % a, nonaffine=True)

    def __neg__(self):
        f = self._form
        return IndexExpr(-self.v, (f[0], -f[1], -f[2]) if f else None)

    def _cmp(self, other, fn):
        if isinstance(self, NonAffine) or isinstance(other, NonAffine):
            # "mask=(i % 4) < 2  # Error: i % 2 is not an affine expression" (nki.errors)
            raise nki_error("err_unsupported_expression_in_mask")
        o = other.v if isinstance(other, IndexExpr) else other
        return MaskExpr(fn(self.v, o))

    def __lt__(self, o): return self._cmp(o, np.less)
    def __le__(self, o): return self._cmp(o, np.less_equal)
    def __gt__(self, o): return self._cmp(o, np.greater)
    def __ge__(self, o): return self._cmp(o, np.greater_equal)
    def __eq__(self, o): return self._cmp(o, np.equal)  # noqa: D105 - mask, like NKI
    def __ne__(self, o): return self._cmp(o, np.not_equal)
    __hash__ = object.__hash__

    def __bool__(self):
        raise nki_error("err_control_flow_condition_depending_on_arange")

    def __index__(self):
        raise nki_error("err_control_flow_condition_depending_on_arange")

    def __repr__(self):
        return f"IndexExpr(shape={self.v.shape})"


class NonAffine(IndexExpr):
    """An index expression that is not affine in the aranges (``i // 2``, ``i % 4``, ``i *
    j``): "Index represents the result of the affine expression" (Beta 1 programming model);
    a mask of one is err_unsupported_expression_in_mask (whose doc example is ``(i % 4) < 2``),
    an index of one is refused by ``normalize_key``."""

    __slots__ = ()

    def __getitem__(self, key):
        return NonAffine(self.v[key])

    def __neg__(self):
        return NonAffine(-self.v)

    def form(self):
        return False


def _affine_form(v):
    """``IndexExpr.form`` of the int array ``v`` (one pass per axis of length > 1)."""
    if v.size == 0:
        return False
    start = int(v.flat[0])
    axis = None
    for a in range(v.ndim):
        if v.shape[a] > 1 and not (v == v[(slice(None),) * a + (slice(0, 1),)]).all():
            if axis is not None:
                return False            # varies along two axes
            axis = a
    if axis is None:
        return (None, start, 0)
    line = v[tuple(slice(None) if d == axis else 0 for d in range(v.ndim))]
    step = int(line[1]) - start
    if len(line) > 2 and not (np.diff(line) == step).all():
        return False
    return (axis, start, step)


class MaskExpr:
    """A predicate over index expressions, combined with ``&`` (ref §1.12)."""

    __slots__ = ("v", "combined")

    def __init__(self, v, combined=False):
        self.v = np.asarray(v, dtype=bool)
        self.combined = combined        # built with & or | (affine_select refuses it)

    # A Python bool operand is a predicate over the enclosing loop indices that nkisim, whose
    # loop indices are concrete integers, has already evaluated: AWS's
    # reference/allocated_fused_linear.py (nki-samples fc5c69f, CI-tested) stores with
    # `mask=(i_res.x < head_dim) & ((2*i + grp) * pmax < seqlen)`, `i` an affine_range index.
    # It is constant over the instruction's elements, so it combines as an all-True/False mask.
    @staticmethod
    def _operand(o):
        if isinstance(o, MaskExpr):
            return o.v
        if isinstance(o, (bool, np.bool_)):
            return bool(o)
        raise nki_error("err_unsupported_expression_in_mask")

    def __and__(self, o):
        return MaskExpr(self.v & MaskExpr._operand(o), True)

    __rand__ = __and__

    def __or__(self, o):
        return MaskExpr(self.v | MaskExpr._operand(o), True)

    __ror__ = __or__

    def __invert__(self):
        return MaskExpr(~self.v)

    def __setitem__(self, key, value):
        raise nki_error("err_cannot_assign_to_index")

    def __bool__(self):
        raise nki_error("err_control_flow_condition_depending_on_arange")


def arange(*args):
    """``nl.arange(stop)`` / ``nl.arange(start, stop)``: a 1-D index expression (no step)."""
    if len(args) not in (1, 2) or not all(isinstance(a, (int, np.integer)) for a in args):
        raise nki_error("nkisim_invalid_argument", api="nl.arange",
                        why="expects integer (stop) or (start, stop); steps are not supported")
    return IndexExpr(np.arange(*[int(a) for a in args]))


class _MGridResult(tuple):
    """The grids of ``nl.mgrid[...]``; unpackable, with ``.p``/``.x``/``.y`` attributes."""

    def __setitem__(self, key, value):
        raise nki_error("err_cannot_assign_to_index")

    def _axis(self, i, attr):
        if i >= len(self):
            names = ", ".join(f".{a} (dim {k})" for k, a in enumerate("pxyz"[:len(self)]))
            raise nki_error("nkisim_invalid_argument", api=f"nl.mgrid(...).{attr}",
                            why=f"this grid has {len(self)} dimensions: {names}; .{attr} needs "
                                f"a grid of at least {i + 1}")
        return self[i]

    @property
    def p(self):
        return self._axis(0, "p")

    @property
    def x(self):
        return self._axis(1, "x")

    @property
    def y(self):
        return self._axis(2, "y")

    @property
    def z(self):
        # the fourth grid (nki.language.mgrid docstring: "i_p, i_x, i_y, i_z ... .z"; AWS's
        # reference kernels index 4-D tiles with `grid.z`)
        return self._axis(3, "z")


class _MGrid:
    """``nl.mgrid[0:a, 0:b, ...]``: dense grids, same as NumPy mgrid (ref §1.5)."""

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        for k in key:
            if not isinstance(k, slice) or isinstance(k.step, complex):
                raise nki_error("nkisim_invalid_argument", api="nl.mgrid",
                                why="expects integer slices start:stop[:step]")
        grids = np.mgrid[key]
        if len(key) == 1:
            grids = [grids]
        return _MGridResult(IndexExpr(g) for g in grids)


mgrid = _MGrid()


class DynSlice:
    """``nl.ds(start, size)`` == ``start:start+size``."""

    __slots__ = ("start", "size", "step")

    def __init__(self, start, size, step=1):
        self.start = whole(start, "the start of nl.ds")
        self.size = whole(size, "the size of nl.ds")
        self.step = whole(step, "the step of nl.ds")

    def as_slice(self) -> slice:
        return slice(self.start, self.start + self.size * self.step, self.step)


def ds(start, size, step=1):
    return DynSlice(start, size, step)


class par_dim:
    """Marks the partition dimension in a shape: ``(N, nl.par_dim(128), F)``."""

    __slots__ = ("size",)

    def __init__(self, size):
        self.size = whole(size, "nl.par_dim's size")

    def __int__(self):
        return self.size

    def __index__(self):
        return self.size

    def __repr__(self):
        return f"par_dim({self.size})"


def whole(v, what: str) -> int:
    """``int(v)`` for a size, loop bound, slice bound or index a kernel gave. A float with an
    integral value (``M / 128`` that divides) passes: there is no evidence the front end
    refuses it. A fractional float, or anything ``int()`` refuses (a tuple: `affine_range(
    a.shape)`), is ``nkisim_not_an_integer`` (a TypeError, as Python's ``range`` raises)."""
    if type(v) is int:
        return v
    if isinstance(v, (float, np.floating)):
        if float(v).is_integer():
            return int(v)
        raise nki_error("nkisim_not_an_integer", what=what, value=float(v),
                        hint=" (`/` divides to a float; `//` for an integer)")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise nki_error("nkisim_not_an_integer", what=what, value=v, hint="") from None


def split_shape(shape) -> tuple[tuple, int]:
    """Plain int shape and the partition axis (the ``par_dim`` position, default 0)."""
    if type(shape) is tuple:           # the common case, every instruction's result: as is
        for s in shape:
            if type(s) is not int:
                break
        else:
            return shape, 0
    if isinstance(shape, (int, np.integer, par_dim)):
        shape = (shape,)
    paxis = 0
    out = []
    for i, s in enumerate(shape):
        if isinstance(s, par_dim):
            paxis = i
        out.append(whole(s, f"dimension {i} of the shape {_shape_text(shape)}"))
    return tuple(out), paxis


def _shape_text(shape) -> str:
    try:
        return "(" + ", ".join(repr(getattr(s, "size", s)) for s in shape) + ")"
    except TypeError:
        return repr(shape)


class _SliceGrid(IndexExpr):
    """A slice rewritten as an index expression (not the user's 1-D arange)."""

    __slots__ = ()


def _slice_oob(k, size) -> bool:
    if isinstance(k, DynSlice):
        k = k.as_slice()
    if not isinstance(k, slice):
        return False
    start = 0 if k.start is None else int(k.start)
    stop = size if k.stop is None else int(k.stop)
    # a slice running past the end only: a negative start is an address below the tensor
    # (Beta 1) or was counted from the end already (nki 0.3+, normalize_key), never a view of
    # the slice's length (`t[:, -8:]` of a 64-wide tile was a 72-wide view)
    return (k.step is None or int(k.step) > 0) and 0 <= start < stop and stop > size


def _slices_as_grid(key, shape):
    """``key`` (ints and slices) as broadcasting index expressions of the same result shape."""
    key = tuple(k.as_slice() if isinstance(k, DynSlice) else k for k in key)
    n = sum(isinstance(k, slice) for k in key)
    out, j = [], 0
    for d, k in enumerate(key):
        if isinstance(k, slice):
            start = 0 if k.start is None else int(k.start)
            stop = shape[d] if k.stop is None else int(k.stop)
            v = np.arange(start, stop, 1 if k.step is None else int(k.step))
            out.append(_SliceGrid(v.reshape((1,) * j + (-1,) + (1,) * (n - j - 1))))
            j += 1
        else:
            out.append(k)
    return tuple(out)


def _from_end(k, size):
    """An int index or slice bound ``k`` counted from the end when negative (Python's rule; a
    bound still negative after that stays negative: out of bound, never clipped)."""
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k < 0:
        return int(k) + size
    return k


def _python_negative(key, shape):
    """``key`` (Ellipsis expanded) with negative ints and slice bounds counted from the end."""
    out = []
    for k, size in zip(key, shape):
        if isinstance(k, slice):
            k = slice(_from_end(k.start, size), _from_end(k.stop, size), k.step)
        else:
            k = _from_end(k, size)
        out.append(k)
    return tuple(out) + tuple(key[len(out):])


def normalize_key(key, shape, name, oob=None, negative=False):
    """Validate an index against ``shape``.

    ``negative``: negative ints and slice bounds count from the end, as in Python (nki 0.3+,
    ``nkisim.context.Rules.negative_indices``); otherwise they are out of bound (Beta 1).

    Returns ``(kind, key)``: ``("basic", tuple of int/slice)`` or
    ``("advanced", tuple of int/int-array)``. ``None`` is not allowed (NKI has no newaxis on
    tensors).

    With a list ``oob``, out-of-bound index *expressions* do not raise: a mask may keep the
    access in bounds ("masks prevent OOB errors", ref §1.12). Their indices are clipped and
    ``(bad elements, error fields)`` is appended to ``oob``; the op that uses the view raises
    ``err_tensor_access_out_of_bound`` unless its mask excludes every bad element.
    """
    if not isinstance(key, tuple):
        key = (key,)
    # expand Ellipsis
    if any(k is Ellipsis for k in key):
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        rest = len(key) - 1
        key = key[:i] + (slice(None),) * (len(shape) - rest) + key[i + 1:]
    if len(key) > len(shape):
        raise nki_error("nkisim_invalid_argument", api=f"indexing `{name}`",
                        why=f"{len(key)} indices for a tensor of shape {list(shape)}")
    if negative:
        key = _python_negative(key, shape)
    advanced = any(isinstance(k, IndexExpr) for k in key)
    if oob is not None and not advanced and any(
            _slice_oob(k, shape[d]) for d, k in enumerate(key)):
        # A slice running past the tensor's end: the instruction's mask decides, as for index
        # expressions (AWS's reference/vision.py adaptive_avg_pool2d slices past the end under
        # a mask; "NKI API Masking": masked-out elements are not accessed). The view becomes
        # an index grid of the slice's full extent; its out-of-bound elements are recorded.
        key, advanced = _slices_as_grid(key, shape), True
    out, forms = [], []
    for dim, k in enumerate(key):
        size = shape[dim]
        if isinstance(k, DynSlice):
            k = k.as_slice()
        if isinstance(k, slice):
            if advanced:
                raise nki_error("err_unsupported_mixing_basic_advanced_tensor_indexing")
            start, stop, step = k.start, k.stop, k.step
            start = 0 if start is None else whole(start, f"the start of a slice of `{name}`")
            stop = size if stop is None else whole(stop, f"the stop of a slice of `{name}`")
            step = 1 if step is None else whole(step, f"the step of a slice of `{name}`")
            if step <= 0:
                raise nki_error("nkisim_invalid_argument", api=f"indexing `{name}`",
                                why="slice steps must be positive")
            if start < 0 or stop > size or start > stop:
                hi = stop - 1 if stop > start else start
                raise nki_error("err_tensor_access_out_of_bound", name=name, dim=dim,
                                lo=start, hi=hi, size=size)
            out.append(slice(start, stop, step))
        elif isinstance(k, IndexExpr):
            if k.ndim == 1 and not isinstance(k, _SliceGrid):
                raise nki_error("err_1d_arange_not_supported", name=name)
            if type(k) is NonAffine:
                raise nki_error("nkisim_invalid_argument", api=f"indexing `{name}`",
                                why=f"the index of dimension {dim} is not affine in the "
                                    "aranges (`//`, `%`, or a product of two index "
                                    "expressions): \"Index represents the result of the "
                                    "affine expression\" (programming model); index with "
                                    "`a * i + b` forms, or reshape the tensor")
            v = k.v
            if v.size:
                lo, hi = k.bounds()
                if lo < 0 or hi >= size:
                    fields = dict(name=name, dim=dim, lo=lo, hi=hi, size=size)
                    if oob is None:
                        raise nki_error("err_tensor_access_out_of_bound", **fields)
                    oob.append(((v < 0) | (v >= size), fields))
                    v = np.clip(v, 0, size - 1)
            out.append(v)
            forms.append(k.form())
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            k = int(k)
            if k < 0 or k >= size:
                raise nki_error("err_tensor_access_out_of_bound", name=name, dim=dim,
                                lo=k, hi=k, size=size)
            out.append(k)
        elif k is None:
            from . import context
            run = context.maybe_current()
            raise nki_error("nkisim_unsupported", what="`None` (newaxis) in a tensor index",
                            why="use .expand_dim(d) or .reshape(...) (nl.arange was removed "
                                "in NKI 0.2.0)" if run is not None and run.rules.dialect !=
                                "beta1" else "use nl.arange(...)[:, None] index expressions")
        elif isinstance(k, MaskExpr):
            # Beta 1's "operand masking" of matmul inputs indexes with the predicate alone,
            # `lhs_T[i_f <= 64]` (nki.api.shared.rst; nkisim.tensor.operand_masked)
            raise nki_error("nkisim_invalid_argument", api=f"indexing `{name}`",
                            why="a predicate among other indices: operand masking indexes with "
                                f"the predicate alone (`{name}[i_f < n]`), after any other "
                                f"index (`{name}[i_p, i_f][i_f < n]`)")
        else:
            raise nki_error("nkisim_invalid_argument", api=f"indexing `{name}`",
                            why=f"unsupported index {k!r} of type {type(k).__name__}")
    if advanced and (oob is None or not oob) and \
            not any(isinstance(k, _SliceGrid) for k in key):
        basic = _as_slices(out, forms)
        if basic is not None:
            return "basic", basic
    return ("advanced" if advanced else "basic"), tuple(out)


def _as_slices(key, forms):
    """An advanced key that selects a rectangle, as the equivalent basic key (or None).

    AWS's Beta 1 kernels index tiles with ``nl.mgrid``/``nl.arange`` expressions
    (``t[k, i.p, i.x]``, ``a[m * 128 + i_p, i_f]``) that nearly always pick a rectangle: the
    j-th expression varies along axis j of the result only, in steps of a positive constant.
    Such a key is the NumPy slice key with the same result (same shape, same elements), and a
    slice is a view where the expression is a gather/scatter of every element (measured: the
    tutorials' matmul_hoist_load spent 4x as long per instruction on its mgrid indexed block
    tiles). Expressions of another form (transposing, diagonal, ...) stay advanced.
    ``forms``: the ``IndexExpr.form()`` of each array of ``key``, in order."""
    exprs = [k for k in key if isinstance(k, np.ndarray)]
    n = len(exprs)
    try:
        shape = np.broadcast_shapes(*(k.shape for k in exprs))
    except ValueError:
        return None
    if len(shape) != n or 0 in shape:
        return None
    out, j = [], 0
    for k in key:
        if not isinstance(k, np.ndarray):
            out.append(k)
            continue
        form = forms[j]
        if not form or k.ndim != n or k.shape[j] != shape[j]:
            return None
        axis, start, step = form
        length = shape[j]
        if length == 1:
            if axis is not None:        # (cannot vary along a length-1 axis: another one)
                return None
            step = 1
        elif axis != j or step <= 0:    # the j-th expression varies along axis j only
            return None
        out.append(slice(start, start + step * (length - 1) + 1, step))
        j += 1
    return tuple(out)
