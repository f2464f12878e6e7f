"""``dma_compute``: the DMA engines' scaled element-wise reduction of up to 16 sources.

"dst = reduce_op(srcs[0] * scales[0], srcs[1] * scales[1], ...) ... Currently, only nl.add is
supported for reduce_op, and all values in scales must be 1.0 (or scales can be None)"; "The
DMA engines perform all computations in float32 precision internally"; srcs and dst "can be in
HBM or SBUF"; "The element count of each tensor in srcs and dst must match exactly. The max
number of source tensors in srcs is 16"; with an indirect (``vector_offset``) source it is a
read-modify-write (scatter ``dst[idx] += src`` or gather ``dst += src[idx]``) of exactly two
sources, for which "unique_indices must be True" (nki.isa.dma_compute docs, aws-neuron-sdk
@81ce03ae nki/api/nki/isa/__init__.py; newest at https://awsdocs-neuron.readthedocs-hosted.com/
en/latest/nki/api/generated/nki.isa.dma_compute.html). It replaces ``dma_copy(dst_rmw_op=)``
from NKI 0.3.0 (MIG 0.2->0.3). Dialect-free core operation; the nki.isa face checks its
argument forms.

Cost: a DMA moving every source's bytes (the engine reads each source once and writes dst),
planned as a dma_copy of dst's layout (nkisim.cost.dma_plan).
"""

from __future__ import annotations

import numpy as np

from . import context, dtypes
from .errors import nki_error, shape_str
from .ops import _dma_detail
from .tensor import Tensor, _free, _partitions, read, region, write
from .trace import DMA

MAX_SOURCES = 16


def dma_compute(dst, srcs, reduce_op="add", scales=None, unique_indices=True,
                oob_skip=False) -> None:
    api = "dma_compute"
    run = context.current()
    if not isinstance(srcs, (list, tuple)) or not srcs:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"srcs must be a non-empty list of tensors, got {srcs!r}")
    if len(srcs) > MAX_SOURCES:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"at most {MAX_SOURCES} source tensors, got {len(srcs)}")
    for p, t in [("dst", dst)] + [(f"srcs[{i}]", s) for i, s in enumerate(srcs)]:
        if not isinstance(t, Tensor):
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"{p} must be an NKI tensor, got {type(t).__name__}")
        if t.root.buffer == "psum":
            raise nki_error("err_unsupported_memory", param=p, api=api, expected="hbm|sbuf",
                            got="psum")
        if t.size != dst.size:
            raise nki_error("nkisim_shape_mismatch", params=f"dst{shape_str(dst.shape)}, "
                            f"{p}{shape_str(t.shape)}", api=api,
                            why=f"element counts differ ({dst.size} vs {t.size})")
    name = reduce_op if isinstance(reduce_op, str) else getattr(reduce_op, "__name__", "")
    if name != "add":
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"only nl.add is supported for reduce_op, got {reduce_op!r}")
    if scales is not None:
        sc = list(scales) if isinstance(scales, (list, tuple)) else None
        if sc is None or len(sc) != len(srcs):
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"scales must be a list of {len(srcs)} values, got {scales!r}")
        if any(not isinstance(v, (int, float, np.integer, np.floating)) or float(v) != 1.0
               for v in sc):
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"all values in scales must be 1.0, got {sc}")
    indirect = [t for t in [dst, *srcs] if t._idx is not None]
    if indirect:
        if len(srcs) != 2:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"a read-modify-write with an indirect tensor takes exactly 2 "
                                f"sources, got {len(srcs)}")
        if not unique_indices:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why="unique_indices must be True with indirect indexing (non-unique "
                                "indices are not supported)")
    keep = None
    if oob_skip:
        # out-of-bound elements of an indirect access are not moved (oob_mode.skip)
        keep = np.ones(dst.size, bool)
        for t in [dst, *srcs]:
            if t._oob is not None and "indirect" in t._oob[1]:
                keep &= ~np.asarray(t._oob[0]).reshape(-1)
                t._oob = None
    acc = np.zeros(dst.size, np.float32)
    for s in srcs:
        acc += dtypes.to_f32(read(s, api, run)).reshape(-1)
    write(dst, acc.reshape(dst.shape), api, run=run,
          mask=None if keep is None or keep.all() else keep.reshape(dst.shape))
    detail = _dma_detail(dst, srcs[0], dst.size * dst.dtype.itemsize)
    detail["bytes"] = sum(s.size * s.dtype.itemsize for s in srcs)
    detail["sources"] = len(srcs)
    hbm = dst.root.buffer == "hbm"
    run.record(api, DMA, tuple(region(s) for s in srcs), (region(dst),), dtypes.name(dst.dtype),
               _partitions(srcs[0] if hbm else dst), _free(srcs[0] if hbm else dst), detail)
