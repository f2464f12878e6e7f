"""``nki-verify course``'s summary: a course kernel the checkout lacks, and the closing line
under ``--cases``/``--quick`` whether the run passes or fails."""

import json
import re
from pathlib import Path

import pytest

from nkiverify import cli, registry

REPO = Path(__file__).resolve().parents[2]
BIAS_LINE = "    bias_sb[...] = nisa.tensor_copy(raw, dtype=nl.float32)\n"
NO_BIAS = "    bias_sb[...] = nisa.memset((PMAX, n_co), value=0.0, dtype=nl.float32)\n"


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch):
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))


def _part1(root: Path) -> Path:
    (root / "part1").mkdir(parents=True)
    (root / "part1" / "kernels.py").write_text(
        (REPO / "kernels" / "vector_add.py").read_text() + "\n\n"
        + (REPO / "kernels" / "transpose.py").read_text())
    return root


def test_a_missing_conv2d_gets_a_summary_line_and_no_every_case_passed(tmp_path, capsys):
    root = _part1(tmp_path / "p1only")
    report = tmp_path / "r.json"
    code = cli.main(["course", str(root), "--cases", "naive-n128", "-j", "1",
                     "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    summary = out[out.index("==== summary ===="):]
    assert "----  conv2d    not checked (part2/conv2d.py not found)" in summary
    assert "every case run that the course requires passed" not in summary
    assert "every case the course requires passed" not in summary
    assert "every case run that was checked passed (3 of the course's " in summary
    assert "but the course's conv2d kernel was not found (not checked)" in summary
    assert json.loads(report.read_text())["course"]["not_found"] == [
        {"kernel": "conv2d", "why": "part2/conv2d.py not found"}]


def test_a_missing_function_gets_a_summary_line(tmp_path, capsys):
    root = _part1(tmp_path / "nofunc")
    (root / "part2").mkdir()
    (root / "part2" / "conv2d.py").write_text("def something_else():\n    pass\n")
    assert cli.main(["course", str(root), "--cases", "naive-n128", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "----  conv2d    not checked (no fused_conv2d_maxpool in part2/conv2d.py)" in out
    assert "every case run that the course requires passed" not in out


def test_the_selected_runs_line_stays_when_a_case_fails(tmp_path, capsys):
    root = _part1(tmp_path / "buggy")
    (root / "part2").mkdir()
    conv = (REPO / "kernels" / "conv2d.py").read_text()
    assert conv.count(BIAS_LINE) == 1
    (root / "part2" / "conv2d.py").write_text(conv.replace(BIAS_LINE, NO_BIAS))
    code = cli.main(["course", str(root), "--quick", "--cases", "conv2d-small-bias-pool2",
                     "-j", "1"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "fix first:" in out
    assert re.search(r"\n\(3 of the course's \d+ case runs selected by --cases and --quick; "
                     r"the others were not run\)", out), out


def test_course_cases_estimate_the_large_configurations_only_when_selected(tmp_path, capsys):
    root = _part1(tmp_path / "asst4")
    (root / "part2").mkdir()
    (root / "part2" / "conv2d.py").write_text((REPO / "kernels" / "conv2d.py").read_text())
    # a small case: the four 224x224 estimates (8-10 s each: ~39 s after a run of 1 s) are
    # left out, the 32x16 ones stay
    assert cli.main(["course", str(root), "--cases", "conv2d-small-c128-c128", "-j", "1"]) == 0
    out, err = capsys.readouterr()
    assert "nki-verify course: 4 large graded configurations not estimated (--cases did not " \
        "select them; nki-verify bench estimates any)" in err
    assert "estimating the latency of 4 configurations" in err
    estimates = out[out.index("latency estimates"):].split("\n\n")[0].splitlines()[1:]
    assert [line.split(":")[0].strip() for line in estimates] == [
        f"conv2d B=1 256->256 32x16 k=3 bias pool={pool} {dtype}"
        for pool in (1, 2) for dtype in ("float32", "float16")], out
