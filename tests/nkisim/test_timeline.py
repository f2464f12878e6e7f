"""nkisim.timeline: the Chrome trace-event JSON of a schedule (opens in ui.perfetto.dev)."""

import gzip
import json
import math
import numbers
import random

import numpy as np
import pytest

from nkisim.cost import params_for
from nkisim.schedule import schedule
from nkisim.timeline import DMA_TID0, ENGINE_TIDS, to_chrome_trace, write_chrome_trace
from nkisim.trace import DMA, GPSIMD, SCALAR, TENSOR, VECTOR, Instr, Region, Trace


def sb(key, b1=2048, buffer="sbuf"):
    return Region(buffer, key, f"{key}_tile", 0, 128, 0, b1)


def build_trace():
    t = Trace("trn2", kernel="demo")
    x = Region("hbm", "X", "X", 0, 1, 0, 128 * 2048)
    t.append(Instr("dma_copy", DMA, (x,), (sb("a"),), "float32", 128, 512,
                   {"rows": 128, "row_bytes": 2048, "bytes": 128 * 2048, "src": "hbm",
                    "dst": "sbuf"}, loops=((0, "affine_range", 0),), file="k.py", line=7))
    t.append(Instr("nc_matmul", TENSOR, (sb("w", 256), sb("a")), (sb("p", buffer="psum"),),
                   "float32", 128, 512, {"K": 128, "M": 128, "N": 512, "accumulate": False,
                                         "fp32": True, "transpose": False,
                                         "flops": 2 * 128 * 128 * 512},
                   file="k.py", line=8))
    t.append(Instr("tensor_copy", VECTOR, (sb("p", buffer="psum"),), (sb("o"),), "float32",
                   128, 512, {"psum_in": True, "inputs": 1, "odd": np.float32(1.5),
                              "fn": np.add, "nan": float("nan"), "nested": {"t": (1, 2)}},
                   file="k.py", line=9))
    t.append(Instr("activation", SCALAR, (sb("o"),), (sb("s"),), "float32", 128, 512,
                   {"inputs": 1}, file="k.py", line=10))
    t.append(Instr("iota", GPSIMD, (), (sb("i"),), "int32", 128, 512, {}, file="k.py", line=11))
    out = Region("hbm", "O", "out", 0, 1, 0, 128 * 2048)
    t.append(Instr("dma_copy", DMA, (sb("s"),), (out,), "float32", 128, 512,
                   {"rows": 128, "row_bytes": 2048, "bytes": 128 * 2048, "src": "sbuf",
                    "dst": "hbm"}, file="k.py", line=12))
    t.append(Instr("dma_copy", DMA, (x,), (Region("sbuf", "one", "one", 0, 1, 0, 64),),
                   "float32", 1, 16, {"rows": 1, "row_bytes": 64, "bytes": 64, "src": "hbm",
                                      "dst": "sbuf"}, file="k.py", line=13))
    return t


@pytest.fixture(scope="module")
def exported():
    t = build_trace()
    s = schedule(t)
    return t, s, to_chrome_trace(s, t)


def validate_trace_events(obj):
    """The Trace Event Format's requirements for what we emit (JSON object form)."""
    assert isinstance(obj, dict) and isinstance(obj["traceEvents"], list)
    assert obj.get("displayTimeUnit") in ("ms", "ns")
    named_threads = set()
    for ev in obj["traceEvents"]:
        ph = ev["ph"]
        assert isinstance(ev["name"], str) and ev["name"]
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ph == "M":
            assert ev["name"] in ("process_name", "thread_name", "process_sort_index",
                                  "thread_sort_index")
            assert isinstance(ev["args"], dict)
            if ev["name"] in ("process_name", "thread_name"):
                assert isinstance(ev["args"]["name"], str)
            else:
                assert isinstance(ev["args"]["sort_index"], int)
            if ev["name"] == "thread_name":
                named_threads.add((ev["pid"], ev["tid"]))
        elif ph == "X":
            for k in ("ts", "dur"):
                assert isinstance(ev[k], numbers.Real) and not isinstance(ev[k], bool)
                assert math.isfinite(ev[k]) and ev[k] >= 0
            assert isinstance(ev.get("args", {}), dict)
            assert isinstance(ev.get("cat", ""), str)
        else:
            raise AssertionError(f"unexpected phase {ph!r}")
    for ev in obj["traceEvents"]:
        if ev["ph"] == "X":
            assert (ev["pid"], ev["tid"]) in named_threads


def test_valid_trace_event_format(exported):
    _, _, obj = exported
    validate_trace_events(obj)


def test_json_round_trip(exported):
    _, _, obj = exported
    text = json.dumps(obj, allow_nan=False)
    assert json.loads(text) == obj


def test_events_match_the_schedule(exported):
    t, s, obj = exported
    xs = [e for e in obj["traceEvents"] if e["ph"] == "X"]
    kernel = [e for e in xs if e["cat"] == "kernel"]
    assert len(kernel) == 1 and kernel[0]["dur"] == pytest.approx(s.makespan_ns / 1e3)
    dmas = [i for i, ins in enumerate(t.instrs) if ins.engine == DMA]
    n_dma_events = sum(len(s.dma_segments(i)) for i in dmas)
    issues = [e for e in xs if e["cat"] == "dge"]
    assert len(issues) == len(dmas)                                   # trn2: hardware DGE path
    assert len(xs) == 1 + sum(ins.engine != DMA for ins in t.instrs) + n_dma_events + len(dmas)
    for e in issues:
        i = e["args"]["index"]
        assert e["ts"] == pytest.approx(s.start_ns[i] / 1e3, abs=5e-4)
        assert e["dur"] == pytest.approx(s.dma_plans[i][2].issue_ns / 1e3, abs=1e-3)
    xs = [e for e in xs if e["cat"] != "dge"]
    by_index = {}
    for e in xs:
        if e["cat"] != "kernel":
            by_index.setdefault(e["args"]["index"], []).append(e)
    for i, ins in enumerate(t.instrs):
        evs = by_index[i]
        assert all(e["name"] == ins.op for e in evs)
        if ins.engine == DMA:
            assert {e["tid"] for e in evs} == {DMA_TID0 + q for q, _, _ in s.dma_segments(i)}
            first = evs[0]["args"]
            assert first["issue_us"] == pytest.approx(s.start_ns[i] / 1e3)
            assert first["done_us"] == pytest.approx(s.end_ns[i] / 1e3)
            assert first["detail"]["bytes"] == ins.detail["bytes"]
            data_end = max(e["ts"] + e["dur"] for e in evs)
            issue_end = (s.start_ns[i] + s.dma_plans[i][2].issue_ns) / 1e3
            assert max(data_end, issue_end) == pytest.approx(s.end_ns[i] / 1e3, abs=1e-3)
        else:
            (e,) = evs
            assert e["tid"] == ENGINE_TIDS[ins.engine]
            assert e["ts"] == pytest.approx(s.start_ns[i] / 1e3, abs=5e-4)   # whole ns
            assert e["dur"] == pytest.approx((s.end_ns[i] - s.start_ns[i]) / 1e3, abs=1e-3)
            assert e["ts"] * 1e3 == pytest.approx(round(e["ts"] * 1e3), abs=1e-6)
        args = evs[0]["args"]
        assert args["source"] == f"k.py:{ins.line}"
        assert args["dtype"] == ins.dtype and args["shape"] == [ins.partitions, ins.free]
    assert len(by_index[0]) == 16 and len(by_index[6]) == 1      # P=128 vs one-row DMA
    desc = to_chrome_trace(schedule(t, params=params_for("trn2", dge=False)))
    assert not [e for e in desc["traceEvents"] if e.get("cat") == "dge"]


def test_args_are_readable_and_json_safe(exported):
    _, _, obj = exported
    ev = next(e for e in obj["traceEvents"] if e["ph"] == "X" and e["name"] == "tensor_copy")
    d = ev["args"]["detail"]
    assert d["odd"] == 1.5 and d["fn"] == "add" and d["nan"] == "nan"
    assert d["nested"] == {"t": [1, 2]}
    assert ev["args"]["reads"] == ["p_tile[0:128, 0:2048] (psum)"]
    ld = next(e for e in obj["traceEvents"] if e["ph"] == "X" and e["args"].get("index") == 0
              and "loops" in e["args"])
    assert ld["args"]["loops"] == [[0, "affine_range", 0]]


def mixed_dma_trace(seed=1, n=300):
    rng = random.Random(seed)
    t = Trace("trn2")
    for i in range(n):
        rows = rng.choice([1, 2, 3, 5, 8, 15, 16, 100, 128])
        rb = rng.choice([4, 64, 512, 2048])
        tile = Region("sbuf", (rng.choice("abcd"), i % 3), "t", 0, min(rows, 128), 0, rb)
        t.append(Instr("dma_copy", DMA, (Region("hbm", "X", "X", 0, 1, 0, rows * rb),), (tile,),
                       "float32", min(rows, 128), rb // 4,
                       {"rows": rows, "row_bytes": rb, "bytes": rows * rb, "src": "hbm",
                        "dst": "sbuf"}))
        if rng.random() < 0.3:
            t.append(Instr("tensor_copy", VECTOR, (tile,), (sb("o", 64),), "float32", 128,
                           rng.choice([1, 1000]), {}))
    return t


@pytest.mark.parametrize("which", ["demo", "mixed"])
def test_tracks_do_not_overlap(exported, which):
    obj = exported[2] if which == "demo" else to_chrome_trace(schedule(mixed_dma_trace()))
    validate_trace_events(obj)
    by_tid = {}
    for e in obj["traceEvents"]:
        if e["ph"] == "X":
            by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    if which == "mixed":           # the pools let some slices share a track: extra lanes
        assert any(tid >= 1000 for tid in by_tid)
    for spans in by_tid.values():
        spans.sort()
        for (_, e0), (s1, _) in zip(spans, spans[1:]):
            assert round(s1 * 1e3) >= round(e0 * 1e3)


def test_metadata_names_every_engine_and_queue(exported):
    _, s, obj = exported
    names = {e["tid"]: e["args"]["name"] for e in obj["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[ENGINE_TIDS[TENSOR]].startswith("TensorE")
    assert all(names[DMA_TID0 + q] == f"DMA queue {q}" for q in range(16))
    procs = [e for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(procs) == 1 and "trn2" in procs[0]["args"]["name"]
    assert obj["otherData"]["total_us"] == pytest.approx(s.total_ns / 1e3)


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_write_chrome_trace(tmp_path, exported, name):
    t, s, obj = exported
    path = write_chrome_trace(s, t, tmp_path / name)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        loaded = json.load(f)
    assert loaded == obj
    validate_trace_events(loaded)


def test_trace_defaults_to_the_schedules_trace(exported):
    t, s, obj = exported
    assert to_chrome_trace(s) == obj


def test_unknown_engine_gets_its_own_track():
    t = Trace("trn2", kernel="x")
    t.append(Instr("barrier", "sync", (), (), "float32", 1, 1, {}))
    obj = to_chrome_trace(schedule(t))
    validate_trace_events(obj)
    ev = next(e for e in obj["traceEvents"] if e["ph"] == "X" and e["name"] == "barrier")
    assert ev["tid"] not in ENGINE_TIDS.values()
