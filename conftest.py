"""Project wiring for the tests under tests/.

The kernel verification machinery (markers ``simulate``/``device``/``slow``, the
``--nki-*`` options, the ``nki_backend``/``nki_verify``/``nki_check``/``nki_report`` fixtures,
the hypothesis profiles and the session's error-distribution table) is the ``nkiverify`` pytest
plugin, loaded through its ``pytest11`` entry point once the project is installed
(``pip install -e '.[test]'``). This file only adds fixtures shared by tests/.
"""

import numpy as np
import pytest

# ---- the default run and the thorough one -----------------------------------------------
# The README's test command (`python -m pytest -n 2 -q`) is the lean default: the tests marked
# `slow` are deselected. They are the larger instances of behaviours the default run also tests
# on a smaller input (the 224x224 conv2d cases with 256 channels at B=4 and B=1 against the
# 32x16 cases and the 128-channel 224x224 image, the 4096x4096 transpose against 1024x1024,
# the handout's ROW_CHUNK=1 kernel at n=25600 against n=1280) and the wheel build of
# test_isolation. `--run-slow` (or any `-m` expression naming `slow`, e.g. `-m slow`) runs
# them: `.ci/run` runs `-m slow` as its thorough step, the per-dtype tox environments pass
# `--run-slow`.


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "shipped_kernel(family): tests our own kernel of that family directly; "
        "skipped when --nki-kernel gives yours for it")


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (deselected by default)")


def _runs_slow(config) -> bool:
    return config.getoption("--run-slow") or "slow" in (config.getoption("markexpr") or "")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    _skip_our_kernels_tests(config, items)
    if _runs_slow(config):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        keep = set(map(id, slow))
        items[:] = [item for item in items if id(item) not in keep]


def _skip_our_kernels_tests(config, items):
    """Under `--nki-kernel conv2d=...` the tests of our own conv2d module (test_conv2d_kernel,
    test_conv2d_timeline) would pass whatever your kernel does: they are skipped, saying so."""
    if not config.getoption("nki_kernel", None):
        return
    from nkiverify import registry
    yours = {name for name, spec in registry.KERNELS.items()
             if spec is not registry.SHIPPED.get(name)}
    for item in items:
        mark = item.get_closest_marker("shipped_kernel")
        if mark is not None and mark.args[0] in yours:
            item.add_marker(pytest.mark.skip(
                reason=f"tests our own {mark.args[0]} kernel, not yours (--nki-kernel)"))


def pytest_report_header(config):
    if not _runs_slow(config):
        return "slow tests deselected (--run-slow or -m slow runs them)"


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
