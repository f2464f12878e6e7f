"""A student's assignment checkout, checked the ways the README tells them to.

The layout is the course's (cs149-assignment §1, §2): ``part1/kernels.py`` with the four Part 1
kernels and ``part2/conv2d.py`` with ``fused_conv2d_maxpool``. The correct kernels are the
repo's own (kernels/), copied as a student's files; the buggy checkout is the same conv with
the bias dropped, the bug a float32 ``np.allclose`` on the course's bias-free small case never
sees and a bf16 check hides under one ulp per element.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIAS_LINE = "    bias_sb[...] = nisa.tensor_copy(raw, dtype=nl.float32)\n"
NO_BIAS = "    bias_sb[...] = nisa.memset((PMAX, n_co), value=0.0, dtype=nl.float32)\n"


def _checkout(root: Path, drop_bias: bool) -> Path:
    (root / "part1").mkdir(parents=True)
    (root / "part2").mkdir()
    part1 = (REPO / "kernels" / "vector_add.py").read_text() + "\n\n" + \
        (REPO / "kernels" / "transpose.py").read_text()
    (root / "part1" / "kernels.py").write_text(part1)
    conv = (REPO / "kernels" / "conv2d.py").read_text()
    assert conv.count(BIAS_LINE) == 1
    if drop_bias:
        conv = conv.replace(BIAS_LINE, NO_BIAS)
    (root / "part2" / "conv2d.py").write_text(conv)
    return root


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    base = tmp_path_factory.mktemp("student")
    return _checkout(base / "good", False), _checkout(base / "buggy", True)


def _run(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH="")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=900)


# a few cases of every kernel, in every dtype (the whole --quick run takes minutes)
CASES = "naive-n128,stream-n384,tiled-n1000,transpose-512x1024,conv2d-small-bias-pool2"


def test_course_passes_the_correct_kernels(checkouts):
    good, _ = checkouts
    r = _run("-m", "nkiverify.cli", "course", str(good), "--quick", "--cases", CASES,
             "-j", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for kernel in ("naive", "tiled", "stream", "transpose", "conv2d"):
        assert f"PASS  {kernel}" in out
    # every case in every dtype: the small pooled conv ran in fp32, fp16 and bf16
    for dtype in ("float32", "float16", "bfloat16"):
        assert f"conv2d-small-bias-pool2  {dtype}" in out
    # latency with the course's verdicts (the extra-credit size under --quick)
    assert "latency estimates" in out and "B=1 256->256 32x16 k=3 bias pool=2 float16" in out
    assert "(threshold 84 us)" in out
    # a progress line on stderr as each estimate starts (the phase took up to 24 s in silence)
    assert "nki-verify course: estimating the latency of 4 configurations on nkisim (trn2)" \
        in r.stderr
    assert "[1/4] estimating conv2d B=1 256->256 32x16 k=3 bias pool=1 float32 ..." in r.stderr
    # --cases and --quick restrict the run: the verdict says so, not "every case the course
    # requires passed"
    assert "every case the course requires passed" not in out
    assert re.search(r"every case run that the course requires passed \(15 of the course's "
                     r"\d+ case runs selected by --cases and --quick; the others were not "
                     r"run\)", out), out


def test_course_reports_the_missing_bias(checkouts):
    _, buggy = checkouts
    r = _run("-m", "nkiverify.cli", "course", str(buggy), "--quick", "--cases",
             "conv2d-small-bias-pool2,conv2d-small-c128-c128,naive-n128", "-j", "2")
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert "PASS  naive" in out and "FAIL  conv2d" in out
    # the course's own bias-free configuration (float32) passes; our extra cases (the same
    # configuration in fp16 and bf16, which the course's harness never runs, and the small
    # conv with a bias in every dtype) pass only where there is no bias
    assert "course configurations 1/1, extra cases 2/5" in out
    # and the table says which runs are the course's own
    assert re.search(r"conv2d-small-c128-c128 +float32 +course +PASS", out)
    assert re.search(r"conv2d-small-c128-c128 +float16 +extra +PASS", out)
    assert "fix first:" in out
    assert "systematic error" in out and "missing bias" in out
    # the timed configurations were not run here: their estimates say so, as the kernel fails
    assert "its output on this configuration was not checked, and 3 of its conv2d runs fail" \
        in out
    assert f"rerun: nki-verify run --kernel conv2d={buggy / 'part2' / 'conv2d.py'}" in out
    assert re.search(r"rerun: .* --cases conv2d-small-bias-pool2 --dtypes \S+ --target trn2$",
                     out, re.M), out


@pytest.mark.parametrize("which, code", [("good", 0), ("buggy", 1)])
def test_pytest_nki_kernel_runs_the_students_conv(checkouts, which, code):
    path = checkouts[0 if which == "good" else 1] / "part2" / "conv2d.py"
    r = _run("-m", "pytest", "-m", "simulate", "-q", "-p", "no:cacheprovider",
             "--nki-kernel", f"conv2d={path}:fused_conv2d_maxpool",
             "tests/kernels/test_cases.py", "-k", "small-bias-pool2 and simulate",
             cwd=REPO)
    assert r.returncode == code, r.stdout[-3000:]
    assert "3 passed" in r.stdout if code == 0 else "3 failed" in r.stdout
    if code:
        assert "missing bias" in r.stdout and str(path) in r.stdout


def test_pytest_nki_kernel_skips_the_tests_of_our_own_kernel(checkouts):
    # tests/kernels/test_conv2d_kernel.py imports our conv2d module: under --nki-kernel it
    # would pass whatever the student's kernel does (it passed with the bias dropped)
    path = checkouts[1] / "part2" / "conv2d.py"
    r = _run("-m", "pytest", "-m", "simulate", "-q", "-p", "no:cacheprovider", "-rs",
             "--nki-kernel", f"conv2d={path}:fused_conv2d_maxpool",
             "tests/kernels/test_conv2d_kernel.py", "-k", "small_images_bias_and_pool",
             cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "passed" not in r.stdout and "tests our own conv2d kernel, not yours" in r.stdout


def test_pytest_nki_kernel_skips_the_cases_beyond_the_course_contract(checkouts):
    # docs/course-contract.md: pool 3 is beyond what the course asks of a conv2d, so a kernel
    # given with --nki-kernel skips that stored case (course lists it as not required), and
    # --nki-contract hardware runs it
    path = checkouts[0] / "part2" / "conv2d.py"
    args = ("-m", "pytest", "-m", "simulate", "-q", "-p", "no:cacheprovider", "-rs",
            "--nki-kernel", f"conv2d={path}:fused_conv2d_maxpool", "tests/kernels/test_cases.py",
            "-k", "conv2d-pool3 and beta1 and simulate")
    r = _run(*args, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "1 skipped" in r.stdout and "beyond the course's contract for conv2d" in r.stdout
    r = _run(*args, "--nki-contract", "hardware", cwd=REPO)
    assert "1 skipped" not in r.stdout and ("1 passed" in r.stdout or "1 failed" in r.stdout)


def test_nki_kernel_without_a_name_finds_the_family(checkouts):
    good, _ = checkouts
    r = _run("-m", "nkiverify.cli", "run", "--kernel",
             f"{good / 'part1' / 'kernels.py'}:vector_add_stream", "--cases", "stream-n384",
             "--dtypes", "float16", "-j", "1")
    assert r.returncode == 0, r.stderr
    assert "stream-n384  float16" in r.stdout


def test_course_checks_a_trn1_checkout_on_trn1(tmp_path):
    # the trn1 course's layout (part1/vec_add.py, no transpose): simulated on trn1, with the
    # trn1 course's thresholds
    root = _checkout(tmp_path / "trn1", False)
    (root / "part1" / "kernels.py").write_text((REPO / "kernels" / "vector_add.py").read_text())
    (root / "part1" / "vec_add.py").write_text("# the trn1 course's Part 1 runner\n")
    r = _run("-m", "nkiverify.cli", "course", str(root), "--quick", "--cases",
             "naive-n128,conv2d-small-bias-pool2", "-j", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "on trn1 (the trn1 course's layout" in r.stderr
    assert "on nkisim (trn1)" in r.stdout
    assert "32x16 k=3 bias pool=2 float16" in r.stdout and "no course threshold on trn1" in r.stdout


# legal on trn2, not on trn1 (NeuronCore-v2 runs no tensor_scalar arithmetic on the Scalar
# Engine): a trn1 student's realistic mistake
TRN1_ONLY_BAD_TILED = """
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def vector_add_tiled(a_vec, b_vec):
    out = nl.ndarray(a_vec.shape, dtype=a_vec.dtype, buffer=nl.shared_hbm)
    M = a_vec.shape[0]
    ROW_CHUNK = 128
    for m in nl.affine_range(M // ROW_CHUNK):
        a = nl.ndarray((ROW_CHUNK, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
        b = nl.ndarray((ROW_CHUNK, 1), dtype=b_vec.dtype, buffer=nl.sbuf)
        a[...] = nl.load(a_vec[m * ROW_CHUNK:(m + 1) * ROW_CHUNK])
        b[...] = nl.load(b_vec[m * ROW_CHUNK:(m + 1) * ROW_CHUNK])
        res = nisa.tensor_scalar(a, nl.add, b, engine=nisa.scalar_engine)
        nl.store(out[m * ROW_CHUNK:(m + 1) * ROW_CHUNK], value=res)
    return out
"""


def test_a_trn1_courses_rerun_line_reruns_on_trn1(tmp_path):
    """The rerun line of a course run on trn1 once had no --target: ``run`` took trn2, where
    the kernel is legal, and passed the case the course had just failed."""
    (tmp_path / "part1").mkdir()
    (tmp_path / "part1" / "kernels.py").write_text(TRN1_ONLY_BAD_TILED)
    (tmp_path / "part1" / "vec_add.py").write_text("# the trn1 course's Part 1 runner\n")
    r = _run("-m", "nkiverify.cli", "course", str(tmp_path), "--quick", "--cases",
             "tiled-n25600", "-j", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Scalar Engine runs tensor_scalar arithmetic only from NeuronCore-v3" in r.stdout
    rerun = re.search(r"rerun: nki-verify (run .*)$", r.stdout, re.M).group(1)
    assert rerun.endswith("--cases tiled-n25600 --dtypes float32 --target trn1"), rerun
    again = _run("-m", "nkiverify.cli", *shlex.split(rerun))
    assert again.returncode == 1, again.stdout + again.stderr
    assert "on nkisim (trn1)" in again.stdout and "tiled-n25600  float32  course  ERROR" \
        in again.stdout


def test_a_kernel_of_a_trn1_checkout_runs_on_trn1_without_target(tmp_path, monkeypatch):
    """``nki-verify --kernel`` / ``case`` / ``bench`` on a file of a trn1 course checkout take
    trn1, as ``course`` does, and say so; --target and $NKISIM_TARGET still decide."""
    (tmp_path / "part1").mkdir()
    (tmp_path / "part1" / "kernels.py").write_text(TRN1_ONLY_BAD_TILED)
    ref = f"{tmp_path / 'part1' / 'kernels.py'}:vector_add_tiled"
    monkeypatch.delenv("NKISIM_TARGET", raising=False)
    r = _run("-m", "nkiverify.cli", "--kernel", ref, "--cases", "tiled-n25600", "-j", "1")
    assert "on nkisim (trn2)" in r.stdout, r.stdout + r.stderr      # no trn1 runner: trn2
    (tmp_path / "part1" / "vec_add.py").write_text("# the trn1 course's Part 1 runner\n")
    r = _run("-m", "nkiverify.cli", "--kernel", ref, "--cases", "tiled-n25600", "-j", "1")
    assert "nki-verify run: on trn1, the trn1 course's layout (part1/vec_add.py)" in r.stderr
    assert "on nkisim (trn1)" in r.stdout and "tiled-n25600  float32  course  ERROR" in r.stdout
    r = _run("-m", "nkiverify.cli", "--kernel", ref, "--cases", "tiled-n25600", "-j", "1",
             "--target", "trn2")
    assert "on nkisim (trn2)" in r.stdout, r.stdout + r.stderr


# the handout's tiled loop (ROW_CHUNK = 128, no tail): all the course requires
NO_TAIL_TILED = """
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def vector_add_tiled(a_vec, b_vec):
    out = nl.ndarray(a_vec.shape, dtype=a_vec.dtype, buffer=nl.shared_hbm)
    M = a_vec.shape[0]
    ROW_CHUNK = 128
    for m in nl.affine_range(M // ROW_CHUNK):
        a = nl.load(a_vec[m * ROW_CHUNK:(m + 1) * ROW_CHUNK])
        b = nl.load(b_vec[m * ROW_CHUNK:(m + 1) * ROW_CHUNK])
        nl.store(out[m * ROW_CHUNK:(m + 1) * ROW_CHUNK], value=nl.add(a, b))
    return out
"""


def test_cases_beyond_the_course_contract_do_not_fail_the_course(tmp_path):
    """docs/course-contract.md: the course's tiled kernel handles multiples of 128; n = 1000
    shows the dropped tail, but the course never asks for it."""
    from fixtures.configs import CASES
    from nkiverify import strategies
    beyond = [c.id for c in CASES if not strategies.in_course_contract(c.kernel, c.params)]
    # (the contract's table: tiled n % 128, stream n % (128 x 200), a 3x3 filter, pool 1 or 2)
    assert beyond == ["tiled-n1000", "stream-n384", "stream-n262272", "conv2d-k1",
                      "conv2d-k5-pool2", "conv2d-pool3"]
    (tmp_path / "part1").mkdir()
    (tmp_path / "part1" / "kernels.py").write_text(NO_TAIL_TILED)
    report = tmp_path / "report.json"
    r = _run("-m", "nkiverify.cli", "course", str(tmp_path), "--quick", "--cases",
             "tiled-n25600,tiled-n1000", "-j", "1", "--report", str(report))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS  tiled     3/6 cases" in r.stdout
    # the report carries the course's verdict and split, not only "failed: 3"
    course = json.loads(report.read_text())["course"]
    assert course["exit_status"] == 0 and course["target"] == "trn2"
    tiled = next(k for k in course["kernels"] if k["kernel"] == "tiled")
    assert (tiled["verdict"], tiled["passed"], tiled["cases"]) == ("PASS", 3, 6)
    assert (tiled["beyond_contract"]["passed"], tiled["beyond_contract"]["cases"]) == (0, 3)
    assert tiled["course_configurations"]["case_runs"] == ["tiled-n25600 float32"]
    # (tiled-n25600 is a course configuration in float32; in fp16 and bf16 an extra case)
    assert "course configurations 1/1, extra cases 2/2, beyond the course's contract 0/3 " \
        "(not required)" in r.stdout
    # (this checkout defines only vector_add_tiled: the other course kernels are not found)
    assert "every case run that was checked passed (6 of the course's " in r.stdout
    assert "but the course's naive, stream, transpose, conv2d kernels were not found" in r.stdout
    assert "beyond the course's contract (not required; docs/course-contract.md):" in r.stdout
    assert "fix first:" not in r.stdout


def test_run_mode_holds_a_users_kernel_to_the_course_contract(tmp_path):
    """`nki-verify --kernel` agrees with `course`: tiled n = 1000 (beyond the contract) fails
    but is labelled and does not fail the run; n = 25600 (a course configuration) passes."""
    (tmp_path / "kernels.py").write_text(NO_TAIL_TILED)
    kernel = f"tiled={tmp_path / 'kernels.py'}:vector_add_tiled"
    r = _run("-m", "nkiverify.cli", "run", "--kernel", kernel, "--cases",
             "tiled-n25600,tiled-n1000", "--dtypes", "float32", "-j", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"tiled-n1000 +float32 +beyond contract +FAIL", r.stdout), r.stdout
    assert "1 passed, 1 failed" in r.stdout
    assert "1 of the failures are beyond the course's contract for your kernel (not required, " \
        "docs/course-contract.md): tiled-n1000 float32" in r.stdout


def test_run_mode_prints_what_to_fix_first_with_a_rerun_line(checkouts):
    """`nki-verify --kernel` ends, as `course` does, with the first reason of your kernel's
    failures and the command that reruns that case, on stdout."""
    _, buggy = checkouts
    path = buggy / "part2" / "conv2d.py"
    r = _run("-m", "nkiverify.cli", "run", "--kernel", f"conv2d={path}:fused_conv2d_maxpool",
             "--cases", "conv2d-small-bias-pool2", "--dtypes", "float32", "-j", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    fix = r.stdout[r.stdout.index("\nfix first:"):]
    assert "conv2d: 1 case(s) fail; first: conv2d-small-bias-pool2 float32" in fix
    assert "systematic error" in fix and "missing bias" in fix
    assert f"rerun: nki-verify run --kernel conv2d={path}:fused_conv2d_maxpool --cases " \
        "conv2d-small-bias-pool2 --dtypes float32 --target trn2" in fix


def test_course_cases_filter_estimates_only_the_kernels_it_checked(checkouts):
    """`course --cases naive-n128` checks the naive kernel only: no conv2d latency estimate
    (it took 17-24 s and judged a kernel the run marked "not checked")."""
    good, _ = checkouts
    r = _run("-m", "nkiverify.cli", "course", str(good), "--quick", "--cases", "naive-n128",
             "-j", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "conv2d    0/0 cases" in r.stdout and "not checked (--cases)" in r.stdout
    assert "estimating the latency" not in r.stderr and "latency estimates" not in r.stdout
