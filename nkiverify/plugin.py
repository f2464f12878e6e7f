"""The pytest plugin (entry point ``pytest11: nkiverify``): markers, options, fixtures, report.

Markers
    ``simulate``  runs without a device (nkisim, or a real neuronx-cc's simulator)
    ``device``    needs a Neuron device and the real neuronx-cc
    ``slow``      takes more than a few seconds (still part of the default run)
    ``nki_modes(*modes)``  restrict the simulate/device twins a test gets (default both)
    ``nki_dtype(name)``    the dtype of a test that has no ``dtype`` parameter

Options
    ``--nki-backend {nkisim,neuronxcc}``  what ``simulate`` tests run on (default nkisim)
    ``--nki-target {trn1,trn2}``          the simulated target (default $NKISIM_TARGET or trn2)
    ``--nki-dtypes LIST``                 e.g. ``float16,bfloat16``: deselect tests whose
                                          ``dtype`` parameter is not listed
    ``--nki-report PATH``                 write every comparison of the session as JSON

Twins. A test that uses the ``nki_backend`` fixture (directly or through ``nki_verify``) is
generated twice, ``[...-simulate]`` (marked ``simulate``) and ``[...-device]`` (marked
``device``). The device twin is skipped with the reason when there is no device or no
neuronx-cc, and with "simulated twin failed" when its simulate twin failed in this session.

Report. ``nki_check``/``nki_verify`` record a ``nkiverify.report.CaseRecord`` per comparison in
the test's ``user_properties``; the controlling process (also under pytest-xdist) collects them
from the test reports, prints one row per kernel x dtype at the end of the session and writes
``--nki-report``.

Hypothesis profiles: ``ci`` (derandomized, 10 examples, no deadline; the default when $CI is
set), ``dev`` (20 examples, no deadline; the default otherwise) and ``thorough`` (200 examples);
choose with ``--hypothesis-profile``.

The shim: at configure time, before test modules import kernels, ``neuronxcc.nki`` is served by
nkisim unless a real neuronx-cc is installed (then the nkisim backend loads kernels privately
with the shim, see ``nkiverify.backends.load_kernel``).
"""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest

RECORD_KEY = "nki_record"
MODES = ("simulate", "device")
_FAILED_TWINS = pytest.StashKey[set]()
_REPORT = pytest.StashKey[object]()
_COLLECTOR = "nkiverify-report-collector"

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    settings = None
else:
    _SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile("ci", derandomize=True, max_examples=10, deadline=None,
                              suppress_health_check=_SLOW_OK, print_blob=True)
    settings.register_profile("dev", max_examples=20, deadline=None,
                              suppress_health_check=_SLOW_OK)
    settings.register_profile("thorough", max_examples=200, deadline=None,
                              suppress_health_check=_SLOW_OK)


def pytest_addoption(parser):
    group = parser.getgroup("nkiverify", "NKI kernel verification (nkiverify)")
    group.addoption("--nki-backend", choices=("nkisim", "neuronxcc"), default="nkisim",
                    help="where simulate tests run: nkisim (default) or a real neuronx-cc's "
                         "nki.simulate_kernel")
    group.addoption("--nki-target", choices=("trn1", "trn2"), default=None,
                    help="simulated target (default: $NKISIM_TARGET, else trn2)")
    group.addoption("--nki-dtypes", default=None, metavar="LIST",
                    help="comma-separated dtypes to keep (float32,float16,bfloat16); tests "
                         "whose dtype parameter is not listed are deselected")
    group.addoption("--nki-report", default=None, metavar="PATH",
                    help="write the session's comparisons (per case and per kernel x dtype) "
                         "as JSON")
    group.addoption("--nki-strict", action="store_true", default=False,
                    help="strict mode (sets NKISIM_STRICT=1): documented NKI rules the device "
                         "tolerates are errors, not warnings")


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _device_backend(config):
    from .backends import DeviceBackend
    return DeviceBackend(target=_target(config))


def _target(config) -> str:
    return config.getoption("nki_target") or os.environ.get("NKISIM_TARGET") or "trn2"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    for line in (
        "simulate: kernel test that runs without a device (nkisim or neuronx-cc simulation)",
        "device: kernel test that needs a Neuron device and the real neuronx-cc",
        "slow: takes more than a few seconds to simulate (still in the default run)",
        "nki_modes(*modes): the twins (simulate, device) a kernel test is generated for",
        "nki_dtype(name): the dtype of a test without a `dtype` parameter (for --nki-dtypes)",
    ):
        config.addinivalue_line("markers", line)
    config.stash[_FAILED_TWINS] = set()
    if config.getoption("nki_strict", False):
        os.environ["NKISIM_STRICT"] = "1"      # read by every nkisim run (xdist workers too)
    from .report import Report
    config.stash[_REPORT] = Report()
    if not _is_worker(config):
        config.pluginmanager.register(_Collector(config.stash[_REPORT]), _COLLECTOR)

    from nkisim import shim
    if not shim.real_neuronxcc_available():
        shim.install()

    if settings is not None and not config.getoption("hypothesis_profile", None):
        settings.load_profile("ci" if os.environ.get("CI") else "dev")

    # One BLAS thread per xdist worker (workers inherit this environment when they start, after
    # configure). nkisim issues thousands of small matmuls (128x128 by 128x512) for which
    # OpenBLAS threads only add overhead, and with -n 2 on 2 cores the workers' BLAS threads
    # oversubscribe the cores: the B=1 224x224 conv2d simulation took 50 s instead of 2 s on a
    # busy 2-core machine.
    if getattr(config.option, "numprocesses", None) and not _is_worker(config):
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")

    # Twins must run on the same xdist worker for "simulated twin failed" to be seen; that
    # only matters where device twins can run at all.
    if getattr(config.option, "dist", "no") == "load" and _device_backend(config).available():
        config.option.dist = "loadgroup"
    elif getattr(config.option, "dist", "no") == "load" and not config.stash.get(_DIST_GIVEN,
                                                                                  True):
        # `-n N` without `--dist`: xdist's `load` hands tests out in fixed chunks, so the large
        # conv2d cases could pile up on one worker (issue 12: `pytest -n 2` 131-136 s, `-n 1`
        # 170 s); `worksteal` lets an idle worker take a busy one's pending tests (92-95 s).
        # With the slow cases ordered first (pytest_collection_modifyitems) each worker
        # starts on large cases and the small ones fill in at the end.
        config.option.dist = "worksteal"


_DIST_GIVEN = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_cmdline_main(config):
    # before xdist turns `-n N` into `--dist load`: did the user choose a distribution mode?
    config.stash[_DIST_GIVEN] = getattr(config.option, "dist", "no") != "no" or \
        bool(getattr(config.option, "distload", False))
    yield


# ---- twins --------------------------------------------------------------------------------

def _parametrizes(metafunc, name) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc):
    if "nki_backend" not in metafunc.fixturenames or _parametrizes(metafunc, "nki_mode"):
        return
    marker = metafunc.definition.get_closest_marker("nki_modes")
    modes = marker.args if marker is not None and marker.args else MODES
    unknown = set(modes) - set(MODES)
    if unknown:
        raise pytest.UsageError(f"nki_modes: unknown mode(s) {sorted(unknown)}; use {MODES}")
    metafunc.parametrize("nki_mode", [
        pytest.param(m, id=m, marks=getattr(pytest.mark, m)) for m in modes])


def _mode(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("nki_mode") if callspec is not None else None


def _twin_key(item):
    """Identifies a simulate/device pair: the test and its other parameters."""
    params = item.callspec.params
    return (str(item.path), item.originalname,
            tuple(sorted((k, id(v)) for k, v in params.items() if k != "nki_mode")))


def _twin_group(item) -> str:
    """An xdist group name shared by a simulate/device pair, the same in every process."""
    import zlib
    tokens = item.callspec.id.split("-")
    mode = _mode(item)
    if mode in tokens:
        del tokens[len(tokens) - 1 - tokens[::-1].index(mode)]
    name = f"{item.nodeid.split('[')[0]}[{'-'.join(tokens)}]"
    return f"nki-{zlib.crc32(name.encode()):08x}"


def _dtype_name(value) -> str | None:
    from .registry import dtype_name
    try:
        return dtype_name(value)
    except TypeError:
        return None


@pytest.hookimpl(tryfirst=True)   # before xdist's worker hook turns xdist_group into nodeids
def pytest_collection_modifyitems(session, config, items):
    allowed = config.getoption("nki_dtypes")
    if allowed:
        keep_names = set()
        for name in allowed.split(","):
            if name.strip():
                dt = _dtype_name(name.strip())
                if dt is None:
                    raise pytest.UsageError(f"--nki-dtypes: unknown dtype {name.strip()!r}")
                keep_names.add(dt)
        selected, deselected = [], []
        for item in items:
            callspec = getattr(item, "callspec", None)
            # a test's own dtype parameter wins; nki_dtype marks the tests without one
            value = callspec.params.get("dtype") if callspec is not None else None
            if value is None:
                marker = item.get_closest_marker("nki_dtype")
                value = marker.args[0] if marker is not None else None
            if value is not None and _dtype_name(value) not in keep_names:
                deselected.append(item)
            else:
                selected.append(item)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = selected

    # The slow cases first (stable: the rest keeps its order), the same on every xdist worker,
    # so the large cases start early and the short ones balance the workers at the end.
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("slow") is None)

    # Each device twin right after its simulate twin, so the simulate outcome is known.
    twins = [i for i in items if _mode(i) is not None]
    if twins:
        order = {}
        for pos, item in enumerate(items):
            if _mode(item) == "simulate":
                order.setdefault(_twin_key(item), pos)
        def position(pair):
            pos, item = pair
            if _mode(item) == "device":
                return (order.get(_twin_key(item), pos), 1)
            return (pos, 0)
        items[:] = [item for _, item in sorted(enumerate(items), key=position)]
        # on xdist workers `dist` is "no" and `loadgroup` says what the controller uses
        if getattr(config.option, "loadgroup", False) or \
                getattr(config.option, "dist", "no") == "loadgroup":
            for item in twins:
                item.add_marker(pytest.mark.xdist_group(_twin_group(item)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and _mode(item) == "simulate":
        item.config.stash[_FAILED_TWINS].add(_twin_key(item))


# ---- fixtures -----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def nki_target(pytestconfig) -> str:
    """The simulated target: ``--nki-target``, else $NKISIM_TARGET, else trn2."""
    return _target(pytestconfig)


@pytest.fixture
def nki_mode() -> str:
    """"simulate" or "device" (tests using ``nki_backend`` are parametrized over both)."""
    return "simulate"


@pytest.fixture
def nki_backend(request, nki_mode, nki_target):
    """The backend this twin runs on; skips with the reason when it cannot run here."""
    from .backends import get_backend
    if nki_mode == "device":
        if _twin_key(request.node) in request.config.stash[_FAILED_TWINS]:
            pytest.skip("simulated twin failed: not running it on the device")
        backend = _device_backend(request.config)
    else:
        backend = get_backend(request.config.getoption("nki_backend"), target=nki_target)
    reason = backend.skip_reason()
    if reason is not None:
        pytest.skip(f"{backend.name} backend unavailable: {reason}")
    return backend


@pytest.fixture
def nki_device(nki_target, request):
    """The device backend, or a skip saying what is missing (for device-only tests such as
    performance thresholds, which have no simulate twin)."""
    backend = _device_backend(request.config)
    reason = backend.skip_reason()
    if reason is not None:
        pytest.skip(f"device backend unavailable: {reason}")
    return backend


class Recorder:
    """Records comparisons of one test into the session report (see ``nki_report``)."""

    def __init__(self, item, backend=None, target=None):
        self.item = item
        self.backend = backend
        self.target = target
        self.records = []

    def record(self, kernel, case_id, dtype, comparison=None, elapsed_s=0.0, passed=None):
        from .registry import dtype_name
        from .report import CaseRecord
        stats = {}
        if comparison is not None and comparison.stats is not None:
            stats = comparison.stats.to_dict()
        if passed is None:
            passed = bool(comparison is not None and comparison.passed)
        rec = CaseRecord(kernel=kernel, dtype=dtype_name(dtype), case_id=str(case_id),
                         passed=bool(passed), stats=stats, elapsed_s=float(elapsed_s),
                         backend=getattr(self.backend, "name", str(self.backend or "?")),
                         target=str(getattr(self.backend, "target", None) or self.target))
        self.records.append(rec)
        self.item.user_properties.append((RECORD_KEY, asdict(rec)))
        return rec

    def check(self, kernel, case_id, dtype, actual, expected, *, reduction_length=1,
              scale=None, baseline=None, k=4.0, elapsed_s=0.0, tolerance=None):
        """``compare`` ``actual`` with ``expected``, record it, fail with the message."""
        from .compare import compare
        from .registry import dtype_of
        comparison = compare(actual, expected, dtype_of(dtype), reduction_length=reduction_length,
                             scale=scale, baseline=baseline, k=k, tolerance=tolerance)
        self.record(kernel, case_id, dtype, comparison, elapsed_s)
        if not comparison.passed:
            pytest.fail(f"{kernel} {case_id} [{dtype}]: {comparison.message()}", pytrace=False)
        return comparison


def _backend_if_requested(request):
    if "nki_backend" in request.fixturenames:
        return request.getfixturevalue("nki_backend")
    return None


@pytest.fixture
def nki_report(request, nki_target):
    """A :class:`Recorder` for this test: ``nki_report.record(...)``/``.check(...)``."""
    return Recorder(request.node, _backend_if_requested(request), nki_target)


@pytest.fixture
def nki_check(nki_report):
    """``nki_check(kernel, case_id, dtype, actual, expected, reduction_length=, scale=,
    baseline=, k=)``: compare, record in the session report, fail with the comparison's
    message."""
    return nki_report.check


@pytest.fixture
def nki_verify(nki_backend, nki_report):
    """``nki_verify(kernel, params, dtype, case_id=, seed=, dist=)``: make the inputs, run the
    kernel on this twin's backend, compare with the golden model, record, fail with the
    message. Returns the ``nkiverify.registry.Outcome``."""
    from . import registry

    def verify(kernel, params, dtype, case_id=None, seed=None, dist="uniform", k=4.0):
        case_id = case_id or ",".join(f"{a}={b}" for a, b in params.items())
        if seed is None:
            seed = registry.case_seed(case_id, dtype)
        try:
            outcome = registry.run_case(kernel, params, dtype, nki_backend, seed=seed,
                                        dist=dist, k=k)
        except Exception:
            nki_report.record(kernel, case_id, dtype, None, passed=False)
            raise
        nki_report.record(kernel, case_id, dtype, outcome.comparison, outcome.elapsed_s)
        if not outcome.passed:
            pytest.fail(f"{kernel} {case_id} [{registry.dtype_name(dtype)}] on "
                        f"{nki_backend.name}/{nki_backend.target}: "
                        f"{outcome.comparison.message()}", pytrace=False)
        return outcome

    return verify


# ---- report -------------------------------------------------------------------------------

class _Collector:
    """Collects the CaseRecords of every test report in the controlling process."""

    def __init__(self, report):
        self.report = report

    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        from .report import CaseRecord
        for name, value in report.user_properties:
            if name == RECORD_KEY:
                self.report.add(CaseRecord(**value))


def _sorted(report):
    """The report with its records in kernel (registry) order, then dtype order."""
    from .registry import sort_records
    from .report import Report
    return Report(sort_records(report.records))


def pytest_unconfigure(config):
    plugin = config.pluginmanager.get_plugin(_COLLECTOR)
    if plugin is not None:
        config.pluginmanager.unregister(plugin)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if _is_worker(config):
        return
    path = config.getoption("nki_report")
    report = config.stash.get(_REPORT, None)
    if path and report is not None:
        _sorted(report).to_json(path)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _is_worker(config):
        return
    report = config.stash.get(_REPORT, None)
    if not report:
        return
    terminalreporter.section("nki-verify: kernel x dtype error summary")
    terminalreporter.write_line(_sorted(report).format_table())
    path = config.getoption("nki_report")
    if path:
        terminalreporter.write_line(f"per-case details written to {path}")
