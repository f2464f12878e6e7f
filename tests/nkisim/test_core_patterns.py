"""Core pieces the current-dialect face needs: pattern-based iota / affine_select
(nkisim.engines.affine_pattern, iota_pattern, affine_select_pattern) and the per-element
"matmul-initialised" PSUM flags (nkisim.psum_init).

Truth: the STUB-R32 formulas quoted in shared/spec/nki-current.md §2.4 ("dst[p, w,z,y,x] =
offset + p*channel_multiplier + Σ step_i*idx_i"; affine_select's predicate ``cmp_op(offset +
p*channel_multiplier + Σ step*idx, 0)``), written out with NumPy index grids here, and the
policy of spec §6 item 5 for the flags.
"""

import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim import engines, ops, psum_init
from nkisim.beta1 import isa as b1isa
from nkisim.runtime import last_run


def hbm_out(shape, dtype=np.float32):
    return ops.ndarray(shape, dtype, buffer=ops.shared_hbm)


def test_affine_pattern_matches_the_index_formula():
    pattern = [[5, 3], [-2, 4], [1, 2]]
    v = engines.affine_pattern(6, pattern, offset=7, channel_multiplier=3)
    p, i, j, k = np.meshgrid(np.arange(6), np.arange(3), np.arange(4), np.arange(2),
                             indexing="ij")
    np.testing.assert_array_equal(v, 7 + 3 * p + 5 * i - 2 * j + k)


@pytest.mark.parametrize("pattern", [[], [[1, 2]] * 5, [[1, 0]], [1, 2], "x"])
def test_affine_pattern_rejects_bad_patterns(pattern):
    with pytest.raises(ValueError, match="pattern"):
        engines.affine_pattern(4, pattern)


def test_iota_pattern_is_int32_cast_to_the_dtype():
    @nki.jit
    def k():
        t = engines.iota_pattern(8, [[3, 4], [1, 3]], np.float32, offset=-2,
                                 channel_multiplier=100)
        out = hbm_out(t.shape)
        ops.store(out, t)
        return out

    out = k()
    p, i, j = np.meshgrid(np.arange(8), np.arange(4), np.arange(3), indexing="ij")
    np.testing.assert_array_equal(out, (-2 + 100 * p + 3 * i + j).astype(np.float32))
    (ins,) = [i for i in last_run().trace.instrs if i.op == "iota"]
    assert ins.engine == "gpsimd"


def test_iota_pattern_wraps_like_int32():
    @nki.jit
    def k():
        t = engines.iota_pattern(2, [[1, 2]], np.int32, offset=2**31 - 2)
        out = hbm_out(t.shape, np.int32)
        ops.store(out, t)
        return out

    expect = (np.array([[0, 1], [0, 1]], np.int64) + 2**31 - 2).astype(np.int32)
    np.testing.assert_array_equal(k(), expect)


@pytest.mark.parametrize("cmp,npcmp", [(ops.greater_equal, np.greater_equal),
                                       (ops.equal, np.equal), (ops.less, np.less),
                                       (ops.not_equal, np.not_equal)])
def test_affine_select_pattern_selects_by_the_affine_predicate(cmp, npcmp):
    a = np.random.default_rng(1).normal(size=(16, 12)).astype(np.float32)

    @nki.jit
    def k(x):
        t = ops.load(x)
        r = engines.affine_select_pattern([[-1, 12]], 1, t, -9.0, cmp_op=cmp, offset=2)
        out = hbm_out(r.shape)
        ops.store(out, r)
        return out

    p, f = np.meshgrid(np.arange(16), np.arange(12), indexing="ij")
    expect = np.where(npcmp(2 + p - f, 0), a, np.float32(-9.0))
    np.testing.assert_array_equal(k(a), expect)


def test_affine_select_pattern_must_cover_the_tile():
    @nki.jit
    def k(x):
        engines.affine_select_pattern([[1, 5]], 0, ops.load(x), 0.0)

    with pytest.raises(ValueError, match="cover the free elements"):
        k(np.zeros((4, 6), np.float32))


# ---------------------------------------------------------------------------------------------
# psum_init: per-element matmul-initialised flags


def test_flags_start_clear_are_set_per_view_and_seen_through_aliases():
    seen = {}

    @nki.jit
    def k():
        ps = ops.ndarray((4, 8), np.float32, buffer=ops.psum)
        seen["new"] = psum_init.get(ps).copy()
        psum_init.mark(ps[1:3, 2:6])
        seen["whole"] = psum_init.get(ps).copy()
        seen["alias"] = psum_init.get(ps[:, 4:8]).copy()
        seen["reshaped"] = psum_init.get(ps.reshape((4, 2, 4))).copy()
        other = ops.ndarray((4, 8), np.float32, buffer=ops.psum)
        seen["other"] = psum_init.get(other).copy()

    k()
    assert not seen["new"].any() and not seen["other"].any()
    expect = np.zeros((4, 8), bool)
    expect[1:3, 2:6] = True
    np.testing.assert_array_equal(seen["whole"], expect)
    np.testing.assert_array_equal(seen["alias"], expect[:, 4:8])
    np.testing.assert_array_equal(seen["reshaped"], expect.reshape(4, 2, 4))


def test_a_non_matmul_write_clears_the_flags_it_covers():
    seen = {}

    @nki.jit
    def k(x):
        ps = ops.ndarray((4, 8), np.float32, buffer=ops.psum)
        psum_init.mark(ps)
        ps[:, 0:3] = b1isa.tensor_copy(ops.load(x))      # a Vector Engine write into PSUM
        seen["after"] = psum_init.get(ps).copy()

    k(np.ones((4, 3), np.float32))
    expect = np.ones((4, 8), bool)
    expect[:, 0:3] = False
    np.testing.assert_array_equal(seen["after"], expect)


def test_untracked_psum_costs_nothing_and_reports_clear():
    seen = {}

    @nki.jit
    def k(x):
        ps = ops.zeros((4, 8), np.float32, buffer=ops.psum)
        ps[...] = b1isa.tensor_copy(ops.load(x))
        seen["tracked"] = psum_init.tracked(ps.root)
        seen["flags"] = psum_init.get(ps).copy()

    k(np.ones((4, 8), np.float32))
    assert seen["tracked"] is False
    assert not seen["flags"].any()


def test_flags_of_address_placed_psum_tiles_are_per_allocation_and_small():
    # a direct allocation lives in the whole PSUM byte array; its flags cover its own
    # partitions' bytes only, and a new allocation at the same address starts clear
    from nkisim.nki import language as nl
    seen = {}

    @nki.jit
    def k():
        a = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.psum, address=(0, 2048))
        psum_init.mark(a[2:4, 4:12])
        seen["a"] = psum_init.get(a).copy()
        seen["size"] = psum_init._FLAGS[a.root].size
        b = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.psum, address=(0, 2048))
        seen["b"] = psum_init.get(b).copy()
        seen["ap"] = psum_init.get(a.ap([[16, 8], [2, 8]], offset=0)).copy()

    k()
    expect = np.zeros((8, 16), bool)
    expect[2:4, 4:12] = True
    np.testing.assert_array_equal(seen["a"], expect)
    assert seen["size"] == 8 * 16                 # one flag per element of the tile
    assert not seen["b"].any()
    np.testing.assert_array_equal(seen["ap"], expect[:, 0::2])
