"""Fixtures shared by the interpreter's tests."""

import sys

import pytest

from nkisim import shim


@pytest.fixture
def served():
    """The shim installed for the test (`import nki...` and `import neuronxcc...` resolve),
    the import system restored after."""
    was = shim._hook_active(), set(shim._serving)
    saved = {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("nki", "neuronxcc")}
    shim.install(force=True)
    yield
    shim.uninstall()
    for n in [n for n in sys.modules if n.split(".")[0] in ("nki", "neuronxcc")]:
        del sys.modules[n]
    sys.modules.update(saved)
    if was[0]:
        shim._serving.update(was[1])
        sys.meta_path.insert(0, shim._finder)
