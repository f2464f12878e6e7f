"""The README's "Verify your own kernels" recipes run as written, in a student's checkout that
did not opt into the plugin (no ini key, no --nki-* option)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_student import _checkout

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _block(first_line: str) -> str:
    for block in re.findall(r"```python\n(.*?)```", README, flags=re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"no README python block starting with {first_line!r}")


# The sessions below add flags the README's commands do not have, which change no outcome:
# pytest rewrites the asserts of every module of hypothesis (it has a pytest plugin) in every
# process, 0.7 s of CPU each where bytecode is not cached (the recipe files have no assert:
# --assert=plain), and hypothesis's plugin imports hypothesis at the end of a session that
# never used it (-p no:hypothesispytest where no test uses hypothesis).
PLAIN = ("--assert=plain",)
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")


def _run(args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTHONPATH")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


# The student's own hypothesis profile (hypothesis's default is 100 examples, minutes of
# simulation); the recipe file itself is used exactly as the README prints it.
PROFILE = """from hypothesis import settings

settings.register_profile("quick", max_examples=15)
settings.load_profile("quick")
"""


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    base = tmp_path_factory.mktemp("readme")
    pair = _checkout(base / "good", False), _checkout(base / "buggy", True)
    for root in pair:
        (root / "conftest.py").write_text(PROFILE)
    return pair


def test_the_hypothesis_recipe_runs_as_written(checkouts):
    good, _ = checkouts
    (good / "test_my_conv.py").write_text(_block("# test_my_conv.py"))
    r = _run([sys.executable, "-m", "pytest", "test_my_conv.py", "-q", "-p", "no:cacheprovider",
              *PLAIN], good)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "1 passed" in r.stdout and "FailedHealthCheck" not in r.stdout


def test_a_failure_shrinks_and_prints_a_command_that_reproduces_it(checkouts):
    _, buggy = checkouts
    (buggy / "test_my_conv.py").write_text(_block("# test_my_conv.py"))
    # (run from outside the checkout: the recipe's relative kernel path is found beside the
    # test file)
    r = _run([sys.executable, "-m", "pytest", str(buggy / "test_my_conv.py"), "-q", "-p",
              "no:cacheprovider", "--hypothesis-seed", "0", *PLAIN], buggy.parent)
    assert r.returncode == 1, r.stdout[-3000:]
    assert "systematic error" in r.stdout
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("reproduce: nki-verify case")]
    assert lines, r.stdout[-3000:]
    command = shlex.split(lines[-1][len("reproduce: "):])
    # shrunk to a minimal case: one batch, one channel tile each way, the bias on
    params = dict(kv.split("=") for kv in command[command.index("--params") + 1].split(","))
    assert params["batch"] == "1" and params["c_in"] == params["c_out"] == "128"
    assert params["bias"] == "True" and params["k"] == "3"
    rerun = _run([sys.executable, "-m", "nkiverify.cli", *command[1:]], buggy)
    assert rerun.returncode == 1 and "systematic error" in rerun.stderr


def test_register_recipe_runs_as_written(tmp_path):
    (tmp_path / "part3").mkdir()
    (tmp_path / "part3" / "scale.py").write_text(
        "import neuronxcc.nki as nki\n"
        "import neuronxcc.nki.isa as nisa\n"
        "import neuronxcc.nki.language as nl\n\n\n"
        "@nki.jit\n"
        "def scale2(x):\n"
        "    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)\n"
        "    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)\n"
        "    nisa.dma_copy(src=x, dst=t)\n"
        "    nisa.dma_copy(src=nisa.tensor_scalar(t, nl.multiply, 2.0), dst=out)\n"
        "    return out\n")
    (tmp_path / "conftest.py").write_text(_block("import numpy as np\nimport nkiverify"))
    (tmp_path / "test_scale.py").write_text(
        "def test_scale2(nki_verify):\n"
        '    nki_verify("scale2", {"n": 512}, "bfloat16")\n')
    r = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "simulate",
              "-rA", *NO_HYPOTHESIS], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "1 passed" in r.stdout
    # a wrong golden fails
    (tmp_path / "conftest.py").write_text(_block("import numpy as np\nimport nkiverify").replace(
        "2.0 * x", "3.0 * x"))
    r = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "simulate",
              *NO_HYPOTHESIS], tmp_path)
    assert r.returncode == 1 and "beyond tolerance" in r.stdout
