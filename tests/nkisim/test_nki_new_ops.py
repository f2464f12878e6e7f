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


def test_a_barrier_on_an_sbuf_tile_is_a_tolerated_rule_and_psum_an_error():
    # docs: data "must be data in shared HBM"; AWS's CI-tested nki-library (moe_cte's
    # bwmm_shard_on_I.py) synchronises on an SBUF tile: a warning quoting the rule, strict: error
    def make(buffer):
        @nki.jit
        def k(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            s = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=s, src=a)
            t = nl.ndarray(a.shape, dtype=a.dtype, buffer=buffer)
            nisa.tensor_copy(dst=t, src=s)
            nisa.core_barrier(t, (0, 1))
            u = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=u, src=t)
            h = a.shape[0] // 2
            pid = nl.program_id(0)
            nisa.dma_copy(dst=out[pid * h:(pid + 1) * h, :], src=u[pid * h:(pid + 1) * h, :])
            return out
        return k

    a = rand((16, 8))
    with pytest.warns(Warning, match="must be data in shared HBM"):
        np.testing.assert_array_equal(nki.simulate(make(nl.sbuf)[2])(a), a)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NKISIM_STRICT", "1")
        with pytest.raises(ValueError, match="must be data in shared HBM"):
            nki.simulate(make(nl.sbuf)[2])(a)
    with pytest.raises(nisa.NkiValidationError, match="'data' of 'core_barrier' to be in "
                                                      "address space 'hbm'"):
        nki.simulate(make(nl.psum)[2])(a)


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


# ---------------------------------------------------------------------------------------------
# nc_n_gather, nonzero_with_count


@nki.jit
def n_gather(data, idx):
    out = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    d = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    i = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
    g = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=data)
    nisa.dma_copy(dst=i, src=idx)
    nisa.nc_n_gather(dst=g, data=d, indices=i)
    nisa.dma_copy(dst=out, src=g)
    return out


def test_nc_n_gather_gathers_each_partitions_flattened_free_dims():
    data = rand((32, 4, 8))
    idx = RNG.integers(0, 32, size=(32, 6, 2)).astype(np.uint32)
    out = nki.simulate(n_gather)(data, idx)
    want = np.take_along_axis(data.reshape(32, -1), idx.reshape(32, -1).astype(np.int64),
                              axis=1).reshape(idx.shape)
    np.testing.assert_array_equal(out, want)


def test_nc_n_gather_rejects_int32_indices_and_indices_past_the_partition():
    with pytest.raises(TypeError, match="'indices' of 'nc_n_gather' has dtype int32; expected "
                                        "one of the following dtypes: uint32"):
        nki.simulate(n_gather)(rand((8, 16)), np.zeros((8, 4), np.int32))
    with pytest.raises(ValueError, match="index 16 .*outside the 16 elements"):
        nki.simulate(n_gather)(rand((8, 16)), np.full((8, 4), 16, np.uint32))


def test_nc_n_gather_costs_like_a_gpsimd_gather():
    from nkisim.cost import instr_cost_ns
    from nkisim.runtime import last_run
    nki.simulate(n_gather)(rand((16, 64)), np.zeros((16, 32), np.uint32))
    instr = [i for i in last_run().trace.instrs if i.op == "nc_n_gather"][0]
    assert instr.engine == "gpsimd" and instr.free == 32
    # GpSimd start-up + one cycle per element, as local_gather (nkisim.cost)
    from nkisim.cost import params_for
    p = params_for("trn2")
    assert instr_cost_ns(instr, p) == pytest.approx((p.gpsimd_start_cycles + 32) /
                                                    p.clock_ghz("gpsimd"))


def nonzero_ref(x, offset, pad):
    """The docs' "Behavior" pseudo-code, for one partition."""
    nz = [i + offset for i in range(len(x)) if x[i] != 0]
    return nz + [pad] * (len(x) - len(nz)) + [len(nz)]


@nki.jit
def nonzero(x, offset, pad):
    out = nl.ndarray((x.shape[0], x.shape[1] + 1), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    r = nl.ndarray((x.shape[0], x.shape[1] + 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.memset(dst=r, value=7)
    nisa.nonzero_with_count(dst=r, src=t, index_offset=offset, padding_val=pad)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_nonzero_with_count_matches_the_docs_example():
    x = np.zeros((16, 8), np.float32)
    x[0] = [0, 1, 1, 0, 0, 1, 0, 0]
    out = nki.simulate(nonzero)(x, 16, -1)
    np.testing.assert_array_equal(out[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])


def test_nonzero_with_count_writes_only_every_16th_partition():
    x = (RNG.uniform(size=(128, 40)) < 0.3).astype(np.int32) * RNG.integers(-5, 5, (128, 40))
    x = x.astype(np.int32)
    out = nki.simulate(nonzero)(x, 3, -9)
    for p in range(128):
        want = nonzero_ref(x[p], 3, -9) if p % 16 == 0 else [7] * 41
        np.testing.assert_array_equal(out[p], want, err_msg=f"partition {p}")


def test_nonzero_with_count_errors():
    with pytest.raises(TypeError, match="'src' of 'nonzero_with_count' has dtype bfloat16"):
        nki.simulate(nonzero)(np.zeros((16, 8), nl.bfloat16), 0, -1)
    with pytest.raises(ValueError, match="padding_val must be an int32, got 1.5"):
        nki.simulate(nonzero)(np.zeros((16, 8), np.float32), 0, 1.5)


def test_nonzero_with_count_is_not_on_trn1(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(ValueError, match=r"NeuronCore-v3 \(trn2\) and newer, not on trn1"):
        nki.simulate(nonzero)(np.zeros((16, 8), np.float32), 0, -1)


# ---------------------------------------------------------------------------------------------
# registers: register_alloc / register_move / register_load / register_store


@pytest.fixture
def nki06(monkeypatch):
    """NKI 0.6 (the parser front end: nl.dynamic_range and `while reg:` exist)."""
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.6")


@nki.jit
def dynamic_rows(a, n_tiles):
    """Doubles the first n_tiles[0] row tiles of `a`, a run-time trip count loaded into a
    register (nki-library dynamic_elementwise_add's pattern); the rest stays zero."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    z = nl.ndarray((16, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.memset(dst=z, value=0.0)
    for i in range(a.shape[0] // 16):
        nisa.dma_copy(dst=out[i * 16:(i + 1) * 16, :], src=z)
    n_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=n_sb, src=n_tiles[0:1].reshape((1, 1)))
    reg = nisa.register_alloc()
    nisa.register_load(reg, n_sb)
    start = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=start, value=0)
    for _ in nl.dynamic_range(0, reg, 1):
        t = nl.ndarray((16, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap(pattern=[[a.shape[1], 16], [1, a.shape[1]]], offset=0,
                                      scalar_offset=start, indirect_dim=0))
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out.ap(pattern=[[a.shape[1], 16], [1, a.shape[1]]], offset=0,
                                 scalar_offset=start, indirect_dim=0), src=t)
        nisa.tensor_scalar(dst=start, data=start, op0=nl.add, operand0=16)
    return out


@pytest.mark.filterwarnings("ignore:nl.dynamic_range is deprecated")
def test_register_loaded_from_sbuf_bounds_a_dynamic_range(nki06):
    a = rand((64, 8))
    out = nki.simulate(dynamic_rows)(a, np.array([3], np.int32))
    want = np.zeros_like(a)
    want[:48] = 2 * a[:48]
    np.testing.assert_array_equal(out, want)


def test_register_move_store_and_while_loop_on_a_register(nki06):
    @nki.jit
    def k(a):
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        r = nisa.register_alloc(5)
        counter = nisa.register_alloc(0)
        cond = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        steps = 0
        while r:                              # 5, 4, ..., 1: five trips
            steps += 1
            nisa.memset(dst=cond, value=5 - steps)
            nisa.register_load(r, cond)
        nisa.register_move(counter, steps * 10)
        copy = nisa.register_alloc()
        nisa.register_move(copy, counter)
        res = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(res, copy)
        nisa.dma_copy(dst=out, src=res)
        return out
    np.testing.assert_array_equal(nki.simulate(k)(rand((2, 2))), [[50]])


def test_register_alloc_of_a_tensor_element_loads_it(nki06):
    @nki.jit
    def k(a):
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        r = nisa.register_alloc(t[0, 2])      # nki-library all_expert_mx_impl's form
        res = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(res, r)
        nisa.dma_copy(dst=out, src=res)
        return out
    np.testing.assert_array_equal(nki.simulate(k)(np.array([[4, 5, 6, 7]], np.int32)), [[6]])


def test_register_errors_are_one_line():
    @nki.jit
    def uninit(a):
        r = nisa.register_alloc()
        nisa.register_move(nisa.register_alloc(), r)
        return a
    with pytest.raises(ValueError, match="read before any value was written"):
        nki.simulate(uninit)(rand((2, 2)))

    @nki.jit
    def too_big(a):
        t = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0)
        nisa.register_load(nisa.register_alloc(), t)
        return a
    with pytest.raises(ValueError, match=r"src must hold exactly one element, got \[1, 2\]"):
        nki.simulate(too_big)(rand((2, 2)))
    with pytest.raises(ValueError, match="does not fit a 32-bit register"):
        nki.simulate(lambda a: (nisa.register_alloc(2**31), a)[1])(rand((2, 2)))


def test_nki_0_7_tracer_refuses_a_register_in_python_control_flow(monkeypatch):
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.7")

    @nki.jit
    def k(a):
        r = nisa.register_alloc(1)
        if r:
            pass
        return a
    with pytest.raises(TypeError, match="tracer front end"):
        nki.simulate(k)(rand((2, 2)))


@pytest.mark.filterwarnings("ignore:nl.dynamic_range is deprecated")
def test_register_load_is_traced_as_a_4_byte_transfer(nki06):
    from nkisim.runtime import last_run
    nki.simulate(dynamic_rows)(rand((32, 8)), np.array([1], np.int32))
    loads = [i for i in last_run().trace.instrs if i.op == "register_load"]
    assert len(loads) == 1 and loads[0].engine == "dma" and loads[0].detail["bytes"] == 4


# ---------------------------------------------------------------------------------------------
# dma_compute


@nki.jit
def residual_sum(a, b, c):
    """qkv_tkg's fused residual: dst = hidden + attn_prev + mlp_prev, HBM to HBM."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_compute(out, (a, b, c), scales=(1.0, 1.0, 1.0), reduce_op=nl.add)
    return out


def test_dma_compute_sums_in_fp32_and_rounds_to_dst():
    import ml_dtypes
    bf = ml_dtypes.bfloat16
    a, b, c = (rand((8, 64)).astype(bf) for _ in range(3))
    out = nki.simulate(residual_sum)(a, b, c)
    want = (a.astype(np.float32) + b.astype(np.float32) + c.astype(np.float32)).astype(bf)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))


def test_dma_compute_into_sbuf_from_hbm_and_sbuf():
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=b)
        nisa.dma_compute(dst=t, srcs=[a, t], reduce_op=nl.add)     # t += a (topk_reduce's)
        nisa.dma_copy(dst=out, src=t)
        return out
    a, b = rand((16, 8)), rand((16, 8))
    np.testing.assert_array_equal(nki.simulate(k)(a, b), a + b)


def test_dma_compute_scatter_rmw_with_vector_offset():
    """Scatter RMW: dst(HBM)[indices] = dst[indices] + src(SB), one source matching dst."""
    @nki.jit
    def k(table, upd, idx):
        out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=table)
        u = nl.ndarray(upd.shape, dtype=upd.dtype, buffer=nl.sbuf)
        i = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=upd)
        nisa.dma_copy(dst=i, src=idx)
        rows = out.ap(pattern=[[table.shape[1], upd.shape[0]], [1, table.shape[1]]], offset=0,
                      vector_offset=i, indirect_dim=0)
        nisa.dma_compute(dst=rows, srcs=[rows, u], reduce_op=nl.add)
        return out
    table, upd = rand((10, 4)), rand((3, 4))
    idx = np.array([[7], [2], [5]], np.int32)
    want = table.copy()
    want[[7, 2, 5]] += upd
    np.testing.assert_array_equal(nki.simulate(k)(table, upd, idx), want)


@pytest.mark.parametrize("kw, err, msg", [
    (dict(reduce_op=nl.multiply), ValueError, "only nl.add is supported for reduce_op"),
    (dict(scales=(1.0, 2.0)), ValueError, r"all values in scales must be 1.0, got \[1.0, 2.0\]"),
    (dict(scales=(1.0,)), ValueError, "scales must be a list of 2 values"),
    (dict(srcs_n=17), ValueError, "at most 16 source tensors, got 17"),
    (dict(short=True), ValueError, r"element counts differ \(128 vs 64\)"),
])
def test_dma_compute_argument_errors(kw, err, msg):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        srcs = [a] * kw.get("srcs_n", 2)
        if kw.get("short"):
            srcs = [a, a[0:8, :]]
        nisa.dma_compute(out, srcs, reduce_op=kw.get("reduce_op", nl.add),
                         scales=kw.get("scales"))
        return out
    with pytest.raises(err, match=msg):
        nki.simulate(k)(rand((16, 8)))


def test_dma_compute_is_one_dma_moving_every_source():
    from nkisim.runtime import last_run
    nki.simulate(residual_sum)(rand((8, 64)), rand((8, 64)), rand((8, 64)))
    (instr,) = [i for i in last_run().trace.instrs if i.op == "dma_compute"]
    assert instr.engine == "dma" and len(instr.reads) == 3
    assert instr.detail["bytes"] == 3 * 8 * 64 * 4


def test_nc_versions_are_ordered_by_generation():
    """nki-library's topk: ``if nisa.get_nc_version() <= nisa.nc_version.gen2``; its
    experimental/collectives fgcc.py and fg_allgather.py: ``nisa.get_nc_version() >= 3`` (a
    plain int, read as the generation)."""
    v = nisa.nc_version
    assert v.gen2 < v.gen3 < v.gen4 and v.gen3 <= v.gen3 and not v.gen4 <= v.gen2
    assert sorted([v.gen4, v.gen2, v.gen3]) == [v.gen2, v.gen3, v.gen4]
    assert v.gen3 >= 3 and v.gen4 >= 3 and not v.gen2 >= 3
    assert v.gen2 < 3 and v.gen3 <= 3 and v.gen3 > 2 and not v.gen3 > 3
    assert 3 <= v.gen3 and 2 < v.gen3 and not 4 <= v.gen3       # reflected
    with pytest.raises(TypeError):
        v.gen2 < "3"  # noqa: B015
    with pytest.raises(TypeError):
        v.gen2 < True  # noqa: B015


def test_an_error_in_one_core_while_the_other_waits_is_raised_and_no_thread_is_left():
    import threading
    before = threading.active_count()

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        if nl.program_id(0) == 1:
            nisa.dma_copy(dst=t, src=a[0:4, :])          # 4 rows into 16: a shape error
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=out, src=t)
        nisa.core_barrier(out, (0, 1))
        return out
    with pytest.raises(ValueError, match="element counts differ"):
        nki.simulate(k[2])(rand((16, 8)))
    with pytest.raises(RuntimeError, match="deadlock"):
        nki.simulate(barrier_on_core0_only[2])(rand((16, 8)))
    assert threading.active_count() == before


def test_lnc2_runs_are_deterministic():
    a = rand((64, 16))
    from nkisim.runtime import last_run
    exchange_and_add[2](a)
    first = [(i.op, i.line) for i in last_run().trace.instrs]
    exchange_and_add[2](a)
    assert [(i.op, i.line) for i in last_run().trace.instrs] == first


def test_sendrecv_costs_as_an_sbuf_to_sbuf_copy_and_the_barrier_as_one_min_ii():
    from nkisim.cost import instr_cost_ns, params_for
    from nkisim.runtime import last_run

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=x)                       # the SBUF -> SBUF reference
        nisa.sendrecv(x, y, send_to_rank=0, recv_from_rank=0, pipe_id=0)
        nisa.dma_copy(dst=out, src=y)
        nisa.core_barrier(out, (0,))
        return out
    nki.simulate(k)(rand((128, 64)))
    p = params_for("trn2")
    instrs = last_run().trace.instrs
    copy = [i for i in instrs if i.op == "dma_copy"][1]
    (sr,) = [i for i in instrs if i.op == "sendrecv"]
    (bar,) = [i for i in instrs if i.op == "core_barrier"]
    assert instr_cost_ns(sr, p) == pytest.approx(instr_cost_ns(copy, p))
    assert bar.engine == "gpsimd"
    assert instr_cost_ns(bar, p) == pytest.approx(p.min_ii_cycles / p.clock_ghz("gpsimd"))


def test_ap_vector_offset_on_a_flattened_view_indexes_elements():
    """nki-library router_topk: ``expert_affinities.reshape((T * E,)).ap([[s, P], [1, 1]],
    vector_offset=idx, indirect_dim=0)`` scatters one value per partition to element idx[p]
    of the [T, E] tensor (dim 0 of the 1-D view: stride 1)."""
    @nki.jit
    def k(table, vals, idx):
        out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=table)
        v = nl.ndarray(vals.shape, dtype=vals.dtype, buffer=nl.sbuf)
        i = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v, src=vals)
        nisa.dma_copy(dst=i, src=idx)
        flat = out.reshape((table.shape[0] * table.shape[1],))
        nisa.dma_copy(dst=flat.ap([[1, vals.shape[0]], [1, 1]], offset=0, vector_offset=i,
                                  indirect_dim=0), src=v)
        return out
    table = np.zeros((4, 6), np.float32)
    vals = rand((3, 1))
    idx = np.array([[5], [13], [22]], np.int32)
    want = table.copy().reshape(-1)
    want[[5, 13, 22]] = vals[:, 0]
    np.testing.assert_array_equal(nki.simulate(k)(table, vals, idx), want.reshape(4, 6))


# ---------------------------------------------------------------------------------------------
# LNC 2: each logical core has its own SBUF/PSUM (nki-current.md §3), address-placed tiles too


@nki.jit
def placed_tile_per_core(a):
    """Both cores place a tile at the same SBUF address (AWS's attention_cte does), scale their
    own half in it, meet at a barrier, then write it out: neither core sees the other's bytes."""
    n, f = a.shape
    h = n // 2
    pid = nl.program_id(0)
    out = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf, address=(0, 0))
    nisa.dma_copy(dst=t, src=a[pid * h:(pid + 1) * h, :])
    nisa.core_barrier(data=out, cores=(0, 1))
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
    nisa.dma_copy(dst=out[pid * h:(pid + 1) * h, :], src=t)
    return out


@nki.jit
def placed_tile_no_barrier(a):
    n, f = a.shape
    h = n // 2
    pid = nl.program_id(0)
    out = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((h, f), dtype=a.dtype, buffer=nl.sbuf, address=(0, 512))
    nisa.dma_copy(dst=t, src=a[pid * h:(pid + 1) * h, :])
    nisa.dma_copy(dst=out[pid * h:(pid + 1) * h, :], src=t)
    return out


@pytest.mark.parametrize("kernel", [placed_tile_per_core, placed_tile_no_barrier])
def test_lnc2_address_placed_tiles_are_per_core(kernel):
    a = rand((64, 16))
    out = nki.simulate(kernel[2])(a)
    want = a * (3 if kernel is placed_tile_per_core else 1)
    np.testing.assert_array_equal(out, want)


@nki.jit
def shared_hbm_same_rows(a):
    """A real cross-core race stays one: both cores write different values to the same rows."""
    n, f = a.shape
    pid = nl.program_id(0)
    out = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.sbuf, address=(0, 0))
    nisa.dma_copy(dst=t, src=a)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=pid * 1.0)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_lnc2_cross_core_hbm_race_still_reported():
    with pytest.raises(Exception, match="output_dependencies|program id"):
        nki.simulate(shared_hbm_same_rows[2])(rand((32, 8)))
