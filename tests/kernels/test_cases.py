"""Every stored case (fixtures/configs.py) on the simulator, with its device twin.

``test_case`` runs each case in each of its dtypes through the session's backend (``nki_verify``:
inputs -> kernel -> float64 golden + low-precision baseline -> tolerance-aware comparison ->
session report), once per NKI dialect of ``--nki-dialect`` (default both: our Beta 1 kernel and its
current-``nki`` twin, ``[...-beta1-...]``/``[...-nki-...]``). The plugin generates a
``[...-simulate]`` and a ``[...-device]`` variant of each;
the device variant runs on a trn1/trn2 and is skipped elsewhere. Large cases are marked ``slow``
and still run by default: the course grades the large-image correctness cases.

``test_performance`` asserts the course's latency thresholds (cs149-assignment §2) on a device
through ``nki.benchmark(warmup=5, iters=20)``; on nkisim the same figures are reported by
``nki-verify bench`` and benchmarks/, not asserted in timed tests.
"""

import pytest

from fixtures.configs import CASES, THRESHOLDS_US, TRANSPOSE_EC_US, performance_cases
from nkiverify import registry, strategies


def _case_params():
    for case in CASES:
        marks = [pytest.mark.slow] if case.slow else []
        for dtype in case.dtypes:
            yield pytest.param(case, dtype, id=f"{case.id}-{dtype}", marks=marks)


@pytest.mark.parametrize("case, dtype", list(_case_params()))
def test_case(case, dtype, nki_dialect, nki_verify, nki_contract):
    # a kernel held to the course's contract (yours, given with --nki-kernel) skips the cases
    # beyond it, which `nki-verify course` lists as "not required" (docs/course-contract.md)
    if (nki_contract(case.kernel) == "course" and case.source != "course"
            and not strategies.in_course_contract(case.kernel, case.params)):
        pytest.skip(f"{case.id}: beyond the course's contract for {case.kernel} (not required, "
                    "docs/course-contract.md; --nki-contract hardware runs it)")
    nki_verify(case.kernel, case.params, dtype, case_id=case.id,
               seed=case.seed(dtype), dist=case.dist)


def _device_spec(kernel, dialect, device):
    """Our kernel in ``dialect``, or a skip saying why the installed SDK cannot run that dialect
    on the device (neuronx-cc up to 2.27 runs beta1, nki 0.3+ runs nki)."""
    reason = device.dialect_skip_reason(dialect)
    if reason is not None:
        pytest.skip(f"device: {reason}")
    return registry.get(kernel).for_dialect(dialect)


def _perf_params():
    for case in performance_cases():
        for dtype in case.dtypes:
            yield pytest.param(case, dtype, id=f"{case.id}-{dtype}")


@pytest.mark.device
@pytest.mark.parametrize("case, dtype", list(_perf_params()))
def test_performance(case, dtype, nki_dialect, nki_device):
    spec = _device_spec(case.kernel, nki_dialect, nki_device)
    inputs = spec.inputs(case.params, dtype, seed=case.seed(dtype))
    kernel = nki_device.load(spec.import_path)
    p99_us = nki_device.benchmark(kernel, inputs.args, inputs.kwargs, warmup=5, iters=20)
    relaxed, optimized = THRESHOLDS_US[(dtype, case.params["height"])]
    assert p99_us <= optimized, (
        f"{case.id} [{dtype}]: p99 NC latency {p99_us:.1f} us exceeds the course's optimized "
        f"threshold {optimized:.0f} us (relaxed: {relaxed:.0f} us)")


@pytest.mark.device
def test_transpose_extra_credit(nki_dialect, nki_device):
    spec = _device_spec("transpose", nki_dialect, nki_device)
    params = {"m": 4096, "n": 4096}
    inputs = spec.inputs(params, "float32", seed=0)
    kernel = nki_device.load(spec.import_path)
    p99_us = nki_device.benchmark(kernel, inputs.args, inputs.kwargs, warmup=5, iters=20)
    assert p99_us < TRANSPOSE_EC_US, (
        f"4096x4096 transpose: p99 NC latency {p99_us:.1f} us, extra credit needs "
        f"< {TRANSPOSE_EC_US:.0f} us")
