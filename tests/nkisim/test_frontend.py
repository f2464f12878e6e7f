"""The real front end's source rewrite of ``and``/``or`` in ``mask=`` arguments (nkisim.frontend).

Truth: AWS's CI-tested doc example nki_nc_match_replace_indices8_mask (aws-neuron-sdk 1db4d74e,
nki/test/test_nki_isa_nc_match_replace8.py) masks with ``(ix < n // 2 and iy < m // 2)`` and
checks the result on exactly the rows and columns both predicates keep; NumPy gives the values.
"""

import numpy as np

from nkisim import beta1 as nki
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl
from nkisim.frontend import rewrite_mask_boolops


@nki.jit
def _masked_exp(a):
    out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    ix, iy = nl.mgrid[0:16, 0:8]
    nl.store(out, nl.zeros((16, 8), dtype=nl.float32))
    t = nl.load(a)
    nl.store(out[ix, iy], nl.exp(t[ix, iy], mask=(ix < 8 and iy < 4)),
             mask=(ix < 8 and iy < 4 or ix >= 16))
    return out


def test_and_in_a_mask_means_both_predicates():
    a = np.random.default_rng(1).random((16, 8), dtype=np.float32)
    out = nki.simulate_kernel(_masked_exp, a)
    want = np.zeros_like(a)
    want[:8, :4] = np.exp(a[:8, :4])
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_functions_without_mask_boolops_are_left_alone():
    def f(x):
        return x > 1 and x < 3          # plain Python: no mask= argument

    assert rewrite_mask_boolops(f) is f


def test_match_replace8_mask_applies_to_vals_partitions():
    # the doc example's pattern: max8 under a partition+column mask, then nc_match_replace8 whose
    # mask is data's; `vals` [P, 8] is read only on the partitions the mask keeps
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:128, 0:64]
        t = nl.load(a)
        mx = nisa.max8(src=t[ix, iy], mask=(ix < 64 and iy < 32))
        r = nisa.nc_match_replace8(data=t[ix, iy], vals=mx, imm=-1.0, mask=(ix < 64 and iy < 32))
        nl.store(out, nl.zeros((128, 64), dtype=nl.float32))
        nl.store(out[ix, iy], r, mask=(ix < 64 and iy < 32))
        return out

    a = np.random.default_rng(2).permutation(128 * 64).reshape(128, 64).astype(np.float32)
    out = nki.simulate_kernel(kernel, a)
    want = np.zeros_like(a)
    sub = a[:64, :32].copy()
    top8 = np.argsort(-sub, axis=1)[:, :8]
    np.put_along_axis(sub, top8, -1.0, axis=1)
    want[:64, :32] = sub
    np.testing.assert_array_equal(out, want)
