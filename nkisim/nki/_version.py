"""Which NKI release the current-dialect face follows where releases differ.

``NKISIM_NKI_VERSION`` (e.g. ``0.5``) selects it; the default is the newest nkisim knows. The
face serves NKI 0.3-0.7 (SDK 2.29-2.33; shared/spec/nki-current.md §1). Read at every call so a
test (or a user) can switch it with the environment without re-importing.
"""

from __future__ import annotations

import os

KNOWN = ((0, 3), (0, 4), (0, 5), (0, 6), (0, 7))
DEFAULT = KNOWN[-1]
ENV = "NKISIM_NKI_VERSION"


def nki_version() -> tuple[int, int]:
    """The (major, minor) NKI release to follow."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT
    try:
        parts = tuple(int(p) for p in raw.split(".")[:2])
    except ValueError:
        parts = ()
    if len(parts) != 2 or parts not in KNOWN:
        raise ValueError(f"{ENV}={raw!r}: nkisim serves NKI "
                         f"{', '.join(f'{a}.{b}' for a, b in KNOWN)}")
    return parts


def at_least(version: str) -> bool:
    """Does the followed release include ``version`` (``"0.6"``)?"""
    major, minor = (int(p) for p in version.split("."))
    return nki_version() >= (major, minor)
