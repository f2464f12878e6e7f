"""``nki`` (NKI 0.3-0.7, Neuron SDK 2.29-2.33), the current dialect, as the shim serves it: a thin
face over the machine core, beside the Beta 1 face (nkisim.beta1). Spec: shared/spec/nki-current.md.

Where versions differ, the face follows ``NKISIM_NKI_VERSION`` (default: the newest it knows).
"""

from __future__ import annotations

from . import isa, language, typing  # noqa: F401
