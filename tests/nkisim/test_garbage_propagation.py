"""Never-written values (garbage) followed element by element through element-wise
instructions and through ``nisa.sendrecv`` (issue 11, nki-library moe_block_tkg / moe_tkg).

The rule under test (nkisim.tensor, "never-written values"): an instruction may read
never-written SBUF; the result elements computed from it are garbage, and garbage is an error
only when it leaves the chip. Truth: an element-wise instruction's result element depends on
the operand elements at the same place only (nki.isa tensor_tensor / tensor_scalar docs: same
partitions, same elements per partition, a (P, 1) scalar operand broadcast along the free
dimension); sendrecv moves the sender's bytes as they are (nki.isa.sendrecv docs: "send src to
... receive into dst"), so the receiver holds exactly the sender's garbage. Values: NumPy.
"""

import warnings

import numpy as np
import pytest

from nkisim import NKIWarning, nki
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.uniform(-2, 2, size=shape).astype(np.float32)


def run(kernel, *args):
    """Simulate with NKI warnings as errors (a partly-garbage output is a warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", NKIWarning)
        return nki.simulate(kernel)(*args)


def _uninit(kernel, *args):
    with pytest.raises(ValueError) as info:
        run(kernel, *args)
    assert getattr(info.value, "nki_code", None) == "nkisim_uninitialized_read", info.value
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# element-wise instructions: garbage stays where it was


def _last_tile_partial(store):
    """A [128, 2, 8] tile whose second 128-row tile has only partitions 0:32 written (an I
    that is not a multiple of 128), updated whole in place, as nki-library's
    mlp_tkg_gate_up_projection does; ``store`` picks what goes to HBM."""
    @nki.jit
    def k(a, b):
        t = nl.ndarray((128, 2, 8), dtype=nl.float32, buffer=nl.sbuf)
        u = nl.ndarray((128, 2, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:, 0, :], src=a[0:128, :])
        nisa.dma_copy(dst=t[0:32, 1, :], src=a[128:160, :])        # partitions 32: never
        nisa.dma_copy(dst=u, src=b)
        nisa.tensor_tensor(dst=t, data1=t, data2=u, op=nl.add)     # the whole tile
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.activation(dst=t, op=nl.exp, data=t)
        rows = store[1] - store[0]
        out = nl.ndarray((rows, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t[store[0]:store[1], store[2], :])
        return out
    return k


def test_elementwise_ops_keep_valid_elements_of_partly_garbage_partitions():
    a, b = rand(160, 8), rand(128, 2, 8)
    want = np.exp(2 * (np.concatenate([a[:128, None], np.zeros((128, 1, 8), np.float32)],
                                      axis=1) + b))
    np.testing.assert_allclose(run(_last_tile_partial((0, 128, 0)), a, b), want[:, 0],
                               rtol=1e-6)
    got = run(_last_tile_partial((0, 32, 1)), a, b)              # the written part of tile 1
    np.testing.assert_allclose(got, np.exp(2 * (a[128:160] + b[:32, 1])), rtol=1e-6)


def test_elementwise_ops_keep_garbage_garbage():
    msg = _uninit(_last_tile_partial((32, 128, 1)), rand(160, 8), rand(128, 2, 8))
    assert "'tensor_tensor'" in msg and "`t[32:128, 1:2, 0:8]`" in msg, msg


def test_a_garbage_scalar_operand_spoils_its_partitions():
    """tensor_scalar's (P, 1) operand is broadcast along the free dimension: a never-written
    operand partition spoils that whole result partition, and only that one."""
    def make(lo, hi):
        @nki.jit
        def k(a, s):
            t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
            sc = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            nisa.dma_copy(dst=sc[0:100, :], src=s[0:100, :])       # partitions 100: never
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=sc)
            out = nl.ndarray((hi - lo, 8), dtype=nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=t[lo:hi, :])
            return out
        return k

    a, s = rand(128, 8), rand(128, 1)
    np.testing.assert_allclose(run(make(0, 100), a, s), a[:100] + s[:100], rtol=1e-6)
    msg = _uninit(make(100, 128), a, s)
    assert "`sc[100:128, 0:1]`" in msg, msg


# ---------------------------------------------------------------------------------------------
# sendrecv: the receiver gets the sender's garbage, not its own


@nki.jit
def _exchange_partial(a, show_garbage):
    """Core 0 sends a fully written tile, core 1 one whose rows 8:16 it never wrote."""
    pid = nl.program_id(0)
    rows = 8 if show_garbage else 16
    out = nl.ndarray((rows, 8), dtype=a.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((16, 8), dtype=a.dtype, buffer=nl.sbuf)
    theirs = nl.ndarray((16, 8), dtype=a.dtype, buffer=nl.sbuf)
    if pid == 0:
        nisa.dma_copy(dst=mine, src=a[0:16, :])
    else:
        nisa.dma_copy(dst=mine[0:8, :], src=a[16:24, :])
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - pid, recv_from_rank=1 - pid,
                  pipe_id=0)
    if show_garbage and pid == 0:           # what core 1 never wrote
        nisa.dma_copy(dst=out, src=theirs[8:16, :])
    if not show_garbage and pid == 1:       # core 0's tile, all written
        nisa.dma_copy(dst=out, src=theirs)
    return out


def test_sendrecv_receives_the_senders_written_elements():
    a = rand(24, 8)
    np.testing.assert_array_equal(run(_exchange_partial[2], a, False), a[0:16])


def test_sendrecv_receives_the_senders_garbage():
    msg = _uninit(_exchange_partial[2], rand(24, 8), True)
    assert "'sendrecv'" in msg and "`mine[8:16, 0:8]`" in msg, msg
