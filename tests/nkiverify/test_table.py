"""What ``nki-verify`` prints and writes around the cases: ``err/allowed`` of a run whose
output has NaN or never-written elements, the progress count, the -j warning, the report
file's mode."""

import os
import stat

import pytest
from test_student import NO_TAIL_TILED  # (the handout's tiled loop: n = 1000 leaves 104 unwritten)

from nkiverify import cli, registry
from nkiverify.report import CaseRecord, Report


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch):
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))


def test_unwritten_outputs_show_inf_not_a_ratio_below_1(tmp_path, capsys):
    path = tmp_path / "kernels.py"
    path.write_text(NO_TAIL_TILED)
    code = cli.main(["--kernel", f"{path}:vector_add_tiled", "--cases", "tiled-n1000",
                     "--dtypes", "float32", "-j", "1"])
    out, err = capsys.readouterr()
    assert code == 0, out + err                  # (tiled-n1000 is beyond the course's contract)
    assert "never written" in err
    row = next(line.split() for line in out.splitlines() if line.startswith("tiled-n1000"))
    # case, dtype, "beyond", "contract", result, err/allowed, ...
    assert row[4] == "FAIL" and row[5] == "inf", row
    summary = next(line.split() for line in out.splitlines() if line.startswith("tiled "))
    assert summary[:6] == ["tiled", "float32", "1", "0", "0.0%", "inf"], summary


def test_the_json_report_keeps_the_finite_elements_ratio():
    stats = {"n": 4, "mismatches": 1, "nan_count": 1, "max_ratio": 0.2}
    report = Report([CaseRecord("tiled", "float32", "tiled-n1000", False, stats, 0.1,
                                "nkisim", "trn2")])
    assert report.rows()[0].max_ratio == 0.2
    line = report.format_table().splitlines()[2].split()
    assert line[5] == "inf", line


def test_progress_counts_finished_runs_with_workers(capsys):
    # the largest case (transpose) starts first on the two workers and the runs end out of the
    # cases' order: the counter is how many have finished, not the case's index
    assert cli.main(["--cases", "naive-n64,stream-n384,transpose-512x1024", "--dtypes",
                     "float16,float32", "--dialect", "beta1", "-j", "2"]) == 0
    err = capsys.readouterr().err
    counts = [line[1:line.index("]")] for line in err.splitlines() if line.startswith("[")]
    assert counts == [f"{k}/6" for k in range(1, 7)], err


def test_more_workers_than_cores_is_a_warning_and_one_run_is_singular(capsys, monkeypatch):
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 2)
    assert cli.main(["--cases", "naive-n64", "--dtypes", "float16", "-j", "3"]) == 0
    err = capsys.readouterr().err
    assert "nki-verify: warning: -j 3 is more than the 2 cores here: the workers share them" \
        in err
    assert cli.main(["--cases", "naive-n64", "--dtypes", "float16", "--dialect", "beta1",
                     "-j", "2"]) == 0
    err = capsys.readouterr().err
    assert "warning: -j" not in err
    assert "nki-verify: 1 case run on nkisim (trn2)" in err.splitlines()


def test_the_json_report_has_the_mode_of_a_plain_file(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "r.json"
        Report([]).to_json(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
