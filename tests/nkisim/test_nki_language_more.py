"""The rest of ``nki.language``'s documented API (0.3.0-0.6.0) and the Beta 1 names its face
lacked: ``rms_norm``, ``erf_dx``, ``expand_dims``, ``broadcast_to``, ``all``, ``dropout``,
``gather_flattened``, ``load_transpose2d``, ``rand``/``random_seed``, ``no_reorder``,
``MemoryRegion``/``NkiTensor``, ``abs_max``/``abs_min``.

Truth: AWS's API stubs, whose names and docstrings are quoted below (aws-neuron-sdk
nki/api/nki/language/__init__.py at 03323f7a = SDK 2.29 / NKI 0.3.0, 3afa0fdf = 2.30 / 0.4.0,
a3247f5b = 2.32 / 0.6.0; Beta 1 at 1db4d74e), and NumPy / SciPy for every value. AWS's own
example that needed them (aws-neuron-sdk nki/examples/fused_mamba, ``nl.broadcast_to``) runs in
``benchmarks/conformance.py --sdk-examples``.
"""

import math

import numpy as np
import pytest
import scipy.special

from nkisim import beta1, nki
from nkisim.beta1 import language as bnl
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl
from nkisim.runtime import last_run

RNG = np.random.default_rng(11)

# The callable names of nki.language that AWS's stubs added at 0.3.0 (03323f7a, beyond the
# allocation/range/buffer API of 0.2.0) and 0.4.0 (3afa0fdf), as listed in those files.
STUB_030 = """MemoryRegion NkiTensor all arctan broadcast_to ceil copy cos dropout dynamic_range
empty_like erf erf_dx exp expand_dims floor fmod full gather_flattened gelu gelu_apprx_tanh
gelu_dx is_hbm is_on_chip is_psum is_sbuf load load_transpose2d log matmul max mean min mish mod
negative no_reorder ones prod rand random_seed relu rms_norm sigmoid sign silu silu_dx sin
softmax softplus sqrt square store sum tan tanh transpose trunc var where zeros_like""".split()
STUB_040 = "abs_max abs_min shared_constant bypass prelu".split()
STUB_050 = ["average"]          # ee7d6e00 (SDK 2.31)


def run(body, *arrays):
    return nki.simulate(nki.jit(body))(*arrays)


def run_b1(body, *arrays):
    return beta1.simulate_kernel(beta1.jit(body), *arrays)


def rand(shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def _load_store(fn, shape=None, dtype=np.float32, face=nl):
    """A kernel body: load every input, apply ``fn`` to the tiles, store the result."""
    def body(*ins):
        tiles = [face.load(x) for x in ins]
        r = fn(*tiles)
        out = face.ndarray(shape or r.shape, dtype=r.dtype, buffer=face.shared_hbm)
        face.store(out, r)
        return out
    return body


@pytest.mark.parametrize("name", STUB_030 + STUB_040 + STUB_050)
def test_every_documented_name_exists(name):
    assert hasattr(nl, name), f"nki.language.{name} (AWS stub) is missing"


@pytest.mark.parametrize("name", ["erf_dx", "expand_dims", "gelu_apprx_sigmoid", "gelu_dx",
                                  "silu_dx", "rms_norm"])
def test_beta1_names_exist(name):
    # aws-neuron-sdk 1db4d74e nki/api/nki/language/__init__.py defines each of them
    assert callable(getattr(bnl, name))


# ---------------------------------------------------------------------------------------------
# rms_norm: "x / RMS(x) * w", n "total number of values to calculate rms"


def _rms_ref(x, w, n, eps=1e-6, axis=1):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 ** 2).sum(axis=axis, keepdims=True) / n + eps) * w


@pytest.mark.parametrize("face,runner", [(nl, run), (bnl, run_b1)])
def test_rms_norm_matches_numpy(face, runner):
    x, w = rand((128, 512)), rand((128, 512), 0.5, 1.5)
    got = runner(_load_store(lambda a, b: face.rms_norm(a, b, axis=1, n=512), face=face), x, w)
    np.testing.assert_allclose(got, _rms_ref(x, w, 512), rtol=2e-6, atol=1e-6)


def test_rms_norm_uses_n_not_the_axis_length_and_epsilon():
    x, w = rand((64, 100)), np.ones((64, 100), np.float32)
    got = run(_load_store(lambda a, b: nl.rms_norm(a, b, axis=1, n=400, epsilon=0.5)), x, w)
    np.testing.assert_allclose(got, _rms_ref(x, w, 400, 0.5), rtol=2e-6, atol=1e-6)


def test_rms_norm_over_the_last_axis_of_3d_tiles_and_output_dtype():
    x, w = rand((32, 4, 64)), rand((32, 4, 64))
    got = run(_load_store(lambda a, b: nl.rms_norm(a, b, axis=2, n=64, dtype=nl.bfloat16)),
              x, w)
    assert got.dtype == nl.bfloat16
    ref = _rms_ref(x, w, 64, axis=2)
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=2 ** -8, atol=1e-6)


def test_rms_norm_is_costed_as_square_reduce_rsqrt_multiply():
    x, w = rand((128, 256)), rand((128, 256))
    run(_load_store(lambda a, b: nl.rms_norm(a, b, axis=1, n=256)), x, w)
    ins = [i for i in last_run().trace.instrs if i.op != "dma_copy"]
    assert [(i.op, i.engine) for i in ins] == [("activation", "scalar"), ("activation", "scalar"),
                                               ("tensor_tensor", "vector")]
    # each step reads what the previous one wrote (the schedule orders them by data)
    assert ins[0].writes[0].key == ins[1].reads[0].key
    assert ins[1].writes[0].key in {r.key for r in ins[2].reads}


@pytest.mark.parametrize("kw,msg", [({"n": 0}, "must be > 0"), ({"n": 512, "axis": 0},
                                                                 "partition dimension")])
def test_rms_norm_bad_arguments(kw, msg):
    x, w = rand((128, 512)), rand((128, 512))
    args = {"axis": 1, **kw}
    with pytest.raises(ValueError, match=msg):
        run(_load_store(lambda a, b: nl.rms_norm(a, b, **args)), x, w)


def test_rms_norm_w_must_broadcast_to_x():
    x, w = rand((128, 512)), rand((128, 256))
    with pytest.raises(ValueError, match="w must broadcast"):
        run(_load_store(lambda a, b: nl.rms_norm(a, b, axis=1, n=512)), x, w)


# ---------------------------------------------------------------------------------------------
# erf_dx: "Derivative of the Error function (erf)"


@pytest.mark.parametrize("face,runner", [(nl, run), (bnl, run_b1)])
def test_erf_dx_is_the_derivative_of_erf(face, runner):
    x = rand((128, 64), -3, 3)
    got = runner(_load_store(face.erf_dx, face=face), x)
    h = 1e-5
    x64 = x.astype(np.float64)
    ref = (scipy.special.erf(x64 + h) - scipy.special.erf(x64 - h)) / (2 * h)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_erf_dx_is_an_activation_function_for_nisa_activation():
    # nisa.activation(op=nl.erf_dx) takes it as it takes nl.gelu_dx (one ScalarE instruction)
    x = rand((128, 32), -2, 2)

    def body(a):
        t = nl.load(a)
        r = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(r, op=nl.erf_dx, data=t)
        out = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    got = run(body, x)
    np.testing.assert_allclose(got, 2 / math.sqrt(math.pi) * np.exp(-x.astype(np.float64) ** 2),
                               rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# expand_dims, broadcast_to, all


def test_expand_dims_inserts_an_axis_anywhere_free_in_nki():
    x = rand((16, 8, 4))
    seen = {}

    def body(a):
        t = nl.load(a)
        seen[1], seen[2], seen[3] = (nl.expand_dims(t, i).shape for i in (1, 2, 3))
        seen["tuple"] = nl.expand_dims(t, (3, 4)).shape
        return None
    run(body, x)
    assert seen == {1: (16, 1, 8, 4), 2: (16, 8, 1, 4), 3: (16, 8, 4, 1),
                    "tuple": (16, 8, 4, 1, 1)}


def test_expand_dims_is_a_view_of_the_same_values():
    x = rand((16, 8))
    got = run(_load_store(lambda t: nl.copy(nl.expand_dims(t, 1))), x)
    np.testing.assert_array_equal(got, x[:, None, :])


def test_expand_dims_beta1_only_after_the_last_index():
    # Beta 1 docstring: "Currently only supports expanding dimensions after the last index"
    x = rand((16, 8))
    got = run_b1(_load_store(lambda t: bnl.copy(bnl.expand_dims(t, 2)), face=bnl), x)
    np.testing.assert_array_equal(got, x[:, :, None])
    with pytest.raises(ValueError, match="after the last index"):
        run_b1(_load_store(lambda t: bnl.expand_dims(t, 1), face=bnl), x)


@pytest.mark.parametrize("face,runner", [(nl, run), (bnl, run_b1)])
def test_expand_dims_never_the_partition_dim(face, runner):
    with pytest.raises(ValueError, match="partition dimension"):
        runner(_load_store(lambda t: face.expand_dims(t, 0), face=face), rand((16, 8)))


def test_broadcast_to_partitions_and_free_dims():
    col, row = rand((128, 1)), rand((1, 64))
    got = run(_load_store(lambda t: nl.broadcast_to(t, (128, 64))), col)
    np.testing.assert_array_equal(got, np.broadcast_to(col, (128, 64)))
    got = run(_load_store(lambda t: nl.broadcast_to(t, (128, 64))), row)
    np.testing.assert_array_equal(got, np.broadcast_to(row, (128, 64)))


def test_broadcast_to_same_shape_returns_x_or_a_cast_copy():
    x = rand((32, 16))
    seen = {}

    def body(a):
        t = nl.load(a)
        seen["same"] = nl.broadcast_to(t, (32, 16)) is t
        c = nl.broadcast_to(t, (32, 16), dtype=nl.bfloat16)
        seen["dtype"] = c.dtype
        out = nl.ndarray((32, 16), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, c)
        return out
    got = run(body, x)
    assert seen == {"same": True, "dtype": nl.bfloat16}
    np.testing.assert_array_equal(got, x.astype(nl.bfloat16))


def test_broadcast_to_needs_the_same_rank():
    # "the target shape. Must have the same rank as x"
    with pytest.raises(ValueError, match="same rank"):
        run(_load_store(lambda t: nl.broadcast_to(t, (128, 4, 64))), rand((128, 64)))


def test_all_defaults_to_the_input_dtype_in_nki_and_bool_in_beta1():
    x = (RNG.random((8, 16)) > 0.2).astype(np.float32)
    x[0] = 1.0
    got = run(_load_store(lambda t: nl.all(t, axis=1)), x)
    assert got.dtype == np.float32            # "default to be the same as ... the input tile"
    np.testing.assert_array_equal(got.ravel(), x.all(axis=1).astype(np.float32))
    got = run_b1(_load_store(lambda t: bnl.all(t, axis=1), face=bnl), x)
    assert got.dtype == np.bool_              # Beta 1: `all(x, axis, *, dtype=bool, ...)`
    np.testing.assert_array_equal(got.ravel(), x.all(axis=1))


# ---------------------------------------------------------------------------------------------
# gathers, transposing load, random numbers


def test_gather_flattened_and_its_axis():
    data = rand((128, 8, 16))
    idx = RNG.integers(0, 128, size=(128, 32)).astype(np.uint32)
    got = run(_load_store(lambda d, i: nl.gather_flattened(d, i)), data, idx)
    np.testing.assert_array_equal(got, np.take_along_axis(data.reshape(128, -1),
                                                          idx.astype(np.int64), axis=1))
    with pytest.raises(NotImplementedError, match="axis=0"):
        run(_load_store(lambda d, i: nl.gather_flattened(d, i, axis=1)), data, idx)


def test_load_transpose2d():
    x = rand((64, 128))

    def body(a):
        t = nl.load_transpose2d(a)
        out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out
    np.testing.assert_array_equal(run(body, x), x.T)


def test_rand_same_seed_same_values_in_0_1():
    # random_seed docstring: "Using the same seed will generate the same sequence"
    def body(a):
        seed = nl.full((1, 1), 42, dtype=nl.int32, buffer=nl.sbuf)
        out = nl.ndarray((2, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in range(2):
            nl.random_seed(seed)
            nl.store(out[i], nl.rand((128, 64), dtype=nl.float32))
        return out
    got = run(body, rand((1, 1)))
    np.testing.assert_array_equal(got[0], got[1])
    assert got.min() >= 0.0 and got.max() < 1.0 and got.std() > 0.2


def test_rand_takes_a_buffer_object_only():
    def body(a):
        nl.rand((128, 4), dtype=nl.float32, buffer="sbuf")
        return None
    with pytest.raises(ValueError, match="string buffers"):
        run(body, rand((1, 1)))


def test_dropout_rate_zero_keeps_and_rate_one_zeroes():
    x = rand((128, 64), 0.5, 1.0)
    np.testing.assert_array_equal(run(_load_store(lambda t: nl.dropout(t, 0.0)), x), x)
    np.testing.assert_array_equal(run(_load_store(lambda t: nl.dropout(t, 1.0)), x), 0 * x)


# ---------------------------------------------------------------------------------------------
# no_reorder, MemoryRegion, NkiTensor, abs_max / abs_min


def test_no_reorder_keeps_values_and_refuses_dynamic_loops(monkeypatch):
    x = rand((128, 64))

    def body(a):
        with nl.no_reorder():
            t = nl.load(a)
            r = nl.add(t, t)
        out = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out
    np.testing.assert_array_equal(run(body, x), 2 * x)

    def bad(a):
        with nl.no_reorder():
            nl.fori_loop(0, 2, lambda i: None)
        return None
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.6")
    with pytest.raises(ValueError, match="no_reorder"):
        run(bad, x)

    def after(a):
        with nl.no_reorder():
            pass
        nl.fori_loop(0, 2, lambda i: None)      # outside the block: fine
        return None
    run(after, x)


def test_memory_region_members_are_the_buffers():
    assert nl.MemoryRegion.sbuf is nl.sbuf and nl.MemoryRegion.psum is nl.psum
    assert nl.MemoryRegion.private_hbm is nl.hbm and nl.MemoryRegion.shared_hbm is nl.shared_hbm
    assert isinstance(nl.psum, nl.MemoryRegion) and not isinstance("psum", nl.MemoryRegion)
    x = rand((8, 8))

    def body(a):
        t = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.MemoryRegion.sbuf)
        nisa.dma_copy(t, a)
        assert isinstance(t, nl.NkiTensor)
        out = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.MemoryRegion.shared_hbm)
        nisa.dma_copy(out, t)
        return out
    np.testing.assert_array_equal(run(body, x), x)


def test_abs_max_is_nc_v4_only_and_new_in_0_4(monkeypatch):
    x = rand((8, 8))
    body = _load_store(lambda t: nl.abs_max(t, t))
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.3")
    with pytest.raises(AttributeError, match="0.4.0"):
        run(body, x)
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.6")
    with pytest.raises(ValueError, match="NeuronCore-v4"):
        run(body, x)


# nki.collectives at 0.6.0 (a3247f5b nki/api/nki/collectives/__init__.py): every function it
# documents imports and says it is not simulated (nor by AWS's CPU simulator)
STUB_COLLECTIVES = """all_reduce all_gather all_gather_v reduce_scatter all_to_all all_to_all_v
collective_permute collective_permute_implicit collective_permute_implicit_reduce
collective_permute_implicit_current_processing_rank_id rank_id""".split()


@pytest.mark.parametrize("name", STUB_COLLECTIVES)
def test_every_documented_collective_is_named_and_not_simulated(name):
    from nkisim.nki import collectives
    with pytest.raises(NotImplementedError, match="not simulated"):
        getattr(collectives, name)()


def test_like_constructors_follow_the_0_6_signatures():
    # STUB-R32: zeros_like(x, dtype=None, buffer=None, name='') "defaults to sbuf";
    # empty_like(x, ...): dtype and buffer "default: same as x"
    seen = {}

    def body(a):
        p = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.psum)
        z = nl.zeros_like(x=p, dtype=nl.bfloat16)
        e = nl.empty_like(p)
        seen["z"] = (z.buffer.kind, z.dtype, z.shape)
        seen["e"] = (e.buffer.kind, e.dtype, e.shape)
        return None
    run(body, rand((1, 1)))
    assert seen == {"z": ("sbuf", nl.bfloat16, (128, 8)), "e": ("psum", np.float32, (128, 8))}


def test_shared_identity_matrix_into_dst():
    def body(a):
        ident = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        r = nl.shared_identity_matrix(64, dtype=nl.float32, dst=ident)
        assert r is ident
        out = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, ident)
        return out
    np.testing.assert_array_equal(run(body, rand((1, 1))), np.eye(64, dtype=np.float32))

    def bad(a):
        nl.shared_identity_matrix(64, dst=nl.ndarray((64, 32), dtype=nl.uint8, buffer=nl.sbuf))
        return None
    with pytest.raises(ValueError, match=r"dst must be an \(64, 64\) SBUF tensor"):
        run(bad, rand((1, 1)))


@pytest.mark.parametrize("call", [
    lambda t: nl.add(t, t, mask=True),
    lambda t: nl.exp(t, mask=True),
    lambda t: nl.sum(t, axis=1, mask=True),
    lambda t: nl.copy(t, mask=True),
    lambda t: nl.where(t, t, t, mask=True),
    lambda t: nl.multiply(t, t, dtpye=nl.float32),
])
def test_nki_wrappers_have_no_mask_and_refuse_unknown_keywords(call):
    # nki 0.2.0+: no mask= (RN 2.27); from 2.28 "unknown kwargs raise `unexpected keyword
    # argument`" (spec nki-current §2.0 items 2 and 5)
    with pytest.raises(TypeError, match="unexpected keyword argument '(mask|dtpye)'"):
        run(_load_store(call), rand((8, 16)))


def test_beta1_wrappers_keep_mask():
    # Beta 1: add(x, y, *, dtype=None, mask=None, **kwargs) (aws-neuron-sdk 1db4d74e)
    x = rand((8, 16))

    def f(t):
        i_f = bnl.arange(16)[None, :]
        return bnl.add(t, t, mask=(i_f < 16))
    np.testing.assert_array_equal(run_b1(_load_store(f, face=bnl), x), 2 * x)


def test_op_codes_that_are_not_functions():
    # the stubs declare `average = ...`, `bypass = ...`, `prelu = ...`: op codes for ISA
    # instructions; calling one is a TypeError, and activate2 knows bypass and prelu by name
    for tok in (nl.average, nl.bypass, nl.prelu):
        assert tok.__name__ in repr(tok)
        with pytest.raises(TypeError, match="op code"):
            tok(1)
    from nkisim import accumulate
    assert accumulate._bypass(nl.bypass) and not accumulate._bypass(nl.add)


def test_nki_wrappers_take_dtype_and_keepdims_positionally():
    # STUB-R32: add(x, y, dtype=None), exp(x, dtype=None), sum(x, axis, dtype=None,
    # keepdims=False), where(condition, x, y, dtype=None), copy(x, dtype=None)
    x = rand((8, 16))
    got = run(_load_store(lambda t: nl.add(t, t, nl.bfloat16)), x)
    assert got.dtype == nl.bfloat16
    np.testing.assert_array_equal(got, (2 * x).astype(nl.bfloat16))
    assert run(_load_store(lambda t: nl.exp(t, nl.float16)), x).dtype == np.float16
    assert run(_load_store(lambda t: nl.copy(t, nl.float16)), x).dtype == np.float16
    got = run(_load_store(lambda t: nl.sum(t, 1, nl.float32, True)), x)
    np.testing.assert_allclose(got, x.sum(axis=1, keepdims=True), rtol=1e-6)
    with pytest.raises(TypeError, match="multiple values for argument 'dtype'"):
        run(_load_store(lambda t: nl.add(t, t, nl.float32, dtype=nl.float32)), x)


def test_beta1_wrappers_keep_dtype_keyword_only():
    # Beta 1: add(x, y, *, dtype=None, mask=None, **kwargs): Python's TypeError
    with pytest.raises(TypeError, match=r"add\(\) takes 2 positional arguments but 3"):
        run_b1(_load_store(lambda t: bnl.add(t, t, bnl.float32), face=bnl), rand((8, 16)))


def _dyn_select(h, index, dim=0, chain=False, onchip=False, version="0.6"):
    def body(hbm_t, idx_in):
        idx = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(idx, idx_in)
        src = hbm_t
        if onchip:
            src = nl.ndarray(hbm_t.shape, dtype=hbm_t.dtype, buffer=nl.sbuf)
            nisa.dma_copy(src, hbm_t)
        v = src.select(dim, idx)
        assert v.is_indirect()
        if chain:
            v.select(0, idx)
        o = nl.ndarray(v.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(o, v)
        return o
    return run(body, h, np.array([[index]], np.int32))


def test_dynamic_select_with_a_tensor_index(monkeypatch):
    # NkiTensor.select (0.5.0+ stub): "When index is an NkiTensor ... performs dynamic indirect
    # selection where the index is resolved at runtime"; `hbm_t.select(0, idx)  # shape
    # becomes (128, 8)`; "only one dynamic select per tensor (no chaining)"; "Dynamic on-chip:
    # dim must not be 0 (partition dim)"
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.6")
    h = np.arange(4 * 128 * 8, dtype=np.float32).reshape(4, 128, 8)
    np.testing.assert_array_equal(_dyn_select(h, 2), h[2])
    np.testing.assert_array_equal(_dyn_select(h, 5, dim=2), h[:, :, 5])
    with pytest.raises(IndexError, match="Out-of-bound"):
        _dyn_select(h, 4)
    with pytest.raises(ValueError, match="no chaining"):
        _dyn_select(h, 1, chain=True)
    g = np.arange(128 * 4 * 8, dtype=np.float32).reshape(128, 4, 8)
    np.testing.assert_array_equal(_dyn_select(g, 3, dim=1, onchip=True), g[:, 3, :])
    with pytest.raises(ValueError, match="partition dimension"):
        _dyn_select(g, 3, dim=0, onchip=True)
