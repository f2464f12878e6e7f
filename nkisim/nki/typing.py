"""``nki.typing`` (nt) of NKI 0.3-0.7: annotations such as ``nt.tensor[128, 512]``."""

from __future__ import annotations
