"""Python state carried across the iterations of a Beta 1 loop (nkisim.frontend.carried_names,
nkisim.ops._loop).

Truth: the NKI migration guide, "Consistent control flow behavior" (aws-neuron-sdk 2.32,
nki/migration/index.rst): "In NKI 0.1.0, range iterators were converted into special objects
that allowed the eDSL to capture the loop body. Because of this, loops were only executed once
by the Python evaluator": `val += 1` in `for i in range(8)` "will print 1 in NKI 0.1.0, prints 8
in NKI 0.2.0" (reference §1.9). So on the device a Beta 1 body that reads a Python number and
then changes it sees the number's value from before the loop in every iteration; nkisim runs
every iteration and must say so instead of computing what the device does not. Valid loops
(values computed from the loop variable, names reset in the body, nl.static_range, the current
nki dialect) run as before, with NumPy's values.
"""

import warnings

import numpy as np
import pytest

from nkisim import NKIWarning, frontend
from nkisim import beta1 as nki
from nkisim import nki as nki_new
from nkisim.beta1 import isa as nisa
from nkisim.beta1 import language as nl
from nkisim.nki import language as nnl
from nkisim.runtime import simulate

RNG = np.random.default_rng(31)
A = RNG.random(1024, dtype=np.float32)
B = RNG.random(1024, dtype=np.float32)


def run(body, *args):
    """Simulate ``body`` with every check on and NKI warnings as errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", NKIWarning)
        return simulate(nki.jit(body), args, {}, checks_spec="all")


def counter_add(loop):
    def body(a, b):
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        off = 0
        for m in loop(8):                        # noqa: B007 (named in the message)
            x = nl.load(a[off:off + 128])
            y = nl.load(b[off:off + 128])
            nl.store(out[off:off + 128], nl.add(x, y))
            off += 128
        return out
    return body


@pytest.mark.parametrize("loop", [nl.affine_range, nl.sequential_range])
def test_a_counter_the_body_reads_and_bumps_is_an_error(loop):
    with pytest.raises(ValueError) as ei:
        run(counter_add(loop), A, B)
    e = ei.value
    assert e.nki_code == "nkisim_python_state_in_loop"
    msg = str(e)
    assert "Python variable `off` changes from one iteration of the `m` loop" in msg
    assert "(0, then 128)" in msg and loop.__name__ in msg
    assert "every iteration sees `off` as it was before the loop" in msg


def test_a_python_range_loop_is_watched_too():
    # "Neuron compiler transforms any usage of Python range() API into nl.sequential_range()
    # under the hood" (Beta 1 programming model): traced once as well. `range` is served in
    # the kernel's module only while the kernel runs, and stays a range for everything else.
    def body(a, b):
        assert len(range(3)) == 3 and 2 in range(3) and list(reversed(range(3))) == [2, 1, 0]
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        off = 0
        for m in range(8):                       # noqa: B007 (named in the message)
            nl.store(out[off:off + 128], nl.add(nl.load(a[off:off + 128]),
                                               nl.load(b[off:off + 128])))
            off += 128
        return out

    with pytest.raises(ValueError, match=r"`off` changes from one iteration of the `m` loop "
                                         r"\(range at test_traced_loops.py:\d+\)"):
        run(body, A, B)
    assert range is __builtins__["range"] if isinstance(__builtins__, dict) else range is \
        __builtins__.range
    assert "range" not in globals()

    def fine(a, b):                              # the offset computed from the loop variable
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        for m in range(8):
            nl.store(out[m * 128:(m + 1) * 128], nl.add(nl.load(a[m * 128:(m + 1) * 128]),
                                                        nl.load(b[m * 128:(m + 1) * 128])))
        return out

    np.testing.assert_array_equal(run(fine, A, B), A + B)


def test_static_range_is_unrolled_so_the_counter_is_fine():
    # nl.static_range: "fully unrolled at trace time (loop var is a Python int)" (ref §1.9)
    np.testing.assert_array_equal(run(counter_add(nl.static_range), A, B), A + B)


def test_the_current_dialect_runs_python_loops_as_python():
    # NKI 0.2+: "prints 8 in NKI 0.2.0" (the same guide)
    def body(a, b):
        out = nnl.ndarray((1024,), dtype=a.dtype, buffer=nnl.shared_hbm)
        off = 0
        for _ in nnl.affine_range(8):
            x = nnl.load(a[off:off + 128])
            y = nnl.load(b[off:off + 128])
            nnl.store(out[off:off + 128], nnl.add(x, y))
            off += 128
        return out

    np.testing.assert_array_equal(nki_new.simulate(nki_new.jit(body))(A, B), A + B)


def test_a_value_assigned_after_its_use_is_carried_too():
    # the body reads `off` before assigning it: the traced body reads the value from before
    # the loop (0) in every iteration, although `(m + 1) * 128` is computed from m
    def body(a, b):
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        off = 0
        for m in nl.affine_range(8):
            nl.store(out[off:off + 128], nl.add(nl.load(a[off:off + 128]),
                                               nl.load(b[off:off + 128])))
            off = (m + 1) * 128
        return out

    with pytest.raises(ValueError, match="`off` changes from one iteration"):
        run(body, A, B)


def test_values_computed_from_the_loop_variable_and_reset_names_run():
    def body(a, b):
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        off = 0
        count = 0
        width = 64
        for i in nl.affine_range(4):
            for j in nl.affine_range(2):
                off = i * 256 + j * 128          # assigned before it is read
                step = 0
                step += 2 * width                # reset, then updated: the same every time
                x = nl.load(a[off:off + step])
                y = nl.load(b[off:off + step])
                nl.store(out[off:off + step], nisa.tensor_tensor(x, y, op=nl.add))
            count += 1                           # changed, read only to report it
            print(f"tile {count}")
            assert count > 0
        return out

    np.testing.assert_array_equal(run(body, A, B), A + B)


def test_carried_names_reads_the_source():
    def k(a):
        off = 0
        total = 0
        for m in nl.affine_range(4):             # noqa: B007
            x = a[off]
            off += 128
            total += 1
            y = 0
            y += x
            z = y
        return z, total

    code = k.__code__
    line = code.co_firstlineno + 3
    # `total` is only updated in the body, but the code after the loop reads it
    assert frontend.carried_names(code, line) == (
        ("off", "total"), "m", {"off": frozenset({"a"}), "total": frontend.AFTER})
    assert frontend.carried_names(code, line + 1) == ((), "", {})

    def reported(a):
        total = 0
        for m in nl.affine_range(4):             # noqa: B007
            total += 1
        print(f"{total} tiles")                  # (a report changes no instruction)
        assert total > 0
        return a

    code = reported.__code__
    assert frontend.carried_names(code, code.co_firstlineno + 2) == ((), "", {})


@pytest.mark.parametrize("loop", ["affine_range", "sequential_range", "range"])
def test_a_counter_read_after_the_loop_is_an_error(loop):
    # the migration guide's own example: `val += 1` in `for i in range(8)` "will print 1"
    def body(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        n = 0
        for i in getattr(nl, loop, range)(4):
            acc[...] = nl.add(acc, nl.load(a[i * 128:(i + 1) * 128]))
            n += 1
        nl.store(out, nl.multiply(acc, 1.0 / n))
        return out

    with pytest.raises(ValueError, match=r"`n` changes from one iteration of the `i` loop .* "
                                         r"\(0, then 1\) and is read after the loop"):
        run(body, np.ones((512, 64), np.float32))


def test_a_counter_that_only_picks_a_tile_from_a_list_is_a_warning():
    # a hand-made double buffer: the traced body picks bufs[0] in every iteration, which
    # computes the same values in a sequential loop: a suspicious pattern, not an error
    def body(a):
        out = nl.ndarray((1024, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        bufs = [nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf),
                nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)]
        k = 0
        for m in nl.sequential_range(8):
            t = bufs[k % 2]
            t[...] = nl.load(a[m * 128:(m + 1) * 128, :])
            nl.store(out[m * 128:(m + 1) * 128, :], nl.multiply(t, 2.0))
            k += 1
        return out

    a = RNG.random((1024, 64), dtype=np.float32)
    with pytest.warns(NKIWarning, match=r"`k` changes from one iteration of the `m` loop .* "
                                        r"picks a tile from `bufs`"):
        got = simulate(nki.jit(body), (a,), {}, checks_spec="all")
    np.testing.assert_array_equal(got, 2 * a)

    # a list of numbers picked the same way is an index into a tensor: still the error
    def offsets(a):
        out = nl.ndarray((1024, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        starts = [0, 128, 256, 384, 512, 640, 768, 896]
        k = 0
        for m in nl.sequential_range(8):         # noqa: B007 (named in the message)
            s = starts[k]
            nl.store(out[s:s + 128, :], nl.load(a[s:s + 128, :]))
            k += 1
        return out

    with pytest.raises(ValueError, match="`k` changes from one iteration"):
        run(offsets, a)


def test_a_loop_index_carried_into_the_next_iteration_is_caught():
    # `prev = m` at the end of the body, read at the start of the next: the traced body reads
    # prev's value from before the loop (0) in every iteration
    def body(a, b):
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        prev = 0
        for m in nl.sequential_range(8):
            nl.store(out[m * 128:(m + 1) * 128],
                     nl.add(nl.load(a[prev * 128:(prev + 1) * 128]),
                            nl.load(b[m * 128:(m + 1) * 128])))
            prev = m
        return out

    with pytest.raises(ValueError, match=r"`prev` changes from one iteration .* \(0, then 1\)"):
        run(body, A, B)


POOL = 2
FLAG = True


def test_names_every_branch_or_a_nested_loop_assigns_are_fresh_in_each_iteration():
    # the device's traced body assigns them before it reads them in every iteration: an if on a
    # trace-time value takes the same branch each time, a nested loop's body is traced once (a
    # static_range one unrolled), and a walrus binds before the rest of its statement reads it
    def body(a, b):
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        for m in nl.affine_range(8):
            if POOL == 2:
                off = m * 128
            elif POOL == 3:
                off = m * 64
            else:
                off = 0
            if FLAG:
                width = 128
            for j in nl.static_range(2):
                half = off + j * 64
            lo = half - 64
            x = nl.load(a[lo:lo + width])
            y = nl.load(b[off:off + width])
            nl.store(out[(start := m * 128):start + width], nl.add(x, y))
        return out

    np.testing.assert_array_equal(run(body, A, B), A + B)


def test_a_counter_beside_a_branch_is_still_carried():
    # the branch assigns another name; `off` is still read before the body changes it
    def body(a, b):
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        off = 0
        for m in nl.affine_range(8):             # noqa: B007
            if FLAG:
                w = 128
            nl.store(out[off:off + w], nl.add(nl.load(a[off:off + w]),
                                              nl.load(b[off:off + w])))
            for j in nl.affine_range(1):         # noqa: B007
                off += 128
        return out

    with pytest.raises(ValueError, match="`off` changes from one iteration"):
        run(body, A, B)


def test_a_tile_of_a_python_range_loop_is_out_of_scope_after_it():
    # "any use of Python range(...) will be replaced with sequential_range(...)" and "Tensors
    # defined inside an if/for block cannot be used outside it" (reference §1.9): as for
    # nl.sequential_range, `acc = nl.add(acc, x)` does not accumulate on the device
    def body(a, b):
        out = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        for i in range(8):
            acc = nl.add(acc, nl.load(a[i * 128:(i + 1) * 128].reshape((128, 1))))
        nl.store(out, acc)
        return out

    with pytest.raises(Exception) as ei:
        run(body, A, B)
    assert ei.value.nki_code == "err_local_variable_used_out_of_scope"

    def comprehension(a, b):                      # Python's own iteration: no loop
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        parts = [nl.load(a[m * 128:(m + 1) * 128]) for m in range(8)]
        for m in list(range(8)):
            nl.store(out[m * 128:(m + 1) * 128], nl.add(parts[m], nl.load(b[m * 128:
                                                                           (m + 1) * 128])))
        return out

    np.testing.assert_array_equal(run(comprehension, A, B), A + B)


@pytest.mark.parametrize("loop", ["affine_range", "range"])
def test_a_list_the_body_grows_and_the_code_after_reads_is_an_error(loop):
    # traced once: on the device `parts` gets one item, and parts[1] fails at trace time
    def body(a, b):
        out = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        buf = nl.ndarray((128, 8, 8), dtype=a.dtype, buffer=nl.sbuf)
        parts = []
        for i in getattr(nl, loop, range)(8):
            buf[:, i, :] = nl.full((128, 8), 1.0, dtype=nl.float32)
            parts.append(buf[:, i, :])
        nl.store(out, nl.add(parts[0], parts[1]))
        return out

    with pytest.raises(ValueError, match=r"Python list `parts` grows from one iteration of the "
                                         r"`i` loop .* and is read after the loop"):
        run(body, A, B)

    def fine(a, b):                               # grown and read in the same iteration
        out = nl.ndarray((1024,), dtype=a.dtype, buffer=nl.shared_hbm)
        for m in getattr(nl, loop, range)(8):
            parts = []
            parts.append(nl.load(a[m * 128:(m + 1) * 128]))
            nl.store(out[m * 128:(m + 1) * 128], nl.add(parts[0],
                                                        nl.load(b[m * 128:(m + 1) * 128])))
        return out

    np.testing.assert_array_equal(run(fine, A, B), A + B)
