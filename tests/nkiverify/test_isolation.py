"""Installing nkisim adds exactly two import names, and its pytest plugin stays out of projects
that did not opt in (issue 9; DESIGN.md "Architecture")."""

import glob
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# ---- what `pip install .` puts in site-packages -------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                        str(REPO)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.skip(f"cannot build a wheel here (no setuptools>=68 from an index?): "
                    f"{r.stderr.strip().splitlines()[-1:]}")
    return glob.glob(str(out / "*.whl"))[0]


@pytest.mark.slow
def test_install_adds_only_nkisim_and_nkiverify(wheel, tmp_path):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"nkisim", "nkiverify"}
    for shipped in ("nkiverify/kernels/conv2d.py", "nkiverify/reference/conv2d.py",
                    "nkiverify/fixtures/configs.py"):
        assert shipped in names
    # installed (no checkout on the path), the tool works and a user's own `kernels` and
    # `fixtures` packages are theirs
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), wheel], check=True, capture_output=True, timeout=300)
    project = tmp_path / "project"
    (project / "kernels").mkdir(parents=True)
    (project / "kernels" / "__init__.py").write_text("from .mine import vector_add_tiled\n")
    (project / "kernels" / "mine.py").write_text("def vector_add_tiled():\n    return 'mine'\n")
    (project / "fixtures").mkdir()
    (project / "fixtures" / "__init__.py").write_text("OWN = True\n")
    env = dict(os.environ, PYTHONPATH=f"{project}{os.pathsep}{site}")
    code = ("import nkiverify.cli, nkiverify.registry as r, kernels, fixtures\n"
            "assert kernels.vector_add_tiled() == 'mine' and fixtures.OWN\n"
            f"assert nkiverify.cli.__file__.startswith({str(site)!r})\n"
            "print(r.KERNELS['conv2d'].import_path)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=project,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "nkiverify.kernels.conv2d:fused_conv2d_maxpool"
    ran = subprocess.run([sys.executable, "-m", "nkiverify.cli", "--cases", "naive-n64",
                          "--dtypes", "float16"], env=env, cwd=project, capture_output=True,
                         text=True, timeout=300)
    # our kernel and its current-nki twin (both served by nkisim's shim in this venv)
    assert ran.returncode == 0 and "2 passed, 0 failed" in ran.stdout, ran.stderr


# ---- the plugin in a project that did not opt in ------------------------------------------

CONFTEST = """
from hypothesis import settings

settings.register_profile("mine", max_examples=7)
settings.load_profile("mine")
"""

TESTS = """
import os
import sys

import pytest
from hypothesis import given, settings, strategies as st

import fixtures


def test_own_fixtures_package():
    assert fixtures.OWN == "yes"


def test_own_profile():
    assert settings.default.max_examples == 7


def test_no_shim():
    assert "neuronxcc" not in sys.modules
    assert not any("nkisim" in type(f).__module__ for f in sys.meta_path)


def test_environment():
    print("ENV", {k: os.environ.get(k) for k in
                  ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})


@given(st.integers())
def test_examples(x):
    pass


def test_markers(pytestconfig):
    names = {m.split(":")[0].split("(")[0] for m in pytestconfig.getini("markers")}
    print("MARKERS", sorted(n for n in names if n in ("simulate", "device", "slow")))
"""


def _throwaway(tmp_path):
    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "__init__.py").write_text('OWN = "yes"\n')
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_project.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return tmp_path


def _session(project, *args):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CI",
                        "PYTHONPATH")}
    # --assert=plain: pytest would otherwise rewrite the asserts of all of hypothesis (which the
    # project imports) in every process, 0.7 s of CPU each where bytecode is not cached; the
    # outcomes are the same
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                        "-p", "no:randomly", "--assert=plain", *args], cwd=project, env=env,
                       capture_output=True, text=True, timeout=300)
    lines = sorted(ln[ln.index(tag):] for ln in r.stdout.splitlines()
                   for tag in ("ENV {", "MARKERS [") if tag in ln)
    summary = r.stdout.strip().splitlines()[-1]
    return r.returncode, lines, summary.split(" in ")[0]


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_the_plugin_is_inert_where_not_asked(tmp_path, xdist):
    # What a session without the plugin (-p no:nkiverify) gives is known exactly: the six
    # tests pass and nothing else is reported, the environment has no BLAS variables, the
    # project registers none of our markers (xdist workers' prints are not shown).
    project = _throwaway(tmp_path)
    code, lines, summary = _session(project, *xdist)
    assert (code, summary) == (0, "6 passed")
    if not xdist:
        assert lines == ["ENV {'OPENBLAS_NUM_THREADS': None, 'OMP_NUM_THREADS': None, "
                         "'MKL_NUM_THREADS': None}", "MARKERS []"]


def test_opting_in_with_the_ini_key(tmp_path):
    project = _throwaway(tmp_path)
    (project / "pytest.ini").write_text("[pytest]\nnki_verify = true\n")
    (project / "test_project.py").write_text(TESTS.replace(
        'assert "neuronxcc" not in sys.modules', 'assert True').replace(
        "assert not any(", "assert any("))
    code, lines, summary = _session(project)
    # the project's own profile (loaded by its conftest) still wins; the shim is on
    assert code == 0 and "6 passed" in summary, summary
    assert "MARKERS ['device', 'simulate', 'slow']" in lines
