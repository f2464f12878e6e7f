"""``neuronxcc.nki.compiler`` (ncc): compiler decorators and direct allocation (ref §1.1).

The decorators change how the real compiler optimizes, not what a kernel computes, so nkisim
accepts them (validating their arguments) and records them on the kernel. Direct allocation
(``ncc.sbuf.mod_alloc``) places tensors at explicit SBUF addresses: nkisim gives such tensors
real storage at those addresses, so overlapping placements alias as they do on the device.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from ..errors import nki_error
from ..runtime import Kernel
from ..tensor import DirectAlloc
from ..tensor import psum as _psum
from ..tensor import sbuf as _sbuf

# what an allocation function returns, by the number of ints (ncc.sbuf.alloc: 2, psum: 3)
_ALLOC_RESULT = {2: "start_partition, byte_addr", 3: "bank, start_partition, byte_addr"}


def _decorator(name, func, **flags):
    def apply(f):
        if not callable(f):
            raise nki_error("nkisim_invalid_argument", api=f"nki.compiler.{name}",
                            why="must decorate a function or an @nki.jit kernel")
        if isinstance(f, Kernel):
            f.options.setdefault("compiler", {})[name] = flags or True
            return f
        try:
            f.__nki_compiler__ = {**getattr(f, "__nki_compiler__", {}), name: flags or True}
        except AttributeError:
            pass
        return f
    return apply(func) if func is not None else apply


def skip_middle_end_transformations(func=None):
    """Skip all middle end transformations on the kernel (accepted; no effect on values)."""
    return _decorator("skip_middle_end_transformations", func)


def enable_stack_allocator(func=None, log_level=50):
    return _decorator("enable_stack_allocator", func, log_level=log_level)


def force_auto_alloc(func=None):
    return _decorator("force_auto_alloc", func)


def no_reorder(func=None):
    return _decorator("no_reorder", func)


def multi_buffer(factor=2):
    if int(factor) < 1:
        raise nki_error("nkisim_invalid_argument", api="nki.compiler.multi_buffer",
                        why="factor must be >= 1")
    return lambda f: _decorator("multi_buffer", f, factor=int(factor))


class allocation_scope:
    """Context manager accepted for compatibility."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FuncAlloc(DirectAlloc):
    """``ncc.sbuf.alloc(func)`` / ``ncc.psum.alloc(func)``: ``func(idx, pdim_size, fdim_size)``
    places each logical block: ``(start_partition, byte_addr)`` in SBUF, ``(bank,
    start_partition, byte_addr)`` in PSUM (aws-neuron-sdk 1db4d74e nki/api/nki/compiler/sbuf.py
    and psum.py ``alloc``; nki/test/test_sbuf_modulo_alloc.py / test_psum_modulo_alloc.py define
    ``mod_alloc`` as such a function). ``fdim_size`` is in bytes per partition."""

    __slots__ = ("func",)

    def __init__(self, kind, func):
        super().__init__(kind)
        self.name = f"{kind}.alloc"
        self.func = func

    def place(self, idx, pdim_size, fdim_size, arch):
        # by keyword: nki-samples fc5c69f reference/allocated_attention.py passes
        # functools.partial(psum_addr, bank_map=...) with psum_addr(bank_map, idx, pdim_size,
        # fdim_size), which only a keyword call binds
        res = self.func(idx=tuple(int(i) for i in idx), pdim_size=int(pdim_size),
                        fdim_size=int(fdim_size))
        try:
            res = tuple(int(r) for r in res)
        except TypeError:
            res = ()
        want = 2 if self.kind == "sbuf" else 3
        if len(res) != want:
            raise nki_error("nkisim_invalid_argument", api=f"ncc.{self.kind}.alloc",
                            why=f"the allocation function must return {want} ints "
                                f"({_ALLOC_RESULT[want]}), "
                                f"got {res!r}")
        if self.kind == "sbuf":
            return res
        bank, part, addr = res
        return part, bank * arch.psum_bank_bytes + addr


def _modulo(base, allocate_shape, scale, indices):
    """The docs' ``modulo_allocate_func(base, allocate_shape, scale)(indices)``: the block index
    taken modulo ``allocate_shape`` (default all ones), linearized, times ``scale``, plus
    ``base``."""
    shape = tuple(int(s) for s in allocate_shape) or (1,) * len(indices)
    mod = tuple(int(i) % s for i, s in zip(indices, shape))
    lin = sum(i * math.prod(shape[d + 1:]) for d, i in enumerate(mod))
    return lin * int(scale) + int(base)


def _allocator(kind):
    base = _sbuf if kind == "sbuf" else _psum

    def mod_alloc(*, base_addr=0, base_partition=0, num_par_tiles=(), num_free_tiles=(),
                  base_bank=0, num_bank_tiles=(), **kwargs):
        if kind == "psum":
            # psum.mod_alloc is alloc() with the docs' psum_modulo_alloc_func (aws-neuron-sdk
            # nki/api/nki/compiler/psum.py; the function is spelled out in
            # nki/test/test_psum_modulo_alloc.py): block idx -> (bank, partition, address),
            # each the modulo of the block index over its tile counts
            for v in (base_addr, base_partition, base_bank):
                if int(v) < 0:
                    raise nki_error("nkisim_invalid_argument", api="ncc.psum.mod_alloc",
                                    why="base_bank, base_partition and base_addr must be >= 0")

            def psum_modulo_alloc_func(idx, pdim_size, fdim_size):
                return (_modulo(base_bank, num_bank_tiles, 1, idx),
                        _modulo(base_partition, num_par_tiles, pdim_size, idx),
                        _modulo(base_addr, num_free_tiles, fdim_size, idx))
            return FuncAlloc("psum", psum_modulo_alloc_func)
        return DirectAlloc(kind, base_addr, base_partition, num_par_tiles, num_free_tiles)

    def alloc(func):
        if not callable(func):
            raise nki_error("nkisim_invalid_argument", api=f"ncc.{kind}.alloc",
                            why="expects a function (idx, pdim_size, fdim_size) -> placement")
        return FuncAlloc(kind, func)

    def auto_alloc():
        return base

    return SimpleNamespace(mod_alloc=mod_alloc, alloc=alloc, auto_alloc=auto_alloc)


sbuf = _allocator("sbuf")
psum = _allocator("psum")
