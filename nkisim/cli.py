"""``nkisim`` command line: run unmodified NKI scripts on nkisim.

    nkisim run SCRIPT [ARGS...]      run SCRIPT as `python SCRIPT ARGS...` with neuronxcc.nki
                                     and nki served by nkisim (course harnesses, benchmarks)
    nkisim info                      targets, the shim's state, the enabled checks

Options for ``run``: ``--target trn1|trn2`` (sets NKISIM_TARGET), ``--checks SPEC`` (sets
NKISIM_CHECKS, e.g. ``-races``), ``--strict`` (sets NKISIM_STRICT=1: documented NKI rules the
device tolerates are errors, not warnings), ``--force`` (serve nkisim even if a real neuronx-cc
exists).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

from . import __version__


class _UsageError(Exception):
    pass


def _validate_env(args) -> None:
    """NKISIM_TARGET / --target and NKISIM_CHECKS / --checks, before anything runs."""
    from .arch import get_arch
    target = getattr(args, "target", None) or os.environ.get("NKISIM_TARGET")
    if target:
        try:
            get_arch(target)
        except ValueError as exc:
            where = "--target" if getattr(args, "target", None) else "NKISIM_TARGET"
            raise _UsageError(f"{where}: {exc}") from None
    checks = getattr(args, "checks", None)
    where = "--checks"
    if checks is None:
        checks, where = os.environ.get("NKISIM_CHECKS"), "NKISIM_CHECKS"
    if checks is not None:
        from .context import parse_checks
        try:
            parse_checks(checks)
        except ValueError as exc:
            raise _UsageError(f"{where} {checks!r}: {exc}") from None


def _run(args) -> int:
    if args.target:
        os.environ["NKISIM_TARGET"] = args.target
    if args.checks is not None:
        os.environ["NKISIM_CHECKS"] = args.checks
    if args.strict:
        os.environ["NKISIM_STRICT"] = "1"
    from . import shim
    if not shim.install(force=args.force or None):
        print("nkisim: a real neuronx-cc is installed; running with it (use --force to "
              "simulate on nkisim)", file=sys.stderr)
    if not shim.serves_nki():
        print("nkisim: a real nki is installed; `import nki` runs with it (use --force to "
              "simulate on nkisim)", file=sys.stderr)
    script = args.script
    if not os.path.exists(script):
        print(f"nkisim: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = [script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if not missing or missing in ("nkisim", "neuronxcc", "nki"):
            raise
        # a package the user's script needs and this environment lacks (the course's
        # part2/conv2d_numpy.py imports torch for its reference): one line, not a traceback
        # through runpy and this module
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if not f.filename.startswith("<") and "importlib" not in f.filename]
        where = f" (imported at {os.path.relpath(frames[-1].filename)}:{frames[-1].lineno})" \
            if frames else ""
        print(f"nkisim run: {script} needs the Python package `{missing}`{where}, which is "
              f"not installed here: pip install {missing}", file=sys.stderr)
        return 1
    except SyntaxError as e:
        from .errors import _PKG_DIR
        if os.environ.get("NKISIM_FULL_TRACEBACK") or (e.filename or "").startswith(_PKG_DIR):
            raise
        # the user's script does not parse: Python's own message (file, line, caret), not a
        # traceback through runpy and this module
        print("".join(traceback.format_exception_only(type(e), e)), end="", file=sys.stderr)
        return 1
    except Exception as e:
        if getattr(e, "nki_code", None) is None or os.environ.get("NKISIM_FULL_TRACEBACK"):
            raise
        # an NKI error in the user's kernel: the traceback through the user's code only (the
        # kernel's line is the last frame shown), not through runpy and nkisim's own modules
        _print_user_traceback(e)
        return 1
    return 0


def _print_user_traceback(e: BaseException) -> None:
    from .errors import _PKG_DIR
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith(_PKG_DIR) and not f.filename.startswith("<")
              and os.path.basename(f.filename) != "runpy.py"]
    out = ["Traceback (most recent call last; nkisim's own frames hidden, "
           "NKISIM_FULL_TRACEBACK=1 shows them):\n"]
    out += traceback.format_list(frames)
    out += traceback.format_exception_only(type(e), e)
    print("".join(out), end="", file=sys.stderr)


def _info(args) -> int:
    from . import shim
    from .arch import TARGETS
    from .context import ALL_CHECKS, parse_checks
    print(f"nkisim {__version__}")
    print(f"targets: {', '.join(sorted(set(t.name for t in TARGETS.values())))} "
          f"(NKISIM_TARGET={os.environ.get('NKISIM_TARGET', 'trn2 (default)')})")
    print(f"real neuronx-cc importable: {shim.real_neuronxcc_available()}")
    print(f"real nki importable: {shim.real_nki_available()}")
    checks = parse_checks(os.environ.get("NKISIM_CHECKS"))
    print(f"checks: {', '.join(c for c in ALL_CHECKS if c in checks) or 'none'}")
    from .context import strict_from_env
    print(f"strict mode (NKISIM_STRICT): {'on' if strict_from_env() else 'off'}")
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message):           # one line, naming the argument; exit status 2
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} -h)\n")


def main(argv=None) -> int:
    p = _Parser(prog="nkisim", description="Run NKI kernels without a device.")
    p.add_argument("--version", action="version", version=f"nkisim {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run an unmodified NKI script on nkisim")
    r.add_argument("--target", choices=["trn1", "trn2"], help="simulated target (default trn2)")
    r.add_argument("--checks", help="checks to run: all, none, a list, or -name to drop one")
    r.add_argument("--strict", action="store_true",
                   help="documented NKI rules the device tolerates are errors (NKISIM_STRICT=1)")
    r.add_argument("--force", action="store_true", help="use nkisim even if neuronx-cc exists")
    r.add_argument("script", nargs="?")
    r.add_argument("args", nargs=argparse.REMAINDER)
    r.set_defaults(fn=_run)
    i = sub.add_parser("info", help="show targets, shim state and checks")
    i.set_defaults(fn=_info)
    args = p.parse_args(argv)
    if args.cmd == "run" and args.script is None:
        # (argparse would also name `args`, which is optional)
        r.error("the following arguments are required: script")
    try:
        _validate_env(args)
    except _UsageError as exc:
        print(f"nkisim {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except BrokenPipeError:
        # `nkisim info | head -1`: the reader left; say nothing more (and keep Python's exit
        # flush from raising again), as nki-verify does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
