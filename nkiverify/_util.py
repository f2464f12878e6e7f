"""Small helpers shared by the ``nki-verify`` command and the pytest plugin (no side effects
at import: the plugin imports this in any session)."""

from __future__ import annotations

import os
import shlex


class UsageError(Exception):
    """A bad command line: one line naming the argument; exit status 2."""


def check_report_path(path: str | None) -> None:
    """Before any case runs: the report's directory exists and is writable, the path is not a
    directory (so an hour of cases is never lost to a typo)."""
    if not path:
        return
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise UsageError(f"--report {path}: is a directory; give a file name")
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        raise UsageError(f"--report {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--report {path}: directory {parent} is not writable")


def reproduce_command(kernel: str, params: dict, dtype: str, seed: int, dist: str,
                      kernel_ref: str | None = None, target: str | None = None,
                      dialect: str | None = None) -> str:
    """The one-line ``nki-verify case`` command that reruns a case (``dialect``: our kernel's
    twin in that dialect; beta1 is the command's default and is not spelled out)."""
    p = ",".join(f"{k}={v}" for k, v in params.items())
    parts = ["nki-verify", "case", kernel, "--params", p, "--dtype", str(dtype), "--seed",
             str(seed), "--dist", dist]
    if kernel_ref:
        parts += ["--kernel", kernel_ref]
    if target:
        parts += ["--target", target]
    if dialect and dialect != "beta1":
        parts += ["--dialect", dialect]
    return " ".join(shlex.quote(x) for x in parts)
