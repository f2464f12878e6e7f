"""Instruction results without their intermediate result tile (issue 12): ``acc +=
nisa.nc_matmul(...)``, the current face's destination-passing ISA, and Beta 1's ``t[key] =
op(...)`` (nkisim.dstform; the last two at the end of the file).

``nc_matmul`` returns a ``PendingMatmul`` when its caller's next bytecode is ``+=``; ``inplace``
adds it without building the result tile (nkisim.tensor, "acc += nisa.nc_matmul(...) without the
intermediate result tile"). Every test runs its kernel twice, with that path and with it turned
off (``engines._iadd_follows`` answering False: the general path, result tile and all), and
compares what a user or a later stage can see: the outputs, the error, the warnings, every trace
record (regions, detail, loops, line, index), the lifetimes, the memory clock, the peaks. The
tests also check that the path is taken where it should be, so they cannot pass by never
exercising it.
"""

import builtins
import functools
import warnings

import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim import dstform, engines, runtime
from nkisim import nki as nki_face
from nkisim import ops as ops_mod
from nkisim import tensor as tensor_mod
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl
from nkisim.beta1 import simulate_kernel
from nkisim.nki import isa as nki_isa


def _digest(run):
    hbm = {}        # HBM regions are keyed by a process-wide allocation id: numbered per run

    def regions(rs):
        return tuple(r._replace(key=hbm.setdefault(r.key, len(hbm))) if r.buffer == "hbm"
                     else r for r in rs)
    recs = [(i.op, i.engine, regions(i.reads), regions(i.writes), i.dtype, i.partitions,
             i.free, sorted(i.detail.items()), i.loops, i.file, i.line, i.index)
            for i in run.trace.instrs]
    mem = run.memory
    return recs, list(mem.dead), mem.clock, sorted(mem.sites.items(), key=repr), \
        run.trace.peak_sbuf_bytes, run.trace.peak_psum_banks


def _simulate(call, lazy, monkeypatch, checks):
    """Run ``call()``: (outputs, error, warnings, digest, (``acc += nc_matmul`` results made
    pending, pending results materialized, current-face matmuls recorded without a result
    tile))."""
    made, built, face = [], [], []
    with monkeypatch.context() as m:
        if lazy:        # count through functions that emit no diagnostics (warning lines)
            follows, result, record = engines._iadd_follows, engines._result, \
                nki_isa.record_pending

            def follows_spy(frame):
                pending = follows(frame)
                made.append(pending)
                return pending

            def result_spy(*a):
                built.append(True)
                return result(*a)

            def record_spy(t):
                face.append(True)
                return record(t)
            m.setattr(engines, "_iadd_follows", follows_spy)
            m.setattr(engines, "_result", result_spy)
            m.setattr(nki_isa, "record_pending", record_spy)
        else:
            m.setattr(engines, "LAZY_RESULTS", False)
        m.setenv("NKISIM_CHECKS", checks)
        out, err, warned = _capture(call)
        if err is None:
            assert not tensor_mod.PENDING       # nothing left pending after a run
        tensor_mod.PENDING.clear()
        return out, err, warned, _digest(runtime.last_run()), \
            (made.count(True), len(built), len(face))


def _capture(call):
    """(``call()``'s result or None, (error type, message) or None, the warnings it issued)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = err = None
        try:
            out = call()
        except Exception as e:      # noqa: BLE001 - compared between the two paths
            err = (type(e).__name__, str(e))
    return out, err, [(w.category, str(w.message), w.lineno) for w in caught]


def _same(kernel, args, monkeypatch, checks="all", face=False):
    def call():
        return kernel(*args) if face else simulate_kernel(kernel, *args)
    got = _simulate(call, True, monkeypatch, checks)
    want = _simulate(call, False, monkeypatch, checks)
    if want[0] is None:
        assert got[0] is None
    else:
        for g, w in zip(*(o if isinstance(o, tuple) else (o,) for o in (got[0], want[0]))):
            np.testing.assert_array_equal(g, w)
    assert got[1] == want[1]
    assert got[2] == want[2]
    assert got[3] == want[3]
    assert want[4] == (0, 0, 0)
    return got


RNG = np.random.default_rng(0)
A = RNG.random((2, 128, 128), dtype=np.float32)
X = RNG.random((128, 2, 6, 40), dtype=np.float32)      # [K, C_in tile, rows, width]


def _conv_like(psum_init):
    """conv2d's accumulation: 3-D windows of a 4-D SBUF band, several accumulation groups."""
    def kernel(a, x):
        out = nl.ndarray((128, 4, 2, 38), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.ndarray((128, 2, 128), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(2):
            at[:, c, :] = nl.load(a[c])
        xt = nl.load(x)
        for g in nl.affine_range(4):
            if psum_init:
                ps = nl.zeros((128, 2, 38), dtype=nl.float32, buffer=nl.psum)
            else:
                ps = nl.ndarray((128, 2, 38), dtype=nl.float32, buffer=nl.psum)
            for c in nl.affine_range(2):
                for dj in nl.affine_range(3):
                    ps += nisa.nc_matmul(at[:, c, :], xt[:, c, g:g + 2, dj:dj + 38])
            nl.store(out[:, g], nisa.tensor_copy(ps))
        return out
    return kernel


def _conv_want():
    want = np.zeros((128, 4, 2, 38), np.float32)
    for g in range(4):
        for c in range(2):
            for dj in range(3):
                want[:, g] += np.einsum("km,krc->mrc", A[c], X[:, c, g:g + 2, dj:dj + 38])
    return want


@pytest.mark.parametrize("checks", ["all", "none"])
def test_conv_accumulation_equals_the_result_tile_path(monkeypatch, checks):
    got = _same(_conv_like(True), (A, X), monkeypatch, checks)
    np.testing.assert_allclose(got[0], _conv_want(), rtol=1e-5)
    # the first matmul of a result shape builds its tile (its allocation is validated once),
    # every other one is consumed
    assert got[4] == (24, 1, 0)


def test_psum_ndarray_accumulator_rule_and_values(monkeypatch):
    got = _same(_conv_like(False), (A, X), monkeypatch)
    np.testing.assert_allclose(got[0], _conv_want(), rtol=1e-5)
    assert any("created without zeros" in m for _, m, _ in got[2])
    assert got[4] == (24, 1, 0)


def _acc_kernel(buffer, dtype, acc_shape, moving, view=False, numpy_lhs=False,
                same_line=False):
    def kernel(a, b):
        out = nl.ndarray(acc_shape, dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.load(a[0])
        bt = nl.load(b)
        acc = nl.zeros(acc_shape, dtype=dtype, buffer=buffer)
        for _ in nl.affine_range(3):
            if numpy_lhs:
                host = np.zeros(acc_shape, np.float32)
                host += nisa.nc_matmul(at, bt[moving])
            elif view:
                acc[:, 0:64] += nisa.nc_matmul(at, bt[moving])
            elif same_line:     # a PSUM tile allocated on the matmul line after it: its key
                acc += nisa.nc_matmul(at, bt[moving]); t = nisa.nc_transpose(bt)  # noqa: E702,F841
            else:
                acc += nisa.nc_matmul(at, bt[moving])
        nl.store(out, nisa.tensor_copy(acc, dtype=nl.float32))
        return out
    return kernel


B = RNG.random((128, 128), dtype=np.float32)
FULL = (slice(None), slice(0, 128))


@pytest.mark.parametrize("case", ["sbuf_acc", "bf16_acc", "needs_fit", "view", "numpy_lhs",
                                  "shape_error", "same_line"])
def test_other_accumulators_build_the_result_tile_as_before(monkeypatch, case):
    kernel = {
        "sbuf_acc": _acc_kernel(nl.sbuf, nl.float32, (128, 128), FULL),
        "bf16_acc": _acc_kernel(nl.psum, nl.bfloat16, (128, 128), FULL),
        "needs_fit": _acc_kernel(nl.psum, nl.float32, (128, 2, 64), FULL),
        "view": _acc_kernel(nl.psum, nl.float32, (128, 128), (slice(None), slice(0, 64)),
                            view=True),
        "numpy_lhs": _acc_kernel(nl.psum, nl.float32, (128, 128), FULL, numpy_lhs=True),
        "shape_error": _acc_kernel(nl.psum, nl.float32, (128, 64), FULL),
        "same_line": _acc_kernel(nl.psum, nl.float32, (128, 128), FULL, same_line=True),
    }[case]
    got = _same(kernel, (A, B), monkeypatch)
    made, built, _ = got[4]
    if case in ("view", "same_line"):
        assert got[1] is None and (made, built) == (3, 1)     # a PSUM view is consumed too
    elif case == "numpy_lhs":
        assert "got ndarray" in got[1][1] and made == 1        # never touched: same error
    else:
        assert made == built > 0            # every one materialized: the result-tile path
        if case == "bf16_acc":
            assert any("PSUM accumulator" in m for _, m, _ in got[2])
        elif case == "sbuf_acc":
            assert "psum" in got[1][1].lower()
        elif case == "needs_fit":
            assert got[1] is None
        else:
            assert got[1] is not None


def test_an_unconsumed_pending_result_materializes_in_order(monkeypatch):
    """`r = nc_matmul(...)` followed by `+=` somewhere else, and a pending matmul used as a
    plain tile: both take the result-tile path (same records, lifetimes)."""
    def kernel(a, b):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.load(a[0])
        bt = nl.load(b)
        acc = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
        r = nisa.nc_matmul(at, bt)
        s = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)     # noqa: F841
        acc += r
        acc += nisa.nc_matmul(at, bt) * 2.0
        nl.store(out, nisa.tensor_copy(acc))
        return out
    got = _same(kernel, (A, B), monkeypatch)
    np.testing.assert_allclose(got[0], 3 * (A[0].T @ B), rtol=1e-5)
    assert got[4] == (0, 0, 0)


def test_never_written_operand_taint_is_unchanged(monkeypatch):
    """A moving tile with never-written columns: the accumulator's garbage columns and the
    warning at the store are those of the result-tile path (no pending result: the taint
    goes through the result tile)."""
    def kernel(a, b):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.load(a[0])
        bt = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        bt[:, 0:64] = nl.load(b[:, 0:64])
        acc = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
        for _ in nl.affine_range(3):
            acc += nisa.nc_matmul(at, bt)
        nl.store(out, nisa.tensor_copy(acc))
        return out
    got = _same(kernel, (A, B), monkeypatch)
    assert any("only partly written" in m for _, m, _ in got[2]) and got[4] == (0, 0, 0)
    assert np.isnan(got[0][:, 64:]).all() and not np.isnan(got[0][:, :64]).any()


def test_the_lazy_path_is_taken_on_this_interpreter():
    """``_iadd_follows`` recognises ``acc += nisa.nc_matmul(...)`` from the running CPython's
    bytecode (f_lasti conventions changed in 3.11), and nothing else."""
    import sys
    seen = []

    def probe():
        seen.append(engines._iadd_follows(sys._getframe(1)))
        return 1

    x = 0
    x += probe()
    y = probe() + 1
    x += (probe(),
          2)[0]
    x += probe(
    )
    assert seen == [True, False, False, True] and x + y


# the current face: nc_matmul(dst, stationary, moving, accumulate=...) defers its result too

def _face_kernel(steps, dst_shape=(32, 16), moving_shape=(8, 16)):
    """Matmuls into one PSUM tile: ("mm", accumulate, dst columns, moving columns) or
    ("memset", value, columns); stationary (8, 32) whose rows 16:32 may be never written."""
    nl, nisa = nki_face.language, nki_face.isa

    @nki_face.jit
    def k(w, x):
        ws = nl.ndarray((8, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ws, src=w)
        junk = nl.ndarray((8, 32), dtype=nl.float32, buffer=nl.sbuf)
        xs = nl.ndarray(moving_shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        p = nl.ndarray(dst_shape, dtype=nl.float32, buffer=nl.psum)
        for kind, arg, cols, mcols in steps:
            if kind == "mm":
                nisa.nc_matmul(p[:, cols], ws if arg != "junk" else junk, xs[:, mcols],
                               accumulate=None if arg == "junk" else arg)
            else:
                nisa.memset(p[:, cols], arg)
        q = nl.ndarray(dst_shape, dtype=nl.float32, buffer=nl.psum)   # never read: its
        nisa.nc_matmul(q, ws, xs)                                      # lifetime ends here
        s = nl.ndarray(dst_shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=p)
        o = nl.ndarray(dst_shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=s)
        return o
    return k


W8 = RNG.random((8, 32), dtype=np.float32)
X8 = RNG.random((8, 16), dtype=np.float32)
ALL, LEFT, RIGHT = slice(0, 16), slice(0, 10), slice(6, 16)


@pytest.mark.parametrize("steps, n_pending", [
    ([("mm", None, ALL, ALL)] * 3, 3),
    ([("mm", None, ALL, ALL), ("mm", False, ALL, ALL), ("mm", True, ALL, ALL)], 3),
    ([("memset", 5.0, ALL, None), ("mm", True, ALL, ALL)], 1),      # first of its shape
    ([("mm", True, ALL, ALL)] * 2, 2),                              # adds to garbage, warns
    ([("mm", None, LEFT, LEFT), ("mm", None, RIGHT, RIGHT), ("mm", None, LEFT, LEFT)], 2),
    ([("mm", None, ALL, ALL), ("mm", "junk", ALL, ALL), ("mm", None, ALL, ALL)], 2),
    ([("mm", None, ALL, ALL), ("mm", None, LEFT, ALL)], 0),        # shape error (materialized)
], ids=["none", "false_true", "memset_true", "true_true", "overlap", "junk", "mismatch"])
def test_current_face_matmul_equals_the_result_tile_path(monkeypatch, steps, n_pending):
    got = _same(_face_kernel(steps), (W8, X8), monkeypatch, face=True)
    assert got[4][2] == n_pending          # recorded without their result tile (+ q's)
    if all(step[:3] == ("mm", None, ALL) for step in steps):
        np.testing.assert_allclose(got[0], len(steps) * (W8.T @ X8), rtol=1e-5)
    if steps[-1][3] is ALL and steps[-1][2] is LEFT:
        assert got[1] is not None and "does not match" in got[1][1]



def test_an_accumulator_never_read_again_ends_its_lifetime_at_its_last_matmul(monkeypatch):
    def kernel(a, b):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.load(a[0])
        bt = nl.load(b)
        for _ in nl.affine_range(3):
            q = nl.zeros((128, 128), dtype=nl.float32, buffer=nl.psum)
            q += nisa.nc_matmul(at, bt)
            q += nisa.nc_matmul(at, bt)
            s = nisa.tensor_copy(bt)        # noqa: F841 - the next instruction: not q's
        nl.store(out, nisa.tensor_copy(at))
        return out
    got = _same(kernel, (A, B), monkeypatch)
    assert got[4] == (6, 1, 0)


def test_operand_tiles_die_in_the_same_order(monkeypatch):
    """Tiles loaded on the matmul's line die when the instruction no longer needs them, the
    stationary first: their lifetimes are recorded in the same order (an overflow message
    lists the tensors live at the peak in that order when their sizes tie)."""
    def kernel(a, b):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            acc += nisa.nc_matmul(nl.load(a[k]), nl.load(b))
        nl.store(out, nisa.tensor_copy(acc))
        return out
    got = _same(kernel, (A, B), monkeypatch)
    assert got[4] == (2, 1, 0)


# ---------------------------------------------------------------------------------------------
# the current face's `nisa.op(dst, ...)`: the result written straight into dst
# (nkisim.tensor.write_into), compared with the path that builds the result tile and copies it
# (ops.DIRECT_RESULTS off), as above

def _both_ways(call, monkeypatch, checks, switch, counted):
    """Run ``call()`` with the flag ``switch`` (module, name) on, then off, counting the calls
    of ``counted`` (module, name) that return something (the direct path taken); compare
    everything ``_same`` compares. Returns (outputs, error, warnings, that count)."""
    runs = []
    real = getattr(*counted)
    for on in (True, False):
        hits = []
        with monkeypatch.context() as m:
            m.setattr(*switch, on)

            def spy(*a, fn=real, hits=hits):
                found = fn(*a)
                hits.append(found is not None)
                return found
            m.setattr(*counted, spy)
            m.setenv("NKISIM_CHECKS", checks)
            out, err, warned = _capture(call)
        runs.append((out, err, warned, _digest(runtime.last_run()), hits.count(True)))
    got, want = runs
    if want[0] is None:
        assert got[0] is None
    else:
        for g, w in zip(*(o if isinstance(o, tuple) else (o,) for o in (got[0], want[0]))):
            np.testing.assert_array_equal(g, w)
            assert g.dtype == w.dtype
    assert got[1:4] == want[1:4]
    assert want[4] == 0
    return got[0], got[1], got[2], got[4]


def _same_direct(kernel, args, monkeypatch, checks="all"):
    """The current face's ISA both ways (``ops.DIRECT_RESULTS``), counting the results
    ``write_into`` wrote."""
    return _both_ways(lambda: kernel(*args), monkeypatch, checks,
                      (ops_mod, "DIRECT_RESULTS"), (tensor_mod, "write_into"))


def _face_operands(x, y):
    """Inside a current-face kernel: x and y (128, 64) fp32 loaded into SBUF, and y's first
    column as a (128, 1) tile."""
    nl, nisa = nki_face.language, nki_face.isa
    xs = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    ys = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ys, src=y)
    col = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=col, src=ys[:, 0:1])
    return xs, ys, col


def _isa_kernel(dtype, reduce=False):
    """Every op `_direct` serves, into whole tiles and views of a wider tile of ``dtype``, in
    an affine loop (a result shape's first instruction allocates it: the literal path), then
    stored."""
    nl, nisa = nki_face.language, nki_face.isa

    @nki_face.jit
    def k(x, y):
        xs, ys, col = _face_operands(x, y)
        wide = nl.ndarray((128, 8, 64), dtype=dtype, buffer=nl.sbuf)
        red = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        for _ in nl.affine_range(2):
            t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=t, data1=xs, data2=ys, op=nl.multiply)
            nisa.tensor_tensor(dst=wide[:, 0, :], data1=t, data2=ys, op=nl.subtract)
            nisa.tensor_scalar(dst=wide[:, 1, :], data=xs, op0=nl.multiply, operand0=col,
                               op1=nl.add, operand1=0.5)
            nisa.scalar_tensor_tensor(dst=wide[:, 2, :], data=xs, op0=nl.multiply,
                                      operand0=2.0, op1=nl.add, operand1=ys)
            nisa.reciprocal(dst=wide[:, 3, :], data=ys)
            nisa.activation(dst=wide[:, 4, :], op=nl.exp, data=xs, scale=col,
                            reduce_op=nl.add if reduce else None,
                            reduce_res=red if reduce else None)
            ps = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
            nisa.tensor_copy(dst=ps, src=t)
            nisa.tensor_copy(dst=wide[:, 5, :], src=ps)
            nisa.memset(dst=wide[:, 6, :], value=0.25)
            nisa.tensor_reduce(dst=wide[:, 7, 0:4], op=nl.maximum,
                               data=xs.reshape((128, 4, 16)), axis=2)
            nisa.memset(dst=wide[:, 7, 4:64], value=1.0)
        o = nl.ndarray((128, 8, 64), dtype=dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=wide)
        return o
    return k


X64 = RNG.random((128, 64), dtype=np.float32)
Y64 = RNG.random((128, 64), dtype=np.float32) + 0.5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("checks", ["all", "none"])
def test_current_face_ops_write_their_dst_as_the_result_tile_path(monkeypatch, dtype, checks):
    nl = nki_face.language
    out, err, _, direct = _same_direct(_isa_kernel(getattr(nl, dtype)), (X64, Y64),
                                       monkeypatch, checks)
    assert err is None
    # per iteration 12 results; the first of each result shape and dtype allocates its tile
    assert direct >= 12
    col = Y64[:, 0:1]
    last = np.concatenate([X64.reshape(128, 4, 16).max(axis=2), np.ones((128, 60))], axis=1)
    want = np.stack([X64 * Y64 - Y64, X64 * col + 0.5, X64 * 2 + Y64, 1 / Y64,
                     np.exp(X64 * col), X64 * Y64, np.full((128, 64), 0.25), last], axis=1)
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=1e-2 if dtype != "float32"
                               else 1e-6)


def test_activation_with_reduce_res_keeps_the_result_tile_path(monkeypatch):
    _, err, _, direct = _same_direct(_isa_kernel(nki_face.language.float32, reduce=True),
                                     (X64, Y64), monkeypatch)
    assert err is None and direct >= 11     # every op but that activation


def _error_kernel(case):
    nl, nisa = nki_face.language, nki_face.isa

    @nki_face.jit
    def k(x):
        xs = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        acc = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=acc, data1=xs, data2=xs, op=nl.add)
        part = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=part[:, 0:32], src=xs[:, 0:32])
        ints = nl.ndarray((128, 64), dtype=nl.int32, buffer=nl.sbuf)
        for _ in nl.affine_range(2):
            if case == "shape":         # 64 elements per partition into 32
                nisa.tensor_tensor(dst=acc[:, 0:32], data1=xs, data2=xs, op=nl.add)
            elif case == "partitions":  # 128 partitions into 64
                nisa.tensor_tensor(dst=acc[0:64, :], data1=xs, data2=xs, op=nl.add)
            elif case == "int32":       # fp32 results rounded into an int32 dst
                nisa.tensor_scalar(dst=ints, data=xs, op0=nl.multiply, operand0=100.0)
            elif case == "garbage":     # never-written operand columns: tainted, as before
                nisa.tensor_tensor(dst=acc, data1=part, data2=xs, op=nl.add)
            else:                       # every iteration writes the same tile
                nisa.tensor_tensor(dst=acc, data1=xs, data2=xs, op=nl.add)
        o = nl.ndarray((128, 64), dtype=ints.dtype if case == "int32" else nl.float32,
                       buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=ints if case == "int32" else acc)
        return o
    return k


@pytest.mark.parametrize("case", ["shape", "partitions", "int32", "garbage", "plain"])
def test_current_face_errors_and_taint_are_those_of_the_result_tile_path(monkeypatch, case):
    out, err, warned, direct = _same_direct(_error_kernel(case), (X64,), monkeypatch)
    if case in ("shape", "partitions"):
        assert err is not None and "does not match" in err[1] and direct == 0
    elif case == "int32":
        assert err is None and direct >= 1
        np.testing.assert_array_equal(out, np.rint(X64 * 100))     # round to nearest
    elif case == "garbage":     # the taint goes through the result tile: never direct there
        assert direct == 0 and any("partly" in m or "never" in m for _, m, _ in warned), warned
    else:
        assert err is None and direct >= 1
        np.testing.assert_array_equal(out, X64 + X64)


def test_a_result_tile_made_on_the_same_line_keeps_its_buffer(monkeypatch):
    """A tile an nl.* op allocates on the line of a direct instruction: its allocation-site
    number (its buffer in the trace) counts the result tile the direct write did without."""
    nl, nisa = nki_face.language, nki_face.isa

    @nki_face.jit
    def k(x):
        xs = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=xs, data2=xs, op=nl.add)   # (the shape's first result)
        o = nl.ndarray((2, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            nisa.tensor_tensor(dst=t, data1=xs, data2=xs, op=nl.add); u = nl.add(t, xs)  # noqa: E702
            nisa.dma_copy(dst=o[i], src=u)
        v = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=xs, data2=t, op=nl.add)
        v[...] = t          # a copy of t (t is not a fresh result: no retargeting)
        nisa.dma_copy(dst=o[0], src=v)
        return o
    out, err, _, direct = _same_direct(k, (X64,), monkeypatch)
    assert err is None and direct == 3
    np.testing.assert_array_equal(out, np.stack([3 * X64, 3 * X64]))
    assert [i.op for i in runtime.last_run().trace.instrs][-3:] == \
        ["tensor_tensor", "tensor_copy", "dma_copy"]


# ---------------------------------------------------------------------------------------------
# `t[key] = op(...)`: the result written straight into t[key] (nkisim.dstform), compared with
# the path that builds the result tile and retargets it (dstform.ENABLED off), as above

def _same_stored(kernel, args, monkeypatch, checks="all", face=False):
    """``t[key] = op(...)`` both ways (``dstform.ENABLED``), counting the results that went
    straight into their target (through ``direct_spec``: a spy on ``Tensor.__setitem__`` would
    hold a reference to the value, which makes the retargeting path take it for a named tile,
    and a spy around the write would be the frame an error names)."""
    return _both_ways(lambda: kernel(*args) if face else simulate_kernel(kernel, *args),
                      monkeypatch, checks, (dstform, "ENABLED"), (tensor_mod, "direct_spec"))


def _dst_kernel(dtype):
    """Every op nkisim.dstform serves, as `t[key] = op(...)` with the key forms kernels use
    (`...`, an int, slices with loop-index arithmetic, a tuple), in an affine loop (a result
    shape's first instruction allocates its tile: the literal path), into tiles of ``dtype``."""
    @nki.jit
    def k(x, y, x4):
        o = nl.ndarray((4, 128, 8, 64), dtype=dtype, buffer=nl.shared_hbm)
        q = nl.ndarray((4, 128, 4, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        col = nl.load(y[:, 0:1])
        for i in nl.affine_range(4):
            xs = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
            xs[...] = nl.load(x[i])
            ys = nl.ndarray((128, 2, 64), dtype=nl.float32, buffer=nl.sbuf)
            ys[:, 1] = nl.load(y)
            w = nl.ndarray((128, 8, 64), dtype=dtype, buffer=nl.sbuf)
            w[:, 0, :] = nl.add(xs, ys[:, 1])
            w[:, 1, 0:32] = nl.exp(xs[:, 0:32])
            w[:, 1, 32:64] = nl.multiply(xs[:, i * 8:i * 8 + 32], 2.0)
            w[:, 2, :] = nisa.tensor_tensor(xs, ys[:, 1], op=nl.subtract)
            w[:, 3, :] = nisa.tensor_scalar(xs, nl.multiply, col, op1=nl.add, operand1=0.5)
            w[:, 4, :] = nisa.activation(op=nl.exp, data=xs, scale=col)
            w[:, 5, :] = nisa.reciprocal(ys[:, 1])
            ps = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
            ps[...] = nisa.tensor_copy(xs)
            w[:, 6, :] = nl.copy(ps)
            w[:, 7, 0:4] = nisa.tensor_reduce(nl.maximum, xs.reshape((128, 4, 16)), axis=2)
            w[:, 7, 4:8] = nl.sum(xs.reshape((128, 4, 16)), axis=2)
            w[:, 7, 8:64] = nisa.memset((128, 56), 1.0, dtype)
            nl.store(o[i], value=w)
            z = nl.ndarray((128, 4, 64), dtype=nl.float32, buffer=nl.sbuf)
            z[:, :, 16:32] = nl.load(x4[i])     # (runs of 64 bytes, the result tile's 256)
            nl.store(q[i], value=z[:, :, 16:32])
        return o, q
    return k


X4 = RNG.random((4, 128, 64), dtype=np.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("checks", ["all", "none"])
def test_beta1_assigned_results_equal_the_retargeting_path(monkeypatch, dtype, checks):
    (out, quarter), err, _, stored = _same_stored(_dst_kernel(getattr(nl, dtype)),
                                                  (X4, Y64, X4.reshape(4, 128, 4, 16)),
                                                  monkeypatch, checks)
    assert err is None
    np.testing.assert_array_equal(quarter, X4.reshape(4, 128, 4, 16))
    # 16 assignments per iteration; the first iteration allocates each result shape (literal
    # path); a bf16 w takes the fp32 results through the retargeting (a second rounding), so
    # only the loads, the PSUM copy and the memset go straight there
    assert stored >= (3 * 16 if dtype == "float32" else 3 * 5)
    col = Y64[:, 0:1]
    for i in range(4):
        x = X4[i]
        want = np.stack([x + Y64, np.concatenate([np.exp(x[:, :32]), 2 * x[:, i * 8:i * 8 + 32]],
                                                 axis=1),
                         x - Y64, x * col + 0.5, np.exp(x * col), 1 / Y64, x,
                         np.concatenate([x.reshape(128, 4, 16).max(axis=2),
                                         x.reshape(128, 4, 16).sum(axis=2),
                                         np.ones((128, 56))], axis=1)], axis=1)
        np.testing.assert_allclose(out[i].astype(np.float32), want,
                                   rtol=1e-2 if dtype != "float32" else 1e-6)


def test_handout_tiled_vector_add_loads_into_its_tiles(monkeypatch):
    """The trn1 handout's tiled kernel (`a_tile[...] = nl.load(a_vec[m * ROW_CHUNK : ...])`)."""
    from fixtures import handout
    a, b = RNG.random(512, dtype=np.float32), RNG.random(512, dtype=np.float32)
    for chunk in (1, 128):
        kernel = handout.make_vector_add_tiled_trn1(chunk)
        out, err, _, stored = _same_stored(kernel, (a, b), monkeypatch)
        assert err is None and stored == 2 * (512 // chunk) - 1   # (the first allocates)
        np.testing.assert_array_equal(out, a + b)


ROWS = RNG.permutation(128)[:48].astype(np.int32).reshape(48, 1)


def _odd_kernel(case):
    @nki.jit
    def k(x, rows):
        o = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        scratch = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.hbm)
        for i in (nl.affine_range if case == "race" else nl.sequential_range)(2):
            t[...] = nl.load(x)
            if case == "race":      # both iterations write t: refused at the second load
                pass
            elif case == "next line":       # (the store's line is not the call's)
                t[...] = \
                    nl.add(t, t)
            elif case == "out of bounds":
                t[:, 32:96] = nl.load(x[:, 0:64])
            elif case == "shape":
                t[:, 0:32] = nl.add(t, t)
            elif case == "mask":
                t[...] = nl.add(t, t, mask=(nl.arange(128)[:, None] < 64))
            elif case == "call in key":
                t[:, builtins.min(i, 0):64] = nl.add(t, t)
            elif case == "chained":
                u = t[...] = nl.add(t, t)
                t[...] = nl.add(u, t)
            elif case == "unwritten source":   # a kernel HBM tensor never written: garbage
                t[:, 0:32] = nl.load(scratch[:, 0:32])
            elif case == "wider dtype":        # an fp32 tile of bf16 results: two roundings
                t[...] = nl.add(t, t, dtype=nl.bfloat16)
            elif case == "reduce":     # nl.add run from C at the call whose value is stored
                t[...] = functools.reduce(nl.add, [t, t, t])
            elif case == "map":
                t[...] = max(map(nl.exp, [t]), key=id)
            elif case == "list of tiles":      # `tiles[k][...] = op(...)`
                tiles = [t, nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)]
                tiles[1][...] = nl.add(t, t)
                tiles[i - i][:, 0:64] = nl.multiply(tiles[1], 0.5)
            elif case == "indirect":           # rows gathered by an SBUF tile of indices
                idx = nl.load(rows)
                t[0:48, :] = nl.load(x[idx, nl.arange(64)[None, :]])
                t[0:48, :] = nl.load(x[idx, nl.arange(64)[None, :]])
            else:
                t[...] = nl.add(t, t)
        nl.store(o, value=t)
        return o
    return k


@pytest.mark.parametrize("case", ["out of bounds", "shape", "mask", "call in key", "chained",
                                  "unwritten source", "wider dtype", "race", "next line",
                                  "indirect", "list of tiles", "reduce", "map", "plain"])
def test_beta1_assignment_errors_and_fallbacks_are_those_of_the_retargeting_path(monkeypatch,
                                                                               case):
    out, err, warned, stored = _same_stored(_odd_kernel(case), (X64, ROWS), monkeypatch)
    if case in ("out of bounds", "shape"):
        assert err is not None
    elif case == "race":
        assert err is not None and "iteration 1 ('dma_copy' at test_lazy_matmul.py" in err[1]
    elif case == "unwritten source":   # a warning where the garbage reaches the output
        assert err is None and any("never written" in w for _, w, _ in warned), warned
    else:
        assert err is None
    if case in ("plain", "chained", "mask", "wider dtype"):
        assert stored >= 1          # (the loop's first load, at least)
    if case in ("reduce", "map"):   # the loads only: the op is not the stored call's callee
        assert stored == 1
        np.testing.assert_allclose(out, 3 * X64 if case == "reduce" else np.exp(X64),
                                   rtol=1e-6)
    if case == "list of tiles":     # all but the first load and the first add (they allocate)
        assert stored == 4
        np.testing.assert_array_equal(out, X64)
    if case == "next line":
        assert stored == 1          # the first load only
    if case == "indirect":
        want = X64.copy()
        want[:48] = X64[ROWS[:, 0]]
        np.testing.assert_array_equal(out, want)
        assert stored == 1          # (the plain loads: the first allocates; not the gathers)
    if case in ("plain", "next line"):
        np.testing.assert_array_equal(out, 2 * X64)   # (each iteration loads x again)


def test_current_face_assigned_results_equal_the_retargeting_path(monkeypatch):
    nl_, nisa_ = nki_face.language, nki_face.isa

    @nki_face.jit
    def k(x):
        xs = nl_.ndarray((128, 64), dtype=nl_.float32, buffer=nl_.sbuf)
        nisa_.dma_copy(dst=xs, src=x)
        t = nl_.ndarray((128, 2, 64), dtype=nl_.float32, buffer=nl_.sbuf)
        for _ in nl_.sequential_range(3):
            t[:, 0, :] = nl_.add(xs, xs)
            t[:, 1, :] = nl_.exp(t[:, 0, :])
        o = nl_.ndarray((128, 2, 64), dtype=nl_.float32, buffer=nl_.shared_hbm)
        nisa_.dma_copy(dst=o, src=t)
        return o
    out, err, _, stored = _same_stored(k, (X64,), monkeypatch, face=True)
    assert err is None and stored == 5         # (the first add allocates the result shape)
    np.testing.assert_allclose(out[:, 1, :], np.exp(2 * X64), rtol=1e-6)


def test_a_target_found_through_user_code_is_left_to_python(monkeypatch):
    """Only names, constants, int arithmetic and list/tuple items are evaluated ahead of the
    store: a container's own __getitem__ (user code) runs once, when Python runs it."""
    calls = []

    class Bag:
        def __init__(self, t):
            self.t = t

        def __getitem__(self, k):
            calls.append(k)
            return self.t

    @nki.jit
    def k(x):
        o = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        bag = Bag(t)
        for _ in nl.sequential_range(3):
            bag[0][...] = nl.load(x)
        nl.store(o, value=t)
        return o
    out, err, _, stored = _same_stored(k, (X64,), monkeypatch)
    assert err is None and stored == 0 and len(calls) == 2 * 3
    np.testing.assert_array_equal(out, X64)


# ---------------------------------------------------------------------------------------------
# the result computed in place (tensor.begin_direct, NumPy out=): tensor_tensor,
# tensor_scalar, activation and nl.add & co. into an fp32 destination, compared with the
# result tile path as above

def _in_place_kernel():
    nl_, nisa_ = nki_face.language, nki_face.isa

    @nki_face.jit
    def k(x, y):
        xs, ys, col = _face_operands(x, y)
        acc = nl_.ndarray((128, 64), dtype=nl_.float32, buffer=nl_.sbuf)
        nisa_.tensor_tensor(dst=acc, data1=xs, data2=ys, op=nl_.add)    # (allocates: literal)
        nisa_.tensor_scalar(dst=acc, data=acc, op0=nl_.add, operand0=1.0)
        for _ in nl_.sequential_range(3):
            # the destination is an operand; then a column view, the operand overlapping it
            # shifted by one column
            nisa_.tensor_tensor(dst=acc, data1=acc, data2=ys, op=nl_.multiply)
            nisa_.tensor_scalar(dst=acc, data=acc, op0=nl_.subtract, operand0=col,
                                reverse0=True, op1=nl_.maximum, operand1=0.25)
            nisa_.tensor_tensor(dst=acc[:, 1:33], data1=acc[:, 0:32], data2=xs[:, 0:32],
                                op=nl_.greater)
            nisa_.tensor_scalar(dst=acc[:, 33:64], data=acc[:, 32:63], op0=nl_.divide,
                                operand0=3.0, op1=nl_.add, operand1=col, reverse1=True)
            nisa_.activation(dst=acc, op=nl_.tanh, data=acc, scale=col, bias=col)
            nisa_.activation(dst=acc[:, 0:63], op=nl_.copy, data=acc[:, 1:64], scale=2.0)
        o = nl_.ndarray((128, 64), dtype=nl_.float32, buffer=nl_.shared_hbm)
        nisa_.dma_copy(dst=o, src=acc)
        return o
    return k


def _numpy_in_place(x, y):
    col = y[:, 0:1]
    acc = x + y + np.float32(1)
    for _ in range(3):
        acc = acc * y
        acc = np.maximum(col - acc, np.float32(0.25))
        acc[:, 1:33] = acc[:, 0:32] > x[:, 0:32]
        acc[:, 33:64] = col + acc[:, 32:63] / np.float32(3)
        acc = np.tanh(acc * col + col)
        acc[:, 0:63] = acc[:, 1:64] * np.float32(2)
    return acc


def _beta1_race_kernel(x):
    xs = nl.load(x)
    acc = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    acc[...] = nisa.tensor_scalar(xs, nl.add, 1.0)      # (allocates the result shape: literal)
    for i in nl.affine_range(2):
        acc[...] = nisa.tensor_scalar(xs, nl.add, 1.0 * i)    # iterations: other values
    o = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(o, acc)
    return o


@pytest.mark.parametrize("checks", ["all", "none"])
def test_results_computed_in_place_equal_the_result_tile_path(monkeypatch, checks):
    out, err, _, direct = _both_ways(lambda: _in_place_kernel()(X64, Y64), monkeypatch, checks,
                                     (ops_mod, "DIRECT_RESULTS"), (tensor_mod, "begin_direct"))
    assert err is None
    # every op of the loop but the first of each shape and op, and the first tensor_scalar
    assert direct >= 13
    np.testing.assert_array_equal(out, _numpy_in_place(X64, Y64))


def test_a_write_the_checks_refuse_raises_as_on_the_result_tile_path(monkeypatch):
    """Beta 1's output dependency in an affine loop: iteration 0 computes in place, iteration
    1's checks refuse the write before any value lands and the literal path raises."""
    _, err, _, direct = _both_ways(
        lambda: simulate_kernel(nki.jit(_beta1_race_kernel), X64), monkeypatch, "all",
        (ops_mod, "DIRECT_RESULTS"), (tensor_mod, "begin_direct"))
    assert direct == 1
    assert err is not None and "Unexpected output dependencies" in err[1], err


def _beta1_in_place_kernel(x, y):
    xs = nl.load(x)
    ys = nl.load(y)
    acc = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    acc[...] = nl.add(xs, ys)                       # (allocates the result shape: literal)
    for _ in nl.sequential_range(3):
        acc[...] = nl.multiply(acc, ys)             # the destination is an operand
        acc[...] = nl.subtract(acc, ys[:, 0:1])     # a (P, 1) operand, broadcast
        acc[:, 1:33] = nl.maximum(acc[:, 0:32], 0.5)    # overlapping, shifted by one column
        acc[:, 33:64] = nl.divide(acc[:, 32:63], xs[:, 0:31])
    o = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(o, acc)
    return o


@pytest.mark.parametrize("checks", ["all", "none"])
def test_beta1_language_ops_computed_in_place_equal_the_result_tile_path(monkeypatch, checks):
    out, err, _, direct = _both_ways(
        lambda: simulate_kernel(nki.jit(_beta1_in_place_kernel), X64, Y64), monkeypatch, checks,
        (ops_mod, "DIRECT_RESULTS"), (tensor_mod, "begin_direct"))
    assert err is None
    assert direct >= 9
    want = X64 + Y64
    for _ in range(3):
        want = want * Y64
        want = want - Y64[:, 0:1]
        want[:, 1:33] = np.maximum(want[:, 0:32], np.float32(0.5))
        want[:, 33:64] = want[:, 32:63] / X64[:, 0:31]
    np.testing.assert_array_equal(out, want)


def _random_program(seed):
    """A random sequence of in-place-capable ops (tensor_tensor, tensor_scalar, activation)
    over three fp32 tiles, each writing a random column window of one tile from windows of
    the same width (overlapping it or not), with (P, 1) operands that may be columns of the
    destination."""
    r = np.random.default_rng(seed)
    steps = []
    for _ in range(12):
        width = (64, 32, 7)[int(r.integers(0, 3))]     # (a result shape seen before: in place)
        cols = [int(r.integers(0, 65 - width)) for _ in range(3)]
        tiles = [int(r.integers(0, 3)) for _ in range(3)]
        kind = ("tt", "ts", "act")[int(r.integers(0, 3))]
        op = ("add", "subtract", "multiply", "maximum", "minimum")[int(r.integers(0, 5))]
        steps.append((kind, op, width, cols, tiles, float(r.integers(-3, 4)) / 2,
                      bool(r.integers(0, 2)), ("tanh", "copy", "abs")[int(r.integers(0, 3))]))
    nl_, nisa_ = nki_face.language, nki_face.isa

    @nki_face.jit
    def k(x, y):
        t = [nl_.ndarray((128, 64), dtype=nl_.float32, buffer=nl_.sbuf) for _ in range(3)]
        nisa_.dma_copy(dst=t[0], src=x)
        nisa_.dma_copy(dst=t[1], src=y)
        nisa_.tensor_tensor(dst=t[2], data1=t[0], data2=t[1], op=nl_.subtract)
        for kind, op, width, cols, tiles, c, rev, func in steps:
            dst = t[tiles[0]][:, cols[0]:cols[0] + width]
            a = t[tiles[1]][:, cols[1]:cols[1] + width]
            b = t[tiles[2]][:, cols[2]:cols[2] + width]
            if kind == "tt":
                nisa_.tensor_tensor(dst=dst, data1=a, data2=b, op=getattr(nl_, op))
            elif kind == "ts":
                nisa_.tensor_scalar(dst=dst, data=a, op0=getattr(nl_, op), operand0=c,
                                    reverse0=rev, op1=nl_.subtract,
                                    operand1=t[tiles[2]][:, 0:1], reverse1=not rev)
            else:
                nisa_.activation(dst=dst, op=getattr(nl_, func), data=a,
                                 scale=t[tiles[1]][:, 3:4] if rev else c,
                                 bias=t[tiles[2]][:, 5:6])
        o = nl_.ndarray((3, 128, 64), dtype=nl_.float32, buffer=nl_.shared_hbm)
        for i in range(3):
            nisa_.dma_copy(dst=o[i], src=t[i])
        return o
    return k


@pytest.mark.parametrize("seed", range(16))
def test_random_programs_in_place_equal_the_result_tile_path(monkeypatch, seed):
    out, err, _, direct = _both_ways(lambda: _random_program(seed)(X64, Y64), monkeypatch,
                                     "all", (ops_mod, "DIRECT_RESULTS"),
                                     (tensor_mod, "begin_direct"))
    assert err is None and direct >= 1
    assert np.isfinite(out).all()


@pytest.mark.parametrize("program", ["current", "beta1", "random0", "random1", "random2"])
def test_a_write_computed_in_place_is_checked_once(monkeypatch, program):
    """Computed in place or copied there (``tensor.begin_direct`` off), each write of a
    destination runs its checks once (``tensor._write_begin``): the in-place path reaches
    ``write_into``'s in-place branch every time it begins, and never checks again."""
    calls = {
        "current": lambda: _in_place_kernel()(X64, Y64),
        "beta1": lambda: simulate_kernel(nki.jit(_beta1_in_place_kernel), X64, Y64),
    }
    call = calls.get(program) or (lambda: _random_program(int(program[-1]))(X64, Y64))
    counts, began = [], []
    for in_place in (True, False):
        n, hits = [0], [0]
        real_begin, real_direct = tensor_mod._write_begin, tensor_mod.begin_direct

        def spy(*a, real=real_begin, n=n, **k):
            n[0] += 1
            return real(*a, **k)

        def direct(*a, real=real_direct, hits=hits, **k):
            found = real(*a, **k)
            hits[0] += found is not None
            return found
        with monkeypatch.context() as m:
            m.setattr(tensor_mod, "_write_begin", spy)
            m.setattr(tensor_mod, "begin_direct", direct if in_place else
                      (lambda *a, **k: None))
            call()
        counts.append(n[0])
        began.append(hits[0])
    assert began[0] >= 1
    assert counts[0] == counts[1]
