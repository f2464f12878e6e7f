"""Where a kernel runs: nkisim, a real neuronx-cc's simulator, or a Neuron device.

One interface::

    backend = get_backend("nkisim", target="trn2")
    if not backend.available():
        print(backend.skip_reason())          # says exactly what is missing
    kernel = backend.load("nkiverify.kernels.conv2d:fused_conv2d_maxpool")  # or "part2/conv2d.py:f"
    out = backend.run(kernel, X, W, bias, pool_size=2)
    p99_us = backend.benchmark(kernel, (X, W, bias), {"pool_size": 2}, warmup=5, iters=20)

* :class:`NkisimBackend` runs on nkisim (``nkisim.runtime.simulate``); ``benchmark`` returns the
  cost model's latency estimate for the run (``nkisim.runtime.estimate``).
* :class:`NeuronxccBackend` runs on the real neuronx-cc's CPU simulator,
  ``nki.simulate_kernel(kernel, *args)`` as the course harness's ``--simulate`` does
  (nki-reference §1.1). It has no timing model, so no ``benchmark``.
* :class:`DeviceBackend` runs on a NeuronCore: ``nki.baremetal(kernel)(*args)`` for outputs and
  ``nki.benchmark(warmup=5, iters=20)(kernel)(*args)`` then
  ``.benchmark_result.nc_latency.get_latency_percentile(99)`` (µs) for timing, exactly as the
  course harness measures (cs149-assignment §2).

``load`` imports a kernel module so that ``neuronxcc.nki`` inside it is the one the backend
needs: nkisim's for ``NkisimBackend``, the real package for the other two. When a real
neuronx-cc is installed (a trn2 instance) and nkisim is wanted too, the kernel module is loaded a
second time, privately, with the nkisim shim serving its imports; the real package stays the one
``import neuronxcc`` gives everywhere else.

nkisim is imported only inside these functions (DESIGN: nkiverify imports nkisim only inside the
nkisim backend).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
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
    return {n: m for n, m in sys.modules.items() if n == "neuronxcc" or n.startswith("neuronxcc.")}


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
        if name.startswith("neuronxcc"):
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

    def load(self, import_path: str):
        self.require()
        return load_kernel(import_path, self.flavor)

    def run(self, kernel, *args, **kwargs):
        raise NotImplementedError

    def benchmark(self, kernel, args=(), kwargs=None, warmup: int = 5, iters: int = 20) -> float:
        """p99 latency in microseconds."""
        raise NotImplementedError(f"backend {self.name} cannot time kernels")

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
        out = runtime.simulate(kernel, args, kwargs, target=self.target)
        self.last_run = runtime.last_run()
        return out

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
    """The real neuronx-cc's CPU simulator, ``nki.simulate_kernel`` (Linux x86-64 only)."""

    name = "neuronxcc"
    flavor = "neuronxcc"

    def skip_reason(self) -> str | None:
        return None if neuronxcc_available() else _NEURONXCC_MISSING

    def _nki(self):
        with _serving("neuronxcc"):
            return importlib.import_module("neuronxcc.nki")

    def run(self, kernel, *args, **kwargs):
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
        if not neuronxcc_available():
            missing.append(_NEURONXCC_MISSING)
        if not device_present(self.device_path):
            missing.append(f"no Neuron device ({self.device_path} does not exist)")
        return "; ".join(missing) or None

    def _nki(self):
        with _serving("neuronxcc"):
            return importlib.import_module("neuronxcc.nki")

    def run(self, kernel, *args, **kwargs):
        return self._nki().baremetal(kernel)(*args, **kwargs)

    def benchmark(self, kernel, args=(), kwargs=None, warmup: int = 5, iters: int = 20) -> float:
        bench = self._nki().benchmark(warmup=warmup, iters=iters)(kernel)
        bench(*args, **(kwargs or {}))
        return float(bench.benchmark_result.nc_latency.get_latency_percentile(99))


BACKENDS = {"nkisim": NkisimBackend, "neuronxcc": NeuronxccBackend, "device": DeviceBackend}


def get_backend(name: str, target: str | None = None, **kwargs) -> Backend:
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None
    return cls(target=target, **kwargs)
