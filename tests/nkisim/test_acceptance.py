"""Code the device accepts runs on nkisim (issue 8, shared/DESIGN.md "The acceptance principle").

Each test names its evidence: the AWS doc that documents the behaviour, or the AWS kernel (in
aws-neuron/nki-samples or the SDK's doc tests, both passing AWS's CI) that relies on it. Expected
values come from NumPy. The checks, the PSUM/SBUF semantics and capacity have their own tests in
test_checks.py and test_errors.py.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

import nkisim.beta1.isa as nisa
import nkisim.beta1.language as nl
from nkisim import NKIWarning
from nkisim import beta1 as nki
from nkisim.errors import NKIRuleWarning
from nkisim.runtime import simulate

RNG = np.random.default_rng(8)


def rand(*shape):
    return RNG.random(shape, dtype=np.float32)


def run(body, *args, strict=False):
    """Simulate ``body`` with every check on and NKI warnings as errors."""
    kernel = nki.jit(body)
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("error", NKIWarning)
        mp.setenv("NKISIM_STRICT", "1" if strict else "0")
        return simulate(kernel, args, {}, checks_spec="all")


def test_reshape_accepts_the_shape_keyword():
    """nki.tensor.reshape(shape): AWS's reference/vision.py calls `x.reshape(shape=(...))`."""
    def body(a):
        out = nl.ndarray((128, 32), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a.reshape(shape=(128, 32))))
        return out

    a = rand(2, 64, 32)
    assert np.array_equal(run(body, a), a.reshape(128, 32))


def test_integer_index_on_a_free_axis_keeps_a_1_column_tile():
    """`buf[:, i]` of an SBUF tile is a [P, 1] tile: the known-issues page says tiles need 2
    dimensions and recommends `my_sbuf[0:N, 0]` to access [N, 1] buffers; AWS's
    reference/attention.py does `m_previous = nl.copy(m_buffer[:, 0])`, and passes
    `l_buffer[:, i]` to a helper documented "l_buffer: (B_P_SIZE, 1)" that indexes it
    `l_buffer[:, 0]`. HBM tensors drop the dimension (programming model, "Basic Tensor
    Indexing": `x[:, 1, 0:2].shape == [2, 2]`)."""
    seen = {}

    def body(a):
        out = nl.ndarray((128, 1), dtype=a.dtype, buffer=nl.shared_hbm)
        buf = nl.load(a)
        m = nl.copy(buf[:, 0])
        col = buf[:, 3]
        seen["view"], seen["copy"], seen["again"] = col.shape, m.shape, col[:, 0].shape
        seen["hbm"], seen["3d"] = a[:, 0].shape, buf.reshape((128, 2, 2))[:, 0].shape
        buf[:, 1] = nl.maximum(m, buf[:, 2])
        nl.store(out, nl.add(buf[:, 1], 1.0))
        return out

    a = rand(128, 4)
    out = run(body, a)
    assert seen == {"view": (128, 1), "copy": (128, 1), "again": (128, 1), "hbm": (128,),
                    "3d": (128, 2)}
    assert np.allclose(out[:, 0], np.maximum(a[:, 0], a[:, 2]) + 1)


def test_a_kernel_created_1d_tile_is_still_insufficient_rank():
    """NKI known issues: `nl.zeros((128, ), ..., buffer=nl.sbuf)  # this won't work`."""
    def body():
        nl.zeros((128,), dtype=nl.float32, buffer=nl.sbuf)

    with pytest.raises(ValueError, match="Insufficient rank"):
        run(body)


def test_mgrid_has_a_z_grid():
    """nl.mgrid results have `.p .x .y .z` (AWS's kernels index 4-D tiles with `.z`)."""
    g = nl.mgrid[0:2, 0:3, 0:4, 0:5]
    want = np.mgrid[0:2, 0:3, 0:4, 0:5]
    for i, name in enumerate("pxyz"):
        assert np.array_equal(getattr(g, name).v, want[i])


@pytest.mark.parametrize("n", [256, 200])
def test_a_plain_bool_mask_is_all_or_nothing(n):
    """A mask on loop indices and constants only is a Python bool (AWS's
    reference/allocated_fused_linear.py: `mask=(i * 128 < n)`): True keeps everything, False
    skips the instruction."""
    def body(a):
        out = nl.ndarray((256, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:128, 0:64]
        for i in nl.affine_range(2):
            nl.store(out[i * 128 + ix, iy], value=nl.load(a[i * 128 + ix, iy]),
                     mask=(i * 128 < 256))
        return out

    a = rand(256, 64)
    assert np.array_equal(run(body, a), a)

    def skipped(a):
        out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, value=nl.multiply(t, 2.0))
        nl.store(out, value=t, mask=(n < 256))           # False for n=256: not executed
        return out

    want = a[:128] * (2 if n == 256 else 1)
    assert np.array_equal(run(skipped, a[:128]), want)


def test_a_masked_slice_may_run_past_the_end():
    """The mask decides, not the slice ("NKI API Masking"): AWS's reference/vision.py
    adaptive_avg_pool2d slices past a tensor's end under a mask."""
    def body(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for t in nl.affine_range(2):
            ip = nl.arange(128)[:, None] + t * 128
            x = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(src=a[t * 128:(t + 1) * 128, :], dst=x, mask=(ip < 200))
            nl.store(out[t * 128:(t + 1) * 128, :], value=x, mask=(ip < 200))
        return out

    a = rand(200, 64)
    assert np.array_equal(run(body, a), a)

    def unmasked(a):
        out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a[128:256, :]))
        return out

    with pytest.raises(IndexError) as ei:
        run(unmasked, a)
    assert ei.value.nki_code == "err_tensor_access_out_of_bound"
    assert "index range [128, 255] exceed dimension size of 200" in str(ei.value)


def test_double_row_matmul_contracts_over_partitions_and_the_pair():
    """perf_mode='double_row_gen3': the SDK's test_nki_isa_nc_matmul.py::test_double_row_gen3
    checks einsum('kli,klj->ij') on [K, 2, M] x [K, 2, N] fp8 tiles."""
    def body(a, b):
        c = nl.ndarray((4, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(c, nisa.nc_matmul(nl.load(a), nl.load(b), perf_mode="double_row_gen3"))
        return c

    a = (RNG.integers(-3, 4, (128, 2, 4))).astype(nl.float8_e5m2)
    b = (RNG.integers(-3, 4, (128, 2, 512))).astype(nl.float8_e5m2)
    want = np.einsum("kli,klj->ij", a.astype(np.float64), b.astype(np.float64))
    assert np.array_equal(run(body, a, b), want)


@pytest.mark.parametrize("shape", [(128, 3, 5), (128, 3, 2, 5)])
@pytest.mark.parametrize("bias_shape", [(128, 1), (128,)])
@pytest.mark.parametrize("api", ["nl.add", "tensor_tensor"])
def test_a_partition_vector_broadcasts_along_every_free_dim(shape, bias_shape, api):
    """A (P, 1) or (P,) operand broadcasts along all free dims of a (P, R, W) or
    (P, R, 2, W) tile: CS149 solutions that passed on trn2 add a bias this way (issue 8)."""
    def body(x, b):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        xt = nl.load(x)
        bt = nl.load(b)
        if len(bias_shape) == 1:
            bt = bt[:, 0]
        if api == "nl.add":
            nl.store(out, nl.add(xt, bt))
        else:
            nl.store(out, nisa.tensor_tensor(bt, xt, op=nl.add))
        return out

    x, b = rand(*shape), rand(128, 1)
    want = x + b.reshape((128,) + (1,) * (len(shape) - 1))
    assert np.allclose(run(body, x, b), want, rtol=1e-6)


def test_loop_reduce_into_a_subscripted_destination():
    """`acc[:, j] = nl.loop_reduce(x, op=np.add, loop_indices=(i,))` (AWS's
    reference/attention.py flash_attn_bwd): the destination is the accumulator (nl.loop_reduce
    docstring: "The destination tile is also the rhs input to op")."""
    def body(a):
        out = nl.ndarray((128, 2, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 2, 8), dtype=nl.float32)
        for j in nl.affine_range(2):
            for s in nl.affine_range(4):
                x = nl.multiply(nl.load(a[s]), float(j + 1))
                acc[:, j, :] = nl.loop_reduce(x, op=np.add, loop_indices=(s,),
                                              dtype=nl.float32)
        nl.store(out, acc)
        return out

    a = rand(4, 128, 8)
    want = np.stack([a.sum(0), 2 * a.sum(0)], axis=1)
    assert np.allclose(run(body, a), want, rtol=1e-6)


def test_strict_mode_from_the_environment_the_cli_and_pytest(tmp_path):
    """A tolerated rule is an NKIRuleWarning; NKISIM_STRICT=1, `nkisim run --strict` and
    `pytest --nki-strict` make it the error nkisim_strict_rule."""
    def body(a):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        t = nl.load(a)
        acc += nisa.nc_matmul(t, t)
        nl.store(out, acc)
        return out

    a = rand(128, 128)
    with pytest.warns(NKIRuleWarning, match="condition 1: a psum buffer with zeros"):
        simulate(nki.jit(body), (a,), {})
    with pytest.raises(ValueError, match="strict mode") as ei:
        run(body, a, strict=True)
    assert ei.value.nki_code == "nkisim_strict_rule"

    script = tmp_path / "k.py"
    script.write_text(
        "import numpy as np, neuronxcc.nki as nki, neuronxcc.nki.language as nl\n"
        "import neuronxcc.nki.isa as nisa\n"
        "@nki.jit\n"
        "def k(a):\n"
        "    out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)\n"
        "    acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)\n"
        "    t = nl.load(a)\n"
        "    acc += nisa.nc_matmul(t, t)\n"
        "    nl.store(out, acc)\n"
        "    return out\n"
        "nki.simulate_kernel(k, np.ones((128, 128), np.float32))\n"
        "print('ran')\n")
    env_run = [sys.executable, "-m", "nkisim.cli", "run"]
    ok = subprocess.run(env_run + [str(script)], capture_output=True, text=True)
    assert ok.returncode == 0 and "ran" in ok.stdout and "NKIRuleWarning" in ok.stderr
    bad = subprocess.run(env_run + ["--strict", str(script)], capture_output=True, text=True)
    assert bad.returncode != 0 and "nkisim_strict_rule" not in bad.stdout
    assert "strict mode (NKISIM_STRICT=1)" in bad.stderr

    # the project opts into the nkiverify plugin (which serves the neuronxcc shim)
    (tmp_path / "pytest.ini").write_text("[pytest]\nnki_verify = true\n")
    test = tmp_path / "test_k.py"
    # the project opts into the nkiverify plugin (issue 9: it is inert elsewhere, no shim)
    (tmp_path / "pytest.ini").write_text("[pytest]\nnki_verify = true\n")
    test.write_text("import runpy\n"
                    f"def test_k():\n    runpy.run_path({str(script)!r})\n")
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test),
            "--rootdir", str(tmp_path)]
    assert subprocess.run(base, capture_output=True, text=True,
                          cwd=tmp_path).returncode == 0
    strict = subprocess.run(base + ["--nki-strict"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert strict.returncode == 1 and "strict mode (NKISIM_STRICT=1)" in strict.stdout


def test_bn_stats_mask_on_the_input_free_index():
    """A reduction's mask predicates its input's index space: AWS's tutorials/layernorm (v2)
    calls `nisa.bn_stats(x[i_p, j * 512 + i_f], mask=(j * 512 + i_f < F))`, a [1, 512] mask for
    a [128, 6] result. Masked-out elements take no part in the statistics (ref §1.12: the
    instruction "only processes" the masked-in region)."""
    F = 700

    def body(a):
        out = nl.ndarray((128, 12), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(512)[None, :]
        stats = nl.ndarray((128, 12), dtype=nl.float32)
        for j in nl.affine_range(2):
            stats[i_p, j * 6 + nl.arange(6)[None, :]] = nisa.bn_stats(
                x[i_p, j * 512 + i_f], mask=(j * 512 + i_f < F), dtype=nl.float32)
        nl.store(out, stats)
        return out

    a = rand(128, 1024) * 10
    got = run(body, a).astype(np.float64)
    a64 = a.astype(np.float64)
    for j, chunk in enumerate((a64[:, :512], a64[:, 512:F])):
        for k, part in enumerate((chunk[:, 0::2], chunk[:, 1::2])):
            c = j * 6 + 3 * k
            np.testing.assert_array_equal(got[:, c], part.shape[1])
            np.testing.assert_allclose(got[:, c + 1], part.mean(axis=1), rtol=1e-5)
            np.testing.assert_allclose(got[:, c + 2], part.var(axis=1) * part.shape[1],
                                       rtol=1e-4)


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_reduction_mask_on_the_input_free_index(op):
    """The same rule for nl reductions and nisa.tensor_reduce: a mask over the reduced (free)
    index leaves those elements out, a partition mask leaves output rows unwritten (NumPy's
    reduction of the masked-in elements is the truth)."""
    def body(a):
        out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        r = nl.zeros((128, 2), dtype=nl.float32)
        r[i_p, 0] = getattr(nl, op)(x[i_p, i_f], axis=1, mask=(i_f < 40))
        r[i_p, 1] = nisa.tensor_reduce(getattr(np, {"sum": "add", "max": "max",
                                                    "mean": "add"}[op]),
                                       x[i_p, i_f], axis=1, mask=(i_p < 100) & (i_f >= 8))
        nl.store(out, r)
        return out

    a = rand(128, 64) - 0.5
    got = run(body, a)
    want0 = getattr(np, op)(a[:, :40], axis=1)
    want1 = (np.sum if op in ("sum", "mean") else np.max)(a[:, 8:], axis=1)
    np.testing.assert_allclose(got[:, 0], want0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:100, 1], want1[:100], rtol=1e-5, atol=1e-6)
    assert (got[100:, 1] == 0).all()           # masked-out rows keep the zeros


def test_tensor_reduce_over_non_consecutive_axes_is_a_tolerated_rule():
    """nki.isa.tensor_reduce (SDK 2.26): "the reduction axes must be consecutive: e.g., [1, 2,
    3, 4] is a legal axis field, but [1, 3, 4] is not"; the device takes it (a trn2 course
    solution with full marks on device pools with `nisa.tensor_reduce(nl.max, ..., axis=(1,
    3))`; AWS's own example does `nl.max(..., axis=[2, 4])`): a warning quoting the rule
    (strict mode: the error), NumPy's values. A 2x2 max pool
    of a (P, 4x8) tile written as axis=[2, 4] of a (P, 2, 2, 4, 2) view; consecutive axes
    (axis=[3, 4] of the same view) warn nothing."""
    def body(a):
        out = nl.ndarray((128, 2, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, nisa.tensor_reduce(nl.max, t.reshape((128, 2, 2, 4, 2)), axis=[2, 4]))
        return out

    def consecutive(a):
        out = nl.ndarray((128, 2, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, nisa.tensor_reduce(nl.max, t.reshape((128, 2, 2, 4, 2)), axis=[3, 4]))
        return out

    a = RNG.standard_normal((128, 32)).astype(np.float32)
    with pytest.warns(NKIRuleWarning, match=r"axis=\[2, 4\] is not a run of consecutive"):
        got = simulate(nki.jit(body), (a,), {})
    assert np.array_equal(got, a.reshape(128, 2, 2, 4, 2).max(axis=(2, 4)))
    with pytest.raises(ValueError, match="strict mode") as ei:
        run(body, a, strict=True)
    assert ei.value.nki_code == "nkisim_strict_rule"
    assert np.array_equal(run(consecutive, a, strict=True),
                          a.reshape(128, 2, 2, 4, 2).max(axis=(3, 4)))
