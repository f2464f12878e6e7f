"""nc_matmul keeps a compact fp32 copy of a stationary that has no unit stride, and a Tensor
Engine transpose its transposed copy, until the tile is written again (nkisim.engines._kept,
issue 12). A kept copy that outlived a write would multiply by (or move) old weights, silently:
these kernels cache a strided weight view, then change its elements through every kind of write
(a load into part of it, a DMA, an in-place op on the whole tile, an op into the view itself, an
overlapping view, a memset, an activation), and multiply (or transpose) again after each. The
outputs must be NumPy's products (or transposes) of the weights as they stand, and the same bits
with the copies turned off (``engines.KEEP_STATIONARIES``).
"""

import numpy as np
import pytest

from nkisim import engines, runtime
from nkisim import nki as nki_face
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl
from nkisim.beta1 import simulate_kernel

RNG = np.random.default_rng(7)
STEPS = 8


def _inputs(dtype=np.float32):
    w = RNG.random((128, 128, 2), dtype=np.float32).astype(dtype)
    v = RNG.random((128, 128), dtype=np.float32).astype(dtype)
    x = RNG.random((128, 64), dtype=np.float32).astype(dtype)
    return w, v, x


def _expected(w_in, v_in, x_in, op="matmul"):
    """The weights after each step, as the kernels change them, and their products (fp32), or
    (``op="transpose"``) their transposes."""
    f = np.float32
    w, v, x = w_in.astype(f), v_in.astype(f), x_in.astype(f)
    dt = w_in.dtype

    def rounded(a):             # a result written into the kernel's tile of dtype dt
        return a.astype(f).astype(dt).astype(f)

    def of(w):
        return w[:, :, 1].T @ x if op == "matmul" else w[:, :, 1].T.copy()
    outs = [of(w)]
    w[:, 0:64, 1] = v[:, 0:64]                                  # 1: a load into part of it
    outs.append(of(w))
    w[:, 64:128, 1] = v[:, 64:128]                              # 2: a DMA into the other part
    outs.append(of(w))
    w[...] = rounded(w * f(2))                                  # 3: in place, the whole tile
    outs.append(of(w))
    w[:, :, 1] = rounded(w[:, :, 1] + f(1))                     # 4: into the view itself
    outs.append(of(w))
    w[:, 5, :] = v[:, 0:2]                                      # 5: an overlapping view
    outs.append(of(w))
    w[:, 7, 1] = 3                                              # 6: a memset of one column
    outs.append(of(w))
    w[:, :, 1] = rounded(np.exp(v))                             # 7: an activation
    outs.append(of(w))
    return np.stack(outs)


def _load(lang, isa, *inputs):
    """Inside a kernel of either face (``lang``/``isa`` its language and ISA modules): each
    input in an SBUF tile of its own shape and dtype."""
    tiles = []
    for a in inputs:
        t = lang.ndarray(a.shape, dtype=a.dtype, buffer=lang.sbuf)
        isa.dma_copy(dst=t, src=a)
        tiles.append(t)
    return tiles


def _beta1_kernel(op="matmul"):
    cols = 64 if op == "matmul" else 128

    def matmul(w, x, out, i):
        # twice, with no write in between: the second finds the kept copy
        r = nl.ndarray((128, cols), dtype=nl.float32, buffer=nl.sbuf)
        for _ in nl.sequential_range(2):
            if op == "matmul":
                ps = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.psum)
                ps += nisa.nc_matmul(w[:, :, 1], x)
            else:
                ps = nisa.nc_transpose(w[:, :, 1], engine=nisa.tensor_engine)
            r[...] = nisa.tensor_copy(ps, dtype=nl.float32)
        nisa.dma_copy(src=r, dst=out[i])

    def kernel(w_in, v_in, x_in):
        out = nl.ndarray((STEPS, 128, cols), dtype=nl.float32, buffer=nl.shared_hbm)
        dt = w_in.dtype
        w, x, v = _load(nl, nisa, w_in, x_in, v_in)
        matmul(w, x, out, 0)
        w[:, 0:64, 1] = nl.load(v_in[:, 0:64])
        matmul(w, x, out, 1)
        nisa.dma_copy(src=v_in[:, 64:128], dst=w[:, 64:128, 1])
        matmul(w, x, out, 2)
        w[...] = nl.multiply(w, 2.0)
        matmul(w, x, out, 3)
        w[:, :, 1] = nisa.tensor_scalar(w[:, :, 1], np.add, 1.0)
        matmul(w, x, out, 4)
        w[:, 5, :] = nisa.tensor_copy(v[:, 0:2])
        matmul(w, x, out, 5)
        w[:, 7:8, 1] = nisa.memset((128, 1), 3.0, dt)
        matmul(w, x, out, 6)
        w[:, :, 1] = nisa.activation(op=nl.exp, data=v)
        matmul(w, x, out, 7)
        return out
    return kernel


def _current_kernel(op="matmul"):
    nlc, nisac = nki_face.language, nki_face.isa
    cols = 64 if op == "matmul" else 128

    def matmul(w, x, out, i):
        if op == "matmul":
            ps = nlc.ndarray((128, 64), dtype=nlc.float32, buffer=nlc.psum)
        else:
            ps = nlc.ndarray((128, 128), dtype=w.dtype, buffer=nlc.psum)
        for _ in nlc.sequential_range(2):
            if op == "matmul":
                nisac.nc_matmul(dst=ps, stationary=w[:, :, 1], moving=x, accumulate=False)
            else:
                nisac.nc_transpose(dst=ps, data=w[:, :, 1], engine=nisac.engine.tensor)
        r = nlc.ndarray((128, cols), dtype=nlc.float32, buffer=nlc.sbuf)
        nisac.tensor_copy(dst=r, src=ps)
        nisac.dma_copy(dst=out[i], src=r)

    @nki_face.jit
    def kernel(w_in, v_in, x_in):
        out = nlc.ndarray((STEPS, 128, cols), dtype=nlc.float32, buffer=nlc.shared_hbm)
        w, x, v = _load(nlc, nisac, w_in, x_in, v_in)
        matmul(w, x, out, 0)
        nisac.tensor_copy(dst=w[:, 0:64, 1], src=v[:, 0:64])
        matmul(w, x, out, 1)
        nisac.dma_copy(dst=w[:, 64:128, 1], src=v_in[:, 64:128])
        matmul(w, x, out, 2)
        nisac.tensor_scalar(dst=w, data=w, op0=nlc.multiply, operand0=2.0)
        matmul(w, x, out, 3)
        nisac.tensor_scalar(dst=w[:, :, 1], data=w[:, :, 1], op0=nlc.add, operand0=1.0)
        matmul(w, x, out, 4)
        nisac.tensor_copy(dst=w[:, 5, :], src=v[:, 0:2])
        matmul(w, x, out, 5)
        nisac.memset(dst=w[:, 7:8, 1], value=3.0)
        matmul(w, x, out, 6)
        nisac.activation(dst=w[:, :, 1], op=nlc.exp, data=v)
        matmul(w, x, out, 7)
        return out
    return kernel


def _run(face, args, keep, monkeypatch, op="matmul"):
    monkeypatch.setattr(engines, "KEEP_STATIONARIES", keep)
    if face == "beta1":
        out = simulate_kernel(_beta1_kernel(op), *args)
    else:
        out = _current_kernel(op)(*args)
    return np.asarray(out), runtime.last_run()


@pytest.mark.parametrize("checks", ["all", "none"])
@pytest.mark.parametrize("face", ["beta1", "nki"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", ["matmul", "transpose"])
def test_every_write_retires_the_kept_copy(op, face, dtype, checks, monkeypatch):
    """(with the checks off as well: the write count is kept by every write, not the checks)"""
    monkeypatch.setenv("NKISIM_CHECKS", checks)
    args = _inputs(dtype)
    out, run = _run(face, args, True, monkeypatch, op)
    # the path was taken: the strided view's copy was kept (once per change of the weights)
    assert run.kept.get("stationary" if op == "matmul" else "transpose")
    assert not run.stationaries and not run.mirrors     # (released when the run ended)
    want = _expected(*args, op=op)
    if op == "transpose":
        np.testing.assert_array_equal(out, want)        # data movement: exact
    else:
        np.testing.assert_allclose(out, want, rtol=2e-6 if dtype == np.float32 else 1e-5)
    off, run_off = _run(face, args, False, monkeypatch, op)
    assert not run_off.kept
    np.testing.assert_array_equal(out, off)


def test_a_stationary_with_a_unit_stride_is_not_copied(monkeypatch):
    """What BLAS takes as it is (a row of a wider tile: w[:, 1, :] of a (128, 2, 128) tile)
    goes straight to the GEMM; the copies are for views with no unit stride."""
    def kernel(w_in, x_in):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        w = nl.ndarray((128, 2, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=w_in, dst=w)
        x = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=x_in, dst=x)
        ps = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.psum)
        ps += nisa.nc_matmul(w[:, 1, :], x)
        r = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        r[...] = nisa.tensor_copy(ps)
        nisa.dma_copy(src=r, dst=out)
        return out
    w = RNG.random((128, 2, 128), dtype=np.float32)
    x = RNG.random((128, 64), dtype=np.float32)
    out = simulate_kernel(kernel, w, x)
    assert not runtime.last_run().kept
    np.testing.assert_allclose(out, w[:, 1, :].T @ x, rtol=2e-6)


@pytest.mark.parametrize("checks", ["all", "none"])
def test_a_write_through_a_view_of_another_dtype_retires_it(checks, monkeypatch):
    """`w.view(bf16)` (a view with its own element size, which the checks only follow
    coarsely) writes the same bytes: the fp32 weights kept before it must not survive it."""
    monkeypatch.setenv("NKISIM_CHECKS", checks)
    nlc, nisac = nki_face.language, nki_face.isa

    @nki_face.jit
    def kernel(w_in, x_in):
        out = nlc.ndarray((2, 128, 64), dtype=nlc.float32, buffer=nlc.shared_hbm)
        w, x = _load(nlc, nisac, w_in, x_in)
        ps = nlc.ndarray((128, 64), dtype=nlc.float32, buffer=nlc.psum)
        r = nlc.ndarray((128, 64), dtype=nlc.float32, buffer=nlc.sbuf)
        for i in nlc.sequential_range(2):
            nisac.nc_matmul(dst=ps, stationary=w[:, :, 1], moving=x, accumulate=False)
            nisac.tensor_copy(dst=r, src=ps)
            nisac.dma_copy(dst=out[i], src=r)
            # the high halves of w[:, :, 1] (bf16 elements 3 of each 4): 2.0 as bf16
            nisac.memset(dst=w.view(nlc.bfloat16)[:, :, 3:4], value=2.0)
        return out
    w = RNG.random((128, 128, 2), dtype=np.float32)
    x = RNG.random((128, 64), dtype=np.float32)
    out = np.asarray(kernel(w, x))
    assert runtime.last_run().kept.get("stationary")
    np.testing.assert_allclose(out[0], w[:, :, 1].T @ x, rtol=2e-6)
    w2 = w.copy()
    w2.view(np.uint16)[:, :, 3] = 0x4000           # bf16 2.0 in the high half (little endian)
    np.testing.assert_allclose(out[1], w2[:, :, 1].T @ x, rtol=2e-6)


def test_a_gathered_view_is_not_kept():
    """A view that ``read`` gathers into a fresh array (a reversed index: no basic view) has no
    place in the tile to key a copy by, and its address is free for the next gather of the
    same size: a copy kept under it was served to the fourth of these transposes before the
    guard (``np.may_share_memory`` with the view's storage in ``engines._kept``)."""
    def kernel(w_in):
        out = nl.ndarray((4, 128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        w, = _load(nl, nisa, w_in)
        ip, ia = nl.arange(128)[:, None], nl.arange(128)[None, :]
        for i in nl.sequential_range(4):
            ps = nisa.nc_transpose(w[ip, 255 - ia - i], engine=nisa.tensor_engine)
            r = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
            r[...] = nisa.tensor_copy(ps)
            nisa.dma_copy(src=r, dst=out[i])
        return out
    w = RNG.random((128, 256), dtype=np.float32)
    out = simulate_kernel(kernel, w)
    assert not runtime.last_run().kept
    for i in range(4):
        np.testing.assert_array_equal(out[i], w[:, 255 - i - np.arange(128)].T)


@pytest.mark.parametrize("checks", ["all", "none"])
@pytest.mark.parametrize("face", ["beta1", "nki"])
def test_an_fp16_tile_read_again_and_again_is_widened_once_per_write(face, checks, monkeypatch):
    """An fp16 tile read as matmul operands more than its size gets an fp32 mirror
    (``engines._f32``) that every write retires: shifted windows of ``x`` (two rows of 150
    columns, as a conv2d reads its input band) are multiplied in four rounds of 3 x 3
    matmuls, with a write into part of ``x`` (a DMA, an in-place op, a memset) before each
    later round. Each product must be NumPy's of ``x`` as it stands, and the same bits with
    the mirrors turned off."""
    monkeypatch.setenv("NKISIM_CHECKS", checks)
    f = np.float32
    w = RNG.random((128, 128), dtype=f).astype(np.float16)
    x = RNG.random((128, 4, 160), dtype=f).astype(np.float16)
    v = RNG.random((128, 160), dtype=f).astype(np.float16)
    xs = [x.astype(f)]
    x2 = xs[0].copy()
    x2[:, 1, :] = v.astype(f)                                   # a DMA into one row
    xs.append(x2.copy())
    x2 = (x2 * f(2)).astype(np.float16).astype(f)               # in place, the whole tile
    xs.append(x2.copy())
    x2[:, 2, 0:8] = 3                                           # a memset of part of one
    xs.append(x2)
    want = np.stack([np.einsum("km,krc->mrc", w.astype(f), xi[:, j:j + 2, 1:151])
                     for xi in xs for j in range(3)])

    def beta1(w_in, x_in, v_in):
        out = nl.ndarray((12, 128, 2, 150), dtype=nl.float32, buffer=nl.shared_hbm)
        wt, xt = _load(nl, nisa, w_in, x_in)
        r = nl.ndarray((128, 2, 150), dtype=nl.float32, buffer=nl.sbuf)
        for rnd in range(4):                    # (unrolled: a Python loop)
            if rnd == 1:
                nisa.dma_copy(src=v_in, dst=xt[:, 1, :])
            elif rnd == 2:
                xt[...] = nl.multiply(xt, 2.0)
            elif rnd == 3:
                xt[:, 2, 0:8] = nisa.memset((128, 8), 3.0, nl.float16)
            for j in nl.sequential_range(3):
                for _ in nl.sequential_range(3):
                    ps = nl.zeros((128, 2, 150), dtype=nl.float32, buffer=nl.psum)
                    ps += nisa.nc_matmul(wt, xt[:, j:j + 2, 1:151])
                    r[...] = nisa.tensor_copy(ps)
                nisa.dma_copy(src=r, dst=out[3 * rnd + j])
        return out

    nlc, nisac = nki_face.language, nki_face.isa

    @nki_face.jit
    def current(w_in, x_in, v_in):
        out = nlc.ndarray((12, 128, 2, 150), dtype=nlc.float32, buffer=nlc.shared_hbm)
        wt, xt = _load(nlc, nisac, w_in, x_in)
        ps = nlc.ndarray((128, 2, 150), dtype=nlc.float32, buffer=nlc.psum)
        r = nlc.ndarray((128, 2, 150), dtype=nlc.float32, buffer=nlc.sbuf)
        for rnd in range(4):
            if rnd == 1:
                nisac.dma_copy(dst=xt[:, 1, :], src=v_in)
            elif rnd == 2:
                nisac.tensor_scalar(dst=xt, data=xt, op0=nlc.multiply, operand0=2.0)
            elif rnd == 3:
                nisac.memset(dst=xt[:, 2, 0:8], value=3.0)
            for j in nlc.sequential_range(3):
                for _ in nlc.sequential_range(3):
                    nisac.nc_matmul(dst=ps, stationary=wt, moving=xt[:, j:j + 2, 1:151],
                                    accumulate=False)
                nisac.tensor_copy(dst=r, src=ps)
                nisac.dma_copy(dst=out[3 * rnd + j], src=r)
        return out

    def run(keep):
        monkeypatch.setattr(engines, "KEEP_STATIONARIES", keep)
        out = simulate_kernel(beta1, w, x, v) if face == "beta1" else current(w, x, v)
        return np.asarray(out), runtime.last_run()
    out, r = run(True)
    # the path was taken: x (and the weights, read 36 times whole) got mirrors
    assert r.kept.get("mirror", 0) >= 2
    np.testing.assert_allclose(out, want, rtol=1e-5)
    off, r_off = run(False)
    assert not r_off.kept
    np.testing.assert_array_equal(out, off)


def test_mirrors_of_many_small_tiles_stay_bounded(monkeypatch):
    """Forty small fp16 tiles, each read three times whole (so each gets a mirror): the
    table of mirrors never holds more than its limit of tiles (here 16), and the products
    stay NumPy's."""
    monkeypatch.setattr(engines, "_MIRRORS_MAX_TILES", 16)
    seen = []
    f32 = engines._f32

    def counting(run, t, a):
        v = f32(run, t, a)
        seen.append(len(run.mirrors))
        return v
    monkeypatch.setattr(engines, "_f32", counting)

    def kernel(w_in, x_in):
        out = nl.ndarray((40, 128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        w, = _load(nl, nisa, w_in)
        for i in range(40):
            x = nl.ndarray((128, 4), dtype=nl.float16, buffer=nl.sbuf)
            nisa.dma_copy(src=x_in[i], dst=x)
            r = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
            for _ in range(3):
                ps = nl.zeros((128, 4), dtype=nl.float32, buffer=nl.psum)
                ps += nisa.nc_matmul(w, x)
                r[...] = nisa.tensor_copy(ps)
            nisa.dma_copy(src=r, dst=out[i])
        return out
    w = RNG.random((128, 128), dtype=np.float32).astype(np.float16)
    x = RNG.random((40, 128, 4), dtype=np.float32).astype(np.float16)
    out = simulate_kernel(kernel, w, x)
    assert runtime.last_run().kept["mirror"] >= 40
    assert seen and max(seen) <= 16
    want = np.stack([w.astype(np.float32).T @ x[i].astype(np.float32) for i in range(40)])
    np.testing.assert_allclose(out, want, rtol=1e-5)
