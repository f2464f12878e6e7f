"""Nothing computed twice (issue 12): the runs of one case (its two dialects, a repeated
hypothesis example) share its inputs, golden, scale and baseline (nkiverify.registry.run_case),
and every run still sees the inputs as drawn."""

import dataclasses

import numpy as np
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


def test_an_output_equal_to_the_last_runs_is_not_compared_again(counted, monkeypatch):
    spec, calls = counted
    compared = []
    real = registry.check_output

    def check_output(*args, **kwargs):
        compared.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(registry, "check_output", check_output)
    backend = NkisimBackend()
    runs = [registry.run_case(spec.for_dialect(d), {"n": 384}, "float32", backend, seed=5)
            for d in ("beta1", "nki", "nki")]
    # both dialects add in fp32 and round once: the same bits, one comparison
    assert all((r.output == runs[0].output).all() for r in runs)
    assert len(compared) == 1 and len(calls) == 1
    assert [r.comparison.reasons for r in runs] == [[], [], []]
    assert runs[1].comparison is not runs[0].comparison       # each run gets its own copy
    # another k is another comparison
    registry.run_case(spec.for_dialect("nki"), {"n": 384}, "float32", backend, seed=5, k=2.0)
    assert len(compared) == 2


def test_a_different_output_is_compared_and_fails(counted, tmp_path):
    # the clobbering kernel's output is right; a kernel returning a + a is not, and is caught
    # although a correct output of the same case was compared (and kept) just before
    spec, _ = counted
    wrong = CLOBBERS_A.replace("data2=b", "data2=a").replace(
        "    zero = nl.ndarray((M, 1), dtype=a_vec.dtype, buffer=nl.sbuf)\n"
        "    nisa.memset(dst=zero, value=0.0)\n"
        "    nisa.dma_copy(dst=a_vec.reshape((M, 1)), src=zero)\n", "")
    (tmp_path / "wrong.py").write_text(wrong)
    backend = NkisimBackend()
    good = registry.run_case(spec.for_dialect("beta1"), {"n": 128}, "float32", backend, seed=1)
    bad_spec = dataclasses.replace(spec, import_path=f"{tmp_path / 'wrong.py'}:vector_add_naive",
                                   dialect="nki", nki_path="")
    bad = registry.run_case(bad_spec, {"n": 128}, "float32", backend, seed=1)
    assert good.passed and not bad.passed


def test_the_conv2d_baseline_sample_is_a_band_of_the_baseline(monkeypatch):
    from nkiverify.reference.conv2d import conv2d_maxpool_baseline
    spec = registry.get("conv2d")
    params = {"batch": 2, "c_in": 16, "c_out": 8, "height": 20, "width": 11, "k": 3,
              "pool": 2, "bias": True}
    inputs = spec.inputs(params, "float32", 3, "normal")
    full = conv2d_maxpool_baseline(*inputs.args, **inputs.kwargs)       # (2, 8, 9, 4)
    monkeypatch.setattr(registry, "BASELINE_SAMPLE", 8 * 4 * 3)         # 3 pooled rows
    values, index = registry._conv_baseline_sample(*inputs.args, dtype=np.float32,
                                                   **inputs.kwargs)
    assert index == (slice(0, 1), slice(None), slice(0, 3), slice(None))
    assert values.shape == full[index].shape == (1, 8, 3, 4) and values.dtype == np.float32
    # the same fp32 computation on fewer columns: equal up to BLAS's order (an fp32 ulp)
    np.testing.assert_allclose(values, full[index], rtol=2**-22, atol=1e-6)
    # a band that would be the whole output: no sample (the whole baseline is computed)
    monkeypatch.setattr(registry, "BASELINE_SAMPLE", 10**6)
    one = spec.inputs({**params, "batch": 1}, "float32", 3, "normal")
    assert registry._conv_baseline_sample(*one.args, dtype=np.float32, **one.kwargs) is None
    values, index = registry._conv_baseline_sample(*inputs.args, dtype=np.float32,
                                                   **inputs.kwargs)
    assert index[0] == slice(0, 1) and values.shape == (1, 8, 9, 4)      # the first image


# ---- cases with the same inputs share the convolution (registry.shared_goldens) ----------------

@pytest.fixture
def conv_calls(monkeypatch):
    """Counts the convolutions reference.conv2d computes for the registry's golden."""
    from nkiverify.reference import conv2d as ref
    calls, real = [], ref._conv2d

    def conv2d(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(ref, "_conv2d", conv2d)
    return calls


# 48x48 outputs per image: the float64 golden takes the Winograd path (>= 2048 outputs)
SHARED_CONV = {"batch": 2, "c_in": 8, "c_out": 6, "height": 50, "width": 50, "k": 3}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cases_with_the_same_inputs_share_the_convolution_bit_for_bit(conv_calls, dtype):
    from nkiverify.reference.conv2d import conv2d_maxpool
    spec = registry.get("conv2d")
    steps = [(False, 1), (True, 1), (True, 2), (True, 3)]     # the order nki-verify runs them
    goldens, computed = [], 0
    with registry.shared_goldens():
        for bias, pool in steps:
            inputs = spec.inputs({**SHARED_CONV, "bias": bias, "pool": pool}, dtype, 11)
            before = len(conv_calls)
            golden = spec.golden(*inputs.args, **inputs.kwargs)
            computed += len(conv_calls) - before
            direct = conv2d_maxpool(*inputs.args, dtype="auto", **inputs.kwargs)
            assert golden.dtype == direct.dtype == golden_precision(dtype)
            assert np.array_equal(golden, direct), (bias, pool)
            # and the float64 golden is the direct float64 sum of the products (Winograd's
            # error, a few float64 ulps of the sums, is far below fp32's half ulp 3e-8)
            exact = direct_sum(*inputs.args, pool)
            np.testing.assert_allclose(golden, exact, rtol=1e-13 if dtype == "float32"
                                       else 2e-6)
            if pool == 1:     # handed out as is: read only (a bias is added to it in place)
                with pytest.raises(ValueError):
                    golden[0, 0, 0, 0] = 0.0
            goldens.append(golden.copy())
            del golden        # the case is over (nki-verify: its runs are done)
    # one convolution: the bias-free one, the bias added to it, the pools taken from it
    assert computed == 1
    # outside the block nothing is shared
    inputs = spec.inputs({**SHARED_CONV, "bias": True, "pool": 2}, dtype, 11)
    before = len(conv_calls)
    assert np.array_equal(spec.golden(*inputs.args, **inputs.kwargs), goldens[2])
    assert len(conv_calls) == before + 1


def golden_precision(dtype):
    return np.dtype(np.float64 if dtype == "float32" else np.float32)


def direct_sum(X, W, bias, pool):
    """conv2d + bias + max pool as the plain float64 sum over (ci, di, dj) (no BLAS, no
    Winograd): the independent truth."""
    x, w = X.astype(np.float64), W.astype(np.float64)
    k = w.shape[2]
    oh, ow = x.shape[2] - k + 1, x.shape[3] - k + 1
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for di in range(k):
        for dj in range(k):
            y += np.einsum("bchw,oc->bohw", x[:, :, di:di + oh, dj:dj + ow], w[:, :, di, dj])
    y += bias.astype(np.float64)[:, None, None]
    ph, pw = oh // pool, ow // pool
    return y[..., :ph * pool, :pw * pool].reshape(*y.shape[:2], ph, pool, pw, pool).max((3, 5))


def test_a_golden_still_held_is_not_changed_by_the_next_case(conv_calls):
    spec = registry.get("conv2d")
    with registry.shared_goldens():
        plain = spec.inputs({**SHARED_CONV, "bias": False, "pool": 1}, "float32", 3)
        first = spec.golden(*plain.args, **plain.kwargs)       # kept: no in-place bias add
        kept = first.copy()
        biased = spec.inputs({**SHARED_CONV, "bias": True, "pool": 1}, "float32", 3)
        second = spec.golden(*biased.args, **biased.kwargs)
        assert np.array_equal(first, kept) and not np.array_equal(second, first)
        assert len(conv_calls) == 2
        # other inputs (another seed): another convolution
        other = spec.inputs({**SHARED_CONV, "bias": True, "pool": 1}, "float32", 4)
        spec.golden(*other.args, **other.kwargs)
        assert len(conv_calls) == 3
    np.testing.assert_allclose(second, direct_sum(*biased.args, 1), rtol=1e-13)


def test_the_large_cases_draw_the_same_inputs_and_run_as_one_job():
    from fixtures.configs import by_id
    from nkiverify import cli
    large, bias, pool2 = (by_id(f"conv2d-{n}") for n in ("large", "large-bias",
                                                         "large-bias-pool2"))
    assert large.seed("float32") == bias.seed("float32") == pool2.seed("float32")
    assert by_id("conv2d-perf-224").seed("float16") == by_id("conv2d-perf-224-pool2").seed(
        "float16")
    assert by_id("conv2d-small-c128-c128").seed("float32") != large.seed("float32")
    small = {**large.params, "batch": 1, "c_in": 2, "c_out": 2, "height": 8, "width": 8}
    a = registry.get("conv2d").inputs(small, "float32", large.seed("float32"))
    b = registry.get("conv2d").inputs({**small, "bias": True, "pool": 2}, "float32",
                                      pool2.seed("float32"))
    assert all(np.array_equal(x, y) for x, y in zip(a.args[:2], b.args[:2]))
    jobs = [(c.kernel, c.params, "float32", c.seed("float32"), c.dist, d)
            for c in (pool2, by_id("conv2d-small-c128-c128"), large, bias)
            for d in ("beta1", "nki")]
    # one group for the three large cases, each case's two runs together, first-seen order
    assert sorted(cli._groups(jobs)) == [[0, 1, 4, 5, 6, 7], [2, 3]]
    assert cli._cases_of([jobs[i] for i in (0, 1, 4, 5, 6, 7)]) == [(0, 2), (2, 4), (4, 6)]
    # with 2 workers no job is more than half the work: here each large case alone
    assert sorted(cli._groups(jobs, 2)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # every case: two large ones share a job, the third is another (the rest is ~1.5 cases)
    every = [(c.kernel, c.params, dt, c.seed(dt), c.dist, d)
             for c, dt in cli._select(None, False, None) for d in ("beta1", "nki")]
    larges = [c.params for c in (large, bias, pool2)]
    parts = [sorted({larges.index(every[i][1]) for i in g}) for g in cli._groups(every, 2)
             if every[g[0]][1] in larges]
    assert sorted(parts) == [[0, 1], [2]]
    work = [sum(cli._work(every[i]) for i in g) for g in cli._groups(every, 2)]
    assert max(work) <= sum(work) / 2
