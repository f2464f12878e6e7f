"""nkisim.cost against the reference's cost formulas (docs/nki-reference.md §1.10, §3)."""

import numpy as np
import pytest

from nkisim.arch import TRN1, TRN2
from nkisim.cost import (
    COST_PARAMS,
    DMA_EFFICIENCY_TABLE,
    adjusted_flops_factor,
    compute_ns,
    descriptor_overhead_bytes,
    dma_efficiency,
    dma_plan,
    instr_cost_ns,
    load_stationary_cycles,
    matmul_cycles,
    params_for,
    stream_cycles,
    table_efficiency,
)
from nkisim.trace import DMA, GPSIMD, SCALAR, TENSOR, VECTOR, Instr, Region

P1 = COST_PARAMS["trn1"]
P2 = COST_PARAMS["trn2"]                     # hardware DGE DMA path (trn2 default)
P2_DESC = params_for("trn2", dge=False)      # compiled with --disable-dge


def sb(key="t", p=128, nbytes=512, buffer="sbuf"):
    return Region(buffer, key, str(key), 0, p, 0, nbytes)


def mm(m, n, k=128, fp32=False):
    return Instr("nc_matmul", TENSOR, (sb("st"), sb("mv")), (sb("ps", buffer="psum"),),
                 "float32", m, n, {"K": k, "M": m, "N": n, "fp32": fp32, "transpose": False,
                                   "accumulate": False, "flops": 2 * k * m * n})


def op(name, engine, n, dtype="float32", out="sbuf", **detail):
    return Instr(name, engine, (sb("a"),), (sb("o", buffer=out),), dtype, 128, n, detail)


def dma(rows, row_bytes, src="hbm", dst="sbuf", p=None, contiguous=False, **extra):
    """``rows`` descriptors of ``row_bytes``; the HBM side is one contiguous range only if
    ``contiguous`` (else the rows are strided, e.g. a tile of a wider matrix)."""
    p = rows if p is None else p
    d = {"rows": rows, "row_bytes": row_bytes, "bytes": rows * row_bytes, "src": src, "dst": dst}
    d.update(extra)
    span = rows * row_bytes * (1 if contiguous else 2)
    reg = {"hbm": lambda k: Region("hbm", k, k, 0, 1, 0, span)}
    s = reg.get(src, lambda k: Region(src, k, k, 0, p, 0, row_bytes))("s")
    t = reg.get(dst, lambda k: Region(dst, k, k, 0, p, 0, row_bytes))("d")
    return Instr("dma_copy", DMA, (s,), (t,), "float32", p, row_bytes // 4, d)


# --- targets ----------------------------------------------------------------------------------
def test_params_per_target():
    assert params_for("trn2") is P2 and params_for("gen3") is P2
    assert params_for(TRN1) is P1 and params_for("gen2") is P1
    assert P1.arch is TRN1 and P2.arch is TRN2
    with pytest.raises(ValueError):
        params_for("trn9")


def test_target_from_environment(monkeypatch):
    monkeypatch.setenv("NKISIM_TARGET", "trn1")
    assert params_for() is P1


# --- TensorE (ref §1.10 nc_matmul, §3.3) --------------------------------------------------------
def test_matmul_128x128x512_bf16_trn2():
    # max(min(64, 128), 512) = 512 TensorE cycles at 2.4 GHz
    assert matmul_cycles(mm(128, 512), P2) == 512
    assert compute_ns(mm(128, 512), P2) == pytest.approx(512 / 2.4)       # 213.3 ns
    assert compute_ns(mm(128, 512), P1) == pytest.approx(512 / 2.8)


def test_matmul_fp32_is_4x_on_nc_v2():
    # "For FP32 input data type, the instruction cost is roughly 4x higher" (trn1 arch guide)
    assert matmul_cycles(mm(128, 512, fp32=True), P1) == 4 * 512
    assert compute_ns(mm(128, 512, fp32=True), P1) == pytest.approx(4 * 512 / 2.8)


def test_matmul_fp32_on_nc_v3_is_the_course_reference_ratio():
    # NC-v3: the fp32 / fp16 latency ratio of the course's optimized reference conv2d on trn2,
    # from its thresholds 4596 / 1002 us (cs149 §2; each 120% of its device p99).
    f = 4596 / 1002
    assert 4.58 < f < 4.59
    assert matmul_cycles(mm(128, 512, fp32=True), P2) == pytest.approx(f * 512)
    assert compute_ns(mm(128, 512, fp32=True), P2) == pytest.approx(f * 512 / 2.4)
    # the measured trn2 solution (seed 000: 3832 us fp32 / 824 us fp16, the same kernel) is at
    # least as far above the documented 4x: the factor is not above what either device shows
    assert 4 < f <= 3832 / 824
    # a short moving tile keeps MM_INIT_LATENCY as its bf16 floor, scaled the same way
    assert matmul_cycles(mm(128, 16, fp32=True), P2) == pytest.approx(f * 64)


def test_fp32_load_stationary_and_adjusted_flops_keep_the_documented_4x():
    # LoadStationary of an fp32 stationary: x4 (the documented fp32 rule) on both targets;
    # neuron-profile's adjusted_flops weight "FP32 uses 4.0x" is a definition, not a rate
    for p in (P1, P2):
        assert load_stationary_cycles(mm(128, 512, fp32=True), p) == 4 * 128 / 4
        assert adjusted_flops_factor(mm(128, 512, fp32=True), p) == 4


@pytest.mark.parametrize("m,n,expected", [
    (128, 1, 64),     # "Short Moving": MM II ~ 64 (§3.3 example)
    (1, 128, 128),    # "Short Stationary": ~128
    (32, 16, 32),     # min(64, 32) = 32 dominates N = 16
    (128, 64, 64),
    (100, 300, 300),
])
def test_matmul_formula(m, n, expected):
    assert matmul_cycles(mm(m, n), P2) == max(min(64, m), n) == expected


def test_load_stationary_is_quarter_of_stationary_free_size():
    assert load_stationary_cycles(mm(128, 512), P2) == 128 / 4
    assert load_stationary_cycles(mm(64, 512), P2) == 16
    # LS never exceeds the MM II, so back-to-back throughput is the MM II (max(LS_II, MM_II))
    for m in (1, 16, 64, 128):
        for n in (1, 64, 512):
            assert load_stationary_cycles(mm(m, n), P2) <= matmul_cycles(mm(m, n), P2)


def tp(p, f, fp32=False):
    """PE transpose of a (P, F) tile as nisa.nc_transpose records it: the matmul of the data
    (stationary: K = P, M = F) with a P x P identity (moving: N = P); the result is (F, P)."""
    return Instr("nc_transpose", TENSOR, (sb("x", p),), (sb("t", f, buffer="psum"),),
                 "float32", f, p, {"K": p, "M": f, "N": p, "fp32": fp32, "transpose": True,
                                   "accumulate": False, "flops": 0})


@pytest.mark.parametrize("p,f", [(128, 128), (32, 128), (128, 16), (64, 64), (128, 32),
                                 (16, 100)])
def test_pe_transpose(p, f):
    # max(P, min(64, F)) (§1.10 nc_transpose, §3.3): the matmul formula with M = F, N = P
    assert matmul_cycles(tp(p, f), P2) == max(p, min(64, f))
    assert matmul_cycles(tp(p, f), P2) == matmul_cycles(mm(f, p, k=p), P2)
    # fp32: 4x on NC-v2 (a matmul), NC-v3 transpose mode "2x faster for fp32" (§3.3)
    assert matmul_cycles(tp(p, f, True), P1) == 4 * max(p, min(64, f))
    assert matmul_cycles(tp(p, f, True), P2) == 2 * max(p, min(64, f))
    # LoadStationary of the (P, F) data: F / 4
    assert load_stationary_cycles(tp(p, f), P2) == f / 4
    assert load_stationary_cycles(tp(p, f, True), P1) == f


def test_nc_transpose_records_the_matmul_convention():
    """nisa.nc_transpose on the PE records K = P, M = F, N = P, as nc_matmul would."""
    import numpy as np

    import nkisim.shim
    nkisim.shim.install()
    import neuronxcc.nki as nki
    import neuronxcc.nki.isa as nisa
    import neuronxcc.nki.language as nl

    from nkisim.runtime import last_run

    @nki.jit(platform_target="trn2")
    def kernel(a):
        out = nl.ndarray((64, 128), dtype=a.dtype, buffer=nl.hbm)
        t = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=a, dst=t)
        tp_ = nisa.nc_transpose(t)
        c = nisa.tensor_copy(tp_)
        nisa.dma_copy(src=c, dst=out)
        return out

    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    np.testing.assert_array_equal(kernel(a), a.T)
    ins = next(i for i in last_run().trace.instrs if i.op == "nc_transpose")
    assert (ins.detail["K"], ins.detail["M"], ins.detail["N"]) == (128, 64, 128)
    assert (ins.partitions, ins.free) == (64, 128)                  # the (F, P) result
    assert matmul_cycles(ins, P2) == 2 * max(128, min(64, 64))      # fp32 transpose mode
    assert load_stationary_cycles(ins, P2) == 2 * 64 / 4


def test_adjusted_flops_factor():
    assert adjusted_flops_factor(mm(128, 512), P2) == 1
    assert adjusted_flops_factor(mm(128, 512, fp32=True), P2) == 4
    fp8 = mm(128, 512)
    fp8.detail["dtype_in"] = "float8_e4m3"
    assert adjusted_flops_factor(fp8, P2) == 0.5 and adjusted_flops_factor(fp8, P1) == 1


# --- Vector / Scalar / GpSimd (ref §1.10, §3.4) ------------------------------------------------
@pytest.mark.parametrize("params", [P1, P2])
def test_one_input_ops_cost_n_with_min_ii(params):
    for name in ("tensor_copy", "tensor_scalar"):
        assert stream_cycles(op(name, VECTOR, 1000), params) == 1000
        assert stream_cycles(op(name, VECTOR, 10), params) == 64            # MIN_II
        assert stream_cycles(op(name, VECTOR, 1), params) == 64
    assert stream_cycles(op("activation", SCALAR, 700), params) == 700


def test_engine_clocks():
    n = 1000
    assert compute_ns(op("tensor_scalar", VECTOR, n), P2) == pytest.approx(n / 0.96)
    # trn1: + the ~60-cycle static tensor-access overhead (NC-v2, ref §3.4)
    assert compute_ns(op("tensor_scalar", VECTOR, n), P1) == pytest.approx((n + 60) / 1.12)
    assert compute_ns(op("activation", SCALAR, n), P2) == pytest.approx(n / 1.2)
    assert compute_ns(op("activation", SCALAR, n), P1) == pytest.approx((n + 60) / 1.4)
    assert compute_ns(op("iota", GPSIMD, n), P1) == pytest.approx((150 + n + 60) / 1.4)


def tt(n, dtype="float32", psum_in=False, all16=False, alu="add", contiguous=True):
    return Instr("tensor_tensor", VECTOR, (sb("a"), sb("b")), (sb("o"),), dtype, 128, n,
                 {"inputs": 2, "psum_in": psum_in, "all_16bit": all16, "alu": alu,
                  "contiguous": contiguous})


@pytest.mark.parametrize("params", [P1, P2])
def test_tensor_tensor_rules(params):
    n = 512
    assert stream_cycles(tt(n), params) == 2 * n                           # else: 2N
    assert stream_cycles(tt(n, psum_in=True), params) == n                 # one input in PSUM
    for alu in ("add", "multiply", "subtract"):                            # all-bf16 add/mul/sub
        assert stream_cycles(tt(n, "bfloat16", all16=True, alu=alu), params) == n
    assert stream_cycles(tt(20), params) == 64                             # MIN_II


def test_tensor_tensor_bf16_other_ops():
    n = 512
    # trn1: only add/multiply/subtract get N; trn2 perf mode gives 2x to any all-16-bit SBUF op
    assert stream_cycles(tt(n, "bfloat16", all16=True, alu="maximum"), P1) == 2 * n
    assert stream_cycles(tt(n, "bfloat16", all16=True, alu="maximum"), P2) == n


def test_trn2_vector_perf_modes():
    n = 1024
    cp = op("tensor_copy", VECTOR, n, "bfloat16", all_16bit=True, contiguous=True)
    assert stream_cycles(cp, P2) == n / 4                                  # SBUF->SBUF 16-bit
    assert stream_cycles(cp, P1) == n                                      # no perf mode on trn1
    nc = op("tensor_scalar", VECTOR, n, "bfloat16", all_16bit=True, contiguous=False)
    assert stream_cycles(nc, P2) == n / 2                                  # non-contiguous: 2x
    ps = op("tensor_copy", VECTOR, n, "bfloat16", all_16bit=True, psum_in=True)
    assert stream_cycles(ps, P2) == n / 2                                  # PSUM side: 2x
    to_ps = op("tensor_copy", VECTOR, n, "bfloat16", out="psum", all_16bit=True)
    assert stream_cycles(to_ps, P2) == n / 2
    assert stream_cycles(op("tensor_copy", VECTOR, n), P2) == n            # fp32: none
    small = op("tensor_copy", VECTOR, 128, "bfloat16", all_16bit=True)
    assert stream_cycles(small, P2) == 64                                  # MIN_II still applies
    # only VectorE has the perf modes
    sc = op("tensor_copy", SCALAR, n, "bfloat16", all_16bit=True)
    assert stream_cycles(sc, P2) == n


def test_tensor_reduce():
    n = 512
    # the instruction's free size is the output's (1); N is the input's (detail in_free)
    def red(dtype, alu, **kw):
        return op("tensor_reduce", VECTOR, 1, dtype, alu=alu, in_free=n, **kw)

    assert stream_cycles(red("bfloat16", "add", all_16bit=True), P2) == n / 2
    assert stream_cycles(red("bfloat16", "maximum", all_16bit=True), P1) == n / 2
    assert stream_cycles(red("float32", "add"), P2) == n
    assert stream_cycles(red("bfloat16", "multiply", all_16bit=True), P2) == n


def test_memset_iota_activation_reduce_reciprocal():
    n = 1000
    assert stream_cycles(op("memset", VECTOR, n, "bfloat16", value=0.0), P2) == n / 2
    assert stream_cycles(op("memset", VECTOR, n, "bfloat16", value=1.0), P2) == n
    assert stream_cycles(op("memset", VECTOR, n, "float32", value=0.0), P2) == n
    assert stream_cycles(op("iota", GPSIMD, n), P2) == 150 + n
    assert stream_cycles(op("affine_select", GPSIMD, n), P2) == 150 + n
    assert stream_cycles(op("activation", SCALAR, n, reduce=True), P2) == n + 64
    assert stream_cycles(op("reciprocal", VECTOR, n), P2) == 8 * n
    assert stream_cycles(op("reciprocal", SCALAR, n), P2) == n
    assert stream_cycles(op("tensor_copy_dynamic_src", GPSIMD, 10), P2) == 600


def test_unknown_ops_fall_back_on_input_count():
    one = Instr("exp", SCALAR, (sb("a"),), (sb("o"),), "float32", 128, 300, {"inputs": 1})
    two = Instr("add", VECTOR, (sb("a"), sb("b")), (sb("o"),), "float32", 128, 300,
                {"inputs": 2})
    assert stream_cycles(one, P2) == 300
    assert stream_cycles(two, P2) == 600


# --- DMA (ref §3.1, §3.5) -----------------------------------------------------------------------
def test_table_interpolation():
    for x, y in DMA_EFFICIENCY_TABLE:
        assert table_efficiency(x) == pytest.approx(y)
    assert table_efficiency(768) == pytest.approx((0.21 + 0.42) / 2)
    assert table_efficiency(1 << 20) == 1.0
    assert table_efficiency(16) == pytest.approx(0.007)


def test_dma_efficiency_is_monotone_and_bounded():
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 100, 128, 200, 256, 384, 512, 800, 1024, 1500,
             2048, 3000, 4096, 6000, 8192, 12000, 16384, 30000, 32768, 65536, 1 << 20]
    for p in (P1, P2):
        effs = [dma_efficiency(b, p) for b in sizes]
        assert all(0 < e <= 1 for e in effs)
        assert all(a <= b for a, b in zip(effs, effs[1:]))
    assert dma_efficiency(0) == 0


def test_descriptor_overhead_is_fitted_to_the_saturating_chart_points():
    d = descriptor_overhead_bytes(P2)
    assert descriptor_overhead_bytes(P1) == d
    # each point alone: 4 KiB -> 145 B, 8 KiB -> 224 B, 16 KiB -> 334 B; least squares: ~162 B
    assert 145 < d < 200 and d == pytest.approx(161.6, abs=0.5)
    for x, y in DMA_EFFICIENCY_TABLE:
        assert dma_efficiency(x, P2) == pytest.approx(x / (x + d))
        rel = dma_efficiency(x, P2) / dma_efficiency(32768, P2)     # the chart is relative
        if x >= 4096:
            assert rel == pytest.approx(y, abs=0.01)
        else:
            # the chart's flat-time region is a transfer's fixed cost, not bandwidth
            assert rel > y
    # 9.5 ns per descriptor on trn1, 7.0 ns on trn2 (HBM share 22.6 B/ns)
    assert dma_plan(dma(1, 4), P1).row_ns == pytest.approx((4 + d) / 17.0)
    assert d / 17.0 == pytest.approx(9.5, abs=0.05)


def test_dma_plan_128x512_fp32_tile():
    # (128, 512) fp32 tile of a wider HBM matrix: 128 descriptors of 2 KiB, 16 queues x 8
    # partitions (§3.5), one descriptor overhead each
    ins = dma(128, 2048)
    d = descriptor_overhead_bytes(P2)
    bw = min(23.0, 362.0 / 16)                                      # HBM share per queue
    row_ns = (2048 + d) / bw
    for p in (P2, P2_DESC, P1):
        plan = dma_plan(ins, p)
        assert plan.queues == 16 and plan.rows == 128
        assert [plan.rows_on(j) for j in range(16)] == [8] * 16
        assert plan.nbytes == 128 * 2048 and plan.hbm_sides == 1
    plan = dma_plan(ins, P2_DESC)                                   # descriptor path
    assert plan.row_ns == pytest.approx(row_ns)
    assert plan.issue_ns == 0 and plan.fixed_ns == 1300
    assert plan.latency_ns == pytest.approx(1300 + 8 * row_ns)
    assert instr_cost_ns(ins, P2_DESC) == pytest.approx(plan.latency_ns)
    dge = dma_plan(ins, P2)                                         # hardware DGE: ~600 ns
    assert dge.issue_ns == pytest.approx(600.0) and dge.fixed_ns == 0
    assert dge.latency_ns == pytest.approx(max(600.0, 8 * row_ns))
    assert instr_cost_ns(ins, "trn2") == pytest.approx(dge.latency_ns)
    # a P=128 DGE DMA costs the documented "about 600 ns" (§3.5); the DGE generates one
    # descriptor per partition row, so a 1-descriptor DMA costs less: the trn2 tiled rows
    # (cs149 §5) give 1457 ns per iteration of three 1-descriptor DMAs + a 67 ns add
    one = dma_plan(dma(1, 4), P2).issue_ns
    assert one < 600.0
    assert 3 * one + 64 / 0.96 == pytest.approx((37318 - 14) * 1e3 / 25600, rel=0.03)
    p1 = dma_plan(ins, P1)
    assert p1.row_ns == pytest.approx((2048 + d) / 17.0) and p1.fixed_ns == 930


def test_contiguous_hbm_side_pays_one_descriptor_overhead_per_queue():
    d = descriptor_overhead_bytes(P1)
    # trn1 vector_add_tiled ROW_CHUNK=128: a contiguous 512 B of HBM into 128 partitions; each
    # queue moves 8 consecutive partitions = one 32 B HBM run
    tiny = dma_plan(dma(128, 4, contiguous=True), P1)
    assert tiny.occupancy_ns == pytest.approx((8 * 4 + d) / 17.0)
    assert tiny.occupancy_ns < 1.3 * dma_plan(dma(1, 4), P1).occupancy_ns
    strided = dma_plan(dma(128, 4), P1)                            # 128 separate HBM runs
    assert strided.occupancy_ns == pytest.approx(8 * (4 + d) / 17.0)
    # stores too (HBM destination), and large tiles: 8 x 8000 B + one overhead per queue
    store = dma_plan(dma(128, 8000, src="sbuf", dst="hbm", contiguous=True), P1)
    assert store.occupancy_ns == pytest.approx((8 * 8000 + d) / 17.0)
    # up to 16 descriptors every descriptor has its own queue anyway
    assert dma_plan(dma(16, 4, contiguous=True), P1).row_ns == pytest.approx((4 + d) / 17.0)
    # a casting DMA moves another byte count on its HBM side: taken as not contiguous
    cast = dma(128, 4, contiguous=True)
    cast.detail["bytes"] = 128 * 2
    cast.detail["row_bytes"] = 2
    assert dma_plan(cast, P1).row_ns == pytest.approx((2 + d) / 17.0)
    # DMA transposes keep their per-partition descriptors
    tr = dma_plan(dma(128, 2048, contiguous=True, transpose=True), P2)
    assert tr.row_ns == pytest.approx(dma_plan(dma(128, 2048, transpose=True), P2).row_ns)


def test_dma_paths():
    assert P2.dge and not P1.dge                                    # HWDGE is NC-v3+ (§1.10)
    assert not P2_DESC.dge and params_for("trn2", dge=False) is P2_DESC
    assert params_for("trn2", dge=True) is P2 and params_for("trn2") is P2
    assert params_for("trn1", dge=True) is P1
    assert P2_DESC.launch_ns == P2.launch_ns and P2_DESC.arch is P2.arch


def test_dma_queue_bandwidths():
    assert P2.queue_bytes_per_ns(0) == 23.0                         # SBUF->SBUF: engine peak
    assert P2.queue_bytes_per_ns(1) == pytest.approx(362.0 / 16)    # HBM per NC / 16
    assert P2.queue_bytes_per_ns(2) == pytest.approx(362.0 / 32)    # HBM read + write
    assert P1.queue_bytes_per_ns(1) == 17.0                         # 410/16 > 17
    sb_sb = dma_plan(dma(128, 2048, src="sbuf", dst="sbuf"), P2)
    assert sb_sb.row_ns == pytest.approx((2048 + descriptor_overhead_bytes(P2)) / 23.0)


def test_dma_small_and_uneven_transfers():
    one = dma_plan(dma(1, 4), P2_DESC)
    assert one.queues == 1
    assert one.latency_ns == pytest.approx(1300 + 4 / ((362 / 16) * dma_efficiency(4, P2)))
    uneven = dma_plan(dma(100, 256), P2)
    assert uneven.queues == 16
    assert sum(uneven.rows_on(j) for j in range(16)) == 100
    assert uneven.occupancy_ns == pytest.approx(7 * uneven.row_ns)


def test_dma_plan_falls_back_on_regions():
    ins = Instr("dma_copy", DMA, (Region("hbm", "x", "x", 0, 1, 0, 64 * 1024),),
                (Region("sbuf", "t", "t", 0, 64, 0, 1024),), "float32", 64, 256, {})
    plan = dma_plan(ins, P2)
    assert plan.rows == 64 and plan.row_bytes == 1024 and plan.nbytes == 64 * 1024
    assert plan.hbm_sides == 1


def _as16(ins):
    """The same DMA with a 2-byte dtype (the hardware-DGE transpose's dtype)."""
    from dataclasses import replace
    return replace(ins, dtype="bfloat16", free=ins.free * 2)


def test_dma_transpose_is_slower():
    # 2-byte dtypes on NC-v3: the hardware-DGE transpose at "up to 90%" (HBM->SBUF) / "50%"
    # (SBUF->SBUF) of DMA throughput (trn2 arch guide), one descriptor per partition
    plain = dma_plan(dma(128, 2048), P2).row_ns
    assert dma_plan(_as16(dma(128, 2048, transpose=True)), P2).row_ns == pytest.approx(
        plain / 0.9)
    # element-wise descriptors (as load_transpose2d records them) are costed per partition
    elem = dma_plan(_as16(dma(128 * 512, 4, p=128, transpose=True)), P2)
    assert elem.rows == 128 and elem.row_bytes == 2048
    assert elem.row_ns == pytest.approx(plain / 0.9)
    assert elem.issue_ns > 0                               # issued by the DGE
    sb_sb = dma_plan(_as16(dma(128, 2048, src="sbuf", dst="sbuf", transpose=True)), P2)
    assert sb_sb.row_ns == pytest.approx((2048 + descriptor_overhead_bytes(P2)) / 23.0 / 0.5)


def test_dma_transpose_of_4_byte_dtypes_by_blocks():
    # No hardware-DGE transpose for 4-byte dtypes (nki-dge.rst: "src.dtype must be 2 bytes"):
    # precomputed descriptors, one per partition per documented 16-element group of the
    # [128, 16] blocks the 16 DMA engines write together (trn2 arch guide, "DMA Transpose")
    d = descriptor_overhead_bytes(P2)
    tr = dma_plan(dma(128, 2048, transpose=True), P2)       # (128, 512) fp32
    assert tr.rows == 128 * 32 and tr.row_bytes == 64
    assert tr.row_ns == pytest.approx((64 + d) / P2.queue_bytes_per_ns(1))
    assert tr.issue_ns == 0 and tr.fixed_ns == P2.dma_fixed_ns
    # per byte: (64 + d) / 64 of a plain DMA's time, about 3.5x (the perf guide: DMA transposes
    # "can degrade DMA bandwidth significantly"); a partial last group is one descriptor too
    assert tr.occupancy_ns > 3 * dma_plan(dma(128, 2048), P2).occupancy_ns
    assert dma_plan(dma(128, 2040, transpose=True), P2).rows == 128 * 32
    # NC-v2 has no DGE: every dtype goes by blocks
    assert dma_plan(_as16(dma(128, 2048, transpose=True)), P1).row_bytes == 32


def test_launch_overhead_and_fixed_latency_constants():
    # NC-v3 descriptor path: the documented cross-engine DMA latency (§3.5); NC-v2: derived from
    # the trn1 vector_add_tiled rows (COST_PARAMS comment, benchmarks/calibrate.py --derive)
    assert P2.dma_fixed_ns == P2_DESC.dma_fixed_ns == 1300.0
    assert P1.dma_fixed_ns == 930.0
    # launch overheads: mean over each target's one- and two-iteration rows, below every one of
    # those measurements (15 / 27 us on trn2, 19 / 28.5 us on trn1)
    assert P2.launch_ns == 13_700.0 and P1.launch_ns == 14_600.0
    assert P2.dep_latency_ns(SCALAR) == pytest.approx(200 / 1.2)
    assert P1.dep_latency_ns(SCALAR) == pytest.approx(200 / 1.4)   # 264 - 64 cycles (§3.4)
    assert P2.dep_latency_ns(DMA) == 0.0


def test_an_mgrid_indexed_dma_is_costed_by_its_contiguous_runs():
    # `a[m*128 + i.p, i.x]` with `i = nl.mgrid[0:128, 0:512]` addresses the same bytes as the
    # slice `a[m*128:(m+1)*128, :]`: 128 runs of 2 KiB, one descriptor each (ref §3.5), not one
    # descriptor per element
    import neuronxcc.nki as nki
    import neuronxcc.nki.language as nl

    from nkisim.runtime import last_run

    @nki.jit
    def with_mgrid(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
        i = nl.mgrid[0:128, 0:512]
        for m in nl.affine_range(a.shape[0] // 128):
            t = nl.load(a[m * 128 + i.p, i.x])
            nl.store(out[m * 128 + i.p, i.x], value=t)
        return out

    @nki.jit
    def with_slice(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
        for m in nl.affine_range(a.shape[0] // 128):
            t = nl.load(a[m * 128:(m + 1) * 128, :])
            nl.store(out[m * 128:(m + 1) * 128, :], value=t)
        return out

    a = np.arange(512 * 512, dtype=np.float32).reshape(512, 512)
    runs = []
    for k in (with_mgrid, with_slice):
        np.testing.assert_array_equal(k(a), a)
        dmas = [i for i in last_run().trace.instrs if i.op == "dma_copy"]
        runs.append([(i.detail["rows"], i.detail["row_bytes"]) for i in dmas])
    assert runs[0] == runs[1] == [(128, 2048)] * 8

    @nki.jit
    def strided(a):                      # every other column: 4-byte runs
        out = nl.ndarray((128, 256), dtype=a.dtype, buffer=nl.hbm)
        i = nl.mgrid[0:128, 0:256]
        t = nl.load(a[i.p, 2 * i.x])
        nl.store(out, value=t)
        return out

    np.testing.assert_array_equal(strided(a), a[:128, ::2])
    load_ins = next(i for i in last_run().trace.instrs if i.op == "dma_copy")
    assert load_ins.detail["row_bytes"] == 4 and load_ins.detail["rows"] == 128 * 256


def test_a_masked_instruction_is_costed_by_the_elements_its_mask_keeps():
    # ref §1.12: a masked instruction is "lowered into a hardware ISA instruction that only
    # processes" the masked-in elements (64x256 of a 128x512 tile for (i_p < 64) & (i_f < 256)).
    # A tail spelled as nl.arange(512) with mask=(i_f < 200) moves and adds what the slice
    # [:, 0:200] does: the same DMA records (bytes, runs) and the same engine extents.
    import neuronxcc.nki as nki
    import neuronxcc.nki.language as nl

    from nkisim.runtime import last_run

    def make(kind):
        @nki.jit
        def k(a, b):
            out = nl.ndarray((128, 200), dtype=a.dtype, buffer=nl.shared_hbm)
            if kind == "slice":
                s = nl.add(nl.load(a[:, 0:200]), nl.load(b[:, 0:200]))
                nl.store(out[:, 0:200], value=s)
            else:
                i_p, i_f = nl.arange(128)[:, None], nl.arange(512)[None, :]
                m = i_f < 200
                s = nl.add(nl.load(a[i_p, i_f], mask=m), nl.load(b[i_p, i_f], mask=m), mask=m)
                nl.store(out[i_p, i_f], value=s, mask=m)
            return out
        return k

    a, b = (np.random.default_rng(3).random((128, 200), dtype=np.float32) for _ in range(2))
    records = []
    for kind in ("slice", "masked"):
        np.testing.assert_array_equal(make(kind)(a, b), a + b)
        records.append([(i.op, i.partitions, i.free,
                         {k: i.detail.get(k) for k in ("bytes", "rows", "row_bytes")}
                         if i.op == "dma_copy" else None)
                        for i in last_run().trace.instrs])
    assert records[0] == records[1]
    assert records[1][0] == ("dma_copy", 128, 200,
                             {"bytes": 128 * 800, "rows": 128, "row_bytes": 800})

    @nki.jit
    def corner(a):                       # the doc's mask: 64 partitions x 256 elements
        out = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(512)[None, :]
        m = (i_p < 64) & (i_f < 256)
        t = nl.load(a, mask=m)
        nl.store(out, value=nl.exp(t, mask=m), mask=m)
        return out

    x = np.zeros((128, 512), np.float32)
    with pytest.warns(Warning, match="partly written"):
        corner(x)
    ins = last_run().trace.instrs
    assert [(i.op, i.partitions, i.free) for i in ins] == \
        [("dma_copy", 64, 256), ("activation", 64, 256), ("dma_copy", 64, 256)]
    # each partition's 256 elements are one 1 KiB run of the 2 KiB rows of `a`
    assert ins[0].detail["bytes"] == 64 * 1024 and ins[0].detail["row_bytes"] == 1024


def test_pe_tiles_of_a_kernel_are_recorded_and_run_in_parallel():
    # ref §1.10 nc_matmul (PE tiling: "multiple small nc_matmul instructions to execute in
    # parallel on the PE array"): two 128x64 column tiles of one product cost what the whole
    # 128x128 matmul does, not twice as much; the values are the same
    import neuronxcc.nki as nki
    import neuronxcc.nki.isa as nisa
    import neuronxcc.nki.language as nl

    from nkisim.runtime import estimate, last_run

    def make(tiled):
        @nki.jit
        def k(a, b):
            out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
            st = nl.load(a)
            mv = nl.load(b)
            ps = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
            for _i in nl.affine_range(64):
                if tiled:
                    for h in nl.static_range(2):
                        ps[h * 64:(h + 1) * 64, :] += nisa.nc_matmul(
                            st[:, h * 64:(h + 1) * 64], mv, tile_position=(0, h * 64),
                            tile_size=(128, 64))
                else:
                    ps += nisa.nc_matmul(st, mv)
            nl.store(out, nl.copy(ps))
            return out
        return k

    rng = np.random.default_rng(5)
    a, b = rng.random((128, 128)).astype(np.float16), rng.random((128, 512)).astype(np.float16)
    ref = 64 * (a.astype(np.float64).T @ b)
    us = {}
    for tiled in (False, True):
        np.testing.assert_allclose(make(tiled)(a, b), ref, rtol=1e-5)
        run = last_run()
        mms = [i for i in run.trace.instrs if i.op == "nc_matmul"]
        assert {i.detail.get("pe_tile") for i in mms} == (
            {(0, 0, 128, 64), (0, 64, 128, 64)} if tiled else {None})
        us[tiled] = estimate(run)[1]
    assert us[True] == pytest.approx(us[False], rel=0.05)
