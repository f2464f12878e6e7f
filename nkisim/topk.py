"""``nki.isa.topk`` (NKI 0.6.0+, STUB-R32 isa): the K largest values of a 16-partition "snake"
and their indices, on the GpSimd engine.

The docstring's layout: "The source tile is interpreted as a 16-partition snake layout:
elements 0..15 fill partitions 0..15 of free-dim column 0, elements 16..31 fill column 1, etc.
The parameter n specifies the total number of active BF16 elements in this snake"; "partition
dim must be a multiple of 16", so each group of 16 partitions (one GpSimd core's, as for
local_gather) holds one snake: element e of group g is ``src[16 g + e % 16, e // 16]``.

Choices where it is not explicit, with the sentences that decide them:
- the selection is over the whole snake of a group, not one partition's row: "K <= n" and
  "src free dim >= ceil(n / 16)" allow K up to n, more than a row holds;
- "For each partition, the instruction selects the top-K elements ... and writes" them: every
  partition of a group receives its group's K values and indices (the same row 16 times);
- "the original 0-based indices of those values" are snake indices e;
- "the K largest values in ascending order": among equal values the lower index is the larger
  (it is kept first when K cuts through a tie) and comes first in the output (nkisim's order;
  the docs do not say).
"""

from __future__ import annotations

import numpy as np

from . import context, dtypes
from .errors import nki_error, shape_str
from .ops import _detail, _tile, _tile_vals
from .tensor import region, write
from .trace import GPSIMD

_U32 = np.dtype(np.uint32)
SNAKE = 16


def topk(val_dst, idx_dst, src, n):
    """``val_dst`` (P, K) bf16 = the K largest of each 16-partition group's ``n``-element snake
    of ``src`` (bf16, SBUF), ascending; ``idx_dst`` (P, K) uint32 = their snake indices."""
    run = context.current()
    api = "topk"
    s = _tile(src, api, "src")
    v = _tile(val_dst, api, "val_dst")
    ix = _tile(idx_dst, api, "idx_dst")
    for param, t, dt in (("src", s, dtypes.bfloat16), ("val_dst", v, dtypes.bfloat16),
                         ("idx_dst", ix, _U32)):
        if t.root.buffer != "sbuf":      # "The source and outputs must be in SBUF"
            raise nki_error("err_unsupported_memory", param=param, api=api, expected="sbuf",
                            got=t.root.buffer)
        if t.dtype != dt:
            raise nki_error("nkisim_operand_dtype", param=param, api=api,
                            dtype=dtypes.name(t.dtype), allowed=dtypes.name(dt))
    P = s.shape[0]
    for param, t in (("val_dst", v), ("idx_dst", ix)):
        if len(t.shape) != 2 or t.shape[0] != P:
            raise nki_error("nkisim_shape_mismatch", params=f"src{shape_str(s.shape)}, "
                            f"{param}{shape_str(t.shape)}", api=api,
                            why=f"{param} must have shape [par_dim, k] with the src's "
                                f"{P} partitions")
    if tuple(v.shape) != tuple(ix.shape):
        raise nki_error("nkisim_shape_mismatch", params=f"val_dst{shape_str(v.shape)}, "
                        f"idx_dst{shape_str(ix.shape)}", api=api,
                        why="val_dst and idx_dst must have the same shape [par_dim, k]")
    if P % SNAKE:
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"partition dim must be a multiple of 16, got {P}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"n must be an int, got {n!r}")
    n, K = int(n), v.shape[1]
    if not 8 <= n < 65536:
        raise nki_error("nkisim_invalid_argument", api=api, why=f"8 <= n < 65536, got n={n}")
    if not (1 <= K < 32768 and K <= n):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"1 <= K < 32768 and K <= n, got K={K} (val_dst free dim), n={n}")
    F = s.size // P
    if F < -(-n // SNAKE):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"src free dim >= ceil(n / 16) = {-(-n // SNAKE)}, got {F}")
    x = _tile_vals(s, api, run).reshape(P // SNAKE, SNAKE, F)
    e = np.arange(n)
    snake = x[:, e % SNAKE, e // SNAKE]                         # (groups, n)
    idx = np.broadcast_to(e, snake.shape)
    # the K largest by (value descending, index ascending), then ascending by value
    order = np.lexsort((idx, -snake), axis=-1)[:, :K]
    top_v = np.take_along_axis(snake, order, axis=-1)
    top_i = np.take_along_axis(idx, order, axis=-1)
    asc = np.lexsort((top_i, top_v), axis=-1)
    top_v = np.repeat(np.take_along_axis(top_v, asc, axis=-1), SNAKE, axis=0)
    top_i = np.repeat(np.take_along_axis(top_i, asc, axis=-1), SNAKE, axis=0)
    write(v, top_v, api, run=run)
    write(ix, top_i.astype(np.uint32), api, run=run)
    # "Estimated instruction cost: 4*n + K GpSIMD Engine cycles per partition": recorded as
    # the instruction's stream length, which the cost model charges one cycle each
    # (nkisim.cost.stream_cycles, one-input ops)
    detail = _detail(s)
    detail.update(n=n, k=K)
    run.record(api, GPSIMD, (region(s),), (region(v), region(ix)), "bfloat16", P, 4 * n + K,
               detail)
