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


# ---------------------------------------------------------------------------------------------
# Beta 1: a student's last band of an image, loaded only where the image has rows. Truth: a
# reduction over free axes (nl.max, nisa.tensor_reduce; ref §1.8, §1.10) makes each result
# element from its own group only; a matmul's result column n from moving column n only (ref
# §1.11); a partial sum computed from garbage is garbage, and adding to it keeps it so (the
# device adds to whatever the PSUM location holds). Values: NumPy.

from nkisim import beta1 as b1  # noqa: E402
from nkisim.beta1 import isa as b1isa  # noqa: E402
from nkisim.beta1 import language as b1l  # noqa: E402


def _b1(kernel, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NKIWarning)
        return b1.simulate_kernel(kernel, *args)


def _pool_band(how, stored_rows):
    """A [128, 4, 8] band of which rows 0:2 were loaded; the max of column pairs by ``how``;
    result rows ``stored_rows`` to HBM."""
    @b1.jit
    def k(x):
        lo, hi = stored_rows
        out = b1l.ndarray((128, hi - lo, 4), dtype=b1l.float32, buffer=b1l.shared_hbm)
        xb = b1l.ndarray((128, 4, 8), dtype=b1l.float32, buffer=b1l.sbuf)
        b1isa.dma_copy(src=x[:, 0:2, :], dst=xb[:, 0:2, :])        # rows 2, 3: past the image
        if how == "tensor_reduce":
            res = b1isa.tensor_reduce(b1l.max, xb.reshape((128, 4, 4, 2)), axis=3)
        elif how == "nl.max":
            res = b1l.max(xb.reshape((128, 4, 4, 2)), axis=3)
        else:
            res = b1l.max(xb.reshape((128, 4, 4, 2)), axis=3, keepdims=True)
        b1isa.dma_copy(src=res.reshape((128, 4, 4))[:, lo:hi, :], dst=out)
        return out
    return k


@pytest.mark.parametrize("how", ["tensor_reduce", "nl.max", "nl.max keepdims"])
def test_a_reduction_keeps_the_rows_of_loaded_data(how):
    x = rand(128, 4, 8)
    got = _b1(_pool_band(how, (0, 2)), x)
    np.testing.assert_array_equal(got, x[:, 0:2].reshape(128, 2, 4, 2).max(axis=3))


@pytest.mark.parametrize("how", ["tensor_reduce", "nl.max", "nl.max keepdims"])
def test_a_reduction_of_garbage_is_garbage(how):
    with pytest.raises(ValueError) as info:
        _b1(_pool_band(how, (2, 4)), rand(128, 4, 8))
    assert getattr(info.value, "nki_code", None) == "nkisim_uninitialized_read", info.value
    assert "`xb[0:128, 2:4, 0:8]`" in str(info.value)
    # one garbage row among the stored ones: a partly garbage output, a warning (see above)
    with pytest.warns(NKIWarning, match=r"only partly written.*region \[0:128, 1:2, 0:4\]"):
        b1.simulate_kernel(_pool_band(how, (1, 3)), rand(128, 4, 8))


def _softmax_rows(cols):
    """softmax along each row of a [128, 2, 8] tile whose row 1 has only columns 0:4 loaded;
    row 1's columns ``cols`` to HBM."""
    @b1.jit
    def k(x):
        out = b1l.ndarray((128, cols[1] - cols[0]), dtype=b1l.float32, buffer=b1l.shared_hbm)
        xb = b1l.ndarray((128, 2, 8), dtype=b1l.float32, buffer=b1l.sbuf)
        b1isa.dma_copy(src=x[:, 0, :], dst=xb[:, 0, :])
        b1isa.dma_copy(src=x[:, 1, 0:4], dst=xb[:, 1, 0:4])
        sm = b1l.softmax(xb, axis=2)
        b1isa.dma_copy(src=sm[:, 1, cols[0]:cols[1]], dst=out)
        return out
    return k


def test_softmax_spreads_a_rows_garbage_over_the_row():
    """Each softmax value divides by its row's sum: a row with a garbage element is garbage
    all along (an element-wise taint marked only columns 4:8 and let 0:4 pass)."""
    with pytest.raises(ValueError) as info:
        _b1(_softmax_rows((0, 4)), rand(128, 2, 8))
    assert getattr(info.value, "nki_code", None) == "nkisim_uninitialized_read", info.value


def _conv_tail(first_tap_reads_garbage, pool):
    """Three taps accumulated into an nl.zeros PSUM tile of 4 rows; input rows 4, 5 (the tap
    windows' last rows) were never loaded, so conv rows 2, 3 read them (tap 0 only when
    ``first_tap_reads_garbage``: then taps 1, 2 read shifted, loaded rows instead). Returns
    pooled row 0 (conv rows 0, 1) and, when ``pool`` is 0, conv rows ``0:2`` or 2:4."""
    @b1.jit
    def k(a, x, rows):
        lo, hi = rows
        out = b1l.ndarray((128, hi - lo, 8 // max(pool, 1)), dtype=b1l.float32,
                          buffer=b1l.shared_hbm)
        a_sb = b1l.ndarray((128, 128), dtype=b1l.float32, buffer=b1l.sbuf)
        b1isa.dma_copy(src=a, dst=a_sb)
        xb = b1l.ndarray((128, 6, 8), dtype=b1l.float32, buffer=b1l.sbuf)
        b1isa.dma_copy(src=x[:, 0:4, :], dst=xb[:, 0:4, :])
        ps = b1l.zeros((128, 4, 8), b1l.float32, buffer=b1l.psum)
        for i in b1l.affine_range(3):
            r0 = 2 - i if first_tap_reads_garbage else i     # tap 0 at rows 2:6 if so
            ps += b1isa.nc_matmul(a_sb, xb[:, r0:r0 + 4, :])
        conv = b1l.ndarray((128, 4, 8), dtype=b1l.float32, buffer=b1l.sbuf)
        conv[...] = b1isa.tensor_copy(ps)
        if pool:
            res = b1l.max(conv.reshape((128, 2, 2, 4, 2)), axis=[2, 4])
        else:
            res = conv
        b1isa.dma_copy(src=res[:, lo:hi, :], dst=out)
        return out
    return k


def _conv_tail_values(a, x, first_tap_reads_garbage):
    x64 = np.concatenate([x, np.full((128, 2, 8), np.nan, np.float32)], axis=1)
    starts = (2, 1, 0) if first_tap_reads_garbage else (0, 1, 2)
    return sum(a.T.astype(np.float64) @ x64[:, r:r + 4].reshape(128, 32)
               for r in starts).reshape(128, 4, 8)


@pytest.mark.parametrize("first", [False, True])
def test_conv_rows_from_loaded_rows_are_right_and_raise_no_rule(first):
    a, x = rand(128, 128), rand(128, 4, 8)
    want = _conv_tail_values(a, x, first)
    # (warnings are errors: no "PSUM tile created without zeros" for the nl.zeros tile)
    np.testing.assert_allclose(_b1(_conv_tail(first, 0), a, x, (0, 2)), want[:, 0:2],
                               rtol=1e-5, atol=1e-4)
    pooled = want[:, 0:2].reshape(128, 1, 2, 4, 2).max(axis=(2, 4))
    np.testing.assert_allclose(_b1(_conv_tail(first, 2), a, x, (0, 1)), pooled,
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("first", [False, True])
def test_conv_rows_from_unloaded_rows_stay_garbage(first):
    """Also when only the first matmul of the group read the garbage: the later ones add to
    it (before, they took the garbage rows for fresh PSUM and dropped tap 0)."""
    a, x = rand(128, 128), rand(128, 4, 8)
    for pool, rows in ((0, (2, 4)), (0, (3, 4)), (2, (1, 2))):
        with pytest.raises(ValueError) as info:
            _b1(_conv_tail(first, pool), a, x, rows)
        assert getattr(info.value, "nki_code", None) == "nkisim_uninitialized_read"
        assert "'nc_matmul'" in str(info.value) and "`xb[0:128, 4:" in str(info.value)


def test_an_ndarray_psum_tile_still_starts_its_group_where_never_written():
    """The mark of garbage is per element: a never-written element of a tile that holds
    garbage elsewhere is still fresh (the first matmul overwrites it, with the rule)."""
    @b1.jit
    def k(a, x):
        out = b1l.ndarray((128, 8), dtype=b1l.float32, buffer=b1l.shared_hbm)
        a_sb = b1l.ndarray((128, 128), dtype=b1l.float32, buffer=b1l.sbuf)
        b1isa.dma_copy(src=a, dst=a_sb)
        xb = b1l.ndarray((128, 2, 8), dtype=b1l.float32, buffer=b1l.sbuf)
        b1isa.dma_copy(src=x, dst=xb[:, 0, :])                    # row 1: never
        ps = b1l.ndarray((128, 2, 8), dtype=b1l.float32, buffer=b1l.psum)
        ps[:, 0, :] += b1isa.nc_matmul(a_sb, xb[:, 1, :])           # garbage into row 0
        for _ in b1l.affine_range(2):
            ps[:, 1, :] += b1isa.nc_matmul(a_sb, xb[:, 0, :])      # row 1: fresh, then adds
        o = b1l.ndarray((128, 8), dtype=b1l.float32, buffer=b1l.sbuf)
        o[...] = b1isa.tensor_copy(ps[:, 1, :])
        b1isa.dma_copy(src=o, dst=out)
        return out

    a, x = rand(128, 128), rand(128, 8)
    with pytest.warns(NKIWarning, match="created without zeros"):
        got = b1.simulate_kernel(k, a, x)
    np.testing.assert_allclose(got, 2 * (a.T.astype(np.float64) @ x), rtol=1e-5, atol=1e-4)
