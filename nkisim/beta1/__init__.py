"""``neuronxcc.nki``, NKI Beta 1 (the CS149 course's dialect), as the shim serves it: kernel
decorators and runners, and the nl / nisa / ncc / nt submodules. A thin face over the machine core.
"""

from __future__ import annotations

from ..runtime import (  # noqa: F401
    Kernel,
    baremetal,
    benchmark,
    jit,
    profile,
    simulate_kernel,
    trace,
)
from ..tensor import Tensor as tensor  # noqa: F401
from . import compiler, isa, language, typing  # noqa: F401
