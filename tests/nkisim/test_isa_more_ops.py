"""The ISA / language ops added for AWS's own kernels and doc tests (issue 8), against NumPy.

Truth: each op's docstring in aws-neuron-sdk @ 1db4d74e nki/api/nki/isa/__init__.py and
nki/api/nki/language/__init__.py (quoted in nkisim), and the NumPy equivalents its doc tests
(nki/test/test_nki_isa_*.py) compare against; the expected values here are computed with NumPy
independently of nkisim. Each op must also record one trace instruction on its documented engine.
"""

import ml_dtypes
import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl
from nkisim.runtime import last_run

RNG = np.random.default_rng(808)


def rand(shape, lo=-4.0, hi=4.0, dtype=np.float32):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def hbm(shape, dtype=np.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)


def store(t):
    out = hbm(t.shape, t.dtype)
    nl.store(out, t)
    return out


def instrs(op):
    return [i for i in last_run().trace.instrs if i.op == op]


def one_instr(op, engine):
    found = instrs(op)
    assert len(found) == 1, [i.op for i in last_run().trace.instrs]
    assert found[0].engine == engine
    return found[0]


# ---------------------------------------------------------------------------------------------
# max8 / nc_find_index8 / nc_match_replace8


def test_max8_gives_the_8_largest_descending():
    a = rand((32, 3, 40))

    @nki.jit
    def k(x):
        return store(nisa.max8(src=nl.load(x)))

    out = k(a)
    expect = -np.sort(-a.reshape(32, -1), axis=1)[:, :8]
    np.testing.assert_array_equal(out, expect)
    ins = one_instr("max8", "vector")
    assert ins.reads and ins.writes


def test_max8_rejects_fewer_than_8_elements():
    @nki.jit
    def k(x):
        return store(nisa.max8(src=nl.load(x)))

    with pytest.raises(ValueError, match="8 to 16,384 elements"):
        k(rand((4, 7)))


def test_find_index8_finds_first_occurrences_in_order():
    a = np.tile(np.arange(20, dtype=np.float32), (4, 1))
    a[:, 15] = 3.0                                    # 3.0 occurs twice: first index wins
    vals = np.array([[19, 3, 0, 7, 8, 9, 10, 11]] * 4, np.float32)

    @nki.jit
    def k(x, v):
        return store(nisa.nc_find_index8(data=nl.load(x), vals=nl.load(v)))

    out = k(a, vals)
    assert out.dtype == np.uint32
    expect = np.array([[np.flatnonzero(row == v)[0] for v in vrow]
                       for row, vrow in zip(a, vals)])
    np.testing.assert_array_equal(out, expect)
    one_instr("nc_find_index8", "vector")


def test_match_replace8_replaces_first_matches_and_reports_indices():
    a = RNG.permutation(np.arange(4 * 4 * 6, dtype=np.float32)).reshape(4, 4, 6)
    a[:, 0, 0] = a[:, 3, 5]                           # a duplicate of one of the values
    vals = -np.sort(-a.reshape(4, -1), axis=1)[:, :8]

    @nki.jit
    def k(x, v):
        idx = nl.ndarray((4, 8), dtype=nl.uint32, buffer=nl.sbuf)
        res = nisa.nc_match_replace8(data=nl.load(x), vals=nl.load(v), imm=-1.0, dst_idx=idx)
        return store(res), store(idx)

    out, idx = k(a, vals)
    # NumPy equivalent from the docs: each value's first match, searching after the previous
    # replacements
    flat = a.reshape(4, -1).copy()
    exp_idx = np.zeros((4, 8), np.int64)
    for i in range(4):
        for j in range(8):
            m = np.flatnonzero(flat[i] == vals[i, j])[0]
            exp_idx[i, j] = m
            flat[i, m] = -1.0
    np.testing.assert_array_equal(out, flat.reshape(a.shape))
    np.testing.assert_array_equal(idx, exp_idx)
    ins = one_instr("nc_match_replace8", "vector")
    assert len(ins.writes) == 2                       # the result and dst_idx


# ---------------------------------------------------------------------------------------------
# select_reduce / range_select and the accumulator registers


def test_select_reduce_with_vector_on_false_and_reduction():
    pred = RNG.integers(0, 2, size=(128, 96)).astype(np.uint8)
    t = rand((128, 96))
    f = rand((128, 1))

    @nki.jit
    def k(p, x, y):
        dst = nl.ndarray((128, 96), dtype=nl.float32, buffer=nl.sbuf)
        red = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=dst, predicate=nl.load(p), on_true=nl.load(x),
                           on_false=nl.load(y), reduce_res=red,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=np.max)
        return store(dst), store(red)

    out, red = k(pred, t, f)
    expect = np.where(pred != 0, t, f)
    np.testing.assert_array_equal(out, expect)
    np.testing.assert_array_equal(red, expect.max(axis=1, keepdims=True))
    one_instr("select_reduce", "vector")


def test_select_reduce_reverse_pred_with_scalar_on_false():
    pred = RNG.integers(0, 2, size=(16, 8)).astype(np.uint8)
    t = rand((16, 8))

    @nki.jit
    def k(p, x):
        dst = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=dst, predicate=nl.load(p), on_true=nl.load(x), on_false=-5.0,
                           reverse_pred=True)
        return store(dst)

    np.testing.assert_array_equal(k(pred, t), np.where(pred == 0, t, -5.0))


def test_range_select_matches_the_docs_numpy_equivalent():
    t = rand((128, 200))
    b0 = np.full((128, 1), 10, np.float32)
    b1 = RNG.integers(20, 180, size=(128, 1)).astype(np.float32)

    @nki.jit(platform_target="trn2")
    def k(x, lo, hi):
        red = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        res = nisa.range_select(on_true_tile=nl.load(x), comp_op0=np.greater_equal,
                                comp_op1=np.less, bound0=nl.load(lo), bound1=nl.load(hi),
                                reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=red,
                                reduce_op=np.max, range_start=5)
        return store(res), store(red)

    res, red = k(t, b0, b1)
    idx = 5 + np.arange(200)[None, :]
    expect = np.where((idx >= b0) & (idx < b1), t, nl.fp32.min)
    np.testing.assert_array_equal(res, expect)
    np.testing.assert_array_equal(red, expect.max(axis=1, keepdims=True))


def test_range_select_chained_accumulation_keeps_the_running_max():
    t = rand((8, 16))

    @nki.jit(platform_target="trn2")
    def k(x):
        lo = nl.zeros((8, 1), dtype=nl.float32)
        hi = nl.full((8, 1), 1000.0, dtype=nl.float32)
        tile = nl.load(x)
        red = nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.range_select(on_true_tile=tile, comp_op0=np.greater_equal, comp_op1=np.less,
                          bound0=lo, bound1=hi, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        shifted = nl.add(tile, -100.0)           # smaller: the max stays the first tile's
        nisa.range_select(on_true_tile=shifted, comp_op0=np.greater_equal, comp_op1=np.less,
                          bound0=lo, bound1=hi, reduce_cmd=nisa.reduce_cmd.reduce,
                          reduce_res=red)
        return store(red)

    np.testing.assert_array_equal(k(t), t.max(axis=1, keepdims=True))


def test_range_select_is_trn2_only():
    @nki.jit(platform_target="trn1")
    def k(x):
        t = nl.load(x)
        return store(nisa.range_select(on_true_tile=t, comp_op0=np.less, comp_op1=np.less,
                                       bound0=1.0, bound1=2.0))

    with pytest.raises(ValueError, match="NeuronCore-v3"):
        k(rand((4, 8)))


# ---------------------------------------------------------------------------------------------
# tensor_scalar_reduce / tensor_partition_reduce


@pytest.mark.parametrize("rop, ref", [(np.add, np.sum), (nl.max, np.max), (nl.min, np.min),
                                      (np.multiply, np.prod)])
def test_tensor_scalar_reduce(rop, ref):
    a = rand((64, 4, 8), 0.5, 1.5)
    s = rand((64, 1))

    @nki.jit
    def k(x, y):
        red = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.sbuf)
        res = nisa.tensor_scalar_reduce(data=nl.load(x), op0=np.multiply, operand0=nl.load(y),
                                        reduce_op=rop, reduce_res=red)
        return store(res), store(red)

    res, red = k(a, s)
    prod = a * s[:, :, None]
    np.testing.assert_allclose(res, prod, rtol=1e-6)
    np.testing.assert_allclose(red, ref(prod.reshape(64, -1), axis=1, keepdims=True), rtol=1e-5)
    ins = one_instr("tensor_scalar_reduce", "vector")
    assert len(ins.writes) == 2


@pytest.mark.parametrize("op, ref", [(np.add, np.sum), (np.max, np.max)])
def test_tensor_partition_reduce(op, ref):
    a = rand((128, 6, 4))

    @nki.jit
    def k(x):
        return store(nisa.tensor_partition_reduce(op, nl.load(x)))

    np.testing.assert_allclose(k(a), ref(a, axis=0, keepdims=True), rtol=1e-5)
    one_instr("tensor_partition_reduce", "gpsimd")


def test_tensor_partition_reduce_bitwise_or_on_ints():
    a = RNG.integers(0, 1 << 12, size=(32, 5)).astype(np.int32)

    @nki.jit
    def k(x):
        return store(nisa.tensor_partition_reduce(np.bitwise_or, nl.load(x)))

    np.testing.assert_array_equal(k(a), np.bitwise_or.reduce(a, axis=0, keepdims=True))


# ---------------------------------------------------------------------------------------------
# nc_stream_shuffle / dma_transpose


def test_stream_shuffle_within_each_quadrant_and_255_keeps_dst():
    a = rand((64, 10))
    shuffle = [(i + 3) % 32 for i in range(32)]
    shuffle[5] = 255

    @nki.jit
    def k(x):
        src = nl.load(x)
        dst = nl.zeros((64, 10), dtype=nl.float32)
        nisa.nc_stream_shuffle(src=src, dst=dst, shuffle_mask=shuffle)
        return store(dst)

    out = k(a)
    expect = np.zeros_like(a)
    for q in range(2):
        for i, s in enumerate(shuffle):
            if s != 255:
                expect[q * 32 + i] = a[q * 32 + s]
    np.testing.assert_array_equal(out, expect)
    one_instr("nc_stream_shuffle", "vector")


@pytest.mark.parametrize("shape, axes", [((96, 128), (1, 0)), ((4, 6, 8), (2, 1, 0)),
                                         ((2, 3, 4, 5), (3, 1, 2, 0))])
def test_dma_transpose_permutations(shape, axes):
    a = rand(shape)

    @nki.jit
    def k(x):
        return store(nisa.dma_transpose(x))

    np.testing.assert_array_equal(k(a), np.transpose(a, axes))
    ins = one_instr("dma_transpose", "dma")
    assert ins.detail["transpose"] and ins.reads[0].buffer == "hbm"


# ---------------------------------------------------------------------------------------------
# bn_stats / bn_aggr


def test_bn_stats_even_odd_triples():
    a = rand((16, 9), 0, 10)

    @nki.jit
    def k(x):
        return store(nisa.bn_stats(nl.load(x)))

    out = k(a).astype(np.float64)
    a64 = a.astype(np.float64)
    for k_, part in enumerate((a64[:, 0::2], a64[:, 1::2])):
        np.testing.assert_allclose(out[:, 3 * k_], part.shape[1])
        np.testing.assert_allclose(out[:, 3 * k_ + 1], part.mean(axis=1), rtol=1e-6)
        np.testing.assert_allclose(out[:, 3 * k_ + 2], part.var(axis=1) * part.shape[1],
                                   rtol=1e-5)


def test_bn_stats_then_bn_aggr_over_several_tiles_gives_mean_and_variance():
    a = rand((128, 1024), 0, 100)

    @nki.jit
    def k(x):
        stats = nl.ndarray((128, 12), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(x)
        for i in nl.static_range(2):
            stats[:, i * 6:(i + 1) * 6] = nisa.bn_stats(t[:, i * 512:(i + 1) * 512])
        return store(nisa.bn_aggr(stats))

    out = k(a)
    np.testing.assert_allclose(out[:, 0], a.mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], a.var(axis=1), rtol=1e-4)
    assert len(instrs("bn_stats")) == 2 and len(instrs("bn_aggr")) == 1


def test_bn_stats_rejects_more_than_512_elements():
    @nki.jit
    def k(x):
        return store(nisa.bn_stats(nl.load(x)))

    with pytest.raises(ValueError):
        k(rand((4, 513)))


# ---------------------------------------------------------------------------------------------
# random: nl.rand, nl.random_seed, dropout


def test_rand_is_uniform_in_0_1_and_seeded():
    @nki.jit
    def k():
        nl.random_seed(seed=7)
        a = nl.rand((64, 256))
        nl.random_seed(seed=7)
        b = nl.rand((64, 256))
        return store(a), store(b)

    a, b = k()
    assert a.min() >= 0 and a.max() < 1 and 0.45 < a.mean() < 0.55
    np.testing.assert_array_equal(a, b)                  # same seed, same sequence
    assert len(instrs("rand")) == 2 and len(instrs("random_seed")) == 2


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_zeroes_with_the_given_probability(p):
    a = rand((128, 512), 1, 2)

    @nki.jit
    def k(x):
        return store(nisa.dropout(nl.load(x), prob=p))

    out = k(a)
    kept = out != 0
    np.testing.assert_array_equal(out[kept], a[kept])     # no rescaling
    assert abs((~kept).mean() - p) < 0.02
    one_instr("dropout", "vector")


def test_dropout_per_partition_probabilities_and_nl_dropout():
    a = rand((128, 512), 1, 2)
    probs = np.where(np.arange(128) < 64, 0.0, 1.0).astype(np.float32).reshape(128, 1)

    @nki.jit
    def k(x, pr):
        return store(nl.dropout(nl.load(x), rate=nl.load(pr)))

    out = k(a, probs)
    np.testing.assert_array_equal(out[:64], a[:64])
    assert not out[64:].any()


# ---------------------------------------------------------------------------------------------
# tensor_copy_predicated / local_gather / sequence_bounds / gather_flattened


def test_tensor_copy_predicated_keeps_dst_where_false():
    a, b = rand((32, 40)), rand((32, 40))
    pred = (a > 0).astype(np.uint8)

    @nki.jit
    def k(p, x, y):
        dst = nl.load(y)
        nisa.tensor_copy_predicated(src=nl.load(x), dst=dst, predicate=nl.load(p))
        return store(dst)

    np.testing.assert_array_equal(k(pred, a, b), np.where(pred != 0, a, b))
    one_instr("tensor_copy_predicated", "vector")


def test_local_gather_per_16_partition_core():
    src = rand((32, 64, 2))
    index = RNG.integers(0, 64, size=(32, 3)).astype(np.uint16)

    @nki.jit
    def k(s, i):
        return store(nisa.local_gather(nl.load(s), nl.load(i) * 2, num_elem_per_idx=2,
                                       num_valid_indices=40))

    # the hardware index is an element offset: 2 * row when gathering rows of 2 elements
    idx = index.astype(np.int64)
    out = k(src, idx.astype(np.uint16))
    expect = np.empty((32, 40, 2), np.float32)
    for c in range(2):
        rows = idx[c * 16:(c + 1) * 16].flatten(order="F")[:40]   # partition-first
        expect[c * 16:(c + 1) * 16] = src[c * 16:(c + 1) * 16][:, rows, :]
    np.testing.assert_array_equal(out, expect)
    one_instr("local_gather", "gpsimd")


def test_sequence_bounds():
    seg = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 4, 4]], np.float32)

    @nki.jit
    def k(s):
        return store(nisa.sequence_bounds(segment_ids=nl.load(s)))

    out = k(seg)
    n = seg.shape[1]
    starts, ends = [], []
    for v in seg[0]:
        if v == 0:
            starts.append(n)
            ends.append(-1)
        else:
            same = np.flatnonzero(seg[0] == v)         # segments are contiguous here
            starts.append(same.min())
            ends.append(same.max() + 1)
    np.testing.assert_array_equal(out, np.array([[starts, ends]], np.float32))


def test_gather_flattened_is_take_along_the_flattened_free_axis():
    data = rand((8, 4, 5))
    idx = RNG.integers(0, 20, size=(8, 7)).astype(np.uint32)

    @nki.jit
    def k(d, i):
        return store(nl.gather_flattened(data=nl.load(d), indices=nl.load(i)))

    expect = np.take_along_axis(data.reshape(8, -1), idx.astype(np.int64), axis=-1)
    np.testing.assert_array_equal(k(data, idx), expect)


# ---------------------------------------------------------------------------------------------
# constants and dtype info


def test_finfo_matches_numpy_and_ml_dtypes():
    assert nl.finfo(nl.float32).min == np.finfo(np.float32).min
    assert nl.finfo(np.float16).max == np.finfo(np.float16).max
    assert nl.finfo(nl.bfloat16).min == float(ml_dtypes.finfo(ml_dtypes.bfloat16).min)
    with pytest.raises(ValueError):
        nl.finfo(nl.int32)


CONST = (np.arange(128 * 4).reshape(128, 4) % 7).astype(np.int8)


def test_shared_constant_and_identity():
    @nki.jit
    def k(a):
        c = nl.shared_constant(CONST, dtype=nl.float32)
        eye = nl.shared_identity_matrix(128, dtype=nl.bfloat16)
        return store(nl.add(nl.load(a), nl.load(c))), store(nl.load(eye))

    a = rand((128, 4))
    s, e = k(a)
    np.testing.assert_array_equal(s, a + CONST.astype(np.float32))
    np.testing.assert_array_equal(e.astype(np.float32), np.eye(128))


def test_shared_constant_is_read_only():
    @nki.jit
    def k(a):
        c = nl.shared_constant(np.zeros((4, 4), np.float32))
        nl.store(c, nl.load(a))
        return c

    with pytest.raises(TypeError, match="immutable"):
        k(rand((4, 4)))


# ---------------------------------------------------------------------------------------------
# indirect DMA: an SBUF tile of row indices (test_nki_nl_load_store_indirect.py,
# test_nki_isa_dma_copy.py, test_nki_nl_atomic_rmw.py)


def test_indirect_load_and_store_rows():
    data = rand((128, 64))
    rows = RNG.permutation(128)[:48].astype(np.int32)

    @nki.jit
    def k(d, r):
        i_p = nl.arange(48)[:, None]
        i_f = nl.arange(64)[None, :]
        idx = nl.load(r.reshape((48, 1)))
        t = nl.load(d[idx, i_f])
        out = hbm((128, 64))
        nl.store(out, nl.zeros((128, 64), dtype=nl.float32))
        nl.store(out[idx[i_p, 0], i_f], t)
        return store(t), out

    got, scattered = k(data, rows)
    np.testing.assert_array_equal(got, data[rows])
    expect = np.zeros_like(data)
    expect[rows] = data[rows]
    np.testing.assert_array_equal(scattered, expect)
    loads = [i for i in instrs("dma_copy") if i.writes[0].buffer == "sbuf"]
    # the gather reads the HBM rows and the SBUF index tile
    assert any(len(i.reads) == 2 and i.reads[1].buffer == "sbuf" for i in loads)


def test_indirect_out_of_bound_raises_numpy_index_error():
    @nki.jit
    def k(d):
        idx = nisa.iota(3 * nl.arange(64)[:, None], dtype=nl.int32)
        return store(nl.load(d[idx, nl.arange(512)[None, :]]))

    with pytest.raises(IndexError) as ei:
        k(rand((128, 512)))
    # AWS's doc test expects NumPy's message for the flattened tensor: row 129 -> 129 * 512
    assert str(ei.value) == "index 66048 is out of bounds for axis 0 with size 65536"


def test_indirect_oob_skip_leaves_the_skipped_rows():
    data = rand((128, 16))

    @nki.jit
    def k(d):
        idx = nisa.iota(3 * nl.arange(64)[:, None], dtype=nl.int32)
        ix, iy = nl.mgrid[0:64, 0:16]
        t = nisa.memset((64, 16), -1.0, nl.float32)
        nisa.dma_copy(src=d[idx, iy], dst=t[ix, iy], oob_mode=nisa.oob_mode.skip)
        return store(t)

    out = k(data)
    expect = np.full((64, 16), -1.0, np.float32)
    rows = 3 * np.arange(64)
    ok = rows < 128
    expect[ok] = data[rows[ok]]
    np.testing.assert_array_equal(out, expect)


def test_atomic_rmw_adds_every_repeated_index():
    base = rand((16, 8))
    vals = rand((32, 8))
    rows = np.repeat(np.arange(16), 2).astype(np.int32).reshape(32, 1)

    @nki.jit
    def k(b, v, r):
        out = hbm((16, 8))
        nl.store(out, nl.load(b))
        nl.atomic_rmw(out[nl.load(r), nl.arange(8)[None, :]], value=nl.load(v), op=np.add)
        return out

    expect = base.copy()
    np.add.at(expect, rows[:, 0], vals)
    np.testing.assert_allclose(k(base, vals, rows), expect, rtol=1e-6)


def test_dma_copy_rmw_through_index_tile():
    base = rand((64, 8))
    vals = rand((32, 8))

    @nki.jit
    def k(b, v):
        out = hbm((64, 8))
        nl.store(out, nl.load(b))
        idx = nisa.iota(2 * nl.arange(32)[:, None], dtype=nl.int32)
        nisa.dma_copy(dst=out[idx, nl.arange(8)[None, :]], src=nl.load(v), dst_rmw_op=np.add)
        return out

    expect = base.copy()
    expect[2 * np.arange(32)] += vals
    np.testing.assert_allclose(k(base, vals), expect, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# tensor_copy_dynamic_src / _dst: an offset read from SBUF at run time


def test_tensor_copy_dynamic_src_gathers_columns_at_runtime_offsets():
    a = rand((128, 64))
    offs = RNG.integers(0, 60, size=(1, 6)).astype(np.int32)

    @nki.jit
    def k(x, o):
        src = nl.load(x)
        off = nl.load(o)
        out = nl.ndarray((128, 6, 4), dtype=nl.float32, buffer=nl.sbuf)
        ix, iy = nl.mgrid[0:128, 0:4]
        for i in nl.affine_range(6):
            out[ix, i, iy] = nisa.tensor_copy_dynamic_src(src[ix, off[0, i] + iy])
        return store(out)

    expect = np.stack([a[:, o:o + 4] for o in offs[0]], axis=1)
    np.testing.assert_array_equal(k(a, offs), expect)
    assert len(instrs("tensor_copy_dynamic_src")) == 6


def test_tensor_copy_dynamic_dst_scatters_at_a_runtime_offset():
    a = rand((16, 4))
    off = np.array([[5]], np.int32)

    @nki.jit
    def k(x, o):
        dst = nl.zeros((16, 12), dtype=nl.float32)
        ix, iy = nl.mgrid[0:16, 0:4]
        nisa.tensor_copy_dynamic_dst(dst=dst[ix, nl.load(o)[0, 0] + iy], src=nl.load(x))
        return store(dst)

    expect = np.zeros((16, 12), np.float32)
    expect[:, 5:9] = a
    np.testing.assert_array_equal(k(a, off), expect)


def test_indirect_index_past_its_axis_but_inside_the_tensor_names_the_axis():
    """A gather from batch 0 of a (2, 128, 64) tensor with rows up to 189: row 129 of batch 0
    is element 129 * 64 = 8256 of the flattened tensor, inside its 16384 elements, so the
    flattened message would say "index 8256 is out of bounds ... with size 16384"; the
    message names the row axis instead (nki-samples' resize_nearest reads one row too many)."""
    @nki.jit
    def k(d):
        idx = nisa.iota(3 * nl.arange(64)[:, None], dtype=nl.int32)
        return store(nl.load(d[0, idx, nl.arange(64)[None, :]]))

    with pytest.raises(IndexError) as ei:
        k(rand((2, 128, 64)))
    assert str(ei.value) == ("index 129 is out of bounds for axis 1 with size 128 (element "
                             "8256 of the flattened tensor, which has 16384)")
