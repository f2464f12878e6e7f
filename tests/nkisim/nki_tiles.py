"""Tile helpers the current-dialect ISA tests share (imported as ``nki_tiles``: pytest puts
this directory on sys.path): SBUF/PSUM allocation, a load by DMA, an HBM output of a tile."""

import numpy as np

from nkisim import ops
from nkisim.nki import isa as nisa


def sb(shape, dtype=np.float32, name=""):
    return ops.ndarray(shape, dtype, buffer=ops.sbuf, name=name)


def ps(shape, dtype=np.float32, name=""):
    return ops.ndarray(shape, dtype, buffer=ops.psum, name=name)


def load(x, dtype=None):
    """An SBUF copy of HBM ``x`` (by DMA), in ``dtype`` if given."""
    t = sb(x.shape, dtype or x.dtype)
    nisa.dma_copy(dst=t, src=x)
    return t


def out_of(t, dtype=None):
    """An HBM output holding tile ``t`` (SBUF; PSUM goes through tensor_copy first)."""
    if t.root.buffer == "psum":
        s = sb(t.shape, t.dtype)
        nisa.tensor_copy(dst=s, src=t)
        t = s
    o = ops.ndarray(t.shape, dtype or t.dtype, buffer=ops.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o
