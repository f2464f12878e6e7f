"""``nki-verify``: the table, progress, exit status, case selection, the JSON report, bench."""

import dataclasses
import json
import subprocess
import sys

import pytest

from fixtures.configs import CASES
from nkiverify import cli, registry

BAD_KERNEL = '''
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


@nki.jit
def raises(a_vec, b_vec):
    raise ValueError("this kernel is broken")
'''


@pytest.fixture
def bad_naive(tmp_path, monkeypatch):
    """Point the registry's `naive` kernel at a buggy module; returns a setter for the attr."""
    (tmp_path / "nkv_cli_bad_kernels.py").write_text(BAD_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))

    def use(attr):
        spec = dataclasses.replace(registry.KERNELS["naive"],
                                   import_path=f"nkv_cli_bad_kernels:{attr}")
        monkeypatch.setitem(registry.KERNELS, "naive", spec)
    return use


def test_run_prints_the_table_and_progress(capsys, tmp_path):
    path = tmp_path / "r.json"
    code = cli.main(["--cases", "stream-n384,naive-n128", "--report", str(path), "-j", "1"])
    out, err = capsys.readouterr()
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("case"))
    for col in ("dtype", "result", "err/allowed", "max abs", "max rel", "max ULP", "total s"):
        assert col in header
    rows = [line.split() for line in out.splitlines()
            if line.startswith(("stream-n384", "naive-n128"))]
    # each case in both dialects by default: our Beta 1 kernel, then its current-nki twin
    assert [(r[0], r[1], r[3]) for r in rows] == [
        ("naive-n128", "float32", "PASS"), ("naive-n128[nki]", "float32", "PASS"),
        ("stream-n384", "float32", "PASS"), ("stream-n384[nki]", "float32", "PASS"),
        ("stream-n384", "float16", "PASS"), ("stream-n384[nki]", "float16", "PASS"),
        ("stream-n384", "bfloat16", "PASS"), ("stream-n384[nki]", "bfloat16", "PASS")]
    assert "8 passed, 0 failed" in out
    # progress: a line as each case starts and finishes (stderr is not a tty here)
    assert "[1/8] naive-n128 float32 ..." in err and \
        "[8/8] stream-n384[nki] bfloat16 PASS" in err
    data = json.loads(path.read_text())
    assert len(data["cases"]) == 8 and all(c["passed"] for c in data["cases"])
    assert [c["dialect"] for c in data["cases"]].count("nki") == 4
    assert {r["kernel"] for r in data["rows"]} == {"naive", "naive[nki]", "stream",
                                                   "stream[nki]"}


def test_dialect_option_picks_our_kernels_twin(capsys):
    assert cli.main(["--dialect", "nki", "--cases", "naive-n64", "--dtypes", "float16"]) == 0
    out = capsys.readouterr().out
    assert "naive-n64[nki]" in out and "1 passed, 0 failed" in out
    assert cli.main(["--dialect", "beta1", "--cases", "naive-n64", "--dtypes", "float16"]) == 0
    out = capsys.readouterr().out
    assert "naive-n64[nki]" not in out and "1 passed, 0 failed" in out


def test_run_is_the_default_command(capsys):
    assert cli.main(["run", "--cases", "naive-n64", "--dtypes", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "naive-n64" in out and "2 passed, 0 failed" in out


def test_a_wrong_kernel_fails_with_the_comparison(bad_naive, capsys):
    bad_naive("forgets_b")
    code = cli.main(["--cases", "naive-n128", "--dialect", "beta1"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "FAIL" in out and "0 passed, 1 failed" in out
    assert "=== naive-n128 float32 ===" in err and "beyond tolerance" in err


def test_a_kernel_that_raises_is_an_error_row(bad_naive, capsys):
    bad_naive("raises")
    code = cli.main(["--cases", "naive-n64", "--dtypes", "float16", "--dialect", "beta1"])
    out, err = capsys.readouterr()
    assert code == 1 and "ERROR" in out
    assert "ValueError: this kernel is broken" in err


def test_selection(capsys):
    quick = cli._select(None, True, None)
    assert not any(c.slow for c, _ in quick)
    assert len(cli._select(None, False, None)) == sum(len(c.dtypes) for c in CASES)
    only_fp16 = cli._select("conv2d", False, ["float16"])
    assert only_fp16 and all(c.kernel == "conv2d" and d == "float16" for c, d in only_fp16)
    globbed = cli._select("transpose-*x1024", False, None)
    assert {c.id for c, _ in globbed} == {"transpose-1024x1024", "transpose-512x1024"}
    assert cli.main(["--cases", "nothing-matches"]) == 2
    assert "no case matches" in capsys.readouterr().err


def test_unknown_dtype_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--dtypes", "float99"])
    assert exc.value.code == 2
    assert "argument --dtypes: unknown dtype 'float99'" in capsys.readouterr().err


def test_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for case in CASES:
        assert case.id in out
    assert "B=4 256->256 224x224 k=3 bias pool=2" in out


def test_case_help_lists_each_kernels_params(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["case", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "conv2d    batch,c_in,c_out,height,width,k,bias,pool" in out
    assert "transpose m,n" in out and "naive     n" in out
    assert "booleans: true/false, yes/no, on/off, 1/0" in out
    # `case` runs one dialect: its help offers no "both"
    assert "or both" not in " ".join(out.split())


def test_list_marks_the_cases_beyond_the_course_contract(capsys):
    # docs/course-contract.md: what course and a --kernel run do not require of a student
    assert cli.main(["list", "--cases", "conv2d-pool3,conv2d-small-bias-pool2"]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[2:] if ln.strip()}
    assert "(beyond the course's contract)" in rows["conv2d-pool3"]
    assert "beyond" not in rows["conv2d-small-bias-pool2"]


def test_unavailable_backend_exits_2(capsys, monkeypatch):
    from nkiverify import backends
    monkeypatch.setattr(backends, "neuronxcc_available", lambda: False)
    assert cli.main(["--backend", "device", "--cases", "naive-n128"]) == 2
    assert "device backend is unavailable" in capsys.readouterr().err


# ---- bench --------------------------------------------------------------------------------

def _args(*argv):
    return cli._parser().parse_args(["bench", *argv])


def test_bench_params_defaults_are_the_course_sizes():
    assert cli.bench_params(_args("tiled")) == {"n": 25600}
    assert cli.bench_params(_args("transpose")) == {"m": 1024, "n": 1024}
    assert cli.bench_params(_args("transpose", "-n", "512", "-m", "256")) == {"m": 256, "n": 512}
    assert cli.bench_params(_args("transpose", "--shape", "256x384")) == {"m": 256, "n": 384}
    assert cli.bench_params(_args("conv2d")) == {
        "batch": 1, "c_in": 256, "c_out": 256, "height": 224, "width": 224, "k": 3,
        "bias": True, "pool": 1}
    p = cli.bench_params(_args("conv2d", "--image", "32x16", "--channels", "128x384", "--pool",
                               "2", "--batch", "2", "--filter", "5", "--no-bias"))
    assert p == {"batch": 2, "c_in": 128, "c_out": 384, "height": 32, "width": 16, "k": 5,
                 "bias": False, "pool": 2}
    with pytest.raises(cli.UsageError, match="--image needs 2 numbers"):
        cli.bench_params(_args("conv2d", "--image", "224"))


def test_course_thresholds():
    perf = cli.bench_params(_args("conv2d"))
    assert cli._course_threshold("conv2d", perf, "float32")[1:] == (4964.0, 4596.0)
    assert cli._course_threshold("conv2d", perf, "float16")[1:] == (1365.0, 1002.0)
    small = cli.bench_params(_args("conv2d", "--image", "32x16", "--pool", "2"))
    assert cli._course_threshold("conv2d", small, "float16")[1:] == (84.0, 84.0)
    assert cli._course_threshold("conv2d", dict(perf, batch=4), "float32") is None
    assert cli._course_threshold("transpose", {"m": 4096, "n": 4096}, "float32")[1] == 700.0
    # the trn1 course (cs149-assignment §3): one threshold per dtype at 224x224, pool 1 and 2
    for pool in (1, 2):
        assert cli._course_threshold("conv2d", dict(perf, pool=pool), "float32",
                                     "trn1")[1:] == (4300.0, 4300.0)
    assert cli._course_threshold("conv2d", perf, "float16", "trn1")[1:] == (1300.0, 1300.0)
    assert cli._course_threshold("conv2d", small, "float16", "trn1") is None
    assert cli._course_threshold("transpose", {"m": 4096, "n": 4096}, "float32", "trn1") is None


def test_latency_caveat_names_what_stands_before_the_grade():
    from nkiverify.report import CaseRecord
    cases = {c.id: c for c in CASES}

    def rec(case_id, dtype, passed):
        c = cases[case_id]
        return CaseRecord(c.kernel, dtype, case_id, passed, {}, 0.0, "nkisim", "trn2",
                          params=dict(c.params))

    perf = dict(cases["conv2d-perf-224"].params)
    # the trn2 calibration solution's shape of result: fp32 right everywhere the course
    # checks, fp16 wrong on the timed configuration itself
    records = [rec("conv2d-large-bias", "float32", True), rec("conv2d-perf-224", "float32", True),
               rec("conv2d-perf-224", "float16", False), rec("conv2d-c384", "float32", False)]
    assert cli._latency_caveat("conv2d", perf, "float32", records, "trn2") == ""
    assert cli._latency_caveat("conv2d", perf, "float16", records, "trn2") == \
        " (but its output on this configuration fails our check)"
    # a configuration that was not run, while the kernel fails elsewhere
    small = dict(cases["conv2d-perf-32x16"].params)
    assert "was not checked, and 2 of its conv2d runs fail" in \
        cli._latency_caveat("conv2d", small, "float32", records, "trn2")
    # the trn2 harness times nothing after a float32 correctness failure; trn1's times anyway
    records.append(rec("conv2d-large-bias-pool2", "float32", False))
    gated = cli._latency_caveat("conv2d", perf, "float32", records, "trn2")
    assert "correctness configuration conv2d-large-bias-pool2 fails our check" in gated
    assert "skips the performance tests" in gated
    assert cli._latency_caveat("conv2d", perf, "float32", records, "trn1") == ""
    # a float16 run of a course correctness configuration is ours, not the course's gate
    only_fp16 = [rec("conv2d-large-bias", "float16", False),
                 rec("conv2d-perf-224", "float32", True)]
    assert cli._latency_caveat("conv2d", perf, "float32", only_fp16, "trn2") == ""


def test_course_target_follows_the_checkouts_layout(tmp_path, monkeypatch):
    monkeypatch.delenv("NKISIM_TARGET", raising=False)
    (tmp_path / "part1").mkdir()
    assert cli.course_target(str(tmp_path), None)[0] == "trn2"
    (tmp_path / "part1" / "vec_add.py").write_text("")           # the trn1 course's runner
    target, why = cli.course_target(str(tmp_path), None)
    assert target == "trn1" and "part1/vec_add.py" in why
    assert cli.course_target(str(tmp_path), "trn2") == ("trn2", "--target")
    monkeypatch.setenv("NKISIM_TARGET", "TRN2")
    assert cli.course_target(str(tmp_path), None) == ("trn2", "$NKISIM_TARGET")
    monkeypatch.delenv("NKISIM_TARGET")
    (tmp_path / "part1" / "run_benchmark.py").write_text("")     # trn2's runner
    assert cli.course_target(str(tmp_path), None)[0] == "trn2"


def test_bench_prints_the_estimate_and_writes_a_trace(capsys, tmp_path):
    trace = tmp_path / "t.json"
    assert cli.main(["bench", "transpose", "-n", "256", "--target", "trn1",
                     "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "on trn1" in out and "estimated latency" in out and "bottleneck" in out
    assert "engine busy" in out and "MFU" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert events and all("ph" in e for e in events)


def test_bench_conv2d_small_reports_mfu_and_the_course_threshold(capsys):
    assert cli.main(["bench", "conv2d", "--image", "32x16", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert "B=1 256->256 32x16 k=3 bias pool=1 float16" in out
    assert "% (fp32-adjusted" in out
    assert "course threshold (float16, 32): threshold 84 us ->" in out


def test_console_script_entry_point():
    result = subprocess.run([sys.executable, "-m", "nkiverify.cli", "list", "--cases",
                             "naive"], capture_output=True, text=True, check=True)
    assert "naive-n128" in result.stdout


def test_an_exact_case_id_selects_only_that_case():
    assert [c.id for c, _ in cli._select("conv2d-large", False, None)] == ["conv2d-large"]
    assert len({c.id for c, _ in cli._select("large", False, None)}) >= 4


def test_course_runs_the_large_images_in_their_own_dtypes_and_every_dtype_meets_one():
    """``course`` runs each case in every dtype, but the slow ones (224x224, 4096x4096) in
    their own: the B=4 images in fp16 and bf16 took two thirds of a course run. Every dtype
    still meets the 224x224 image (at B=1)."""
    picked = cli._select(None, False, None, every_dtype=True)
    for case, dt in picked:
        assert dt in case.dtypes or not case.slow, (case.id, dt)
    # the others in every dtype (once per distinct configuration)
    runs: dict = {}
    for case, dt in picked:
        if not case.slow:
            runs.setdefault((case.kernel, repr(sorted(case.params.items())), case.dist),
                            set()).add(dt)
    assert runs and all(dts == set(cli.ALL_DTYPES) for dts in runs.values())
    for dt in cli.ALL_DTYPES:
        assert any(c.kernel == "conv2d" and c.params["height"] == 224 and d == dt
                   for c, d in picked), dt


def test_a_course_failures_rerun_line_selects_that_run():
    """``course`` runs every case in every dtype; its rerun line for conv2d-large-bias in
    float16 (a float32-only case, as the course's harness runs it) must select that run:
    `nki-verify run --cases conv2d-large-bias --dtypes float16` once said "no case matches"."""
    case = next(c for c in CASES if c.id == "conv2d-large-bias")
    assert case.dtypes == ("float32",)
    picked = cli._select("conv2d-large-bias", False, ["float16"])
    assert [(c.id, d) for c, d in picked] == [("conv2d-large-bias", "float16")]
    # a kernel name or a glob keeps each case's own dtypes
    assert all(d in c.dtypes for c, d in cli._select("conv2d", False, ["float16"]))
    assert all(d in c.dtypes for c, d in cli._select("conv2d-large*", False, ["float16"]))
    assert "conv2d-large-bias" not in {c.id for c, _ in cli._select("conv2d", False,
                                                                     ["float16"])}
    # the course's own configurations: its cases in their own dtypes, nothing else
    assert cli.course_own("conv2d-large-bias", "float32")
    assert not cli.course_own("conv2d-large-bias", "float16")
    assert cli.course_own("conv2d-perf-224", "float16")
    assert not cli.course_own("conv2d-small-bias-pool2", "float32")     # an extra case


def test_timings_print_each_run_with_its_worker_in_start_order():
    # two workers (pids 7, 9); wall 10 s from t=100: w1 (pid 9, started first) is busy 4 + 5 s
    results = [{"pid": 7, "started": 101.0, "ended": 107.0, "kernel_s": 5.0, "cpu_s": 5.5},
               {"pid": 9, "started": 100.0, "ended": 104.0, "kernel_s": 3.0, "cpu_s": 3.9},
               {"pid": 9, "started": 104.0, "ended": 109.0, "kernel_s": None, "cpu_s": 1.0},
               None]                                        # not run (interrupted)
    text = cli.format_timeline(results, ["a f32", "b f32", "c f16", "d f16"], 100.0, 110.0, 2)
    lines = text.splitlines()
    assert lines[0].startswith("timeline (-j 2, wall 10.0 s")
    rows = [line.split() for line in lines[3:6]]
    assert [r[:2] for r in rows] == [["w1", "b"], ["w2", "a"], ["w1", "c"]]
    assert rows[0][3:] == ["0.0", "4.0", "4.00", "3.00", "1.00", "3.90"]
    assert rows[2][6:] == ["-", "-", "1.00"]               # no kernel time: it raised
    assert lines[6] == "w1: 2 runs, busy 9.0 s (4.9 s CPU), last end 9.0 s, idle 1.0 s"
    assert lines[7] == "w2: 1 runs, busy 6.0 s (5.5 s CPU), last end 7.0 s, idle 4.0 s"
    assert "d f16" not in text


def test_timings_option_prints_the_timeline(capsys):
    assert cli.main(["--cases", "naive-n64,stream-n384", "--dtypes", "float16", "-j", "2",
                     "--timings"]) == 0
    out = capsys.readouterr().out
    timeline = out[out.index("timeline (-j 2"):].splitlines()
    runs = [line for line in timeline[3:] if line.startswith("w") and ":" not in line[:3]]
    assert sorted(line.split()[1] for line in runs) == sorted(
        ["naive-n64", "naive-n64[nki]", "stream-n384", "stream-n384[nki]"])
    assert any(line.startswith("w1: ") for line in timeline)
    # without the option there is no timeline
    assert cli.main(["--cases", "naive-n64", "--dtypes", "float16", "-j", "1"]) == 0
    assert "timeline" not in capsys.readouterr().out


def test_a_course_with_one_threshold_passes_or_fails_it():
    """cs149-assignment §3: the trn1 course has one threshold per dtype (224x224: fp32 4300 us)
    and its harness prints pass or fail; trn2's has two tiers (full and partial credit)."""
    relaxed, optimized = cli.course_thresholds("trn1")[("float32", 224)]
    assert relaxed == optimized == 4300
    assert cli._limits(relaxed, optimized) == "threshold 4300 us"
    assert cli._grade(2635.0, relaxed, optimized) == "within the threshold"
    assert cli._grade(4400.0, relaxed, optimized) == "too slow"
    relaxed, optimized = cli.course_thresholds("trn2")[("float16", 224)]
    assert relaxed > optimized
    assert cli._limits(relaxed, optimized) == \
        f"optimized {optimized:.0f} us, relaxed {relaxed:.0f} us"
    assert [cli._grade(us, relaxed, optimized) for us in (optimized, relaxed, relaxed + 1)] == \
        ["full credit", "partial credit", "too slow"]
