"""``nki.typing`` (nt) of NKI 0.3-0.7: annotations such as ``nt.tensor[128, 512]`` (MIG 0.2->0.3).

Annotations have no effect on what a kernel computes; ``nt.tensor[[shape], dtype]`` is a
placeholder input, as in Beta 1 (nkisim.typing)."""

from __future__ import annotations

from ..typing import TensorPlaceholder, mutable_tensor, tensor  # noqa: F401
