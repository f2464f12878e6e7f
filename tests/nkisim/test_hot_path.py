"""The interpreter's fast paths (issue 12) compute what the plain paths compute.

- same-dtype writes copy bit for bit through an integer ufunc (``tensor._copy``);
- an op's freshly computed result becomes its tile's storage (no copy), so later writes to that
  tile must not reach the op's inputs;
- ``psum += nisa.nc_matmul(...)`` adds in place, equal to NumPy's fp32 sum in the same order.
"""

import ml_dtypes
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl
from nkisim.tensor import _copy

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int8, np.uint32, np.bool_],
                         ids=str)
def test_copy_is_bit_exact(dtype):
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 256, size=(128, 512 * np.dtype(dtype).itemsize), dtype=np.uint8)
    src = bits.view(dtype) if dtype is not np.bool_ else bits.astype(bool)
    if np.dtype(dtype).kind == "f" or dtype is BF16:
        src.reshape(-1)[:3] = np.array([np.nan, -0.0, np.inf]).astype(dtype)
    # 4 KiB-aliased destination (the case the integer-ufunc copy exists for) and a strided one
    dst = np.empty_like(src)
    _copy(dst, src)
    assert dst.tobytes() == src.tobytes()
    wide = np.zeros((128, 2 * src.shape[1]), src.dtype)
    _copy(wide[:, ::2], src)
    assert wide[:, ::2].tobytes() == src.tobytes()
    _copy(dst, src[:1])                               # broadcast along partitions
    assert dst.tobytes() == np.broadcast_to(src[:1], src.shape).tobytes()


def test_adopted_result_tiles_do_not_alias_their_inputs():
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)

    @nki.jit
    def kernel(a_in):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a_in)
        s = nisa.tensor_tensor(x, x, op=nl.add)       # adopted storage
        s[...] = nisa.tensor_scalar(s, nl.multiply, 3.0)
        t = nisa.tensor_tensor(x, s, op=nl.add)       # x must still hold a
        nl.store(out, t)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), a + 6 * a)


def test_matmul_accumulates_in_place_like_numpy():
    rng = np.random.default_rng(1)
    a = rng.random((4, 128, 128), dtype=np.float32)
    b = rng.random((4, 128, 512), dtype=np.float32)

    @nki.jit
    def kernel(a_in, b_in):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(4):
            acc += nisa.nc_matmul(nl.load(a_in[k]), nl.load(b_in[k]))
        nl.store(out, nisa.tensor_copy(acc))
        return out

    want = np.zeros((128, 512), np.float32)
    with threadpool_limits(1, user_api="blas"):       # as nkisim simulates (same GEMM blocking)
        for k in range(4):
            want += a[k].T @ b[k]
    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a, b), want)


def test_a_one_column_tile_covers_all_its_partitions():
    # A (128, 1) fp32 tile's last stride equals its row size; a size-1 dimension must not be read
    # as a partition step (it once recorded such tiles as partition 0 only, dropping scheduler
    # dependencies between the writer and readers of partitions 1..127).
    from nkisim.runtime import last_run

    a = np.arange(128, dtype=np.float32).reshape(128, 1)

    @nki.jit
    def kernel(a_in):
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a_in)
        y = nisa.tensor_scalar(x[0:128, 0:1], nl.multiply, 2.0)     # views: regions computed
        nl.store(out[0:128, 0:1], y[0:128, 0:1])
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, a), 2 * a)
    regions = [r for i in last_run().trace.instrs for r in i.reads + i.writes if r.buffer == "sbuf"]
    assert regions and all((r.p0, r.p1) == (0, 128) for r in regions), regions


def test_a_tile_read_before_any_write_is_still_poisoned():
    # nl.ndarray tiles are poisoned lazily (issue 12): never-written elements reaching an output
    # must still be reported (a warning for a kernel-created output, issue 8) and read back as NaN.
    a = np.ones((128, 8), dtype=np.float32)

    @nki.jit
    def kernel(a_in):
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        t[:, 0:4] = nl.load(a_in[:, 0:4])
        nl.store(out, t)
        return out

    with pytest.warns(Warning, match="never written"):
        out = nki.simulate_kernel(kernel, a)
    np.testing.assert_array_equal(out[:, :4], 1.0)
    assert np.isnan(out[:, 4:]).all()
