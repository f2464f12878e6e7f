"""``nki.language`` (nl) of NKI 0.3-0.7: allocation, buffers, dtypes, iteration, views, and the
experimental convenience wrappers (spec nki-current.md §2.2, §2.3)."""

from __future__ import annotations
