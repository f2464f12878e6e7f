"""Conformance: run AWS's own NKI kernels and tests on nkisim, as AWS's CI runs them.

    python benchmarks/conformance.py --nki-samples DIR --sdk DIR [--no-tutorials] [-k EXPR]

- ``--nki-samples``: a checkout of aws-neuron/nki-samples at commit fc5c69f (the last one on
  ``neuronxcc.nki``). Runs its CI command ``PYTHONPATH=src pytest test/unit --simulation-only``
  (their conftest unchanged) with the nkisim shim installed by a tiny pytest plugin this script
  writes to a temporary directory; then (unless ``--no-tutorials``) every tutorial script under
  src/nki_samples/tutorials that imports neither torch nor jax and has a ``__main__`` block, run as
  ``nkisim run SCRIPT`` from its own directory.
- ``--sdk``: a checkout of aws-neuron/aws-neuron-sdk at commit 1db4d74e; runs ``pytest
  nki/test/test_*.py`` (the legacy NKI doc-example tests) the same way.

Prints, per file, the passed/failed counts and each failure's first error line, and as its last line
``conformance: nki-samples A/N sdk-tests B/M tutorials C/D``. A test file that cannot even be
imported counts all its tests as failed (their number at the pinned commits is in EXPECTED below).
Without any corpus path it says how to get the checkouts and exits 0 (CI cannot fetch them).
The checkouts stay outside the repo: never commit their code.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

HOW_TO_GET = """\
conformance: no corpus given. Get the pinned checkouts (outside this repo, never committed):
  git clone https://github.com/aws-neuron/nki-samples && git -C nki-samples checkout fc5c69f
  git clone https://github.com/aws-neuron/aws-neuron-sdk && git -C aws-neuron-sdk checkout 1db4d74e
then: python benchmarks/conformance.py --nki-samples nki-samples --sdk aws-neuron-sdk"""

# Tests per file at the pinned commits (pytest's collection once every file imports: the nki-samples
# tests are parametrized, so a file that fails to import cannot be counted from its source). Used
# only for files that fail to import; a file not listed counts one failed test.
EXPECTED = {
    "nki-samples": {
        "test_SD_attention_small_head.py": 2, "test_adaptive_avg_pool2d.py": 16,
        "test_allocated_SD_attention_small_head.py": 3, "test_double_row_matmul.py": 3,
        "test_flash_attn_bwd.py": 16, "test_flash_attn_fwd.py": 5,
        "test_resize_nearest.py": 3, "test_rmsnorm_qkv.py": 4,
        "test_select_and_scatter.py": 2,
    },                   # 54 tests marked `simulation` (of 86 in test/unit)
    "sdk-tests": {},     # no parametrization there: counted from the sources (_static_count)
}

PLUGIN = '''\
"""pytest plugin written by benchmarks/conformance.py: serve neuronxcc.nki from nkisim."""
import builtins
import io
import os

import nkisim.shim

nkisim.shim.install()

# nki-samples test_double_row_matmul.py asks the machine what it is (the EC2 DMI product name,
# e.g. "trn2.48xlarge") and only runs on a trn2. nkisim is the machine here: where the file
# does not exist, answer with the simulated target (NKISIM_TARGET, default trn2).
_DMI = "/sys/devices/virtual/dmi/id/product_name"
_open = builtins.open


def _open_dmi(file, *args, **kwargs):
    if file == _DMI and not os.path.exists(_DMI):
        return io.StringIO(os.environ.get("NKISIM_TARGET", "trn2") + ".nkisim\\n")
    return _open(file, *args, **kwargs)


builtins.open = _open_dmi
'''

NO_TORCH_JAX = ("torch", "jax", "torch_xla", "torch_neuronx", "jax_neuron")


@dataclass
class FileResult:
    name: str
    passed: int = 0
    failed: int = 0
    errors: list = field(default_factory=list)     # (test name, first error line)


def _first_line(text: str, limit: int = 220) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[:limit - 3] + "..."
    return "(no message)"


def _error_line(text: str) -> str:
    """The most telling line of a traceback: the last ``E   ...`` line that names an exception,
    else the last line that looks like ``SomeError: ...``."""
    lines = [ln.rstrip() for ln in (text or "").splitlines()]
    e_lines = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    for ln in reversed(e_lines):        # chained exceptions: the one finally raised
        head = ln.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Warning")) or head.startswith(("nki", "assert")):
            return _first_line(ln)
    if e_lines:
        return _first_line(e_lines[0])
    for ln in reversed(lines):
        s = ln.strip()
        if s and ":" in s and s.split(":", 1)[0].replace(".", "").isidentifier() and \
                s.split(":", 1)[0].endswith(("Error", "Exception", "Exit")):
            return _first_line(s)
    tail = [ln for ln in lines if ln.strip()]
    return _first_line(tail[-1] if tail else "")


def _static_count(path: str) -> int:
    """Test functions in a file without parametrization: ``def test_*`` at any level."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError):
        return 1
    # a decorated `def test_*` is a kernel (`@nki.jit def test_nl_broadcast`), not a test
    n = sum(isinstance(node, ast.FunctionDef) and node.name.startswith("test")
            and not node.decorator_list for node in ast.walk(tree))
    return max(n, 1)


_TMP = tempfile.TemporaryDirectory(prefix="nkisim-conformance-")    # removed at exit


def _plugin_dir() -> str:
    d = tempfile.mkdtemp(dir=_TMP.name)
    with open(os.path.join(d, "_nkisim_conformance_plugin.py"), "w") as f:
        f.write(PLUGIN)
    return d


def _env(extra_path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    env.setdefault("NKISIM_QUIET", "1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def run_pytest(corpus: str, cwd: str, targets: list, pythonpath: list, extra: list,
               timeout: float) -> dict:
    """Run pytest in a subprocess; per-file results from its JUnit XML report."""
    plug = _plugin_dir()
    report = os.path.join(plug, "report.xml")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
           "_nkisim_conformance_plugin", "--continue-on-collection-errors", "-q", "-o",
           "junit_family=xunit1", f"--junitxml={report}", *targets, *extra]
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=_env([*pythonpath, plug]), capture_output=True,
                              text=True, timeout=timeout)
        out = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        return {"(pytest)": FileResult("(pytest)", failed=1,
                                       errors=[("pytest", f"TIMEOUT after {timeout:.0f} s")])}
    results: dict = {}
    if not os.path.exists(report):
        why = _error_line(out)
        if proc.returncode < 0:
            why = f"killed by signal {-proc.returncode} (out of memory?)"
        results["(pytest)"] = FileResult("(pytest)", failed=1, errors=[("pytest", why)])
        return results
    root = ET.parse(report).getroot()
    for case in root.iter("testcase"):
        file = case.get("file") or ""
        name = case.get("name") or ""
        cls = case.get("classname") or ""
        if not file:
            # collection errors: classname "" and name "test.unit.test_x" (dotted module path)
            file = (cls or name).replace(".", "/")
            file = file if file.endswith(".py") else file + ".py"
        key = os.path.basename(file)
        r = results.setdefault(key, FileResult(key))
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped")
        if bad is not None:
            msg = _error_line(bad.text or "") if bad.text else _first_line(bad.get("message"))
            collect = not case.get("file") and not cls.count(".") > name.count(".") and \
                "collect" in (bad.get("message") or "").lower()
            if collect or (not case.get("file") and bad.tag == "error" and not cls):
                n = EXPECTED.get(corpus, {}).get(key)
                if n is None:
                    path = os.path.join(cwd, *[t for t in targets if t.endswith(".py")
                                               and os.path.basename(t) == key][:1])
                    n = _static_count(path) if path.endswith(".py") else 1
                r.failed += n
                r.errors.append(("(import)", msg))
            else:
                r.failed += 1
                r.errors.append((name, msg))
        elif skipped is None:
            r.passed += 1
    return results


def _node_ids(cwd, target, extra_targets, pythonpath) -> list:
    """The test ids pytest collects from one file (empty if it cannot even collect)."""
    plug = _plugin_dir()
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
           "_nkisim_conformance_plugin", "--co", "-q", target, *extra_targets]
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=_env([*pythonpath, plug]), capture_output=True,
                              text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return []
    return [ln.strip() for ln in proc.stdout.splitlines() if "::" in ln and
            ln.strip().startswith(target)]


def _merge(into: dict, res: dict) -> None:
    for key, r in res.items():
        cur = into.setdefault(key, FileResult(key))
        cur.passed += r.passed
        cur.failed += r.failed
        cur.errors.extend(r.errors)


def _per_file(corpus, cwd, files, extra_targets, pythonpath, args) -> dict:
    """One pytest process per test file (a timeout costs that file only), ``--jobs`` of them at
    a time; when a file's process dies (the memory big simulations leave behind), each of its
    tests runs again in its own process."""
    from concurrent.futures import ThreadPoolExecutor

    def one_file(f):
        res = run_pytest(corpus, cwd, [f, *extra_targets], pythonpath, args.pytest_args,
                         args.timeout)
        if "(pytest)" in res and "killed" in res["(pytest)"].errors[0][1]:
            # the process died (out of memory): each test again in its own process
            ids = _node_ids(cwd, f, extra_targets, pythonpath)
            if ids:
                out: dict = {}
                for i in ids:
                    _merge(out, one((f, i)))
                return out
        return one((f, f), res)

    def one(job, res=None):
        f, target = job
        if res is None:
            res = run_pytest(corpus, cwd, [target, *extra_targets], pythonpath,
                             args.pytest_args, args.timeout)
        if "(pytest)" in res:                      # no report: the run timed out or crashed
            key = os.path.basename(f)
            n = 1 if target != f else (EXPECTED.get(corpus, {}).get(key) or
                                       _static_count(os.path.join(cwd, f)))
            name = target.split("::")[-1] if target != f else "(file)"
            err = res["(pytest)"].errors[0][1]
            res = {key: FileResult(key, failed=n, errors=[(name, err)])}
        return res

    results: dict = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for res in pool.map(one_file, files):
            _merge(results, res)
    return results


def nki_samples_tests(root: str, args) -> dict:
    tdir = os.path.join(root, "test", "unit")
    files = sorted(os.path.join("test", "unit", f) for f in os.listdir(tdir)
                   if f.startswith("test_") and f.endswith(".py"))
    return _per_file("nki-samples", root, files, ["--simulation-only"],
                     [os.path.join(root, "src")], args)


def sdk_tests(root: str, args) -> dict:
    tdir = os.path.join(root, "nki", "test")
    files = sorted(f for f in os.listdir(tdir) if f.startswith("test_") and f.endswith(".py"))
    return _per_file("sdk-tests", tdir, files, [], [], args)


def tutorial_scripts(root: str) -> list:
    """Tutorial scripts that need neither torch nor jax and run something as __main__."""
    base = os.path.join(root, "src", "nki_samples", "tutorials")
    out = []
    for d, _, files in sorted(os.walk(base)):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            src = open(path, encoding="utf-8").read()
            try:
                tree = ast.parse(src)
            except SyntaxError:
                continue
            mods = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    mods.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module:
                    mods.add(node.module.split(".")[0])
            if mods & set(NO_TORCH_JAX) or "__main__" not in src:
                continue
            out.append(path)
    return out


def tutorials(root: str, args) -> dict:
    results = {}
    plug = _plugin_dir()
    for path in tutorial_scripts(root):
        key = os.path.relpath(path, os.path.join(root, "src", "nki_samples", "tutorials"))
        r = results.setdefault(key, FileResult(key))
        cmd = [sys.executable, "-m", "nkisim.cli", "run", path]
        try:
            proc = subprocess.run(cmd, cwd=os.path.dirname(path),
                                  env=_env([os.path.join(root, "src"), plug]),
                                  capture_output=True, text=True, timeout=args.timeout)
            ok, out = proc.returncode == 0, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            ok, out = False, f"TIMEOUT after {args.timeout:.0f} s"
        if ok:
            r.passed += 1
        else:
            r.failed += 1
            r.errors.append(("script", _error_line(out)))
    return results


def report(title: str, results: dict) -> tuple:
    print(f"== {title}")
    passed = failed = 0
    for key in sorted(results):
        r = results[key]
        passed += r.passed
        failed += r.failed
        print(f"  {key}: {r.passed} passed, {r.failed} failed")
        for name, msg in r.errors:
            print(f"      {name}: {msg}")
    print(f"  total: {passed} passed, {failed} failed")
    return passed, passed + failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nki-samples", metavar="DIR", help="aws-neuron/nki-samples @ fc5c69f")
    p.add_argument("--sdk", metavar="DIR", help="aws-neuron/aws-neuron-sdk @ 1db4d74e")
    p.add_argument("--tutorials", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the nki-samples tutorial scripts (default: yes)")
    p.add_argument("--timeout", type=float, default=3600,
                   help="seconds per test file / tutorial script (default 3600)")
    p.add_argument("-j", "--jobs", type=int, default=1,
                   help="test files run at the same time (default 1; each may need GBs)")
    p.add_argument("-k", dest="select", help="pytest -k expression (both corpora)")
    args = p.parse_args(argv)
    args.pytest_args = ["-k", args.select] if args.select else []
    if not args.nki_samples and not args.sdk:
        print(HOW_TO_GET)
        return 0
    for opt in ("nki_samples", "sdk"):
        d = getattr(args, opt)
        if d and not os.path.isdir(d):
            p.error(f"--{opt.replace('_', '-')}: no such directory: {d}")
    parts = []
    if args.nki_samples:
        a, n = report("nki-samples test/unit --simulation-only",
                      nki_samples_tests(os.path.abspath(args.nki_samples), args))
        parts.append(f"nki-samples {a}/{n}")
    else:
        parts.append("nki-samples -/-")
    if args.sdk:
        b, m = report("aws-neuron-sdk nki/test", sdk_tests(os.path.abspath(args.sdk), args))
        parts.append(f"sdk-tests {b}/{m}")
    else:
        parts.append("sdk-tests -/-")
    if args.nki_samples and args.tutorials:
        c, d = report("nki-samples tutorials (no torch/jax)",
                      tutorials(os.path.abspath(args.nki_samples), args))
        parts.append(f"tutorials {c}/{d}")
    else:
        parts.append("tutorials -/-")
    print("conformance: " + " ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
