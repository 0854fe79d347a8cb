"""`--time`: each policy's step time on the target GPUs, from XLA's own cost models of the compiled
step (issue 39).

Everywhere: the kernel reader on HLO text written here (trip counts, a GEMM's FLOPs, what a fusion
reads through a slice), each kernel's rule against figures computed here by hand (XLA's estimate
where it stands, the bf16 x bf16 -> f32 GEMM's rescaled one, the roofline floor), the record's
JSON and the cache's entries. In the gpu-target lane (the [gpu] extra): compiled steps, whose
figures are checked against the HLO the estimate compile wrote, read here with regexes of its own.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import jsonschema
import pytest
from _gpu_lane import LANE, MISSING_GPU_TARGET, ROOT, cli, compiles

from te_ckpt_audit import audit
from te_ckpt_audit.gpus import BF16, F32, GpuRequest, gpu_model
from te_ckpt_audit.records import JSON_SCHEMA, KernelKind, StepTime, to_plain
from te_ckpt_audit.targets import _steptime as steptime
from te_ckpt_audit.targets._kernels import Kernel, step_kernels

H100 = gpu_model("h100")
PEAK_BF16 = H100.dense_flops(BF16)
SLOWER = 1 / steptime.TENSOR_EFFICIENCY  # a training step's GEMMs and attention against their isolated speed


@pytest.fixture(scope="module", autouse=True)
def _the_lane_has_everything() -> None:
    if LANE and MISSING_GPU_TARGET is not None:
        pytest.fail(f"the gpu-target lane cannot compile for a GPU: {MISSING_GPU_TARGET}")


# --- each kernel's rule, by hand -----------------------------------------------------------------


def gemm(m: int, n: int, k: int, sol_us: float | None, widening: int = 1, precision: str = "bf16") -> Kernel:
    moved = 2 * (m * k + k * n) + 2 * widening * m * n
    costs = () if sol_us is None else (("sol", sol_us),)
    return Kernel("gemm", KernelKind.GEMM, 2 * m * n * k, moved, precision, widening, costs)


def test_a_gemm_takes_xlas_estimate_where_it_stands_above_the_floor() -> None:
    big = gemm(8192, 8192, 8192, 1409.28)  # XLA's table: 780 TFLOP/s
    assert steptime.timed(big, H100).seconds == pytest.approx(1409.28e-6 * SLOWER, rel=1e-12)
    assert steptime.timed(big, H100).basis == "sol"


def test_a_gemm_never_runs_above_the_peak_of_its_type() -> None:
    fast = gemm(8192, 8192, 8192, 100.0)  # an estimate above the peak: the floor
    floor = 2 * 8192**3 / PEAK_BF16
    assert steptime.timed(fast, H100).seconds == pytest.approx(floor * SLOWER, rel=1e-12)
    assert steptime.timed(fast, H100).basis == "roofline"
    tf32 = gemm(8192, 8192, 8192, None, precision="tf32")
    assert steptime.timed(tf32, H100).seconds == pytest.approx(2 * 8192**3 / H100.dense_flops(F32) * SLOWER, rel=1e-12)
    assert H100.dense_flops(F32) == pytest.approx(PEAK_BF16 / 2)


def test_an_fp8_gemm_runs_at_the_fp8_rate() -> None:
    """Issue 49: XLA's `sol` times cuBLAS's FP8 GEMM at its table's BF16 speed for the shape (780
    TFLOP/s on an H100 for a big one); the FP8 tensor cores run twice the BF16 rate."""
    from te_ckpt_audit.gpus import FP8

    fp8 = gemm(8192, 8192, 8192, 1409.28, precision="fp8")
    ratio = PEAK_BF16 / H100.dense_flops(FP8[0])
    assert ratio == pytest.approx(0.5)
    assert steptime.timed(fp8, H100).seconds == pytest.approx(1409.28e-6 * ratio * SLOWER, rel=1e-12)
    assert steptime.timed(fp8, H100).basis == "sol"
    bf16 = gemm(8192, 8192, 8192, 1409.28)
    assert steptime.timed(bf16, H100).seconds == pytest.approx(1409.28e-6 * SLOWER, rel=1e-12)


def test_the_kernels_no_model_times_are_counted_apart() -> None:
    """Issue 49: what the estimate cannot see (a kernel with no cost model's estimate, as TE's GEMM
    custom calls, taken at its roofline floor) is said in the record: its seconds and runs."""
    seen = gemm(8192, 8192, 8192, 1409.28)
    unseen = dataclasses.replace(gemm(4096, 4096, 4096, None), runs=3)
    time = steptime.estimate([seen, unseen], H100, 1, 1.0)
    floor = 2 * 4096**3 / PEAK_BF16 * SLOWER
    assert time.floor_kernels == 3 and time.floor_seconds == pytest.approx(3 * floor, rel=1e-12)
    assert time.compute_seconds == pytest.approx(1409.28e-6 * SLOWER + 3 * floor, rel=1e-12)
    assert steptime.from_plain(to_plain(time)) == time
    from te_ckpt_audit.records import AuditReport, PolicyResult, Scope, TeKind, Totals
    from te_ckpt_audit.render._common import time_notes

    row = PolicyResult("p", Scope.OUTER, (), Totals(0, 0, 0, 0, 0, 0, 0, 0), (), 0, 0, (), time=time)
    report = AuditReport("t", (), "0", TeKind.NONE, (), (row,))
    assert any("3 kernel runs) is kernels no cost model times" in n for n in time_notes(report))


def test_a_bf16_gemm_with_an_f32_result_has_xlas_fallback_taken_out() -> None:
    """XLA's table has no bf16 x bf16 -> f32 entry; its fallback scales the bf16 one by 4^3."""
    widened = gemm(8192, 8192, 8192, 1409.28 * 64, widening=2)
    assert steptime.timed(widened, H100).seconds == pytest.approx(1409.28e-6 * SLOWER, rel=1e-12)


def test_a_memory_kernel_is_floored_at_hbm_bandwidth_and_placeholders_are_dropped() -> None:
    moved = 1 << 30
    floor = moved / H100.bandwidth
    copy = Kernel("f", KernelKind.MEMORY, 0, moved, xla_us=(("sol", 0.01), ("", 1e8)))  # both absurd
    assert steptime.timed(copy, H100).seconds == pytest.approx(floor, rel=1e-12)
    assert steptime.timed(copy, H100).high == pytest.approx(floor, rel=1e-12)  # 100 s is a placeholder
    slow = Kernel("f", KernelKind.MEMORY, 0, moved, xla_us=(("sol", 2e6 * floor), ("", 3e6 * floor)))
    timed = steptime.timed(slow, H100)
    assert (timed.seconds, timed.low, timed.high) == pytest.approx((2 * floor, 2 * floor, 3 * floor), rel=1e-12)


def test_a_collective_moves_its_bytes_over_its_links_as_a_ring() -> None:
    rates = H100.rates
    assert rates is not None
    all_reduce = Kernel("ar", KernelKind.COLLECTIVE, 0, 1 << 30, group=8, collective="all-reduce")
    assert steptime.timed(all_reduce, H100).seconds == pytest.approx(2 * 7 / 8 * (1 << 30) / rates.nvlink_bytes)
    across = Kernel("ag", KernelKind.COLLECTIVE, 0, 1 << 30, group=16, spans_hosts=True, collective="all-gather")
    assert steptime.timed(across, H100).seconds == pytest.approx(15 / 16 * (1 << 30) / rates.network_bytes)


def test_the_step_is_the_sum_of_its_kernel_runs() -> None:
    kernels = [gemm(4096, 4096, 4096, 200.0), Kernel("f", KernelKind.MEMORY, 0, 1 << 28, runs=4)]
    expected = max(200e-6, 2 * 4096**3 / PEAK_BF16) * SLOWER + 4 * (1 << 28) / H100.bandwidth
    time = steptime.estimate(kernels, H100, 1, 1.0)
    assert time.seconds == pytest.approx(expected, rel=1e-12)
    assert time.kernels == 5 and time.hlo_flops == 2 * 4096**3
    assert time.exposed_communication_seconds == 0.0 == time.communication_seconds


# --- the kernel reader on HLO text written here ----------------------------------------------------

LOOP = """HloModule step, is_scheduled=true

%fused_slice (param_0: bf16[{layers},1024,1024], param_1: s32[]) -> bf16[1024,1024] {{
  %param_0 = bf16[{layers},1024,1024]{{2,1,0}} parameter(0)
  %param_1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %slice = bf16[1,1024,1024]{{2,1,0}} dynamic-slice(%param_0, %param_1, %zero, %zero), dynamic_slice_sizes={{1,1024,1024}}
  ROOT %b = bf16[1024,1024]{{1,0}} bitcast(%slice)
}}

%body (p: (s32[], bf16[4096,1024], bf16[{layers},1024,1024])) -> (s32[], bf16[4096,1024], bf16[{layers},1024,1024]) {{
  %p = (s32[], bf16[4096,1024]{{1,0}}, bf16[{layers},1024,1024]{{2,1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = bf16[4096,1024]{{1,0}} get-tuple-element(%p), index=1
  %ws = bf16[{layers},1024,1024]{{2,1,0}} get-tuple-element(%p), index=2
  %w = bf16[1024,1024]{{1,0}} fusion(%ws, %i), kind=kLoop, calls=%fused_slice, backend_config={{"reification_cost":[{{"exec_time_us":2.5,"name":"sol"}}]}}
  %mm = (bf16[4096,1024]{{1,0}}, s8[4194304]{{0}}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", metadata={{op_name="jit(step)/layer/dot_general" source_file="/home/u/model.py" source_line=12}}, backend_config={{"gemm_backend_config":{{"dot_dimension_numbers":{{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}},"reification_cost":[{{"exec_time_us":20.0,"name":"sol"}}]}}
  %y = bf16[4096,1024]{{1,0}} get-tuple-element(%mm), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[4096,1024]{{1,0}}, bf16[{layers},1024,1024]{{2,1,0}}) tuple(%next, %y, %ws)
}}

%cond (c: (s32[], bf16[4096,1024], bf16[{layers},1024,1024])) -> pred[] {{
  %c = (s32[], bf16[4096,1024]{{1,0}}, bf16[{layers},1024,1024]{{2,1,0}}) parameter(0)
  %ci = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant({layers})
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}}

ENTRY %main (a: bf16[4096,1024], b: bf16[{layers},1024,1024]) -> bf16[4096,1024] {{
  %a = bf16[4096,1024]{{1,0}} parameter(0)
  %b = bf16[{layers},1024,1024]{{2,1,0}} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4096,1024]{{1,0}}, bf16[{layers},1024,1024]{{2,1,0}}) tuple(%zero, %a, %b)
  %loop = (s32[], bf16[4096,1024]{{1,0}}, bf16[{layers},1024,1024]{{2,1,0}}) while(%init), condition=%cond, body=%body, backend_config={{"known_trip_count":{{"n":"{layers}"}}}}
  ROOT %out = bf16[4096,1024]{{1,0}} get-tuple-element(%loop), index=1
}}
"""  # noqa: E501 - HLO as XLA prints it


def test_the_reader_runs_a_loop_body_its_trip_count_and_reads_only_the_slice() -> None:
    kernels = step_kernels(LOOP.format(layers=8))
    by_name = {k.name: k for k in kernels}
    assert set(by_name) == {"w", "mm", "next"}
    mm, w = by_name["mm"], by_name["w"]
    assert (mm.kind, mm.runs, mm.flops, mm.precision, mm.widening) == (KernelKind.GEMM, 8, 2 * 4096 * 1024 * 1024,
                                                                      "bf16", 1)
    assert mm.bytes == 2 * (4096 * 1024 + 1024 * 1024 + 4096 * 1024)  # the workspace is not HBM traffic
    assert mm.xla_us == (("sol", 20.0),) and mm.source == "jit(step)/layer/dot_general (model.py:12)"
    assert (w.kind, w.runs) == (KernelKind.MEMORY, 8)
    assert w.bytes == 2 * 1024 * 1024 + 4 + 2 * 1024 * 1024  # one layer's slice read, its index, the result


QDQ = """HloModule m, entry_computation_layout={(bf16[128,256]{1,0}, bf16[256,256]{1,0})->bf16[128,256]{1,0}}

%qdq (p: bf16[128,256]) -> bf16[128,256] {
  %p = bf16[128,256]{1,0} parameter(0)
  %q = f8e4m3fn[128,256]{1,0} convert(%p)
  ROOT %dq = bf16[128,256]{1,0} convert(%q)
}

%qdq_amax (g: bf16[128,256]) -> (bf16[128,256], bf16[]) {
  %g = bf16[128,256]{1,0} parameter(0)
  %g8 = f8e5m2[128,256]{1,0} convert(%g)
  %gdq = bf16[128,256]{1,0} convert(%g8)
  %zero = bf16[] constant(0)
  %amax = bf16[] reduce(%g, %zero), dimensions={0,1}, to_apply=%qdq
  ROOT %both = (bf16[128,256]{1,0}, bf16[]) tuple(%gdq, %amax)
}

%qdqw (p: bf16[256,256]) -> bf16[256,256] {
  %p = bf16[256,256]{1,0} parameter(0)
  %q = f8e4m3fn[256,256]{1,0} convert(%p)
  ROOT %dq = bf16[256,256]{1,0} convert(%q)
}

ENTRY %main (x: bf16[128,256], w: bf16[256,256]) -> bf16[128,256] {
  %x = bf16[128,256]{1,0} parameter(0)
  %w = bf16[256,256]{1,0} parameter(1)
  %x8 = bf16[128,256]{1,0} fusion(%x), kind=kLoop, calls=%qdq
  %t = bf16[128,256]{1,0} bitcast(%x8)
  %w8 = bf16[256,256]{1,0} fusion(%w), kind=kLoop, calls=%qdqw
  %mm = (bf16[128,256]{1,0}, s8[1024]{0}) custom-call(%t, %w8), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %plain = (bf16[128,256]{1,0}, s8[1024]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %g2 = (bf16[128,256]{1,0}, bf16[]) fusion(%x), kind=kInput, calls=%qdq_amax
  %g2q = bf16[128,256]{1,0} get-tuple-element(%g2), index=0
  %grad = (bf16[128,256]{1,0}, s8[1024]{0}) custom-call(%g2q, %w8), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %half = (bf16[128,256]{1,0}, s8[1024]{0}) custom-call(%g2q, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %out = bf16[128,256]{1,0} get-tuple-element(%mm), index=0
}
"""  # noqa: E501 - HLO as XLA prints it


def test_a_gemm_of_quantize_dequantized_operands_is_an_fp8_gemm() -> None:
    """Issue 49: MaxText's FP8 (Flax's FP8 dot general) compiles without a GPU to BF16 cuBLAS GEMMs
    whose operands come out of a quantize-dequantize fusion; on the GPU XLA makes them FP8 GEMMs. The
    reader calls such a GEMM fp8 (and the estimate runs it at the FP8 rate); a plain one stays bf16.
    The backward pass's quantize-dequantize also takes the amax (a multi-output fusion): its GEMMs
    read the quantized tensor through a get-tuple-element, and are FP8 GEMMs too."""
    by_name = {k.name: k for k in step_kernels(QDQ)}
    assert (by_name["mm"].kind, by_name["mm"].precision) == (KernelKind.GEMM, "fp8")
    assert (by_name["grad"].kind, by_name["grad"].precision) == (KernelKind.GEMM, "fp8")
    assert (by_name["plain"].kind, by_name["plain"].precision) == (KernelKind.GEMM, "bf16")
    # issue 56, item 6: one quantized operand beside a BF16 one is a BF16 GEMM (cuBLASLt's FP8 takes two)
    assert (by_name["half"].kind, by_name["half"].precision) == (KernelKind.GEMM, "bf16")


def test_a_scan_of_eight_layers_costs_twice_a_scan_of_four_in_its_loop() -> None:
    four, eight = (steptime.estimate(step_kernels(LOOP.format(layers=n)), H100, 1, 0.0) for n in (4, 8))
    assert four.seconds is not None and eight.seconds is not None
    assert eight.seconds == pytest.approx(2 * four.seconds, rel=1e-12)
    assert eight.hlo_flops == 2 * four.hlo_flops


MESH = """HloModule step, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: bf16[1024,1024], w: bf16[1024,1024]) -> f32[1024,1024] {
  %x = bf16[1024,1024]{1,0} parameter(0)
  %w = bf16[1024,1024]{1,0} parameter(1)
  %ag = (bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0}) all-gather-start(%x), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %mm = (bf16[1024,1024]{1,0}, s8[4194304]{0}) custom-call(%w, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}},"reification_cost":[{"exec_time_us":10.0,"name":"sol"}]}
  %agd = bf16[8192,1024]{1,0} all-gather-done(%ag)
  %y = bf16[1024,1024]{1,0} get-tuple-element(%mm), index=0
  %f = f32[1024,1024]{1,0} convert(%y)
  ROOT %ar = f32[1024,1024]{1,0} all-reduce(%f), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
}
"""  # noqa: E501 - HLO as XLA prints it


def test_an_asynchronous_collective_hides_behind_the_kernels_scheduled_before_its_wait() -> None:
    rates = H100.rates
    assert rates is not None
    kernels = step_kernels(MESH, devices=8, gpus_per_host=8)
    gather = next(k for k in kernels if k.name == "ag")
    assert (gather.collective, gather.group, gather.asynchronous, gather.bytes) == ("all-gather", 8, True, 8 * 2**21)
    assert [k.waits_for for k in kernels if k.waits_for] == ["ag"]
    time = steptime.estimate(kernels, H100, 8, 0.0)
    gathering = 7 / 8 * 8 * 2**21 / rates.nvlink_bytes  # 32.6 us over NVLink
    reducing = 2 * 7 / 8 * 4 * 2**20 / rates.nvlink_bytes  # synchronous: all of it exposed
    gemm = 10e-6 * SLOWER  # XLA's sol, above its floor (2.2 us)
    convert = (2 + 4) * 2**20 / H100.bandwidth
    assert time.communication_seconds == pytest.approx(gathering + reducing, rel=1e-12)
    assert time.exposed_communication_seconds == pytest.approx(gathering - gemm + reducing, rel=1e-9)
    assert time.seconds == pytest.approx(gemm + convert + (gathering - gemm) + reducing, rel=1e-9)
    assert time.kernels == 4  # the wait is no kernel


# --- the record, its JSON and the cache ------------------------------------------------------------


def test_the_time_round_trips_through_json_and_the_cache() -> None:
    time = steptime.estimate(step_kernels(LOOP.format(layers=4)), H100, 1, 1.25)
    plain = json.loads(json.dumps(to_plain(time)))
    assert steptime.from_plain(plain) == time
    assert plain["mfu"] == time.mfu == 0.0  # no model FLOPs yet: the session sets them
    jsonschema.validate(plain, JSON_SCHEMA["properties"]["results"]["items"]["properties"]["time"])
    for broken in ({**plain, "seconds": -1.0}, {**plain, "kernels": 1.5}, {**plain, "costliest": [{"kind": "x"}]},
                   {k: v for k, v in plain.items() if k != "devices"}, {**plain, "compute_seconds": float("nan")}):
        assert steptime.from_plain(broken) is None


def test_utilisation_and_throughput_are_the_models_flops_over_the_time() -> None:
    time = StepTime(2.0, 1.5, 2.5, 2.0, 0.0, 0.0, 10, 0, 4 * 10**15, 10**15, 10**15, 8192, 8, (), "m", 0.0)
    assert time.mfu == pytest.approx(2.0) and time.hfu == pytest.approx(2.5)
    assert time.tflops_per_gpu == pytest.approx(2000.0)
    assert time.tokens_per_second_per_gpu == pytest.approx(512.0)


@pytest.mark.parametrize(("args", "said"), [
    (["--time"], "--time is about the step compiled for a GPU"),
    (["--gpu", "h100", "--network-gbps", "100"], "--network-gbps is about the step time estimate"),
    (["--gpu", "h100", "--time", "--network-gbps", "0"], "--network-gbps 0.0 must be from 0.1 to 100000 Gb/s"),
    (["--gpu", "h100", "--time", "--network-gbps", "nan"], "--network-gbps nan must be from 0.1 to 100000 Gb/s"),
])
def test_time_and_its_network_are_checked_before_any_work(args: list[str], said: str) -> None:
    run = cli("sample_models/mlp.py:loss", *args)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith(f"te-ckpt-audit: error: {said}"), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_the_networks_bandwidth_times_what_crosses_hosts() -> None:
    slow = GpuRequest(H100, time=True, network_gbps=100).timed_model
    across = Kernel("ag", KernelKind.COLLECTIVE, 0, 1 << 30, group=16, spans_hosts=True, collective="all-gather")
    within = dataclasses.replace(across, group=8, spans_hosts=False)
    assert steptime.timed(across, slow).seconds == pytest.approx(15 / 16 * (1 << 30) / 12.5e9)
    assert steptime.timed(within, slow).seconds == steptime.timed(within, H100).seconds  # NVLink as it was


# --- compiled steps (the gpu-target lane) ---------------------------------------------------------


def _gemm_step(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.sum((x @ w).astype(jnp.float32))


def _costs(hlo: str, name: str) -> dict[str, float]:
    line = next(line for line in hlo.splitlines() if re.search(rf"%{re.escape(name)} = ", line))
    found = re.finditer(r'"exec_time_us":([\d.e+-]+)[^}]*"name":"([^"]*)"', line)
    return {m.group(2): float(m.group(1)) for m in found}


@compiles
def test_a_single_gemm_is_timed_as_xlas_table_or_its_roofline_by_hand() -> None:
    m, k, n = 8192, 4096, 8192
    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16))
    request = GpuRequest(H100, step=True, time=True)
    report = audit(_gemm_step, *args, policies=["as-is"], gpu=request)
    time = report.results[0].time
    assert time is not None and time.error is None and time.seconds is not None
    top = time.costliest[0]
    assert top.kind is KernelKind.GEMM and top.flops == 2 * m * n * k
    from te_ckpt_audit._session import Session
    from te_ckpt_audit.specs import resolve_policy

    session = Session.of_function(_gemm_step, *args, own_step=True)
    spec = resolve_policy("as-is")
    hlo = session.compiler(request).estimate_text(spec, session.resolved_scope(spec))
    sol = _costs(hlo, top.name)["sol"] * 1e-6
    floor = max(2 * m * n * k / PEAK_BF16, 2 * (m * k + k * n + m * n) / H100.bandwidth)
    assert top.seconds == pytest.approx(max(sol, floor) * SLOWER, rel=1e-9)
    assert top.basis == ("sol" if sol >= floor else "roofline")
    assert 0.3 < 2 * m * n * k / top.seconds / PEAK_BF16 <= steptime.TENSOR_EFFICIENCY  # a big bf16 GEMM


@compiles
def test_a_gpu_without_xlas_cost_table_is_timed_at_its_roofline_and_says_so() -> None:
    """Issue 49: an A100 (sm_80, absent from XLA's cost tables) got no estimate ("NOT_FOUND: Cannot
    find key: sm_80"); now every kernel is at its roofline on the A100's own figures, and the
    record names that method."""
    m, k, n = 8192, 4096, 8192
    a100 = gpu_model("a100")
    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16))
    time = audit(_gemm_step, *args, policies=["as-is"], gpu=GpuRequest(a100, step=True, time=True)).results[0].time
    assert time is not None and time.error is None and time.seconds is not None
    assert time.estimator == steptime.ROOFLINE_ESTIMATOR and "no entry for sm_80" in time.model
    assert all(k.basis == "roofline" for k in time.costliest)
    top = time.costliest[0]
    assert top.kind is KernelKind.GEMM and top.flops == 2 * m * n * k
    floor = max(2 * m * n * k / a100.dense_flops(BF16), 2 * (m * k + k * n + m * n) / a100.bandwidth)
    assert top.seconds == pytest.approx(floor * SLOWER, rel=1e-9)


def _stack(w: jax.Array, x: jax.Array) -> jax.Array:
    def layer(h: jax.Array, wi: jax.Array) -> tuple[jax.Array, None]:
        return jnp.tanh(h @ wi), None

    return jnp.mean(jax.lax.scan(layer, x, w)[0].astype(jnp.float32))


def _stack_time(layers: int, batch: int, policy: str) -> StepTime:
    args = (jax.ShapeDtypeStruct((layers, 2048, 2048), jnp.bfloat16), jax.ShapeDtypeStruct((batch, 2048), jnp.bfloat16))
    report = audit(_stack, *args, policies=[policy], gpu=GpuRequest(H100, time=True), params=0)
    time = report.results[0].time
    assert time is not None and time.error is None and time.seconds is not None, time
    return time


@compiles
def test_a_compiled_scan_of_eight_layers_costs_about_twice_four() -> None:
    four, eight = _stack_time(4, 8192, "nothing_saveable"), _stack_time(8, 8192, "nothing_saveable")
    assert four.seconds is not None and eight.seconds is not None
    looped = [k for k in eight.costliest if k.runs == 8]
    assert looped, eight.costliest  # the layers' kernels run once per layer
    assert 1.8 < eight.seconds / four.seconds < 2.05
    assert eight.model_flops == pytest.approx(2 * four.model_flops, rel=1e-3)


@compiles
def test_a_larger_batch_never_lowers_the_step_time() -> None:
    times = [_stack_time(4, b, "nothing_saveable").seconds or 0.0 for b in (2048, 4096, 8192)]
    assert times == sorted(times) and 0 < times[0] < times[-1]


@compiles
def test_a_policy_that_recomputes_more_never_runs_faster() -> None:
    saved = _stack_time(4, 8192, "dots_saveable")
    recomputed = _stack_time(4, 8192, "nothing_saveable")
    assert recomputed.recompute_flops > saved.recompute_flops
    assert recomputed.seconds is not None and saved.seconds is not None
    assert recomputed.seconds > saved.seconds
    assert recomputed.hfu is not None and recomputed.mfu is not None and recomputed.hfu > recomputed.mfu


@compiles
def test_time_on_the_command_line_is_json_under_the_schema(tmp_path: Any) -> None:
    out = tmp_path / "report.json"
    run = cli("sample_models/mlp.py:loss", "--gpu", "h100", "--time", "-p", "nothing_saveable", "--format", "json",
              "-o", str(out))
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, JSON_SCHEMA)
    time = doc["results"][0]["time"]
    assert time["seconds"] > 0 and time["model"] == steptime.METHOD and math.isfinite(time["mfu"])
    assert time["model_flops"] == 3 * doc["results"][0]["forward_flops"]


@compiles
def test_a_model_file_that_turns_on_jaxs_persistent_cache_runs_twice(tmp_path: Any) -> None:
    """Training scripts turn JAX's persistent compilation cache on at import. A device-less compile
    written there cannot be read back (no client), so the second run's compiles failed their read:
    none of the tool's GPU compiles writes an entry."""
    jax_cache = tmp_path / "jax-cache"
    model = tmp_path / "cached.py"
    model.write_text(
        "import sys\nimport jax\n"
        f"sys.path.insert(0, {str(ROOT / 'sample_models')!r})\n"
        f"jax.config.update('jax_compilation_cache_dir', {str(jax_cache)!r})\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)\n"
        "jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)\n"
        "from mlp import loss, loss_inputs  # noqa: E402,F401\n")
    env = {"PYTHONWARNINGS": "error::UserWarning:jax._src.compiler"}
    for run_number in (1, 2):
        out = tmp_path / f"run{run_number}.json"
        run = cli(f"{model}:loss", "--gpu", "h100", "--time", "-p", "nothing_saveable", "--format", "json",
                  "-o", str(out), env={**env, "TE_CKPT_AUDIT_CACHE": str(tmp_path / f"tool-cache{run_number}")})
        assert run.returncode == 0, run.stderr
        result = json.loads(out.read_text())["results"][0]
        assert result["peak"]["error"] is None and result["time"]["error"] is None, result
        assert "persistent compilation cache" not in run.stderr
    assert not [p for p in jax_cache.rglob("*") if p.is_file() and "jit_step" in p.name]


def test_time_in_the_config_file_asks_for_the_estimate(tmp_path: Any) -> None:
    from te_ckpt_audit import UsageError
    from te_ckpt_audit.config import load_config

    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.te-ckpt-audit]\ngpu = "h100"\ntime = true\n[[tool.te-ckpt-audit.targets]]\n'
                      'target = "m.py:loss"\n')
    request = load_config(config).targets[0].gpu
    assert request is not None and request.time is True
    config.write_text('[tool.te-ckpt-audit]\ngpu = "h100"\ntime = "yes"\n[[tool.te-ckpt-audit.targets]]\n'
                      'target = "m.py:loss"\n')
    with pytest.raises(UsageError, match="time must be true or false"):
        load_config(config)


@compiles
def test_a_mesh_adds_collective_time_as_the_schedule_orders_it() -> None:
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices("cpu")[:8]), ("data",))
    weights = jax.ShapeDtypeStruct((4, 2048, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
    batch = jax.ShapeDtypeStruct((8 * 2048, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("data")))
    report = audit(_stack, weights, batch, policies=["nothing_saveable"], mesh=mesh, gpu=GpuRequest(H100, time=True),
                   params=0)
    on_mesh = report.results[0].time
    alone = _stack_time(4, 2048, "nothing_saveable")  # one GPU, the same batch per GPU
    assert on_mesh is not None and on_mesh.seconds is not None and alone.seconds is not None, on_mesh
    assert on_mesh.devices == 8 and alone.communication_seconds == 0.0
    assert on_mesh.communication_seconds > 0  # the gradients' all-reduce over 8 GPUs
    assert 0 <= on_mesh.exposed_communication_seconds <= on_mesh.communication_seconds
    assert on_mesh.seconds == pytest.approx(on_mesh.compute_seconds + on_mesh.exposed_communication_seconds)
    assert on_mesh.seconds >= alone.seconds * 0.98
    assert on_mesh.model_flops == pytest.approx(alone.model_flops, rel=1e-3)  # per device


def test_every_format_shows_the_time_as_an_estimate_with_its_method_and_kernels() -> None:
    from te_ckpt_audit.render._common import format_rate
    from te_ckpt_audit.render.html import render_audit_html as render_html
    from te_ckpt_audit.render.markdown import render_markdown
    from te_ckpt_audit.render.terminal import render_table

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.mean(jnp.tanh(x @ w))

    report = audit(loss, jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((8, 64), jnp.float32),
                   policies=["nothing_saveable"], params=0)
    time = dataclasses.replace(steptime.estimate(step_kernels(LOOP.format(layers=4)), H100, 1, 1.0),
                               model_flops=10**12, tokens=4096)
    timed = dataclasses.replace(report, results=(dataclasses.replace(report.results[0], time=time),))
    assert time.seconds is not None
    shown = f"{time.seconds * 1e3:.3g} ms"
    for text in (render_table(timed), render_markdown(timed), render_html(timed)):
        words = " ".join(html.unescape(text).split())  # the terminal wraps at 80 columns
        assert "an estimate from XLA's cost models" in words and steptime.METHOD in words
        assert shown in words and "dot_general (model.py:12)" in words
        assert format_rate((time.tflops_per_gpu or 0) * 1e12) in words and f"{100 * (time.mfu or 0):.1f}%" in words
    assert "Step time" not in render_table(report)  # no --time, no section


@compiles
def test_recommend_times_what_it_compiles(tmp_path: Any) -> None:
    out = tmp_path / "rec.json"
    run = cli("recommend", "sample_models/mlp.py:loss", "--gpu", "h100", "--time", "--format", "json", "-o", str(out))
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "te-ckpt-audit-recommend/16"
    chosen = doc["recommended"]
    assert chosen["peak"] is not None and chosen["time"]["seconds"] > 0 and chosen["time"]["error"] is None
    assert chosen["time"]["model_flops"] == 3 * chosen["forward_flops"]
    assert all(c["time"] is None for c in doc["frontier"] if c["peak"] is None)  # only what was compiled
    text = cli("recommend", "sample_models/mlp.py:loss", "--gpu", "h100", "--time")
    assert text.returncode == 0 and "per step (estimate, XLA's cost models" in text.stdout, text.stdout


# --- issue 40: policy and batch searched together by estimated throughput ------------------------------

LAYERS = """import jax
import jax.numpy as jnp


def _layer(x, w):
    return x + jax.nn.gelu(x @ w[0]) @ w[1]


def loss(w, x):
    for i in range(w.shape[0]):
        x = jax.checkpoint(_layer)(x, w[i])
    return jnp.mean(x.astype(jnp.float32))


def loss_inputs(batch: int = 1024, d: int = 256, layers: int = 8):
    return (jax.ShapeDtypeStruct((layers, 2, d, d), jnp.bfloat16), jax.ShapeDtypeStruct((batch, d), jnp.bfloat16))
"""
SEARCHED = ["everything_saveable", "nothing_saveable"]


def _searched_and_brute(tmp_path: Any, fraction: float, start: int, rungs: int) -> tuple[Any, dict[Any, Any]]:
    """`recommend --maximize throughput` over the two presets on eight checkpointed layers, and every
    (policy, rung) of the doubling ladder from `start` compiled on its own, as the search compiles it."""
    from te_ckpt_audit import Session, recommend_target
    from te_ckpt_audit.gpus import GpuEnvironment
    from te_ckpt_audit.specs import resolve_policy

    model = tmp_path / "layers.py"
    model.write_text(LAYERS)
    request = GpuRequest(H100, environment=GpuEnvironment(mem_fraction=fraction), cache=tmp_path / "cache", time=True)
    rec = recommend_target(f"{model}:loss", defines={"batch": str(start)}, presets=SEARCHED, gpu=request,
                           maximize="throughput", params=0)
    brute = {}
    for value in (start * 2**k for k in range(rungs)):
        session = Session.of_target(f"{model}:loss", defines={"batch": str(value)}, params=0)
        specs = [resolve_policy(p) for p in SEARCHED]
        steps = session.compiled(specs, request)
        brute.update({(s.text, value): steps[s.text] for s in specs})
    return rec, brute


def _brute_best(brute: dict[tuple[str, int], Any]) -> tuple[str, int, float]:
    fitting = [(k, c.time.seconds) for k, c in brute.items() if c.peak.fits and c.time.seconds]
    (policy, value), seconds = max(fitting, key=lambda kv: kv[0][1] / kv[1])
    return policy, value, value / seconds


def _each_point_as_compiled(rec: Any, brute: dict[tuple[str, int], Any]) -> None:
    """Every point reported was compiled: timed, a peak, and the ladder's equal to their own compiles."""
    found = rec.throughput
    assert found is not None and found.points
    for p in found.points:
        assert p.peak_bytes is not None and p.seconds is not None and p.error is None, p
        if (p.policy, p.value) in brute:
            c = brute[(p.policy, p.value)]
            assert (p.peak_bytes, p.seconds, p.fits) == (c.peak.bytes_per_device, c.time.seconds, c.peak.fits)


def _search_checked(tmp_path: Any, fraction: float, start: int, rungs: int, winner: str) -> tuple[Any, Any]:
    """The search's best pair: `winner`, as brute force over the ladder's rungs finds it, and at
    least as fast; every point it reports compiled."""
    rec, brute = _searched_and_brute(tmp_path, fraction, start, rungs)
    _each_point_as_compiled(rec, brute)
    best = rec.throughput.best
    policy, value, rate = _brute_best(brute)
    assert best is not None and best.policy == policy == winner
    assert best.value >= value and best.throughput >= rate * (1 - 1e-9)
    return rec, best


@compiles
def test_throughput_a_policy_that_fits_a_larger_batch_beats_the_least_recompute(tmp_path: Any) -> None:
    # 40 MiB of an H100 (0.05%): saving everything fits 2048 examples, recomputing fits 8192; at these
    # sizes a step is mostly fixed cost, so the larger batch runs faster per example despite recompute
    rec, best = _search_checked(tmp_path, 0.001, 1024, 5, "nothing_saveable")
    assert rec.recommended is not None and rec.recommended.policy == "everything_saveable"  # memory alone picks it
    saving = max(p.throughput or 0 for p in rec.throughput.points if p.policy == "everything_saveable" and p.fits)
    assert best.throughput > 1.5 * saving


@compiles
def test_throughput_the_least_recompute_wins_where_the_gpu_is_full(tmp_path: Any) -> None:
    # 320 MiB: both policies fill the GPU's arithmetic before memory; recomputing then only costs time
    rec, best = _search_checked(tmp_path, 0.004, 4096, 4, "everything_saveable")
    largest = max(p.value for p in rec.throughput.points if p.policy == "nothing_saveable" and p.fits)
    assert largest > best.value  # recomputing fits a larger batch, and is slower


@compiles
def test_throughput_max_compiles_bounds_the_search_and_says_so(tmp_path: Any) -> None:
    model = tmp_path / "layers.py"
    model.write_text(LAYERS)
    out = tmp_path / "rec.json"
    args = ("recommend", f"{model}:loss", "--gpu", "h100", "--mem-fraction", "0.001", "--params", "0",
            "--maximize", "throughput", "--max-compiles", "3")
    run = cli(*args, "--format", "json", "-o", str(out))
    assert run.returncode == 0, run.stderr
    found = json.loads(out.read_text())["throughput"]
    assert len(found["points"]) == 3 and found["bounded"] is True and found["max_compiles"] == 3
    assert all(p["peak_bytes"] is not None and p["seconds"] is not None for p in found["points"])
    assert found["best"] in found["points"] and found["best"]["fits"]
    text = cli(*args)
    assert text.returncode == 0 and "stopped by --max-compiles" in text.stdout, text.stdout
    assert f"--policy {found['best']['policy']} -D batch={found['best']['value']}" in text.stdout
    page = tmp_path / "rec.html"
    assert cli(*args, "--format", "html", "-o", str(page)).returncode == 0
    assert "Fastest that fits" in page.read_text() and "batch/s/GPU" in page.read_text()


@compiles
def test_calibrate_hands_the_profile_to_the_compile_and_moves_the_estimate(tmp_path: Any) -> None:
    """Issue 40: a profile naming the costliest kernel of the step's estimate compile (as a real
    GPU's PGLE profile names them) sets its time; the others are counted and scaled by their kind."""
    base = ("sample_models/mlp.py:loss", "--gpu", "h100", "--time", "-p", "nothing_saveable", "--format", "json")
    plain = tmp_path / "plain.json"
    assert cli(*base, "-o", str(plain)).returncode == 0
    time = json.loads(plain.read_text())["results"][0]["time"]
    top = time["costliest"][0]
    profile = tmp_path / "profile.txt"
    profile.write_text(f'costs {{ name: "{top["name"]}" cost_us: 1000 }}\ncosts {{ name: "not.here" cost_us: 1 }}\n')
    out = tmp_path / "calibrated.json"
    run = cli(*base, "--calibrate", str(profile), "-o", str(out))
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, JSON_SCHEMA)
    found = doc["results"][0]["time"]
    c = found["calibration"]
    assert (c["instructions"], c["measured"]) == (2, 1) and 1 <= c["missing"] < time["kernels"]
    kernels = {k["name"]: k for k in found["costliest"]}
    assert kernels[top["name"]]["seconds"] == pytest.approx(1e-3) and kernels[top["name"]]["basis"] == "profile"
    assert c["estimated_seconds"] == pytest.approx(time["seconds"]) and found["seconds"] > time["seconds"]
    shown = cli(*base[:-2], "--calibrate", str(profile))
    assert shown.returncode == 0 and "calibrated by" in " ".join(shown.stdout.split()), shown.stdout
    over = cli(*base, "--calibrate", str(profile), "-o", str(profile))
    assert over.returncode == 2 and "profile" in over.stderr


PIPELINED = """HloModule step, is_scheduled=true

%body (p: (s32[], bf16[1024,1024], (bf16[1024,1024], bf16[8192,1024]))) -> (s32[], bf16[1024,1024], (bf16[1024,1024], bf16[8192,1024])) {
  %p = (s32[], bf16[1024,1024]{1,0}, (bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0})) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %w = bf16[1024,1024]{1,0} get-tuple-element(%p), index=1
  %carried = (bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0}) get-tuple-element(%p), index=2
  %agd = bf16[8192,1024]{1,0} all-gather-done(%carried)
  %mm = (bf16[1024,1024]{1,0}, s8[4194304]{0}) custom-call(%w, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}},"reification_cost":[{"exec_time_us":{gemm_us},"name":"sol"}]}
  %y = bf16[1024,1024]{1,0} get-tuple-element(%mm), index=0
  %ag = (bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0}) all-gather-start(%y), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  ROOT %t = (s32[], bf16[1024,1024]{1,0}, (bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0})) tuple(%i, %y, %ag)
}

ENTRY %main (a: (s32[], bf16[1024,1024], (bf16[1024,1024], bf16[8192,1024]))) -> s32[] {
  %a = (s32[], bf16[1024,1024]{1,0}, (bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0})) parameter(0)
  %loop = (s32[], bf16[1024,1024]{1,0}, (bf16[1024,1024]{1,0}, bf16[8192,1024]{1,0})) while(%a), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
  ROOT %n = s32[] get-tuple-element(%loop), index=0
}
"""  # noqa: E501 - HLO as XLA prints it


@pytest.mark.parametrize("gemm_us", [10.0, 100.0])
def test_a_pipelined_collective_runs_beside_the_next_trips_kernels(gemm_us: float) -> None:
    """XLA's pipelined all-gather starts at the end of one trip and is waited for in the next: each
    trip takes its GEMM or its all-gather, whichever is longer, never both."""
    rates = H100.rates
    assert rates is not None
    kernels = step_kernels(PIPELINED.replace("{gemm_us}", str(gemm_us)), devices=8, gpus_per_host=8)
    time = steptime.estimate(kernels, H100, 8, 0.0)
    gathering = 7 / 8 * 8 * 2**21 / rates.nvlink_bytes  # 32.6 us
    gemm = gemm_us * 1e-6 * SLOWER
    assert time.seconds == pytest.approx(10 * max(gemm, gathering), rel=1e-9)
    assert time.exposed_communication_seconds == pytest.approx(10 * max(0.0, gathering - gemm), rel=1e-9)


def test_a_collective_across_hosts_leaves_each_host_through_its_groups_nics() -> None:
    """NCCL runs one ring per NIC: an FSDP group holding all 8 GPUs of each host moves its
    cross-host share through 8 NICs (8 x 400 Gb/s = 400 GB/s, under NVLink's 450); a data-parallel
    group of one GPU per host through one."""
    rates = H100.rates
    assert rates is not None
    fsdp = MESH.replace("replica_groups=[1,8]<=[8]", "replica_groups=[1,16]<=[16]")
    gather = next(k for k in step_kernels(fsdp, devices=16, gpus_per_host=8) if k.name == "ag")
    assert (gather.group, gather.spans_hosts, gather.nics) == (16, True, 8)
    assert steptime.timed(gather, H100).seconds == pytest.approx(15 / 16 * gather.bytes / (8 * rates.network_bytes))
    data = MESH.replace("replica_groups=[1,8]<=[8]", "replica_groups=[8,2]<=[2,8]T(1,0)")
    across = next(k for k in step_kernels(data, devices=16, gpus_per_host=8) if k.name == "ag")
    assert (across.group, across.spans_hosts, across.nics) == (2, True, 1)
    assert steptime.timed(across, H100).seconds == pytest.approx(1 / 2 * across.bytes / rates.network_bytes)


def test_the_estimates_gpu_has_tensor_cores_and_no_interconnect_for_xla_to_abort_on() -> None:
    """XLA's tile-aware models need the tensor-core units; with `device_interconnect_info` XLA 0.12
    emits Triton all-reduce kernels and aborts compiling one on 64 GPUs (LLVM "size mismatch when
    packing elements for LLVM struct": MaxText's Llama-2 7B on 8 A3 VMs), so it is left out."""
    text = H100.estimate_config_text()
    assert "matrix_unit_description" in text and "rate_infos { key: 16 " in text  # BF16's units
    assert "device_interconnect_info" not in text
    assert H100.config_text() in text.replace(text[text.index("  scalar_unit_description"):
                                                   text.index("  cuda_compute_capability")], "")


def test_a_small_models_time_reads_in_units_that_scale_with_its_kernels_once() -> None:
    """Issue 46, item 6: a toy model showed "TFLOP/s per GPU 0", "MFU 0.0%", "tokens/s n/a" for
    every policy and one near-identical kernel table per policy."""
    from sample_models import mlp
    from te_ckpt_audit import audit
    from te_ckpt_audit.records import KernelKind, KernelTime
    from te_ckpt_audit.render import render_json, render_markdown, render_table
    from te_ckpt_audit.render.html import render_audit_html

    report = audit(mlp.loss, *mlp.loss_inputs(), policies=["nothing_saveable", "everything_saveable"], params=0)
    kernel = KernelTime("fusion.1", KernelKind.GEMM, 1e-6, 2, 10**6, 10**4, "sol", "dot_general")

    def timed(seconds: float) -> StepTime:
        return StepTime(seconds, seconds, seconds, seconds, 0.0, 0.0, 2, 0, 3 * 10**6, 0, 989e12, None, 1,
                        (kernel,), "m", 0.0, examples=8)

    rows = tuple(dataclasses.replace(r, time=timed(s)) for r, s in zip(report.results, (2e-4, 1e-4), strict=True))
    shown = dataclasses.replace(report, results=rows)
    text = " ".join(render_table(shown).split())
    assert "15 GFLOP/s" in text and "30 GFLOP/s" in text  # 3 MFLOP in 0.2 ms and 0.1 ms
    section = text[text.index("Step time on"):text.index("Estimate, not a measurement")]
    assert "0.0015%" in section and "0.0%" not in section  # 3 MFLOP in 0.2 ms of 989 TFLOP/s: two figures
    assert "40,000 examples/s" in text and "80,000 examples/s" in text  # batch 8 per step
    assert text.count("Costliest kernels under") == 1
    assert "Costliest kernels under everything_saveable, the fastest" in text
    markdown = render_markdown(shown)
    assert markdown.count("Costliest kernels under") == 1 and "GFLOP/s" in markdown
    page = render_audit_html(shown)  # the fastest open, the others folded
    assert page.count("<h3>Costliest kernels") == 1 and page.count("<details><summary>Costliest kernels") == 1
    doc = json.loads(render_json(shown))
    assert doc["results"][0]["time"]["examples_per_second_per_gpu"] == pytest.approx(40000.0)
    assert all(r["time"]["costliest"] for r in doc["results"])  # JSON keeps every policy's kernels


NAMED = """\
import jax
import jax.numpy as jnp


def loss(w, x):
    with jax.named_scope("{scope}"):
        return jnp.sum(jnp.tanh(x @ w) @ w)


def loss_inputs():
    return jax.ShapeDtypeStruct((256, 256), jnp.float32), jax.ShapeDtypeStruct((64, 256), jnp.float32)
"""


@compiles
def test_a_cached_estimate_is_never_another_programs_names(tmp_path: Any) -> None:
    """Issue 46, item 12 (a): the cache key ignored HLO metadata, so a second model differing
    only in names showed the first one's op names and source lines."""
    env = {"TE_CKPT_AUDIT_CACHE": str(tmp_path / "cache")}
    sources = []
    for scope in ("first_model", "second_model"):
        (tmp_path / f"{scope}.py").write_text(NAMED.format(scope=scope))
        out = tmp_path / f"{scope}.json"
        run = cli(f"{scope}.py:loss", "--gpu", "h100", "--time", "-p", "nothing_saveable", "-f", "json", "-o",
                  str(out), cwd=tmp_path, env=env)
        assert run.returncode == 0, run.stderr
        kernels = json.loads(out.read_text())["results"][0]["time"]["costliest"]
        sources.append(" ".join(k["source"] for k in kernels))
    assert "first_model" in sources[0] and "second_model" not in sources[0]
    assert "second_model" in sources[1] and "first_model" not in sources[1]


@compiles
def test_a_config_file_gpu_times_collectives_only_over_the_network_it_is_given(tmp_path: Any) -> None:
    """Issue 46, item 12 (b): with --gpu-config, collectives cost nothing and --network-gbps was ignored."""
    config = tmp_path / "my_h100.txtpb"
    config.write_text(H100.config_text(H100.memory_bytes))
    base = ["sample_models/gpt.py:loss", "-D", "batch=16", "--gpu-config", str(config), "--mesh", "data=8",
            "--time", "-p", "nothing_saveable", "-f", "json"]
    bare = cli(*base, "-o", str(tmp_path / "bare.json"))
    assert bare.returncode == 0, bare.stderr
    time = json.loads((tmp_path / "bare.json").read_text())["results"][0]["time"]
    assert time["seconds"] is None and "names no link bandwidth" in time["error"]
    slow, fast = [], []
    for gbps, into in ((10, slow), (1000, fast)):
        run = cli(*base, "--network-gbps", str(gbps), "-o", str(tmp_path / f"{gbps}.json"))
        assert run.returncode == 0, run.stderr
        into.append(json.loads((tmp_path / f"{gbps}.json").read_text())["results"][0]["time"])
    assert slow[0]["communication_seconds"] > 0 and fast[0]["communication_seconds"] > 0
    assert slow[0]["communication_seconds"] == pytest.approx(100 * fast[0]["communication_seconds"], rel=1e-6)


@compiles
def test_calibrating_in_workers_keeps_xlas_log_off_stderr(tmp_path: Any) -> None:
    """Issue 46, item 14: --calibrate with --jobs 2 poured one XLA log line per kernel missing
    from the profile (43 lines on the MLP sample) onto stderr; the workers' log is filtered too."""
    profile = tmp_path / "p.txt"
    profile.write_text('costs { name: "fusion.1" cost_us: 3.0 }\n')
    run = cli("sample_models/mlp.py:loss", "--gpu", "h100", "--time", "--calibrate", str(profile), "--jobs", "2",
              "-p", "nothing_saveable", "-p", "checkpoint_dots", "-f", "json", "-o", str(tmp_path / "r.json"),
              env={"TE_CKPT_AUDIT_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr
    assert not re.search(r"^[IW]\d{4} ", run.stderr, re.MULTILINE), run.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert all(r["time"]["calibration"] is not None for r in doc["results"])


def test_a_gpu_without_xlas_cost_tables_is_said_in_words() -> None:
    """Issue 46, item 14: `--gpu a100 --time` ended with XLA's own "Cannot find key: sm_80"."""
    from te_ckpt_audit.targets._gpu import _time_failure

    said = _time_failure(RuntimeError("NOT_FOUND: Cannot find key: sm_80"), "a100-80gb")
    assert said.startswith("XLA's GPU cost tables have no entry for sm_80, the a100-80gb's architecture")
    assert _time_failure(ValueError("boom"), "h100") == "ValueError: boom"


def test_a_cached_step_of_no_time_is_estimated_again_not_taken() -> None:
    """Issue 56, item 6: a planted cache entry gave a 0 s step, exit 0."""
    from te_ckpt_audit.records import to_plain

    time = steptime.estimate(step_kernels(LOOP.format(layers=4)), H100, 1, 0.0)
    plain = to_plain(time)
    assert steptime.from_plain(plain) == time
    assert steptime.from_plain({**plain, "seconds": 0.0}) is None


def test_offloaded_residuals_cross_the_host_link_beside_the_kernels() -> None:
    """An offload policy's copies to host memory and back were timed at the HBM's bandwidth and
    summed with the kernels: offloading read as free (a GPT offloading three names: 0.320 ms, the
    same as saving them). They go over the GPU's host link (PCIe 5.0 x16 on an H100, 63 GB/s each
    direction) on their own stream, beside the kernels scheduled before their wait: what the
    schedule leaves unhidden is added, and said."""
    h100 = gpu_model("h100")
    assert h100.host_link == 63e9 and gpu_model("a100").host_link == 31.5e9
    copy = Kernel("dynamic-update-slice-start", KernelKind.HOST, 0, 630_000, asynchronous=True)  # 10 us over PCIe
    work = Kernel("fusion", KernelKind.MEMORY, 0, int(4e-6 * h100.bandwidth))  # 4 us at the HBM's bandwidth
    wait = Kernel("dynamic-update-slice-done", KernelKind.HOST, 0, 0, waits_for=copy.name)
    t = steptime.estimate([copy, work, wait], h100, 1, 0.0)
    assert t.host_seconds == pytest.approx(10e-6) and t.exposed_host_seconds == pytest.approx(6e-6)
    assert t.compute_seconds == pytest.approx(4e-6) and t.seconds == pytest.approx(10e-6)
    hidden = steptime.estimate([copy, *[work] * 3, wait], h100, 1, 0.0)  # 12 us of kernels hide it
    assert hidden.exposed_host_seconds == 0 and hidden.seconds == pytest.approx(12e-6)
    waited_at_once = steptime.estimate([copy, wait, work], h100, 1, 0.0)  # nothing between: all of it shows
    assert waited_at_once.seconds == pytest.approx(14e-6)
    plain = {k: v for k, v in to_plain(t).items() if k in ("host_seconds", "exposed_host_seconds")}
    assert plain == {"host_seconds": pytest.approx(10e-6), "exposed_host_seconds": pytest.approx(6e-6)}


@compiles
def test_an_offload_policys_compiled_step_times_its_host_copies() -> None:
    """XLA:GPU offloads a scanned stack's residuals as asynchronous dynamic-update-slice fusions into
    host memory and dynamic-slice fusions back: each read as a copy over the host link, waited for
    at its done; saving the same names on the device has none."""
    from te_ckpt_audit import audit_target

    off, kept = "save_and_offload_only_these_names:offload=ffn1,qkv_proj", "save_only_these_names:ffn1,qkv_proj"
    report = audit_target(str(ROOT / "sample_models/gpt.py") + ":loss", [off, kept],
                          gpu=GpuRequest(H100, time=True))
    moved, device = (r.time for r in report.results)
    assert moved is not None and device is not None and moved.seconds is not None
    host = report.results[0].totals.host_bytes
    assert host > 0 and moved.host_seconds == pytest.approx(2 * host / H100.host_link, rel=0.01)  # out and back
    assert 0 <= moved.exposed_host_seconds <= moved.host_seconds and device.host_seconds == 0
    assert moved.seconds == pytest.approx(moved.compute_seconds + moved.exposed_communication_seconds
                                          + moved.exposed_host_seconds)
