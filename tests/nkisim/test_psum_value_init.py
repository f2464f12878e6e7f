"""``psum += nisa.nc_matmul(...)`` onto PSUM that a non-matmul instruction wrote last.

Truth: the nc_matmul docstring (aws-neuron-sdk, SDK 2.32): "On NeuronCore-v2 and NeuronCore-v3,
matmul accumulating into a PSUM location that was value-initialized by a non-matmul instruction
(e.g., ``memset``, ``tensor_copy``) is not supported and is undefined behavior on hardware";
reference §1.11: the Beta 1 compiler turns the ``nl.zeros`` + ``+=`` pattern into
overwrite-then-accumulate. A bias copied into the accumulator first is a natural conv2d idea.
"""

import numpy as np
import pytest

from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl

RNG = np.random.default_rng(3)
LHS_T = RNG.standard_normal((256, 128)).astype(np.float32)
RHS = RNG.standard_normal((256, 512)).astype(np.float32)
BIAS = RNG.standard_normal((128, 512)).astype(np.float32)


def kernel(init):
    @nki.jit
    def k(lhs_t, rhs, bias):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        if init == "tensor_copy":
            acc[...] = nisa.tensor_copy(nl.load(bias))
        elif init == "memset":
            acc[...] = 0.0
        elif init == "matmul":
            acc[...] = nisa.nc_matmul(nl.load(lhs_t[0:128]), nl.load(rhs[0:128]))
        for i in nl.affine_range(2):
            acc += nisa.nc_matmul(nl.load(lhs_t[i * 128:(i + 1) * 128]),
                                  nl.load(rhs[i * 128:(i + 1) * 128]))
        nl.store(out, nl.copy(acc))
        return out
    return k


@pytest.mark.parametrize("init", ["tensor_copy", "memset"])
def test_accumulating_onto_a_non_matmul_write_is_a_warning(init):
    with pytest.warns(UserWarning, match=rf"accumulates onto PSUM that a non-matmul instruction "
                                         rf"\({init}\) wrote: .*undefined behavior on hardware"):
        nki.simulate_kernel(kernel(init), LHS_T, RHS, BIAS)


@pytest.mark.parametrize("init", ["zeros", "matmul"])
def test_the_documented_groups_are_quiet(init, recwarn):
    got = nki.simulate_kernel(kernel(init), LHS_T, RHS, BIAS)
    want = LHS_T.T @ RHS + (LHS_T[:128].T @ RHS[:128] if init == "matmul" else 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert not [w for w in recwarn if "non-matmul" in str(w.message)]
