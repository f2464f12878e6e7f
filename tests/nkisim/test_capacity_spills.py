"""SBUF/PSUM capacity: what the compiler spills (a tolerated rule) and what it cannot (errors).

Truth: AWS's programming model (aws-neuron-sdk 1db4d74e nki/programming_model.rst): "When the
cumulative size of live data defined by the NKI kernel overflows the capacity of any on-chip
memory, the Neuron compiler inserts the necessary spills or refills between that memory and the
next-tier memory in the hierarchy"; AWS's CI-compiled nki-library moe_cte kernels keep 12 PSUM
accumulators live (bwmm_shard_on_I.py, I=3072 at LNC 2). What cannot be spilled: the operands of
one instruction (GCA035, aws-neuron-sdk #1060, "Total Accessed Bytes per partition by
instruction: 198024 Total SB Partition Size: 196608"), one tensor larger than a partition, and
anything under ``enable_stack_allocator`` (nki-reference §2.2 ``err_stack_overflow_*``). Byte
counts are computed from shapes here; values against NumPy.
"""

import linecache
import warnings

import numpy as np
import pytest

import nkisim.shim
from nkisim import NKIWarning
from nkisim import beta1 as b1
from nkisim.beta1 import isa as b1isa
from nkisim.beta1 import language as b1nl
from nkisim.errors import NKIRuleWarning
from nkisim.runtime import simulate

nkisim.shim.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

RNG = np.random.default_rng(61)


def _run(kernel, *args, strict=False, target=None):
    """(output, NKI warnings) with every check on."""
    with warnings.catch_warnings(record=True) as ws, pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("always", NKIWarning)
        mp.setenv("NKISIM_STRICT", "1" if strict else "0")
        out = simulate(kernel, args, {}, checks_spec="all", target=target)
    return out, [w for w in ws if issubclass(w.category, NKIWarning)]


# ---------------------------------------------------------------------------------------------
# the current dialect: accumulators kept live until all are evacuated (my own kernel, the shape
# of the pattern AWS's moe_cte uses)


@nki.jit
def _blocks_then_evacuate(xT, w):
    """out[:, i-block] = x @ w[:, i-block] for n_i blocks of 128 columns, each block a PSUM
    accumulation over K tiles; every block is evacuated only after all are computed."""
    K, B = xT.shape
    _, N = w.shape
    n_k, n_i = K // 128, N // 128
    out = nl.ndarray((128, n_i, B), dtype=nl.float32, buffer=nl.shared_hbm)
    xs, ws = [], []
    for k in range(n_k):
        xt = nl.ndarray((128, B), dtype=xT.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=xT[k * 128:(k + 1) * 128, :])
        wt = nl.ndarray((128, N), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=wt, src=w[k * 128:(k + 1) * 128, :])
        xs.append(xt)
        ws.append(wt)
    acc = [nl.ndarray((128, B), dtype=nl.float32, buffer=nl.psum) for _ in range(n_i)]
    for i in range(n_i):
        for k in range(n_k):
            nisa.nc_matmul(dst=acc[i], stationary=ws[k][:, i * 128:(i + 1) * 128],
                           moving=xs[k], accumulate=k > 0)
    for i in range(n_i):
        res = nl.ndarray((128, B), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc[i])
        nisa.dma_copy(dst=out[:, i, :], src=res)
    return out


def _blocks_inputs(n_i):
    xT = RNG.standard_normal((256, 512), np.float32)
    w = RNG.standard_normal((256, n_i * 128), np.float32)
    want = (w.T.astype(np.float64) @ xT).reshape(n_i, 128, 512).transpose(1, 0, 2)
    return xT, w, want


def test_twelve_live_psum_accumulators_spill_and_compute_the_right_values():
    xT, w, want = _blocks_inputs(12)
    out, ws = _run(_blocks_then_evacuate, xT, w)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
    assert [w.category for w in ws] == [NKIRuleWarning]
    msg = str(ws[0].message)
    assert "PSUM overflow: live tensors need 12 PSUM banks at once, more than the 8 banks" in msg
    assert "[128, 512] float32: 12 tiles x 1 bank" in msg
    assert "inserts the necessary spills or refills" in msg
    # reported at the allocation site of the largest live tensors: the accumulators
    assert ws[0].filename == __file__
    assert "buffer=nl.psum" in linecache.getline(__file__, ws[0].lineno)
    with pytest.raises(ValueError) as info:
        _run(_blocks_then_evacuate, xT, w, strict=True)
    assert info.value.nki_code == "nkisim_strict_rule" and "12 PSUM banks" in str(info.value)


def test_eight_live_psum_accumulators_fit():
    xT, w, want = _blocks_inputs(8)
    out, ws = _run(_blocks_then_evacuate, xT, w, strict=True)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
    assert ws == []


@nki.jit
def _many_live_sbuf_tiles(x):
    """n tiles of 32 KiB per partition loaded, then all read: n * 32 KiB live at once."""
    n = x.shape[1] // 8192
    out = nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.shared_hbm)
    tiles = []
    for j in range(n):
        t = nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.sbuf)       # 32 KiB
        nisa.dma_copy(dst=t, src=x[:, j * 8192:(j + 1) * 8192])
        tiles.append(t)
    acc = nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=acc, src=tiles[0])
    for t in tiles[1:]:
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_live_sbuf_tiles_over_the_partition_spill_and_compute_the_right_values():
    # 8 tiles of 32 KiB live once loaded (the sum takes the place of the first, read once):
    # 8 x 32768 = 262144 > 229376 (trn2)
    x = RNG.standard_normal((128, 8 * 8192), np.float32)
    out, ws = _run(_many_live_sbuf_tiles, x)
    np.testing.assert_allclose(out, x.reshape(128, 8, 8192).sum(axis=1), rtol=1e-5, atol=1e-5)
    assert [w.category for w in ws] == [NKIRuleWarning]
    assert "SBUF overflow: live tensors need 262144 bytes per partition at once" in \
        str(ws[0].message)


# ---------------------------------------------------------------------------------------------
# what cannot be spilled


def test_one_instruction_whose_operands_exceed_a_partition_is_gca035():
    def body(a, b):
        out = b1nl.ndarray((128, 30000), dtype=b1nl.float32, buffer=b1nl.shared_hbm)
        x = b1nl.ndarray((128, 30000), dtype=b1nl.float32, buffer=b1nl.sbuf)     # 120000 B
        y = b1nl.ndarray((128, 30000), dtype=b1nl.float32, buffer=b1nl.sbuf)     # 120000 B
        b1isa.dma_copy(src=a, dst=x)
        b1isa.dma_copy(src=b, dst=y)
        z = b1isa.tensor_tensor(x, y, b1nl.add)      # reads 240000 B per partition at once
        b1isa.dma_copy(src=z, dst=out)
        return out

    a, b = RNG.random((128, 30000), np.float32), RNG.random((128, 30000), np.float32)
    with pytest.raises(RuntimeError) as info:
        _run(b1.jit(body), a, b)
    assert info.value.nki_code == "nkisim_instruction_sbuf_overflow"
    msg = str(info.value)
    assert msg.startswith("SBUF overflow: 'tensor_tensor' at test_capacity_spills.py:")
    assert "needs its SBUF operands at once, 240000 bytes per partition, more than the 229376 " \
           "bytes of an SBUF partition of trn2" in msg
    assert "`x` [128, 30000] float32: 120000 B" in msg and "`y` [128, 30000]" in msg


def test_an_instruction_may_write_its_output_over_its_input():
    """x (200000 B) read for the last time by the instruction that writes y (200000 B): in-place
    ops are legal, so the allocator can put y where x was; neither a GCA035 nor a spill."""
    def body(a):
        out = b1nl.ndarray((128, 50000), dtype=b1nl.float32, buffer=b1nl.shared_hbm)
        x = b1nl.ndarray((128, 50000), dtype=b1nl.float32, buffer=b1nl.sbuf)
        b1isa.dma_copy(src=a, dst=x)
        y = b1isa.tensor_scalar(x, b1nl.multiply, 2.0)
        b1isa.dma_copy(src=y, dst=out)
        return out

    a = RNG.random((128, 50000), np.float32)
    out, ws = _run(b1.jit(body), a, strict=True)
    assert np.array_equal(out, 2 * a) and ws == []


def test_the_stack_allocator_does_not_spill():
    def body():
        tiles = []
        for _ in b1nl.static_range(9):
            tiles.append(b1nl.zeros((128, 512), dtype=b1nl.float32, buffer=b1nl.psum))
        for t in tiles:
            b1isa.tensor_copy(t)

    spilling = b1.jit(body)
    _, ws = _run(spilling)
    assert [w.category for w in ws] == [NKIRuleWarning]
    stack = b1.compiler.enable_stack_allocator(
        b1.compiler.skip_middle_end_transformations(b1.jit(body)))
    with pytest.raises(RuntimeError) as info:
        _run(stack)
    assert info.value.nki_code == "nkisim_stack_overflow_psum"
    assert str(info.value).startswith("required psum banks 9 exceeds available psum banks 8")
