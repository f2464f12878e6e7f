"""The engines' pseudo-random number generators: ``rng``, ``rand2``, ``set_rng_seed``,
``rand_set_state`` and ``rand_get_state`` of the current dialect's ``nki.isa`` (STUB-R32 isa).

What the docs fix, nkisim follows:
- each engine keeps its own generator state, one per compute lane (partition), "cached inside
  the engine as a persistent state during the rest of NEFF execution" (set_rng_seed,
  rand_set_state); a logical core's engines are its own (the state lives in ``Run.vector_acc``,
  the engine-register dict nkisim.lnc swaps per program instance);
- the algorithm is XORWOW ("Uses XORWOW PRNG algorithm", rand2) and its state is "6 elements
  (GpSimd) or 24 elements (Vector)" of uint32 per lane (rand_set_state, rand_get_state): what
  ``rand_get_state`` returns, ``rand_set_state`` takes back and the stream goes on from there;
- ``rng`` "generates 32 random bits per element ... taking the least significant bits" of
  each for the integer dtype of ``dst``; ``rand2`` is uniform in [min, max];
- "Using the same seed will generate the same sequence of random numbers" (set_rng_seed).

What they do not fix, so the values differ from the device's (bit-exact hardware streams are
unknowable): how a seed becomes the state (nkisim: splitmix64 of the seed, the engine and the
word index), the state before any seed (nkisim: seed 0, so runs reproduce, as ``nl.rand``'s),
the order of the 24 Vector words (nkisim: four XORWOW generators of six words each, Marsaglia's
x, y, z, w, v then the Weyl counter d; generator g draws elements g, g + 4, g + 8, ... of each
partition, free dims flattened in row-major order), and the XORWOW variant (nkisim: Marsaglia
2003, "Xorshift RNGs", J. Stat. Softw. 8(14), §3.1: ``t = x ^ (x >> 2); x, y, z, w = y, z, w, v;
v = (v ^ (v << 4)) ^ (t ^ (t << 1)); d += 362437; return d + v``).

``nisa.dropout`` draws from the kernel's generator (nkisim.ops._rng, seeded 0 at kernel start
and by ``nl.random_seed``); it runs on the Vector Engine, so seeding the Vector Engine's PRNG
(``set_rng_seed``, ``rand_set_state(engine=vector)``) reseeds it too: dropout is reproducible by
seed like ``rng``.
"""

from __future__ import annotations

import numpy as np

from . import context, dtypes
from .engines import _scalar_operand, require_nc_version
from .errors import nki_error, shape_str
from .ops import _detail, _tile, _tile_shape
from .tensor import Tensor, _free, read, region, write
from .trace import GPSIMD, VECTOR

WORDS = 6                              # XORWOW: x, y, z, w, v and the Weyl counter d
GENERATORS = {GPSIMD: 1, VECTOR: 4}    # 6 or 24 state words per lane (rand_set_state docs)
_WEYL = 362437
_SALT = {GPSIMD: 0x67707364, VECTOR: 0x76656374}   # one seed, different engines' streams

# "The output dst tile must be an integer type: int8, int16, int32, uint8, uint16, or uint32"
_RNG_DTYPES = {np.dtype(t) for t in (np.int8, np.int16, np.int32, np.uint8, np.uint16,
                                     np.uint32)}
# rand2: "float8_e4m3, float8_e5m2, float16, bfloat16, float32, tfloat32, int8, int16, int32,
# uint8, uint16, or uint32"
_RAND2_DTYPES = {dtypes.float8_e4m3, dtypes.float8_e5m2, np.dtype(np.float16), dtypes.bfloat16,
                 dtypes.F32, dtypes.TF32} | _RNG_DTYPES
_U32 = np.dtype(np.uint32)


# ---------------------------------------------------------------------------------------------
# the state


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function (Steele, Lea & Flood 2014)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def seeded_state(seed: int, engine: str, lanes: int) -> np.ndarray:
    """The (lanes, generators, 6) uint32 XORWOW state nkisim derives from a 32-bit seed."""
    n = lanes * GENERATORS[engine] * WORDS
    key = np.uint64((_SALT[engine] << 32) | (int(seed) & 0xFFFFFFFF))
    with np.errstate(over="ignore"):
        z = _mix64(key + np.arange(1, n + 1, dtype=np.uint64) *
                   np.uint64(0x9E3779B97F4A7C15))
    st = (z >> np.uint64(32)).astype(np.uint32).reshape(lanes, GENERATORS[engine], WORDS)
    dead = ~st[..., :5].any(axis=-1)           # all-zero xorshift words stay zero forever
    st[..., 0][dead] = 1
    return st


def _state(run, engine: str) -> np.ndarray:
    key = ("prng", engine)
    st = run.vector_acc.get(key)
    if st is None:
        st = run.vector_acc[key] = seeded_state(0, engine, run.arch.pmax)
    return st


def _lanes(t: Tensor) -> slice:
    """The compute lanes of a tile: its partitions."""
    p0 = region(t).p0
    return slice(p0, p0 + t.shape[0])


def _xorwow(st: np.ndarray, counts) -> np.ndarray:
    """Advance each generator of ``st`` (L, G, 6), in place, by its count of ``counts`` (G,)
    draws; the draws, (L, G, max(counts)) uint32 (past a generator's count: unused)."""
    n = int(max(counts))
    x, y, z, w, v, d = (st[..., i].copy() for i in range(WORDS))
    out = np.empty(st.shape[:2] + (n,), np.uint32)
    partial = min(counts) < n
    for k in range(n):
        t = x ^ (x >> 2)
        nv = (v ^ (v << 4)) ^ (t ^ (t << 1))
        nd = d + np.uint32(_WEYL)
        out[..., k] = nd + nv
        if partial and k == n - 1:
            on = np.asarray(counts) > k            # the generators still drawing
            x, y, z, w = (np.where(on, a, b) for a, b in ((y, x), (z, y), (w, z), (v, w)))
            v, d = np.where(on, nv, v), np.where(on, nd, d)
        else:
            x, y, z, w, v, d = y, z, w, v, nv, nd
    st[...] = np.stack((x, y, z, w, v, d), axis=-1)
    return out


def draw_bits(run, engine: str, lanes: slice, per_lane: int) -> np.ndarray:
    """``per_lane`` random 32-bit words for each lane of ``lanes`` from ``engine``'s state:
    (L, per_lane) uint32, element j of a lane from generator j % G."""
    st = _state(run, engine)
    g = GENERATORS[engine]
    counts = [len(range(i, per_lane, g)) for i in range(g)]
    sub = st[lanes]                                # (a copy for an advanced index; a view here)
    out = _xorwow(sub, counts)
    st[lanes] = sub
    L = out.shape[0]
    return out.transpose(0, 2, 1).reshape(L, -1)[:, :per_lane]


# ---------------------------------------------------------------------------------------------
# instructions


def rng(dst, engine=VECTOR):
    """``dst`` = 32 random bits per element, truncated to its integer dtype's least significant
    bits (nki.isa.rng docs). Vector, or GpSimd from NeuronCore-v3 ("NeuronCore-v2: Vector.
    NeuronCore-v3+: GpSimd, Vector"); GpSimd cannot write PSUM."""
    run = context.current()
    api = "rng"
    d = _tile(dst, api, "dst")
    if d.dtype not in _RNG_DTYPES:
        raise nki_error("nkisim_operand_dtype", param="dst", api=api, dtype=dtypes.name(d.dtype),
                        allowed="int8, int16, int32, uint8, uint16, uint32")
    if engine == GPSIMD:
        require_nc_version(run, "rng on the GpSimd engine", 3)
        if d.root.buffer == "psum":
            raise nki_error("err_unsupported_memory", param="dst", api="rng (gpsimd)",
                            expected="sbuf", got="psum")
    P, F = d.shape[0], _free(d)
    bits = draw_bits(run, engine, _lanes(d), F)
    # the least significant bits: a modular cast, reinterpreted as the (signed) dtype
    vals = bits.astype(np.dtype(f"u{d.dtype.itemsize}")).view(d.dtype)
    write(d, vals.reshape(d.shape), api, run=run)
    run.record(api, engine, (), (region(d),), dtypes.name(d.dtype), P, F, {"inputs": 0})


def rand2(dst, lo, hi):
    """``dst`` = uniform fp32 values in [``lo``, ``hi``] from the Vector Engine's XORWOW, cast
    to ``dst.dtype`` (nki.isa.rand2 docs: "Generates FP32 random values with uniform
    distribution", "min < max for valid range", min/max "(FP32), can be a scalar or vector").
    NeuronCore-v4+. nkisim maps each 32-bit draw r to ``lo + (r >> 8) * 2**-24 * (hi - lo)``."""
    run = context.current()
    api = "rand2"
    require_nc_version(run, "nki.isa.rand2", 4)
    d = _tile(dst, api, "dst")
    if d.dtype not in _RAND2_DTYPES:
        raise nki_error("nkisim_operand_dtype", param="dst", api=api, dtype=dtypes.name(d.dtype),
                        allowed=", ".join(sorted(dtypes.name(t) for t in _RAND2_DTYPES)))
    P, F = d.shape[0], _free(d)
    bounds, tiles = [], []
    for param, b in (("min", lo), ("max", hi)):
        if isinstance(b, Tensor) and b.dtype != dtypes.F32:
            raise nki_error("nkisim_operand_dtype", param=param, api=api,
                            dtype=dtypes.name(b.dtype), allowed="float32")
        v, t = _scalar_operand(b, d, api, param, run)
        bounds.append(np.asarray(v, np.float32).reshape(-1, 1))
        if t is not None:
            tiles.append(t)
    a, b = bounds
    if not np.all(a < b):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"min < max for valid range, got min {a.reshape(-1)[:4].tolist()} "
                            f"and max {b.reshape(-1)[:4].tolist()}")
    bits = draw_bits(run, VECTOR, _lanes(d), F)
    u = (bits >> 8).astype(np.float32) * np.float32(2.0 ** -24)
    vals = a + u * (b - a)
    write(d, vals.reshape(d.shape), api, run=run)
    run.record(api, VECTOR, tuple(region(t) for t in tiles), (region(d),),
               dtypes.name(d.dtype), P, F, _detail(*tiles))


def set_rng_seed(src_seeds):
    """Seed the Vector Engine's PRNG (every lane) with the 32-bit value of the [1, 1] tensor
    ``src_seeds`` (SBUF or PSUM): "Using the same seed will generate the same sequence of
    random numbers" (nki.isa.set_rng_seed docs). The seed is the value's 32 bits (an int32's
    two's complement, a float32's bit pattern). Also reseeds ``nisa.dropout``'s generator as
    ``nl.random_seed`` does."""
    run = context.current()
    api = "set_rng_seed"
    s = _tile(src_seeds, api, "src_seeds")
    if tuple(_tile_shape(s)) != (1, 1):
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"src_seeds must be a [1, 1] tensor, got {shape_str(s.shape)}")
    if dtypes.itemsize(s.dtype) != 4:
        raise nki_error("nkisim_operand_dtype", param="src_seeds", api=api,
                        dtype=dtypes.name(s.dtype), allowed="a 32-bit value (int32, uint32, "
                        "float32)")
    raw = np.ascontiguousarray(read(s, api, run)).reshape(-1)[:1]
    seed = int(raw.view(np.uint32)[0])
    run.vector_acc[("prng", VECTOR)] = seeded_state(seed, VECTOR, run.arch.pmax)
    run.rng = np.random.default_rng(seed)
    run.record(api, VECTOR, (region(s),), (), "uint32", 1, 1, {"inputs": 1})


def _state_tile(t, engine, api, param):
    """The uint32 (P, 6 or 24) tile of rand_set_state / rand_get_state."""
    x = _tile(t, api, param)
    if x.dtype != _U32:
        raise nki_error("nkisim_operand_dtype", param=param, api=api, dtype=dtypes.name(x.dtype),
                        allowed="uint32")
    words = WORDS * GENERATORS[engine]
    if len(x.shape) != 2 or x.shape[1] != words:
        name = "GpSimd" if engine == GPSIMD else "Vector"
        raise nki_error("nkisim_invalid_argument", api=api,
                        why=f"{param} must be a 2D uint32 tensor of {words} elements per "
                            f"partition for XORWOW on the {name} engine, got "
                            f"{shape_str(x.shape)}")
    return x


def _state_engine_check(run, api, engine):
    # "Supported arch versions: NeuronCore-v3+. Supported engines: NeuronCore-v3: GpSimd.
    # NeuronCore-v4+: GpSimd, Vector."
    require_nc_version(run, f"nki.isa.{api}", 3)
    if engine == VECTOR:
        require_nc_version(run, f"{api} on the Vector engine", 4)


def rand_set_state(src_seeds, engine=GPSIMD):
    """Load each lane's XORWOW state from the matching partition of the uint32 SBUF tile
    ``src_seeds`` (6 words per lane on GpSimd, 24 on Vector); lanes outside it keep theirs."""
    run = context.current()
    api = "rand_set_state"
    _state_engine_check(run, api, engine)
    s = _state_tile(src_seeds, engine, api, "src_seeds")
    if s.root.buffer != "sbuf":                     # "src_seeds must be in SBUF"
        raise nki_error("err_unsupported_memory", param="src_seeds", api=api, expected="sbuf",
                        got=s.root.buffer)
    vals = np.asarray(read(s, api, run)).astype(np.uint32)
    st = _state(run, engine)
    st[_lanes(s)] = vals.reshape(s.shape[0], GENERATORS[engine], WORDS)
    if engine == VECTOR:
        run.rng = np.random.default_rng(st.reshape(-1).tolist())
    run.record(api, engine, (region(s),), (), "uint32", s.shape[0], s.shape[1], {"inputs": 1})


def rand_get_state(dst, engine=GPSIMD):
    """Store each lane's XORWOW state into the matching partition of the uint32 tile ``dst``
    (SBUF on NeuronCore-v3, SBUF or PSUM from v4; GpSimd cannot write PSUM)."""
    run = context.current()
    api = "rand_get_state"
    _state_engine_check(run, api, engine)
    d = _state_tile(dst, engine, api, "dst")
    if d.root.buffer == "psum" and (engine == GPSIMD or run.arch.nc_version < 4):
        raise nki_error("err_unsupported_memory", param="dst",
                        api=f"{api} ({'gpsimd' if engine == GPSIMD else 'NeuronCore-v3'})",
                        expected="sbuf", got="psum")
    st = _state(run, engine)
    write(d, st[_lanes(d)].reshape(d.shape), api, run=run)
    run.record(api, engine, (), (region(d),), "uint32", d.shape[0], d.shape[1], {"inputs": 0})
