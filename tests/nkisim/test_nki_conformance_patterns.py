"""Patterns AWS's own current-dialect code uses that nkisim's nki face does not accept yet
(found running nki-library's simulation tests, benchmarks/conformance.py --nki-library).

Each is a minimal reproducer written here (no corpus code), marked ``xfail(strict=True)`` so it
documents the gap and turns into a failure (to remove the mark) once the face accepts it.
"""

import ml_dtypes
import numpy as np
import pytest

import nkisim.shim
from nkisim.errors import NKIRuleWarning

nkisim.shim.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


def test_dma_copy_accepts_the_integer_dge_mode_aws_library_passes():
    """AWS's nki-library (d2ad3a5, core/subkernels/norm_tkg_utils.py `_DGE_MODE_NONE = 3`, used
    by rmsnorm_tkg/layernorm_tkg) passes dge_mode=3 to nisa.dma_copy: a tolerated rule (a
    warning; an error in strict mode), read as dge_mode.none."""
    @nki.jit
    def copy(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x, dge_mode=3)
        nisa.dma_copy(dst=out, src=t, dge_mode=3)
        return out

    x = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
    with pytest.warns(NKIRuleWarning, match="dge_mode=3 is an integer"):
        assert np.array_equal(nki.simulate(copy)(x), x)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NKISIM_STRICT", "1")
        with pytest.raises(ValueError, match="Integer enum values"):
            nki.simulate(copy)(x)


def test_nc_matmul_accepts_the_perf_mode_string_aws_library_passes():
    """AWS's nki-library (d2ad3a5, core/qkv/qkv_cte.py, static-quantization path) passes
    nc_matmul(perf_mode="double_row"): a tolerated rule, read as matmul_perf_mode.double_row."""
    @nki.jit
    def mm(w, x):
        out = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        ws = nl.ndarray(w.shape, dtype=w.dtype, buffer=nl.sbuf)
        xs = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ws, src=w)
        nisa.dma_copy(dst=xs, src=x)
        p = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=p, stationary=ws, moving=xs, perf_mode="double_row")
        s = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=p)
        nisa.dma_copy(dst=out, src=s)
        return out

    rng = np.random.default_rng(0)
    # double_row: "stationary and moving tiles must be one of float8_e4m3 or float8_e5m2"
    fp8 = ml_dtypes.float8_e4m3
    w = rng.standard_normal((8, 2, 32), np.float32).astype(fp8)   # [K, 2, M] and [K, 2, N]:
    x = rng.standard_normal((8, 2, 16), np.float32).astype(fp8)   # rows of a pair contracted
    want = np.einsum("kjm,kjn->mn", w.astype(np.float32), x.astype(np.float32))
    with pytest.warns(NKIRuleWarning, match="perf_mode='double_row' is a string"):
        np.testing.assert_allclose(nki.simulate(mm)(w, x), want, rtol=1e-4, atol=1e-4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NKISIM_STRICT", "1")
        with pytest.raises(ValueError, match="strings"):
            nki.simulate(mm)(w, x)


def test_other_integer_enums_stay_rejected():
    @nki.jit
    def copy(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x, oob_mode=0)
        return out

    with pytest.raises(TypeError, match="oob_mode must be a nki.isa.oob_mode member"):
        nki.simulate(copy)(np.zeros((128, 4), np.float32))


def test_shared_constant_reads_a_npy_file(tmp_path):
    """nki-library (d2ad3a5, core/topk/rotational_topk.py) passes nl.shared_constant the name of
    a .npy file written with np.save."""
    m = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    path = tmp_path / "rot.npy"
    np.save(path, m)

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=nl.shared_constant(str(path)))
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(np.zeros_like(m)), m)

    @nki.jit
    def missing(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=nl.shared_constant(str(tmp_path / "nope.npy")))
        return out

    with pytest.raises(Exception, match="cannot read the constant file"):
        nki.simulate(missing)(np.zeros_like(m))


def test_address_placed_kernel_may_omit_the_bias_and_transpose_on_tensore():
    """Beta 1's "allocated NKI kernels" restrictions (activation needs a bias tile, no TensorE
    transpose) are not rules of nki 0.3+: AWS's nki-library places tensors with address= (its
    SbufManager) and, in the same kernels (attention_tkg), calls activation without bias and
    nc_transpose on the Tensor Engine."""
    @nki.jit
    def exp_then_transpose(x):
        out = nl.ndarray((64, 128), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf, address=(0, 0))
        e = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf, address=(0, 1024))
        p = nl.ndarray((64, 128), dtype=x.dtype, buffer=nl.psum, address=(0, 0))
        r = nl.ndarray((64, 128), dtype=x.dtype, buffer=nl.sbuf, address=(0, 2048))
        nisa.dma_copy(dst=t, src=x)
        nisa.activation(dst=e, op=nl.exp, data=t)
        nisa.nc_transpose(dst=p, data=e, engine=nisa.engine.tensor)
        nisa.tensor_copy(dst=r, src=p)
        nisa.dma_copy(dst=out, src=r)
        return out

    x = np.linspace(-2, 2, 128 * 64, dtype=np.float32).reshape(128, 64)
    np.testing.assert_allclose(nki.simulate(exp_then_transpose)(x), np.exp(x).T, rtol=1e-6)


def test_a_tensor_argument_tests_true_as_an_object_handle():
    """AWS's nki-library (mlp_tkg_constants.py) tests an optional tensor argument with
    `if params.expert_index:`; in nki 0.3+ a tensor is a handle and tests true. A one-element
    SBUF tile cannot steer Python (a dynamic-control-flow error)."""
    @nki.jit
    def pick(x, idx=None):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if idx:
            nisa.activation(dst=t, op=nl.exp, data=t)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.linspace(-1, 1, 128 * 4, dtype=np.float32).reshape(128, 4)
    np.testing.assert_allclose(nki.simulate(pick)(x, np.zeros((4, 2), np.int32)), np.exp(x),
                               rtol=1e-6)
    np.testing.assert_array_equal(nki.simulate(pick)(x), x)

    @nki.jit
    def branch_on_value(x):
        t = nl.ndarray((1, 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if t:
            pass
        return x

    with pytest.raises(Exception, match="dynamic control-flow depending on tensor value"):
        nki.simulate(branch_on_value)(np.ones((1, 1), np.float32))


def test_one_input_alu_op_as_op0_is_an_abs_max():
    """ALU op table (tbl-aluop): abs is a one-input ALU op; AWS's nki-library rmsnorm_quant.py
    computes a row's abs-max with tensor_scalar_reduce(op0=nl.abs, operand0=0.0,
    reduce_op=nl.maximum). The operand is ignored."""
    @nki.jit
    def absmax(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        amax = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        m = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar_reduce(dst=a, data=t, op0=nl.abs, operand0=0.0,
                                  reduce_op=nl.maximum, reduce_res=m)
        nisa.dma_copy(dst=out, src=a)
        nisa.dma_copy(dst=amax, src=m)
        return out, amax

    x = np.random.default_rng(3).uniform(-5, 5, (128, 16)).astype(np.float32)
    got, amax = nki.simulate(absmax)(x)
    np.testing.assert_array_equal(got, np.abs(x))
    np.testing.assert_array_equal(amax[:, 0], np.abs(x).max(axis=1))


def _two_banks(windows):
    """A [128, 1024] fp32 PSUM tensor (two banks) filled by one matmul per (first column,
    columns) window, then evicted (the shape of AWS's nki-library topk `rotate`, rewritten
    here)."""
    @nki.jit
    def kernel(w, x):
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        w_sb = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        x_sb = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=w_sb, src=w)
        nisa.dma_copy(dst=x_sb, src=x)
        ps = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)
        for first, n in windows:
            cols = nl.ds(first, n)
            nisa.nc_matmul(ps[:, cols], w_sb, x_sb[:, cols])
        res = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        nisa.dma_copy(dst=out, src=res)
        return out
    return kernel


def test_a_psum_tensor_spans_banks_but_each_matmul_writes_one_bank():
    """nki 0.3+: a PSUM tensor over two banks, written one 512-column bank (or half of one)
    per matmul, is valid (nkisim.context.Rules.psum_tile_spans_banks); a matmul whose 256
    columns straddle the bank boundary (columns 384-640) is not."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((128, 128)).astype(np.float32)
    x = rng.standard_normal((128, 1024)).astype(np.float32)
    for span in (512, 256):
        got = nki.simulate(_two_banks([(c, span) for c in range(0, 1024, span)]))(w, x)
        np.testing.assert_allclose(got, w.T @ x, rtol=1e-4, atol=1e-4)
    straddle = _two_banks([(0, 384), (384, 256), (640, 384)])
    with pytest.raises(ValueError, match="across a 2048 byte bank boundary"):
        nki.simulate(straddle)(w, x)


def test_a_psum_tensor_larger_than_psum_is_refused():
    @nki.jit
    def too_big(x):
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.ndarray((128, 4097), dtype=nl.float32, buffer=nl.psum)       # 16388 B > 16 KiB
        return out

    with pytest.raises(ValueError, match="more than PSUM's 16384 bytes per partition"):
        nki.simulate(too_big)(np.zeros((128, 8), np.float32))
