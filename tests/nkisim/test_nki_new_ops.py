"""The current dialect's ops nki-library needs beyond the first face (issue 11): the logical
cores of an LNC 2 launch (``nisa.core_barrier``, ``nisa.sendrecv``), and the ops added after.

Truth: the nki.isa docs (aws-neuron-sdk @81ce03ae nki/api/nki/isa/__init__.py: core_barrier,
sendrecv, ...), spec nki-current.md §3 (LNC 2 = two instances, program_id 0 and 1), NumPy for
the values.
"""

import numpy as np
import pytest

from nkisim import nki
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl

RNG = np.random.default_rng(1011)


def rand(shape, dtype=np.float32):
    return RNG.uniform(-2, 2, size=shape).astype(dtype)


# ---------------------------------------------------------------------------------------------
# LNC 2: core_barrier


@nki.jit
def halves_then_swap(a):
    """Each core writes its half of a shared tensor, both meet at the barrier, then each reads
    the half the other core wrote (the core_barrier docs' use case)."""
    n, f = a.shape
    h = n // 2
    pid = nl.program_id(0)
    shared = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    out = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[pid * h:(pid + 1) * h, :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=shared[pid * h:(pid + 1) * h, :], src=t)
    nisa.core_barrier(data=shared, cores=(0, 1))
    other = 1 - pid
    u = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=u, src=shared[other * h:(other + 1) * h, :])
    nisa.dma_copy(dst=out[pid * h:(pid + 1) * h, :], src=u)
    return out


def test_core_barrier_orders_the_halves_written_by_the_two_cores():
    a = rand((64, 32))
    out = nki.simulate(halves_then_swap[2])(a)
    want = np.concatenate([2 * a[32:], 2 * a[:32]])
    np.testing.assert_array_equal(out, want)


def test_lnc2_kernel_called_directly_gives_the_same_values():
    a = rand((64, 8))
    np.testing.assert_array_equal(halves_then_swap[2](a),
                                  np.concatenate([2 * a[32:], 2 * a[:32]]))


@nki.jit
def read_without_barrier(a):
    n, f = a.shape
    h = n // 2
    pid = nl.program_id(0)
    shared = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    out = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[pid * h:(pid + 1) * h, :])
    nisa.dma_copy(dst=shared[pid * h:(pid + 1) * h, :], src=t)
    other = 1 - pid
    u = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=u, src=shared[other * h:(other + 1) * h, :])
    nisa.dma_copy(dst=out[pid * h:(pid + 1) * h, :], src=u)
    return out


def test_reading_the_other_cores_half_without_a_barrier_is_a_race():
    """Without the barrier, core 1 reads what core 0 wrote with nothing ordering them: the
    race check names the SPMD grid (the barrier version above passes the same check)."""
    with pytest.raises(ValueError, match="SPMD grid"):
        nki.simulate(read_without_barrier[2])(rand((64, 8)))


@nki.jit
def barrier_on_core0_only(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    if nl.program_id(0) == 0:
        nisa.dma_copy(dst=out, src=t)
        nisa.core_barrier(out, (0, 1))
    return out


def test_a_barrier_only_one_core_reaches_is_a_deadlock_naming_it():
    with pytest.raises(RuntimeError, match=r"deadlock.*program 0 waits at core_barrier\(cores="
                                           r"\(0, 1\)\) at .*test_nki_new_ops.py:\d+.*program 1 "
                                           r"has finished"):
        nki.simulate(barrier_on_core0_only[2])(rand((16, 8)))


@nki.jit
def barrier_of_one_core(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.dma_copy(dst=out, src=t)
    nisa.core_barrier(out, (0))          # nki-library's spelling on one core: an int
    return out


def test_a_barrier_of_core_0_alone_runs_on_one_core():
    a = rand((16, 8))
    np.testing.assert_array_equal(nki.simulate(barrier_of_one_core)(a), a)


@nki.jit
def barrier_of_two_cores(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.dma_copy(dst=out, src=t)
    nisa.core_barrier(out, (0, 1))
    return out


def test_a_barrier_naming_a_core_the_launch_lacks_is_an_error():
    with pytest.raises(ValueError, match=r"core_barrier: cores=1 names no logical core of this "
                                         r"launch \(1 instance"):
        nki.simulate(barrier_of_two_cores)(rand((16, 8)))


def test_a_barrier_on_an_sbuf_tile_is_an_error():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.core_barrier(t, (0, 1))
        nisa.dma_copy(dst=out, src=t)
        return out
    with pytest.raises(nisa.NkiValidationError, match="'data' of 'core_barrier' to be in "
                                                      "address space 'hbm'"):
        nki.simulate(k[2])(rand((16, 8)))


# ---------------------------------------------------------------------------------------------
# LNC 2: sendrecv


@nki.jit
def exchange_and_add(a):
    """Each core loads its half, swaps it with the other core and adds: the LNC all-reduce of
    nki-library's attention kernels (sendrecv then tensor_tensor)."""
    n, f = a.shape
    h = n // 2
    pid = nl.program_id(0)
    out = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    theirs = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=a[pid * h:(pid + 1) * h, :])
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - pid, recv_from_rank=1 - pid,
                  pipe_id=0)
    total = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=total, data1=mine, data2=theirs, op=nl.add)
    if pid == 0:
        nisa.dma_copy(dst=out, src=total)
    return out


def test_sendrecv_swaps_tiles_between_the_two_cores():
    a = rand((64, 16))
    out = nki.simulate(exchange_and_add[2])(a)
    np.testing.assert_array_equal(out, a[:32] + a[32:])


@nki.jit
def ring_twice(a):
    """Two exchanges on two pipes, the second of the received data: each core ends with its
    own half again (ring of 2: next = prev = the other core)."""
    n, f = a.shape
    h = n // 2
    pid = nl.program_id(0)
    out = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    y = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    z = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a[pid * h:(pid + 1) * h, :])
    nxt, prv = (pid + 1) % 2, (pid - 1) % 2
    nisa.sendrecv(x, y, send_to_rank=nxt, recv_from_rank=prv, pipe_id=0)
    nisa.tensor_scalar(dst=y, data=y, op0=nl.add, operand0=1.0)
    nisa.sendrecv(y, z, send_to_rank=nxt, recv_from_rank=prv, pipe_id=1)
    nisa.dma_copy(dst=out[pid * h:(pid + 1) * h, :], src=z)
    return out


def test_two_sendrecvs_in_a_row_return_each_half_plus_one():
    a = rand((32, 8))
    np.testing.assert_array_equal(nki.simulate(ring_twice[2])(a), a + np.float32(1.0))


def test_sendrecv_to_itself_on_one_core_copies():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.sendrecv(x, y, send_to_rank=0, recv_from_rank=0, pipe_id=0)
        nisa.dma_copy(dst=out, src=y)
        return out
    a = rand((16, 4))
    np.testing.assert_array_equal(nki.simulate(k)(a), a)


@nki.jit
def mismatched_exchange(a):
    pid = nl.program_id(0)
    f = 8 if pid == 0 else 4           # core 1 sends a narrower tile than core 0 expects
    out = nl.ndarray((16, 8), dtype=a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray((16, f), dtype=a.dtype, buffer=nl.sbuf)
    y = nl.ndarray((16, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a[:, 0:f])
    nisa.sendrecv(x, y, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    if pid == 0:
        nisa.dma_copy(dst=out, src=y)
    return out


def test_sendrecv_of_mismatched_shapes_names_both_sides():
    with pytest.raises(ValueError, match=r"sendrecv\(pipe_id=0.*program 1 sends \[16, 4\] "
                                         r"float32 but program 0 receives into \[16, 8\]"):
        nki.simulate(mismatched_exchange[2])(rand((16, 8)))


@nki.jit
def different_pipes(a):
    pid = nl.program_id(0)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    nisa.sendrecv(x, y, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=pid)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_sendrecv_on_different_pipes_deadlocks_with_both_waits_named():
    with pytest.raises(RuntimeError, match=r"deadlock.*program 0 waits at sendrecv\(pipe_id=0"
                                           r".*program 1 waits at sendrecv\(pipe_id=1"):
        nki.simulate(different_pipes[2])(rand((16, 8)))


@pytest.mark.parametrize("kw, msg", [
    (dict(send_to_rank=2, recv_from_rank=0), r"send_to_rank=2 names no logical core"),
    (dict(send_to_rank=0, recv_from_rank=0, pipe_id=0.5), r"pipe_id must be an int"),
])
def test_sendrecv_bad_ranks_and_pipes_are_one_line_errors(kw, msg):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.sendrecv(x, y, **{"pipe_id": 0, **kw})
        nisa.dma_copy(dst=out, src=y)
        return out
    with pytest.raises(ValueError, match=msg):
        nki.simulate(k[2])(rand((16, 8)))


def test_sendrecv_checks_dtype_buffer_and_gpsimd_dma_size():
    def run(dst_dtype=np.float32, f=8, buf="sbuf", engine=None):
        @nki.jit
        def k(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            x = nl.ndarray((16, f), dtype=a.dtype, buffer=nl.sbuf)
            y = nl.ndarray((16, f), dtype=dst_dtype,
                           buffer=nl.sbuf if buf == "sbuf" else nl.psum)
            nisa.memset(dst=x, value=0.0)
            kw = {} if engine is None else {"dma_engine": engine}
            nisa.sendrecv(x, y, send_to_rank=0, recv_from_rank=0, pipe_id=0, **kw)
            nisa.dma_copy(dst=out, src=a)
            return out
        return nki.simulate(k)(rand((16, 8)))
    with pytest.raises(ValueError, match="same dtype"):
        run(dst_dtype=np.float16)
    with pytest.raises(nisa.NkiValidationError, match="dst must be in SBUF"):
        run(buf="psum")
    run(f=256, engine=nisa.dma_engine.gpsimd_dma)          # 1024 bytes of fp32: the limit
    with pytest.raises(ValueError, match="at most 1024 bytes per partition"):
        run(f=257, engine=nisa.dma_engine.gpsimd_dma)


def test_lnc2_instances_each_have_their_own_sbuf_accounting():
    """Each logical core has its own SBUF: two instances suspended at a barrier while each
    holds a 100 KiB-per-partition tile (together more than trn2's 192 KiB) do not overflow."""
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        big = nl.ndarray((128, 25600), dtype=nl.float32, buffer=nl.sbuf)    # 100 KiB
        nisa.memset(dst=big, value=1.0)
        nisa.core_barrier(out, (0, 1))
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=big[:, 0:a.shape[1]])
        if nl.program_id(0) == 0:
            nisa.dma_copy(dst=out, src=t)
        return out
    out = nki.simulate(k[2])(rand((128, 8)))
    np.testing.assert_array_equal(out, np.ones((128, 8), np.float32))


def test_the_trace_records_one_barrier_and_one_sendrecv_per_core():
    a = rand((64, 16))
    exchange_and_add[2](a)
    run = exchange_and_add.last_run if exchange_and_add.last_run else None
    from nkisim.runtime import last_run
    ops = [i.op for i in last_run().trace.instrs]
    assert ops.count("sendrecv") == 2
    halves_then_swap[2](a)
    ops = [i.op for i in last_run().trace.instrs]
    assert ops.count("core_barrier") == 2
    del run


# ---------------------------------------------------------------------------------------------
# .ap(scalar_offset=...) as nki-library's indexed_flatten uses it


def test_ap_indirect_dim_counts_in_the_shape_of_a_reshaped_view():
    """``row_offsets.reshape((1, N)).ap(pattern, offset, scalar_offset, indirect_dim=1)`` on a
    1-D [N] tensor: dim 1 of the view's shape (stride 1) scales the offset (NkiTensor.ap docs:
    "dimension in self.shape")."""
    @nki.jit
    def k(a):
        n = a.shape[0]
        out = nl.ndarray((1, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        start = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=start, value=3)
        t = nl.ndarray((1, 4), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.reshape((1, n)).ap(pattern=[[n, 1], [1, 4]], offset=2,
                                                        scalar_offset=start, indirect_dim=1))
        nisa.dma_copy(dst=out, src=t)
        return out
    a = np.arange(16, dtype=np.int32)
    np.testing.assert_array_equal(nki.simulate(k)(a), a[5:9][None, :])


def _scatter_at(value, oob):
    @nki.jit
    def k(a):
        out = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        off = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=off, value=value)
        t = nl.ndarray((2, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=7)
        nisa.dma_copy(dst=out.ap(pattern=[[8, 2], [1, 8]], offset=0, scalar_offset=off,
                                 indirect_dim=0), src=t, oob_mode=oob)
        return out
    return nki.simulate(k)(np.zeros((4, 8), np.int32))


def test_ap_runtime_offset_in_bounds_writes_its_rows():
    out = _scatter_at(1, nisa.oob_mode.error)
    want = np.zeros((4, 8), np.int32)
    want[1:3] = 7
    np.testing.assert_array_equal(out, want)


def test_ap_runtime_offset_out_of_bounds_is_skipped_with_oob_skip():
    np.testing.assert_array_equal(_scatter_at(-1000000, nisa.oob_mode.skip),
                                  np.zeros((4, 8), np.int32))
    out = _scatter_at(3, nisa.oob_mode.skip)          # row 3 inside, row 4 outside
    want = np.zeros((4, 8), np.int32)
    want[3] = 7
    np.testing.assert_array_equal(out, want)


def test_ap_runtime_offset_out_of_bounds_is_an_error_by_default():
    with pytest.raises(IndexError, match=r"scalar_offset -1000000 puts 16 of 16 elements "
                                         r"outside `out` \[4, 8\]"):
        _scatter_at(-1000000, nisa.oob_mode.error)
