"""Every bad input of issue 9: a one-line error naming the argument or the kernel line, exit
status 2 for usage errors, 1 for a failed case, 0 when all is well."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from nkiverify.report import CaseRecord, Report

PY = sys.executable
pytest_plugins = ["pytester"]
BAD = '''
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def returns_none(a_vec, b_vec):
    out = nl.ndarray(a_vec.shape, dtype=a_vec.dtype, buffer=nl.hbm)


@nki.jit
def huge_tile(a_vec, b_vec):
    t = nl.ndarray((128, 1000000000), dtype=nl.float32, buffer=nl.sbuf)
    return t
'''


def run(*args, env=None, **kw):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(list(args), capture_output=True, text=True, env=e, timeout=300, **kw)


def nkv(*args, env=None):
    return run(PY, "-m", "nkiverify.cli", *args, env=env)


@pytest.fixture
def nkv_here(capsys, monkeypatch):
    """``nki-verify ARGS`` in this process (what ``python -m nkiverify.cli`` calls), as a
    CompletedProcess: the usage errors need no process of their own (a Python start costs
    about 0.3 s of CPU); the exit status of the real command is checked in
    test_exit_status_0_1_2 and test_unknown_target_from_the_environment."""
    from nkiverify import cli, registry
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))

    def call(*args):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:       # argparse's own usage errors
            code = exc.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)
    return call


def one_line_error(r, *needles, code=2):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


CONV = "batch=1,c_in=128,c_out=128,height=8,width=8,k=3,"
CONV_KEYS = "batch,c_in,c_out,height,width,k,bias,pool"


@pytest.mark.parametrize("args, needles", [
    (["--report", "/nonexistent/r.json"], ["--report /nonexistent/r.json",
                                           "directory /nonexistent does not exist"]),
    (["bench", "conv2d", "--dtype", "foo"], ["argument --dtype", "unknown dtype 'foo'"]),
    (["bench", "tiled", "-n", "-5"], ["argument -n/--n", "positive integer, got -5"]),
    (["bench", "conv2d", "--pool", "0"], ["argument --pool", "positive integer, got 0"]),
    (["bench", "conv2d", "--channels", "100x100"], ["--channels 100x100", "multiples of 128"]),
    (["bench", "conv2d", "--image", "32"], ["--image needs 2 numbers"]),
    (["--dtypes", "float99"], ["argument --dtypes", "unknown dtype 'float99'"]),
    (["-j", "0"], ["argument -j/--jobs"]),
    (["--kernel", "conv2d=/nonexistent/conv2d.py:f"], ["--kernel", "no such file"]),
    (["--kernel", "mine.py:my_conv"], ["--kernel", "not one of the course's functions",
                                       "NAME="]),
    (["--cases", "nothing-matches"], ["no case matches"]),
    (["course", "/nonexistent"], ["DIR", "no such directory"]),
    (["case", "conv2d", "--params", "batch"], ["--params", "KEY=VALUE"]),
    # a boolean that is none of true/false, yes/no, on/off, 1/0 (any case)
    (["case", "conv2d", "--params", CONV + "bias=maybe,pool=2"],
     ["--params", "bias=maybe", "expected a boolean"]),
    (["case", "conv2d", "--params", "batch=one" + CONV[7:] + "bias=1,pool=2"],
     ["--params", "batch=one", "expected an integer"]),
    # a typo'd key (poool) once ran pool=2 silently; a missing one was a bare KeyError, exit 1
    (["case", "conv2d", "--params", CONV + "bias=True,pool=2,poool=3"],
     ["--params", "conv2d takes " + CONV_KEYS, "unknown 'poool'", "case --help"]),
    (["case", "conv2d", "--params", "batch=1,c_in=128"],
     ["--params", "conv2d takes " + CONV_KEYS, "missing 'c_out', 'height', 'width', 'k', "
      "'bias', 'pool'"]),
    (["case", "transpose", "--params", "n=256"], ["--params", "transpose takes m,n",
                                                  "missing 'm'"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("-") or
    isinstance(v, list) and v and v[0] in ("bench", "course", "case") else None)
def test_usage_errors_exit_2_with_one_line(args, needles, nkv_here):
    r = nkv_here(*args)
    one_line_error(r, *needles)
    assert "[1/" not in r.stderr            # nothing ran (the report path checked first)


@pytest.mark.parametrize("bias, passes", [("false", True), ("No", True), ("off", True),
                                          ("0", True), ("False", True), ("true", False),
                                          ("YES", False), ("on", False), ("1", False)])
def test_case_params_booleans_mean_what_they_say(bias, passes, nkv_here, tmp_path):
    """``bias=false`` (or ``no``) once ran with the bias (the string 'false' is truthy): a conv
    that drops its bias passes exactly the cases without one."""
    from pathlib import Path
    conv = (Path(__file__).resolve().parents[2] / "kernels" / "conv2d.py").read_text()
    line = "    bias_sb[...] = nisa.tensor_copy(raw, dtype=nl.float32)\n"
    assert conv.count(line) == 1
    (tmp_path / "nobias.py").write_text(conv.replace(
        line, "    bias_sb[...] = nisa.memset((PMAX, n_co), value=0.0, dtype=nl.float32)\n"))
    r = nkv_here("case", "conv2d", "--params", f"{CONV}bias={bias},pool=2",
                 "--kernel", f"conv2d={tmp_path / 'nobias.py'}:fused_conv2d_maxpool")
    assert r.returncode == (0 if passes else 1), r.stdout + r.stderr
    assert ("PASS" if passes else "FAIL") in r.stdout


def test_a_kernel_importing_a_missing_package_is_one_usage_error(nkv_here, tmp_path):
    """A stray import in the student's file: one line naming the package, not an ERROR row
    for each of the kernel's cases."""
    (tmp_path / "k.py").write_text("import no_such_pkg_abc\n\ndef vector_add_naive(a, b):\n"
                                   "    return a\n")
    r = nkv_here("--kernel", f"{tmp_path / 'k.py'}:vector_add_naive", "-j", "1")
    one_line_error(r, "the naive kernel: importing", "`no_such_pkg_abc`, which is not installed",
                   "pip install no_such_pkg_abc")


def test_unknown_target_from_the_environment():
    one_line_error(nkv("--cases", "naive-n128", env={"NKISIM_TARGET": "trn3"}),
                   "unknown target 'trn3'", "NKISIM_TARGET")
    one_line_error(run(PY, "-m", "nkisim", "info", env={"NKISIM_TARGET": "trn3"}),
                   "NKISIM_TARGET", "unknown target 'trn3'")


def test_nkisim_run_checks_bogus(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    r = run(PY, "-m", "nkisim", "run", "--checks", "bogus", str(script))
    one_line_error(r, "--checks 'bogus'", "unknown nkisim check(s) ['bogus']")
    assert "ran" not in r.stdout


def test_python_dash_m_nkisim_works(tmp_path):
    r = run(PY, "-m", "nkisim", "info")
    assert r.returncode == 0 and "targets: trn1, trn2" in r.stdout
    script = tmp_path / "s.py"
    script.write_text("import neuronxcc.nki as nki\nprint(nki.__name__)\n")
    r = run(PY, "-m", "nkisim", "run", str(script))
    assert r.returncode == 0 and "nkisim" in r.stdout


def test_list_into_a_closed_pipe_is_quiet():
    r = run("bash", "-c", f"{PY} -m nkiverify.cli list | head -2")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2
    assert "BrokenPipeError" not in r.stderr and "Traceback" not in r.stderr


def test_exit_status_0_1_2(tmp_path):
    (tmp_path / "bad.py").write_text(BAD)
    assert nkv("--cases", "naive-n64", "--dtypes", "float16").returncode == 0
    failed = nkv("--kernel", f"naive={tmp_path / 'bad.py'}:returns_none", "--cases",
                 "naive-n64", "--dtypes", "float16", "-j", "1")
    assert failed.returncode == 1
    assert "returned None" in failed.stderr and "return out" in failed.stderr
    assert "ERROR" in failed.stdout
    assert nkv("--dtypes", "nope").returncode == 2


def test_a_huge_sbuf_tile_is_the_sbuf_overflow_error(tmp_path):
    (tmp_path / "bad.py").write_text(BAD)
    r = nkv("--kernel", f"naive={tmp_path / 'bad.py'}:huge_tile", "--cases", "naive-n64",
            "--dtypes", "float32", "-j", "1")
    assert r.returncode == 1
    assert "RuntimeError: SBUF overflow" in r.stderr and "MemoryError" not in r.stderr
    assert "`t` [128, 1000000000] float32: 4000000000 B (bad.py:13)" in r.stderr  # its line


def test_an_empty_input_names_the_argument(nkv_here):
    r = nkv_here("case", "naive", "--params", "n=0")
    assert r.returncode == 1
    assert "kernel argument 'a_vec' has shape (0,): an empty tensor" in r.stderr
    assert "ZeroDivisionError" not in r.stderr


def test_a_128_by_0_input():
    from nkisim import shim
    shim.install()
    from nkiverify.backends import get_backend
    b = get_backend("nkisim")
    k = b.load("nkiverify.kernels.transpose:matrix_transpose")
    with pytest.raises(ValueError, match=r"kernel argument 'a_tensor' has shape \(128, 0\): "
                                         "an empty tensor"):
        b.run(k, np.zeros((128, 0), np.float32))


def test_report_json_is_atomic_versioned_and_has_the_errors(tmp_path):
    path = tmp_path / "r.json"
    failing = CaseRecord("naive", "float32", "x", False, {}, 0.1, "nkisim", "trn2",
                         error="ValueError: boom")
    Report([failing], meta={"interrupted": True, "target": "trn2"}).to_json(path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == 2 and data["tool"] == "nkiverify"
    assert data["tool_version"] and data["created"] and data["target"] == "trn2"
    assert data["interrupted"] is True
    assert data["cases"][0]["error"] == "ValueError: boom"
    # a second run replaces the report whole (never a mix), leaving no temporary file behind
    Report([CaseRecord("stream", "float16", "y", True, {}, 0.1, "nkisim", "trn1")]).to_json(path)
    data = json.loads(path.read_text())
    assert [c["case_id"] for c in data["cases"]] == ["y"]
    assert os.listdir(tmp_path) == ["r.json"]
    assert Report.from_json(path).records[0].case_id == "y"


def test_pytest_report_path_is_checked_before_running(pytester):
    pytester.makepyfile("def test_a():\n    raise AssertionError('must not run')\n")
    r = pytester.runpytest("--nki-report", "/nonexistent/r.json", "-p", "no:cacheprovider")
    assert r.ret == 4                           # pytest's usage-error status
    assert "directory /nonexistent does not exist" in r.stderr.str()
