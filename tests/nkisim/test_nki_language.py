"""``nki.language`` of NKI 0.3-0.7 and the tensor views of the current dialect.

Truth: shared/spec/nki-current.md §2.0 item 3 (on-chip/HBM integer indexing, reshape, view, ap),
§2.2 (ndarray, buffers, ranges, tile_size), §2.3 (the experimental wrappers: no broadcasting,
nl.copy's buffer by release, store rejects PSUM, matmul/transpose into PSUM), §3 (NaN / 4 fill,
device_print to stdout); NumPy for every value.
"""

import dataclasses

import numpy as np
import pytest

from nkisim import engines, nki, ops
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl
from nkisim.nki import typing as nt

RNG = np.random.default_rng(7)


def rand(shape, dtype=np.float32):
    return RNG.uniform(-2, 2, size=shape).astype(dtype)


def run(body, *arrays, **kw):
    """Simulate ``body`` as an nki kernel."""
    return nki.simulate(nki.jit(body))(*arrays, **kw)


# ---------------------------------------------------------------------------------------------
# op tokens are the core's objects


# (not nl.rsqrt: the face's own wrapper, for 0.5.0's "no longer accepts PSUM inputs"; as an op
# code nki.isa takes it as the core's rsqrt, tests/nkisim/test_nki_face_gaps.py)
@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "maximum", "minimum", "exp",
                                  "copy", "max", "sum", "logical_and", "equal"])
def test_op_tokens_are_the_core_functions(name):
    assert getattr(nl, name) is getattr(ops, name)


def test_isa_accepts_the_tokens():
    assert engines._alu_name(nl.add, "t") == "add"
    assert engines._alu_name(nl.maximum, "t") == "maximum"
    assert nl.copy in engines._ACT and nl.exp in engines._ACT


# ---------------------------------------------------------------------------------------------
# nl.ndarray


@pytest.mark.parametrize("dtype,fill", [(np.float32, "nan"), (nl.bfloat16, "nan"),
                                        (np.int32, 4), (np.uint8, 4)])
def test_new_memory_holds_nan_or_4(monkeypatch, dtype, fill):
    # SIM: "new tensors are filled with NaN (floats) or 4 (ints)"; read back with the
    # uninitialised-read check off (it reports such a read otherwise, see below)
    monkeypatch.setenv("NKISIM_CHECKS", "none")

    def k(a):
        t = nl.ndarray((128, 4), dtype=dtype, buffer=nl.sbuf)
        out = nl.ndarray((128, 4), dtype=dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out
    out = run(k, rand((1, 1)))
    if fill == "nan":
        assert np.isnan(out.astype(np.float32)).all()
    else:
        assert (out == fill).all()


def test_reading_never_written_memory_is_reported():
    def k(a):
        t = nl.ndarray((128, 4), dtype=np.float32, buffer=nl.sbuf)
        out = nl.ndarray((128, 4), dtype=np.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out
    with pytest.raises(Exception, match="never written|uninitiali"):
        run(k, rand((1, 1)))


def test_default_buffer_is_sbuf_and_buffers_compare():
    seen = {}

    def k(a):
        t = nl.ndarray((128, 4), dtype=np.float32)
        p = nl.ndarray((128, 4), dtype=np.float32, buffer=nl.psum)
        o = nl.ndarray((128, 4), dtype=np.float32, buffer=nl.shared_hbm)
        h = nl.ndarray((128, 4), dtype=np.float32, buffer=nl.hbm)
        seen.update(t=t.buffer, p=p.buffer, o=o.buffer, h=h.buffer, a=a.buffer)
        nisa.dma_copy(dst=o, src=a)
        return o
    run(k, rand((128, 4)))
    assert seen["t"] == nl.sbuf and seen["t"] != nl.psum and nl.is_sbuf(seen["t"])
    assert seen["p"] == nl.psum and nl.is_psum(seen["p"]) and nl.is_on_chip(seen["p"])
    assert seen["o"] == nl.shared_hbm and seen["o"] != nl.hbm and nl.is_hbm(seen["o"])
    assert seen["h"] == nl.hbm == nl.private_hbm and seen["h"] != nl.shared_hbm
    # nki-library's is_hbm_buffer: `tensor.buffer in (nl.hbm, nl.shared_hbm, nl.private_hbm)`
    assert seen["a"] in (nl.hbm, nl.shared_hbm, nl.private_hbm)
    assert nl.hbm is nl.private_hbm


@pytest.mark.parametrize("buf", ["sbuf", "psum", "shared_hbm"])
def test_string_buffers_are_rejected(buf):
    def k(a):
        return nl.ndarray((128, 4), dtype=np.float32, buffer=buf)
    with pytest.raises(ValueError, match="string buffers are rejected"):
        run(k, rand((1, 1)))


def test_address_places_tensors_that_alias():
    def k(a):
        x = nl.ndarray((128, 8), dtype=np.float32, buffer=nl.sbuf, address=(0, 1024))
        y = nl.ndarray((128, 8), dtype=np.float32, buffer=nl.sbuf, address=(0, 1024))
        nisa.dma_copy(dst=x, src=a)
        out = nl.ndarray((128, 8), dtype=np.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=y)          # y is x: same address
        return out
    a = rand((128, 8))
    np.testing.assert_array_equal(run(k, a), a)


def test_psum_address_must_be_bank_aligned():
    def k(a):
        return nl.ndarray((128, 8), dtype=np.float32, buffer=nl.psum, address=(0, 100))
    with pytest.raises(ValueError, match="2 KiB bank boundary"):
        run(k, rand((1, 1)))


def test_new_dtypes_exist():
    assert nl.float8_e4m3fn.name == "float8_e4m3fn"
    assert nl.float8_e8m0fnu.name == "float8_e8m0fnu"
    assert nl.bfloat16 == "bfloat16" and nl.float32 == np.float32


# ---------------------------------------------------------------------------------------------
# indexing rules of the current dialect (§2.0 item 3)


def test_onchip_integer_indexing_keeps_two_dims():
    shapes = {}

    def k(a):
        t = nl.ndarray((128, 4, 8), dtype=np.float32, buffer=nl.sbuf)
        u = nl.ndarray((128, 64), dtype=np.float32, buffer=nl.sbuf)
        shapes["t[3]"] = t[3].shape              # integer on dim 0 keeps it at size 1
        shapes["t[:, 2, :]"] = t[:, 2, :].shape  # integer on a free dim drops it
        shapes["t[:, 2, 5]"] = t[:, 2, 5].shape  # ... unless the view would fall below 2-D
        shapes["u[:, 5]"] = u[:, 5].shape
        shapes["u[3, :]"] = u[3, :].shape
        shapes["u[3, 5]"] = u[3, 5].shape
        shapes["a[2]"] = a[2].shape              # HBM: the integer drops the dim
        shapes["a[2, 1]"] = a[2, 1].shape
        out = nl.ndarray((1, 1), dtype=np.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a[0:1, 0, 0:1])
        return out
    run(k, rand((4, 3, 2)))
    assert shapes == {"t[3]": (1, 4, 8), "t[:, 2, :]": (128, 8), "t[:, 2, 5]": (128, 1),
                      "u[:, 5]": (128, 1), "u[3, :]": (1, 64), "u[3, 5]": (1, 1),
                      "a[2]": (3, 2), "a[2, 1]": (2,)}


def test_integer_indexed_row_reads_the_right_partition():
    def k(a):
        t = nl.ndarray((128, 16), dtype=np.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        out = nl.ndarray((1, 16), dtype=np.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t[5])
        return out
    a = rand((128, 16))
    np.testing.assert_array_equal(run(k, a), a[5:6])


def test_chained_indexing_and_hbm_reshape():
    def k(a):
        out = nl.ndarray((4, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        v = a.reshape((16, 8, 4))[3][2:6]        # a view of a view (0.5 chained indexing)
        t = nl.ndarray((4, 4), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=v)
        nisa.dma_copy(dst=out, src=t)
        return out
    a = rand((64, 8))
    np.testing.assert_array_equal(run(k, a), a.reshape(16, 8, 4)[3][2:6])


def test_reshape_checks_the_element_count():
    def k(a):
        return a.reshape((3, 7))
    with pytest.raises(ValueError, match="cannot reshape"):
        run(k, rand((4, 4)))


def test_view_reinterprets_bits():
    def k(a):
        out = nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), dtype=np.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=out, src=t.view(nl.int32))
        return out
    a = rand((128, 8))
    np.testing.assert_array_equal(run(k, a), a.view(np.int32))


def test_view_to_a_smaller_dtype_widens_the_last_dim():
    def k(a):
        out = nl.ndarray((128, 16), dtype=nl.uint16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a.view(nl.uint16))
        return out
    a = rand((128, 8))
    np.testing.assert_array_equal(run(k, a), a.view(np.uint16))


# ---------------------------------------------------------------------------------------------
# .ap(): the raw access pattern over the storage


def _ap_kernel(pattern, offset, shape, onchip=True, **kw):
    def k(a):
        out = nl.ndarray(shape, dtype=a.dtype, buffer=nl.shared_hbm)
        if onchip:
            t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            src = t[10:20, 1:2].ap(pattern, offset=offset, **kw)   # .ap ignores the view
        else:
            src = a[3:4].ap(pattern, offset=offset, **kw)
        s = nl.ndarray(shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=src) if onchip else nisa.dma_copy(dst=s, src=src)
        nisa.dma_copy(dst=out, src=s)
        return out
    return k


def test_ap_on_sbuf_addresses_storage():
    a = np.arange(128 * 16, dtype=np.float32).reshape(128, 16)
    # partitions 2.. (offset 2*16 + 1), every other column from column 1
    out = run(_ap_kernel([[16, 64], [2, 7]], 2 * 16 + 1, (64, 7)), a)
    np.testing.assert_array_equal(out, a[2:66, 1:15:2])


def test_ap_stride_zero_broadcasts():
    a = rand((128, 4))
    out = run(_ap_kernel([[4, 128], [0, 8]], 2, (128, 8)), a)
    np.testing.assert_array_equal(out, np.repeat(a[:, 2:3], 8, axis=1))


def test_ap_multidim_window_like_the_pool_example():
    # spec §5.3 [v]: conv.ap([[R*OW, P], [s*OW, R//s], [s, OW//s], [OW, s], [1, s]])
    P, R, OW, s = 128, 4, 6, 2
    a = rand((P, R * OW))
    out = run(_ap_kernel([[R * OW, P], [s * OW, R // s], [s, OW // s], [OW, s], [1, s]], 0,
                         (P, R // s, OW // s, s, s)), a)
    expect = a.reshape(P, R // s, s, OW // s, s).transpose(0, 1, 3, 2, 4)
    np.testing.assert_array_equal(out, expect)


def test_ap_on_hbm_is_linear():
    a = np.arange(6 * 10, dtype=np.float32).reshape(6, 10)
    out = run(_ap_kernel([[10, 3], [3, 3]], 21, (3, 3), onchip=False), a)
    np.testing.assert_array_equal(out, a.reshape(-1)[21:][np.arange(3)[:, None] * 10 +
                                                          np.arange(3) * 3])


def test_ap_partition_stride_must_be_the_free_size():
    with pytest.raises(ValueError, match="partition stride must equal"):
        run(_ap_kernel([[8, 128], [1, 8]], 0, (128, 8)), rand((128, 16)))


def test_ap_out_of_bounds_is_an_error():
    with pytest.raises(ValueError, match="reaches outside"):
        run(_ap_kernel([[16, 128], [1, 16]], 1, (128, 16)), rand((128, 16)))
    with pytest.raises(ValueError, match="reaches byte"):
        run(_ap_kernel([[10, 6], [1, 10]], 1, (6, 10), onchip=False), rand((6, 10)))


def _strided_columns(n_views, guard):
    """Column j of w (128, 3) as a (128, 1) stationary, for j < n_views, each in a matmul only
    when ``guard(j)``: AWS's output_projection_tkg makes the view of an index one past the end
    and skips its matmul (``if h_2_idx < cfg.h_2_size``)."""
    def k(w, x):
        w_sb = nl.ndarray(w.shape, dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=w_sb, src=w)
        x_sb = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_sb, src=x)
        out = nl.ndarray((3, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        for j in range(n_views):
            st = w_sb.ap(pattern=[[3, 128], [3, 1]], offset=j)
            if guard(j):
                ps = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=ps, stationary=st, moving=x_sb)
                row = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_copy(dst=row, src=ps)
                nisa.dma_copy(dst=out[j:j + 1, :], src=row)
        return out
    return k


def test_ap_out_of_bounds_view_is_an_error_only_when_an_instruction_uses_it():
    w, x = rand((128, 3)), rand((128, 4))
    got = run(_strided_columns(4, lambda j: j < 3), w, x)       # view 3 is made, never used
    np.testing.assert_allclose(got, w.T @ x, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="reaches outside `w_sb`"):
        run(_strided_columns(4, lambda j: True), w, x)


def test_ap_writes_land_in_the_storage():
    def k(a):
        out = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        src = nl.ndarray((128, 4), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=a)
        nisa.tensor_copy(dst=t.ap([[8, 128], [2, 4]], offset=1), src=src)   # odd columns
        nisa.dma_copy(dst=out, src=t)
        return out
    a = rand((128, 4))
    expect = np.zeros((128, 8), np.float32)
    expect[:, 1::2] = a
    np.testing.assert_array_equal(run(k, a), expect)


def test_ap_scalar_offset_selects_a_row_at_run_time():
    def k(a, idx):
        i_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i_sb, src=idx)
        out = nl.ndarray((1, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        row = nl.ndarray((1, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=a.ap([[8, 1], [1, 8]], offset=0, scalar_offset=i_sb,
                                        indirect_dim=0))
        nisa.dma_copy(dst=out, src=row)
        return out
    a = rand((16, 8))
    np.testing.assert_array_equal(run(k, a, np.array([[11]], np.int32)), a[11:12])


def test_ap_vector_offset_gathers_rows():
    def k(a, idx):
        i_sb = nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i_sb, src=idx)
        out = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        rows = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=a.ap([[8, 4], [1, 8]], offset=0, vector_offset=i_sb,
                                         indirect_dim=0))
        nisa.dma_copy(dst=out, src=rows)
        return out
    a = rand((16, 8))
    idx = np.array([[9], [0], [15], [9]], np.int32)
    np.testing.assert_array_equal(run(k, a, idx), a[idx[:, 0]])


def test_ap_vector_offset_out_of_bounds():
    def k(a, idx):
        i_sb = nl.ndarray((2, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i_sb, src=idx)
        rows = nl.ndarray((2, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=a.ap([[8, 2], [1, 8]], vector_offset=i_sb))
        return a
    with pytest.raises(IndexError, match="Out-of-bound access for tensor `a`"):
        run(k, rand((16, 8)), np.array([[1], [16]], np.int32))


def _scatter_rows(idx, oob):
    """Scatter row b of a (B, 8) tile to row idx[b] of a (16, 8) cache, as nki-library's
    attention_block_tkg updates its block KV cache (uint32 max marks a batch not to write)."""
    def k(cache, idx, vals):
        i_sb = nl.ndarray(idx.shape, dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=i_sb, src=idx)
        v_sb = nl.ndarray(vals.shape, dtype=vals.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v_sb, src=vals)
        B = idx.shape[0]
        nisa.dma_copy(dst=cache.ap([[1, B], [8, 1], [1, 8]], offset=0, vector_offset=i_sb,
                                   indirect_dim=0),
                      src=v_sb.ap([[8, B], [8, 1], [1, 8]]), oob_mode=oob)
        return cache
    cache = rand((16, 8))
    vals = rand((idx.shape[0], 8))
    return cache, vals, nki.simulate(nki.jit(k))(cache.copy(), idx, vals)


def test_ap_vector_offset_scatter_skips_out_of_bound_rows_with_oob_skip():
    # uint32 max (a -1 stored as uint32) is the "skip this batch" slot of AWS's kernel
    idx = np.array([[3], [0xFFFFFFFF], [12], [16]], np.uint32)
    cache, vals, got = _scatter_rows(idx, nisa.oob_mode.skip)
    want = cache.copy()
    want[3], want[12] = vals[0], vals[2]
    np.testing.assert_array_equal(got, want)


def test_ap_vector_offset_scatter_out_of_bounds_is_an_error_by_default():
    idx = np.array([[3], [0xFFFFFFFF]], np.uint32)
    with pytest.raises(IndexError, match=r"Out-of-bound access for tensor `cache` on dimension "
                                         r"0: index range \[4294967295, 4294967295\]"):
        _scatter_rows(idx, nisa.oob_mode.error)


def test_ap_vector_offset_gather_skips_negative_rows_with_oob_skip():
    # moe_cte gathers the tokens of a block with -1 for its padding slots (oob_mode.skip):
    # the skipped rows of the destination keep what they held (the kernel memsets them)
    def k(a, idx):
        i_sb = nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i_sb, src=idx)
        rows = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.memset(dst=rows, value=0)
        nisa.dma_copy(dst=rows, src=a.ap([[8, 4], [1, 8]], offset=0, vector_offset=i_sb,
                                         indirect_dim=0), oob_mode=nisa.oob_mode.skip)
        out = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=rows)
        return out
    a = rand((16, 8))
    idx = np.array([[5], [-1], [15], [-1]], np.int32)
    want = np.zeros((4, 8), np.float32)
    want[0], want[2] = a[5], a[15]
    np.testing.assert_array_equal(run(k, a, idx), want)


# ---------------------------------------------------------------------------------------------
# 0.5 view primitives


def test_view_primitives_match_numpy():
    got = {}

    def k(a):
        t = nl.ndarray((128, 4, 6), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        views = {"permute": t.permute((0, 2, 1)), "slice": t.slice(2, 1, 5, 2),
                 "select": t.select(1, 3), "reshape_dim": t.reshape_dim(2, (2, 3)),
                 "flatten_dims": t.flatten_dims(1, 2),
                 "broadcast": t.slice(1, 0, 1).broadcast(1, 5),
                 "expand_squeeze": t.expand_dim(1).squeeze_dim(1)}
        for name, v in views.items():
            out = nl.ndarray(v.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            s = nl.ndarray(v.shape, dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=s, src=v)
            nisa.dma_copy(dst=out, src=s)
            got[name] = out
        return tuple(got.values())
    a = rand((128, 4, 6))
    outs = dict(zip(["permute", "slice", "select", "reshape_dim", "flatten_dims", "broadcast",
                     "expand_squeeze"], run(k, a)))
    np.testing.assert_array_equal(outs["permute"], a.transpose(0, 2, 1))
    np.testing.assert_array_equal(outs["slice"], a[:, :, 1:5:2])
    np.testing.assert_array_equal(outs["select"], a[:, 3, :])
    np.testing.assert_array_equal(outs["reshape_dim"], a.reshape(128, 4, 2, 3))
    np.testing.assert_array_equal(outs["flatten_dims"], a.reshape(128, 24))
    np.testing.assert_array_equal(outs["broadcast"], np.repeat(a[:, 0:1], 5, axis=1))
    np.testing.assert_array_equal(outs["expand_squeeze"], a)


@pytest.mark.parametrize("method, args", [
    ("permute", ((0, 1),)), ("slice", (1, 0, 1)), ("select", (1, 0)), ("broadcast", (1, 4)),
    ("expand_dim", (1,)), ("squeeze_dim", (1,)), ("reshape_dim", (1, (1, 1))),
    ("flatten_dims", (1, 1)), ("is_contiguous", ()), ("is_indirect", ())])
def test_view_primitives_are_new_in_0_5(method, args, monkeypatch):
    """nki-current §1: "NkiTensor view primitives (slice/select/permute/broadcast/...)" are new
    in 0.5.0; reference §1: Beta 1's nki.tensor has none of them."""
    from nkisim import beta1 as b1nki
    from nkisim.beta1 import language as b1nl

    def k(a):
        t = nl.ndarray((128, 1), dtype=a.dtype, buffer=nl.sbuf)
        getattr(t, method)(*args)
        return a
    run(k, rand((1, 1)))                                     # the default version
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.4")
    with pytest.raises(AttributeError, match=rf"no attribute '{method}' \(added in NKI "
                                             r"0\.5\.0; NKISIM_NKI_VERSION=0\.4\)"):
        run(k, rand((1, 1)))

    @b1nki.jit
    def beta1(a):
        t = b1nl.ndarray((128, 1), dtype=a.dtype, buffer=b1nl.sbuf)
        getattr(t, method)(*args)
        return a
    with pytest.raises(AttributeError, match=rf"no attribute '{method}' \(a view primitive"):
        b1nki.simulate_kernel(beta1, rand((1, 1)))


def test_partition_dim_stays_first():
    def k(a):
        t = nl.ndarray((128, 4), dtype=a.dtype, buffer=nl.sbuf)
        return t.permute((1, 0))
    with pytest.raises(ValueError, match="partition dimension"):
        run(k, rand((1, 1)))


# ---------------------------------------------------------------------------------------------
# iteration


def test_ranges_are_python_ranges():
    seen = []

    def k(a):
        for r in (nl.affine_range(5), nl.sequential_range(2, 9, 3), nl.static_range(1, 4)):
            seen.append(list(r))
        return a
    run(k, rand((1, 1)))
    assert seen == [list(range(5)), list(range(2, 9, 3)), list(range(1, 4))]


def test_range_rejects_beta1_keywords():
    def k(a):
        for _ in nl.affine_range(4, precise_schedule=True):
            pass
        return a
    with pytest.raises(TypeError, match="unexpected keyword argument 'precise_schedule'"):
        run(k, rand((1, 1)))


@pytest.mark.parametrize("make, text", [
    (lambda a: [None for _ in nl.affine_range(a.shape[1] / 200)],
     "nl.affine_range's stop must be an integer, got 2.56"),
    (lambda a: [None for _ in nl.sequential_range(2.5)],
     "nl.sequential_range's stop must be an integer, got 2.5"),
    (lambda a: [None for _ in nl.range(2.5)], "nl.range's stop must be an integer, got 2.5"),
    (lambda a: nl.ndarray((128, 804 / 8), dtype=a.dtype, buffer=nl.sbuf),
     "dimension 1 of nl.ndarray's shape (128, 100.5) must be an integer, got 100.5"),
    (lambda a: nl.fori_loop(0, 640 / 256, lambda i: None),
     "nl.fori_loop's bound must be an integer, got 2.5")])
def test_a_fractional_bound_or_size_is_a_type_error(make, text):
    def k(a):
        make(a)
        return a
    with pytest.raises(TypeError) as info:
        run(k, rand((128, 512)))
    assert str(info.value) == f"{text} (`/` divides to a float; `//` for an integer)."


def test_fori_loop_step_zero_says_there_is_no_init_val():
    def k(a):
        nl.fori_loop(0, 2, lambda i: None, 0)        # jax's fori_loop(lower, upper, body, init)
        return a
    with pytest.raises(ValueError, match=r"nl.fori_loop: the step \(4th argument; "
                                         r"nl.fori_loop\(lower, upper, body_fun, step=1\) has "
                                         r"no init_val\) must not be zero"):
        run(k, rand((1, 1)))

    def k2(a):
        for _ in nl.affine_range(0, 2, 0):
            pass
        return a
    with pytest.raises(ValueError, match="nl.affine_range: the step must not be zero"):
        run(k2, rand((1, 1)))


def test_fori_loop_calls_the_body_in_order(monkeypatch):
    seen = []

    def k(a):
        nl.fori_loop(2, 11, lambda i: seen.append(i), step=3)
        return a
    run(k, rand((1, 1)))
    assert seen == [2, 5, 8]
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.5")          # new in 0.6.0
    with pytest.raises(AttributeError, match=r"fori_loop' \(added in NKI 0\.6\.0; "
                                             r"NKISIM_NKI_VERSION=0\.5\)"):
        run(k, rand((1, 1)))


def test_while_loop_runs_until_the_body_returns_zero():
    seen = []

    def k(a):
        def body(n):
            seen.append(n)
            return n - 1
        nl.while_loop(3, body)
        return a
    run(k, rand((1, 1)))
    assert seen == [3, 2, 1]


def test_dynamic_range_by_release(monkeypatch):
    seen = []

    def k(a):
        seen.extend(nl.dynamic_range(1, 4))
        return a
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.5")
    run(k, rand((1, 1)))
    assert seen == [1, 2, 3]
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.6")           # deprecated
    with pytest.warns(DeprecationWarning, match="fori_loop"):
        run(k, rand((1, 1)))
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.7")           # removed
    with pytest.raises(AttributeError, match="removed in NKI 0.7.0"):
        run(k, rand((1, 1)))


def test_ds_is_a_slice():
    def k(a):
        out = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[nl.ds(3, 4), :])
        nisa.dma_copy(dst=out, src=t)
        return out
    a = rand((16, 8))
    np.testing.assert_array_equal(run(k, a), a[3:7])


def test_tile_size(monkeypatch):
    ts = nl.tile_size
    assert (ts.pmax, ts.psum_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax) == \
        (128, 512, 128, 512)
    assert (ts.psum_bank_fmax, ts.psum_bank_fmax_bytes) == (512, 2048)
    assert ts.psum_num_banks == 8
    monkeypatch.setenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "true")
    assert ts.psum_num_banks == 7
    assert ts.sbuf_fmax_bytes == ts.total_available_sbuf_size


# ---------------------------------------------------------------------------------------------
# wrappers (0.3+, experimental)


def test_binary_wrappers_do_not_broadcast():
    def k(a, b):
        out = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(b)))
        return out
    with pytest.raises(ValueError, match="do not broadcast"):
        run(k, rand((128, 8)), rand((128, 1)))
    a, b = rand((128, 8)), rand((128, 8))
    np.testing.assert_array_equal(run(k, a, b), a + b)


def test_scalar_operand_is_fine():
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(a), 2.0))
        return out
    a = rand((128, 8))
    np.testing.assert_array_equal(run(k, a), a * 2)


def test_reductions_over_the_last_axes():
    def k(a):
        o1 = nl.ndarray((128, 1), dtype=a.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray((128, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(o1, nl.max(t, axis=(1, 2)))
        nl.store(o2, nl.sum(t, axis=2))
        return o1, o2
    a = rand((128, 4, 6))
    o1, o2 = run(k, a)
    np.testing.assert_array_equal(o1[:, 0], a.max(axis=(1, 2)))
    np.testing.assert_allclose(o2, a.sum(axis=2), rtol=1e-6)


@pytest.mark.parametrize("version,buffer", [("0.5", "psum"), ("0.6", "sbuf")])
def test_copy_result_buffer_by_release(monkeypatch, version, buffer):
    seen = []

    def k(a):
        p = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=nl.load(a))
        c = nl.copy(p)
        seen.append(c.buffer)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        s = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=c)
        nl.store(out, s)
        return out
    monkeypatch.setenv("NKISIM_NKI_VERSION", version)
    a = rand((128, 8))
    np.testing.assert_array_equal(run(k, a), a)
    assert seen[0] == buffer


def test_store_rejects_psum():
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=nl.load(a))
        nl.store(out, p)
        return out
    with pytest.raises(Exception, match="psum|PSUM"):
        run(k, rand((128, 8)))


def test_matmul_transpose_x_and_transpose_into_psum():
    seen = []

    def k(x, y):
        xt, yt = nl.load(x), nl.load(y)
        m = nl.matmul(xt, yt, transpose_x=True)        # x.T @ y: K=128 on partitions
        t = nl.transpose(nl.load(x[:, 0:64]))
        seen.extend([m.buffer, t.buffer])
        o1 = nl.ndarray(m.shape, dtype=np.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray(t.shape, dtype=np.float32, buffer=nl.shared_hbm)
        nl.store(o1, nl.copy(m))
        nl.store(o2, nl.copy(t))
        return o1, o2
    x, y = rand((128, 64)), rand((128, 32))
    o1, o2 = run(k, x, y)
    np.testing.assert_allclose(o1, x.T @ y, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(o2, x[:, 0:64].T)
    assert seen == [nl.psum, nl.psum]


def test_softmax_matches_numpy():
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.softmax(nl.load(a), axis=1))
        return out
    a = rand((128, 16))
    e = np.exp(a - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(run(k, a), e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_device_print_writes_to_stdout(capsys):
    def k(a):
        nl.device_print("tile:", nl.load(a))
        return a
    run(k, np.arange(4, dtype=np.float32).reshape(2, 2))
    out = capsys.readouterr().out
    assert "tile:" in out and "3." in out


def test_device_print_prefix_must_be_a_string():
    def k(a):
        nl.device_print(3, nl.load(a))
        return a
    with pytest.raises(ValueError, match="print_prefix"):
        run(k, rand((2, 2)))


def test_nkiobject_and_typing():
    @dataclasses.dataclass(frozen=True)
    class Cfg(nl.NKIObject):
        tile: int = 128
    assert Cfg().tile == 128
    assert nt.tensor[128, 512].shape == (128, 512)
    assert nki.dtype is nl.dtype


def test_nkiobject_dataclass_fields_include_unannotated_class_attributes():
    """AWS's nki-library attention_cte.py: `@dataclass class SectionParams(nl.NKIObject):
    section_idx = None ...` is built as SectionParams(section_idx=..., ...)."""
    @dataclasses.dataclass
    class Section(nl.NKIObject):
        size: int
        idx = None
        offset = 0
        table = [1, 2]                 # unhashable: stays a class attribute

        def end(self):
            return self.offset + self.size

        @property
        def twice(self):
            return 2 * self.size

    s = Section(4, idx=1, offset=8)
    assert [f.name for f in dataclasses.fields(Section)] == ["size", "idx", "offset"]
    assert (s.idx, s.offset, s.end(), s.twice, s.table) == (1, 8, 12, 8, [1, 2])
    assert Section(2).idx is None and Section(2).offset == 0
    # a field declared without a default may be left out (nki-library mlp_tkg_constants.py
    # builds MLPTKGConstantsDimensionSizes without its `remainderIFused: int`): None
    assert Section(idx=3).size is None
    with pytest.raises(TypeError):
        Section(2, table=[3])

    class Plain(nl.NKIObject):         # not a dataclass: class attributes as Python has them
        idx = None
    p = Plain()
    p.idx = 3
    assert (p.idx, Plain.idx) == (3, None)


def test_nkiobject_subclass_without_dataclass_is_built_from_its_fields():
    """AWS's nki-library moe_cte: `class DimensionSizes(NKIObject): B: int ...` (no @dataclass)
    built as DimensionSizes(T=T, H=H, ...), the derived fields set later by a method."""
    class Dims(nl.NKIObject):
        B: int
        H: int
        area: int
        mode = "x"

        def derive(self):
            self.area = self.B * self.H

    d = Dims(B=2, H=3)
    assert d.area is None
    d.derive()
    assert (d.B, d.H, d.area, d.mode) == (2, 3, 6, "x")
    assert Dims(4, 5).H == 5                            # by position, in annotation order
    assert Dims(2, 3, mode="y").mode == "y"
    with pytest.raises(TypeError, match="unexpected keyword argument 'Q'"):
        Dims(Q=1)
    with pytest.raises(TypeError, match="at most 4 positional"):
        Dims(1, 2, 3, 4, 5)

    class Own(nl.NKIObject):          # a class with its own __init__ keeps it
        def __init__(self, x):
            self.x = 2 * x
    assert Own(5).x == 10


@pytest.mark.parametrize("name,ref", [
    # GELU's sigmoid approximation x * sigmoid(1.702 x) (Hendrycks & Gimpel 2016, §2) and the
    # derivatives of silu / gelu, by central differences of NumPy references
    ("gelu_apprx_sigmoid", lambda x: x / (1 + np.exp(-1.702 * x))),
    ("silu_dx", None), ("gelu_apprx_sigmoid_dx", None), ("gelu_dx", None)])
def test_activation_tokens_of_the_current_language(name, ref):
    from math import erf
    fns = {"silu_dx": lambda x: x / (1 + np.exp(-x)),
           "gelu_apprx_sigmoid_dx": lambda x: x / (1 + np.exp(-1.702 * x)),
           "gelu_dx": np.vectorize(lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))))}
    x = np.linspace(-4, 4, 128 * 8).reshape(128, 8)
    if ref is None:
        h = 1e-4
        expect = (fns[name](x + h) - fns[name](x - h)) / (2 * h)
    else:
        expect = ref(x)

    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.activation(dst=t, op=getattr(nl, name), data=nl.load(a))
        nl.store(out, t)
        return out
    np.testing.assert_allclose(run(k, x.astype(np.float32)), expect, rtol=2e-4, atol=2e-5)


def test_nl_range_and_bool():
    seen = []

    def k(a):
        seen.extend(nl.range(3))
        return a
    run(k, rand((1, 1)))
    assert seen == [0, 1, 2] and nl.bool == np.bool_


def test_isa_constants_submodule_through_the_shim(served):
    from nki.isa import constants
    from nki.isa.constants import oob_mode
    assert constants.oob_mode is oob_mode is nisa.oob_mode


def test_shared_identity_matrix_is_an_sbuf_tile():
    # nki-library core/embeddings/rope.py: identity_sb.ap(...) as a tensor_copy source
    seen = []

    def k(a):
        ident = nl.shared_identity_matrix(8, dtype=nl.float32)
        seen.append(ident.buffer)
        out = nl.ndarray((8, 8), dtype=np.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=ident)
        return out
    np.testing.assert_array_equal(run(k, rand((1, 1))), np.eye(8, dtype=np.float32))
    assert seen == [nl.sbuf]


def test_outputs_created_inside_unrolled_loops():
    # every nki loop is an unrolled Python range (§2.0 item 4): no loop scope for outputs
    def k(a):
        outs = []
        for i in nl.affine_range(2):
            o = nl.ndarray((128, 4), dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(o, nl.multiply(nl.load(a), float(i + 1)))
            outs.append(o)
        return tuple(outs)
    a = rand((128, 4))
    o1, o2 = run(k, a)
    np.testing.assert_array_equal(o1, a)
    np.testing.assert_array_equal(o2, a * 2)


def test_reductions_must_take_the_last_axes():
    def k(a):
        out = nl.ndarray((128, 6), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.max(nl.load(a), axis=1))
        return out
    with pytest.raises(ValueError, match="last contiguous free dimensions"):
        run(k, rand((128, 4, 6)))


@pytest.mark.parametrize("version,fails", [("0.3", True), ("0.4", True), ("0.5", False)])
def test_matmul_without_transpose_x_by_release(monkeypatch, version, fails):
    def k(x, y):
        m = nl.matmul(nl.load(x), nl.load(y))            # x @ y: x is (M=128, K=128)
        out = nl.ndarray(m.shape, dtype=np.float32, buffer=nl.shared_hbm)
        s = nl.ndarray(m.shape, dtype=np.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=m)
        nl.store(out, s)
        return out
    monkeypatch.setenv("NKISIM_NKI_VERSION", version)
    x, y = rand((128, 128)), rand((128, 64))
    if fails:
        with pytest.raises(NotImplementedError, match="transpose_x=True"):
            run(k, x, y)
    else:
        np.testing.assert_allclose(run(k, x, y), x @ y, rtol=1e-4, atol=1e-4)


def test_rearrange_and_vector_select():
    def k(a, idx):
        t = nl.ndarray((128, 24), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        v = t.rearrange(("p", ("h", "w")), ("p", "w", "h"), {"h": 4})
        o1 = nl.ndarray(v.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        s = nl.ndarray(v.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=v)
        nisa.dma_copy(dst=o1, src=s)
        i_sb = nl.ndarray((3, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i_sb, src=idx)
        rows = nl.ndarray((3, 24), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=a.vector_select(0, i_sb))
        o2 = nl.ndarray((3, 24), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o2, src=rows)
        return o1, o2
    a = rand((128, 24))
    idx = np.array([[5], [127], [5]], np.int32)
    o1, o2 = run(k, a, idx)
    np.testing.assert_array_equal(o1, a.reshape(128, 4, 6).transpose(0, 2, 1))
    np.testing.assert_array_equal(o2, a[[5, 127, 5]])


def test_dtypes_print_and_hash_like_the_real_string_constants():
    # nki-library core/utils/allocator.py: `str(dtype) == str(nl.float32)` with a tensor's dtype
    seen = {}

    def k(a):
        t = nl.ndarray((128, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
        seen.update(f32=a.dtype, bf16=t.dtype)
        return a
    run(k, rand((128, 4)))
    for name in ("float32", "bfloat16", "int32", "uint8", "float8_e4m3", "bool"):
        assert str(getattr(nl, name if name != "bool" else "bool_")) == name
    assert str(seen["f32"]) == str(nl.float32) and str(seen["bf16"]) == str(nl.bfloat16)
    assert {nl.float32: 4, nl.bfloat16: 2}[seen["f32"]] == 4


def test_ap_of_an_input_that_is_a_slice_of_a_larger_array():
    def k(a):
        out = nl.ndarray((2, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((2, 4), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[8, 2], [2, 4]], offset=1))
        nisa.dma_copy(dst=out, src=t)
        return out
    big = np.arange(10 * 8, dtype=np.float32).reshape(10, 8)
    a = big[3:5]                      # contiguous, its memory owned by `big`
    np.testing.assert_array_equal(run(k, a), a[:, 1::2])


def _ap_of_ap_kernel(placed):
    """``.ap()`` of a view that ``.ap()`` made (nki-library's TensorView.get_view() on a tile
    it got from get_view()): the pattern addresses the tile's storage, not the view."""
    def k(a):
        out = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        kw = {"address": (0, 512)} if placed else {}
        t = nl.ndarray((128, 2, 8), dtype=a.dtype, buffer=nl.sbuf, **kw)
        nisa.dma_copy(dst=t, src=a)
        v = t.ap([[16, 64], [1, 8]], offset=2 * 16 + 4)      # partitions 2:66, elements 4:12
        w = v.ap([[16, 128], [2, 8]], offset=1)              # all partitions, odd elements
        s = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=w)
        nisa.tensor_scalar(dst=v.ap([[16, 128], [1, 2]], offset=14), data=s[:, 0:2],
                           op0=nl.multiply, operand0=-1.0)   # writes land in t's elements 14:16
        nisa.tensor_copy(dst=s[:, 0:2], src=t.ap([[16, 128], [1, 2]], offset=14))
        nisa.dma_copy(dst=out, src=s)
        return out
    return k


@pytest.mark.parametrize("placed", [False, True], ids=["allocated", "address"])
def test_ap_of_an_ap_view_addresses_the_storage(placed):
    a = rand((128, 2, 8))
    flat = a.reshape(128, 16)
    want = flat[:, 1::2].copy()
    want[:, 0:2] = -flat[:, 1:4:2]
    np.testing.assert_array_equal(run(_ap_of_ap_kernel(placed), a), want)


def test_ap_storage_bytes_of_a_strided_owner():
    """The storage's bytes when its owner is strided (its elements inside a larger block):
    a view from its first element to its last, which writes go through."""
    from nkisim.access import _bytes_of
    big = np.arange(64, dtype=np.float32).reshape(8, 8)
    owner = big[:, 2:6]
    b = _bytes_of(owner, "x")
    assert b.dtype == np.uint8 and b.size == (7 * 8 + 3 + 1) * 4
    np.testing.assert_array_equal(b.view(np.float32), np.arange(2, 62, dtype=np.float32))
    b[:4] = np.frombuffer(np.float32(-1).tobytes(), np.uint8)
    assert big[0, 2] == -1
    with pytest.raises(NotImplementedError, match="negative strides"):
        _bytes_of(big[::-1, 2:6], "x")
