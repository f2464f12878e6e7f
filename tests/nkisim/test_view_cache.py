"""On-chip tiles cache their views by key (issue 12, ``nkisim.tensor._view``): a view taken
again behaves as a fresh one (same fields as the general path, writes and checks through it),
two names never share a view object, and the cache keeps no tile alive."""

import gc
import weakref

import numpy as np
import pytest

from nkisim import NKIWarning
from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl
from nkisim.runtime import last_run
from nkisim.tensor import _VIEWS_MAX, _view, region


def _general_view(t, key):
    from nkisim.indexing import normalize_key
    kind, k = normalize_key(key, t.shape, t.name, [])
    assert kind == "basic"
    return t._basic_view(k)


def test_cached_views_equal_the_general_path():
    """Taken once and again (from the cache), a view has the general path's shape, partition
    axis, byte offset, region and elements; loop indices in slice bounds included."""
    x = np.arange(128 * 6 * 40, dtype=np.float32).reshape(128, 6, 40)
    hits = []

    @nki.jit
    def kernel(x_in):
        out = nl.ndarray((128, 6, 40), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 6, 40), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x_in)
        for i in nl.affine_range(2):
            keys = [(slice(None), i, slice(1, 39)), (slice(0, 64), slice(i, i + 3), slice(2, 7)),
                    (slice(None), slice(None), slice(i, i + 30)), (slice(0, 128), 5),
                    (slice(None, 128, None), slice(0, 6, 1), 7)]
            for key in keys:
                slow = _general_view(t, key)
                first = _view(t, key)
                ident = id(first)
                del first
                for v in (_view(t, key), _view(t, key)):
                    assert v.shape == slow.shape and v.paxis == slow.paxis
                    assert v._off == slow._off and region(v) == region(slow)
                    assert v._arr.tobytes() == slow._arr.tobytes()
                    hits.append(id(v) == ident)
                    del v
        nl.store(out, t)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(kernel, x), x)
    assert any(hits)          # (dropped views were reused: the cache is exercised)


def test_two_names_never_share_a_view():
    @nki.jit
    def kernel(x_in):
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x_in)
        a = t[:, 0:4]
        b = t[:, 0:4]
        assert a is not b
        nl.store(out[:, 0:4], a)
        nl.store(out[:, 4:8], b)
        return out

    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    np.testing.assert_array_equal(nki.simulate_kernel(kernel, x), np.tile(x[:, :4], 2))


def _ops(kernel, *args):
    nki.simulate_kernel(kernel, *args)
    return [i.op for i in last_run().trace.instrs]


@pytest.mark.parametrize("drop", [False, True])
def test_an_in_place_update_does_not_leak_into_another_view(drop):
    """``a += y`` marks ``a`` for the assignment Python runs next in ``t[k] += y``; a view of
    the same key taken later (``b``, whether ``a`` is still held or was dropped) is a fresh
    view: ``t[k] = b`` copies (a tensor_copy), as with views never cached."""
    @nki.jit
    def kernel(x_in):
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x_in)
        a = t[:, 0:4]
        a += 1.0
        if drop:
            del a
        b = t[:, 0:4]
        t[:, 0:4] = b
        nl.store(out, t)
        return out

    x = np.zeros((128, 8), dtype=np.float32)
    ops = _ops(kernel, x)
    assert ops[-2:] == ["tensor_copy", "dma_copy"], ops
    np.testing.assert_array_equal(nki.simulate_kernel(kernel, x)[:, :4], 1.0)


def _carried(loop_range, n):
    """A kernel whose loop reads, through a view taken again each iteration, what the previous
    iteration wrote through the same key (legal only in a sequential loop)."""
    @nki.jit
    def kernel(x_in):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:, 4:8], src=x_in)
        for _i in loop_range(n):
            t[:, 0:4] = nisa.tensor_copy(t[:, 4:8])
            t[:, 4:8] = nisa.tensor_scalar(t[:, 0:4], nl.add, 1.0)
        nl.store(out, t[:, 4:8])
        return out
    return kernel


def test_writes_and_checks_through_cached_views():
    """Writes through a view taken again land in the tile and stamp its shadow: the race check
    sees the second iteration read what the first wrote through the same key."""
    with pytest.raises(ValueError) as info:
        nki.simulate_kernel(_carried(nl.affine_range, 2), np.zeros((128, 4), np.float32))
    assert info.value.nki_code == "nkisim_loop_carried_dependency"
    assert "`t[0:128, 4:8]`" in str(info.value) and "written by iteration 0" in str(info.value)

    np.testing.assert_array_equal(
        nki.simulate_kernel(_carried(nl.sequential_range, 3), np.ones((128, 4), np.float32)),
        np.full((128, 4), 4.0, np.float32))

    @nki.jit
    def unwritten(x_in):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:, 0:2], src=x_in[:, 0:2])
        for _i in nl.sequential_range(2):   # the same view twice
            nl.store(out, t[:, 0:4])
        return out

    with pytest.warns(NKIWarning, match=r"reads `t\[0:128, 2:4\]` \(256 of 512 elements never"):
        nki.simulate_kernel(unwritten, np.zeros((128, 4), np.float32))


def test_the_cache_keeps_no_tile_alive_and_is_bounded():
    """A dropped tile dies (its Tensor is freed, its allocation leaves the live set) although
    views of it were cached; at most _VIEWS_MAX views are kept per tile."""
    seen = {}

    @nki.jit
    def kernel(x_in):
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x_in)
        for j in range(8):
            nl.store(out[:, j:j + 1], t[:, j:j + 1])
        for j in range(_VIEWS_MAX + 40):
            t[:, j % 8:j % 8 + 1 + j // 8 % 2]
        seen["size"] = len(t._views)
        ref = weakref.ref(t)
        rid = t.root.id
        run = last_run()
        del t
        gc.collect()
        seen["dead"] = ref() is None and rid not in run.memory.live
        return out

    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    np.testing.assert_array_equal(nki.simulate_kernel(kernel, x), x)
    assert seen["dead"] and 0 < seen["size"] <= _VIEWS_MAX
