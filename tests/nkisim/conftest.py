"""Fixtures shared by the interpreter's tests."""

import sys

import pytest

from nkisim import shim


def _served_modules() -> dict:
    return {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("nki", "neuronxcc")}


@pytest.fixture
def shim_restored():
    """The import system (the shim's hook, what it serves, the `nki`/`neuronxcc` modules) as
    it was before the test, restored after whatever the test installed."""
    was = shim._hook_active(), set(shim._serving)
    saved = _served_modules()
    yield
    shim.uninstall()
    for n in _served_modules():
        del sys.modules[n]
    sys.modules.update(saved)
    if was[0]:
        shim._serving.update(was[1])
        sys.meta_path.insert(0, shim._finder)


@pytest.fixture
def served(shim_restored):
    """The shim installed for the test (`import nki...` and `import neuronxcc...` resolve),
    the import system restored after."""
    shim.install(force=True)
