"""The ``neuronxcc.nki`` package as the shim serves it: kernels, runners, submodules."""

from __future__ import annotations

from . import compiler, isa, language, typing  # noqa: F401
from .runtime import (  # noqa: F401
    Kernel,
    baremetal,
    benchmark,
    jit,
    profile,
    simulate_kernel,
    trace,
)
from .tensor import Tensor as tensor  # noqa: F401
