"""Export a schedule as a Chrome trace (JSON trace-event format) to open in ui.perfetto.dev.

One process per NeuronCore; one thread (track) per compute engine and per DMA queue, plus a
"kernel" track spanning the kernel body and, on the hardware-DGE DMA path, a "DMA issue (DGE)"
track. Each instruction is an "X" (complete) event named after
the NKI op, with ``ts``/``dur`` in microseconds (whole nanoseconds, so that back-to-back slices
abut exactly); its ``args`` give the operand regions, shapes,
dtype, byte counts and the kernel source line. A DMA is drawn as one event per queue it uses (its
data phase there); the first of them carries the args, including when the DMA was issued and
completed. On the hardware-DGE path a "DMA issue (DGE)" track shows when each DMA was issued.
Where two slices overlap on one of these tracks (the schedule shares queue bandwidth and DMA
issue as pools), the later one is drawn on an extra lane under it, so that no two slices on a
track overlap.

Format reference: the "Trace Event Format" document (Chrome tracing / Perfetto legacy JSON).
"""

from __future__ import annotations

import gzip
import json
import math

from .trace import DMA, GPSIMD, SCALAR, TENSOR, VECTOR

PID = 1                                  # NeuronCore 0
KERNEL_TID = 1
ENGINE_TIDS = {TENSOR: 2, VECTOR: 3, SCALAR: 4, GPSIMD: 5}
ENGINE_NAMES = {TENSOR: "TensorE (PE)", VECTOR: "VectorE (DVE)", SCALAR: "ScalarE (ACT)",
                GPSIMD: "GpSimdE (POOL)"}
DGE_TID = 6                              # DMA issue (hardware DGE path)
DMA_TID0 = 10                            # DMA queue q is tid DMA_TID0 + q


def _lane_tid(base: int, lane: int) -> int:
    """Track of the ``lane``-th overflow lane of track ``base`` (DGE issue or a DMA queue)."""
    return 1000 + 100 * base + lane


def _sort(base: int, lane: int) -> int:
    return 1000 + 100 * base + lane


def _jsonable(v, depth=0):
    """A JSON-safe copy of ``v`` (numbers stay numbers; NaN/inf, callables, objects -> str)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    item = getattr(v, "item", None)      # NumPy scalars
    if item is not None and getattr(v, "ndim", None) == 0:
        return _jsonable(item(), depth)
    if depth < 3 and isinstance(v, (list, tuple)):
        return [_jsonable(x, depth + 1) for x in v]
    if depth < 3 and isinstance(v, dict):
        return {str(k): _jsonable(x, depth + 1) for k, x in v.items()}
    return getattr(v, "__name__", None) or str(v)


def _region(r) -> str:
    return f"{r.name}[{r.p0}:{r.p1}, {r.b0}:{r.b1}] ({r.buffer})"


def _args(ins, i: int) -> dict:
    a = {
        "index": i,
        "engine": ins.engine,
        "shape": [ins.partitions, ins.free],
        "dtype": ins.dtype,
        "reads": [_region(r) for r in ins.reads],
        "writes": [_region(w) for w in ins.writes],
        "source": f"{ins.file}:{ins.line}" if ins.file else "",
    }
    if ins.loops:
        a["loops"] = _jsonable(ins.loops)
    if ins.detail:
        a["detail"] = _jsonable(ins.detail)
    return a


def _meta(tid: int, label: str, sort: int) -> list:
    return [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "args": {"name": label}},
        {"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid,
         "args": {"sort_index": sort}},
    ]


def to_chrome_trace(schedule, trace=None) -> dict:
    """The Chrome trace-event JSON object of ``schedule`` (``trace`` defaults to its trace)."""
    trace = trace if trace is not None else schedule.trace
    instrs = trace.instrs if trace is not None else []
    arch = schedule.arch.name
    kernel = schedule.kernel or (trace.kernel if trace is not None else "") or "kernel"
    ev = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0,
           "args": {"name": f"NeuronCore 0 ({arch}): {kernel}"}},
          {"ph": "M", "name": "process_sort_index", "pid": PID, "tid": 0,
           "args": {"sort_index": 0}}]
    ev += _meta(KERNEL_TID, "kernel", 0)
    tids = dict(ENGINE_TIDS)
    for eng, tid in tids.items():
        ev += _meta(tid, ENGINE_NAMES[eng], tid)
    nq = schedule.params.dma_queues
    labels = {DMA_TID0 + q: f"DMA queue {q}" for q in range(nq)}
    if schedule.params.dge:
        labels[DGE_TID] = "DMA issue (DGE)"
    for tid, label in labels.items():
        ev += _meta(tid, label, _sort(tid, 0))

    summary = _jsonable(schedule.summary())
    ev.append({"ph": "X", "name": kernel, "cat": "kernel", "pid": PID, "tid": KERNEL_TID,
               "ts": 0.0, "dur": schedule.makespan_ns / 1e3, "args": summary})

    start = schedule.start_ns
    end = schedule.end_ns
    shared = []                     # (start ns, end ns, event) on tracks that may need lanes
    for i, ins in enumerate(instrs):
        if ins.engine == DMA:
            segs = schedule.dma_segments(i)
            rec = schedule.dma_plans.get(i)
            if rec is not None and rec[2].issue_ns > 0:
                s = round(float(start[i]))
                e = round(float(start[i]) + rec[2].issue_ns)
                shared.append((s, e, {"ph": "X", "name": ins.op, "cat": "dge", "pid": PID,
                                      "tid": DGE_TID, "ts": s / 1e3, "dur": (e - s) / 1e3,
                                      "args": {"index": i}}))
            first = True
            for q, s, e in segs:
                if first:
                    args = _args(ins, i)
                    args["issue_us"] = float(start[i]) / 1e3
                    args["done_us"] = float(end[i]) / 1e3
                    args["queues"] = len(segs)
                    first = False
                else:
                    args = {"index": i}
                s, e = round(s), round(e)
                shared.append((s, e, {"ph": "X", "name": ins.op, "cat": "dma", "pid": PID,
                                      "tid": DMA_TID0 + q, "ts": s / 1e3, "dur": (e - s) / 1e3,
                                      "args": args}))
        else:
            # the engine the schedule ran it on (the compiler's choice for a copy the kernel
            # left to it, nkisim.cost "engine choice")
            eng = schedule.engine[i] if i < len(schedule.engine) else ins.engine
            tid = tids.get(eng)
            if tid is None:                       # an engine the exporter does not know
                tid = tids[eng] = DMA_TID0 + nq + len(tids)
                ev += _meta(tid, str(eng), tid)
            s = round(float(start[i]))
            args = _args(ins, i)
            args["engine"] = eng
            ev.append({"ph": "X", "name": ins.op, "cat": eng, "pid": PID, "tid": tid,
                       "ts": s / 1e3, "dur": (round(float(end[i])) - s) / 1e3,
                       "args": args})
    # The schedule shares DMA bandwidth and issue as pools served in readiness order, so two
    # transfers can briefly overlap on one queue (or issue). Slices on one track must not
    # overlap, so such a slice goes to an extra lane shown under its track.
    shared.sort(key=lambda x: (x[0], x[1]))
    lanes = {}                                     # base tid -> end time of each lane
    for s, e, event in shared:
        base = event["tid"]
        ends = lanes.setdefault(base, [])
        lane = next((j for j, lane_end in enumerate(ends) if lane_end <= s), None)
        if lane is None:
            lane = len(ends)
            ends.append(0)
            if lane:
                ev += _meta(_lane_tid(base, lane), f"{labels[base]} (overlap {lane})",
                            _sort(base, lane))
        ends[lane] = e
        if lane:
            event["tid"] = _lane_tid(base, lane)
        ev.append(event)
    return {"traceEvents": ev, "displayTimeUnit": "ns",
            "otherData": {"target": arch, "kernel": kernel,
                          "launch_overhead_us": schedule.launch_ns / 1e3,
                          "total_us": schedule.total_ns / 1e3}}


def write_chrome_trace(schedule, trace=None, path="nkisim_trace.json") -> str:
    """Write :func:`to_chrome_trace` to ``path`` (gzip-compressed if it ends in ``.gz``)."""
    obj = to_chrome_trace(schedule, trace)
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=3) as f:
            f.write(text)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return str(path)
