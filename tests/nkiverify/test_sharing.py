"""Nothing computed twice (issue 12): the runs of one case (its two dialects, a repeated
hypothesis example) share its inputs, golden, scale and baseline (nkiverify.registry.run_case),
and every run still sees the inputs as drawn."""

import dataclasses

import pytest

from nkiverify import registry
from nkiverify.backends import NkisimBackend

# computes a + b correctly, then overwrites its input `a` with zeros (legal in the nki dialect:
# inputs are written back to the caller's arrays, nki-current.md §3)
CLOBBERS_A = '''
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def vector_add_naive(a_vec, b_vec):
    M = a_vec.shape[0]
    out = nl.ndarray(a_vec.shape, dtype=a_vec.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((M, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
    b = nl.ndarray((M, 1), dtype=b_vec.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=a_vec.reshape((M, 1)))
    nisa.dma_copy(dst=b, src=b_vec.reshape((M, 1)))
    res = nl.ndarray((M, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out.reshape((M, 1)), src=res)
    zero = nl.ndarray((M, 1), dtype=a_vec.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    nisa.dma_copy(dst=a_vec.reshape((M, 1)), src=zero)
    return out
'''


@pytest.fixture
def counted(monkeypatch):
    """The stream family with a golden model that counts its calls; an empty shared store."""
    monkeypatch.setattr(registry, "_SHARED", {})
    calls = []
    spec = registry.get("stream")

    def golden(a, b):
        calls.append(a.shape)
        return spec.golden(a, b)
    return dataclasses.replace(spec, golden=golden), calls


def test_both_dialects_of_a_case_share_one_golden(counted):
    spec, calls = counted
    backend = NkisimBackend()
    outcomes = [registry.run_case(spec.for_dialect(d), {"n": 384}, "float16", backend, seed=5)
                for d in ("beta1", "nki")]
    assert [o.passed for o in outcomes] == [True, True] and len(calls) == 1
    # another seed or size is another case
    registry.run_case(spec.for_dialect("nki"), {"n": 384}, "float16", backend, seed=6)
    registry.run_case(spec.for_dialect("nki"), {"n": 512}, "float16", backend, seed=5)
    assert len(calls) == 3
    # beyond the byte limit nothing is kept
    with registry.sharing(max_bytes=0):
        for _ in range(2):
            registry.run_case(spec, {"n": 384}, "float16", backend, seed=7)
    assert len(calls) == 5


def test_a_kernel_that_writes_its_inputs_does_not_change_the_next_run(counted, tmp_path):
    _, calls = counted
    (tmp_path / "clobber.py").write_text(CLOBBERS_A)
    spec = registry.spec_for(f"naive={tmp_path / 'clobber.py'}:vector_add_naive")
    assert spec.dialect == "nki"
    backend = NkisimBackend()
    for _ in range(2):      # the second run reuses the golden of the first, and gets `a` intact
        outcome = registry.run_case(spec, {"n": 128}, "float32", backend, seed=1)
        assert outcome.passed, outcome.comparison.message()
    inputs = spec.inputs({"n": 128}, "float32", 1)
    expected = inputs.args[0] + inputs.args[1]        # one fp32 rounding, as the engine
    assert (outcome.output == expected).all()
