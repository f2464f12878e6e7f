"""nkisim: a pure-NumPy interpreter of NKI, in both dialects: ``neuronxcc.nki`` (Beta 1, the face
in nkisim.beta1) and ``nki`` (NKI 0.3-0.7, the face in nkisim.nki), on one machine core.

Run unmodified NKI kernels on any machine: ``nkisim.shim.install()`` (or ``nkisim run SCRIPT``)
makes ``import neuronxcc.nki as nki`` resolve to nkisim when the real neuronx-cc is not installed.
See README.md and shared/DESIGN.md for the architecture.
"""

from __future__ import annotations

from . import ops  # noqa: F401 - registers the tile operations (nkisim.tensor.register_ops)
from .arch import TRN1, TRN2, get_arch  # noqa: F401
from .errors import NKISyntaxError, NKIWarning, nki_error  # noqa: F401
from .runtime import baremetal, benchmark, jit, last_run, profile, simulate_kernel  # noqa: F401

__version__ = "0.1.0"
