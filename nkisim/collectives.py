"""Synchronisation between the logical cores of one launch: ``core_barrier`` and ``sendrecv``.

Dialect-free core operations (the ``nki.isa`` face checks its own argument forms and calls
these). The program instances of a launch (``kernel[2]`` = LNC 2) are nkisim.lnc.Instances;
an instance's *rank* is its index in the launch (``nl.program_id(0)`` under LNC 2). In a launch
of one instance, a barrier of core 0 alone and a sendrecv to itself are trivial; naming a rank
that does not exist is an error (it would hang the device).

Semantics (nki.isa docs, aws-neuron-sdk @81ce03ae nki/api/nki/isa/__init__.py; newest at
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.sendrecv.html
and ...nki.isa.core_barrier.html):

* ``core_barrier(data, cores)``: "a synchronization point where all specified NeuronCores must
  reach before any can proceed"; ``data`` is "the shared data that all cores need to synchronize
  on; must be data in shared HBM". "Currently only cores=(0, 1) is supported" under LNC 2;
  nki-library also calls it with ``(0,)`` (and ``(0)``) when it runs on one core
  (core/moe/moe_cte/bwmm_shard_on_I.py, experimental/moe/forward/bwmm_shard_on_H.py): a barrier
  of one core is accepted and does nothing.
* ``sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id)``: "the current NeuronCore sends
  its src tile to the dst location of the target NeuronCore specified by send_to_rank, while
  simultaneously receiving data from recv_from_rank into its own dst tile"; "operations with
  the same pipe_id form a logical group where all operations in the group must complete before
  any can proceed". Constraints: src and dst in SBUF, the same dtype, "the same partition
  dimension size and the same number of elements per partition"; ``dma_engine=gpsimd_dma``
  limits a partition's data to 1024 bytes (32-bit), 512 (16-bit) or 256 (8-bit).
  nkisim: the k-th sendrecv of a pipe on each instance meets the k-th of the others; what a
  sender sends is its ``src`` at the call.
"""

from __future__ import annotations

import numpy as np

from . import context, dtypes
from .errors import nki_error, shape_str
from .tensor import Tensor, _free, _partitions, read, region, write
from .trace import DMA, GPSIMD


def rank_and_size(run) -> tuple:
    """(rank of the running instance, instances in the launch)."""
    lnc = run.lnc
    if lnc is None:
        return 0, 1
    return lnc.index(), lnc.size


def _where() -> str:
    file, line = context.caller_location()
    return context.where(file, line)


def _ranks(api, param, value, size) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{param} must be an int rank, got {value!r}")
    if not 0 <= int(value) < size:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{param}={int(value)} names no logical core of this launch "
                            f"({size} instance{'s' if size > 1 else ''}: ranks 0..{size - 1}; "
                            "launch the kernel as kernel[2] for LNC 2)")
    return int(value)


def core_barrier(data, cores, engine: str = GPSIMD) -> None:
    """Wait until every core in ``cores`` has reached its matching ``core_barrier``."""
    api = "core_barrier"
    run = context.current()
    if not isinstance(data, Tensor):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"data must be an NKI tensor, got {type(data).__name__}")
    if data.root.buffer == "sbuf":
        # the docs say "must be data in shared HBM", yet AWS's CI-tested nki-library synchronises
        # on an SBUF tile (core/moe/moe_cte/bwmm_shard_on_I.py: ``core_barrier(block_idx,
        # (0, 1))``, block_idx an SBUF int32 counter): a tolerated rule; the barrier itself only
        # needs the semaphores, so nkisim still synchronises the cores
        run.rule(("core_barrier_sbuf",), f"{api}() data `{data.name}` is in SBUF",
                 "data: the shared data that all cores need to synchronize on; must be data "
                 "in shared HBM",
                 "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/"
                 "nki.isa.core_barrier.html")
    elif data.root.buffer != "hbm":
        raise nki_error("err_unsupported_memory", param="data", api=api, expected="hbm",
                        got=data.root.buffer)
    if isinstance(cores, (int, np.integer)) and not isinstance(cores, bool):
        cores = (cores,)            # nki-library writes core_barrier(output, (0)): an int
    if not isinstance(cores, (tuple, list)) or not cores:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"cores must be a tuple of core indices such as (0, 1), got "
                            f"{cores!r}")
    me, size = rank_and_size(run)
    ranks = tuple(sorted({_ranks(api, "cores", c, size) for c in cores}))
    if len(ranks) != len(cores):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"cores {tuple(cores)} names a core twice")
    if me not in ranks:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"program {me} calls a barrier of cores {ranks} it is not part of")
    # the instruction: the barrier orders what the cores did to `data` before it (the
    # scheduler sees a read of it); a semaphore update and wait on one engine, costed as one
    # minimal instruction on it (nkisim.cost: a 1-element instruction takes MIN_II)
    run.record(api, engine, (region(data),), (), dtypes.name(data.dtype), 1, 1,
               {"inputs": 0, "cores": ranks})
    if len(ranks) > 1:
        run.lnc.meet(("core_barrier", ranks), ranks, None,
                     f"core_barrier(cores={ranks}) at {_where()}", _describe_barrier)


def _describe_barrier(me, members, first, first_members):
    return f"program {me} waits at a barrier of cores {members}, program {first} at one of " \
           f"cores {first_members}"


# gpsimd_dma: "the data size per partition [must] not exceed 1024 bytes for 32-bit types,
# 512 bytes for 16-bit types, 256 bytes for 8-bit types" (nki.isa.sendrecv docs)
GPSIMD_DMA_BYTES = {4: 1024, 2: 512, 1: 256}


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, gpsimd_dma: bool = False) -> None:
    """Send ``src`` to rank ``send_to_rank``'s ``dst`` and receive rank ``recv_from_rank``'s
    ``src`` into this instance's ``dst``."""
    api = "sendrecv"
    run = context.current()
    for p, t in (("src", src), ("dst", dst)):
        if not isinstance(t, Tensor):
            raise nki_error("nkisim_invalid_argument", api=api,
                            why=f"{p} must be an NKI tensor, got {type(t).__name__}")
        if t.root.buffer != "sbuf":
            raise nki_error("err_unsupported_memory", param=p, api=api, expected="sbuf",
                            got=t.root.buffer)
    if src.dtype != dst.dtype:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"src and dst must have the same dtype, got "
                            f"{dtypes.name(src.dtype)} and {dtypes.name(dst.dtype)}")
    layout = (_partitions(src), _free(src))
    if layout != (_partitions(dst), _free(dst)):
        raise nki_error("nkisim_shape_mismatch", params=f"src{shape_str(src.shape)}, "
                        f"dst{shape_str(dst.shape)}", api=api,
                        why="src and dst need the same partitions and elements per partition")
    if isinstance(pipe_id, bool) or not isinstance(pipe_id, (int, np.integer)):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"pipe_id must be an int, got {pipe_id!r}")
    item = dst.dtype.itemsize
    if gpsimd_dma and layout[1] * item > GPSIMD_DMA_BYTES.get(item, 1024):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"dma_engine=gpsimd_dma moves at most "
                            f"{GPSIMD_DMA_BYTES.get(item, 1024)} bytes per partition of "
                            f"{8 * item}-bit data, got {layout[1] * item}")
    me, size = rank_and_size(run)
    to = _ranks(api, "send_to_rank", send_to_rank, size)
    frm = _ranks(api, "recv_from_rank", recv_from_rank, size)
    sent = np.array(read(src, api, run), copy=True)       # what this core sends, now
    # never-written elements of src travel with the data: they mark the *peer's* dst, not this
    # core's (nkisim.tensor._taint; AWS's router_topk with shard_on_tokens and T=5 sends a
    # 3-row buffer of which core 0 wrote 2 rows, and core 1 reads back only those 2)
    taint, run.taint = run.taint, None
    members = tuple(sorted({me, to, frm}))
    what = f"sendrecv(pipe_id={int(pipe_id)}, send_to_rank={to}, recv_from_rank={frm}) at " \
           f"{_where()}"
    if len(members) == 1:
        got = {me: (to, sent, layout, src.dtype, tuple(src.shape), taint)}
    else:
        got = run.lnc.meet(("sendrecv", int(pipe_id)), members,
                           (to, sent, layout, src.dtype, tuple(src.shape), taint), what,
                           _describe_sendrecv)
    peer_to, vals, peer_layout, peer_dtype, peer_shape, peer_taint = got[frm]
    if peer_to != me:
        raise nki_error("nkisim_lnc_mismatch", what=what, detail=f"program {me} receives "
                        f"from program {frm}, which sends to program {peer_to}")
    if peer_layout != layout or peer_dtype != dst.dtype:
        raise nki_error("nkisim_lnc_mismatch", what=what, detail=f"program {frm} sends "
                        f"{shape_str(peer_shape)} {dtypes.name(peer_dtype)} but program {me} "
                        f"receives into {shape_str(dst.shape)} {dtypes.name(dst.dtype)}")
    run.taint = peer_taint
    write(dst, vals.reshape(dst.shape), api, run=run)
    nbytes = dst.size * item
    # a DMA of src's bytes (SBUF -> the peer's SBUF), costed as an SBUF-to-SBUF dma_copy of
    # the same layout (nkisim.cost: one descriptor per partition row)
    row = max(1, layout[1] * item)
    run.record(api, DMA, (region(src),), (region(dst),), dtypes.name(dst.dtype), layout[0],
               layout[1], {"bytes": nbytes, "src": "sbuf", "dst": "sbuf", "row_bytes": row,
                           "rows": max(1, -(-nbytes // row)), "pipe_id": int(pipe_id),
                           "gpsimd_dma": bool(gpsimd_dma)})


def _describe_sendrecv(me, members, first, first_members):
    return f"program {me} exchanges with programs {members}, program {first} with " \
           f"{first_members} on the same pipe"
