"""Checks the real simulator lacks: uninitialized reads, races between ``affine_range``
iterations, outputs never written (ref §1.5, §1.9, §2.1, §4.3).

They read the per-element shadow of every tensor: the epoch of its last write (``nkisim.context``).

- **Uninitialized read**: an operand element whose shadow is 0 was never written.
- **Loop-carried dependency**: an iteration of an ``affine_range`` loop reads an element written
  by another iteration of the same loop activation. ``affine_range`` promises independent
  iterations, so on the device such a kernel may compute garbage (aws-neuron-sdk #1051).
- **Output dependency** (``err_unexpected_output_dependencies``): two iterations of one
  ``affine_range`` loop write the same element.
- Both exempt the associative PSUM accumulation ``psum += nisa.nc_matmul(...)`` (ref §1.9, §1.11),
  and ``sequential_range``/``static_range`` loops.
- **Outputs not written** (``err_tensor_output_not_written_to``): every returned HBM tensor must be
  fully written when the kernel returns.

Each check can be turned off (``NKISIM_CHECKS=-races``); see ``nkisim.context.ALL_CHECKS``.
"""

from __future__ import annotations

import numpy as np

from .context import where
from .errors import nki_error


def region_str(mask: np.ndarray) -> str:
    """``[lo:hi, lo:hi]`` bounding box of the True elements of ``mask``."""
    if mask.ndim == 0:
        return ""
    nz = np.nonzero(mask)
    if not nz[0].size:
        return ""
    return "[" + ", ".join(f"{int(a.min())}:{int(a.max()) + 1}" for a in nz) + "]"


def _shadow(t):
    return t._w if t._idx is None else t._w[t._idx]


def check_read(run, t, api: str) -> None:
    w = _shadow(t)
    if not w.size:
        return
    lo = int(w.min())
    if lo >= run.epoch:
        return                                  # written in this iteration (or nested loops)
    if lo == 0 and "uninit" in run.checks:
        unwritten = w == 0
        file, line = run_location()
        raise nki_error("nkisim_uninitialized_read", api=api, where=where(file, line),
                        name=t.name, region=region_str(unwritten),
                        count=int(unwritten.sum()), total=int(w.size))
    if "races" in run.checks and run.loops:
        hi = int(w.max())
        epochs = (lo,) if lo == hi else np.unique(w[w < run.epoch])
        for e in epochs:
            e = int(e)
            if e == 0:
                continue
            loop = race_loop(run, e, run.epoch)
            if loop is not None:
                file, line = run_location()
                bad = w == e
                raise nki_error("nkisim_loop_carried_dependency", loop=where(loop.file, loop.line),
                                it=loop.iteration, name=t.name, region=region_str(bad),
                                other=run.epochs[_child_of(run, e, loop.id)][3], api=api,
                                where=where(file, line))


def check_write(run, t, api: str, accumulate: bool) -> None:
    if accumulate or "races" not in run.checks or not run.loops:
        return
    w = _shadow(t)
    if not w.size:
        return
    lo = int(w.min())
    if lo >= run.epoch:
        return
    cand = w[(w > 0) & (w < run.epoch)]
    if not cand.size:
        return
    lo, hi = int(cand.min()), int(cand.max())
    epochs = (lo,) if lo == hi else np.unique(cand)
    for e in epochs:
        loop = race_loop(run, int(e), run.epoch)
        if loop is not None:
            raise nki_error("err_unexpected_output_dependencies",
                            loop=f"the affine_range ({where(loop.file, loop.line)})",
                            name=t.name, region=region_str(w == int(e)))


def _chain(run, e):
    out = []
    epochs = run.epochs
    while e:
        out.append(e)
        e = epochs[e][0]
    return out


def _child_of(run, e, loop_id):
    for x in _chain(run, e):
        if run.epochs[x][1] == loop_id:
            return x
    return e


def race_loop(run, writer: int, reader: int):
    """The active affine loop whose different iterations wrote ``writer`` and run ``reader``.

    None when the two accesses are ordered: one context encloses the other, or they sit in
    different loops (program order), or the loop they share is sequential/static.
    """
    rc = _chain(run, reader)
    if writer in rc:
        return None
    rset = set(rc)
    wc = _chain(run, writer)
    prev = None
    for x in wc:
        if x in rset:
            if prev is None:
                return None
            # prev: writer-side child of the common context x; find the reader-side child
            i = rc.index(x)
            if i == 0:
                return None       # reader runs in x itself, after the nested loop finished
            rchild = rc[i - 1]
            wl, rl = run.epochs[prev], run.epochs[rchild]
            if wl[1] == rl[1] and wl[2] == "affine" and wl[3] != rl[3]:
                for lp in run.loops:
                    if lp.id == wl[1]:
                        return lp
            return None
        prev = x
    return None


def check_outputs(run, outputs) -> None:
    """``err_tensor_output_not_written_to`` for any returned HBM tensor not fully written."""
    if "outputs" not in run.checks:
        return
    for t in outputs:
        if t._w is None or t.root.param:
            continue
        w = t._w if t._idx is None else t._w[t._idx]
        unwritten = w == 0
        if unwritten.any():
            from .errors import shape_str
            n = int(unwritten.sum())
            raise nki_error("err_tensor_output_not_written_to", name=t.name,
                            region=f"{n} of {w.size} elements, region {region_str(unwritten)}",
                            shape=shape_str(t.shape))


def run_location():
    from .context import caller_location
    return caller_location()
