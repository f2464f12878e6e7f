"""The ``nki.isa`` ops of AWS's stubs the current face lacked: ``get_nc_sub_version``,
``tensor_scalar_cumulative``, ``activate2``, ``exponential``, ``topk`` and the engines' random
number generators (``rng``, ``rand2``, ``set_rng_seed``, ``rand_set_state``,
``rand_get_state``).

Truth: the docstrings of the SDK 2.32 (NKI 0.6.0) stubs (their pseudocode and constraints,
quoted in nkisim/accumulate.py, nkisim/topk.py, nkisim/prng.py), the releases that added each
name (spec nki-current.md §1), Marsaglia's XORWOW (2003, §3.1, the algorithm the docs name),
and NumPy / plain Python loops written here for every value. nkisim simulates trn1 and trn2;
the ops "Available only on NeuronCore-v4 and newer" are errors there and are checked on a
stand-in v4 target (the ``trn3`` fixture).
"""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from nki_tiles import load, out_of, ps, sb

import nkisim.arch as arch
import nkisim.nki as nki
from nkisim import ops
from nkisim.cost import params_for, stream_cycles
from nkisim.nki import isa as nisa
from nkisim.nki import language as nl
from nkisim.runtime import last_run

RNG = np.random.default_rng(2032)
BF16 = np.dtype(ml_dtypes.bfloat16)
M32 = 0xFFFFFFFF
# tokens of nl the face may not define yet (language.py is another engineer's): the docs'
# names, which nkisim recognises by name
BYPASS = getattr(nl, "bypass", "bypass")


def prelu(x):          # stands for nl.prelu, an opaque activation token named prelu
    raise AssertionError("a token, never called")


def rand(shape, lo=-2.0, hi=2.0, dtype=np.float32):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def const(value, dtype=np.float32, shape=(1, 1)):
    """An SBUF tile holding ``value`` (a memset)."""
    t = sb(shape, dtype)
    nisa.memset(t, float(value) if np.dtype(dtype).kind == "f" or dtype == BF16 else int(value))
    return t


def instrs(op):
    return [i for i in last_run().trace.instrs if i.op == op]


@pytest.fixture
def trn3(monkeypatch):
    """A stand-in NeuronCore-v4 target: trn2's limits with nc_version 4 (nkisim.arch has no
    trn3 yet)."""
    monkeypatch.setitem(arch.TARGETS, "trn3",
                        dataclasses.replace(arch.TRN2, name="trn3", nc_version=4))
    monkeypatch.setenv("NKISIM_TARGET", "trn3")
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)


@pytest.fixture
def trn1(monkeypatch):
    monkeypatch.setenv("NKISIM_TARGET", "trn1")
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)


@pytest.fixture(autouse=True)
def _trn2_default(monkeypatch):
    monkeypatch.delenv("NKISIM_TARGET", raising=False)
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    monkeypatch.delenv("NKISIM_NKI_VERSION", raising=False)


# ---------------------------------------------------------------------------------------------
# the names each release added


@pytest.mark.parametrize("name,added", [("activate2", "0.4"), ("get_nc_sub_version", "0.5"),
                                        ("topk", "0.6")])
def test_names_appear_in_the_release_that_added_them(monkeypatch, name, added):
    major, minor = map(int, added.split("."))
    monkeypatch.setenv("NKISIM_NKI_VERSION", f"{major}.{minor - 1}")
    assert not hasattr(nisa, name)
    with pytest.raises(AttributeError, match=rf"no attribute '{name}' \(added in NKI "
                                             rf"{added}\.0; NKISIM_NKI_VERSION=0\.{minor - 1}\)"):
        getattr(nisa, name)
    monkeypatch.setenv("NKISIM_NKI_VERSION", added)
    assert callable(getattr(nisa, name)) and getattr(nisa, name).__name__ == name


@pytest.mark.parametrize("name", ["tensor_scalar_cumulative", "exponential", "rng", "rand2",
                                  "set_rng_seed", "rand_set_state", "rand_get_state"])
def test_names_of_the_earliest_stubs_are_in_every_release(monkeypatch, name):
    monkeypatch.setenv("NKISIM_NKI_VERSION", "0.3")
    assert callable(getattr(nisa, name))


def test_get_nc_sub_version_is_the_first_revision():
    seen = []

    @nki.jit
    def k():
        seen.append(nisa.get_nc_sub_version())

    k()
    assert seen == [0] and nisa.get_nc_sub_version() == 0


def test_ops_still_unsimulated_say_so():
    @nki.jit
    def k():
        nisa.quantize_mx(None, None, None)

    with pytest.raises(NotImplementedError, match="nki.isa.quantize_mx is not supported"):
        k()


# ---------------------------------------------------------------------------------------------
# tensor_scalar_cumulative


def cumulative_ref(x, op0, imm0, op1, reg):
    """The docstring's pseudocode, element by element in fp32: ``reg = op1(op0(in[i], imm0),
    reg); out[i] = reg`` along each partition's flattened free elements."""
    f = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b,
         "multiply": lambda a, b: a * b, "maximum": max, "minimum": min}
    P = x.shape[0]
    flat = x.reshape(P, -1).astype(np.float32)
    out = np.empty_like(flat)
    for p in range(P):
        r = np.float32(reg[p] if np.ndim(reg) else reg)
        i0 = np.float32(imm0[p] if np.ndim(imm0) else imm0)
        for i in range(flat.shape[1]):
            r = np.float32(f[op1](np.float32(f[op0](flat[p, i], i0)), r))
            out[p, i] = r
    return out.reshape(x.shape)


@pytest.mark.parametrize("op0,op1,init", [
    ("multiply", "add", 0.0), ("add", "maximum", -np.inf), ("subtract", "minimum", np.inf),
    ("multiply", "multiply", 1.0), ("add", "subtract", 0.0)])
def test_tensor_scalar_cumulative_follows_the_pseudocode(op0, op1, init):
    a = rand((8, 3, 4), 0.5, 1.5)

    @nki.jit
    def k(x):
        d = sb(x.shape)
        nisa.tensor_scalar_cumulative(d, load(x), getattr(nl, op0), getattr(nl, op1), 1.25)
        return out_of(d)

    np.testing.assert_allclose(k(a), cumulative_ref(a, op0, 1.25, op1, init), rtol=1e-6)
    (i,) = instrs("tensor_scalar_cumulative")
    assert i.engine == "vector" and (i.partitions, i.free) == (8, 12)
    assert len(i.reads) == 1 and len(i.writes) == 1 and i.writes[0].buffer == "sbuf"


def test_tensor_scalar_cumulative_register_carries_over_and_loads_imm1():
    """reduce_cmd=reduce continues from the register the previous call left; load_reduce
    starts from imm1 (a (P, 1) float32 tile here); the output is cast to dst.dtype."""
    a, b = rand((4, 6)), rand((4, 6))
    start = rand((4, 1), 10, 20)

    @nki.jit
    def k(x, y, s):
        d1, d2, d3 = sb(x.shape), sb(x.shape, BF16), sb(x.shape)
        nisa.tensor_scalar_cumulative(d1, load(x), nl.add, nl.add, 0.0)
        nisa.tensor_scalar_cumulative(d2, load(y), nl.add, nl.add, 0.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.tensor_scalar_cumulative(d3, load(y), nl.multiply, nl.add, 2.0, imm1=load(s),
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
        return out_of(d1), out_of(d2), out_of(d3)

    o1, o2, o3 = k(a, b, start)
    want1 = cumulative_ref(a, "add", 0.0, "add", 0.0)
    np.testing.assert_allclose(o1, want1, rtol=1e-6)
    want2 = cumulative_ref(b, "add", 0.0, "add", want1[:, -1])
    assert o2.dtype == BF16
    np.testing.assert_array_equal(o2, want2.astype(BF16))
    np.testing.assert_allclose(o3, cumulative_ref(b, "multiply", 2.0, "add", start[:, 0]),
                               rtol=1e-6)


def test_tensor_scalar_cumulative_takes_a_vector_imm0_and_narrow_integers():
    a = RNG.integers(-3, 4, size=(6, 5)).astype(np.int16)
    scale = rand((6, 1), 1, 3)

    @nki.jit
    def k(x, s):
        d = sb(x.shape, np.int16)
        nisa.tensor_scalar_cumulative(d, load(x), nl.multiply, nl.add, load(s))
        return out_of(d)

    want = np.rint(cumulative_ref(a.astype(np.float32), "multiply", scale[:, 0], "add", 0.0))
    np.testing.assert_array_equal(k(a, scale), want.astype(np.int16))


@pytest.mark.parametrize("case,exc,msg", [
    ("int32", TypeError, "operand 'src' of 'tensor_scalar_cumulative' has dtype int32"),
    ("imm0_bf16", TypeError, "operand 'imm0' .* has dtype bfloat16; .* float32"),
    ("op1_divide", ValueError, "op1 is limited to add, subtract, multiply, maximum, minimum"),
    ("op0_compare", ValueError, "op0 must be an arithmetic op"),
    ("load_no_imm1", ValueError, "load_reduce loads imm1 .* pass imm1"),
    ("shape", ValueError, r"dst\[4, 5\], src\[4, 6\].* same partitions"),
    ("hbm", AssertionError, "tensor_scalar_cumulative dst must be in SBUF or PSUM"),
])
def test_tensor_scalar_cumulative_errors(case, exc, msg):
    a = rand((4, 6))

    @nki.jit
    def k(x, xi):
        src = load(x)
        d = sb(x.shape)
        kw = dict(op0=nl.add, op1=nl.add, imm0=1.0)
        if case == "int32":
            src = load(xi)
        elif case == "imm0_bf16":
            kw["imm0"] = const(1.0, BF16, (4, 1))
        elif case == "op1_divide":
            kw["op1"] = nl.divide
        elif case == "op0_compare":
            kw["op0"] = nl.greater
        elif case == "load_no_imm1":
            kw["reduce_cmd"] = nisa.reduce_cmd.load_reduce
        elif case == "shape":
            d = sb((4, 5))
        elif case == "hbm":
            d = ops.ndarray(x.shape, np.float32, buffer=ops.shared_hbm)
        nisa.tensor_scalar_cumulative(d, src, **kw)

    with pytest.raises(exc, match=msg) as e:
        k(a, a.astype(np.int32))
    assert isinstance(e.value, nisa.NkiValidationError)


def test_tensor_scalar_cumulative_commands_the_docs_do_not_define_are_unsupported():
    @nki.jit
    def k(x):
        nisa.tensor_scalar_cumulative(sb(x.shape), load(x), nl.add, nl.add, 1.0,
                                      reduce_cmd=nisa.reduce_cmd.idle)

    with pytest.raises(NotImplementedError, match="reduce_cmd=idle is not supported by nkisim"):
        k(rand((2, 3)))


# ---------------------------------------------------------------------------------------------
# the NeuronCore-v4 ops on trn1 / trn2


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("op", ["exponential", "activate2", "rand2"])
def test_v4_only_ops_are_errors_on_the_simulated_targets(monkeypatch, target, op):
    monkeypatch.setenv("NKISIM_TARGET", target)

    @nki.jit
    def k(x):
        t, d = load(x), sb(x.shape)
        if op == "exponential":
            nisa.exponential(d, t)
        elif op == "activate2":
            nisa.activate2(d, nl.exp, t, 1.0, 0.0, nl.multiply, BYPASS)
        else:
            nisa.rand2(d, 0.0, 1.0)

    with pytest.raises(nisa.NkiValidationError,
                       match=rf"nki.isa.{op}: available only on NeuronCore-v4 \(trn3\) and "
                             rf"newer, not on {target}"):
        k(rand((2, 3)))


# ---------------------------------------------------------------------------------------------
# exponential


def test_exponential_values_and_the_sum_of_exponentials(trn3):
    a, b = rand((8, 2, 5)), rand((8, 10))
    m = rand((8, 1))

    @nki.jit
    def k(x, y, mv):
        d1, d2, d3 = sb(x.shape), sb(y.shape, BF16), sb(y.shape)
        r1, r2, r3 = sb((8, 1)), sb((8, 1)), ps((8, 1))
        nisa.exponential(d1, load(x), max_value=load(mv), reduce_res=r1,
                         reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.exponential(d2, load(y), max_value=0.5, reduce_res=r2,
                         reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.exponential(d3, load(y), reduce_res=r3, reduce_cmd=nisa.reduce_cmd.load_reduce,
                         reduce_init=10.0)
        return out_of(d1), out_of(d2), out_of(d3), out_of(r1), out_of(r2), out_of(r3)

    o1, o2, o3, s1, s2, s3 = k(a, b, m)
    e1 = np.exp(a.astype(np.float64) - m[:, :, None])
    e2 = np.exp(b.astype(np.float64) - 0.5)
    e3 = np.exp(b.astype(np.float64))
    np.testing.assert_allclose(o1, e1, rtol=1e-6)
    assert o2.dtype == BF16
    np.testing.assert_allclose(o2.astype(np.float64), e2, rtol=2 ** -8)
    np.testing.assert_allclose(o3, e3, rtol=1e-6)
    np.testing.assert_allclose(s1[:, 0], e1.reshape(8, -1).sum(1), rtol=1e-5)
    np.testing.assert_allclose(s2[:, 0], e1.reshape(8, -1).sum(1) + e2.sum(1), rtol=1e-5)
    np.testing.assert_allclose(s3[:, 0], 10.0 + e3.sum(1), rtol=1e-5)
    ins = instrs("exponential")
    assert len(ins) == 3 and {i.engine for i in ins} == {"vector"}
    assert [len(i.writes) for i in ins] == [2, 2, 2] and ins[0].free == 10


def test_exponential_shares_the_vector_accumulator_with_tensor_scalar_cumulative(trn3):
    """"The accumulator registers are shared across Vector Engine accumulation instructions
    including nki.isa.exponential" (tensor_scalar_cumulative docs): a cumulative sum with
    reduce_cmd=reduce starts from the exponentials' sum."""
    a, b = rand((4, 6)), rand((4, 3))

    @nki.jit
    def k(x, y):
        nisa.exponential(sb(x.shape), load(x), reduce_cmd=nisa.reduce_cmd.reset_reduce)
        d = sb(y.shape)
        nisa.tensor_scalar_cumulative(d, load(y), nl.add, nl.add, 0.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)
        return out_of(d)

    start = np.exp(a.astype(np.float64)).sum(1)
    np.testing.assert_allclose(k(a, b), start[:, None] + np.cumsum(b, axis=1), rtol=1e-5)


@pytest.mark.parametrize("case,msg", [
    ("init", "reduce_init should be unset or set to 0.0 when reduce_cmd is not load_reduce"),
    ("reset", "reduce_cmd reset is not supported; use idle, reset_reduce, reduce or "
              "load_reduce"),
    ("dst_u32", "operand 'dst' of 'exponential' has dtype uint32"),
    ("rank5", "exceed max supported number of dimensions of 4"),
    ("res_int", "operand 'reduce_res' of 'exponential' has dtype int32"),
    ("res_shape", r"reduce_res must be a \(4, 1\) tile"),
])
def test_exponential_errors(trn3, case, msg):
    @nki.jit
    def k(x):
        t, d = load(x), sb(x.shape)
        kw = {}
        if case == "init":
            kw = dict(reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_init=1.0)
        elif case == "reset":
            kw = dict(reduce_cmd=nisa.reduce_cmd.reset)
        elif case == "dst_u32":
            d = sb(x.shape, np.uint32)
        elif case == "rank5":
            t, d = load(x.reshape(4, 1, 1, 2, 3)), sb((4, 1, 1, 2, 3))
        elif case == "res_int":
            kw = dict(reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=sb((4, 1), np.int32))
        elif case == "res_shape":
            kw = dict(reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=sb((4, 2)))
        nisa.exponential(d, t, **kw)

    with pytest.raises(nisa.NkiValidationError, match=msg):
        k(rand((4, 6)))


# ---------------------------------------------------------------------------------------------
# activate2


def test_activate2_the_three_stages(trn3):
    a = rand((8, 4, 3))
    imm = rand((8, 1))
    alpha = rand((8, 1), 0.1, 0.3)

    @nki.jit
    def k(x, im, al):
        t = load(x)
        d1, d2, d3, d4 = sb(x.shape), sb(x.shape, BF16), sb(x.shape), ps(x.shape)
        nisa.activate2(d1, nl.exp, t, 2.0, 0.5, nl.multiply, nl.add)
        nisa.activate2(d2, nl.tanh, t, load(im), 0.25, nl.subtract, BYPASS, reverse0=True)
        nisa.activate2(d3, prelu, t, 3.0, load(im), nl.multiply, nl.subtract, relu_param=load(al),
                       reverse1=True)
        nisa.activate2(d4, nl.copy, t, 0.0, 0.0, BYPASS, BYPASS)
        return out_of(d1), out_of(d2), out_of(d3), out_of(d4)

    o1, o2, o3, o4 = k(a, imm, alpha)
    x = a.astype(np.float64)
    np.testing.assert_allclose(o1, np.exp(x * 2 + 0.5), rtol=1e-6)
    np.testing.assert_allclose(o2.astype(np.float64), np.tanh(imm[:, :, None] - x),
                               rtol=2 ** -8, atol=2 ** -9)
    v = imm[:, :, None] - x * 3
    np.testing.assert_allclose(o3, np.where(v >= 0, v, alpha[:, :, None] * v), rtol=1e-6)
    np.testing.assert_array_equal(o4, a)
    ins = instrs("activate2")
    assert len(ins) == 4 and {i.engine for i in ins} == {"scalar"}
    assert (ins[0].partitions, ins[0].free) == (8, 12)


def test_activate2_reductions_in_the_scalar_accumulators(trn3):
    a, b = rand((4, 6)), rand((4, 6))

    def kernel(reduce_op, second):
        @nki.jit
        def k(x, y):
            r1, r2 = sb((4, 1)), sb((4, 1))
            nisa.activate2(sb(x.shape), nl.copy, load(x), 1.0, 0.0, nl.multiply, BYPASS,
                           reduce_op=reduce_op, reduce_res=r1,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
            nisa.activate2(sb(y.shape), nl.copy, load(y), 1.0, 0.0, nl.multiply, BYPASS,
                           reduce_op=reduce_op, reduce_res=r2, reduce_cmd=second)
            return out_of(r1), out_of(r2)
        return k

    cmd = nisa.reduce_cmd
    s1, s2 = kernel(nl.add, cmd.reduce)(a, b)
    # fp32 sums of 6 and 12 terms in an order NumPy need not share: within n * eps32 * sum|x|
    # (a relative tolerance alone fails a row whose sum nearly cancels; RNG is shared by the
    # file's tests, so the draws depend on which ran before in the worker)
    eps = np.finfo(np.float32).eps
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(s1[:, 0], a64.sum(1), rtol=0,
                               atol=6 * eps * np.abs(a64).sum(1).max())
    np.testing.assert_allclose(s2[:, 0], a64.sum(1) + b64.sum(1), rtol=0,
                               atol=12 * eps * (np.abs(a64).sum(1) + np.abs(b64).sum(1)).max())
    m1, m2 = kernel(nl.maximum, cmd.idle)(a, b)      # idle: the register as it was
    np.testing.assert_array_equal(m1, m2)
    np.testing.assert_array_equal(m1[:, 0], a.max(1))
    _, z = kernel(nl.minimum, cmd.reset)(a, b)        # reset: the identity, nothing reduced
    assert np.all(z == np.inf)
    x1, x2 = kernel(nl.abs_max, cmd.reduce)(a, b)     # the token (a v4-only nl function)
    both = np.concatenate([a, b], axis=1)
    np.testing.assert_array_equal(x1[:, 0], a[np.arange(4), np.abs(a).argmax(1)])
    np.testing.assert_array_equal(x2[:, 0], both[np.arange(4), np.abs(both).argmax(1)])


@pytest.mark.parametrize("case,msg", [
    ("pair", r"\(op0, op1\) = \(add, add\) is not one of the supported combinations"),
    ("op1_alone", "op1 requires op0 to be set"),
    ("reverse1", "reverse1 requires op1 to be set"),
    ("imm_dtypes", r"all immediates \(imm0, imm1\) must have the same dtype when both are "
                   "tensors, got float32 and bfloat16"),
    ("no_reduce_op", "reduce_cmd=reset_reduce needs reduce_op"),
    ("reduce_op", "reduce_op multiply is not supported"),
    ("shape", r"data\[4, 6\], dst\[4, 5\]"),
])
def test_activate2_errors(trn3, case, msg):
    @nki.jit
    def k(x):
        t, d = load(x), sb(x.shape)
        a = [d, nl.exp, t, 1.0, 2.0, nl.multiply, nl.add]
        kw = {}
        if case == "pair":
            a[5] = nl.add
        elif case == "op1_alone":
            a[5] = BYPASS
        elif case == "reverse1":
            a[6], kw = BYPASS, dict(reverse1=True)
        elif case == "imm_dtypes":
            a[3], a[4] = const(1.0, np.float32, (4, 1)), const(1.0, BF16, (4, 1))
        elif case == "no_reduce_op":
            kw = dict(reduce_cmd=nisa.reduce_cmd.reset_reduce)
        elif case == "reduce_op":
            kw = dict(reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.multiply)
        elif case == "shape":
            a[0] = sb((4, 5))
        nisa.activate2(*a, **kw)

    with pytest.raises(nisa.NkiValidationError, match=msg):
        k(rand((4, 6)))


def test_activate2_load_reduce_is_not_supported(trn3):
    @nki.jit
    def k(x):
        nisa.activate2(sb(x.shape), nl.exp, load(x), 1.0, 0.0, nl.multiply, BYPASS,
                       reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.load_reduce)

    with pytest.raises(NotImplementedError, match="activate2 reduce_cmd=load_reduce"):
        k(rand((2, 3)))


# ---------------------------------------------------------------------------------------------
# topk


def snake_topk(src, n, K):
    """Per 16-partition group, the snake ``src[16 g + e % 16, e // 16]`` for e < n, its K
    largest values ascending and their snake indices (distinct values: no ties)."""
    vals, idx = [], []
    for g in range(src.shape[0] // 16):
        block = src[16 * g:16 * (g + 1)].astype(np.float32)
        snake = block.T.reshape(-1)[:n]            # column 0 is elements 0..15, column 1 ...
        top = sorted(range(n), key=lambda e: snake[e])[-K:]
        vals += [[snake[e] for e in top]] * 16
        idx += [top] * 16
    return np.array(vals, np.float32), np.array(idx, np.uint32)


def test_topk_of_each_16_partition_snake():
    n, K = 42, 8
    src = np.full((32, 4), 1000.0, np.float32)       # elements past n: larger, and ignored
    for g in range(2):
        block = RNG.permutation(200)[:48].astype(np.float32) - 100   # exact in bf16
        src[16 * g:16 * (g + 1), :3] = block.reshape(3, 16).T
    src = src.astype(BF16)
    want_v, want_i = snake_topk(src, n, K)
    assert want_v.max() < 1000

    @nki.jit
    def k(s):
        v, i = sb((32, K), BF16), sb((32, K), np.uint32)
        h = nisa.topk(val_dst=v, idx_dst=i, src=load(s), n=n, name="tk")
        assert h.name == "tk"
        return out_of(v), out_of(i)

    v, i = k(src)
    np.testing.assert_array_equal(v.astype(np.float32), want_v)
    np.testing.assert_array_equal(i, want_i)
    (ins,) = instrs("topk")
    assert ins.engine == "gpsimd" and len(ins.writes) == 2
    # "Estimated instruction cost: 4*n + K GpSIMD Engine cycles per partition"
    assert stream_cycles(ins, params_for("trn2")) == 4 * n + K


@pytest.mark.parametrize("case,msg", [
    ("src_f32", "operand 'src' of 'topk' has dtype float32; .* bfloat16"),
    ("idx_i32", "operand 'idx_dst' of 'topk' has dtype int32; .* uint32"),
    ("p24", "partition dim must be a multiple of 16, got 24"),
    ("n_small", "8 <= n < 65536, got n=7"),
    ("k_big", r"1 <= K < 32768 and K <= n, got K=9 \(val_dst free dim\), n=8"),
    ("src_short", r"src free dim >= ceil\(n / 16\) = 4, got 3"),
    ("psum", "topk val_dst must be in SBUF, got PSUM"),
])
def test_topk_errors(case, msg):
    @nki.jit
    def k():
        P, F, n, K = 16, 3, 40, 8
        if case == "p24":
            P = 24
        src_dt = np.float32 if case == "src_f32" else BF16
        s = const(0, src_dt, (P, F))
        v = (ps if case == "psum" else sb)((P, K), BF16)
        i = sb((P, K), np.int32 if case == "idx_i32" else np.uint32)
        if case == "n_small":
            n = 7
        elif case == "k_big":
            n, v, i = 8, sb((P, 9), BF16), sb((P, 9), np.uint32)
        elif case == "src_short":
            n = 49
        nisa.topk(v, i, s, n)

    with pytest.raises(nisa.NkiValidationError, match=msg):
        k()


# ---------------------------------------------------------------------------------------------
# random numbers: XORWOW state, rng, set_rng_seed


def xorwow(words, count):
    """Marsaglia 2003 §3.1 xorwow in Python ints: (draws, state after)."""
    x, y, z, w, v, d = (int(a) for a in words)
    out = []
    for _ in range(count):
        t = x ^ (x >> 2)
        x, y, z, w = y, z, w, v
        v = (v ^ (v << 4) ^ t ^ (t << 1)) & M32
        d = (d + 362437) & M32
        out.append((d + v) & M32)
    return out, [x, y, z, w, v, d]


def test_gpsimd_rng_is_xorwow_from_the_state_rand_set_state_loads():
    """rand_set_state (GpSimd: 6 uint32 words per lane) then rng: each partition's elements are
    its lane's XORWOW draws in order; rand_get_state returns the state after them."""
    state = RNG.integers(1, 2 ** 32, size=(4, 6), dtype=np.uint64).astype(np.uint32)

    @nki.jit
    def k(s):
        nisa.rand_set_state(load(s))
        r = sb((4, 5), np.uint32)
        nisa.rng(r, engine=nisa.engine.gpsimd)
        g = sb((4, 6), np.uint32)
        nisa.rand_get_state(g)
        return out_of(r), out_of(g)

    r, g = k(state)
    for p in range(4):
        draws, after = xorwow(state[p], 5)
        assert r[p].tolist() == draws
        assert g[p].tolist() == after
    assert [i.engine for i in instrs("rng")] == ["gpsimd"]
    assert [(i.op, i.engine) for i in last_run().trace.instrs
            if i.op.startswith("rand_")] == [("rand_set_state", "gpsimd"),
                                             ("rand_get_state", "gpsimd")]


def test_vector_state_is_four_xorwow_generators_per_lane(trn3):
    """Vector: 24 words per lane (4 generators of 6); element j draws from generator j % 4."""
    state = RNG.integers(1, 2 ** 32, size=(2, 24), dtype=np.uint64).astype(np.uint32)

    @nki.jit
    def k(s):
        nisa.rand_set_state(load(s), engine=nisa.engine.vector)
        r = sb((2, 2, 5), np.uint32)
        nisa.rng(r)
        g = ps((2, 24), np.uint32)               # Vector may write PSUM on NeuronCore-v4
        nisa.rand_get_state(g, engine=nisa.engine.vector)
        return out_of(r), out_of(g)

    r, g = k(state)
    for p in range(2):
        gens = [xorwow(state[p, 6 * q:6 * q + 6], len(range(q, 10, 4))) for q in range(4)]
        assert r[p].reshape(-1).tolist() == [gens[j % 4][0][j // 4] for j in range(10)]
        assert g[p].tolist() == sum((gens[q][1] for q in range(4)), [])


def test_rng_truncates_to_the_least_significant_bits():
    """"truncates each 32-bit random value to the specified data type, taking the least
    significant bits": the same seed, as uint32 then as uint8 / int16."""

    def draw(dtype):
        @nki.jit
        def k(seed):
            nisa.set_rng_seed(load(seed))
            r = sb((16, 64), dtype)
            nisa.rng(r)
            return out_of(r)
        return k(np.array([[1234]], np.int32))

    full = draw(np.uint32)
    np.testing.assert_array_equal(draw(np.uint8), (full & 0xFF).astype(np.uint8))
    np.testing.assert_array_equal(draw(np.int16),
                                  (full & 0xFFFF).astype(np.uint16).view(np.int16))
    # 32 random bits: each bit is set about half the time, the words are all different
    bits = (full[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    assert np.all(np.abs(bits.mean(axis=(0, 1)) - 0.5) < 0.08)
    assert len(np.unique(full)) == full.size


def test_set_rng_seed_makes_rng_and_dropout_reproducible():
    a = rand((8, 32), 1, 2)

    def run(seed, seed_dtype=np.int32):
        @nki.jit
        def k(x, s):
            nisa.set_rng_seed(load(s))
            r, d = sb((8, 16), np.uint32), sb(x.shape)
            nisa.rng(r)
            nisa.dropout(d, load(x), 0.5)
            return out_of(r), out_of(d)
        return k(a, np.array([[seed]]).astype(seed_dtype) if seed_dtype != np.float32
                 else np.array([[seed]], np.uint32).view(np.float32))

    r1, d1 = run(7)
    r2, d2 = run(7)
    r3, d3 = run(8)
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_array_equal(d1, d2)
    assert np.mean(r1 != r3) > 0.99 and np.any((d1 == 0) != (d3 == 0))
    # the seed is the value's 32 bits: a float32 with the bits of 7 seeds as 7 does
    rf, _ = run(7, np.float32)
    np.testing.assert_array_equal(rf, r1)
    assert set(np.unique(d1)) <= set(np.unique(a)) | {0.0} and 0.3 < np.mean(d1 == 0) < 0.7
    (s,) = instrs("set_rng_seed")
    assert s.engine == "vector" and s.writes == () and len(s.reads) == 1


def test_rng_without_a_seed_is_the_same_every_run_and_differs_per_engine():
    @nki.jit
    def k():
        a, b = sb((4, 8), np.uint32), sb((4, 8), np.uint32)
        nisa.rng(a)
        nisa.rng(b, engine=nisa.engine.gpsimd)
        return out_of(a), out_of(b)

    a1, b1 = k()
    a2, b2 = k()
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)
    assert np.mean(a1 != b1) > 0.9 and len(np.unique(a1)) == a1.size


def test_rand_get_state_then_set_replays_the_stream():
    @nki.jit
    def k():
        g = sb((8, 6), np.uint32)
        nisa.rand_get_state(g)
        r1, r2 = sb((8, 7), np.uint16), sb((8, 7), np.uint16)
        nisa.rng(r1, engine=nisa.engine.gpsimd)
        nisa.rand_set_state(g)
        nisa.rng(r2, engine=nisa.engine.gpsimd)
        return out_of(r1), out_of(r2)

    r1, r2 = k()
    np.testing.assert_array_equal(r1, r2)


def test_rand_set_state_sets_only_the_lanes_of_its_partitions():
    state = RNG.integers(1, 2 ** 32, size=(3, 6), dtype=np.uint64).astype(np.uint32)

    @nki.jit
    def k(s):
        before = sb((8, 6), np.uint32)
        nisa.rand_get_state(before)
        nisa.rand_set_state(load(s))
        after = sb((8, 6), np.uint32)
        nisa.rand_get_state(after)
        return out_of(before), out_of(after)

    before, after = k(state)
    np.testing.assert_array_equal(after[:3], state)
    np.testing.assert_array_equal(after[3:], before[3:])


@pytest.mark.parametrize("case,exc,msg", [
    ("rng_float", TypeError, "operand 'dst' of 'rng' has dtype float32; .* int8, int16, int32, "
                             "uint8, uint16, uint32"),
    ("rng_tensor", AssertionError, "rng engine tensor is not supported; use vector or gpsimd"),
    ("rng_gpsimd_psum", TypeError, "'dst' of 'rng \\(gpsimd\\)' to be in address space 'sbuf'"),
    ("seed_shape", ValueError, r"src_seeds must be a \[1, 1\] tensor, got \[1, 2\]"),
    ("seed_16bit", TypeError, "'src_seeds' of 'set_rng_seed' has dtype int16; .* 32-bit"),
    ("state_count", ValueError, "src_seeds must be a 2D uint32 tensor of 6 elements per "
                                r"partition for XORWOW on the GpSimd engine, got \[4, 5\]"),
    ("state_int32", TypeError, "'src_seeds' of 'rand_set_state' has dtype int32"),
    ("state_psum", AssertionError, "rand_set_state src_seeds must be in SBUF, got PSUM"),
    ("get_psum_v3", TypeError, "'dst' of 'rand_get_state \\(gpsimd\\)' to be in address space "
                               "'sbuf'"),
    ("vector_state_v3", ValueError, r"rand_set_state on the Vector engine: available only on "
                                    r"NeuronCore-v4 \(trn3\) and newer, not on trn2"),
])
def test_rng_errors(case, exc, msg):
    @nki.jit
    def k():
        if case == "rng_float":
            nisa.rng(sb((4, 4)))
        elif case == "rng_tensor":
            nisa.rng(sb((4, 4), np.uint32), engine=nisa.engine.tensor)
        elif case == "rng_gpsimd_psum":
            nisa.rng(ps((4, 4), np.uint32), engine=nisa.engine.gpsimd)
        elif case == "seed_shape":
            nisa.set_rng_seed(const(1, np.int32, (1, 2)))
        elif case == "seed_16bit":
            nisa.set_rng_seed(const(1, np.int16))
        elif case == "state_count":
            nisa.rand_set_state(const(1, np.uint32, (4, 5)))
        elif case == "state_int32":
            nisa.rand_set_state(const(1, np.int32, (4, 6)))
        elif case == "state_psum":
            nisa.rand_set_state(ps((4, 6), np.uint32))
        elif case == "get_psum_v3":
            nisa.rand_get_state(ps((4, 6), np.uint32))
        elif case == "vector_state_v3":
            nisa.rand_set_state(const(1, np.uint32, (4, 24)), engine=nisa.engine.vector)

    with pytest.raises(exc, match=msg) as e:
        k()
    assert isinstance(e.value, nisa.NkiValidationError)


def test_rng_generations(trn1):
    """"Supported arch versions: NeuronCore-v3+" for rand_set_state / rand_get_state;
    "NeuronCore-v2: Vector" for rng."""
    for call, msg in (
            (lambda: nisa.rand_get_state(sb((4, 6), np.uint32)), "nki.isa.rand_get_state"),
            (lambda: nisa.rand_set_state(sb((4, 6), np.uint32)), "nki.isa.rand_set_state"),
            (lambda: nisa.rng(sb((4, 4), np.uint32), engine=nisa.engine.gpsimd),
             "rng on the GpSimd engine")):
        @nki.jit
        def k(call=call):
            call()

        with pytest.raises(nisa.NkiValidationError,
                           match=rf"{msg}: available only on NeuronCore-v3 \(trn2\) and "
                                 r"newer, not on trn1"):
            k()

    @nki.jit
    def ok():
        r = sb((4, 4), np.int8)
        nisa.rng(r)
        return out_of(r)

    assert ok().dtype == np.int8


# ---------------------------------------------------------------------------------------------
# rand2


def test_rand2_uniform_in_the_range_and_reproducible(trn3):
    lo = rand((16, 1), -5, 0)
    hi = lo + rand((16, 1), 0.5, 3)

    def run(seed):
        @nki.jit
        def k(a, b, s):
            nisa.set_rng_seed(load(s))
            d1, d2, d3 = sb((16, 256)), sb((16, 64), BF16), ps((16, 64), np.int32)
            nisa.rand2(d1, -1.0, 3.0)
            nisa.rand2(d2, load(a), load(b))
            nisa.rand2(d3, 0.0, 100.0)
            return out_of(d1), out_of(d2), out_of(d3)
        return k(lo, hi, np.array([[seed]], np.uint32))

    u1, u2, u3 = run(3)
    assert u1.dtype == np.float32 and u2.dtype == BF16 and u3.dtype == np.int32
    assert u1.min() >= -1.0 and u1.max() <= 3.0
    assert abs(u1.mean() - 1.0) < 0.1 and abs(u1.std() - 4 / np.sqrt(12)) < 0.1
    hist = np.histogram(u1, bins=4, range=(-1, 3))[0]
    assert np.all(np.abs(hist - u1.size / 4) < 0.1 * u1.size / 4)
    v2 = u2.astype(np.float32)
    assert np.all(v2 >= lo.astype(BF16).astype(np.float32)) and \
        np.all(v2 <= hi.astype(BF16).astype(np.float32))
    assert u3.min() >= 0 and u3.max() <= 100 and len(np.unique(u3)) > 50
    for a, b in zip(run(3), (u1, u2, u3)):
        np.testing.assert_array_equal(a, b)
    assert np.mean(run(4)[0] != u1) > 0.99
    assert [i.engine for i in instrs("rand2")] == ["vector"] * 3


def test_rand2_needs_min_below_max(trn3):
    @nki.jit
    def k():
        nisa.rand2(sb((4, 4)), 2.0, 2.0)

    with pytest.raises(nisa.NkiValidationError, match="rand2: min < max for valid range"):
        k()
