"""Engine-sequencer registers: ``register_alloc/move/load/store`` (nki.isa, NKI 0.2+).

"Each engine sequencer ... maintains its own set of physical registers for scalar operations
(64x 32-bit registers per engine sequencer in NeuronCore v2-v4). This API conceptually allocates
a register within a virtual register space ... these registers are primarily used to specify
dynamic loop boundaries and while loop conditions" (nki.isa.register_alloc docs, aws-neuron-sdk
@81ce03ae nki/api/nki/isa/__init__.py; newest at https://awsdocs-neuron.readthedocs-hosted.com/
en/latest/nki/api/generated/nki.isa.register_alloc.html). nkisim runs eagerly, so a register
holds its value now: loop bounds (``nl.dynamic_range(reg)``, ``nl.fori_loop``), ``while reg:``
and ``.ap(scalar_offset=reg)`` read it (they look for ``.value``).

Instructions: ``register_load``/``register_store`` move one 32-bit value between memory and a
sequencer register; nkisim records each as a 4-byte DMA (costed as one, nkisim.cost.dma_plan),
which over-states a sequencer's own load but keeps it ordered after the write it reads.
``register_alloc``/``register_move`` touch no memory: no instruction.
"""

from __future__ import annotations

import numpy as np

from . import context, dtypes
from .errors import nki_error, shape_str
from .tensor import Tensor, read, region, write
from .trace import DMA

_I32 = (-2**31, 2**31)


class VirtualRegister:
    """A 32-bit sequencer register (``nki.isa.VirtualRegister``); ``value`` is None until
    something is written to it."""

    __slots__ = ("value", "tracer")

    def __init__(self, value=None, tracer=False):
        self.value = value
        # NKI 0.7's tracer front end: "using a register in Python control flow (if/while) or
        # converting it with int() / range() raises TypeError" (VirtualRegister docs)
        self.tracer = tracer

    def _now(self, what, python=True) -> int:
        """The value now; ``python``: read by Python code (control flow, int()), not by an
        instruction."""
        if self.tracer and python:
            raise TypeError(f"a VirtualRegister cannot be used in {what} under NKI 0.7's "
                            "tracer front end: use nl.fori_loop / nl.while_loop")
        if self.value is None:
            raise nki_error("nkisim_invalid_argument", api="VirtualRegister",
                            why="the register was read before any value was written to it "
                                "(register_alloc() without a value, then no register_load or "
                                "register_move)")
        return self.value

    def __bool__(self):
        return bool(self._now("Python control flow (if/while)"))

    def __int__(self):
        return int(self._now("int()"))

    __index__ = __int__

    def __repr__(self):
        return f"VirtualRegister({self.value})"


def _int32(x, api, param) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{param} must be an int or a VirtualRegister, got {x!r}")
    if not _I32[0] <= int(x) < _I32[1]:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{param} {int(x)} does not fit a 32-bit register")
    return int(x)


def _register(r, api, param) -> VirtualRegister:
    if not isinstance(r, VirtualRegister):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{param} must be a VirtualRegister (from nisa.register_alloc), got "
                            f"{type(r).__name__}")
    return r


def _scalar(t, api, param) -> Tensor:
    """"a NKI tensor with exactly one element (shape [1] or [1, 1])", in HBM or SBUF."""
    if not isinstance(t, Tensor):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{param} must be an NKI tensor, got {type(t).__name__}")
    if t.size != 1:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{param} must hold exactly one element, got {shape_str(t.shape)}")
    if t.root.buffer == "psum":
        raise nki_error("err_unsupported_memory", param=param, api=api, expected="hbm|sbuf",
                        got="psum")
    if t.dtype.itemsize > 4:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{param} holds a {8 * t.dtype.itemsize}-bit value; registers are "
                            "32-bit")
    return t


def _record(run, api, reads, writes, t):
    run.record(api, DMA, reads, writes, dtypes.name(t.dtype), 1, 1,
               {"bytes": 4, "src": t.root.buffer, "dst": t.root.buffer, "row_bytes": 4,
                "rows": 1})


def register_alloc(x=None, tracer=False) -> VirtualRegister:
    """A new register, holding ``x`` (an int) or nothing (None). nki-library also passes a
    one-element tensor (core/moe/moe_tkg/all_expert_mx_impl.py:
    ``nisa.register_alloc(dynamic_decision_sb[0, 0])``): its value is loaded."""
    reg = VirtualRegister(tracer=tracer)
    if isinstance(x, Tensor):
        register_load(reg, x)
    elif x is not None:
        reg.value = _int32(x, "register_alloc", "x")
    return reg


def register_move(dst, src) -> None:
    """``dst = src``: a compile-time int or another register."""
    api = "register_move"
    d = _register(dst, api, "dst")
    if isinstance(src, VirtualRegister):
        d.value = src._now("register_move", python=False)
    else:
        d.value = _int32(src, api, "src")


def register_load(dst, src) -> None:
    """Load the one value of ``src`` (HBM or SBUF, up to 32 bits) into register ``dst``; a
    float value is truncated toward zero (the register is an integer)."""
    api = "register_load"
    d = _register(dst, api, "dst")
    t = _scalar(src, api, "src")
    run = context.current()
    v = np.asarray(read(t, api, run)).reshape(-1)[0]
    d.value = int(np.float64(v)) if dtypes.is_float(t.dtype) else int(v)
    _record(run, api, (region(t),), (), t)


def register_store(dst, src) -> None:
    """Store register ``src``'s value into the one element of ``dst`` (HBM or SBUF)."""
    api = "register_store"
    t = _scalar(dst, api, "dst")
    r = _register(src, api, "src")
    run = context.current()
    value = r._now("register_store", python=False)
    write(t, np.full(t.shape, value).astype(dtypes.storage(t.dtype)), api, run=run)
    _record(run, api, (), (region(t),), t)
