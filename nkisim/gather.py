"""GpSimd gathers added with the current dialect: ``nc_n_gather`` and ``nonzero_with_count``.

Dialect-free core operations (semantics from the nki.isa docs, aws-neuron-sdk @81ce03ae
nki/api/nki/isa/__init__.py; newest at
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.nc_n_gather.html
and ...nki.isa.nonzero_with_count.html). Both run on GpSimd, SBUF only ("GpSimd Engine cannot
access PSUM"), costed as the other GpSimd element-streaming gathers (local_gather: the GpSimd
start-up plus one cycle per output element, nkisim.cost.stream_cycles).
"""

from __future__ import annotations

import numpy as np

from . import context, dtypes
from .engines import require_nc_version
from .errors import nki_error, shape_str
from .ops import _detail, _tile, result_tile
from .ops import ignored_keywords as _ignored_keywords
from .tensor import _free, _partitions, read, region, values, write
from .trace import GPSIMD


def _sbuf(t, api, param):
    x = _tile(t, api, param)
    if x.root.buffer != "sbuf":
        raise nki_error("err_unsupported_memory", param=param, api=api, expected="sbuf",
                        got=x.root.buffer)
    return x


def nc_n_gather(data, indices, *, dtype=None, **kwargs):
    """Per partition, ``out[p, j] = data[p].flatten()[indices[p].flatten()[j]]``: the result has
    ``indices``' shape and ``data``'s dtype ("The free dimensions of data are conceptually
    flattened ... The free dimensions of indices determine the shape of the output"). Indices
    are uint32 and "must be within the range [0, data.size / data.shape[0])": one outside is
    an error (the docs define no out-of-range behaviour)."""
    if kwargs:
        _ignored_keywords(nc_n_gather, kwargs)
    run = context.current()
    api = "nc_n_gather"
    d = _sbuf(data, api, "data")
    ix = _sbuf(indices, api, "indices")
    P = d.shape[0]
    if ix.shape[0] != P:
        raise nki_error("nkisim_shape_mismatch", params=f"data{shape_str(d.shape)}, "
                        f"indices{shape_str(ix.shape)}", api=api,
                        why="data and indices must have the same partition dimension")
    if ix.dtype != np.dtype(np.uint32):
        raise nki_error("nkisim_operand_dtype", param="indices", api=api,
                        dtype=dtypes.name(ix.dtype), allowed="uint32")
    out_dt = dtypes.normalize(dtype) if dtype is not None else d.dtype
    if out_dt != d.dtype:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"dst must have the data's dtype {dtypes.name(d.dtype)}, got "
                            f"{dtypes.name(out_dt)}")
    dv = read(d, api, run).reshape(P, -1)
    iv = np.asarray(read(ix, api, run)).astype(np.int64).reshape(P, -1)
    F = dv.shape[1]
    bad = iv >= F
    if bad.any():
        p, j = np.argwhere(bad)[0]
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"index {int(iv[p, j])} (partition {int(p)}) is outside the {F} "
                            "elements of a data partition")
    out = np.take_along_axis(dv, iv, axis=1).reshape(ix.shape)
    detail = _detail(d, ix)
    detail["inputs"] = 2
    return result_tile(run, tuple(ix.shape), out_dt, out, api, GPSIMD, (d, ix), detail)


# "Each of the eight GpSimd cores connects to 16 contiguous SBUF partitions ... each GpSimd core
# reads from and writes to its 0-th partition only" (nonzero_with_count docs)
GPSIMD_CORE_PARTITIONS = 16


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1) -> None:
    """For partitions 0, 16, ..., 112 of ``src``: the indices of its nonzero elements plus
    ``index_offset``, then ``padding_val`` up to the src's length, then the count, into the
    same partition of ``dst`` (one element longer). Other partitions of ``dst`` keep their
    values. NeuronCore-v3+; src float32 or int32, dst int32. Partitions count from the tile's
    first partition (nki-library's kernels pass tiles starting at partition 0)."""
    run = context.current()
    api = "nonzero_with_count"
    require_nc_version(run, api, 3)
    s = _sbuf(src, api, "src")
    d = _sbuf(dst, api, "dst")
    if s.dtype not in (np.dtype(np.float32), np.dtype(np.int32)):
        raise nki_error("nkisim_operand_dtype", param="src", api=api,
                        dtype=dtypes.name(s.dtype), allowed="float32, int32")
    if d.dtype != np.dtype(np.int32):
        raise nki_error("nkisim_operand_dtype", param="dst", api=api,
                        dtype=dtypes.name(d.dtype), allowed="int32")
    for param, v in (("index_offset", index_offset), ("padding_val", padding_val)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or \
                not -2**31 <= int(v) < 2**31:
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"{param} must be an int32, got {v!r}")
    P = s.shape[0]
    sv = read(s, api, run).reshape(P, -1)
    T = sv.shape[1]
    if d.shape[0] != P or d.size // max(d.shape[0], 1) != T + 1:
        raise nki_error("nkisim_shape_mismatch", params=f"src{shape_str(s.shape)}, "
                        f"dst{shape_str(d.shape)}", api=api,
                        why="dst needs src's partitions and one more element per partition "
                            "(the count)")
    out = np.array(values(d), copy=True).reshape(P, T + 1)
    rows = np.arange(0, P, GPSIMD_CORE_PARTITIONS)
    for p in rows:
        nz = np.flatnonzero(sv[p] != 0)
        out[p, :nz.size] = nz + int(index_offset)
        out[p, nz.size:T] = int(padding_val)
        out[p, T] = nz.size
    keep = np.zeros((P, 1), bool)
    keep[rows] = True
    write(d, out.reshape(d.shape), api, run=run,
          mask=np.broadcast_to(keep, (P, T + 1)).reshape(d.shape))
    run.record(api, GPSIMD, (region(s),), (region(d),), dtypes.name(d.dtype), _partitions(d),
               _free(d), _detail(s))
