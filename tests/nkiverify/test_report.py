"""nkiverify.report: per-(kernel, dtype) aggregation, the text table, JSON round trip."""

import json

import numpy as np
import pytest

from nkiverify.compare import compare
from nkiverify.report import COLUMNS, CaseRecord, Report, ReportRow


def stats(ulp_max, ratio, rel_max, abs_max=1e-3):
    return {"n": 10, "ulp": {"max": ulp_max, "p99": ulp_max}, "rel": {"max": rel_max},
            "abs": {"max": abs_max}, "max_ratio": ratio}


def record(kernel, dtype, case_id, passed, stats_dict, reduction_length=None):
    return CaseRecord(kernel, dtype, case_id, passed, stats_dict, elapsed_s=0.25,
                      backend="nkisim", target="trn2", reduction_length=reduction_length)


@pytest.fixture
def report():
    r = Report()
    r.add(record("conv2d", "bfloat16", "small", True, stats(0.5, 0.49, 3e-3)))
    r.add(record("vector_add_stream", "float32", "n25600", False, {}))  # e.g. shape mismatch
    r.add(record("conv2d", "bfloat16", "large", False, stats(3.0, 0.45, 1e-2)))
    r.add(record("conv2d", "bfloat16", "pool", True, stats(0.4, 0.499, 2e-3)))
    r.add(record("conv2d", "float32", "small", True, stats(2.5, 1.5, 4e-7)))
    return r


def test_rows_aggregate_per_kernel_and_dtype(report):
    rows = report.rows()
    assert [(r.kernel, r.dtype) for r in rows] == [
        ("conv2d", "bfloat16"), ("vector_add_stream", "float32"), ("conv2d", "float32")]
    conv_bf16 = rows[0]
    assert conv_bf16 == ReportRow("conv2d", "bfloat16", cases=3, passed=2, pass_rate=2 / 3,
                                  max_ratio=0.499, max_abs=1e-3, max_rel=1e-2,
                                  max_ulp=3.0)
    no_stats = rows[1]
    assert (no_stats.cases, no_stats.passed, no_stats.pass_rate) == (1, 0, 0.0)
    assert no_stats.max_ulp is None and no_stats.max_ratio is None and no_stats.max_rel is None


def test_ulp_is_left_out_after_a_reduction():
    # a conv output next to zero is millions of its own ulps off within tolerance: not shown
    r = Report([record("conv2d", "float32", "a", True, stats(1.07e7, 0.3, 1e-2), 2304),
                record("stream", "float32", "b", True, stats(0.5, 0.2, 6e-8), 1)])
    conv, stream = r.rows()
    assert conv.max_ulp is None and conv.max_ratio == 0.3
    assert stream.max_ulp == 0.5
    line = r.format_table().splitlines()[2]
    assert line.rstrip().endswith("-") and "1.07e+07" not in r.format_table()


def test_format_table_is_aligned(report):
    lines = report.format_table().splitlines()
    assert len(lines) == 2 + 3  # header, rule, one line per (kernel, dtype)
    assert len({len(line) for line in lines}) == 1  # every line padded to the same width
    for name in COLUMNS:
        assert name in lines[0]
    assert set(lines[1]) == {"-", " "}
    # Numbers are right-aligned under their header; kernel names left-aligned.
    end_of_rate = lines[0].index("pass rate") + len("pass rate")
    assert lines[2][:end_of_rate].endswith("66.7%")
    assert lines[3][:end_of_rate].endswith("0.0%")
    assert lines[2].startswith("conv2d ") and lines[3].startswith("vector_add_stream ")
    assert "1.00e-02" in lines[2] and lines[2].rstrip().endswith("3")
    assert lines[3].rstrip().endswith("-")  # no statistics for that row


def test_empty_report():
    assert Report().rows() == []
    assert Report().format_table().splitlines()[0].split()[:2] == ["kernel", "dtype"]


def test_json_round_trip(report, tmp_path):
    path = tmp_path / "report.json"
    report.to_json(path)
    data = json.loads(path.read_text())
    assert {"schema_version", "tool_version", "created", "target", "interrupted", "rows",
            "cases"} <= set(data)
    assert data["schema_version"] == 2 and data["interrupted"] is False
    assert len(data["cases"]) == 5 and len(data["rows"]) == 3
    assert data["rows"][0]["max_ulp"] == 3.0 and data["rows"][1]["max_ulp"] is None
    assert data["cases"][0]["backend"] == "nkisim" and data["cases"][0]["elapsed_s"] == 0.25
    again = Report.from_json(path)
    assert again.records == report.records
    assert again.rows() == report.rows()


def test_records_from_compare_statistics(tmp_path):
    expected = np.linspace(1, 2, 64).reshape(8, 8)
    good = compare(expected.astype(np.float16), expected, np.float16)
    bad = compare(np.full((8, 8), np.nan, np.float16), expected, np.float16)
    r = Report()
    for case_id, result in (("good", good), ("bad", bad)):
        r.add(CaseRecord("matrix_copy", "float16", case_id, result.passed,
                         result.stats.to_dict(), 0.1, "nkisim", "trn1"))
    (row,) = r.rows()
    assert (row.cases, row.passed) == (2, 1)
    assert row.max_ulp == pytest.approx(good.stats.ulp.max)  # the all-NaN case has no ULPs
    r.to_json(tmp_path / "r.json")
    json.loads((tmp_path / "r.json").read_text())
    assert Report.from_json(tmp_path / "r.json").rows() == r.rows()
