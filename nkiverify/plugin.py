"""The pytest plugin (entry point ``pytest11: nkiverify``): markers, options, fixtures, report.

Opt-in. Installed, the plugin is in every pytest session of the environment but stays inert in a
project that did not ask for it: no hypothesis profile is loaded, no ``neuronxcc`` shim is put on
``sys.meta_path``, no environment variable (BLAS threads) is set, no generic marker registered.
A project opts in with the ini key ``nki_verify = true`` (this repo's pyproject.toml does), or a
session with any ``--nki-*`` option. A test that requests an nki fixture (``nki_verify``,
``nki_backend``, ...) gets what that fixture needs (the backend installs the shim when it is
created) without the session-wide changes.

Markers (registered when opted in; ``simulate``/``device`` also as soon as a test uses
``nki_backend``)
    ``simulate``  runs without a device (nkisim, or a real neuronx-cc's simulator)
    ``device``    needs a Neuron device and the real neuronx-cc
    ``slow``      takes more than a few seconds (still part of the default run)
    ``nki_modes(*modes)``  restrict the simulate/device twins a test gets (default both)
    ``nki_dtype(name)``    the dtype of a test that has no ``dtype`` parameter

Options
    ``--nki-kernel [NAME=]PATH:FUNC``     run your kernel instead of ours for its family in every
                                          kernel test (cases, properties, hypothesis); repeatable
    ``--nki-backend {nkisim,neuronxcc}``  what ``simulate`` tests run on (default nkisim)
    ``--nki-target {trn1,trn2}``          the simulated target (default $NKISIM_TARGET or trn2)
    ``--nki-dtypes LIST``                 e.g. ``float16,bfloat16``: deselect tests whose
                                          ``dtype`` parameter is not listed
    ``--nki-contract {course,hardware}``  what property tests draw and which stored cases run
                                          (default: course for the kernels given with
                                          --nki-kernel, which skip the cases beyond it, else
                                          hardware)
    ``--nki-report PATH``                 write every comparison of the session as JSON
    ``--nki-dialect {beta1,nki,both}``    the NKI dialect(s) of our kernels that tests asking
                                          for ``nki_dialect`` run (default both): Beta 1
                                          (``import neuronxcc.nki``) and/or the current ``nki``

Dialects. A test that requests the ``nki_dialect`` fixture (the kernel cases and property tests
in tests/kernels/) is generated once per dialect of ``--nki-dialect`` (``[...-beta1-...]``,
``[...-nki-...]``); ``nki_verify`` then runs the family's kernel written in that dialect (the
shipped kernels have both). A user's kernel (``--nki-kernel``) is in one dialect, read from its
imports: its other-dialect tests skip saying so. Device twins run the dialect the installed SDK
runs (neuronx-cc up to 2.27: beta1; nki 0.3 or newer: nki) and skip with the reason otherwise.
A test that does not request ``nki_dialect`` runs the single dialect ``--nki-dialect`` names,
else each kernel in its own dialect (ours: beta1).

Twins. A test that uses the ``nki_backend`` fixture (directly or through ``nki_verify``) is
generated twice, ``[...-simulate]`` (marked ``simulate``) and ``[...-device]`` (marked
``device``). The device twin is skipped with the reason when there is no device or no
neuronx-cc, and with "simulated twin failed" when its simulate twin failed in this session.

Report. ``nki_check``/``nki_verify`` record a ``nkiverify.report.CaseRecord`` per comparison in
the test's ``user_properties`` (a hypothesis replay of the same case replaces its record, so
replays are not counted twice); the controlling process (also under pytest-xdist) collects them
from the test reports, prints one row per kernel x dtype at the end of the session and writes
``--nki-report``.

Hypothesis profiles (own names, loaded only in an opted-in project whose conftest did not load
one itself): ``nki-ci`` (derandomized, 10 examples, no deadline; the default when $CI is set),
``nki-dev`` (20 examples, no deadline; the default otherwise) and ``nki-thorough`` (200
examples); choose with ``--hypothesis-profile``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict

import pytest

RECORD_KEY = "nki_record"
MODES = ("simulate", "device")
_FAILED_TWINS = pytest.StashKey[set]()
_REPORT = pytest.StashKey[object]()
_OPTED_IN = pytest.StashKey[bool]()
_SAVED_KERNELS = pytest.StashKey[dict]()
_COLLECTOR = "nkiverify-report-collector"
PROFILES = ("nki-ci", "nki-dev", "nki-thorough")

# hypothesis is imported only where it is used: an opted-in session (to load our profile), a
# session naming one of our profiles, or one whose tests import it. Importing it costs every
# pytest process (xdist workers, the sessions tests start) about 1 s of CPU where bytecode is
# not cached (see _stop_rewriting), and a project that did not opt in pays nothing.
_INITIAL_PROFILES = ("default", "ci")    # what hypothesis itself loads at import ($CI: "ci")
_REGISTERED_WITH = None      # the hypothesis `settings` class our profiles are registered with


def _hypothesis():
    """``(settings, HealthCheck)`` with our profiles registered, or ``(None, None)`` without
    hypothesis.

    Registering a profile changes nothing until it is loaded; only opted-in sessions load one.
    function_scoped_fixture: the nki fixtures (backend, recorder) hold no per-example state,
    so `@given` tests may request them (the README recipe)."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # pragma: no cover - hypothesis is in the test extra
        return None, None
    global _REGISTERED_WITH
    if _REGISTERED_WITH is not settings:     # once per hypothesis import
        _REGISTERED_WITH = settings
        ok = [HealthCheck.too_slow, HealthCheck.data_too_large,
              HealthCheck.function_scoped_fixture]
        settings.register_profile("nki-ci", derandomize=True, max_examples=10, deadline=None,
                                  suppress_health_check=ok, print_blob=True)
        settings.register_profile("nki-dev", max_examples=20, deadline=None,
                                  suppress_health_check=ok)
        settings.register_profile("nki-thorough", max_examples=200, deadline=None,
                                  suppress_health_check=ok)
    return settings, HealthCheck


# Assertion rewriting. pytest rewrites the asserts of every module of a distribution that has a
# pytest11 entry point: all of nkisim and nkiverify (ours), all of hypothesis. None of those
# modules has an assert that rewriting would explain (nkisim and nkiverify have none), and
# where bytecode is not cached (PYTHONDONTWRITEBYTECODE=1, a read-only site-packages) every
# pytest process pays it again: measured on the 2-core machine (issue 12), a session that
# simulates one kernel took 2.6 s of CPU, 1.1 s without rewriting; hypothesis alone 0.7 s.
# So our own packages are never rewritten, and hypothesis is not where we import it ourselves
# (opted-in sessions); a project's test files and conftests are rewritten as always.
_OWN_PACKAGES = ("nkisim", "nkiverify")
_HYPOTHESIS_MODULES = ("hypothesis", "_hypothesis_globals", "_hypothesis_ftz_detector")


def _stop_rewriting(pluginmanager, names) -> None:
    # pytest keeps the marked names in a private set: where it has none, nothing changes
    marked = getattr(getattr(pluginmanager, "rewrite_hook", None), "_must_rewrite", None)
    if isinstance(marked, set):
        marked.difference_update(names)


_OPTIONS = ("nki_kernel", "nki_backend", "nki_target", "nki_dtypes", "nki_report", "nki_strict",
            "nki_contract", "nki_dialect")
DIALECT_CHOICES = ("beta1", "nki", "both")
_MARKERS = {
    "simulate": "simulate: kernel test that runs without a device (nkisim or neuronx-cc "
                "simulation)",
    "device": "device: kernel test that needs a Neuron device and the real neuronx-cc",
    "slow": "slow: takes more than a few seconds to simulate (still in the default run)",
}


def pytest_addoption(parser, pluginmanager):
    _stop_rewriting(pluginmanager, _OWN_PACKAGES)     # before anything imports them
    parser.addini("nki_verify", type="bool", default=False,
                  help="opt this project into the nkiverify plugin (profiles, shim, markers)")
    group = parser.getgroup("nkiverify", "NKI kernel verification (nkiverify)")
    group.addoption("--nki-kernel", action="append", default=None, metavar="[NAME=]PATH:FUNC",
                    help="run your kernel instead of ours for its family in every kernel test "
                         "(repeatable), e.g. conv2d=part2/conv2d.py:fused_conv2d_maxpool")
    group.addoption("--nki-backend", choices=("nkisim", "neuronxcc"), default=None,
                    help="where simulate tests run: nkisim (default) or a real neuronx-cc's "
                         "nki.simulate_kernel")
    group.addoption("--nki-target", choices=("trn1", "trn2"), default=None,
                    help="simulated target (default: $NKISIM_TARGET, else trn2)")
    group.addoption("--nki-dtypes", default=None, metavar="LIST",
                    help="comma-separated dtypes to keep (float32,float16,bfloat16); tests "
                         "whose dtype parameter is not listed are deselected")
    group.addoption("--nki-contract", choices=("course", "hardware"), default=None,
                    help="what property tests draw and which stored cases run: the course's "
                         "contract or the hardware's limits (default: course for --nki-kernel "
                         "kernels, whose cases beyond it skip, else hardware)")
    group.addoption("--nki-report", default=None, metavar="PATH",
                    help="write the session's comparisons (per case and per kernel x dtype) "
                         "as JSON")
    group.addoption("--nki-dialect", choices=DIALECT_CHOICES, default=None,
                    help="NKI dialect(s) of the kernels the kernel tests run: beta1 "
                         "(neuronxcc.nki), nki (import nki, NKI 0.3+) or both (default)")
    group.addoption("--nki-strict", action="store_true", default=False,
                    help="strict mode (sets NKISIM_STRICT=1): documented NKI rules the device "
                         "tolerates are errors, not warnings")


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def opted_in(config) -> bool:
    """The ini key ``nki_verify = true`` or any ``--nki-*`` option."""
    try:
        if config.getini("nki_verify"):
            return True
    except ValueError:
        pass
    return any(config.getoption(name, None) for name in _OPTIONS)


def _device_backend(config):
    from .backends import DeviceBackend
    return DeviceBackend(target=_target(config))


def _target(config) -> str:
    target = config.getoption("nki_target") or os.environ.get("NKISIM_TARGET") or "trn2"
    if target.lower() not in ("trn1", "trn2"):
        raise pytest.UsageError(f"NKISIM_TARGET={target!r}: unknown target; nkisim simulates "
                                "trn1, trn2")
    return target.lower()


def _register_markers(config, names=("simulate", "device", "slow")):
    known = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    for name in names:
        if name not in known:
            config.addinivalue_line("markers", _MARKERS[name])


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    for line in (
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
    config.stash[_OPTED_IN] = opted_in(config)
    if config.stash[_OPTED_IN] and "hypothesis" not in sys.modules:
        _stop_rewriting(config.pluginmanager, _HYPOTHESIS_MODULES)    # we import it below
    if config.getoption("hypothesis_profile", None) in PROFILES:
        _hypothesis()       # registered before hypothesis's own plugin loads the profile
    if not config.stash[_OPTED_IN]:
        return

    _register_markers(config)
    _target(config)                     # an unknown NKISIM_TARGET is a usage error, now
    path = config.getoption("nki_report")
    if path and not _is_worker(config):  # checked before any test runs
        from ._util import UsageError, check_report_path
        try:
            check_report_path(path)
        except UsageError as exc:
            raise pytest.UsageError(str(exc)) from None
    refs = config.getoption("nki_kernel") or ()
    if refs:
        from . import registry
        # restored at unconfigure: an in-process session (pytester) must not leave the
        # user's kernel registered in the process that ran it
        config.stash[_SAVED_KERNELS] = dict(registry.KERNELS)
        for ref in refs:
            try:
                registry.use_kernel(ref)
            except registry.KernelRefError as exc:
                raise pytest.UsageError(f"--nki-kernel: {exc}") from None

    from nkisim import shim
    shim.install()          # serves neuronxcc.nki and nki where the real packages are absent

    # Our profile only where the project has not chosen one (its conftest's load_profile, or
    # --hypothesis-profile, wins). hypothesis loads "default" (or its own "ci" when $CI is
    # set) at import; a project that loads another profile changes it, and then we leave it.
    settings, _ = _hypothesis()
    if settings is not None and not config.getoption("hypothesis_profile", None) and \
            getattr(settings, "_current_profile", None) in (None, *_INITIAL_PROFILES):
        settings.load_profile("nki-ci" if os.environ.get("CI") else "nki-dev")

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


def _dialects(config) -> tuple:
    """The dialects ``--nki-dialect`` asks for: ("beta1", "nki") for both (the default)."""
    chosen = config.getoption("nki_dialect", None) or "both"
    return ("beta1", "nki") if chosen == "both" else (chosen,)


def _single_dialect(config) -> str | None:
    """The one dialect ``--nki-dialect`` names, or None (both: each kernel in its own)."""
    d = _dialects(config)
    return d[0] if len(d) == 1 else None


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc):
    if "nki_dialect" in metafunc.fixturenames and not _parametrizes(metafunc, "nki_dialect"):
        metafunc.parametrize("nki_dialect", [
            pytest.param(d, id=d) for d in _dialects(metafunc.config)])
    if "nki_backend" not in metafunc.fixturenames or _parametrizes(metafunc, "nki_mode"):
        return
    marker = metafunc.definition.get_closest_marker("nki_modes")
    modes = marker.args if marker is not None and marker.args else MODES
    unknown = set(modes) - set(MODES)
    if unknown:
        raise pytest.UsageError(f"nki_modes: unknown mode(s) {sorted(unknown)}; use {MODES}")
    _register_markers(metafunc.config, MODES)    # this test asked for the kernel machinery
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
    _let_given_tests_use_nki_fixtures(items)
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
    # so the large cases start early and the short ones balance the workers at the end. Only in
    # an opted-in project: elsewhere `slow` is the project's own marker and its order its own.
    if config.stash.get(_OPTED_IN, False):
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


NKI_FIXTURES = ("nki_verify", "nki_backend", "nki_check", "nki_report", "nki_target",
                "nki_mode", "nki_device", "nki_contract", "nki_dialect")


def _let_given_tests_use_nki_fixtures(items) -> None:
    """A ``@given`` test that requests nki fixtures (the README recipe) would fail hypothesis's
    function-scoped-fixture health check (and its deadline); those fixtures hold no per-example
    state (a backend, a recorder that replaces a replayed case's record), so that check is
    suppressed for exactly those tests (when every function-scoped fixture they request is
    ours), whatever the project's hypothesis profile."""
    if "hypothesis" not in sys.modules:     # no test module uses it
        return
    settings, HealthCheck = _hypothesis()
    if settings is None:
        return
    for item in items:
        fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is None or HealthCheck.function_scoped_fixture in own.suppress_health_check:
            continue
        names = set(getattr(item, "fixturenames", ()))
        if not names & set(NKI_FIXTURES):
            continue
        import inspect
        try:
            params = set(inspect.signature(item.function).parameters)
        except (TypeError, ValueError):
            continue
        info = item._fixtureinfo.name2fixturedefs
        foreign = [n for n in params if n in info and n not in NKI_FIXTURES
                   and info[n][-1].scope == "function"]
        if foreign:
            continue
        # a simulated kernel takes longer than hypothesis's default 200 ms deadline, which is
        # about timing, not correctness: lift it too unless the test set its own
        deadline = None if own.deadline == settings.default.deadline else own.deadline
        fn._hypothesis_internal_use_settings = settings(
            own, deadline=deadline,
            suppress_health_check=[*own.suppress_health_check,
                                   HealthCheck.function_scoped_fixture])


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
def nki_dialect(pytestconfig) -> str | None:
    """The NKI dialect of the kernels this test runs: "beta1" or "nki". A test that requests
    it is generated once per dialect of ``--nki-dialect`` (default both); this default value
    (the single ``--nki-dialect``, else None: each kernel in its own dialect) is what the
    other tests see."""
    return _single_dialect(pytestconfig)


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
        backend = get_backend(request.config.getoption("nki_backend") or "nkisim",
                              target=nki_target)
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

    def record(self, kernel, case_id, dtype, comparison=None, elapsed_s=0.0, passed=None, *,
               error=None, **extra):
        """Add a record; a case already recorded by this test (a hypothesis replay of the same
        example) replaces its record instead of counting again."""
        from .registry import dtype_name
        from .report import CaseRecord
        stats = {}
        if comparison is not None and comparison.stats is not None:
            stats = comparison.stats.to_dict()
        if passed is None:
            passed = bool(comparison is not None and comparison.passed)
        if error is None and comparison is not None and not passed:
            error = "; ".join(comparison.reasons) or None
        if comparison is not None and "reduction_length" not in extra:
            extra["reduction_length"] = comparison.tolerance.reduction_length
        rec = CaseRecord(kernel=kernel, dtype=dtype_name(dtype), case_id=str(case_id),
                         passed=bool(passed), stats=stats, elapsed_s=float(elapsed_s),
                         backend=getattr(self.backend, "name", str(self.backend or "?")),
                         target=str(getattr(self.backend, "target", None) or self.target),
                         error=error, **extra)
        key = (rec.kernel, rec.case_id, rec.dtype)
        props = self.item.user_properties
        for i, (name, value) in enumerate(props):
            if name == RECORD_KEY and (value["kernel"], value["case_id"], value["dtype"]) == key:
                props[i] = (RECORD_KEY, asdict(rec))
                break
        else:
            props.append((RECORD_KEY, asdict(rec)))
        self.records.append(rec)
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


@pytest.fixture(scope="session")
def nki_contract(pytestconfig):
    """``nki_contract(kernel) -> "course" | "hardware"``: what property tests should draw for
    a kernel family: ``--nki-contract``, else "course" for a kernel given with
    ``--nki-kernel`` (a student's kernel need only honour the course's contract), else
    "hardware" (ours handle every shape the hardware allows)."""
    from . import registry
    chosen = pytestconfig.getoption("nki_contract")

    def contract(kernel: str) -> str:
        if chosen:
            return chosen
        spec = registry.KERNELS.get(kernel)
        return "course" if spec is not None and spec.source != "shipped" else "hardware"
    return contract


def _kernel_ref_for_command(spec) -> str | None:
    if spec.source in ("shipped", "user") or spec.kernel is not None:
        return None
    return f"{spec.name}={spec.import_path}"


def _beside_test(kernel, request):
    """A ``[NAME=]PATH:FUNC`` reference whose relative PATH is no file from the current
    directory but is one beside the test file (``test_my_conv.py`` in a checkout, run from
    elsewhere: ``python -m pytest ~/asst4/test_my_conv.py``): that file."""
    if not isinstance(kernel, str) or ":" not in kernel:
        return kernel
    head, _, func = kernel.rpartition(":")
    name, eq, path = head.rpartition("=")
    if not path or os.path.isabs(os.path.expanduser(path)) or os.path.exists(path):
        return kernel
    near = os.path.join(os.path.dirname(str(request.path)), path)
    return f"{name}{eq}{near}:{func}" if os.path.isfile(near) else kernel


@pytest.fixture
def nki_verify(nki_backend, nki_report, request):
    """``nki_verify(kernel, params, dtype, case_id=, seed=, dist=, family=)``: make the inputs,
    run the kernel on this twin's backend, compare with the golden model, record, fail with the
    message (and a one-line command that reproduces the case). Returns the
    ``nkiverify.registry.Outcome``.

    ``kernel``: a registered name ("conv2d"; with ``--nki-kernel`` it is your kernel), a
    reference ("part2/conv2d.py:fused_conv2d_maxpool", "conv2d=mine.py:conv") or a kernel object
    (its family from its course function name, or ``family=``).
    """
    from . import registry

    if "nki_dialect" in request.fixturenames:
        dialect = request.getfixturevalue("nki_dialect")
    else:
        dialect = _single_dialect(request.config)

    def verify(kernel, params, dtype, case_id=None, seed=None, dist="uniform", k=4.0,
               family=None):
        try:
            spec, error = registry.spec_for(_beside_test(kernel, request), family), None
        except registry.KernelRefError as exc:
            spec, error = None, str(exc)
        if error is not None:           # (outside the except: one message, not a chain)
            pytest.fail(f"nki_verify: {error}", pytrace=False)
        if dialect is not None:
            try:
                spec = spec.for_dialect(dialect)
            except registry.DialectMismatch as exc:
                pytest.skip(f"--nki-dialect {dialect}: {exc}")
        reason = nki_backend.dialect_skip_reason(spec.dialect)
        if reason is not None:
            pytest.skip(f"{nki_backend.name} backend cannot run {spec.dialect}-dialect kernels "
                        f"here: {reason}")
        name = spec.name
        dt = registry.dtype_name(dtype)
        case_id = case_id or ",".join(f"{a}={b}" for a, b in params.items())
        if seed is None:
            seed = registry.case_seed(case_id, dtype)
        extra = {"params": dict(params), "seed": int(seed), "dist": dist,
                 "kernel_source": spec.source, "dialect": spec.dialect}
        from ._util import reproduce_command
        repro = reproduce_command(name, params, dt, seed, dist, _kernel_ref_for_command(spec),
                                  nki_backend.target,
                                  dialect=spec.dialect if spec.source == "shipped" else None)
        try:
            outcome = registry.run_case(spec, params, dtype, nki_backend, seed=seed,
                                        dist=dist, k=k)
        except Exception as exc:
            nki_report.record(name, case_id, dtype, None, passed=False,
                              error=f"{type(exc).__name__}: {exc}".splitlines()[0], **extra)
            if hasattr(exc, "add_note"):         # Python 3.11+
                exc.add_note(f"reproduce: {repro}")
            raise
        nki_report.record(name, case_id, dtype, outcome.comparison, outcome.elapsed_s, **extra)
        if not outcome.passed:
            pytest.fail(f"{name} {case_id} [{dt}, {spec.dialect}] on "
                        f"{nki_backend.name}/{nki_backend.target} "
                        f"({spec.label}): {outcome.comparison.message()}\nreproduce: {repro}",
                        pytrace=False)
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
    return report.sorted(sort_records)


def pytest_unconfigure(config):
    saved = config.stash.get(_SAVED_KERNELS, None)
    if saved is not None:
        from . import registry
        registry.KERNELS.clear()
        registry.KERNELS.update(saved)
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
        report.meta.update(target=_target(config), backend=config.getoption("nki_backend")
                           or "nkisim", interrupted=int(exitstatus) == 2,
                           command="pytest " + " ".join(config.invocation_params.args))
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
