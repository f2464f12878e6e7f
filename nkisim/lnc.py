"""Program instances of one launch (``kernel[2]``, LNC 2; Beta 1's SPMD grid): who runs when.

The instances of a launch run one at a time, in program-id order, each to its end, in the
calling thread, as they always did: a launch whose instances never synchronise costs nothing
more. An instance that must wait for another (``nisa.core_barrier``, ``nisa.sendrecv``:
nkisim.collectives) is suspended and another one runs: the instances are cooperative
coroutines, each on its own thread once it has to be suspended, with exactly one running at
any time (a baton), so the Run's state needs no lock and every run is deterministic. AWS's CPU
simulator runs LNC 2 "as two Python threads, each with its own program_id", with "thread-safe
primitives" for sendrecv and core_barrier (nki-current.md §3, SIM §Execution); nkisim's order
is one of the interleavings the device allows.

Scheduling: at a synchronisation point the lowest-numbered instance able to run goes first
(a suspended one whose wait is over, or one not started yet). So instance 0 is never behind
the others, and the n-th ``shared_hbm`` tensor an instance creates is the one instance 0
created (nkisim.tensor.ndarray). When no instance can run and some have not finished, the
launch is deadlocked: ``nkisim_lnc_deadlock`` names what each instance waits for.

Per instance the Run keeps its own program id, loop stack, epoch, SBUF/PSUM accounting (each
logical core has its own SBUF and PSUM: a suspended instance's tiles do not count against the
running one's), the bytes of its address-placed tiles and accumulators; they are swapped at
every switch. For nkisim.checks a
synchronisation of all instances starts a new *phase* of the SPMD pseudo-loop: what an instance
wrote before it is ordered before what any instance does after it (core_barrier's purpose:
"both cores can safely read the complete tensor", nki.isa.core_barrier docs).
"""

from __future__ import annotations

import threading

from .checks import settle_spmd_writes
from .errors import nki_error

# the Run fields that belong to one program instance (swapped at every switch)
_FIELDS = ("program_ids", "shared_hbm_cursor", "loops", "epoch", "par_cache", "taint",
           "last_fresh", "assoc", "into", "nesting", "vector_acc", "memory",
           "sbuf_bytes", "psum_bytes", "direct_sites")

# Python's default thread stack (8 MiB on Linux, less elsewhere) is small for deep kernels;
# nki-library's kernels nest several helper layers (measured: fine with 64 MiB)
_STACK_BYTES = 64 << 20


class _Aborted(BaseException):
    """Unwinds a suspended instance when the launch failed elsewhere (not an ``Exception``:
    kernel code catching ``Exception`` must not swallow it)."""


class Instances:
    """The program instances of one launch and the baton passed between them."""

    def __init__(self, run, ids, body):
        self.run = run
        self.ids = [tuple(i) for i in ids]
        self.body = body                    # body(i) runs instance i's kernel, returns its result
        n = len(self.ids)
        self.state = ["new"] * n            # new | running | waiting | done
        self.waits = [None] * n             # (predicate, description) of a waiting instance
        self.saved = [None] * n             # its Run fields while suspended
        self.fresh_epoch = [False] * n      # a phase began while it waited (see module doc)
        self.results = [None] * n
        self.cv = threading.Condition()
        self.turn = None
        self.error = None
        self.threads = []
        self.memories = []                  # SBUF/PSUM accounting of instances past the first
        self.meets = {}                     # (key, generation) -> {"members", "payloads", ...}
        self.counts = {}                    # (key, instance) -> generations it has joined

    @property
    def size(self) -> int:
        return len(self.ids)

    def index(self) -> int:
        """The running instance."""
        return self.turn

    # ---- launching ----
    def run_all(self):
        """Run every instance; return the last one's result (they return the same tensors).
        Afterwards the Run holds the first instance's loop stack and SBUF/PSUM accounting."""
        run = self.run
        start = tuple(getattr(run, f) for f in _FIELDS)
        try:
            for i in range(self.size):
                with self.cv:
                    if self.error is not None or any(
                            s in ("running", "waiting") for s in self.state):
                        break                       # suspended instances: the baton decides
                    self.state[i] = "running"
                    self.turn = i
                if not self._host(i, fresh=False, main=True):
                    break
            with self.cv:
                while self.error is None and not all(s == "done" for s in self.state):
                    self.cv.wait()
            if self.error is None:          # the last phase ends with the launch
                settle_spmd_writes(run)
        except BaseException as e:      # KeyboardInterrupt in the caller's thread
            self._fail(e)
        if self.error is not None:
            self._abort()
            raise self.error
        for f, v in zip(_FIELDS, start):
            if f != "program_ids":
                setattr(run, f, v)
        return self.results[-1]

    def _host(self, i, fresh, main=False) -> bool:
        """Run instance i in this thread; False when the launch failed. When it ends, the
        baton goes to the next instance, unless this is the caller's thread (``main``) and no
        instance is suspended: ``run_all`` then starts the next one itself."""
        try:
            self._begin(i, fresh)
            self.results[i] = self.body(i)
            # its values are final: its overlapping writes are decided now, so that a grid of
            # many instances holds one instance's records at a time (checks.settle_spmd_writes)
            settle_spmd_writes(self.run)
        except _Aborted:
            return False
        except BaseException as e:
            self._fail(e)
            return False
        with self.cv:
            self.state[i] = "done"
            self.waits[i] = None
            if self.error is not None:
                return False
            if all(s == "done" for s in self.state):
                self.turn = None
                self.cv.notify_all()
                return True
            if not main or any(s == "waiting" for s in self.state):
                try:
                    self._pass(self._pick(i))
                except BaseException as e:
                    self._fail(e, locked=True)
                    return False
        return True

    def _begin(self, i, fresh) -> None:
        """Set the Run up for a starting instance (``fresh``: others are suspended, so it gets
        its own loop stack and SBUF/PSUM accounting)."""
        run = self.run
        if fresh:
            from .memory import Memory
            run.loops = []
            run.epoch = 1
            run.par_cache = (0, ())
            run.taint = run.last_fresh = run.assoc = run.into = None
            run.nesting = 0
            run.vector_acc = {}
            run.memory = Memory(run)
            self.memories.append(run.memory)
        # each logical core has its own SBUF and PSUM (module doc): its tiles placed with
        # ``address=`` (or ncc's direct allocation) are its own bytes and its own record of
        # which were written, never another instance's (AWS's attention_cte and qkv_cte place
        # tiles at the same address on both cores of their LNC 2 launches)
        run.sbuf_bytes = run.psum_bytes = None
        run.direct_sites = {}
        run.program_ids = self.ids[i]
        run.shared_hbm_cursor = 0
        if run.grid:           # each instance is an "iteration" of the grid for nkisim.checks
            run.begin_program(run.program_ids, self.func)

    func = None                 # the kernel function (names the SPMD pseudo-loop)

    def _thread_main(self, i) -> None:
        import numpy as np
        with np.errstate(all="ignore"):    # the run's floating-point state is per thread
            self._host(i, fresh=True)

    # ---- the baton ----
    def _pick(self, me):
        """The lowest-numbered instance that can run (cv held); a deadlock error if none."""
        for j, s in enumerate(self.state):
            if s == "new" or (s == "waiting" and self.waits[j][0]()):
                return j
        raise self._deadlock()

    def _pass(self, j) -> None:
        """Give the baton to instance j (cv held), starting its thread if it is new."""
        self.turn = j
        if self.state[j] == "new":
            self.state[j] = "running"
            t = threading.Thread(target=self._thread_main, args=(j,), daemon=True,
                                 name=f"nkisim-program-{j}")
            old = threading.stack_size()
            try:
                threading.stack_size(_STACK_BYTES)
            except (ValueError, RuntimeError):
                pass
            try:
                t.start()
            finally:
                threading.stack_size(old)
            self.threads.append(t)
        self.cv.notify_all()

    def wait(self, me, pred, what: str) -> None:
        """Instance ``me`` goes on once ``pred()`` holds, letting the others run meanwhile."""
        with self.cv:
            if self.error is not None:       # the launch failed meanwhile: unwind
                raise _Aborted()
            self.waits[me] = (pred, what)
            self.state[me] = "waiting"
            j = self._pick(me)
            if j != me:
                self._suspend(me, j)
            self.state[me] = "running"
            self.waits[me] = None
        if self.fresh_epoch[me]:
            self.fresh_epoch[me] = False
            self._new_phase_epoch()

    def _suspend(self, me, j) -> None:
        """Save instance ``me``'s Run fields, pass the baton to ``j``, and come back with them
        once the baton returns (cv held)."""
        run = self.run
        lp = run.spmd
        self.saved[me] = (tuple(getattr(run, f) for f in _FIELDS),
                          (lp.iteration, lp.epoch) if lp is not None else None)
        self._pass(j)
        while self.turn != me and self.error is None:
            self.cv.wait()
        if self.error is not None:
            raise _Aborted()
        fields, spmd = self.saved[me]
        self.saved[me] = None
        for f, v in zip(_FIELDS, fields):
            setattr(run, f, v)
        if spmd is not None:
            lp.iteration, lp.epoch = spmd

    # ---- meeting points (nkisim.collectives) ----
    def meet(self, key, members: tuple, payload, what: str, describe) -> dict:
        """Instance ``turn`` joins its next meeting ``key`` of ``members`` (sorted instance
        indices), leaving ``payload``; returns every member's payload once all have joined.
        ``describe(members)`` words a membership mismatch."""
        me = self.turn
        with self.cv:
            g = self.counts.get((key, me), 0)
            self.counts[(key, me)] = g + 1
            slot = self.meets.get((key, g))
            if slot is None:
                slot = self.meets[(key, g)] = {"members": members, "payloads": {},
                                               "first": me}
            elif slot["members"] != members:
                raise nki_error("nkisim_lnc_mismatch", what=what, detail=describe(
                    me, members, slot["first"], slot["members"]))
            slot["payloads"][me] = payload
            if len(slot["payloads"]) == len(members) and len(members) == self.size:
                self._phase()             # every instance synchronised (module doc)
                for m in members:
                    self.fresh_epoch[m] = True
        self.wait(me, lambda: len(slot["payloads"]) == len(members), what)
        return slot["payloads"]

    def _phase(self) -> None:
        """All instances met: epochs from here on are a new phase of the SPMD pseudo-loop.
        Their overlapping writes of the phase are decided now (checks.settle_spmd_writes)."""
        settle_spmd_writes(self.run)
        lp = self.run.spmd
        if lp is not None:
            lp.first_epoch = self.run.next_epoch

    def _new_phase_epoch(self) -> None:
        run = self.run
        lp = run.spmd
        if lp is None:
            return
        e = run.new_epoch(lp, lp.iteration)
        lp.epoch = e
        if not run.loops:
            run.epoch = e

    # ---- failure ----
    def _deadlock(self):
        parts = []
        for j, s in enumerate(self.state):
            pid = self.ids[j][0] if len(self.ids[j]) == 1 else self.ids[j]
            if s == "done":
                parts.append(f"program {pid} has finished")
            elif s == "waiting":
                parts.append(f"program {pid} waits at {self.waits[j][1]}")
        return nki_error("nkisim_lnc_deadlock", detail="; ".join(parts))

    def _fail(self, e, locked=False) -> None:
        if not locked:
            with self.cv:
                self._fail(e, locked=True)
            return
        if self.error is None:
            self.error = e
        self.turn = None
        self.cv.notify_all()

    def _abort(self) -> None:
        """Unwind the suspended instances (their threads raise _Aborted) and wait for them."""
        with self.cv:
            self.cv.notify_all()
        me = threading.current_thread()
        for t in list(self.threads):
            if t is not me:
                t.join()

    def finish_memories(self) -> None:
        """The launch ended: check every instance's SBUF/PSUM accounting (the first one's is
        ``run.memory``); the trace and ``run.memory`` report the largest peaks."""
        main = self.run.memory
        main.finish()
        for m in self.memories:
            m.finish()
            main.peak_sbuf = max(main.peak_sbuf, m.peak_sbuf)
            main.peak_psum = max(main.peak_psum, m.peak_psum)
        self.run.trace.peak_sbuf_bytes = main.peak_sbuf
        self.run.trace.peak_psum_banks = main.peak_psum
