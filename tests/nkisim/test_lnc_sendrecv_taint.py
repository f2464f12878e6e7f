"""``nisa.sendrecv`` of a buffer only partly written: the never-written part travels to the peer.

nki-library's router_topk (d2ad3a5, `shard_on_tokens` with T=5 on LNC 2) splits 5 tokens into
2 (core 0) and 3 (core 1), exchanges them through buffers of max(2, 3) = 3 rows, and each core
reads back only the rows its peer wrote: core 0 sends a buffer whose third row it never wrote,
and core 1 never reads that row. nkisim marks never-written values where they go
(nkisim.tensor._taint): through a sendrecv they go to the peer's destination, not to the
sender's own.

Truth: NumPy for the values; the sendrecv docs (each rank's dst receives its peer's src).
"""

import warnings

import numpy as np

from nkisim import nki
from nkisim.errors import NKIWarning
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl

RNG = np.random.default_rng(5)
N, F = 5, 4
FIRST = N // 2                   # core 0's rows; core 1 has N - FIRST


def _exchange(read_all_received):
    """Core p computes its rows (x * 2) into a send buffer of max rows, exchanges buffers with
    the other core, and writes its own rows and the received ones to out[p].
    ``read_all_received``: each core also copies the last row of its received buffer to
    extra[p] (core 0's peer wrote it, core 1's did not)."""
    @nki.jit
    def kernel(x):
        pid = nl.program_id(0)
        mine = FIRST if pid == 0 else N - FIRST
        theirs = N - mine
        off = 0 if pid == 0 else FIRST
        rows = max(FIRST, N - FIRST)
        out = nl.ndarray((2, N, F), dtype=nl.float32, buffer=nl.shared_hbm)
        extra = nl.ndarray((2, F), dtype=nl.float32, buffer=nl.shared_hbm)
        send = nl.ndarray((rows, F), dtype=nl.float32, buffer=nl.sbuf)
        recv = nl.ndarray((rows, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=send[:mine, :], src=x[off:off + mine, :])
        nisa.tensor_scalar(dst=send[:mine, :], data=send[:mine, :], op0=nl.multiply,
                           operand0=2.0)
        nisa.sendrecv(src=send, dst=recv, send_to_rank=1 - pid, recv_from_rank=1 - pid,
                      pipe_id=0)
        other = FIRST if pid == 0 else 0
        nisa.dma_copy(dst=out[pid, off:off + mine, :], src=send[:mine, :])
        nisa.dma_copy(dst=out[pid, other:other + theirs, :], src=recv[:theirs, :])
        if not read_all_received:
            return out
        nisa.dma_copy(dst=extra[pid:pid + 1, :], src=recv[rows - 1:rows, :])
        return out, extra
    return kernel


def test_a_partly_written_send_buffer_whose_peer_reads_only_the_written_rows_passes():
    x = RNG.uniform(-1, 1, size=(N, F)).astype(np.float32)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always", NKIWarning)
        out = nki.simulate(_exchange(False)[2])(x)
    np.testing.assert_array_equal(out[0], 2 * x)
    np.testing.assert_array_equal(out[1], 2 * x)
    assert not ws, [str(w.message) for w in ws]


def test_the_row_the_peer_never_wrote_arrives_never_written():
    """Core 1 stores the received row core 0 never wrote: garbage on the device, nkisim's
    poison (NaN) and the partly-written warning naming core 0's send buffer; the row core 0
    received is valid (core 1 wrote it)."""
    x = RNG.uniform(-1, 1, size=(N, F)).astype(np.float32)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always", NKIWarning)
        out, extra = nki.simulate(_exchange(True)[2])(x)
    np.testing.assert_array_equal(out[0], 2 * x)
    np.testing.assert_array_equal(out[1], 2 * x)
    np.testing.assert_array_equal(extra[0], 2 * x[N - 1])
    assert np.isnan(extra[1]).all()
    msgs = [str(w.message) for w in ws]
    assert any("`extra` is only partly written" in m and "`send[2:3, 0:4]`" in m
               for m in msgs), msgs
