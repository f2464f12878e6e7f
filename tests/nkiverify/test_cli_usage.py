"""``nki-verify`` usage errors and warnings about what the command line selects: a ``--kernel``
that does not load, ``--cases`` that select nothing of the user's kernels, a ``--cases`` element
that matches nothing (one line each, before any case runs)."""

from pathlib import Path

import pytest

from nkiverify import cli, registry

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch):
    """``--kernel`` replaces a family in the registry: keep that to the test."""
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))


@pytest.fixture
def part1(tmp_path):
    """A student's part1/kernels.py: the repo's vector adds and transpose."""
    path = tmp_path / "part1" / "kernels.py"
    path.parent.mkdir()
    path.write_text((REPO / "kernels" / "vector_add.py").read_text() + "\n\n"
                    + (REPO / "kernels" / "transpose.py").read_text())
    return path


def _usage_error(capsys, argv, *needles):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err            # one line, nothing scheduled
    assert "case runs" not in err and "ERROR" not in out, out + err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ---- a --kernel that does not load (F4) ---------------------------------------------------

@pytest.mark.parametrize("cases", ["tiled", "tiled-n1000"])     # (tiled-n1000: beyond contract)
@pytest.mark.parametrize("named", [True, False])
def test_a_kernel_file_with_a_syntax_error_is_one_usage_error(tmp_path, capsys, cases, named):
    bad = tmp_path / "syntax_err.py"
    bad.write_text("import neuronxcc.nki as nki\n\n\ndef vector_add_tiled(a, b):\n"
                   "    return (a\n")
    ref = f"{'tiled=' if named else ''}{bad}:vector_add_tiled"
    _usage_error(capsys, ["--kernel", ref, "--cases", cases, "-j", "1"],
                 "nki-verify run: error: --kernel", "the kernel does not load: SyntaxError:",
                 "syntax_err.py, line 5")


@pytest.mark.parametrize("named", [True, False])
def test_a_missing_function_is_one_usage_error(part1, capsys, named):
    ref = f"naive={part1}:nope" if named else f"{part1}:vector_add_naive_typo"
    line = _usage_error(capsys, ["--kernel", ref, "-j", "1"], "nki-verify run: error: --kernel")
    if named:
        assert "has no function 'nope' (it defines: " in line and "vector_add_naive" in line
    else:       # (without NAME= the family cannot be told: said before loading)
        assert "is not one of the course's functions" in line


def test_an_error_at_import_is_one_usage_error_naming_the_line(tmp_path, capsys):
    bad = tmp_path / "raises.py"
    bad.write_text("import numpy as np\n\nraise RuntimeError('broken at import')\n\n\n"
                   "def vector_add_naive(a, b):\n    return a\n")
    _usage_error(capsys, ["--kernel", f"{bad}:vector_add_naive", "-j", "1"],
                 "RuntimeError: broken at import (raises.py, line 3)")


def test_case_and_bench_say_it_once_too(tmp_path, capsys):
    bad = tmp_path / "syntax_err.py"
    bad.write_text("def vector_add_tiled(a, b):\n    return (a\n")
    ref = f"{bad}:vector_add_tiled"
    _usage_error(capsys, ["case", "tiled", "--params", "n=256", "--kernel", ref],
                 "nki-verify case: error: --kernel", "SyntaxError:")
    _usage_error(capsys, ["bench", "--kernel", ref], "nki-verify bench: error: --kernel",
                 "SyntaxError:")


# ---- --cases of kernels --kernel does not give (F2) -----------------------------------------

def test_cases_of_other_families_do_not_run_our_kernels(part1, capsys):
    # the student's stream kernel with a transpose case: that case once ran our transpose and
    # passed, as if it were the student's
    code = cli.main(["--kernel", f"{part1}:vector_add_stream", "--cases",
                     "stream-n384,transpose-1024x1024", "--dtypes", "float32", "-j", "1"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("stream-",
                                                                             "transpose-"))]
    assert rows == ["stream-n384"], out
    assert "nki-verify: --cases: left out the cases of kernels no --kernel gives (transpose: " \
        "transpose-1024x1024): with --kernel only your kernels run" in err


def test_cases_that_select_none_of_the_users_kernels_are_a_usage_error(part1, capsys):
    _usage_error(capsys, ["--kernel", f"{part1}:vector_add_naive", "--cases", "conv2d*"],
                 "nki-verify run: error: --cases/--dtypes: no case matches the filters for "
                 "your --kernel kernels (naive); they select cases of conv2d only")


# ---- course --cases that match nothing; one element of a list that matches nothing (F5, F6) --

@pytest.fixture
def checkout(tmp_path, part1):
    (tmp_path / "part2").mkdir()
    (tmp_path / "part2" / "conv2d.py").write_text((REPO / "kernels" / "conv2d.py").read_text())
    return tmp_path


@pytest.mark.parametrize("pattern", ["transpos-4096", "nomatch*"])
def test_course_cases_that_match_nothing_say_so_as_run_does(checkout, capsys, pattern):
    code = cli.main(["course", str(checkout), "--cases", pattern])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    last = err.strip().splitlines()[-1]
    # (course has no --dialect: it once blamed it)
    assert last == "nki-verify course: error: --cases/--dtypes: no case matches the filters " \
        "(see `nki-verify list`)", err
    assert "--dialect" not in err
    assert cli.main(["--cases", pattern]) == 2
    assert capsys.readouterr().err.strip() == last.replace("nki-verify course:", "nki-verify run:")


def test_a_large_case_under_quick_says_quick_skips_it(checkout, capsys):
    for argv in (["course", str(checkout)], []):
        assert cli.main(argv + ["--quick", "--cases", "transpose-4096x4096"]) == 2
        err = capsys.readouterr().err
        assert "no case matches the filters (transpose-4096x4096 is a large case, which " \
            "--quick skips)" in err


def test_course_cases_of_a_kernel_the_checkout_lacks(part1, capsys):
    root = part1.parent.parent                 # (part1/kernels.py only)
    assert cli.main(["course", str(root), "--cases", "conv2d-small-c128-c128"]) == 2
    err = capsys.readouterr().err
    assert "conv2d-small-c128-c128 matches only cases of conv2d, which the checkout does not " \
        "define" in err


def test_an_element_of_a_cases_list_that_matches_nothing_is_warned(part1, capsys):
    code = cli.main(["--kernel", f"{part1}:vector_add_naive", "--cases", "naive-n128,naiv-n64",
                     "--dtypes", "float32", "-j", "1"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "1 passed, 0 failed" in out
    assert "nki-verify: warning: --cases: 'naiv-n64' matches no case (see `nki-verify list`)" \
        in err.splitlines()
    assert "naive-n128" not in " ".join(line for line in err.splitlines() if "warning" in line)
    # and an element --quick empties
    cli.main(["--cases", "naive-n128,transpose-4096x4096", "--quick", "--dialect", "beta1",
              "--dtypes", "float32", "-j", "1"])
    err = capsys.readouterr().err
    assert "nki-verify: warning: --cases: 'transpose-4096x4096' is a large case, which --quick " \
        "skips" in err


# ---- bench options the kernel does not take; --kernel help (F17) ----------------------------

@pytest.mark.parametrize("argv,options", [
    (["transpose", "--image", "32x16"], "--image: not an option of transpose"),
    (["stream", "--pool", "2"], "--pool: not an option of stream"),
    (["tiled", "-m", "256", "--no-bias"], "-m, --no-bias: not options of tiled"),
    (["conv2d", "-n", "4096"], "-n: not an option of conv2d"),
    (["transpose", "--shape", "1024x512", "-n", "128"], "--shape and -n/-m: give the size one way"),
])
def test_bench_options_the_kernel_does_not_take_are_a_usage_error(capsys, argv, options):
    _usage_error(capsys, ["bench", *argv], f"nki-verify bench: error: {options}")


def test_bench_and_case_help_do_not_call_kernel_repeatable(capsys):
    for command in ("bench", "case"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--kernel [NAME=]PATH:FUNC your kernel instead of ours" in text
        assert "(repeatable)" not in text
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "(repeatable)" in capsys.readouterr().out
