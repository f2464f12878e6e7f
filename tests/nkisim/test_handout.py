"""The CS149 Part 1 handout kernels, unmodified, through the shim: the handout's results.

Truth: the handouts (shared/seeds/001 trn2, 002 trn1) and cs149-assignment.md §1: every kernel
computes a + b exactly in fp32 (the harness checks ``np.allclose(out, a + b)``); ROW_CHUNK=256
fails with the quoted partition error; the direct-allocation kernel is correct and its bad twin
(all three tensors at base_addr 0) is wrong; FREE_DIM=1000 at n=25600 runs zero iterations and
leaves the output unwritten; the transpose gives ``a.T``.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from nkisim import NKIWarning, shim

shim.install()

import neuronxcc.nki as nki  # noqa: E402

from fixtures import handout  # noqa: E402

RNG = np.random.default_rng(149)
PARTITION_ERROR = (
    "number of partitions 256 exceed architecture limitation of 128. Info on how to fix: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/api/nki.errors.html"
    "#err-num-partition-exceed-arch-limit")


def vectors(n):
    # as part1/run_benchmark.py: np.random.rand(n).astype(np.float32)
    return RNG.random(n).astype(np.float32), RNG.random(n).astype(np.float32)


@pytest.fixture
def trn1(monkeypatch):
    monkeypatch.setenv("NKISIM_TARGET", "trn1")


# ---------------------------------------------------------------------------------------------
# trn2 handout


def test_vector_add_naive_n128():
    a, b = vectors(128)
    out = nki.baremetal(handout.vector_add_naive)(a, b)
    assert out.shape == (128,) and out.dtype == np.float32
    np.testing.assert_array_equal(out, a + b)


def test_vector_add_naive_fails_past_128():
    a, b = vectors(256)
    with pytest.raises(ValueError) as ei:
        nki.baremetal(handout.vector_add_naive)(a, b)
    assert ei.value.nki_code == "err_num_partition_exceed_arch_limit"
    assert str(ei.value) == PARTITION_ERROR


@pytest.mark.parametrize("n", [
    1280,
    # the handout's size: 25600 one-partition iterations, ~100k instructions
    pytest.param(25600, marks=pytest.mark.slow)])
def test_vector_add_tiled_row_chunk_1(n):
    a, b = vectors(n)
    out = nki.baremetal(handout.make_vector_add_tiled(1))(a, b)
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize("n", [25600, 128, 512])
def test_vector_add_tiled_row_chunk_128(n):
    a, b = vectors(n)
    out = nki.baremetal(handout.make_vector_add_tiled(128))(a, b)
    np.testing.assert_array_equal(out, a + b)


def test_vector_add_tiled_row_chunk_256_raises_the_handout_error():
    a, b = vectors(25600)
    kernel = handout.make_vector_add_tiled(256)
    with pytest.raises(ValueError) as ei:
        nki.baremetal(kernel)(a, b)
    assert type(ei.value) is ValueError
    assert ei.value.nki_code == "err_num_partition_exceed_arch_limit"
    assert str(ei.value) == PARTITION_ERROR
    with pytest.raises(ValueError, match="^number of partitions 256 exceed"):
        nki.simulate_kernel(kernel, a, b)


@pytest.mark.parametrize("free_dim", [2, 200])
def test_vector_add_stream(free_dim):
    a, b = vectors(25600)
    out = nki.baremetal(handout.make_vector_add_stream(free_dim))(a, b)
    assert out.shape == (25600,)
    np.testing.assert_array_equal(out, a + b)


def test_vector_add_stream_free_dim_1000_at_25600_runs_no_iteration():
    # 25600 // (128 * 1000) == 0: the output is never written (cs149-assignment.md §1 gotcha)
    a, b = vectors(25600)
    with pytest.raises(ValueError) as ei:
        nki.baremetal(handout.make_vector_add_stream(1000))(a, b)
    assert ei.value.nki_code == "err_tensor_output_not_written_to"
    assert str(ei.value).startswith("Output tensor `out` was never written to: all 25600 "
                                    "elements")
    assert str(ei.value).endswith(
        "Info on how to fix: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/"
        "nki/api/nki.errors.html#err-tensor-output-not-written-to")


def test_vector_add_stream_profiling_sizes():
    # part 2b: n=256000 with FREE_DIM 2000 and 1000 (200 columns per partition... 2000 cols)
    a, b = vectors(256000)
    for free_dim in (2000, 1000):
        np.testing.assert_array_equal(
            nki.baremetal(handout.make_vector_add_stream(free_dim))(a, b), a + b)


@pytest.mark.parametrize("shape", [(1024, 1024), (256, 384), (384, 128), (128, 128)])
def test_transpose_per_tile(shape):
    mat = RNG.random(shape).astype(np.float32)
    out = nki.baremetal(handout.transpose_per_tile)(mat)
    assert out.shape == (shape[1], shape[0])
    np.testing.assert_array_equal(out, mat.T)


def test_transpose_per_tile_uses_only_nc_transpose_for_compute():
    mat = RNG.random((256, 128)).astype(np.float32)
    nki.simulate_kernel(handout.transpose_per_tile, mat)
    from nkisim import last_run
    ops = {i.op for i in last_run().trace.instrs}
    assert ops == {"dma_copy", "nc_transpose", "tensor_copy"}
    engines = {i.engine for i in last_run().trace.instrs if i.op == "nc_transpose"}
    assert engines == {"tensor"}


# ---------------------------------------------------------------------------------------------
# trn1 handout


def test_vector_add_naive_trn1(trn1):
    a, b = vectors(128)
    np.testing.assert_array_equal(nki.baremetal(handout.vector_add_naive_trn1)(a, b), a + b)


@pytest.mark.parametrize("row_chunk", [128, 64])
def test_vector_add_tiled_trn1(trn1, row_chunk):
    a, b = vectors(25600)
    out = nki.baremetal(handout.make_vector_add_tiled_trn1(row_chunk))(a, b)
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize("free_dim,n", [(1000, 256000), (2000, 256000), (2, 25600),
                                        (100, 25600)])
def test_vector_add_stream_trn1(trn1, free_dim, n):
    a, b = vectors(n)
    out = nki.baremetal(handout.make_vector_add_stream_trn1(free_dim))(a, b)
    assert out.shape == (n,)
    np.testing.assert_array_equal(out, a + b)


def test_vector_add_direct_allocation_is_correct(trn1):
    a, b = vectors(256000)
    # vec_add.py: nki.baremetal(kernel, disable_allocation_opt=True)(a, b).reshape(a.shape)
    with pytest.warns(NKIWarning, match="warn_block_dimension_is_deprecated"):
        out = nki.baremetal(handout.vector_add_direct_allocation,
                            disable_allocation_opt=True)(a, b)
    assert out.shape == (256000, 1)
    np.testing.assert_array_equal(out.reshape(a.shape), a + b)


def test_vector_add_direct_allocation_bad_is_wrong_as_aliasing_predicts(trn1):
    a, b = vectors(256000)
    with pytest.warns(NKIWarning, match="warn_block_dimension_is_deprecated"):
        out = nki.baremetal(handout.vector_add_direct_allocation_bad,
                            disable_allocation_opt=True)(a, b).reshape(a.shape)
    assert not np.allclose(out, a + b)          # the harness: "Correctness check failed"
    # a_tile, b_tile and res_tile share storage: loading b overwrites a, so res = b + b
    np.testing.assert_array_equal(out, b + b)


@pytest.mark.filterwarnings("ignore:NKI rule the device tolerates.*block dimensions")
@pytest.mark.filterwarnings("ignore:block dimensions")
def test_direct_allocation_kernels_on_trn2_too():
    a, b = vectors(128000)
    np.testing.assert_array_equal(
        nki.simulate_kernel(handout.vector_add_direct_allocation, a, b).reshape(-1), a + b)
    np.testing.assert_array_equal(
        nki.simulate_kernel(handout.vector_add_direct_allocation_bad, a, b).reshape(-1), b + b)


def test_handout_kernels_carry_the_handout_decorators():
    k = handout.make_vector_add_tiled(1)
    assert k.options["compiler"]["skip_middle_end_transformations"] is True
    assert handout.vector_add_naive.options["compiler"]["skip_middle_end_transformations"]
    assert "compiler" not in handout.vector_add_direct_allocation.options


# ---------------------------------------------------------------------------------------------
# `nkisim run SCRIPT`: an unmodified NKI script


SCRIPT = textwrap.dedent('''
    import argparse

    import numpy as np
    import neuronxcc.nki as nki
    import neuronxcc.nki.isa as nisa
    import neuronxcc.nki.language as nl


    @nki.compiler.skip_middle_end_transformations
    @nki.jit
    def vector_add_naive(a_vec, b_vec):
        out = nl.ndarray(shape=a_vec.shape, dtype=a_vec.dtype, buffer=nl.hbm)
        a_sbuf = nl.ndarray(shape=(a_vec.shape[0], 1), dtype=a_vec.dtype, buffer=nl.sbuf)
        b_sbuf = nl.ndarray(shape=(b_vec.shape[0], 1), dtype=b_vec.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=a_vec, dst=a_sbuf)
        nisa.dma_copy(src=b_vec, dst=b_sbuf)
        res = nisa.tensor_scalar(a_sbuf, nl.add, b_sbuf)
        nl.device_print("res[0:2] =", res[0:2, 0:1])
        nisa.dma_copy(src=res, dst=out)
        return out


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("-n", type=int, required=True)
        args = parser.parse_args()
        a = np.arange(args.n, dtype=np.float32)
        b = np.full(args.n, 0.5, dtype=np.float32)
        out = nki.baremetal(vector_add_naive)(a, b)
        print(f"Correctness passed? {np.allclose(out, a + b)}")
        sim = nki.simulate_kernel(vector_add_naive, a, b)
        print("simulated:", sim[:4].tolist())
        print("nc version:", nki.isa.nc_version.gen3 == 3)
''')


def _nkisim_run(tmp_path, script_text, *args, target=None):
    script = tmp_path / "run_benchmark.py"
    script.write_text(script_text)
    env = dict(os.environ)
    env.pop("NKISIM_TARGET", None)
    cmd = [sys.executable, "-m", "nkisim.cli", "run"]
    if target:
        cmd += ["--target", target]
    return subprocess.run(cmd + [str(script), *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)


def test_nkisim_run_executes_an_unmodified_script(tmp_path):
    r = _nkisim_run(tmp_path, SCRIPT, "-n", "128")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "Correctness passed? True" in lines
    assert "simulated: [0.5, 1.5, 2.5, 3.5]" in lines
    assert "nc version: True" in lines
    assert sum(line.startswith("res[0:2] = ") for line in lines) == 2   # once per run


def test_nkisim_run_reports_nki_errors_with_a_failing_exit_code(tmp_path):
    r = _nkisim_run(tmp_path, SCRIPT, "-n", "256")
    assert r.returncode == 1
    assert ("ValueError: number of partitions 256 exceed architecture limitation of 128. "
            "Info on how to fix:") in r.stderr
    # the traceback runs through the user's script only, ending at the kernel's line
    frames = [ln for ln in r.stderr.splitlines() if ln.startswith('  File "')]
    assert frames and all("run_benchmark.py" in ln for ln in frames), r.stderr
    assert "in vector_add_naive" in frames[-1]
    assert "nkisim's own frames hidden" in r.stderr


def test_nkisim_run_target_option(tmp_path):
    script = textwrap.dedent('''
        import neuronxcc.nki as nki
        import neuronxcc.nki.isa as nisa
        import neuronxcc.nki.language as nl
        import numpy as np

        @nki.jit
        def version(a):
            out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
            nl.store(out, nl.full((1, 1), int(nisa.get_nc_version()), dtype=nl.int32))
            return out

        print("version", int(nki.baremetal(version)(np.zeros((1, 1), np.float32))[0, 0]))
    ''')
    assert "version 2" in _nkisim_run(tmp_path, script, target="trn1").stdout
    assert "version 3" in _nkisim_run(tmp_path, script).stdout


def test_nkisim_run_passes_exit_codes_and_argv(tmp_path):
    script = "import sys\nprint(sys.argv[1:])\nsys.exit(3)\n"
    r = _nkisim_run(tmp_path, script, "--kernel", "tiled", "-n", "25600")
    assert r.returncode == 3
    assert r.stdout.strip() == "['--kernel', 'tiled', '-n', '25600']"


def test_nkisim_run_names_a_package_the_script_lacks_in_one_line(tmp_path):
    # the course's part2/conv2d_numpy.py imports torch for its reference; without it the user
    # gets one line naming the package and the importing line, not a traceback through runpy
    (tmp_path / "conv2d_numpy.py").write_text("import numpy as np\nimport no_such_pkg_xyz.nn\n")
    r = _nkisim_run(tmp_path, "import conv2d_numpy\n")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"nkisim run: {tmp_path / 'run_benchmark.py'} needs the Python package `no_such_pkg_xyz` "
        "(imported at conv2d_numpy.py:2), which is not installed here: pip install "
        "no_such_pkg_xyz"]


def test_nkisim_run_of_a_script_that_does_not_parse_is_pythons_message_only(tmp_path):
    r = _nkisim_run(tmp_path, "import numpy as np\nx = (1,\n")
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0] == f'  File "{tmp_path / "run_benchmark.py"}", line 2', r.stderr
    assert lines[-1] == "SyntaxError: '(' was never closed"
    assert "Traceback" not in r.stderr and "runpy" not in r.stderr and "cli.py" not in r.stderr


def test_a_script_running_a_kernel_twice_sees_each_warning_once(tmp_path):
    # the trn1 course runs each kernel with baremetal, then benchmark: the same suspicious
    # pattern was printed once per run
    script = textwrap.dedent('''
        import numpy as np
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl

        @nki.jit
        def k(a):
            out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
            acc = nl.zeros((128, 8), nl.float16, buffer=nl.psum)
            acc += nl.matmul(nl.load(a), nl.load(a)[:, 0:8], transpose_x=True)
            nl.store(out, acc)
            return out

        a = np.ones((128, 128), np.float32)
        nki.baremetal(k)(a)
        nki.benchmark(k)(a)
    ''')
    r = _nkisim_run(tmp_path, script)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("NKIWarning: suspicious pattern: PSUM accumulator `acc`") == 1, r.stderr


def test_nkisim_run_without_a_script_names_only_the_script():
    r = subprocess.run([sys.executable, "-m", "nkisim.cli", "run"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == ("nkisim run: error: the following arguments are required: "
                                "script (see nkisim run -h)")


def test_nkisim_info_into_a_closed_pipe_says_nothing_more():
    # `nkisim info | head -1`: the reader leaves; no BrokenPipeError traceback
    r, w = os.pipe()
    os.close(r)
    proc = subprocess.run([sys.executable, "-m", "nkisim.cli", "info"], stdout=w,
                          stderr=subprocess.PIPE, text=True, timeout=60)
    os.close(w)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
