"""How fast is nkisim.schedule? Builds a synthetic ~100k-instruction trace shaped like a conv2d
kernel (weights preloaded; per output row: input-row DMA loads, 9 taps x 2 input-channel tiles of
matmuls accumulating into one of 4 rotating PSUM banks, a PSUM->SBUF copy with bias on ScalarE, a
VectorE max for pooling, an output DMA store) and prints the scheduling cost per instruction.

    python benchmarks/schedule_speed.py [--instructions 100000] [--target trn2] [--repeat 3]

Budget (DESIGN.md, schedule brief): at most ~5 us per instruction.
"""

from __future__ import annotations

import argparse
import time

from nkisim.schedule import schedule
from nkisim.trace import DMA, SCALAR, TENSOR, VECTOR, Instr, Region, Trace


def _sb(key, p, b0, b1, name=None):
    return Region("sbuf", key, name or str(key), 0, p, b0, b1)


def conv_like_trace(n_instructions: int = 100_000, target: str = "trn2", dtype: str = "bfloat16",
                    width: int = 224, cin_tiles: int = 2, cout_tiles: int = 2,
                    psum_bufs: int = 4, in_bufs: int = 2) -> Trace:
    es = 2 if dtype in ("bfloat16", "float16") else 4
    fp32 = es == 4
    out_w = width - 2
    t = Trace(target, kernel="conv_like")
    x = "X@hbm"
    out = "out@hbm"
    row_bytes = width * es
    # weights: 9 taps x cin_tiles x cout_tiles (128x128) tiles in one direct-allocated SBUF block
    w_key = ("sbuf", "W")
    for k in range(9 * cin_tiles * cout_tiles):
        t.append(Instr("dma_copy", DMA, (Region("hbm", "W@hbm", "W", 0, 1, k * 128 * 128 * es,
                                                 (k + 1) * 128 * 128 * es),),
                       (_sb(w_key, 128, k * 128 * es, (k + 1) * 128 * es, "W_sbuf"),),
                       dtype, 128, 128,
                       {"rows": 128, "row_bytes": 128 * es, "bytes": 128 * 128 * es,
                        "src": "hbm", "dst": "sbuf"}))
    row = 0
    while len(t) < n_instructions:
        for co in range(cout_tiles):
            ib = row % in_bufs
            # load 3 input rows for each input-channel tile (one DMA per tile, 3 runs/partition)
            x_regions = []
            for ci in range(cin_tiles):
                xr = _sb(("sbuf", f"x{ci}_{ib}"), 128, 0, 3 * row_bytes, f"x{ci}")
                x_regions.append(xr)
                base = (ci * 128 * width * width + row * width) * es
                t.append(Instr("dma_copy", DMA,
                               (Region("hbm", x, "X", 0, 1, base,
                                       base + (127 * width * width + 3 * width) * es),),
                               (xr,), dtype, 128, 3 * width,
                               {"rows": 128 * 3, "row_bytes": row_bytes,
                                "bytes": 128 * 3 * row_bytes, "src": "hbm", "dst": "sbuf"}))
            pb = (row * cout_tiles + co) % psum_bufs
            ps = Region("psum", ("psum", f"acc{pb}"), "acc", 0, 128, 0, out_w * 4)
            first = True
            for tap in range(9):
                for ci in range(cin_tiles):
                    k = (tap * cin_tiles + ci) * cout_tiles + co
                    w = _sb(w_key, 128, k * 128 * es, (k + 1) * 128 * es, "W_sbuf")
                    dy, dx = divmod(tap, 3)
                    xr = x_regions[ci]
                    mv = Region("sbuf", xr.key, xr.name, 0, 128, (dy * width + dx) * es,
                                (dy * width + dx + out_w) * es)
                    t.append(Instr("nc_matmul", TENSOR, (w, mv), (ps,), "float32", 128, out_w,
                                   {"K": 128, "M": 128, "N": out_w, "accumulate": not first,
                                    "transpose": False, "fp32": fp32,
                                    "flops": 2 * 128 * 128 * out_w}))
                    first = False
            ob = _sb(("sbuf", f"o{row % 2}"), 128, 0, out_w * es, "o")
            t.append(Instr("activation", SCALAR, (ps, _sb(("sbuf", "bias"), 128, 0, 4)), (ob,),
                           dtype, 128, out_w, {"psum_in": True, "inputs": 1}))
            pool = _sb(("sbuf", f"p{row % 2}"), 128, 0, out_w * es, "pool")
            t.append(Instr("tensor_tensor", VECTOR, (ob, ob), (pool,), dtype, 128, out_w,
                           {"inputs": 2, "alu": "maximum", "all_16bit": es == 2,
                            "contiguous": True}))
            base = (co * 128 * out_w * out_w + row * out_w) * es
            t.append(Instr("dma_copy", DMA, (pool,),
                           (Region("hbm", out, "out", 0, 1, base,
                                   base + (127 * out_w * out_w + out_w) * es),),
                           dtype, 128, out_w,
                           {"rows": 128, "row_bytes": out_w * es, "bytes": 128 * out_w * es,
                            "src": "sbuf", "dst": "hbm"}))
        row += 1
    return t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instructions", type=int, default=100_000)
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    t0 = time.process_time()
    trace = conv_like_trace(args.instructions, args.target, args.dtype)
    build = time.process_time() - t0
    best = float("inf")
    sched = None
    for _ in range(args.repeat):
        t0 = time.process_time()
        sched = schedule(trace)
        best = min(best, time.process_time() - t0)
    n = len(trace)
    print(f"trace: {n} instructions ({args.target}, {args.dtype}), built in {build:.2f} s")
    print(f"schedule: {best:.3f} s best of {args.repeat} = {1e6 * best / n:.2f} us/instruction")
    print(sched.format_summary())


if __name__ == "__main__":
    main()
