"""Hypothesis property tests: each kernel family matches its golden model on drawn cases.

Cases are drawn within the hardware limits of the session's target (``--nki-target``) by
``nkiverify.strategies``: shapes, pool sizes, bias, and inputs at several magnitudes (uniform
[0, 1) as the course harness, signed normal, ~1e-3, ~1e3). Each dtype is its own test so
``--nki-dtypes`` and the tox envs select them. The number of examples comes from the
hypothesis profile (``nki-ci``: 10, derandomized; ``nki-dev``: 20; ``nki-thorough``: 200).

Each test runs once per NKI dialect of ``--nki-dialect`` (default both: the Beta 1 kernel and its
current-``nki`` twin; the ``nki_dialect`` fixture). Our kernels are drawn within the hardware's
limits; a kernel given with ``--nki-kernel`` (a
student's) within the course's contract (``nki_contract``; ``--nki-contract`` overrides).
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nkiverify import strategies

DTYPES = strategies.DTYPES

# The fixtures (backend, report recorder) hold no per-example state.
relaxed = settings(suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow, HealthCheck.data_too_large])


def _verify(case, nki_verify):
    nki_verify(case.kernel, case.params, case.dtype, case_id=case.id, seed=case.seed,
               dist=case.dist)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", ["naive", "tiled", "stream"])
@relaxed
@given(data=st.data())
def test_vector_add(kernel, dtype, data, nki_target, nki_verify, nki_contract,
                     nki_dialect):
    case = data.draw(strategies.kernel_cases(kernel, dtype=dtype, target=nki_target,
                                             contract=nki_contract(kernel),
                                             **({"max_tiles": 8} if kernel == "tiled" else {})),
                     label="case")
    _verify(case, nki_verify)


@pytest.mark.parametrize("dtype", DTYPES)
@relaxed
@given(data=st.data())
def test_transpose(dtype, data, nki_target, nki_verify, nki_contract,
                     nki_dialect):
    case = data.draw(strategies.kernel_cases("transpose", dtype=dtype, target=nki_target,
                                             contract=nki_contract("transpose")),
                     label="case")
    _verify(case, nki_verify)


@pytest.mark.parametrize("dtype", DTYPES)
@relaxed
@given(data=st.data())
def test_conv2d(dtype, data, nki_target, nki_verify, nki_contract,
                     nki_dialect):
    case = data.draw(strategies.kernel_cases("conv2d", dtype=dtype, target=nki_target,
                                             contract=nki_contract("conv2d")),
                     label="case")
    _verify(case, nki_verify)
