"""The checks the real simulator lacks (nkisim.checks, nkisim.memory, issue 5): races between
affine_range iterations and SPMD instances, uninitialized reads, outputs not written, tiles used
out of scope, writes to inputs, SBUF/PSUM capacity, suspicious-pattern warnings; and that each
can be turned off.

Truth: the NKI rules of nki-reference §1.2 (tiles, buffers), §1.4 (PSUM banks), §1.5 (output
dependencies), §1.9 (affine_range, associative reductions, scoping), §1.11 (PSUM accumulation),
§2 (error codes) and §3.1 (SBUF/PSUM capacity); byte counts are computed from shapes here.
"""

import re
import warnings

import numpy as np
import pytest

from nkisim import NKIWarning
from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl
from nkisim.context import ALL_CHECKS, parse_checks
from nkisim.errors import NKIRuleWarning
from nkisim.runtime import simulate

RNG = np.random.default_rng(5)
F32 = 4


def rand(*shape):
    return RNG.random(shape, dtype=np.float32)


def run(body, *args, checks="all", target=None, strict=False, **kwargs):
    """Simulate ``body`` as a kernel with NKI warnings as errors; return (output, Run)."""
    kernel = nki.jit(body)
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("error", NKIWarning)
        mp.setenv("NKISIM_STRICT", "1" if strict else "0")
        out = simulate(kernel, args, kwargs, checks_spec=checks, target=target)
    return out, kernel.last_run


def raises(code, body, *args, checks="all", **kwargs):
    """Run ``body``; assert it raises NKI error ``code``; return the message."""
    with pytest.raises(Exception) as info:
        run(body, *args, checks=checks, **kwargs)
    assert getattr(info.value, "nki_code", None) == code, str(info.value)
    return str(info.value)


def spills(body, *args, target=None):
    """Run ``body``, whose live tensors overflow SBUF or PSUM: the compiler spills them (a
    tolerated rule, nkisim.memory ``Memory._spilled``), so it runs with one NKIRuleWarning, and
    strict mode raises ``nkisim_strict_rule`` with the same text. Returns the warning's text."""
    kernel = nki.jit(body)
    with warnings.catch_warnings(record=True) as ws, pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("always", NKIWarning)
        mp.setenv("NKISIM_STRICT", "0")
        simulate(kernel, args, {}, checks_spec="all", target=target)
    texts = [str(w.message) for w in ws if issubclass(w.category, NKIWarning)]
    assert len(texts) == 1 and issubclass(ws[-1].category, NKIRuleWarning), texts
    msg = texts[0]
    what = msg[msg.index(" overflow: ") - 4:]
    assert what.startswith(("SBUF overflow", "PSUM overflow")), msg
    assert what in raises("nkisim_strict_rule", body, *args, target=target, strict=True)
    return msg


def collect_warnings(body, *args, checks="all"):
    kernel = nki.jit(body)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always", NKIWarning)
        out = simulate(kernel, args, {}, checks_spec=checks)
    return out, [w for w in ws if issubclass(w.category, NKIWarning)]


# ---------------------------------------------------------------------------------------------
# selecting checks


def test_parse_checks():
    assert parse_checks(None) == parse_checks("all") == frozenset(ALL_CHECKS)
    assert parse_checks("none") == frozenset()
    assert parse_checks("uninit,races") == {"uninit", "races"}
    assert parse_checks("-races,-capacity") == frozenset(ALL_CHECKS) - {"races", "capacity"}
    with pytest.raises(ValueError, match="unknown nkisim check"):
        parse_checks("-speling")


def test_all_checks_are_on_by_default(monkeypatch):
    monkeypatch.delenv("NKISIM_CHECKS", raising=False)
    kernel = nki.jit(_waw_same_output_location)
    with pytest.raises(SyntaxError):
        kernel(rand(128, 512))
    monkeypatch.setenv("NKISIM_CHECKS", "-races")
    kernel(rand(128, 512))
    assert "races" not in kernel.last_run.checks


# ---------------------------------------------------------------------------------------------
# races in affine_range: output dependencies (WAW)


def _waw_same_output_location(a):
    out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=a[:, i * 128:(i + 1) * 128], dst=t)
        nisa.dma_copy(src=t, dst=out)       # every iteration writes the same place
    return out


def test_output_dependency_names_loop_tensor_region_and_iterations():
    msg = raises("err_unexpected_output_dependencies", _waw_same_output_location, rand(128, 512))
    m = re.match(r"Unexpected output dependencies, different iterations of the `i` loop "
                 r"\(affine_range at test_checks\.py:(\d+)\) write to `out\[0:128, 0:128\]`: "
                 r"iteration 1 \('dma_copy' at test_checks\.py:(\d+)\) writes what iteration 0 "
                 r"wrote; ", msg)
    assert m, msg
    assert int(m.group(2)) == int(m.group(1)) + 3       # the store, three lines below the loop


def test_output_dependency_region_is_in_tensor_coordinates():
    def body(a):
        out = nl.ndarray((256, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(src=a[0:128, :], dst=out[0:128, :])
        for i in nl.affine_range(3):
            t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(src=a[0:128, 0:64], dst=t)
            nisa.dma_copy(src=t, dst=out[128:256, 64 + 32 * i:128 + 32 * i])   # overlap by 32
        return out

    msg = raises("err_unexpected_output_dependencies", body, rand(256, 512))
    assert "write to `out[128:256, 96:128]`: iteration 1" in msg and "iteration 0 wrote" in msg


@pytest.mark.parametrize("kind", ["sequential_range", "static_range"])
def test_ordered_loops_may_write_the_same_location(kind):
    def body(a):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in getattr(nl, kind)(4):
            t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(src=a[:, i * 128:(i + 1) * 128], dst=t)
            nisa.dma_copy(src=t, dst=out)
        return out

    a = rand(128, 512)
    out, _ = run(body, a)
    assert np.array_equal(out, a[:, 384:512])           # the last iteration wins, in order


def test_disjoint_output_slices_and_fresh_tiles_per_iteration_are_fine():
    def body(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(4):
            t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)   # new storage
            nisa.dma_copy(src=a[:, i * 128:(i + 1) * 128], dst=t)
            r = nisa.tensor_scalar(t, nl.multiply, 2.0)
            nisa.dma_copy(src=r, dst=out[:, i * 128:(i + 1) * 128])
        return out

    a = rand(128, 512)
    out, _ = run(body, a)
    assert np.array_equal(out, 2 * a)


def test_memset_of_a_shared_tile_in_every_iteration_is_an_output_dependency():
    def body():
        a = nl.ndarray((4, 4), dtype=nl.float32)
        for _ in nl.affine_range(4):
            a[0:1, :] = 0.0                  # the reference's own example (ref §1.5)

    raises("err_unexpected_output_dependencies", body)


# ---------------------------------------------------------------------------------------------
# races in affine_range: loop-carried dependencies (RAW)


def _sbuf_reduction(a):
    out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 1), dtype=nl.float32, buffer=nl.sbuf)
    for k in nl.affine_range(4):
        t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=a[:, k * 128:(k + 1) * 128], dst=t)
        s = nisa.tensor_reduce(nl.add, t, axis=1, keepdims=True)
        total = nisa.tensor_tensor(acc, s, nl.add)     # the partial sum, into another tile
        acc[...] = nl.copy(total)
    nisa.dma_copy(src=acc, dst=out)
    return out


def test_loop_carried_dependency_names_loop_reader_tensor_region_and_iterations():
    msg = raises("nkisim_loop_carried_dependency", _sbuf_reduction, rand(128, 512))
    assert re.match(r"loop-carried dependency in the `k` loop \(affine_range at "
                    r"test_checks\.py:\d+\): 'tensor_tensor' at test_checks\.py:\d+ in "
                    r"iteration 1 reads `acc\[0:128, 0:1\]`, written by iteration 0; ", msg), msg


def test_the_same_reduction_in_sequential_range_is_fine():
    def body(a):
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        for k in nl.sequential_range(4):
            t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(src=a[:, k * 128:(k + 1) * 128], dst=t)
            s = nisa.tensor_reduce(nl.add, t, axis=1, keepdims=True)
            acc[...] = nisa.tensor_tensor(acc, s, nl.add)
        nisa.dma_copy(src=acc, dst=out)
        return out

    a = rand(128, 512)
    out, _ = run(body, a)
    np.testing.assert_allclose(out[:, 0], a.sum(axis=1), rtol=1e-5)


def test_reading_another_iterations_slice_is_a_dependency():
    def body(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(4):
            nisa.dma_copy(src=a[:, i * 128:(i + 1) * 128], dst=buf[:, i * 128:(i + 1) * 128])
            j = max(i - 1, 0)                                    # the previous iteration's
            nisa.dma_copy(src=buf[:, j * 128:(j + 1) * 128], dst=out[:, i * 128:(i + 1) * 128])
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NKIWarning)        # max() on the loop variable
        with pytest.raises(ValueError) as info:
            simulate(nki.jit(body), (rand(128, 512),), {}, checks_spec="all")
    assert info.value.nki_code == "nkisim_loop_carried_dependency"
    assert "iteration 1 reads `buf[0:128, 0:128]`, written by iteration 0" in str(info.value)


def test_partial_writes_after_a_whole_write_are_still_tracked():
    """The per-tensor summaries (a tile written as a whole has one epoch) must not hide the
    iterations' partial writes."""
    def body(a, read_back=False):
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        buf[...] = 0.0                                       # the whole tile, before the loop
        for i in nl.affine_range(2):
            if read_back:
                t = nisa.tensor_copy(buf[:, 0:128])         # iteration 1 reads iteration 0's
                buf[:, 128 * i:128 * (i + 1)] = nisa.tensor_scalar(t, nl.add, 1.0)
            else:
                buf[:, 0:128] = nisa.tensor_scalar(_load(a[:, 0:128]), nl.add, 1.0)
        nisa.dma_copy(src=buf, dst=out)
        return out

    msg = raises("err_unexpected_output_dependencies", body, rand(128, 256))
    assert "write to `buf[0:128, 0:128]`: iteration 1" in msg
    msg = raises("nkisim_loop_carried_dependency", body, rand(128, 256), read_back=True)
    assert "iteration 1 reads `buf[0:128, 0:128]`, written by iteration 0" in msg


def test_tile_written_before_the_loop_and_read_inside_is_fine():
    def body(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        w = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=a[:, 0:128], dst=w)
        for i in nl.affine_range(4):
            t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(src=a[:, i * 128:(i + 1) * 128], dst=t)
            r = nisa.tensor_tensor(w, t, nl.add)
            nisa.dma_copy(src=r, dst=out[:, i * 128:(i + 1) * 128])
        return out

    a = rand(128, 512)
    out, _ = run(body, a)
    assert np.array_equal(out, a + np.tile(a[:, :128], 4))


def test_nested_loops_filling_a_stage_then_reading_it_are_fine():
    def body(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            stage = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
            for j in nl.affine_range(2):
                c0 = (2 * i + j) * 128
                stage[:, j * 128:(j + 1) * 128] = nisa.tensor_scalar(_load(a[:, c0:c0 + 128]),
                                                                     nl.add, 1.0)
            nisa.dma_copy(src=stage, dst=out[:, i * 256:(i + 1) * 256])
        # a later loop reads what the earlier loops wrote: ordered by program order
        for i in nl.affine_range(2):
            t = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(src=out[:, (1 - i) * 256:(2 - i) * 256], dst=t)
        return out

    a = rand(128, 512)
    out, _ = run(body, a)
    assert np.array_equal(out, a + np.float32(1))


@nki.jit
def _load(src):
    """A kernel called from a kernel (runs inline): load an HBM slice into a new tile."""
    t = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=src, dst=t)
    return t


def test_sequential_loop_inside_affine_loop_is_ordered():
    def body(a):
        out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            acc = nl.zeros((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            for k in nl.sequential_range(2):
                c0 = (2 * i + k) * 128
                s = nisa.tensor_reduce(nl.add, _load(a[:, c0:c0 + 128]), axis=1, keepdims=True)
                acc[...] = nisa.tensor_tensor(acc, s, nl.add)
            nisa.dma_copy(src=acc, dst=out[:, i:i + 1])
        return out

    a = rand(128, 512)
    out, _ = run(body, a)
    np.testing.assert_allclose(out, a.reshape(128, 2, 256).sum(axis=2), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# the PSUM accumulation pattern (ref §1.9, §1.11)


def _matmul_acc(a, read_inside=False, zero_outside_outer=False):
    out = nl.ndarray((2, 128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    if zero_outside_outer:
        acc = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
    for j in nl.affine_range(2):
        if not zero_outside_outer:
            acc = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            t = _load(a[:, (2 * j + k) * 128:(2 * j + k + 1) * 128])
            acc += nisa.nc_matmul(t, t)
            if read_inside:
                r = nisa.tensor_copy(acc)
        if not read_inside:
            r = nisa.tensor_copy(acc)
        nisa.dma_copy(src=r, dst=out[j])
    return out


def test_psum_matmul_accumulation_in_affine_range_is_exempt():
    a = rand(128, 512)
    out, _ = run(_matmul_acc, a)
    blocks = [a[:, 128 * c:128 * (c + 1)].astype(np.float64) for c in range(4)]
    want = np.stack([blocks[0].T @ blocks[0] + blocks[1].T @ blocks[1],
                     blocks[2].T @ blocks[2] + blocks[3].T @ blocks[3]])
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_reading_the_accumulator_inside_the_accumulation_loop_is_a_dependency():
    msg = raises("nkisim_loop_carried_dependency", _matmul_acc, rand(128, 512),
                 read_inside=True)
    assert "the `k` loop" in msg and "iteration 1 reads `acc[0:128, 0:128]`" in msg


def test_accumulator_zeroed_outside_the_outer_loop_is_a_dependency_of_that_loop():
    msg = raises("nkisim_loop_carried_dependency", _matmul_acc, rand(128, 512),
                 zero_outside_outer=True)
    assert "the `j` loop" in msg and "iteration 1 reads `acc[0:128, 0:128]`" in msg
    assert "written by iteration 0" in msg


def test_accumulating_across_loops_read_after_all_of_them_is_fine():
    def body(a):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
        for j in nl.affine_range(2):
            for k in nl.affine_range(2):
                t = _load(a[:, (2 * j + k) * 128:(2 * j + k + 1) * 128])
                acc += nisa.nc_matmul(t, t)
        nisa.dma_copy(src=nisa.tensor_copy(acc), dst=out)
        return out

    a = rand(128, 512).astype(np.float64)
    out, _ = run(body, a.astype(np.float32))
    want = sum(a[:, 128 * c:128 * (c + 1)].T @ a[:, 128 * c:128 * (c + 1)] for c in range(4))
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_matmul_assigned_instead_of_accumulated_is_an_output_dependency():
    def body(a):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(4):
            t = _load(a[:, k * 128:(k + 1) * 128])
            acc[...] = nisa.nc_matmul(t, t)
        nisa.dma_copy(src=nisa.tensor_copy(acc), dst=out)
        return out

    msg = raises("err_unexpected_output_dependencies", body, rand(128, 512))
    assert "write to `acc[0:128, 0:128]`: iteration 1 ('nc_matmul'" in msg


# ---------------------------------------------------------------------------------------------
# SPMD grids: instances are checked like affine_range iterations over program ids


def _spmd(a, same_tile=False, read_other=False):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    c = 0 if same_tile else i
    t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(src=a[:, i * 128:(i + 1) * 128], dst=t)
    nisa.dma_copy(src=t, dst=out[:, c * 128:(c + 1) * 128])
    if read_other and i > 0:
        u = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=out[:, 0:128], dst=u)        # what instance 0 wrote
    return out


def test_spmd_instances_writing_disjoint_slices_are_fine():
    a = rand(128, 512)
    out = simulate(nki.jit(_spmd)[4], (a,), {}, checks_spec="all")
    assert np.array_equal(out, a)


def test_spmd_instances_writing_the_same_location_is_an_output_dependency():
    kernel = nki.jit(_spmd)[4]
    with pytest.raises(SyntaxError) as info:
        simulate(kernel, (rand(128, 512),), {"same_tile": True}, checks_spec="all")
    assert info.value.nki_code == "err_unexpected_output_dependencies"
    assert re.search(r"different iterations of the SPMD grid \(program instances of the kernel "
                     r"at test_checks\.py:\d+\) write to `out\[0:128, 0:128\]`: program id "
                     r"\(1,\) \('dma_copy' at test_checks\.py:\d+\) writes what program id "
                     r"\(0,\) wrote", str(info.value)), str(info.value)


def test_spmd_instance_reading_another_instances_output_is_a_dependency():
    kernel = nki.jit(_spmd)[2]
    with pytest.raises(ValueError) as info:
        simulate(kernel, (rand(128, 512),), {"read_other": True}, checks_spec="all")
    assert info.value.nki_code == "nkisim_loop_carried_dependency"
    assert "in program id (1,) reads `out[0:128, 0:128]`, written by program id (0,)" in \
        str(info.value)


# ---------------------------------------------------------------------------------------------
# uninitialized reads


def test_uninitialized_read_names_tensor_region_and_line():
    def body(a):
        out = nl.ndarray((64, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=a[:, 0:32], dst=buf[:, 0:32])
        r = nisa.tensor_copy(buf[64:128, 16:48])         # columns 32:48 never written
        nisa.dma_copy(src=r[:, 16:32], dst=out)          # the garbage leaves the chip
        return out

    msg = raises("nkisim_uninitialized_read", body, rand(128, 64))
    assert re.fullmatch(r"read of uninitialized memory: 'tensor_copy' at test_checks\.py:\d+ "
                        r"reads `buf\[64:128, 32:48\]` \(1024 of 2048 elements never "
                        r"written\)\.", msg), msg


def test_views_made_before_a_partial_write_see_its_epochs():
    """A tile starts with a lazy shadow (one epoch for every element, nkisim.checks.LAZY); the
    first partial write gives it element-wise epochs, which views made before that write see
    too: the same verdicts and messages as an element-wise shadow from the start."""
    def body(a):
        out = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        bad = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        left, right = buf[:, 0:32], buf[:, 16:48]          # views of the lazy tile
        nisa.dma_copy(src=a[:, 0:32], dst=left)             # a partial write materializes
        nisa.dma_copy(src=nisa.tensor_copy(left), dst=out)  # fine: written
        r = nisa.tensor_copy(right)                         # columns 32:48 never written
        nisa.dma_copy(src=r[:, 16:32], dst=bad)             # ... and stored
        return out, bad

    msg = raises("nkisim_uninitialized_read", body, rand(128, 64))
    assert "reads `buf[0:128, 32:48]` (2048 of 4096 elements never written)" in msg, msg

    lazy = []

    def whole(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)                       # written whole: no element-wise shadow
        u = nisa.tensor_tensor(t, t, op=nl.add)
        part = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        part[:, 0:32] = nl.copy(t[:, 0:32])  # written in part: a box (nkisim.checks)
        lazy.extend((x.root.shadow is None, x.root.boxes is not None) for x in (t, u, part))
        part[0:64, 0:32:2] = nl.copy(t[0:64, 0:32:2])   # not a box: element-wise epochs
        lazy.append((part.root.shadow is None, part.root.boxes is not None))
        nl.store(out, u)
        return out

    a = rand(128, 64)
    got, _ = run(whole, a)
    np.testing.assert_array_equal(got, a + a)
    assert lazy == [(True, False), (True, False), (True, True), (False, False)]


def test_never_written_values_are_an_error_only_when_they_reach_hbm():
    """On the device an instruction reading never-written SBUF computes garbage in the result
    elements that came from it; that only matters if they are stored (AWS's tutorials/layernorm
    with nrows % 128 != 0: row-wise ops on rows a masked load skipped, masked store)."""
    def body(a):
        out = nl.ndarray((200, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        ip, jf = nl.mgrid[0:128, 0:64]
        for i in nl.affine_range(2):
            x = nl.load(a[i * 128 + ip, jf], mask=(i * 128 + ip < 200))
            m = nl.mean(x, axis=1)                       # reads rows the load skipped
            y = nl.subtract(x, m)
            nl.store(out[i * 128 + ip, jf], value=y, mask=(i * 128 + ip < 200))
        return out

    a = rand(200, 64)
    out, _ = run(body, a)
    assert np.allclose(out, a - a.mean(1, keepdims=True), atol=1e-6)

    def unmasked_store(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        ip, jf = nl.mgrid[0:128, 0:64]
        x = nl.load(a[ip, jf], mask=(ip < 100))
        y = nl.multiply(nl.exp(x), 2.0)
        nl.store(out, value=y)                          # rows 100:128 are garbage
        return out

    # Stored unmasked, rows 100:128 are garbage in the output: the caller may read back only
    # rows 0:100 (AWS's nc_match_replace8 mask doc test does so), so a warning naming the
    # read, and the garbage is nkisim's poison (NaN) so a comparison of the whole fails.
    a = rand(128, 64)
    out, ws = collect_warnings(unmasked_store, a)
    assert len(ws) == 1, ws
    msg = str(ws[0].message)
    assert "only partly written: 1792 of 8192 elements (region [100:128, 0:64])" in msg, msg
    assert "'exp'" in msg and "`x[100:128, 0:64]`" in msg, msg
    np.testing.assert_allclose(out[:100], 2 * np.exp(a[:100]), rtol=1e-6)
    assert np.isnan(out[100:]).all()

    def all_garbage(a):
        out = nl.ndarray((28, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        ip, jf = nl.mgrid[0:128, 0:64]
        x = nl.load(a[ip, jf], mask=(ip < 100))
        y = nl.multiply(nl.exp(x), 2.0)
        nl.store(out, value=y[100:128, :])              # nothing but garbage: the error
        return out

    msg = raises("nkisim_uninitialized_read", all_garbage, rand(128, 64))
    assert "'exp'" in msg and "`x[100:128, 0:64]`" in msg, msg


def test_garbage_stored_into_an_integer_output_is_poison():
    """Garbage computed into plausible numbers (an int cast) is still poison in the output."""
    def body(a):
        out = nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.shared_hbm)
        ip, jf = nl.mgrid[0:128, 0:8]
        x = nl.load(a[ip, jf], mask=(ip < 64))
        nl.store(out, value=nl.copy(nl.greater(x, 0.5), dtype=nl.int32))
        return out

    a = rand(128, 8)
    out, ws = collect_warnings(body, a)
    assert len(ws) == 1 and "only partly written" in str(ws[0].message)
    np.testing.assert_array_equal(out[:64], (a[:64] > 0.5).astype(np.int32))
    assert (out[64:] == 4).all()                          # nkisim's int poison (ref §4.2)


def test_garbage_stored_into_a_kernel_argument_is_an_error():
    """A kernel argument is the caller's memory: no output check follows, so the error is at
    the store (nki.trace kernels write their outputs through arguments)."""
    @nki.trace
    def k(a, b):
        ip, jf = nl.mgrid[0:128, 0:8]
        x = nl.load(a[ip, jf], mask=(ip < 64))
        nl.store(b, value=nl.exp(x))

    with pytest.raises(ValueError) as info:
        nki.simulate_kernel(k, rand(128, 8), np.zeros((128, 8), np.float32))
    assert info.value.nki_code == "nkisim_uninitialized_read"


def test_psum_accumulation_into_ndarray_starts_with_an_overwrite():
    """`acc += nc_matmul(...)` into an nl.ndarray PSUM tile: the first matmul of the group
    overwrites (arch guide, "Near-memory accumulation in PSUM"; AWS's
    tutorials/attention_fwd_performance v8a+ and reference/allocated_fused_linear.py do this).
    The docs' pattern starts from nl.zeros: a tolerated rule (warning, error in strict mode)."""
    def body(a):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            t = _load(a[:, k * 128:(k + 1) * 128])
            acc += nisa.nc_matmul(t, t)
        nisa.dma_copy(src=nisa.tensor_copy(acc), dst=out)
        return out

    a = rand(128, 256)
    out, ws = collect_warnings(body, a)
    want = a[:, :128].T @ a[:, :128] + a[:, 128:].T @ a[:, 128:]
    assert np.allclose(out, want, rtol=1e-5)
    assert len(ws) == 1 and issubclass(ws[0].category, NKIRuleWarning)
    assert str(ws[0].message).startswith("NKI rule the device tolerates")
    assert '"condition 1: a psum buffer with zeros"' in str(ws[0].message)
    assert "trainium_inferentia2_arch.html#near-memory-accumulation-in-psum" in \
        str(ws[0].message)
    msg = raises("nkisim_strict_rule", body, a, strict=True)
    assert msg.startswith("strict mode (NKISIM_STRICT=1)")


# ---------------------------------------------------------------------------------------------
# outputs not written


def test_handout_stream_with_free_dim_1000_at_25600_writes_nothing():
    from nkisim import shim
    shim.install()
    from fixtures.handout import make_vector_add_stream
    kernel = make_vector_add_stream(1000)
    a, b = rand(25600), rand(25600)
    with pytest.raises(ValueError) as info:
        simulate(kernel, (a, b), {}, checks_spec="all")
    assert info.value.nki_code == "err_tensor_output_not_written_to"
    assert str(info.value).startswith(
        "Output tensor `out` was never written to: all 25600 elements (region [0:128, 0:200]) "
        "of shape [128, 200] (returned as [25600])")
    out = simulate(kernel, (a, b), {}, checks_spec="-outputs")
    assert np.isnan(out).all()


def test_partially_written_output_reports_the_unwritten_region():
    def body(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(3):                     # misses the last 128 columns
            nisa.dma_copy(src=_load(a[:, i * 128:(i + 1) * 128]),
                          dst=out[:, i * 128:(i + 1) * 128])
        return out

    # A partly written output is a warning, not err_tensor_output_not_written_to (the doc's
    # error is for an output "never written to"; AWS's CI-tested `example_indirect_save_1/2`
    # return a [128, 512] output with only its even rows written). The unwritten part keeps
    # the poison, so comparing the whole result still fails.
    a = rand(128, 512)
    out, ws = collect_warnings(body, a)
    assert [str(w.message) for w in ws] == [
        "suspicious pattern: output tensor `out` is only partly written: 16384 of 65536 "
        "elements (region [0:128, 384:512]) of shape [128, 512] hold no value written by the "
        "kernel (garbage on device): a loop bound or tail that misses part of the output, "
        "unless the caller reads back only the written part"]
    # located at the output's allocation in the kernel, not at the caller's line
    assert ws[0].filename == __file__
    assert ws[0].lineno == body.__code__.co_firstlineno + 1
    np.testing.assert_array_equal(out[:, :384], a[:, :384])
    assert np.isnan(out[:, 384:]).all()


def test_indirect_store_to_every_other_row_is_accepted():
    # Reproducer of AWS's doc example `example_indirect_save_2` (aws-neuron-sdk 1db4d74e,
    # nki/test/test_nki_nl_load_store_indirect.py): 64 rows stored to rows 0, 2, ..., 126 of a
    # [128, 512] output through an iota index tile; the test reads back out[idx].
    def body(a):
        out = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        idx = nisa.iota(2 * nl.arange(64)[:, None], dtype=np.int32)
        nl.store(out[idx, nl.arange(16)[None, :]], value=nl.load(a))
        return out

    a = rand(64, 16)
    out, ws = collect_warnings(body, a)
    assert len(ws) == 1 and "only partly written: 1024 of 2048 elements" in str(ws[0].message)
    np.testing.assert_array_equal(out[0::2], a)
    assert np.isnan(out[1::2]).all()


# ---------------------------------------------------------------------------------------------
# scope: tiles of a loop body live for one iteration (ref §1.9)


def test_tile_used_after_its_loop_is_out_of_scope():
    def body(a):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            t = _load(a[:, i * 128:(i + 1) * 128])
        nisa.dma_copy(src=t, dst=out)
        return out

    a = rand(128, 256)
    msg = raises("err_local_variable_used_out_of_scope", body, a)
    assert msg.startswith("Local variable 't' is referenced outside of its parent scope")
    out, _ = run(body, a, checks="-scope")
    assert np.array_equal(out, a[:, 128:256])


def test_static_range_tiles_are_unrolled_and_stay_in_scope():
    def body(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        tiles = []
        for i in nl.static_range(4):
            tiles.append(_load(a[:, i * 128:(i + 1) * 128]))
        for i in nl.affine_range(4):
            nisa.dma_copy(src=tiles[i], dst=out[:, i * 128:(i + 1) * 128])
        return out

    a = rand(128, 512)
    out, r = run(body, a)
    assert np.array_equal(out, a)
    assert r.memory.summary()["peak_sbuf_bytes_per_partition"] == 4 * 128 * F32


# ---------------------------------------------------------------------------------------------
# writes to inputs


@pytest.mark.parametrize("how", ["dma_copy", "store", "assignment"])
def test_writing_an_input_is_rejected(how):
    def body(a):
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=a, dst=t)
        if how == "dma_copy":
            nisa.dma_copy(src=t, dst=a)
        elif how == "store":
            nl.store(a, value=t)
        else:
            a[...] = t
        return a

    a = rand(128, 64)
    before = a.copy()
    msg = raises("err_cannot_update_immutable_parameter", body, a)
    assert msg.startswith("Cannot update immutable parameter `a`")
    assert np.array_equal(a, before)


# ---------------------------------------------------------------------------------------------
# capacity (ref §1.4, §3.1)


def test_peak_counts_declared_tiles_and_instruction_results():
    def body(a):
        out = nl.ndarray((128, 1024), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        out2 = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf)        # 4096 B
        nisa.dma_copy(src=a, dst=x)
        y = nisa.tensor_scalar(x, nl.multiply, 2.0)                           # + 4096 B
        z = nisa.tensor_scalar(y, nl.add, 1.0, dtype=nl.bfloat16)            # + 2048 B
        w = nisa.tensor_tensor(x, y, nl.add)      # last use of x, y: w takes their place
        nisa.dma_copy(src=z, dst=out)
        nisa.dma_copy(src=w, dst=out2)
        return out, out2

    _, r = run(body, rand(128, 1024))
    summary = r.memory.summary()
    assert summary["peak_sbuf_bytes_per_partition"] == 1024 * (4 + 4 + 2)
    assert r.trace.peak_sbuf_bytes == 1024 * (4 + 4 + 2)
    assert summary["sbuf_usable_bytes_per_partition"] == 224 * 1024
    assert summary["peak_psum_banks"] == 0 and summary["psum_banks"] == 8


def test_retargeted_result_tile_is_not_counted():
    def body(a):
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=a, dst=x)
        x[...] = nisa.tensor_scalar(x, nl.multiply, 2.0)     # writes x in place
        nisa.dma_copy(src=x, dst=out)
        return out

    a = rand(128, 1024)
    out, r = run(body, a)
    assert np.array_equal(out, 2 * a)
    assert r.memory.summary()["peak_sbuf_bytes_per_partition"] == 1024 * F32


def test_tiles_are_released_at_the_end_of_their_iteration_and_when_unreachable():
    def body(a):
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        keep = []
        for i in nl.affine_range(8):
            t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(src=a[:, i * 128:(i + 1) * 128], dst=t)
            keep.append(t)                                   # reachable, but out of scope
            nisa.dma_copy(src=t, dst=out[:, i * 128:(i + 1) * 128])
        big = nl.ndarray((128, 4096), dtype=nl.float32, buffer=nl.sbuf)
        del big                                              # unreachable: freed
        big2 = nl.ndarray((128, 4096), dtype=nl.float32, buffer=nl.sbuf)
        del big2
        return out

    _, r = run(body, rand(128, 1024))
    assert r.memory.summary()["peak_sbuf_bytes_per_partition"] == 4096 * F32
    assert r.memory.sbuf_live == 0


def test_psum_banks_are_counted_per_tile():
    def body(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = _load(a[:, 0:128])
        p1 = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)      # a full bank
        p2 = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.psum)       # a bank too
        p1 += nisa.nc_matmul(t, _load(a[:, 0:512]))
        p2[...] = nisa.nc_matmul(t, _load(a[:, 0:64]))
        nisa.dma_copy(src=nisa.tensor_copy(p1), dst=out)
        return out

    _, r = run(body, rand(128, 512))
    assert r.memory.summary()["peak_psum_banks"] == 2


def test_sbuf_overflow_names_the_largest_live_tensors():
    def body(a):
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        w = nl.ndarray((128, 100, 256), dtype=nl.float32, buffer=nl.sbuf)   # 102400 B
        x = nl.ndarray((128, 24, 1024), dtype=nl.float32, buffer=nl.sbuf)   # 98304 B
        y = nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.sbuf)       # 32768 B: over
        w[...] = 1.0
        x[...] = 2.0
        y[...] = 3.0                     # w and x are read later: all three live here
        for t in (w, x, y):
            nisa.dma_copy(src=t[:, 0, 0] if t is not y else t[:, 0], dst=out)
        return out

    msg = spills(body, rand(1))
    assert ("SBUF overflow: live tensors need 233472 bytes per partition at once, more than the "
            "229376 usable bytes per partition of trn2; the compiler spills") in msg
    largest = msg.split("Largest live tensors: ")[1].split("; the rule: ")[0]
    assert re.fullmatch(r"`w` \[128, 100, 256\] float32: 102400 B \(test_checks\.py:\d+\); "
                        r"`x` \[128, 24, 1024\] float32: 98304 B \(test_checks\.py:\d+\); "
                        r"`y` \[128, 8192\] float32: 32768 B \(test_checks\.py:\d+\)", largest)


def test_trn2_usable_sbuf_is_the_documented_224_kib():
    """No trn2 SBUF reservation is documented (physical 224 KiB per partition, trainium2 arch
    guide) and a CS149 solution using 215,572 B per partition ran on a trn2 (issue 8)."""
    def body(a):
        out = nl.ndarray((128, 53893), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 53893), dtype=nl.float32, buffer=nl.sbuf)     # 215572 B
        nisa.dma_copy(src=a, dst=t)
        nisa.dma_copy(src=t, dst=out)
        return out

    a = rand(128, 53893)
    out, r = run(body, a)
    assert np.array_equal(out, a) and r.memory.peak_sbuf == 215572


def test_a_broadcast_to_view_is_not_a_buffer():
    """`t.broadcast_to(shape)` "Return a new view of the tensor, no copy will occur"
    (nki.tensor.broadcast_to); AWS's tutorials/layernorm broadcasts gamma this way."""
    def body(g, x):
        out = nl.ndarray((128, 4096), dtype=nl.float32, buffer=nl.shared_hbm)
        gt = nl.load(g)                                                  # [1, 4096]
        gb = gt.broadcast_to((128, 4096))
        xt = nl.load(x)
        nl.store(out, nl.add(gb, xt))
        nl.store(out, nl.add(gb, xt))    # gt and xt are live while the first sum is
        return out

    g, x = rand(1, 4096), rand(128, 4096)
    out, r = run(body, g, x)
    assert np.array_equal(out, g + x)
    assert r.memory.peak_sbuf == 3 * 4096 * 4            # gt, x tile, the sum: no [128, F] copy


def test_capacity_counts_lifetimes_not_python_references():
    """Conformance repro r15 (AWS tutorials/layernorm shape): tiles the kernel still holds in
    variables but never touches again do not occupy SBUF; an instruction's result may take the
    place of the operands it reads for the last time (in-place ops are legal on the engines)."""
    def body(x, g):
        out = nl.ndarray((128, 12000), dtype=nl.float32, buffer=nl.shared_hbm)
        xt = nl.load(x)                                  # 160000 B
        gt = nl.load(g)                                  #  48000 B: 208000 B live
        s = nl.add(gt.broadcast_to((128, 12000)), xt[:, 0:12000])   # xt, gt: last use
        nl.store(out, s)
        t = nl.multiply(s, 2.0)                          # xt still referenced, dead
        nl.store(out, t)
        return out

    x, g = rand(128, 40000), rand(1, 12000)
    out, r = run(body, x, g)
    assert np.array_equal(out, 2 * (g + x[:, :12000]))
    assert r.memory.peak_sbuf == 208000


def test_capacity_counts_a_tile_until_its_last_use():
    """The same tiles overflow when the first one is read again after the others exist."""
    def body(x, g):
        out = nl.ndarray((128, 12000), dtype=nl.float32, buffer=nl.shared_hbm)
        xt = nl.load(x)                                  # 160000 B
        gt = nl.load(g)
        gb = gt.broadcast_to((128, 12000))
        s = nl.add(gb, xt[:, 0:12000])                  # xt and gt live with s: 256000 B
        nl.store(out, nl.add(nl.add(s, xt[:, 12000:24000]), gb))
        return out

    msg = spills(body, rand(128, 40000), rand(1, 12000))
    assert "need 256000 bytes per partition" in msg and "`xt` [128, 40000]" in msg


@pytest.mark.parametrize("target, fits", [("trn1", False), ("trn2", True)])
def test_sbuf_limit_depends_on_the_target(target, fits):
    def body():
        t = nl.ndarray((128, 180 * 256), dtype=nl.float32, buffer=nl.sbuf)    # 180 KiB
        t[...] = 0.0

    if fits:
        run(body, target=target)
    else:
        msg = raises("nkisim_sbuf_overflow", body, target=target)
        assert "more than the 180224 usable bytes per partition of trn1" in msg
        run(body, target=target, checks="-capacity")


def _tiles_live_at_once(parts):
    """64 KiB-per-partition fp32 tiles live at once, one on each of ``parts`` partitions (four
    like AWS's rope kernel at its largest filtered size)."""
    def body():
        out = nl.ndarray((1, len(parts)), dtype=nl.float32, buffer=nl.shared_hbm)
        tiles = []
        for p in parts:
            t = nl.ndarray((p, 16384), dtype=nl.float32, buffer=nl.sbuf)         # 64 KiB
            t[...] = 1.0
            tiles.append(t)
        for i, t in enumerate(tiles):        # all four are read after the last one is written
            nisa.dma_copy(src=t[0:1, 0:1], dst=out[0:1, i:i + 1])
        return out
    return body


def test_sbuf_capacity_is_per_partition():
    """(64, F) tiles occupy 64 partitions: three of them and a 128-partition tile fit in
    trn2's 224 KiB per partition (counting all four on every partition needs 256 KiB). Any
    placement needs at least 64 KiB (the full tile) + 3 x 64 KiB x 64 / 128 = 160 KiB on its
    fullest partition (two side by side and one more reach 192 KiB: still fits)."""
    out, r = run(_tiles_live_at_once((128, 64, 64, 64)), target="trn2")
    assert np.all(out == 1.0)
    # the bound: (128 + 3 * 64) * 64 KiB / 128 partitions
    assert r.memory.summary()["peak_sbuf_bytes_per_partition"] == 160 * 1024


def test_sbuf_capacity_tiles_on_more_than_half_the_partitions_share_one():
    """Four tiles of 65 partitions pairwise overlap, so one partition holds all 256 KiB."""
    msg = spills(_tiles_live_at_once((128, 65, 65, 65)), target="trn2")
    assert "need 262144 bytes per partition" in msg and "[65, 16384]" in msg


def test_sbuf_capacity_small_tiles_overflow_when_their_total_does_not_fit():
    """Sixteen (32, F) tiles of 64 KiB spread over 128 partitions need 256 KiB on average."""
    msg = spills(_tiles_live_at_once((32,) * 16), target="trn2")
    assert "[32, 16384]" in msg


def test_psum_overflow_at_nine_banks():
    def body():
        tiles = []
        for _ in nl.static_range(9):
            tiles.append(nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum))
        for t in tiles:                  # all nine are read after the last one is written
            nisa.tensor_copy(t)

    msg = spills(body)
    assert "PSUM overflow: live tensors need 9 PSUM banks at once, more than the 8 banks" in msg
    assert "9 tiles x 1 bank" in msg
    run(body, checks="-capacity", strict=True)


# ---------------------------------------------------------------------------------------------
# warnings: once per site, and off with the `warnings` check


def _psum_fp16(a):
    out = nl.ndarray((128, 128), dtype=nl.float16, buffer=nl.shared_hbm)
    for _ in nl.affine_range(3):
        acc = nl.zeros((128, 128), dtype=nl.float16, buffer=nl.psum)
        for k in nl.affine_range(2):
            t = _load(a[:, k * 128:(k + 1) * 128])
            acc += nisa.nc_matmul(t, t)
        nisa.dma_copy(src=nisa.tensor_copy(acc), dst=out)   # (the race is not the point)
    return out


def test_psum_accumulator_not_fp32_warns_once_per_site():
    _, ws = collect_warnings(_psum_fp16, rand(128, 256).astype(np.float16), checks="-races")
    assert len(ws) == 1
    assert str(ws[0].message).startswith("suspicious pattern: PSUM accumulator `acc` is float16")
    assert ws[0].filename.endswith("test_checks.py")
    _, ws = collect_warnings(_psum_fp16, rand(128, 256).astype(np.float16),
                             checks="-races,-warnings")
    assert ws == []


def test_python_control_flow_on_a_loop_variable_warns_once_per_site():
    def body(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.sequential_range(4):
            if i == 0:
                pass
            if i > 1:
                pass
            nisa.dma_copy(src=_load(a[:, i * 128:(i + 1) * 128]),
                          dst=out[:, i * 128:(i + 1) * 128])
        return out

    _, ws = collect_warnings(body, rand(128, 512))
    assert len(ws) == 2 and len({w.lineno for w in ws}) == 2
    assert all("Python control flow on an nl.*_range loop variable" in str(w.message)
               for w in ws)
    _, ws = collect_warnings(body, rand(128, 512), checks="-warnings")
    assert ws == []


def test_associative_sbuf_accumulation_in_affine_range_is_allowed():
    """"associative reductions are not considered loop carried dependencies" (nl.affine_range
    docstring); AWS's tutorials/fused_mamba v1 accumulates `scanC_accum += ...` into an SBUF
    tile across affine_range iterations. Reading the partial sum inside the loop still races."""
    def body(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        for s in nl.affine_range(4):
            acc[0:128, 0:64] += nl.load(a[s])
        nl.store(out, acc)
        return out

    a = rand(4, 128, 64)
    out, _ = run(body, a)
    assert np.allclose(out, a.sum(0), rtol=1e-6)

    def reads_partial_sum(a):
        out = nl.ndarray((4, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        for s in nl.affine_range(4):
            acc += nl.load(a[s])
            nl.store(out[s], nl.copy(acc))              # another iteration's partial sum
        return out

    raises("nkisim_loop_carried_dependency", reads_partial_sum, a)

    def subtracts(a):                                   # not associative: a real dependency
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        for s in nl.affine_range(4):
            acc -= nl.load(a[s])
        nl.store(out, acc)
        return out

    raises("nkisim_loop_carried_dependency", subtracts, a)


def test_an_accumulation_spelled_out_is_exempt_as_its_augmented_form():
    """``psum_tile += X`` is ``psum_tile[...] = psum_tile + X`` (reference §1.11), and AWS
    advises ``c[...] = c + a`` or ``c[...] = nl.add(c, a)`` over ``+=`` (aws-neuron-sdk #1051):
    the same associative reduction, exempt as ``acc += x`` is. Storing the partial sum
    anywhere else, or subtracting, still races."""
    a = rand(4, 128, 64)

    def body(form):
        def k(a):
            out = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
            buf = nl.psum if form == "psum" else nl.sbuf
            acc = nl.zeros((64, 64), dtype=nl.float32, buffer=buf)
            for s in nl.affine_range(4):
                t = nl.load(a[s])
                if form == "operator":
                    acc[...] = acc + t[0:64, :]
                elif form == "nl.add":
                    acc[0:64, 0:64] = nl.add(acc[0:64, 0:64], t[0:64, :])
                else:
                    acc[...] = acc + nisa.nc_matmul(t[:, 0:64], t)
            nl.store(out, nl.copy(acc))
            return out
        return k

    for form, want in (("operator", a[:, 0:64].sum(0)), ("nl.add", a[:, 0:64].sum(0)),
                       ("psum", sum(x.T @ x for x in a))):
        out, _ = run(body(form), a)
        np.testing.assert_allclose(out, want, rtol=1e-5)

    def elsewhere(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        other = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        for s in nl.affine_range(4):
            other[...] = acc + nl.load(a[s])            # another iteration's partial sum
            acc[...] = nl.copy(other)
        nl.store(out, acc)
        return out

    raises("nkisim_loop_carried_dependency", elsewhere, a)

    def subtracts(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        for s in nl.affine_range(4):
            acc[...] = acc - nl.load(a[s])
        nl.store(out, acc)
        return out

    raises("nkisim_loop_carried_dependency", subtracts, a)


@pytest.mark.parametrize("form", ["nl.maximum", "nl.minimum", "tensor_tensor max",
                                  "tensor_tensor add"])
def test_a_running_max_or_min_spelled_out_is_exempt_too(form):
    """A running max over affine_range iterations is order-independent like the sum (the ALU
    table lists maximum and minimum as reduction ops): a trn1 conv2d pools that way."""
    a = rand(4, 128, 64)

    def k(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        acc[...] = nl.load(a[0])
        for s in nl.affine_range(3):
            t = nl.load(a[s + 1])
            if form == "nl.maximum":
                acc[...] = nl.maximum(acc, t)
            elif form == "nl.minimum":
                acc[...] = nl.minimum(acc, t)
            elif form == "tensor_tensor max":
                acc[...] = nisa.tensor_tensor(acc, t, op=nl.maximum)
            else:
                acc[...] = nisa.tensor_tensor(acc, t, op=nl.add)
        nl.store(out, acc)
        return out

    ref = {"nl.maximum": np.max, "nl.minimum": np.min, "tensor_tensor max": np.max,
           "tensor_tensor add": np.sum}[form]
    out, _ = run(k, a)
    np.testing.assert_allclose(out, ref(a, axis=0), rtol=1e-6)


def test_control_flow_on_a_tile_value_is_an_error():
    def body(a):
        t = _load(a)
        if t:
            pass

    raises("err_dynamic_control_flow_not_supported", body, rand(1, 1))
    raises("err_ambiguous_tensor_truth_value", body, rand(4, 4))


# ---------------------------------------------------------------------------------------------
# each check can be turned off, independently of the others


def _trips_uninit():
    out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(src=nisa.tensor_copy(t), dst=out)
    return out


def _trips_outputs():
    return nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)


def _trips_capacity():
    t = nl.ndarray((128, 60000), dtype=nl.float32, buffer=nl.sbuf)
    t[...] = 0.0


def _trips_warnings():
    t = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    acc = nl.zeros((128, 128), dtype=nl.bfloat16, buffer=nl.psum)
    acc += nisa.nc_matmul(t, t)


def _trips_inputs(a):
    t = _load(a)
    nisa.dma_copy(src=t, dst=a)


def _trips_scope():
    for _ in nl.affine_range(2):
        t = nl.zeros((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(t)


TRIPS = {"uninit": (_trips_uninit, ()), "races": (_sbuf_reduction, (rand(128, 512),)),
         "outputs": (_trips_outputs, ()), "capacity": (_trips_capacity, ()),
         "warnings": (_trips_warnings, ()), "inputs": (_trips_inputs, (rand(128, 8),)),
         "scope": (_trips_scope, ())}


def test_every_check_has_a_tripwire():
    assert set(TRIPS) == set(ALL_CHECKS)


@pytest.mark.parametrize("check", ALL_CHECKS)
def test_each_check_can_be_turned_off(check):
    body, args = TRIPS[check]
    with pytest.raises((Exception, NKIWarning)):
        run(body, *args)
    run(body, *args, checks=f"-{check}")
    with pytest.raises((Exception, NKIWarning)):
        run(body, *args, checks=check)          # this check alone catches it


def test_writing_an_input_with_the_inputs_check_off_updates_the_array():
    a = rand(128, 8)
    b = a.copy()
    run(_trips_inputs, a, checks="-inputs")
    assert np.array_equal(a, b)                  # the same values were written back


# ---------------------------------------------------------------------------------------------
# never-written columns through a matmul and a copy (AWS reference/allocated_fused_linear.py,
# nki-samples fc5c69f, run by its CI at head_dim 384: weights loaded into a [128, 512] buffer
# with a column mask, the whole buffer multiplied, the PSUM result copied to SBUF, and only the
# valid columns stored with the same mask)


def _masked_weights_matmul(store_all):
    def body(x, w):
        out = nl.ndarray((128, 512 if store_all else 384), dtype=nl.float32,
                         buffer=nl.shared_hbm)
        g = nl.mgrid[0:128, 0:512]
        wbuf = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        wbuf[g.p, g.x] = nl.load(w[g.p, g.x], mask=(g.x < 384))
        ps = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        ps += nisa.nc_matmul(nl.load(x), wbuf)
        res = nl.copy(ps, dtype=nl.float32)
        nl.store(out[g.p, g.x], res, mask=None if store_all else (g.x < 384))
        return out
    return body


def test_never_written_columns_through_matmul_and_copy_stay_in_their_columns():
    x, w = rand(128, 128), rand(128, 512)
    out, _ = run(_masked_weights_matmul(False), x, w)
    np.testing.assert_allclose(out, x.T.astype(np.float64) @ w[:, :384], rtol=1e-5)


def test_storing_the_never_written_columns_is_a_warning_and_poison():
    x, w = rand(128, 128), rand(128, 512)
    out, ws = collect_warnings(_masked_weights_matmul(True), x, w)
    assert len(ws) == 1 and "`wbuf[0:128, 384:512]`" in str(ws[0].message), ws
    np.testing.assert_allclose(out[:, :384], x.T.astype(np.float64) @ w[:, :384], rtol=1e-5)
    assert np.isnan(out[:, 384:]).all()


# ---------------------------------------------------------------------------------------------
# SPMD instances rewriting identical values (AWS test_resize_nearest.py, nki-samples fc5c69f:
# resize_nearest_fixed_dma_kernel launched on a grid of in_b instances loops over every batch)


def _every_instance_writes_everything(shift):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((2, 128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        for b in nl.affine_range(2):
            t = nl.load(a[b])
            nl.store(out[b], nl.add(t, shift * nl.program_id(0)))
        return out
    return kernel


def test_spmd_instances_writing_the_same_values_is_a_warning():
    a = rand(2, 128, 8)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always", NKIWarning)
        out = simulate(_every_instance_writes_everything(0.0)[2], (a,), {}, checks_spec="all")
    np.testing.assert_array_equal(out, a)
    msgs = [str(w.message) for w in ws if issubclass(w.category, NKIWarning)]
    assert any("program instances write the same values to `out`" in m for m in msgs), msgs


def test_spmd_instances_writing_different_values_is_still_an_error():
    with pytest.raises(Exception) as info:
        simulate(_every_instance_writes_everything(1.0)[2], (rand(2, 128, 8),), {},
                 checks_spec="all")
    assert info.value.nki_code == "err_unexpected_output_dependencies", str(info.value)
