"""``nki.isa`` (nisa) of NKI 0.3-0.7: destination-passing engine instructions (spec
nki-current.md §2.4): every op writes ``dst`` (its first parameter) and returns nothing usable;
no ``dtype=``/``mask=``; the output dtype is ``dst.dtype``."""

from __future__ import annotations
