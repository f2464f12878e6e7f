"""Which NKI release the current-dialect face follows where releases differ.

``NKISIM_NKI_VERSION`` (``0.3`` ... ``0.7``, also ``0.6.0`` or ``0.6.0+31049...``) selects it;
the default is the newest nkisim knows, 0.7.0 (SDK 2.33). The face serves NKI 0.3-0.7 (SDK
2.29-2.33; shared/spec/nki-current.md §1). Read at every call so a test (or a user) can switch it
with the environment without re-importing.
"""

from __future__ import annotations

import os

KNOWN = ((0, 3), (0, 4), (0, 5), (0, 6), (0, 7))
DEFAULT = KNOWN[-1]
OLDEST, NEWEST = KNOWN[0], KNOWN[-1]
ENV = "NKISIM_NKI_VERSION"


def parse(text: str) -> tuple[int, int]:
    """``"0.5"``, ``"0.5.0"``, ``"0.6.0+31049..."`` -> ``(0, 5)``."""
    raw = str(text).strip()
    try:
        parts = tuple(int(p) for p in raw.split("+")[0].split(".")[:2])
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected a version such as 0.6 or 0.6.0") from None
    if len(parts) == 1:
        parts = parts + (0,)
    if parts not in KNOWN:
        raise ValueError(f"{ENV}={raw!r}: nkisim serves NKI "
                         f"{', '.join(f'{a}.{b}' for a, b in KNOWN)} (0.3 to 0.7)")
    return parts


def nki_version() -> tuple[int, int]:
    """The (major, minor) NKI release to follow."""
    raw = os.environ.get(ENV, "").strip()
    return parse(raw) if raw else DEFAULT


current = nki_version


def at_least(version, minor: int | None = None) -> bool:
    """Does the followed release include ``version`` (``"0.6"``, or ``at_least(0, 6)``)?"""
    if minor is None:
        major, minor = (int(p) for p in str(version).split("."))
    else:
        major = int(version)
    return nki_version() >= (major, int(minor))


def version_string() -> str:
    """What ``nki.__version__`` reports: the release, marked as nkisim's."""
    major, minor = nki_version()
    return f"{major}.{minor}.0+nkisim"
