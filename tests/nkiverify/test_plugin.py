"""The nkiverify pytest plugin, exercised through pytester (inner pytest sessions)."""

import json

import pytest

pytest_plugins = ["pytester"]


def _skip_reasons(result):
    return "\n".join(line for line in result.outlines if line.startswith("SKIPPED"))


OPT_IN = "[pytest]\nnki_verify = true\n"


def test_markers_are_registered(pytester):
    pytester.makeini(OPT_IN)
    result = pytester.runpytest("--markers")
    out = result.stdout.str()
    for marker in ("@pytest.mark.simulate", "@pytest.mark.device", "@pytest.mark.slow",
                   "@pytest.mark.nki_modes"):
        assert marker in out


def test_options_are_in_help(pytester):
    out = pytester.runpytest("--help").stdout.str()
    for option in ("--nki-backend", "--nki-target", "--nki-dtypes", "--nki-report"):
        assert option in out


def test_every_kernel_test_has_a_simulate_and_a_device_twin(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.parametrize("x", [1, 2])
        def test_k(x, nki_backend):
            assert nki_backend.name == "nkisim"

        def test_plain():
            pass
    """)
    result = pytester.runpytest("--collect-only", "-q")
    ids = [line for line in result.outlines if "::" in line]
    assert ids == ["test_every_kernel_test_has_a_simulate_and_a_device_twin.py::" + i for i in (
        "test_k[1-simulate]", "test_k[1-device]", "test_k[2-simulate]", "test_k[2-device]",
        "test_plain")]
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=3, skipped=2)
    reasons = _skip_reasons(result)
    assert "device backend unavailable" in reasons and "neuronx-cc" in reasons
    assert "/dev/neuron0" in reasons


def test_markers_select_the_twins(pytester):
    pytester.makepyfile("""
        def test_k(nki_backend):
            pass
    """)
    pytester.runpytest("-m", "simulate").assert_outcomes(passed=1, deselected=1)
    result = pytester.runpytest("-m", "device")
    result.assert_outcomes(skipped=1, deselected=1)
    assert result.ret == 0        # device tests without a device skip, they do not error


def test_device_twin_skips_when_its_simulated_twin_failed(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.parametrize("x", [1, 2])
        def test_k(x, nki_backend):
            assert x == 2
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(failed=1, passed=1, skipped=2)
    lines = [line for line in result.outlines if line.startswith("SKIPPED")]
    assert any("simulated twin failed" in line for line in lines)
    assert sum("simulated twin failed" in line for line in lines) == 1


def test_device_twin_follows_its_simulate_twin_even_if_declared_first(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.parametrize("nki_mode", ["device", "simulate"])
        def test_k(nki_mode, nki_backend):
            pass
    """)
    result = pytester.runpytest("--collect-only", "-q")
    ids = [line.split("::")[1] for line in result.outlines if "::" in line]
    assert ids == ["test_k[simulate]", "test_k[device]"]


def test_nki_modes_marker_restricts_the_twins(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.nki_modes("simulate")
        def test_k(nki_backend):
            pass
    """)
    result = pytester.runpytest("--collect-only", "-q")
    assert "test_nki_modes_marker_restricts_the_twins.py::test_k[simulate]" in result.outlines
    assert not any("device" in line for line in result.outlines)


def test_nki_dtypes_deselects_other_dtypes(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
        def test_k(dtype):
            pass

        def test_no_dtype():
            pass
    """)
    result = pytester.runpytest("--nki-dtypes", "fp16, bfloat16", "-v")
    result.assert_outcomes(passed=3, deselected=1)
    assert "test_k[float32]" not in result.stdout.str()
    result = pytester.runpytest("--nki-dtypes", "float99")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "unknown dtype 'float99'" in result.stderr.str()


def test_nki_check_records_and_reports(pytester, tmp_path):
    pytester.makepyfile("""
        import numpy as np
        import pytest

        @pytest.mark.parametrize("dtype", ["float32", "float16"])
        def test_good(dtype, nki_check):
            x = np.linspace(1, 2, 50).astype(dtype)
            nki_check("toy", "good", dtype, x, x.astype(np.float64))

        def test_bad(nki_check):
            x = np.linspace(1, 2, 50).astype(np.float32)
            y = x.copy()
            y[7] += 0.01
            nki_check("toy", "bad", "float32", y, x.astype(np.float64))
    """)
    path = tmp_path / "report.json"
    result = pytester.runpytest("--nki-report", str(path))
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    # the failure says what, where and by how much
    assert "toy bad [float32]" in out and "worst element at index (7,)" in out
    # the terminal summary: one row per kernel x dtype
    assert "nki-verify: kernel x dtype error summary" in out
    result.stdout.re_match_lines([r"toy\s+float32\s+2\s+1\s+50\.0%", r"toy\s+float16\s+1\s+1\s+"
                                  r"100\.0%"], consecutive=False)
    data = json.loads(path.read_text())
    assert [(c["case_id"], c["dtype"], c["passed"]) for c in data["cases"]] == [
        ("good", "float32", True), ("bad", "float32", False), ("good", "float16", True)]
    bad = data["cases"][1]
    assert bad["stats"]["worst_index"] == [7] and bad["stats"]["mismatches"] == 1
    assert {r["kernel"] for r in data["rows"]} == {"toy"}


def test_no_summary_without_comparisons(pytester):
    pytester.makepyfile("def test_a():\n    pass\n")
    assert "error summary" not in pytester.runpytest().stdout.str()


def test_nki_verify_runs_real_kernels_and_records_errors(pytester, tmp_path):
    pytester.makepyfile("""
        def test_stream(nki_verify):
            out = nki_verify("stream", {"n": 384}, "bfloat16", case_id="n384")
            assert out.output.shape == (384,)

        def test_naive_too_long(nki_verify):
            nki_verify("naive", {"n": 256}, "float32", case_id="n256")
    """)
    path = tmp_path / "r.json"
    result = pytester.runpytest("--nki-report", str(path), "-m", "simulate")
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    cases = {c["case_id"]: c for c in json.loads(path.read_text())["cases"]}
    assert cases["n384"]["passed"] and cases["n384"]["kernel"] == "stream"
    assert cases["n384"]["backend"] == "nkisim" and cases["n384"]["target"] == "trn2"
    assert cases["n384"]["stats"]["ulp"]["max"] <= 0.5
    assert not cases["n256"]["passed"] and cases["n256"]["stats"] == {}
    assert "partition" in result.stdout.str()     # the NKI error is the failure


def test_target_option(pytester):
    pytester.makepyfile("""
        def test_t(nki_backend, nki_target):
            assert nki_target == "trn1" and nki_backend.target == "trn1"
    """)
    pytester.runpytest("--nki-target", "trn1", "-m", "simulate").assert_outcomes(
        passed=1, deselected=1)


def test_neuronxcc_backend_skips_without_the_package(pytester):
    from nkiverify.backends import neuronxcc_available
    if neuronxcc_available():
        pytest.skip("a real neuronx-cc is installed")
    pytester.makepyfile("""
        def test_k(nki_backend):
            pass
    """)
    result = pytester.runpytest("--nki-backend", "neuronxcc", "-m", "simulate", "-rs")
    result.assert_outcomes(skipped=1, deselected=1)
    assert "neuronxcc backend unavailable" in _skip_reasons(result)


def test_the_shim_serves_neuronxcc_before_test_modules_import(pytester):
    pytester.makepyfile("""
        import neuronxcc.nki as nki

        def test_k():
            assert nki.__name__ == "nkisim.beta1"
    """)
    pytester.runpytest().assert_outcomes(passed=1)


def test_the_shim_serves_the_current_nki_dialect_too(pytester):
    pytester.makepyfile("""
        import nki
        import nki.language as nl
        from nki.isa.constants import oob_mode

        def test_k():
            assert nki.__name__ == "nkisim.nki" and nl.__name__ == "nkisim.nki.language"
    """)
    pytester.runpytest().assert_outcomes(passed=1)


def test_nki_device_fixture_skips_with_the_reason(pytester):
    pytester.makepyfile("""
        def test_perf(nki_device):
            raise AssertionError("must not run")
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    assert "no Neuron device" in _skip_reasons(result)


PROFILE_TEST = """
    from hypothesis import settings

    def test_profile():
        s = settings.default
        print("PROFILE", s.max_examples, s.derandomize, s.deadline)
"""


@pytest.mark.parametrize("env, args, expected", [
    ({"CI": "true"}, [], "PROFILE 10 True None"),
    ({}, [], "PROFILE 20 False None"),
    ({}, ["--hypothesis-profile", "nki-thorough"], "PROFILE 200 False None"),
], ids=["ci-env", "local", "thorough"])
def test_hypothesis_profiles(pytester, monkeypatch, env, args, expected):
    monkeypatch.delenv("CI", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    pytester.makeini(OPT_IN)
    pytester.makepyfile(PROFILE_TEST)
    result = pytester.runpytest_subprocess("-s", *args)
    result.assert_outcomes(passed=1)
    assert expected in result.stdout.str()


def test_report_is_collected_from_xdist_workers(pytester, tmp_path):
    # also the end-to-end check of the default scheduler: `-n 2` alone in an opted-in session
    # (--nki-report opts in) runs under worksteal (test_xdist_defaults_to_worksteal_...)
    pytester.makepyfile("""
        import numpy as np
        import pytest

        @pytest.mark.parametrize("i", range(6))
        def test_k(i, nki_check, nki_backend):
            x = np.full(4, i + 1.0, dtype=np.float32)
            nki_check("par", f"case{i}", "float32", x, x.astype(np.float64))
    """)
    path = tmp_path / "x.json"
    result = pytester.runpytest_subprocess("-n", "2", "-v", "--nki-report", str(path), "-p",
                                           "no:cacheprovider")
    result.stdout.fnmatch_lines(["*scheduling tests via WorkStealingScheduling*"])
    result.assert_outcomes(passed=6, skipped=6)
    data = json.loads(path.read_text())
    assert sorted(c["case_id"] for c in data["cases"]) == [f"case{i}" for i in range(6)]
    assert data["rows"][0]["cases"] == 6
    result.stdout.re_match_lines([r"par\s+float32\s+6\s+6\s+100\.0%"])


def test_twins_share_an_xdist_worker_under_loadgroup(pytester):
    # with --dist loadgroup (what the plugin switches -n to where a device is available) each
    # simulate/device pair is one xdist group, so a failed simulate twin is seen by its device
    # twin even when the pairs are spread over workers
    pytester.makepyfile("""
        import pytest

        @pytest.mark.parametrize("x", range(8))
        def test_k(x, nki_backend):
            assert x % 2 == 0
    """)
    # (no hypothesis here: without its plugin no process imports it, 5.8 -> 2.1 s of CPU)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-rs",
                                           "-p", "no:cacheprovider", "-p", "no:hypothesispytest")
    result.assert_outcomes(passed=4, failed=4, skipped=8)
    reasons = [line for line in result.outlines if line.startswith("SKIPPED")]
    assert sum(int(line.split("[")[1].split("]")[0]) for line in reasons
               if "simulated twin failed" in line) == 4


DIST_CONFTEST = """
def pytest_collection_finish(session):
    print("DIST", session.config.option.dist)
"""


def test_xdist_defaults_to_worksteal_with_slow_cases_first(pytester, monkeypatch):
    # `-n 2` alone: worksteal (an idle worker takes a busy one's pending tests); an explicit
    # --dist is kept. Slow cases are collected first, twins still adjacent (opted-in projects).
    # xdist starts no workers under --collect-only but reads the same `dist` option it
    # schedules by, so these sessions run in this process; test_report_is_collected_from_
    # xdist_workers sees xdist actually schedule via WorkStealingScheduling.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)    # restored after the in-process sessions
    pytester.makeini(OPT_IN)
    pytester.makeconftest(DIST_CONFTEST)
    pytester.makepyfile("""
        import pytest

        def test_fast():
            pass

        @pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.slow)])
        def test_k(x, nki_backend):
            pass
    """)
    assert "DIST worksteal" in pytester.runpytest("-n", "2", "--collect-only", "-q").outlines
    for dist in ("load", "loadscope"):
        explicit = pytester.runpytest("-n", "2", "--dist", dist, "--collect-only", "-q")
        assert f"DIST {dist}" in explicit.outlines
    assert "DIST no" in pytester.runpytest("--collect-only", "-q").outlines
    order = pytester.runpytest("--collect-only", "-q").outlines
    assert [line for line in order if "::" in line] == [
        "test_xdist_defaults_to_worksteal_with_slow_cases_first.py::test_k[2-simulate]",
        "test_xdist_defaults_to_worksteal_with_slow_cases_first.py::test_k[2-device]",
        "test_xdist_defaults_to_worksteal_with_slow_cases_first.py::test_fast",
        "test_xdist_defaults_to_worksteal_with_slow_cases_first.py::test_k[1-simulate]",
        "test_xdist_defaults_to_worksteal_with_slow_cases_first.py::test_k[1-device]",
    ]


def test_pytest_does_not_rewrite_our_modules_or_hypothesis(pytestconfig):
    # nkiverify.plugin._stop_rewriting (issue 12): the library modules load as plain modules,
    # the test modules are still rewritten (this session opted in through pyproject.toml)
    import sys

    import hypothesis.core  # noqa: F401

    import nkisim.runtime  # noqa: F401
    import nkiverify.registry  # noqa: F401
    if pytestconfig.getoption("assertmode") == "plain":
        pytest.skip("--assert=plain: nothing is rewritten")

    def loader(name):
        return type(sys.modules[name].__spec__.loader).__name__

    assert loader(__name__) == "AssertionRewritingHook"
    for name in ("nkisim.runtime", "nkiverify.registry", "hypothesis.core"):
        assert loader(name) != "AssertionRewritingHook", name
