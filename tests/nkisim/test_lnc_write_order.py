"""The two cores of an LNC 2 launch writing the same HBM bytes with no synchronisation.

nki-library's router_topk (d2ad3a5, `use_indirect_dma_scatter` without `shard_on_tokens`)
has both cores zero-fill the output rows and then scatter the same top-k values into them.
Core 1's zero-fill may land after core 0's scatter, but core 1's own scatter is ordered after
its zero-fill, so every byte ends with the scattered value: the result does not depend on the
order (nkisim.checks, "program instances writing the same HBM bytes with other values"). What
would depend on it stays an error: cores ending with other values, or a core reading those
bytes before the cores synchronise (nisa.core_barrier).

Truth: NumPy for the values; the ordering argument above (each core's writes to a byte are
ordered, the two cores' are not).
"""

import warnings

import numpy as np
import pytest

from nkisim import nki
from nkisim.errors import NKIWarning
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl

RNG = np.random.default_rng(2026)
T, E = 16, 8


def _zero_fill_then_scatter(last_differs=False, read_back=False, barrier=False):
    """out = zeros (T, E), then vals[t] scattered (indirect DMA) to element idx[t] of the
    flattened out, on both cores. ``last_differs``: core 1 scatters other values;
    ``read_back``: each core then reads out back (after a core_barrier if ``barrier``) into
    a second output."""
    @nki.jit
    def kernel(vals, idx):
        pid = nl.program_id(0)
        out = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.shared_hbm)
        copy = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.shared_hbm)
        zero = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zero, value=0.0)
        nisa.dma_copy(dst=out, src=zero)
        v = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
        i = nl.ndarray((T, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=v, src=vals)
        nisa.dma_copy(dst=i, src=idx)
        if last_differs:
            nisa.tensor_scalar(dst=v, data=v, op0=nl.add, operand0=pid * 1.0)
        flat = out.reshape((T * E,))
        nisa.dma_copy(dst=flat.ap([[1, T], [1, 1]], offset=0, vector_offset=i, indirect_dim=0),
                      src=v)
        if read_back:
            if barrier:
                nisa.core_barrier(out, (0, 1))
            h = T // 2
            back = nl.ndarray((h, E), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=back, src=out[pid * h:(pid + 1) * h, :])
            nisa.dma_copy(dst=copy[pid * h:(pid + 1) * h, :], src=back)
            return out, copy
        return out
    return kernel


def _inputs():
    vals = RNG.uniform(1, 2, size=(T, 1)).astype(np.float32)
    cols = RNG.integers(0, E, size=T)
    idx = (np.arange(T) * E + cols).astype(np.int32).reshape(T, 1)
    want = np.zeros((T, E), np.float32)
    want[np.arange(T), cols] = vals[:, 0]
    return vals, idx, want


def test_both_cores_zero_fill_then_scatter_the_same_values_passes_with_a_warning():
    vals, idx, want = _inputs()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always", NKIWarning)
        out = nki.simulate(_zero_fill_then_scatter()[2])(vals, idx)
    np.testing.assert_array_equal(out, want)
    msgs = [str(w.message) for w in ws if issubclass(w.category, NKIWarning)]
    assert any("program instances write `out` without synchronisation" in m and
               "does not depend on their order" in m for m in msgs), msgs


def test_cores_ending_with_other_values_is_an_output_dependency():
    vals, idx, _ = _inputs()
    with pytest.raises(Exception) as info:
        nki.simulate(_zero_fill_then_scatter(last_differs=True)[2])(vals, idx)
    assert info.value.nki_code == "err_unexpected_output_dependencies", str(info.value)
    assert "they end with other values" in str(info.value)


def test_reading_the_bytes_before_the_cores_synchronise_is_an_error():
    """Core 0 reads its rows back before core 1 zero-fills them: on the device core 1's zeros
    may land before that read."""
    vals, idx, _ = _inputs()
    with pytest.raises(Exception) as info:
        nki.simulate(_zero_fill_then_scatter(read_back=True)[2])(vals, idx)
    assert info.value.nki_code == "err_unexpected_output_dependencies", str(info.value)


def test_reading_them_after_a_core_barrier_passes():
    vals, idx, want = _inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NKIWarning)
        out, copy = nki.simulate(_zero_fill_then_scatter(read_back=True, barrier=True)[2])(
            vals, idx)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(copy, want)


@nki.jit
def core1_reads_after_overwriting(a):
    """Core 1 overwrites what core 0 wrote, then reads it back before any barrier: core 0's
    writes may still land in between on the device."""
    pid = nl.program_id(0)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    res = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    if pid == 0:
        nisa.dma_copy(dst=out, src=t)
    else:
        z = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.memset(dst=z, value=0.0)
        nisa.dma_copy(dst=out, src=z)
        nisa.dma_copy(dst=out, src=t)
        u = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=out)
        nisa.dma_copy(dst=res, src=u)
    return out, res


def test_the_overwriting_core_reading_before_a_barrier_is_an_error():
    a = RNG.uniform(1, 2, size=(8, 4)).astype(np.float32)
    with pytest.raises(Exception) as info:
        nki.simulate(core1_reads_after_overwriting[2])(a)
    assert info.value.nki_code == "err_unexpected_output_dependencies", str(info.value)
    assert "what this read sees is not determined" in str(info.value)
