"""Where a kernel runs: nkisim, a real neuronx-cc's simulator, or a Neuron device.

One interface::

    backend = get_backend("nkisim", target="trn2")
    if not backend.available():
        print(backend.skip_reason())          # says exactly what is missing
    kernel = backend.load("nkiverify.kernels.conv2d:fused_conv2d_maxpool")  # or "part2/conv2d.py:f"
    out = backend.run(kernel, X, W, bias, pool_size=2)
    p99_us = backend.benchmark(kernel, (X, W, bias), {"pool_size": 2}, warmup=5, iters=20)

Kernels come in two dialects (``nkiverify.registry.DIALECTS``): ``beta1`` (``import
neuronxcc.nki``, Neuron SDK up to 2.27) and ``nki`` (``import nki``, NKI 0.3+, SDK 2.29+).
``backend.dialect_skip_reason(dialect)`` says why a backend cannot run a dialect here (None: it
can).

* :class:`NkisimBackend` runs both on nkisim (``nkisim.runtime.simulate``); ``benchmark``
  returns the cost model's latency estimate for the run (``nkisim.runtime.estimate``).
* :class:`NeuronxccBackend` runs on the real SDK's CPU simulator: Beta 1 kernels through
  ``neuronxcc.nki.simulate_kernel(kernel, *args)`` as the course harness's ``--simulate`` does
  (nki-reference §1.1), ``nki`` kernels through ``nki.simulate(kernel)(*args)`` (nki 0.3+,
  nki-current §3). No timing model, so no ``benchmark``.
* :class:`DeviceBackend` runs on a NeuronCore, in the dialect the installed SDK runs
  (:func:`device_dialect`): Beta 1 (neuronx-cc up to 2.27) through
  ``neuronxcc.nki.baremetal(kernel)(*args)`` for outputs and
  ``neuronxcc.nki.benchmark(warmup=5, iters=20)(kernel)(*args)`` then
  ``.benchmark_result.nc_latency.get_latency_percentile(99)`` (µs) for timing, exactly as the
  course harness measures (cs149-assignment §2); ``nki`` (nki 0.3+) by calling the ``@nki.jit``
  kernel with NumPy arrays, which "compiles and executes standalone kernel, without a
  framework" on a Neuron host, the documented replacement of ``baremetal`` (nki-current §2.1).
  ``nki.benchmark``/``nki.profile`` are gone with no public replacement (§2.1, §6.16); timing
  uses the documented profiling path instead (``nki/guides/use-neuron-profile.rst``): run the
  kernel with ``NEURON_FRAMEWORK_DEBUG=1`` so the NEFF is kept, then ``neuron-explorer capture``
  (``neuron-profile`` on older tools) and the profile summary's ``total_time`` (device time from
  the TPB start/stop notifications, nki-reference §3.6). That is one profiled execution, not the
  p99 of 20 as ``nki.benchmark`` gave.

``load`` imports a kernel module so that ``neuronxcc.nki`` / ``nki`` inside it is the one the
backend needs: nkisim's for ``NkisimBackend``, the real package for the other two. When a real
SDK is installed (a trn2 instance) and nkisim is wanted too, the kernel module is loaded a
second time, privately, with the nkisim shim serving its imports; the real package stays the one
``import neuronxcc`` / ``import nki`` gives everywhere else.

nkisim is imported only inside these functions (DESIGN: nkiverify imports nkisim only inside the
nkisim backend).
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types

DEVICE_PATH = "/dev/neuron0"
_NEURONXCC_MISSING = ("the real neuronx-cc is not importable (it ships only in the AWS Neuron "
                      "pip repository; the PyPI package of that name is a placeholder)")


def neuronxcc_available() -> bool:
    """True when ``import neuronxcc.nki`` can give the real package (not nkisim's shim)."""
    mod = sys.modules.get("neuronxcc")
    if mod is not None and not getattr(mod, "__nkisim__", False):
        return True
    from nkisim import shim
    return shim.real_neuronxcc_available()


def device_present(path: str = DEVICE_PATH) -> bool:
    return os.path.exists(path)


def _version_tuple(text: str | None) -> tuple:
    """(2, 27, 5334) from "2.27.5334.0+abc"; () when there is no version."""
    if not text:
        return ()
    parts = []
    for piece in re.split(r"[.+]", text):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def real_nki_available() -> bool:
    """True when ``import nki`` can give AWS's real package (not nkisim's shim, not the PyPI
    ``nki`` 0.0.1 placeholder, whose ``nki/__init__.py`` only raises "WRONG PACKAGE",
    nki-current §3)."""
    from nkisim import shim
    return shim.real_nki_available()


def sdk_versions() -> dict:
    """The installed AWS SDK packages: {"neuronx-cc": "2.27.5334.0" | None, "nki": "0.6.0" |
    None} (a real package only: placeholders and nkisim's shim count as None)."""
    return {"neuronx-cc": _dist_version("neuronx-cc") if neuronxcc_available() else None,
            "nki": _dist_version("nki") if real_nki_available() else None}


# The dialect each SDK runs on a device (the brief of issue #11, from nki-current §1, §2.1):
# neuronx-cc up to 2.27 runs Beta 1 kernels (baremetal/benchmark work); nki 0.3 and newer runs
# `import nki` kernels called with NumPy arrays. In between (SDK 2.28, nki 0.2.0) neither: the
# Beta 1 decorators are "not available" there and nki 0.2 has no standalone NumPy execution of
# the current kind (and nl.load/nl.add were removed until 0.3.0).
BETA1_LAST = (2, 27)
NKI_FIRST = (0, 3)


def device_dialect_reason(dialect: str, versions: dict | None = None) -> str | None:
    """None when the installed SDK runs ``dialect`` on a device, else the precise reason."""
    v = sdk_versions() if versions is None else versions
    cc, nki = v.get("neuronx-cc"), v.get("nki")
    if dialect == "beta1":
        if cc is None:
            return "Beta 1 kernels need the real neuronx-cc (up to 2.27); " + \
                ("it is not installed" if nki is None else
                 f"only nki {nki} is installed (it runs the nki dialect)")
        if _version_tuple(cc)[:2] > BETA1_LAST:
            return (f"neuronx-cc {cc} no longer runs Beta 1 kernels on a device (neuronxcc.nki."
                    "baremetal/benchmark are not available from 2.28 on, nki-current §2.1); "
                    "use --nki-dialect nki" + ("" if nki else " with nki 0.3 or newer"))
        return None
    if dialect == "nki":
        if nki is None:
            return "nki-dialect kernels need AWS's nki package 0.3 or newer (Neuron pip " + \
                "repository; the PyPI `nki` is a placeholder); " + \
                ("it is not installed" if cc is None else
                 f"only neuronx-cc {cc} is installed (it runs Beta 1 kernels)")
        if _version_tuple(nki)[:2] < NKI_FIRST:
            return (f"nki {nki} predates 0.3.0: no nki.simulate and no NumPy standalone run of "
                    "the current kind; install nki 0.3 or newer")
        return None
    return f"unknown NKI dialect {dialect!r}"


def device_dialects(versions: dict | None = None) -> list:
    """The dialects the installed SDK runs on a device (what ``-m device`` tests pick)."""
    return [d for d in ("beta1", "nki") if device_dialect_reason(d, versions) is None]


def _served_flavor() -> str:
    """Who answers ``import neuronxcc.nki`` in this process now: "nkisim" or "neuronxcc"."""
    mod = sys.modules.get("neuronxcc")
    if mod is not None:
        return "nkisim" if getattr(mod, "__nkisim__", False) else "neuronxcc"
    from nkisim import shim
    if shim.installed() or not neuronxcc_available():
        return "nkisim"
    return "neuronxcc"


def _neuronxcc_modules() -> dict:
    """The modules of both dialects' namespaces (``neuronxcc*`` and ``nki*``)."""
    return {n: m for n, m in sys.modules.items()
            if n in ("neuronxcc", "nki") or n.startswith(("neuronxcc.", "nki."))}


_FLAVOR_MODULES: dict = {}     # flavor -> its neuronxcc.* modules, kept between swaps


@contextlib.contextmanager
def _serving(flavor: str):
    """Temporarily make ``import neuronxcc`` resolve to ``flavor``; restore everything after.

    The modules each flavor imported are kept for the next swap, so the real package is
    imported once per process however often we switch.
    """
    if flavor == _served_flavor():
        yield
        return
    from nkisim import shim
    saved = _neuronxcc_modules()
    for name in saved:
        del sys.modules[name]
    was_installed = shim.installed()
    if flavor == "nkisim" and not was_installed:
        shim.install(force=True)
    elif flavor == "neuronxcc" and was_installed:
        shim.uninstall()
    sys.modules.update(_FLAVOR_MODULES.get(flavor, {}))
    try:
        yield
    finally:
        _FLAVOR_MODULES[flavor] = _neuronxcc_modules()
        for name in _FLAVOR_MODULES[flavor]:
            del sys.modules[name]
        if flavor == "nkisim" and not was_installed:
            shim.uninstall()
        elif flavor == "neuronxcc" and was_installed:
            shim.install(force=True)
        sys.modules.update(saved)


_PRIVATE: dict = {}


def _module_flavor(module) -> str | None:
    """Which ``neuronxcc.nki`` a loaded kernel module got: "nkisim", "neuronxcc" or None."""
    for value in vars(module).values():
        name = getattr(value, "__name__", "") if isinstance(value, types.ModuleType) else ""
        if name.startswith("nkisim."):
            return "nkisim"
        if name.startswith("neuronxcc") or name == "nki" or name.startswith("nki."):
            return "neuronxcc"
    return None


def load_kernel(import_path: str, flavor: str):
    """The kernel at ``module:attr``, with its ``neuronxcc.nki`` imports served by ``flavor``.

    The module is imported normally when that gives the right flavor; otherwise it is loaded
    again under a private name (``_nkiverify_<flavor>.<module>``) while ``flavor`` serves
    ``neuronxcc``, and cached.
    """
    module_name, _, attr = import_path.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"kernel path must be 'module:function' or 'file.py:function', got "
                         f"{import_path!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        return _attr(load_file(module_name, flavor), attr, module_name)
    module = sys.modules.get(module_name)
    if module is None and flavor == _served_flavor():
        module = importlib.import_module(module_name)
    if module is None or _module_flavor(module) not in (flavor, None):
        key = (flavor, module_name)
        module = _PRIVATE.get(key)
        if module is None:
            spec = importlib.util.find_spec(module_name)
            if spec is None or not spec.origin:
                raise ImportError(f"cannot find kernel module {module_name!r}")
            private = f"_nkiverify_{flavor}.{module_name}"
            with _serving(flavor):
                pspec = importlib.util.spec_from_file_location(private, spec.origin)
                module = importlib.util.module_from_spec(pspec)
                pspec.loader.exec_module(module)
            _PRIVATE[key] = module
    return _attr(module, attr, module_name)


def _attr(module, attr, where):
    try:
        return getattr(module, attr)
    except AttributeError:
        names = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and
                       getattr(v, "__module__", None) == module.__name__)
        raise ImportError(f"{where} has no function {attr!r}"
                          + (f" (it defines: {', '.join(names)})" if names else "")) from None


def load_file(path: str, flavor: str):
    """The module at file ``path`` (a student's part2/conv2d.py), its ``neuronxcc.nki`` imports
    served by ``flavor``, loaded under a private name (so it never shadows the user's own
    ``conv2d``/``kernels`` modules) with its directory importable while it loads (as the
    course's ``from conv2d import ...`` expects). Cached per (flavor, path, mtime)."""
    path = os.path.abspath(path)
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        raise ImportError(f"no such kernel file: {path}") from None
    key = (flavor, path, mtime)
    module = _PRIVATE.get(key)
    if module is not None:
        return module
    import zlib
    stem = os.path.splitext(os.path.basename(path))[0].replace("-", "_").replace(".", "_")
    private = f"_nkiverify_{flavor}_file_{zlib.crc32(path.encode()):08x}_{stem}"
    directory = os.path.dirname(path)
    spec = importlib.util.spec_from_file_location(private, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[private] = module     # dataclasses and pickling look modules up by name
    sys.path.insert(0, directory)
    try:
        with _serving(flavor):
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(private, None)
        raise
    finally:
        try:
            sys.path.remove(directory)
        except ValueError:
            pass
    _PRIVATE[key] = module
    return module


class Backend:
    """Runs kernels; see the module docstring. Subclasses set ``name`` and ``flavor``."""

    name = "?"
    flavor = "nkisim"          # which neuronxcc.nki the kernels must be imported with

    def __init__(self, target: str | None = None):
        self.target = target

    def available(self) -> bool:
        return self.skip_reason() is None

    def skip_reason(self) -> str | None:
        """None when usable, else a sentence saying exactly what is missing."""
        return None

    def require(self) -> None:
        reason = self.skip_reason()
        if reason is not None:
            raise RuntimeError(f"backend {self.name} is not available: {reason}")

    def dialect_skip_reason(self, dialect: str) -> str | None:
        """None when this backend can run kernels of ``dialect`` here, else why not."""
        return None

    def load(self, import_path: str):
        self.require()
        return load_kernel(import_path, self.flavor)

    def run(self, kernel, *args, **kwargs):
        raise NotImplementedError

    def benchmark(self, kernel, args=(), kwargs=None, warmup: int = 5, iters: int = 20) -> float:
        """p99 latency in microseconds."""
        raise NotImplementedError(f"backend {self.name} cannot time kernels")

    def release(self) -> None:
        """Forget what the last run keeps (nothing here)."""

    def __repr__(self):
        return f"<{type(self).__name__} target={self.target}>"


class NkisimBackend(Backend):
    """nkisim: exact values, checks, and a cost-model latency estimate (no device needed)."""

    name = "nkisim"
    flavor = "nkisim"

    def __init__(self, target: str | None = None):
        super().__init__(target or os.environ.get("NKISIM_TARGET") or "trn2")
        from nkisim import arch, shim
        arch.get_arch(self.target)            # validate the name early
        if not neuronxcc_available():
            shim.install()
        self.last_run = None

    def run(self, kernel, *args, **kwargs):
        from nkisim import runtime
        self._last_kernel = kernel
        out = runtime.simulate(kernel, args, kwargs, target=self.target)
        self.last_run = runtime.last_run()
        return out

    def release(self) -> None:
        """Forget the last run (``nki-verify`` does between cases): its trace and HBM tensors
        hold the kernel's inputs and output, which the kernel object and
        ``nkisim.runtime.last_run()`` would otherwise keep until that kernel runs again (the
        B=4 224x224 conv2d: 400 MB; measured peak of the three large cases in one job 1554 ->
        1431 MiB; issue 12)."""
        from nkisim import runtime
        run, self.last_run = self.last_run, None
        kernel, self._last_kernel = getattr(self, "_last_kernel", None), None
        if run is None:
            return
        if runtime.last_run() is run:
            runtime._LAST[0] = None
        try:
            k = runtime._as_kernel(kernel)
        except TypeError:
            return
        if getattr(k, "last_run", None) is run:
            k.last_run = None

    def estimate(self, kernel, args=(), kwargs=None):
        """(outputs, Schedule, latency µs) of one simulated run."""
        from nkisim import runtime
        out = self.run(kernel, *args, **(kwargs or {}))
        sched, us = runtime.estimate(self.last_run)
        return out, sched, us

    def benchmark(self, kernel, args=(), kwargs=None, warmup: int = 5, iters: int = 20) -> float:
        # The cost model is deterministic: warmup/iters do not change the estimate.
        return self.estimate(kernel, args, kwargs)[2]


class NeuronxccBackend(Backend):
    """The real SDK's CPU simulator: ``neuronxcc.nki.simulate_kernel`` for Beta 1 kernels,
    ``nki.simulate`` for nki-dialect ones (Linux x86-64 only)."""

    name = "neuronxcc"
    flavor = "neuronxcc"

    def skip_reason(self) -> str | None:
        return None if neuronxcc_available() or real_nki_available() else _NEURONXCC_MISSING

    def dialect_skip_reason(self, dialect: str) -> str | None:
        if dialect == "beta1":
            return None if neuronxcc_available() else _NEURONXCC_MISSING
        v = _dist_version("nki") if real_nki_available() else None
        if v is None:
            return ("AWS's nki package (0.3+) is not importable, so its simulator nki.simulate "
                    "cannot run nki-dialect kernels (the PyPI `nki` is a placeholder)")
        if _version_tuple(v)[:2] < NKI_FIRST:
            return f"nki {v} has no nki.simulate (new in 0.3.0, nki-current §3)"
        return None

    def _nki(self):
        with _serving("neuronxcc"):
            return importlib.import_module("neuronxcc.nki")

    def run(self, kernel, *args, **kwargs):
        from .registry import kernel_dialect
        if kernel_dialect(kernel) == "nki":
            with _serving("neuronxcc"):
                nki = importlib.import_module("nki")
            return nki.simulate(kernel)(*args, **kwargs)
        return self._nki().simulate_kernel(kernel, *args, **kwargs)

    def benchmark(self, kernel, args=(), kwargs=None, warmup: int = 5, iters: int = 20) -> float:
        raise NotImplementedError("neuronx-cc's simulate_kernel has no timing model "
                                  "(nki-reference §4.1); use the nkisim or device backend")


class DeviceBackend(Backend):
    """A NeuronCore: ``nki.baremetal`` for outputs, ``nki.benchmark`` for p99 latency."""

    name = "device"
    flavor = "neuronxcc"

    def __init__(self, target: str | None = None, device_path: str = DEVICE_PATH):
        super().__init__(target)
        self.device_path = device_path

    def skip_reason(self) -> str | None:
        missing = []
        if not neuronxcc_available() and not real_nki_available():
            missing.append(_NEURONXCC_MISSING)
        if not device_present(self.device_path):
            missing.append(f"no Neuron device ({self.device_path} does not exist)")
        return "; ".join(missing) or None

    def dialect_skip_reason(self, dialect: str) -> str | None:
        return device_dialect_reason(dialect)

    def _nki(self):
        with _serving("neuronxcc"):
            return importlib.import_module("neuronxcc.nki")

    def run(self, kernel, *args, **kwargs):
        from .registry import kernel_dialect
        if kernel_dialect(kernel) == "nki":
            return run_nki_on_device(kernel, args, kwargs)
        return self._nki().baremetal(kernel)(*args, **kwargs)

    def benchmark(self, kernel, args=(), kwargs=None, warmup: int = 5, iters: int = 20) -> float:
        from .registry import kernel_dialect
        if kernel_dialect(kernel) == "nki":
            return profile_nki_on_device(kernel, args, kwargs or {})
        bench = self._nki().benchmark(warmup=warmup, iters=iters)(kernel)
        bench(*args, **(kwargs or {}))
        return float(bench.benchmark_result.nc_latency.get_latency_percentile(99))


@contextlib.contextmanager
def _env(**values):
    """Set (str) or unset (None) environment variables for the block."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_nki_on_device(kernel, args, kwargs):
    """An ``@nki.jit`` kernel called with NumPy arrays on a Neuron host compiles and runs it
    standalone (nki-current §2.1, the replacement of ``baremetal``). ``NKI_SIMULATOR`` is
    unset for the call, or the real package would route it to its CPU simulator (§3)."""
    with _env(NKI_SIMULATOR=None):
        return kernel(*args, **(kwargs or {}))


PROFILERS = ("neuron-explorer", "neuron-profile")


def profile_nki_on_device(kernel, args, kwargs) -> float:
    """Device time (µs) of one execution of an ``nki`` kernel, by the documented profiling
    path (``nki/guides/use-neuron-profile.rst``, nki-current §2.1): run it with
    ``NEURON_FRAMEWORK_DEBUG=1`` in a scratch directory so the NEFF is kept, ``capture`` a
    trace of that NEFF, and read ``total_time`` (seconds) from the profile summary."""
    tool = next((t for t in PROFILERS if shutil.which(t)), None)
    if tool is None:
        raise RuntimeError("timing an nki-dialect kernel on a device needs neuron-explorer "
                           "(or neuron-profile) on PATH: nki.benchmark is gone (nki-current "
                           "§2.1), and the documented way is NEURON_FRAMEWORK_DEBUG=1 + capture")
    work = tempfile.mkdtemp(prefix="nkiverify-profile-")
    cwd = os.getcwd()
    try:
        os.chdir(work)
        with _env(NKI_SIMULATOR=None, NEURON_FRAMEWORK_DEBUG="1"):
            kernel(*args, **kwargs)
        neffs = sorted(glob.glob(os.path.join(work, "**", "*.neff"), recursive=True),
                       key=os.path.getmtime)
        if not neffs:
            raise RuntimeError(f"NEURON_FRAMEWORK_DEBUG=1 left no .neff under {work}")
        neff, ntff = neffs[-1], os.path.join(work, "profile.ntff")
        subprocess.run([tool, "capture", "-n", neff, "-s", ntff], check=True,
                       capture_output=True, text=True)
        view = subprocess.run([tool, "view", "-n", neff, "-s", ntff, "--output-format",
                               "summary-text"], check=True, capture_output=True, text=True)
        return parse_total_time_us(view.stdout)
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)


def parse_total_time_us(summary: str) -> float:
    """µs from a profile summary's ``total_time`` line (seconds, nki-reference §3.6)."""
    m = re.search(r"total_time\W+([0-9.]+(?:[eE][-+]?\d+)?)", summary)
    if m is None:
        raise RuntimeError("the profile summary has no total_time: "
                           + (summary.strip().splitlines() or ["(empty)"])[0][:200])
    return float(m.group(1)) * 1e6


BACKENDS = {"nkisim": NkisimBackend, "neuronxcc": NeuronxccBackend, "device": DeviceBackend}


def get_backend(name: str, target: str | None = None, **kwargs) -> Backend:
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None
    return cls(target=target, **kwargs)
