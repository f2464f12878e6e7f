"""Project wiring for the tests under tests/.

The kernel verification machinery (markers ``simulate``/``device``/``slow``, the
``--nki-*`` options, the ``nki_backend``/``nki_verify``/``nki_check``/``nki_report`` fixtures,
the hypothesis profiles and the session's error-distribution table) is the ``nkiverify`` pytest
plugin, loaded through its ``pytest11`` entry point once the project is installed
(``pip install -e '.[test]'``). This file only adds fixtures shared by tests/.
"""

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded from the test's node id: reproducible, different per test."""
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(scope="session")
def cases():
    """The stored kernel cases (fixtures/configs.py)."""
    from fixtures.configs import CASES
    return CASES


# ---- the bug catalogue's tally (tests/test_bug_catalogue.py) ------------------------------
# Counted from the test reports, so it also works under pytest-xdist (the controlling process
# receives every report).

_BUG_TEST = "test_bug_catalogue.py::test_bug_is_caught["
_bugs = {"caught": 0, "missed": 0}


def pytest_runtest_logreport(report):
    if _BUG_TEST not in report.nodeid:
        return
    if report.when == "call" and report.passed:
        _bugs["caught"] += 1
    elif report.failed and report.when in ("setup", "call"):
        _bugs["missed"] += 1


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # the outermost wrapper: the tally comes after every other summary section (the
    # nki-verify table, the short test summary), as the last line before the final counts
    result = yield
    total = _bugs["caught"] + _bugs["missed"]
    if total and not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"bug catalogue: caught {_bugs['caught']}/{total}")
    return result
