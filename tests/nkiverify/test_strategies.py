"""nkiverify.strategies: drawn cases respect the hardware limits of nkisim.arch and the kernels'
contracts, reach the interesting corners, and the value distributions are what they claim."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from nkisim.arch import TRN1, TRN2
from nkiverify import registry, strategies

BF16 = np.dtype(ml_dtypes.bfloat16)
ARCHS = {"trn1": TRN1, "trn2": TRN2}


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_limits_come_from_nkisim_arch(target):
    lim = strategies.limits(target)
    arch = ARCHS[target]
    assert (lim.pmax, lim.gemm_moving_fmax, lim.sbuf_usable_bytes) == (
        arch.pmax, arch.gemm_moving_fmax, arch.sbuf_usable_bytes)


def test_weights_fit_is_the_sbuf_budget_per_partition():
    lim = strategies.limits("trn2")
    # C_out*C_in*K*K*itemsize/pmax bytes per partition against the usable SBUF
    c_in, k = 1024, 5
    per_cout = c_in * k * k * 4 / lim.pmax
    fits = int(lim.sbuf_usable_bytes // per_cout)
    assert lim.weights_fit(c_in, fits, k, "float32")
    assert not lim.weights_fit(c_in, fits + 1, k, "float32")
    # half the bytes in fp16: twice the channels fit
    assert lim.weights_fit(c_in, 2 * fits, k, "float16")
    # the course's large layer fits comfortably on both targets
    assert strategies.limits("trn1").weights_fit(256, 256, 3)


def _check_conv(p, lim, dtype="float32"):
    out_h, out_w = p["height"] - p["k"] + 1, p["width"] - p["k"] + 1
    assert p["c_in"] % lim.pmax == 0 and p["c_out"] % lim.pmax == 0
    assert p["c_in"] >= lim.pmax and p["c_out"] >= lim.pmax
    assert 1 <= out_h and 1 <= out_w <= lim.gemm_moving_fmax
    assert out_h % p["pool"] == 0 and p["pool"] <= out_w
    assert lim.weights_fit(p["c_in"], p["c_out"], p["k"], dtype)
    assert p["batch"] >= 1 and isinstance(p["bias"], bool)


@given(p=strategies.conv2d_params())
def test_conv2d_params_respect_the_kernel_contract(p):
    _check_conv(p, strategies.limits())


@settings(max_examples=30)
@given(p=strategies.conv2d_params(target="trn1", max_channel_tiles=16, filters=(5,),
                                  max_out_w=600))
def test_conv2d_params_keep_big_weights_within_sbuf_and_width_limits(p):
    # 16 channel tiles of 5x5 fp32 weights would need 400 KiB per partition: the strategy
    # must only draw the C_out that fit, and never an output wider than gemm_moving_fmax.
    _check_conv(p, strategies.limits("trn1"))


def test_conv2d_params_reach_the_corners():
    s = strategies.conv2d_params()
    assert find(s, lambda p: p["pool"] > 1)["pool"] == 2
    assert find(s, lambda p: p["k"] == 5)["k"] == 5
    assert find(s, lambda p: p["c_in"] != p["c_out"])
    assert find(s, lambda p: (p["height"] - p["k"] + 1) % 2 == 1 and p["batch"] == 2)
    assert find(s, lambda p: p["pool"] == 3)["pool"] == 3


@given(p=strategies.transpose_params(target="trn2"))
def test_transpose_params_are_multiples_of_pmax(p):
    assert p["m"] % TRN2.pmax == 0 and p["n"] % TRN2.pmax == 0 and p["m"] > 0 and p["n"] > 0


def test_transpose_params_draw_non_square():
    p = find(strategies.transpose_params(), lambda p: p["m"] != p["n"])
    assert p["m"] != p["n"]


@given(naive=strategies.vector_add_params("naive"),
       stream=strategies.vector_add_params("stream"),
       tiled=strategies.vector_add_params("tiled"))
def test_vector_add_params(naive, stream, tiled):
    assert 1 <= naive["n"] <= TRN2.pmax
    assert stream["n"] % TRN2.pmax == 0 and stream["n"] > 0
    assert tiled["n"] >= 1


def test_vector_add_params_rejects_other_kernels():
    with pytest.raises(ValueError, match="not a vector-add kernel"):
        strategies.vector_add_params("conv2d")


def test_tiled_draws_lengths_that_are_not_multiples_of_pmax():
    p = find(strategies.vector_add_params("tiled"), lambda p: p["n"] % 128 != 0)
    assert p["n"] % 128


@settings(max_examples=20)
@given(case=strategies.kernel_cases("conv2d"))
def test_kernel_cases_carry_a_dtype_seed_and_magnitude(case):
    assert case.dtype in strategies.DTYPES
    assert case.dist in registry.DISTS
    assert 0 <= case.seed < 2**32
    assert case.kernel in case.id and case.dtype in case.id


def test_kernel_cases_fix_the_dtype_when_asked():
    case = find(strategies.kernel_cases("transpose", dtype="bfloat16"), lambda c: True)
    assert case.dtype == "bfloat16"


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(a=strategies.bf16_arrays((3, 5), min_value=-2.0, max_value=2.0))
def test_bf16_arrays(a):
    assert a.dtype == BF16 and a.shape == (3, 5)
    f = a.astype(np.float32)
    assert np.all(np.isfinite(f)) and np.all(f >= -2.0) and np.all(f <= 2.0)
    # every element is a bf16 value: it round-trips through bf16 unchanged
    assert np.array_equal(f.astype(BF16).astype(np.float32), f)


def test_bf16_arrays_reach_values_between_fp32_and_bf16_resolution():
    # not just small integers: values whose bf16 rounding matters
    a = find(strategies.bf16_arrays((4,)), lambda a: np.any(
        (a.astype(np.float32) % 1) != 0))
    assert a.dtype == BF16


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_float_arrays(dtype):
    @settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow])
    @given(a=strategies.float_arrays(dtype, (8,), min_value=-1.5, max_value=1.5))
    def check(a):
        assert a.dtype == registry.dtype_of(dtype)
        f = a.astype(np.float64)
        assert np.all(np.isfinite(f)) and np.all(np.abs(f) <= 1.5)

    check()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_value_distributions_have_their_magnitudes(dtype):
    rng = np.random.default_rng(0)
    shape = (20000,)
    u = registry.values(rng, shape, dtype, "uniform").astype(np.float64)
    assert u.min() >= 0 and u.max() <= 1 and 0.45 < u.mean() < 0.55
    n = registry.values(rng, shape, dtype, "normal").astype(np.float64)
    assert n.min() < 0 < n.max() and 0.9 < n.std() < 1.1
    tiny = registry.values(rng, shape, dtype, "tiny").astype(np.float64)
    assert 0.5e-3 < np.abs(tiny).mean() < 2e-3
    large = registry.values(rng, shape, dtype, "large").astype(np.float64)
    assert 500 < np.abs(large).mean() < 2000
    # within the dtype's range with room to add two of them (vector add)
    assert np.all(np.isfinite(2 * large.astype(registry.dtype_of(dtype))))


def test_values_rejects_unknown_distribution():
    with pytest.raises(ValueError, match="unknown value distribution"):
        registry.values(np.random.default_rng(0), (2,), "float32", "zipf")


@given(st.data())
def test_conv_inputs_follow_the_params(data):
    p = data.draw(strategies.conv2d_params())
    dtype = data.draw(strategies.dtypes())
    dist = data.draw(strategies.dists())
    inputs = registry.get("conv2d").inputs(p, dtype, seed=1, dist=dist)
    x, w, bias = inputs.args
    assert x.shape == (p["batch"], p["c_in"], p["height"], p["width"])
    assert w.shape == (p["c_out"], p["c_in"], p["k"], p["k"])
    assert bias.shape == (p["c_out"],)
    assert {a.dtype for a in (x, w, bias)} == {registry.dtype_of(dtype)}
    assert inputs.kwargs == {"pool_size": p["pool"]}
    if not p["bias"]:
        assert not np.any(bias.astype(np.float32))


# ---- contracts ----------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(p=strategies.kernel_params("conv2d", contract="course"))
def test_course_contract_conv2d(p):
    # cs149-assignment §2: 3x3 filter, pool 1 or 2 dividing the output height, channels
    # multiples of 128, output width <= gemm_moving_fmax
    out_h, out_w = p["height"] - p["k"] + 1, p["width"] - p["k"] + 1
    assert p["k"] == 3 and p["pool"] in (1, 2) and out_h % p["pool"] == 0
    assert p["c_in"] % 128 == 0 and p["c_out"] % 128 == 0 and out_w <= 512


def test_course_contract_draws_wide_outputs_too():
    """Row-grouping bugs of student kernels (512 // out_w rows per PSUM bank) appear only past
    widths of about 128 (docs/course-contract.md allows up to gemm_moving_fmax = 512)."""
    course = strategies.kernel_params("conv2d", contract="course")
    wide = find(course, lambda p: p["width"] - 2 > 256 and p["pool"] == 2)
    assert (wide["width"], wide["height"], wide["pool"]) == (259, 4, 2)
    assert find(course, lambda p: p["width"] - 2 <= 20)["width"] - 2 == 1
    # ours (the hardware contract) small unless asked: its wide cases are fixed ones
    assert find(strategies.kernel_params("conv2d", contract="hardware", wide=True),
                lambda p: p["width"] - p["k"] + 1 > 256)


def test_hardware_contract_reaches_what_the_course_never_tests():
    hw = strategies.kernel_params("conv2d", contract="hardware")
    assert find(hw, lambda p: p["k"] == 5)["k"] == 5
    assert find(hw, lambda p: p["pool"] == 3)["pool"] == 3


@settings(max_examples=40, deadline=None)
@given(tiled=strategies.kernel_params("tiled", contract="course"),
       stream=strategies.kernel_params("stream", contract="course"))
def test_course_contract_vector_add(tiled, stream):
    assert tiled["n"] % 128 == 0
    assert stream["n"] % (128 * 200) == 0


def test_kernel_cases_default_to_the_course_contract():
    case = find(strategies.kernel_cases("conv2d"), lambda c: True)
    assert case.params["k"] == 3
    with pytest.raises(ValueError, match="contract must be one of"):
        find(strategies.kernel_cases("conv2d", contract="bogus"), lambda c: True)
