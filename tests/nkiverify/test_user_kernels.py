"""Kernels by reference: nki_verify(kernel=...) with a path or a kernel object, --nki-kernel,
nki-verify run -j N and bench --kernel."""

import os

import pytest

from nkiverify import cli, registry

pytest_plugins = ["pytester"]

OPT_IN = "[pytest]\nnki_verify = true\n"

FORGETS_B = '''
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def forgets_b(a_vec, b_vec):
    out = nl.ndarray(a_vec.shape, dtype=a_vec.dtype, buffer=nl.hbm)
    a = nl.ndarray((a_vec.shape[0], 1), dtype=a_vec.dtype, buffer=nl.sbuf)
    nisa.dma_copy(src=a_vec, dst=a)
    nisa.dma_copy(src=a, dst=out)
    return out
'''


def test_nki_verify_takes_a_kernel_object_or_a_path(pytester):
    pytester.makeini(OPT_IN)
    pytester.makepyfile(bad_kernels=FORGETS_B)
    pytester.makepyfile(test_k="""
        from nkiverify.kernels.vector_add import vector_add_stream

        def test_object(nki_verify):
            out = nki_verify(kernel=vector_add_stream, params={"n": 384}, dtype="float16")
            assert out.passed

        def test_path_with_family(nki_verify):
            nki_verify(kernel="bad_kernels.py:forgets_b", family="naive", params={"n": 64},
                       dtype="float32")

        def test_reference(nki_verify):
            nki_verify("naive=bad_kernels.py:forgets_b", {"n": 64}, "float32")
    """)
    result = pytester.runpytest("-m", "simulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2, deselected=3)
    out = result.stdout.str()
    assert "forgets_b" in out and "beyond tolerance" in out
    assert "reproduce: nki-verify case naive --params n=64" in out


def test_an_in_process_session_leaves_the_registry_as_it_was(pytester, tmp_path):
    from nkiverify import registry
    conv = tmp_path / "conv2d.py"
    conv.write_text("def fused_conv2d_maxpool(X, W, bias, pool_size=1):\n    pass\n")
    before = dict(registry.KERNELS)
    pytester.makepyfile("def test_a():\n    pass\n")
    pytester.runpytest("--nki-kernel", f"{conv}:fused_conv2d_maxpool").assert_outcomes(passed=1)
    assert registry.KERNELS == before


def test_nki_kernel_option_replaces_the_family_in_shipped_style_tests(pytester):
    pytester.makepyfile(bad_kernels=FORGETS_B)
    pytester.makepyfile(test_k="""
        def test_naive(nki_verify):
            nki_verify("naive", {"n": 64}, "float32")
    """)
    ours = pytester.runpytest("-m", "simulate", "-p", "no:cacheprovider")
    ours.assert_outcomes(passed=1, deselected=1)
    theirs = pytester.runpytest("-m", "simulate", "-p", "no:cacheprovider",
                                "--nki-kernel", "naive=bad_kernels.py:forgets_b")
    theirs.assert_outcomes(failed=1, deselected=1)
    bad = pytester.runpytest("--nki-kernel", "mine.py:nope")
    assert bad.ret == 4
    assert "--nki-kernel" in bad.stderr.str() and "not one of the course's functions" in \
        bad.stderr.str()


def test_nki_contract_is_course_for_a_users_kernel(pytester, tmp_path):
    pytester.makepyfile(test_c="""
        def test_c(nki_contract):
            print("CONTRACT", nki_contract("conv2d"), nki_contract("naive"))
    """)
    conv = tmp_path / "conv2d.py"
    conv.write_text("def fused_conv2d_maxpool(X, W, bias, pool_size=1):\n    pass\n")
    r = pytester.runpytest("-s", "--nki-kernel", f"{conv}:fused_conv2d_maxpool")
    assert "CONTRACT course hardware" in r.stdout.str()
    r = pytester.runpytest("-s", "--nki-contract", "hardware", "--nki-kernel",
                           f"{conv}:fused_conv2d_maxpool")
    assert "CONTRACT hardware hardware" in r.stdout.str()


def test_parallel_run_prints_in_the_same_order():
    import subprocess
    import sys
    args = [sys.executable, "-m", "nkiverify.cli", "--cases",
            "naive-n64,stream-n384,transpose-1024x384", "--dtypes", "float16"]

    def rows(jobs):
        r = subprocess.run([*args, "-j", jobs], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return [ln.split()[:4] for ln in r.stdout.splitlines()
                if ln.startswith(("naive-", "stream-", "transpose-"))]

    serial, parallel = rows("1"), rows("2")
    assert serial == parallel
    assert [r[0] for r in serial] == ["naive-n64", "naive-n64[nki]", "stream-n384",
                                      "stream-n384[nki]", "transpose-1024x384",
                                      "transpose-1024x384[nki]"]


def test_bench_takes_a_kernel_reference(tmp_path, capsys, monkeypatch):
    from pathlib import Path
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))
    path = tmp_path / "kernels.py"
    path.write_text((Path(__file__).resolve().parents[2] / "kernels" / "transpose.py").read_text())
    assert cli.main(["bench", "--kernel", f"{path}:matrix_transpose", "-n", "256"]) == 0
    out = capsys.readouterr().out
    assert f"transpose ({path}:matrix_transpose) 256x256 float32" in out
    assert "estimated latency" in out


def test_bench_checks_the_output_it_times(tmp_path, capsys, monkeypatch):
    """A grade for a kernel that computes the wrong thing would mislead (the course's harness
    times only kernels that pass its correctness tests): bench compares the timed run's output
    with the golden model, says which way it went, and exits 1 when it is wrong."""
    from pathlib import Path
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))
    src = (Path(__file__).resolve().parents[2] / "kernels" / "conv2d.py").read_text()
    bias = "    bias_sb[...] = nisa.tensor_copy(raw, dtype=nl.float32)\n"
    assert src.count(bias) == 1
    good, bad = tmp_path / "good.py", tmp_path / "nobias.py"
    good.write_text(src)
    bad.write_text(src.replace(bias, "    bias_sb[...] = nisa.memset((PMAX, n_co), value=0.0, "
                                     "dtype=nl.float32)\n"))
    args = ["bench", "--image", "32x16", "--dtype", "float16", "--kernel"]
    assert cli.main([*args, f"conv2d={good}:fused_conv2d_maxpool"]) == 0
    out = capsys.readouterr().out
    assert "output              matches the golden model" in out
    assert "course threshold (float16, 32): threshold 84 us -> within the threshold\n" in out
    assert cli.main([*args, f"conv2d={bad}:fused_conv2d_maxpool"]) == 1
    out = capsys.readouterr().out
    assert "output              WRONG: " in out
    assert "-> within the threshold if it were correct, but its output is wrong (above)" in out


def test_spec_for_names_what_it_cannot_resolve():
    with pytest.raises(registry.KernelRefError, match="cannot tell which kernel family"):
        registry.spec_for(lambda x: x)
    with pytest.raises(registry.KernelRefError, match="unknown kernel 'nope'"):
        registry.parse_kernel_ref("nope=x.py:f")


MATMUL = '''
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def matmul(a_t, b, lowp=False):
    """a_t.T @ b, K in tiles of 128 accumulated in PSUM; ``lowp``: the operands in bf16."""
    k_total, m = a_t.shape
    n = b.shape[1]
    out = nl.ndarray((m, n), dtype=b.dtype, buffer=nl.shared_hbm)
    acc = nl.zeros((m, n), nl.float32, buffer=nl.psum)
    for k in nl.affine_range(k_total // 128):
        at = nl.load(a_t[k * 128:(k + 1) * 128, :])
        bt = nl.load(b[k * 128:(k + 1) * 128, :])
        if lowp:
            at = nl.copy(at, dtype=nl.bfloat16)
            bt = nl.copy(bt, dtype=nl.bfloat16)
        acc += nisa.nc_matmul(at, bt)
    nl.store(out, value=nl.copy(acc, dtype=b.dtype))
    return out
'''


@pytest.mark.parametrize("k_total", [128, 512])
def test_a_registered_reduction_is_not_failed_by_the_default_baseline(tmp_path, monkeypatch,
                                                                      k_total):
    # The default baseline is the golden rounded once: after an fp32 sum of K products the
    # correct kernel is several fp32 ulps off (5-6 at K=128), which 4x that baseline failed.
    # The tolerance still fails the same kernel computing with bf16 operands.
    import numpy as np

    from nkiverify.backends import get_backend
    (tmp_path / "mm.py").write_text(MATMUL)
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))

    def inputs(params, dtype, seed, dist):
        rng = np.random.default_rng(seed)
        return ((registry.values(rng, (params["k"], 128), dtype, dist),
                 registry.values(rng, (params["k"], 64), dtype, dist)),
                {"lowp": params["lowp"]})

    def golden(a_t, b, lowp=False):
        return a_t.astype(np.float64).T @ b.astype(np.float64)

    registry.register("mm", kernel=f"{tmp_path / 'mm.py'}:matmul", inputs=inputs,
                      golden=golden, reduction_length=lambda p: p["k"])
    backend = get_backend("nkisim", "trn2")
    for seed in range(3):
        good = registry.run_case("mm", {"k": k_total, "lowp": False}, "float32", backend,
                                 seed=seed)
        assert good.passed, good.comparison.message()
        assert good.comparison.baseline_stats is None
    bad = registry.run_case("mm", {"k": k_total, "lowp": True}, "float32", backend)
    assert not bad.passed and "beyond tolerance" in bad.comparison.message()


RETURNS_M_BY_1 = '''
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def vector_add_naive(a_vec, b_vec):
    out = nl.ndarray((a_vec.shape[0], 1), dtype=a_vec.dtype, buffer=nl.shared_hbm)
    a = nl.load(a_vec.reshape((a_vec.shape[0], 1)))
    b = nl.load(b_vec.reshape((b_vec.shape[0], 1)))
    nl.store(out, value=nl.add(a, b))
    return out
'''


def test_an_m_by_1_vector_sum_is_read_as_each_courses_harness_reads_it(tmp_path):
    """cs149-assignment §1: the trn1 runner (vec_add.py) checks ``out.reshape(a.shape)``, as its
    direct-allocation kernel returns ``out.reshape((M, 1))``; the trn2 runner (run_benchmark.py)
    checks ``np.allclose(out, a + b)`` as returned, so an (M, 1) output fails there."""
    from nkiverify.backends import get_backend
    path = tmp_path / "kernels.py"
    path.write_text(RETURNS_M_BY_1)
    spec = registry.spec_for(f"naive={path}:vector_add_naive")
    on = {t: registry.run_case(spec, {"n": 128}, "float32", get_backend("nkisim", target=t))
          for t in ("trn1", "trn2")}
    assert on["trn1"].comparison.passed, on["trn1"].comparison.reasons
    assert not on["trn2"].comparison.passed
    assert "shape mismatch: kernel output (128, 1), golden (128,)" in \
        on["trn2"].comparison.reasons[0]


def test_course_notes_say_why_a_function_is_skipped(tmp_path):
    (tmp_path / "part1").mkdir()
    (tmp_path / "part1" / "kernels.py").write_text(RETURNS_M_BY_1)
    refs, notes = cli.find_course_kernels(str(tmp_path))
    assert refs == [f"naive={tmp_path / 'part1' / 'kernels.py'}:vector_add_naive"]
    assert "part1/kernels.py: no vector_add_tiled (skipped)" in notes
    assert "part1/kernels.py: no matrix_transpose (skipped; the trn1 course's part 1 has no " \
        "transpose)" in notes
    assert "part2/conv2d.py: not found (its kernels are skipped)" in notes
    # the trn1 handout's direct-allocation kernels (given whole) are named, not checked
    (tmp_path / "part1" / "kernels.py").write_text(
        RETURNS_M_BY_1 + "\n\ndef vector_add_direct_allocation(a, b):\n    pass\n")
    refs, notes = cli.find_course_kernels(str(tmp_path))
    assert len(refs) == 1 and any(n.startswith(
        "part1/kernels.py: vector_add_direct_allocation not checked (the handout's own; ")
        for n in notes), notes


def test_an_error_deep_in_an_op_points_at_the_kernels_line(tmp_path):
    from nkiverify.backends import get_backend
    path = tmp_path / "bad.py"
    path.write_text(RETURNS_M_BY_1.replace(
        "    nl.store(out, value=nl.add(a, b))",
        "    nl.store(out, value=nisa.tensor_scalar(a, nl.add, b_vec))").replace(
        "import neuronxcc.nki.language as nl",
        "import neuronxcc.nki.isa as nisa\nimport neuronxcc.nki.language as nl"))
    line = path.read_text().splitlines().index(
        "    nl.store(out, value=nisa.tensor_scalar(a, nl.add, b_vec))") + 1
    spec = registry.spec_for(f"naive={path}:vector_add_naive")
    with pytest.raises(TypeError) as info:       # operand0 in HBM: raised inside nkisim
        registry.run_case(spec, {"n": 128}, "float32", get_backend("nkisim"))
    where = cli._user_traceback(info.value)
    assert where.startswith("in the kernel's code (most recent call last):\n")
    assert f'File "{path}", line {line}, in vector_add_naive' in where
    import nkisim
    assert os.path.dirname(nkisim.__file__) not in where          # none of nkisim's frames
    # nothing of the user's raised: no frames to show
    assert cli._user_traceback(registry.KernelReturnedNone("returned None")) == ""


BLOCK_DIM_ADD = '''
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def vector_add_naive(a_vec, b_vec):
    n = a_vec.shape[0]
    out = nl.ndarray((n,), dtype=a_vec.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((2, nl.par_dim(n), 1), dtype=a_vec.dtype, buffer=nl.sbuf)
    t[0] = nl.load(a_vec.reshape((n, 1)))
    t[1] = nl.load(b_vec.reshape((n, 1)))
    nl.store(out.reshape((n, 1)), value=nl.add(t[0], t[1]))
    return out
'''


def test_a_warning_every_run_raises_is_printed_once_with_its_count(tmp_path):
    """A course checkout runs a kernel ~100 times: its warnings (here NKI's block-dimension
    rule, ref: warn_block_dimension_is_deprecated) come once per kernel line, with how many
    runs raised them, not once per run (here from worker processes: -j 2; -j 1 runs the same
    capture in the parent)."""
    import subprocess
    import sys
    path = tmp_path / "kernels.py"
    path.write_text(BLOCK_DIM_ADD)
    line = BLOCK_DIM_ADD.splitlines().index(
        "    t = nl.ndarray((2, nl.par_dim(n), 1), dtype=a_vec.dtype, buffer=nl.sbuf)") + 1
    r = subprocess.run([sys.executable, "-m", "nkiverify.cli", "run", "--kernel",
                        f"naive={path}:vector_add_naive", "--cases", "naive-*", "--dtypes",
                        "float32,float16", "-j", "2"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    runs = sum(ln.startswith("naive-") for ln in r.stdout.splitlines())
    assert runs >= 3, r.stdout
    assert r.stderr.count("warn_block_dimension_is_deprecated") == 1, r.stderr
    assert f"{path}:{line}: NKIRuleWarning: NKI rule the device tolerates" in r.stderr
    assert f"in {runs} of {runs} runs (first: naive-" in r.stderr


def test_a_course_kernel_returning_a_wider_dtype_is_a_suspicious_pattern(tmp_path, monkeypatch):
    """The handout allocates X_out with dtype=X.dtype; a float32 output of a float16 case passes
    on its values (and the course's np.allclose) but is not the kernel the course times."""
    import warnings
    from pathlib import Path

    from nkisim import NKIWarning
    from nkiverify.backends import NkisimBackend
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))
    src = (Path(__file__).resolve().parents[2] / "kernels" / "vector_add.py").read_text()
    line = "    out = nl.ndarray(shape=a_vec.shape, dtype=a_vec.dtype, buffer=nl.hbm)\n"
    assert line in src
    (tmp_path / "wide.py").write_text(src.replace(line, line.replace("a_vec.dtype",
                                                                     "nl.float32"), 1))
    spec = registry.use_kernel(f"{tmp_path / 'wide.py'}:vector_add_naive")
    params = {"n": 128}
    for dtype, warned in (("float16", True), ("float32", False)):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            outcome = registry.run_case(spec, params, dtype, NkisimBackend())
        assert outcome.passed
        texts = [str(w.message) for w in ws if issubclass(w.category, NKIWarning)]
        hit = [t for t in texts if "the kernel returns float32 for a float16 case" in t]
        assert bool(hit) == warned, texts


def test_bench_reads_the_output_as_the_checks_do(tmp_path, monkeypatch, capsys):
    """``nki-verify bench`` judges the output it times the way ``run_case`` does, warning
    included: the wider output moves more bytes than the kernel the course times."""
    import warnings
    from pathlib import Path

    from nkisim import NKIWarning
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))
    src = (Path(__file__).resolve().parents[2] / "kernels" / "vector_add.py").read_text()
    line = "    out = nl.ndarray(shape=a_vec.shape, dtype=a_vec.dtype, buffer=nl.hbm)\n"
    (tmp_path / "wide.py").write_text(src.replace(line, line.replace("a_vec.dtype",
                                                                     "nl.float32"), 1))
    for dtype, warned in (("float16", True), ("float32", False)):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            assert cli.main(["bench", "--kernel", f"naive={tmp_path / 'wide.py'}:vector_add_naive",
                             "-n", "128", "--dtype", dtype]) == 0
        assert "output              matches the golden model" in capsys.readouterr().out
        texts = [str(w.message) for w in ws if issubclass(w.category, NKIWarning)]
        assert any("the kernel returns float32 for a float16 case" in t for t in texts) == warned
