"""Which ``nki`` release the face imitates: ``NKISIM_NKI_VERSION`` (``0.3`` ... ``0.7``; default
the newest nkisim knows, 0.7.0 / Neuron SDK 2.33). Where releases differ (spec nki-current.md §1
timeline) the face asks :func:`at_least` at call time, so the variable may be set any time before
a kernel runs.
"""

from __future__ import annotations

import os

OLDEST = (0, 3)      # nki.simulate and the nki.language wrappers arrived in 0.3.0 (RN 2.29)
NEWEST = (0, 7)      # 0.7.0 (SDK 2.33): dynamic_range / `while reg:` removed
ENV = "NKISIM_NKI_VERSION"


def parse(text: str) -> tuple:
    """``"0.5"``, ``"0.5.0"``, ``"0.6.0+31049..."`` -> ``(0, 5)``."""
    core = str(text).strip().split("+")[0]
    try:
        parts = tuple(int(p) for p in core.split(".")[:2])
    except ValueError:
        raise ValueError(f"{ENV}={text!r}: expected a version such as 0.6 or 0.6.0") from None
    if len(parts) == 1:
        parts = parts + (0,)
    if not OLDEST <= parts <= NEWEST:
        raise ValueError(f"{ENV}={text!r}: nkisim serves nki "
                         f"{'.'.join(map(str, OLDEST))} to {'.'.join(map(str, NEWEST))}")
    return parts


def current() -> tuple:
    """The (major, minor) release the face follows now."""
    text = os.environ.get(ENV, "").strip()
    return parse(text) if text else NEWEST


def at_least(major: int, minor: int) -> bool:
    return current() >= (major, minor)


def version_string() -> str:
    """What ``nki.__version__`` reports: the release, marked as nkisim's."""
    major, minor = current()
    return f"{major}.{minor}.0+nkisim"
