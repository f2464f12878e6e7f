"""Session report: one ``CaseRecord`` per verified case, summarized per (kernel, dtype).

Independent of pytest: the pytest plugin (or any script) adds records and prints
``format_table()`` or writes ``to_json(path)``.
"""

import json
from dataclasses import asdict, dataclass

COLUMNS = ("kernel", "dtype", "cases", "passed", "pass rate", "max ULP", "p99 ULP", "max rel")
TEXT_COLUMNS = 2  # kernel and dtype are left-aligned, the numbers right-aligned


@dataclass
class CaseRecord:
    """One verified case. ``stats`` is ``ErrorStats.to_dict()`` ({} when there are none,
    e.g. a shape mismatch); ``backend`` is e.g. "nkisim", ``target`` e.g. "trn2"."""

    kernel: str
    dtype: str
    case_id: str
    passed: bool
    stats: dict
    elapsed_s: float
    backend: str
    target: str


@dataclass
class ReportRow:
    """Summary of the cases of one (kernel, dtype). The error figures are maxima over the cases
    (``p99_ulp``: the largest per-case p99), None when no case has statistics."""

    kernel: str
    dtype: str
    cases: int
    passed: int
    pass_rate: float
    max_ulp: float | None
    p99_ulp: float | None
    max_rel: float | None


def _stat(record, metric, key):
    value = (record.stats or {}).get(metric) or {}
    return value.get(key)


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _format_number(value, spec):
    return "-" if value is None else format(value, spec)


class Report:
    """The records of a session, in the order they were added."""

    def __init__(self, records=()):
        self.records = list(records)

    def __len__(self):
        return len(self.records)

    def add(self, record):
        self.records.append(record)

    def rows(self):
        """One ``ReportRow`` per (kernel, dtype), in order of first appearance."""
        groups = {}
        for record in self.records:
            groups.setdefault((record.kernel, record.dtype), []).append(record)
        rows = []
        for (kernel, dtype), records in groups.items():
            passed = sum(r.passed for r in records)
            rows.append(ReportRow(
                kernel=kernel,
                dtype=dtype,
                cases=len(records),
                passed=passed,
                pass_rate=passed / len(records),
                max_ulp=_max(_stat(r, "ulp", "max") for r in records),
                p99_ulp=_max(_stat(r, "ulp", "p99") for r in records),
                max_rel=_max(_stat(r, "rel", "max") for r in records),
            ))
        return rows

    def format_table(self):
        """Aligned plain-text table: a header line, a rule, one line per (kernel, dtype)."""
        cells = [COLUMNS]
        for row in self.rows():
            cells.append((
                row.kernel,
                row.dtype,
                str(row.cases),
                str(row.passed),
                f"{100 * row.pass_rate:.1f}%",
                _format_number(row.max_ulp, ".3g"),
                _format_number(row.p99_ulp, ".3g"),
                _format_number(row.max_rel, ".2e"),
            ))
        widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]

        def format_line(line):
            return "  ".join(cell.ljust(w) if i < TEXT_COLUMNS else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(line, widths)))

        rule = "  ".join("-" * w for w in widths)
        return "\n".join([format_line(cells[0]), rule] + [format_line(c) for c in cells[1:]])

    def to_dict(self):
        return {"rows": [asdict(row) for row in self.rows()],
                "cases": [asdict(record) for record in self.records]}

    def to_json(self, path):
        """Write ``{"rows": [...], "cases": [...]}`` to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")

    @classmethod
    def from_json(cls, path):
        """Read a report written by ``to_json`` (the rows are recomputed from the cases)."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return cls(CaseRecord(**case) for case in data["cases"])
