"""``neuronxcc.nki.typing`` (nt), NKI Beta 1: kernel annotations and input placeholders."""

from __future__ import annotations

from ..typing import TensorPlaceholder, mutable_tensor, tensor  # noqa: F401
