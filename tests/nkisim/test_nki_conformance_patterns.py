"""Patterns AWS's own current-dialect code uses that nkisim's nki face does not accept yet
(found running nki-library's simulation tests, benchmarks/conformance.py --nki-library).

Each is a minimal reproducer written here (no corpus code), marked ``xfail(strict=True)`` so it
documents the gap and turns into a failure (to remove the mark) once the face accepts it.
"""

import numpy as np
import pytest

import nkisim.shim

nkisim.shim.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


@pytest.mark.xfail(strict=True, reason=(
    "nki face rejects an integer dge_mode; AWS's nki-library (d2ad3a5, core/subkernels/"
    "norm_tkg_utils.py `_DGE_MODE_NONE = 3`, used by rmsnorm_tkg/layernorm_tkg) passes "
    "dge_mode=3 to nisa.dma_copy, so the SDK it targets accepts it: 7 of 8 sampled "
    "test_rmsnorm_tkg.py tests fail on it"))
def test_dma_copy_accepts_the_integer_dge_mode_aws_library_passes():
    @nki.jit
    def copy(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x, dge_mode=3)
        nisa.dma_copy(dst=out, src=t, dge_mode=3)
        return out

    x = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
    assert np.array_equal(nki.simulate(copy)(x), x)
