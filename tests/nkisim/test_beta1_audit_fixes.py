"""Beta 1 (``neuronxcc.nki``) behaviours an audit against AWS's Beta 1 API docs found wrong.

Truth: the Beta 1 stubs' docstrings (aws-neuron-sdk 1db4d74e nki/api/nki/isa/__init__.py,
quoted at each test) and NumPy.
"""

import ml_dtypes
import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl

BF16 = np.dtype(ml_dtypes.bfloat16)
VALS = [-4.59375, 2.5, 3.5, 300.0, -300.0, -2.5]


def _int8_of(x, how):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.int8, buffer=nl.shared_hbm)
        if how == "tensor_copy":
            nl.store(out, nisa.tensor_copy(nl.load(a), dtype=nl.int8))
        elif how == "dma_copy":
            nisa.dma_copy(dst=out, src=a)
        else:
            nl.store(out, nl.load(a, dtype=nl.int8))
        return out
    return nki.simulate_kernel(k, x)


@pytest.mark.parametrize("how", ["tensor_copy", "dma_copy", "load"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_a_float_to_int_cast_rounds_and_saturates_for_every_float_dtype(how, dtype):
    # "intermediate FP32 cast when input and output data types differ": the values are exact in
    # every one of these dtypes, so each gives what NumPy's round-half-even and clip give
    x = np.array([VALS], dtype=dtype)
    ref = np.clip(np.rint(np.array(VALS)), -128, 127).astype(np.int8)
    np.testing.assert_array_equal(_int8_of(x, how)[0], ref)


def _tt(case):
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        if case == "bitvec_float":
            r = nisa.tensor_tensor(x, y, nl.bitwise_and)
        elif case == "scalar_engine":
            r = nisa.tensor_tensor(x, y, nl.add, engine=nisa.scalar_engine)
        elif case == "power_psum":
            p = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
            p[...] = nl.copy(x)
            r = nisa.tensor_tensor(p, y, nl.power)
        elif case == "stt_psum":
            p = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
            q = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
            p[...] = nl.copy(x)
            q[...] = nl.copy(y)
            r = nisa.scalar_tensor_tensor(data=p, op0=nl.add, operand0=1.0, op1=nl.add,
                                          operand1=q)
        elif case == "scan_psum":
            p = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
            q = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
            p[...] = nl.copy(x)
            q[...] = nl.copy(y)
            r = nisa.tensor_tensor_scan(p, q, 0.0, nl.multiply, nl.add)
        else:
            r = nisa.tensor_tensor(x, y, nl.power)
        nl.store(out, r)
        return out
    a = np.random.default_rng(3).random((8, 16), dtype=np.float32) + 0.5
    return a, nki.simulate_kernel(k, a, a)


@pytest.mark.parametrize("case,exc,msg", [
    # "For bitvec operators, the input/output data types must be integer types"
    ("bitvec_float", TypeError, "integer dtypes"),
    # "engine: nki.isa.vector_engine, nki.isa.gpsimd_engine or nki.isa.unknown_engine"
    ("scalar_engine", ValueError, "engine scalar is not supported"),
    # "Since GpSimd Engine cannot access PSUM, the input or output tiles cannot be in PSUM if
    # op is one of the GpSimd operations" (power)
    ("power_psum", TypeError, "psum"),
    # scalar_tensor_tensor: "operand1 and data can't both be on PSUM"
    ("stt_psum", TypeError, "both inputs from PSUM"),
    # tensor_tensor_scan: "The two input tiles, data0 and data1 cannot both reside in PSUM"
    ("scan_psum", TypeError, "both inputs from PSUM"),
])
def test_tensor_tensor_family_rules_of_the_beta1_docs(case, exc, msg):
    with pytest.raises(exc, match=msg):
        _tt(case)


def test_power_runs_on_gpsimd_from_sbuf():
    # "... power ... which run[s] on the GpSimd Engine"
    from nkisim.runtime import last_run
    a, got = _tt("power")
    np.testing.assert_allclose(got, a.astype(np.float64) ** a, rtol=2e-6)
    ins = [i for i in last_run().trace.instrs if i.op == "tensor_tensor"]
    assert [i.engine for i in ins] == ["gpsimd"]


def _on(target, case, monkeypatch):
    monkeypatch.setenv("NKISIM_TARGET", target)

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        if case == "scalar_add":
            r = nisa.tensor_scalar(x, nl.add, 1.0, engine=nisa.scalar_engine)
            nl.store(out, r)
        else:
            nisa.dma_copy(dst=out, src=a, dge_mode=nisa.dge_mode.hwdge)
        return out
    a = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    return a, nki.simulate_kernel(k, a)


@pytest.mark.parametrize("case,msg", [
    # "Add and Multiply are supported on Scalar Engine only from NeuronCore-v3" (ALU table)
    ("scalar_add", "only from NeuronCore-v3"),
    # dma_copy: "HWDGE is only supported for NeuronCore-v3+"
    ("hwdge", "NeuronCore-v3"),
])
def test_neuroncore_v3_features_are_refused_on_trn1_and_run_on_trn2(case, msg, monkeypatch):
    with pytest.raises(ValueError, match=msg):
        _on("trn1", case, monkeypatch)
    a, got = _on("trn2", case, monkeypatch)
    np.testing.assert_array_equal(got, a + 1 if case == "scalar_add" else a)


def test_affine_select_takes_one_comparison_not_combined_masks():
    # "It can't be multiple masks combined using logical operators such as & and |. For a
    # complex predicate that doesn't meet the above requirements, consider using nl.where"
    def make(combined):
        @nki.jit
        def k(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            ip, jf = nl.arange(8)[:, None], nl.arange(16)[None, :]
            pred = (ip >= jf) & (jf < 12) if combined else ip >= jf
            nl.store(out, nisa.affine_select(pred, nl.load(a), -1.0))
            return out
        return k
    a = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    ip, jf = np.arange(8)[:, None], np.arange(16)[None, :]
    np.testing.assert_array_equal(nki.simulate_kernel(make(False), a),
                                  np.where(ip >= jf, a, -1.0))
    with pytest.raises(ValueError, match="one affine comparison"):
        nki.simulate_kernel(make(True), a)


@pytest.mark.parametrize("engine", ["gpsimd", "vector"])
def test_a_gpsimd_result_assigned_to_a_psum_tile_is_refused(engine):
    # tensor_copy doc: "since GpSimd Engine cannot access PSUM in NeuronCore, Scalar or Vector
    # Engine must be chosen when the input or output tile is in PSUM ... this API returns a tile
    # in SBUF, unless the returned value is assigned to a pre-declared PSUM tile"
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        p = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
        p[...] = nisa.tensor_copy(nl.load(a), engine=getattr(nisa, f"{engine}_engine"))
        nl.store(out, nl.copy(p))
        return out
    a = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    if engine == "gpsimd":
        with pytest.raises(TypeError, match="psum"):
            nki.simulate_kernel(k, a)
    else:
        np.testing.assert_array_equal(nki.simulate_kernel(k, a), a)
