"""Session report: one ``CaseRecord`` per verified case, summarized per (kernel, dtype).

Independent of pytest: the pytest plugin (or any script) adds records and prints
``format_table()`` or writes ``to_json(path)``. The JSON format is documented in
docs/report-schema.md (``SCHEMA_VERSION``); it is written atomically (a temporary file in the
same directory, then a rename), so a reader never sees half a report and a concurrent run
replaces the file whole instead of mixing cases.

What decides a case is the worst element's error as a fraction of its allowed error
(``err/allowed``, above 1 fails) together with the systematic-error and baseline checks; the
table shows it first, then the max abs and rel errors. Max ULP is shown only for kernels whose
outputs are a single rounding (reduction length <= 1: vector add, transpose); after a long
fp32 reduction an output next to zero is millions of its own ulps off while well within the
tolerance, which is relative to the summed magnitudes (nkiverify.compare.Tolerance).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, fields

SCHEMA_VERSION = 2
COLUMNS = ("kernel", "dtype", "cases", "passed", "pass rate", "err/allowed", "max abs",
           "max rel", "max ULP")
TEXT_COLUMNS = 2  # kernel and dtype are left-aligned, the numbers right-aligned


@dataclass
class CaseRecord:
    """One verified case. ``stats`` is ``ErrorStats.to_dict()`` ({} when there are none,
    e.g. a shape mismatch or a kernel that raised); ``backend`` is e.g. "nkisim", ``target``
    e.g. "trn2"; ``error`` the one-line reason a failed case failed (None when it passed);
    ``reduction_length`` the products summed per output (decides whether ULP is shown)."""

    kernel: str
    dtype: str
    case_id: str
    passed: bool
    stats: dict
    elapsed_s: float
    backend: str
    target: str
    error: str | None = None
    params: dict | None = None
    seed: int | None = None
    dist: str | None = None
    kernel_source: str | None = None
    reduction_length: int | None = None
    dialect: str | None = None     # "beta1" or "nki": the NKI dialect the kernel is written in

    @property
    def ulp_meaningful(self) -> bool:
        return self.reduction_length is None or self.reduction_length <= 1


@dataclass
class ReportRow:
    """Summary of the cases of one (kernel, dtype). The error figures are maxima over the cases,
    None when no case has statistics (``max_ulp`` also None when ULP means nothing there)."""

    kernel: str
    dtype: str
    cases: int
    passed: int
    pass_rate: float
    max_ratio: float | None
    max_abs: float | None
    max_rel: float | None
    max_ulp: float | None


def _stat(record, metric, key=None):
    value = (record.stats or {}).get(metric)
    if key is None:
        return value
    return (value or {}).get(key)


def shown_ratio(stats) -> float | None:
    """``err/allowed`` as the tables show it: ``max_ratio``, which covers the finite outputs
    only, or inf when an output is NaN/inf where the golden is finite (never written, or an
    overflow: beyond any allowed error), so a failing run never shows a figure below 1."""
    stats = stats or {}
    if stats.get("nan_count"):
        return math.inf
    return stats.get("max_ratio")


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _format_number(value, spec):
    return "-" if value is None else format(value, spec)


def _tool_version() -> str:
    try:
        from importlib.metadata import version
        return version("nkisim")
    except Exception:  # pragma: no cover - not installed (running from a checkout)
        from nkisim import __version__
        return __version__


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class Report:
    """The records of a session, in the order they were added, and the session's facts
    (``meta``: target, backend, interrupted, command)."""

    def __init__(self, records=(), meta: dict | None = None):
        self.records = list(records)
        self.meta = dict(meta or {})

    def __len__(self):
        return len(self.records)

    def add(self, record):
        self.records.append(record)

    def sorted(self, sort_records) -> Report:
        return Report(sort_records(self.records), self.meta)

    def _groups(self) -> dict:
        """{(kernel label, dtype): [records]}, in order of first appearance."""
        groups: dict = {}
        for record in self.records:
            # the current-dialect twin of a kernel is a row of its own: "conv2d[nki]"
            label = f"{record.kernel}[nki]" if record.dialect == "nki" else record.kernel
            groups.setdefault((label, record.dtype), []).append(record)
        return groups

    def rows(self):
        """One ``ReportRow`` per (kernel, dtype), in order of first appearance."""
        rows = []
        for (kernel, dtype), records in self._groups().items():
            passed = sum(r.passed for r in records)
            rows.append(ReportRow(
                kernel=kernel,
                dtype=dtype,
                cases=len(records),
                passed=passed,
                pass_rate=passed / len(records),
                max_ratio=_max(_stat(r, "max_ratio") for r in records),
                max_abs=_max(_stat(r, "abs", "max") for r in records),
                max_rel=_max(_stat(r, "rel", "max") for r in records),
                max_ulp=_max(_stat(r, "ulp", "max") for r in records if r.ulp_meaningful),
            ))
        return rows

    def format_table(self):
        """Aligned plain-text table: a header line, a rule, one line per (kernel, dtype)."""
        cells = [COLUMNS]
        for row, records in zip(self.rows(), self._groups().values()):
            # (inf where a run's output has NaN/inf: ``shown_ratio``; the JSON keeps max_ratio)
            ratio = _max(shown_ratio(r.stats) for r in records)
            cells.append((
                row.kernel,
                row.dtype,
                str(row.cases),
                str(row.passed),
                f"{100 * row.pass_rate:.1f}%",
                _format_number(ratio, ".3g"),
                _format_number(row.max_abs, ".2e"),
                _format_number(row.max_rel, ".2e"),
                _format_number(row.max_ulp, ".3g"),
            ))
        widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]

        def format_line(line):
            return "  ".join(cell.ljust(w) if i < TEXT_COLUMNS else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(line, widths)))

        rule = "  ".join("-" * w for w in widths)
        return "\n".join([format_line(cells[0]), rule] + [format_line(c) for c in cells[1:]])

    def to_dict(self):
        targets = sorted({r.target for r in self.records})
        meta = {"target": ",".join(targets) or None, "backend": None, "interrupted": False,
                "command": None}
        meta.update(self.meta)
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "nkiverify",
            "tool_version": _tool_version(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            **meta,
            "summary": {"cases": len(self.records),
                        "passed": sum(r.passed for r in self.records),
                        "failed": sum(not r.passed for r in self.records)},
            "rows": [asdict(row) for row in self.rows()],
            "cases": [asdict(record) for record in self.records],
        }

    def to_json(self, path):
        """Write the report (docs/report-schema.md) atomically: temp file + rename."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".nkiverify-", suffix=".json.tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_dict(), f, indent=2)
                f.write("\n")
            # (mkstemp makes the file 0600: give it the mode a plain open() would, 0644 under
            # the usual umask)
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    @classmethod
    def from_json(cls, path):
        """Read a report written by ``to_json`` (the rows are recomputed from the cases)."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        known = {f.name for f in fields(CaseRecord)}
        meta = {k: data[k] for k in ("target", "backend", "interrupted", "command") if k in data}
        return cls((CaseRecord(**{k: v for k, v in case.items() if k in known})
                    for case in data["cases"]), meta)


__all__ = ["COLUMNS", "SCHEMA_VERSION", "CaseRecord", "Report", "ReportRow"]
