"""The engine timeline of the real conv2d kernel: valid Chrome trace JSON, engines overlapping.

Truth: the Chrome Trace Event Format (the JSON ui.perfetto.dev opens): a ``traceEvents`` list;
complete events ``ph == "X"`` with string ``name``, integer ``pid``/``tid`` and numeric ``ts`` and
``dur`` (microseconds, ``dur >= 0``); metadata events ``ph == "M"`` naming processes and threads.
And the engine model of nki-reference §3.2: engines run their queues in parallel, so a
well-pipelined convolution keeps the Tensor Engine busy while DMAs and PSUM evacuations run.
"""

import json

import numpy as np
import pytest

import nkisim.shim

nkisim.shim.install()

from kernels.conv2d import fused_conv2d_maxpool  # noqa: E402
from nkisim.runtime import estimate, last_run  # noqa: E402
from nkisim.timeline import to_chrome_trace  # noqa: E402

pytestmark = [pytest.mark.simulate, pytest.mark.shipped_kernel("conv2d"),
              pytest.mark.nki_dtype("float16")]


@pytest.fixture(scope="module")
def exported():
    rng = np.random.default_rng(1)
    # three row bands, so loads of one band overlap the matmuls of another
    X = rng.random((1, 256, 48, 34), dtype=np.float32).astype(np.float16)
    W = rng.random((256, 256, 3, 3), dtype=np.float32).astype(np.float16)
    b = rng.random(256, dtype=np.float32).astype(np.float16)
    fused_conv2d_maxpool(X, W, b, pool_size=1)
    run = last_run()
    sched, _ = estimate(run)
    return json.loads(json.dumps(to_chrome_trace(sched, run.trace)))


def test_conv2d_trace_is_chrome_trace_event_json(exported):
    events = exported["traceEvents"]
    assert events
    threads = {}
    for e in events:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index",
                                 "thread_sort_index")
            if e["name"] == "thread_name":
                threads[e["tid"]] = e["args"]["name"]
        else:
            assert isinstance(e["name"], str) and e["name"]
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
    # one track per engine and per DMA queue used
    names = " ".join(threads.values()).lower()
    for engine in ("tensor", "vector", "scalar", "dma"):
        assert engine in names


def _intervals(exported, word):
    tids = {e["tid"] for e in exported["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name" and word in e["args"]["name"].lower()}
    return [(e["ts"], e["ts"] + e["dur"]) for e in exported["traceEvents"]
            if e["ph"] == "X" and e["tid"] in tids and e["dur"] > 0]


def _overlap(a, b):
    return sum(max(0.0, min(x1, y1) - max(x0, y0)) for x0, x1 in a for y0, y1 in b)


def test_conv2d_engines_overlap(exported):
    pe = _intervals(exported, "tensor")
    assert pe
    pe_busy = sum(t1 - t0 for t0, t1 in pe)
    # matmuls run while DMA transfers and PSUM evacuations (Vector/Scalar) are in flight
    assert _overlap(pe, _intervals(exported, "dma")) > 0.05 * pe_busy
    evac = _intervals(exported, "vector") + _intervals(exported, "scalar")
    assert _overlap(pe, evac) > 0.01 * pe_busy
