"""nkiverify: verify NKI kernels against golden models, on nkisim or on a device.

- ``strategies``: hypothesis strategies for kernel cases within nkisim.arch's hardware limits.
- ``registry``: per kernel, its import path, input maker, golden, baseline, reduction length;
  ``run_case`` is the pipeline inputs -> backend -> golden -> comparison.
- ``backends``: ``NkisimBackend``, ``NeuronxccBackend`` (a real neuronx-cc's simulate_kernel),
  ``DeviceBackend`` (``nki.baremetal`` / ``nki.benchmark``), ``get_backend(name)``.
- ``compare``: tolerance-aware comparison with error distributions.
- ``report``: the session report (per case, per kernel x dtype).
- ``plugin``: the pytest plugin (markers ``simulate``/``device``, ``--nki-*`` options, fixtures).
- ``cli``: the ``nki-verify`` command.

Submodules are imported on demand; importing the package itself is cheap (the pytest plugin
loads it in every session).
"""

__all__ = ["register", "use_kernel"]


def __getattr__(name):
    # nkiverify.register / nkiverify.use_kernel without importing NumPy at package import
    if name in ("register", "use_kernel"):
        from . import registry
        return getattr(registry, name)
    raise AttributeError(f"module 'nkiverify' has no attribute {name!r}")
