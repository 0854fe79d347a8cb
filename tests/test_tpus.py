"""The TPU catalog and topologies (`te_ckpt_audit.tpus`, issue 47), and the rows the lent v5e
measured against the deviceless compile of the same steps (bench/tpu_truth.py, bench/data/)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from test_cli import cli

from te_ckpt_audit import UsageError
from te_ckpt_audit.tpus import CATALOG, GIB, derived_shape, parse_tpu, tpu_model

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data"


def test_each_chip_has_its_figures_and_their_source() -> None:
    assert set(CATALOG) >= {"v5e", "v5p", "v6e", "v4"}
    v5e = tpu_model("v5e")
    assert v5e.hbm_bytes == 16 * GIB and v5e.usable_bytes == int(15.75 * GIB)  # the chip's own "15.75G"
    assert v5e.bf16_flops == 197e12 and v5e.hbm_bandwidth == 819e9 and v5e.ici_bandwidth == 200e9
    for m in CATALOG.values():
        assert m.usable_bytes < m.hbm_bytes and m.source.startswith("Google Cloud TPU") and m.usable_source
    assert tpu_model("Trillium") is CATALOG["v6e"] and tpu_model(" V5E ") is v5e


@pytest.mark.parametrize(("chips", "v5e", "v4"), [(1, (1, 1), (1, 1, 1)), (4, (2, 2), (1, 2, 2)),
                                                   (8, (2, 4), (2, 2, 2)), (256, (16, 16), (4, 8, 8))])
def test_a_topology_is_derived_from_the_meshs_devices(chips: int, v5e: tuple[int, ...], v4: tuple[int, ...]) -> None:
    assert derived_shape(CATALOG["v5e"], chips) == v5e and derived_shape(CATALOG["v4"], chips) == v4
    assert parse_tpu("v5e", chips).topology == "v5e:" + "x".join(map(str, v5e))


@pytest.mark.parametrize(("text", "chips", "said"), [
    ("v5f", None, "did you mean v5p or v5e?"),
    ("v5e:2x", None, "'2x' is not a topology"),
    ("v5e:0x4", None, "'0x4' is not a topology"),
    ("v4:2x2", None, "a v4 slice has 3 dimensions"),
    ("v5e:2x2", 8, "has 4 chips and the mesh 8 devices"),
    ("v5e", 6, "slices are powers of two"),
])
def test_bad_names_and_topologies_are_one_clear_error(text: str, chips: int | None, said: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_tpu(text, chips)
    assert said in str(err.value) and err.value.hint


def test_the_tpus_command_lists_every_chip_with_its_sources() -> None:
    result = cli("tpus")
    assert result.exit_code == 0
    for name in CATALOG:
        assert any(line.startswith(name + " ") for line in result.stdout.splitlines())
    assert " ".join(result.stdout.split()).count("Google Cloud TPU documentation") == len(CATALOG)  # lines wrap


def test_the_tpus_command_keeps_to_the_terminals_width() -> None:
    """Issue 56, item 5: `tpus` printed 190-column lines whatever the terminal."""
    result = cli("tpus", env={"COLUMNS": "80"})
    assert result.exit_code == 0 and max(len(line) for line in result.stdout.splitlines()) <= 80
    assert sum(line.startswith(tuple(f"{n} " for n in CATALOG)) for line in result.stdout.splitlines()) == len(CATALOG)


def _rows(name: str) -> dict[str, dict]:
    return {r["case"]: r for r in map(json.loads, (DATA / name).read_text().splitlines())}


def test_the_deviceless_compile_gives_the_chips_plan_and_its_verdict_on_every_point() -> None:
    """What the lent v5e said (compiled and ran, or refused with RESOURCE_EXHAUSTED) is what libtpu's
    deviceless compile for v5e:1x1 said of the same step: the same verdict on every point, the
    same plan bytes where it compiled, the same "required" bytes where it refused."""
    chip, here = _rows("tpu-v5e-chip.jsonl"), _rows("tpu-v5e-deviceless.jsonl")
    assert set(chip) == set(here) and len(chip) >= 24
    refused = 0
    for case, measured in chip.items():
        predicted = here[case]
        assert (measured["verdict"] == "ran") == (predicted["verdict"] == "compiled"), case
        if measured["verdict"] == "ran":
            assert measured["plan"] == {**predicted["plan"], "generated_code_size_in_bytes":
                                        measured["plan"]["generated_code_size_in_bytes"]}, case
        else:
            refused += 1
            assert measured["refusal"] == predicted["refusal"], case
    assert 0 < refused < len(chip)  # points on both sides of the chip's line


_TPU_LOOP = """HloModule step

%cond (p: (s32[], f32[8,128])) -> pred[] {{
  %p = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant({layers})
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

%body (p: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {{
  %p = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %h = f32[8,128]{{1,0}} get-tuple-element(%p), index=1
  %t = f32[8,128]{{1,0}} tanh(%h), backend_config={{"window_config":{{"estimated_cycles":"3000"}}}}
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one), backend_config={{"window_config":{{"estimated_cycles":"0"}}}}
  ROOT %r = (s32[], f32[8,128]{{1,0}}) tuple(%j, %t)
}}

ENTRY %main (x: f32[8,128]) -> f32[8,128] {{
  %x = f32[8,128]{{1,0}} parameter(0)
  %e = f32[8,128]{{1,0}} exponential(%x), backend_config={{"window_config":{{"estimated_cycles":"1500"}}}}
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,128]{{1,0}}) tuple(%zero, %e)
  %w = (s32[], f32[8,128]{{1,0}}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,128]{{1,0}} get-tuple-element(%w), index=1
}}
"""


@pytest.mark.parametrize("layers", [4, 8])
def test_a_tpu_loops_trips_come_from_its_condition_and_each_kernel_from_libtpus_cycles(layers: int) -> None:
    """libtpu writes no known_trip_count: the loop's trips are the constant its condition compares
    with; each kernel costs its estimated cycles at the chip's clock, times the one constant."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import step_kernels

    kernels = step_kernels(_TPU_LOOP.format(layers=layers))
    by_name = {k.name: k for k in kernels}
    assert (by_name["t"].runs, by_name["t"].cycles) == (layers, 3000)
    assert (by_name["e"].runs, by_name["e"].cycles) == (1, 1500)
    chip = tpu_model("v5e")
    tiny = dataclasses.replace(chip, hbm_attained=1e3)  # the bytes' time above libtpu's: libtpu's cycles stand
    time = steptime.tpu_estimate(kernels, tiny, 1, 0.5)
    cycles = 1500 + layers * 3000
    runs = sum(k.runs for k in kernels)  # each run costs its own (none moves VMEM bytes or indexes rows)
    assert time.kernels == runs and time.overhead_seconds == pytest.approx(steptime.TPU_STEP_S)
    assert time.seconds == pytest.approx(cycles / chip.clock_hz * steptime.TPU_EFFICIENCY
                                         + runs * steptime.TPU_KERNEL_S + steptime.TPU_STEP_S)
    assert time.communication_seconds == 0 and time.compile_seconds == 0.5
    assert (time.device, time.hardware) == ("chip", "v5e")


def test_a_v5e_times_offloaded_residuals_over_its_host_link_as_the_chip_ran_them() -> None:
    """Issue 58 (and 56: nothing silently different): on the v5e libtpu's estimate priced an
    offloading step as if its copies were free (a GPT offloading its five names: 112.6 ms estimated,
    345.9 ms on the chip). A v5e's copies to host memory and back now cross its host link, 14 GB/s
    each direction: what the chip's own copies ran at (bench/data/tpu-v5e-host.jsonl: 13.4-14.0 GB/s
    host to chip for 256 MiB-1 GiB), on their stream beside the kernels; the report says which link,
    and a chip whose link was not measured says that libtpu's estimate stands."""
    from te_ckpt_audit.records import to_plain
    from te_ckpt_audit.render._common import _host_link
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import Kernel, KernelKind

    rows = [json.loads(line) for line in (DATA / "tpu-v5e-host.jsonl").read_text().splitlines()]
    links = [r["to_device_bytes_per_second"] for r in rows if r["study"] == "link" and r["bytes"] >= 256 * 2**20]
    v5e = tpu_model("v5e")
    assert len(links) == 2 and min(links) < v5e.host_link < max(links) * 1.01
    assert [m.name for m in CATALOG.values() if m.host_link] == ["v5e"]
    chip = {r["case"].split(", ")[1]: r["seconds_per_step"] for r in rows if r["study"] == "offload"}
    assert chip["offloaded"] > 3 * chip["saved"] > 3 * 0.1  # what the estimate read as free
    copy = Kernel("dynamic-update-slice-start", KernelKind.HOST, 0, 140_000, asynchronous=True)  # 10 us at 14 GB/s
    work = Kernel("fusion", KernelKind.MEMORY, 0, int(4e-6 * v5e.hbm_attained), cycles=1)  # libtpu: 1 cycle
    wait = Kernel("dynamic-update-slice-done", KernelKind.HOST, 0, 0, waits_for=copy.name)
    t = steptime.tpu_estimate([copy, work, wait], v5e, 1, 0.0)
    assert t.host_seconds == pytest.approx(10e-6) and t.host_link == 14e9
    assert t.exposed_host_seconds == pytest.approx(10e-6 - t.compute_seconds)
    assert "each direction over the v5e's host link, 14 GB/s as measured on the chip" in _host_link(t)
    assert to_plain(t)["host_link"] == 14e9 and steptime.from_plain(to_plain(t)) == t
    v6e = steptime.tpu_estimate([copy, work, wait], tpu_model("v6e"), 1, 0.0)
    assert v6e.host_link == 0 and "the v6e's host link was not measured" in _host_link(v6e)


def test_small_steps_the_fit_never_saw() -> None:
    """Issue 56, item 2, held out: steps of other sizes of the same models, run on the chip after
    the costs were fitted (bench/data/tpu-v5e-small-held.jsonl), estimated under today's per-kernel
    costs from the chip's own program (bench/data/tpu-v5e-small-steps.jsonl.gz). Round 1: median
    8.6%, worst 11.6% over the seven of 0.3 ms to 1 s (one cost per step and per kernel run, the
    model before: 10.3%, 24.8%); round 2 (chosen before the chip ran them): 8.7%, 15.3% over nine
    (before: 7.3%, 28.5%); round 3 (chosen and run after these costs were fitted, with what no
    fitted step had: a bf16 MLP and GPT, a wider MLP, longer sequences): 7.9%, 26.5%, 11 of 16 within
    10% (the model before, on the same programs: 7.7%, 27.5%, 11). The goal, 10% on every one, is
    not met: a model's GEMMs run 0.7-1.5x libtpu's estimate (the GPTs' faster, the tiny Llama's at
    sequence 1024 slower), and the tiny steps at the host's pace vary 10% from day to day."""
    import statistics
    import sys

    from te_ckpt_audit.targets._steptime import TPU_COSTS

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from tpu_small import ROUNDS, kernel_errors

    errors = kernel_errors(DATA / "tpu-v5e-small-steps.jsonl.gz", TPU_COSTS)
    held = {(r.get("round", 1), r["case"]): r for r in map(json.loads, (DATA / "tpu-v5e-small-held.jsonl")
                                                            .read_text().splitlines())}
    for held_out, size, median, worst, within in ((1, 7, 0.09, 0.12, 4), (2, 9, 0.09, 0.155, 5),
                                                  (3, 16, 0.08, 0.27, 11)):
        ran = [e for e in errors if e[1] == held_out]
        assert {e[0] for e in ran} == {c[0] for c in ROUNDS[held_out]}
        assert all(held[(held_out, case)]["seconds_per_step"] == measured for case, _, measured, _ in ran)
        off = [abs(est / measured - 1) for _, _, measured, est in ran if 0.3e-3 <= measured <= 1.0]
        assert len(off) == size and statistics.median(off) < median and max(off) < worst
        assert sum(e < 0.10 for e in off) == within


def test_small_steps_profiled_are_their_device_time_or_the_hosts() -> None:
    """Issue 56, item 2, where the time goes (bench/data/tpu-v5e-small-profile.jsonl: every small step
    traced by the chip's profiler, the five held-out rounds' too): a step the device bounds runs, as
    a loop runs it, at its program's device time plus at most 25 us (0.5% of a long step), and that
    time is its kernels' own (the ops the trace names) plus at most 65 us (the most: 1,678 kernel
    runs); every other step runs slower than that (the host's pace)."""
    profiles = {r["case"]: r for r in map(json.loads, (DATA / "tpu-v5e-small-profile.jsonl").read_text().splitlines())}
    steps = {r["case"]: r["seconds_per_step"] for name in ("tpu-v5e-small.jsonl", "tpu-v5e-small-held.jsonl")
             for r in map(json.loads, (DATA / name).read_text().splitlines()) if r.get("verdict") == "ran"}
    assert len(profiles) == 77 and set(profiles) <= set(steps)
    device_bound = 0
    for case, r in profiles.items():
        module = r["module_ns"] * 1e-9
        ops = (sum(ns for name, (_, ns) in r["ops"].items() if not name.startswith("while")) + r["small_ops_ns"]) * 1e-9
        assert 0 <= module - ops <= 65e-6, case
        if steps[case] - module <= max(25e-6, 0.005 * steps[case]):
            device_bound += 1
        else:
            assert steps[case] > module, case
    assert device_bound == 55


_TPU_DMAS = "\n".join([
    "HloModule step",
    "%gathered (p0: f32[4096,256], p1: s32[8,256,1]) -> f32[8,256,256] {",
    "  %p0 = f32[4096,256]{1,0} parameter(0)",
    "  %p1 = s32[8,256,1]{2,1,0} parameter(1)",
    "  ROOT %g = f32[8,256,256]{2,1,0:T(8,128)S(1)} gather(%p0, %p1), offset_dims={2}, collapsed_slice_dims={0}, "
    "start_index_map={0}, index_vector_dim=2, slice_sizes={1,256}",
    "}",
    "ENTRY %main (w: f32[2048,2048], e: f32[4096,256], i: s32[8,256,1]) -> f32[8,256,256] {",
    "  %w = f32[2048,2048]{1,0:T(8,128)} parameter(0)",
    "  %e = f32[4096,256]{1,0:T(8,128)} parameter(1)",
    "  %i = s32[8,256,1]{2,1,0} parameter(2)",
    *(f"  %s{k} = ((f32[2048,2048]{{1,0:T(8,128)}}), f32[1024,2048]{{1,0:T(8,128)S(1)}}, s32[]{{:S(2)}}) "
      f"slice-start(%w), slice={{[{1024 * k}:{1024 * (k + 1)}], [0:2048]}}" for k in (0, 1)),
    "  %c = (f32[4096,256]{1,0:T(8,128)S(1)}, f32[4096,256]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%e)",
    "  %gf = f32[8,256,256]{2,1,0:T(8,128)S(1)} fusion(%e, %i), kind=kCustom, calls=%gathered, "
    'backend_config={"window_config":{"estimated_cycles":"0"}}',
    "  %d0 = f32[1024,2048]{1,0:T(8,128)S(1)} slice-done(%s0)",
    "  %d1 = f32[1024,2048]{1,0:T(8,128)S(1)} slice-done(%s1)",
    "  %cd = f32[4096,256]{1,0:T(8,128)S(1)} copy-done(%c)",
    '  %whole = f32[2048,2048]{1,0:T(8,128)S(1)} custom-call(%d0, %d1), custom_call_target="ConcatBitcast"',
    "  ROOT %out = f32[8,256,256]{2,1,0:T(8,128)S(1)} copy(%gf)",
    "}",
    "",
])


def test_a_tpu_reads_its_dmas_as_dmas_and_a_gathers_rows() -> None:
    """Issue 56, item 2: libtpu brings a parameter into VMEM as slices (`slice-start`s) joined by a
    `ConcatBitcast`: each slice moves its own bytes (it was read as its whole operand, twice, and
    timed at nothing), beside the kernels until its `slice-done`; the `ConcatBitcast` launches
    nothing (it was a kernel); a gather counts the rows it reads one by one (libtpu gives the GPT's
    embedding gather 0 cycles, and it ran 14 us)."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import VMEM, step_kernels

    kernels = {k.name: k for k in step_kernels(_TPU_DMAS, 1, 1, VMEM)}
    assert sorted(kernels) == ["c", "cd", "d0", "d1", "gf", "out", "s0", "s1"]  # no ConcatBitcast
    for name in ("s0", "s1"):
        assert (kernels[name].bytes, kernels[name].vmem_copy, kernels[name].asynchronous) == (1024 * 2048 * 4,
                                                                                              True, True)
    assert (kernels["c"].bytes, kernels["c"].vmem_copy) == (4096 * 256 * 4, True)
    assert [kernels[n].waits_for for n in ("d0", "d1", "cd")] == ["s0", "s1", "c"]
    rows = 8 * 256 * 256 * 4  # the rows gathered, and its result; both typed as the result, in VMEM
    assert kernels["gf"].indices == 8 * 256 and kernels["gf"].vmem_bytes == 2 * rows
    chip = tpu_model("v5e")
    time = steptime.tpu_estimate(tuple(kernels.values()), chip, 1, 0.0)
    assert time.kernels == 2  # the gather and the copy out; the DMAs are not kernel runs, nor costly kernels
    assert sorted(k.name for k in time.costliest) == ["gf", "out"]
    dmas = sum(k.bytes for k in kernels.values() if k.asynchronous) / chip.hbm_attained * steptime.TPU_DMA_SLOWDOWN
    gather = steptime.tpu_timed(kernels["gf"], chip).seconds
    assert gather == pytest.approx(2048 * steptime.TPU_INDEX_S + 2 * rows / steptime.TPU_VMEM_BANDWIDTH
                                   + steptime.TPU_KERNEL_S)
    # the gather runs while the DMAs move: the step waits for whichever is longer, then copies out
    assert time.compute_seconds == pytest.approx(max(dmas, gather) + steptime.tpu_timed(kernels["out"], chip).seconds)


def test_a_small_step_runs_at_the_hosts_pace_and_dmas_run_beside_the_kernels() -> None:
    """Issue 56, item 2: a step whose chip work is less than the host's launch of it (a time per step
    and per array passed) takes the launch's time, and the report says a larger batch costs nothing
    until the chip's work exceeds it; libtpu's DMAs between HBM and VMEM (no cycles) take their
    bytes at the pace the chip's steps showed, beside the kernels scheduled until their wait: only
    what outlasts those kernels is the step's."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import Kernel, KernelKind

    chip = tpu_model("v5e")
    work = Kernel("fusion", KernelKind.MEMORY, 0, int(20e-6 * chip.hbm_attained),  # 20 us of HBM traffic
                  cycles=int(30e-6 * chip.clock_hz))
    small = steptime.tpu_estimate([work], chip, 1, 0.0, arrays=40)
    launch = steptime.TPU_HOST_STEP_S + 40 * steptime.TPU_HOST_ARRAY_S
    assert small.dispatch_seconds == pytest.approx(launch) and small.seconds == pytest.approx(launch)
    assert small.host_bound and small.overhead_seconds == pytest.approx(launch - small.compute_seconds)
    big = steptime.tpu_estimate([dataclasses.replace(work, runs=1000)], chip, 1, 0.0, arrays=40)
    one = 20e-6 * steptime.TPU_EFFICIENCY + steptime.TPU_KERNEL_S
    assert not big.host_bound and big.compute_seconds == pytest.approx(1000 * one)
    assert big.seconds == pytest.approx(big.compute_seconds + steptime.TPU_STEP_S)
    dma = 1e-3 * steptime.TPU_DMA_SLOWDOWN  # 648 MB: 1 ms at 648 GB/s, at the DMAs' pace
    start = Kernel("copy-start", KernelKind.MEMORY, 0, 648_000_000, vmem_copy=True, asynchronous=True)
    done = Kernel("copy-done", KernelKind.MEMORY, 0, 0, waits_for="copy-start", vmem_copy=True)
    beside = dataclasses.replace(work, runs=10)  # 0.2 ms of kernels between the start and its wait
    step = steptime.tpu_estimate([start, beside, done], chip, 1, 0.0)
    assert step.kernels == 10 and step.compute_seconds == pytest.approx(dma)  # the wait: what outlasts them
    overlapped = steptime.tpu_estimate([start, dataclasses.replace(work, runs=100), done], chip, 1, 0.0)
    assert overlapped.compute_seconds == pytest.approx(100 * one)  # 2 ms of kernels: the DMA hides behind them


def test_a_kernel_libtpu_cannot_estimate_is_named_and_not_timed_at_int64_max() -> None:
    """Issue 56, item 2: libtpu gave a reduction over a 4 GiB score tensor INT64_MAX cycles; the
    estimate timed it at its bandwidth floor without a word and its upper bound read 3.7e10 s. Now
    the kernel is named, counted among the floor's, and no figure carries the sentinel."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import step_kernels
    text = _TPU_LOOP.format(layers=4).replace('"estimated_cycles":"1500"', '"estimated_cycles":"9223372036854775807"')
    kernels = step_kernels(text)
    chip = tpu_model("v5e")
    time = steptime.tpu_estimate(kernels, chip, 1, 0.5)
    e = next(k for k in kernels if k.name == "e")
    floor = steptime.tpu_roofline(e, chip) * steptime.TPU_EFFICIENCY + steptime.TPU_KERNEL_S
    assert time.unestimated == ("e",) and time.floor_kernels == 1 and time.floor_seconds == pytest.approx(floor)
    assert time.seconds_high is not None and time.seconds_high < 1.0  # not 9.2e18 cycles at 1.5 GHz
    assert steptime.from_plain(__import__("te_ckpt_audit").records.to_plain(time)) == time
    plain = steptime.tpu_estimate(step_kernels(_TPU_LOOP.format(layers=4)), chip, 1, 0.5)
    assert plain.unestimated == () and plain.floor_kernels == 0
    import jax
    import jax.numpy as jnp

    from te_ckpt_audit import audit
    from te_ckpt_audit.render._common import time_notes

    report = audit(lambda x: jnp.sum(x * x), jax.ShapeDtypeStruct((8,), jnp.float32), policies=["nothing_saveable"])
    report = dataclasses.replace(report, results=(dataclasses.replace(report.results[0], time=time),))
    said = [n for n in time_notes(report) if "no estimate" in n]
    assert said == ["nothing_saveable: not to be trusted: libtpu gave no estimate for 1 kernel(s) (e); they are "
                    "timed at their roofline floor, and the chip may run them many times slower"]


def test_a_step_whose_time_is_a_reduce_window_says_so() -> None:
    """Issue 56, item 2: the sequence-8192 decoder ran 10x its smaller steps' time because libtpu
    lowered its softmax's max as a reduce-window (n^2 work); the estimate now prices it, and the
    report says where the step's time goes (not "no warnings" beside a 0.6% MFU)."""
    import jax
    import jax.numpy as jnp

    from te_ckpt_audit import audit
    from te_ckpt_audit.records import WINDOW_TAPS, KernelKind
    from te_ckpt_audit.render._common import time_notes
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import Kernel

    chip = tpu_model("v5e")
    window = Kernel("fusion.150", KernelKind.MEMORY, 0, 12 * 2**30, cycles=2**63 - 1, window_taps=13_194_139_533_312,
                    window_sublane=True)
    gemm = Kernel("fusion.11", KernelKind.GEMM, 10**11, 10**9, cycles=30_000_000)
    time = steptime.tpu_estimate([window, gemm], chip, 1, 0.0, arrays=41)
    [priced] = [k for k in time.costliest if k.name == "fusion.150"]
    assert priced.basis == WINDOW_TAPS and time.unestimated == ()
    assert priced.seconds == pytest.approx(window.window_taps / steptime.TPU_WINDOW_SUBLANE_TAPS_PER_S
                                           * steptime.TPU_EFFICIENCY + steptime.TPU_KERNEL_S)
    report = audit(lambda x: jnp.sum(x * x), jax.ShapeDtypeStruct((8,), jnp.float32), policies=["nothing_saveable"])
    report = dataclasses.replace(report, results=(dataclasses.replace(report.results[0], time=time),))
    said = [n for n in time_notes(report) if n.startswith("nothing_saveable") and "reduce-window" in n]
    assert time.seconds is not None
    share = f"{100 * priced.total_seconds / time.seconds:.0f}%"
    assert share == "99%" and said == [f"nothing_saveable: {share} of the step is fusion.150: a reduction libtpu "
                                       "lowered as a reduce-window whose every output reads its whole window (n^2 "
                                       "work where that is a row: a softmax's max over long rows), which libtpu could "
                                       "not price; it is timed at the window taps per second a v5e ran such kernels"]
    small = steptime.tpu_estimate([dataclasses.replace(window, bytes=2**20, window_taps=10**9), gemm], chip, 1, 0.0,
                                  arrays=41)
    report = dataclasses.replace(report, results=(dataclasses.replace(report.results[0], time=small),))
    assert not [n for n in time_notes(report) if n.startswith("nothing_saveable") and "reduce-window" in n]


def test_a_tpu_kernel_is_timed_between_libtpus_estimate_and_its_roofline() -> None:
    """libtpu over-prices what the chip runs (bench/data/tpu-v5e-profile.jsonl): a memory-bound
    kernel at the lesser of its estimate and its bytes at the attained HBM bandwidth, a GEMM at the
    geometric mean of its estimate and its roofline (FLOPs at the peak, or bytes if more); the
    range from the one to the other."""
    from te_ckpt_audit.records import KernelKind
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import Kernel

    chip = tpu_model("v5e")
    c = steptime.TPU_EFFICIENCY
    libtpu = 3e-3  # seconds: cycles at the clock
    cycles = round(libtpu * chip.clock_hz)
    libtpu = cycles / chip.clock_hz
    add = Kernel("add", KernelKind.MEMORY, 0, 2**30, cycles=cycles)  # 1 GiB: 1.66 ms at 648 GB/s
    bound = 2**30 / chip.hbm_attained
    timed = steptime.tpu_timed(add, chip)
    run = steptime.TPU_KERNEL_S  # what any kernel but a GEMM costs per run
    assert (timed.seconds, timed.low, timed.high) == pytest.approx((bound * c + run, bound * c + run, libtpu * c + run))
    gemm = Kernel("mm", KernelKind.GEMM, 2 * 8192**3, 3 * 8192**2 * 2, cycles=cycles)  # 5.6 ms at the peak
    floor = 2 * 8192**3 / chip.bf16_flops
    timed = steptime.tpu_timed(gemm, chip)
    fill = steptime.TPU_GEMM_FILL_S  # a long GEMM's: the cap
    assert timed.seconds == pytest.approx(math.sqrt(libtpu * floor) * c + fill)
    assert (timed.low, timed.high) == pytest.approx((libtpu * c + fill, floor * c + fill))
    short = steptime.tpu_timed(dataclasses.replace(gemm, flops=2 * 256**3, bytes=0, cycles=1500), chip)
    estimate = math.sqrt(1500 / chip.clock_hz * 2 * 256**3 / chip.bf16_flops) * c
    assert short.seconds == pytest.approx(estimate * (1 + steptime.TPU_GEMM_FILL))  # a short one's: a share
    vmem = steptime.tpu_timed(Kernel("in-vmem", KernelKind.MEMORY, 0, 0, cycles=cycles, vmem_bytes=2**30), chip)
    assert vmem.seconds == pytest.approx(2**30 / steptime.TPU_VMEM_BANDWIDTH + run)  # no HBM bytes: VMEM's
    gather = steptime.tpu_timed(Kernel("gather", KernelKind.MEMORY, 0, 0, cycles=cycles, indices=4096), chip)
    assert gather.seconds == pytest.approx(4096 * steptime.TPU_INDEX_S + run)
    assert chip.hbm_attained == 648e9 < chip.hbm_bandwidth


def test_an_all_reduce_over_ici_moves_twice_its_share_of_the_buffer() -> None:
    from te_ckpt_audit.records import KernelKind
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import Kernel

    chip = tpu_model("v5e")
    reduce = Kernel("ar", KernelKind.COLLECTIVE, 0, 2**30, group=4, collective="all-reduce")
    gather = Kernel("ag", KernelKind.COLLECTIVE, 0, 2**30, group=4, collective="all-gather")
    assert steptime.ici_seconds(reduce, chip) == pytest.approx(2 * 3 / 4 * 2**30 / chip.ici_bandwidth)
    assert steptime.ici_seconds(gather, chip) == pytest.approx(3 / 4 * 2**30 / chip.ici_bandwidth)
    assert steptime.ici_seconds(Kernel("one", KernelKind.COLLECTIVE, 0, 2**30, group=1), chip) == 0


@pytest.mark.parametrize(("chip", "topology", "chips"), [("v5e", "v5e-256", 256), ("v6e", "v6e-16", 16),
                                                          ("v5p", "v5p-256", 128), ("v4", "v4-8", 4)])
def test_maxtexts_compile_topology_names_the_tpu_slice(chip: str, topology: str, chips: int) -> None:
    from te_ckpt_audit.maxtext import MaxTextRun, tpu_chips

    assert tpu_chips(chip, topology) == chips
    run = MaxTextRun("base.yml", (f"compile_topology={topology}", "compile_topology_num_slices=1"), tpu=chip)
    assert run.devices == chips and parse_tpu(chip, run.devices).chips == chips


@pytest.mark.parametrize(("settings", "said"), [
    ((), "--tpu v5e compiles for MaxText's compile_topology, which the run leaves unset"),
    (("compile_topology=a3",), "which is 'a3', not a v5e slice"),
    (("compile_topology=v5p-8",), "which is 'v5p-8', not a v5e slice"),
    (("compile_topology=v5e-256", "compile_topology_num_slices=2"), "--tpu compiles for one slice"),
])
def test_a_maxtext_run_on_a_tpu_needs_one_slice_of_that_chip(settings: tuple[str, ...], said: str) -> None:
    from te_ckpt_audit.maxtext import MaxTextRun

    with pytest.raises(UsageError, match=re.escape(said)) as err:
        _ = MaxTextRun("base.yml", settings, tpu="v5e").devices
    if "compile_topology_num_slices=2" not in settings:  # the hint: a slice a newcomer's chip comes in
        assert err.value.hint.startswith("add compile_topology=v5e-8, or the slice you train on (MaxText names a "
                                         "v5e slice by its chips")


def test_maxtext_recommend_on_a_tpu_checks_its_settings_before_any_work(tmp_path: Path) -> None:
    """--recommend searches on a TPU slice too (the run's compile_topology); what it cannot take is
    refused as on a GPU, before MaxText is imported."""
    from te_ckpt_audit.maxtext import MaxTextRun, recommend_maxtext
    from te_ckpt_audit.tpus import TpuRequest

    on_tpu = TpuRequest(parse_tpu("v5e"))
    with pytest.raises(UsageError, match="is not a positive per-device batch size"):
        recommend_maxtext(MaxTextRun("c.yml", ("compile_topology=v5e-256",), tpu="v5e"), on_tpu, ["2", "-1"])
    with pytest.raises(UsageError, match="MaxText's search maximizes throughput"):
        recommend_maxtext(MaxTextRun("c.yml", tpu="v5e"), on_tpu, maximize="batch")
    config = tmp_path / "c.yml"
    config.write_text("per_device_batch_size: 2\n")
    result = cli("maxtext", str(config), "compile_topology=v5e-256", "--tpu", "v5e", "--recommend", "--fit")
    assert result.exit_code == 2 and "--recommend searches what fits the GPU or the TPU itself" in result.stderr
    result = cli("maxtext", str(config), "--recommend")
    assert result.exit_code == 2 and "add --gpu h100, or --tpu v5e with compile_topology=v5e-256" in result.stderr


def test_a_maxtext_search_on_a_tpu_names_the_slice_in_every_format() -> None:
    """`maxtext --recommend --tpu`: the record carries the slice (its topology, chips, usable HBM,
    libtpu), and the text, JSON and notebook views say it; throughput per chip."""
    from te_ckpt_audit.records import MaxTextPoint, MaxTextRecommendation, PeakMemory, Point, Throughput, TpuInfo
    from te_ckpt_audit.render import render_maxtext_recommend_json, render_maxtext_recommend_text

    info = TpuInfo("v5e", "v5e:16x16", 256, 16 * GIB, 15_750 * GIB // 1000, "0.0.50.1", "data=256")
    peak = PeakMemory(14 * GIB, 14 * GIB, 2 * GIB, 0, 0, 12 * GIB, True, False, None, 1.0)
    chosen = MaxTextPoint("minimal", "4", peak)
    best = Point("minimal", 4, 14 * GIB, True, 2.5, 6553.6)
    searched = Throughput("per_device_batch_size", "tokens", best, (best,), ("minimal",), 4, device="chip",
                          estimator="libtpu's cycle estimates and the roofline")
    rec = MaxTextRecommendation("maxtext base.yml", chosen, (chosen,), None, searched, info)
    assert rec.device_name == "v5e:16x16"
    text = render_maxtext_recommend_text(rec)
    assert "compiled for v5e:16x16, per device" in text and "256 x v5e: 15.8 GiB usable of 16 GiB per chip" in text
    assert "tokens/s/chip" in text and "libtpu's cycle estimates and the roofline" in text
    assert "peak: the plan per chip, or what a refused step requires" in text
    doc = json.loads(render_maxtext_recommend_json(rec))
    assert doc["schema"] == "te-ckpt-audit-maxtext-recommend/4" and doc["gpu"] is None
    assert doc["tpu"]["topology"] == "v5e:16x16" and doc["tpu"]["chips"] == 256 and doc["tpu"]["libtpu"] == "0.0.50.1"
    assert doc["throughput"]["device"] == "chip"
    assert "tokens/s/chip" in rec._repr_html_()
    assert "estimates from libtpu&#x27;s cycle estimates and the roofline" in rec._repr_html_()  # not XLA's
    refused = MaxTextRecommendation("maxtext base.yml", None, (MaxTextPoint("full", "64", PeakMemory(
        None, None, None, None, None, None, False, False, None, 1.0)),), None, None, info)
    assert "a larger slice (compile_topology)" in render_maxtext_recommend_text(refused)


@pytest.mark.parametrize(("conv", "lhs", "rhs", "flops"), [
    # a weight gradient (libtpu's Llama): the batch (4) is the window, the sequence (1024) the features
    ("%c = bf16[2048,32000,1]{1,0,2} convolution(%a, %b), window={size=4}, dim_labels=0fb_0io->bf0",
     "bf16[4,1024,2048]", "bf16[4,1024,32000]", 2 * 2048 * 32000 * 4 * 1024),
    # bse,ehd->bshd: the 16 heads a window padded 15 on each side, one tap of each output on the input
    ("%c = bf16[4,1024,16,128]{1,3,2,0} convolution(%a, %b), window={size=1x16 pad=0_0x15_15 rhs_reversal=0x1}, "
     "dim_labels=0bf1_i1o0->0b1f", "bf16[4,1024,2048,1]", "bf16[2048,16,128,1]", 2 * 4 * 1024 * 2048 * 16 * 128),
    # a plain dot: no spatial dimension
    ("%c = f32[64,32]{1,0} convolution(%a, %b), dim_labels=bf_io->bf", "f32[64,128]", "f32[128,32]", 2 * 64 * 128 * 32),
])
def test_a_convolutions_flops_count_the_window_taps_on_its_input(conv: str, lhs: str, rhs: str, flops: int) -> None:
    """libtpu writes its GEMMs as convolutions: the FLOPs are each output's input features times its
    window taps that read the input (not the padding), never more than the dot they compute."""
    from te_ckpt_audit.targets._kernels import _conv_flops, _instruction

    inst = _instruction(conv)
    assert inst is not None and _conv_flops(inst, lhs, rhs) == flops


_STACKED = """HloModule step

%slice_layer (p0: f32[12,8,128], p1: s32[]) -> f32[8,128] {
  %p0 = f32[12,8,128]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %one = f32[1,8,128]{2,1,0} dynamic-slice(%p0, %p1, %zero, %zero), dynamic_slice_sizes={1,8,128}
  ROOT %b = f32[8,128]{1,0} bitcast(%one)
}

%layer (q0: f32[12,8,128], q1: s32[], q2: f32[8,128]) -> f32[8,128] {
  %q0 = f32[12,8,128]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %q2 = f32[8,128]{1,0:T(8,128)S(1)} parameter(2)
  %s = f32[8,128]{1,0} fusion(%q0, %q1), kind=kLoop, calls=%slice_layer
  ROOT %m = f32[8,128]{1,0} multiply(%s, %q2)
}

ENTRY %main (x: f32[12,8,128], i: s32[], v: f32[8,128]) -> f32[8,128] {
  %x = f32[12,8,128]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %v = f32[8,128]{1,0:T(8,128)S(1)} parameter(2)
  ROOT %f = f32[8,128]{1,0} fusion(%x, %i, %v), kind=kLoop, calls=%layer
}
"""


def test_a_kernel_reads_one_layer_of_a_stacked_buffer_and_nothing_of_vmem_from_hbm() -> None:
    """A loop's layer of a stacked residual is read through a fusion nested in the kernel: only
    that layer crosses HBM; an operand libtpu placed in VMEM (`S(1)`) crosses none on a TPU."""
    from te_ckpt_audit.targets._kernels import VMEM, step_kernels

    layer = 8 * 128 * 4
    (on_tpu,) = step_kernels(_STACKED, on_chip=VMEM)
    assert on_tpu.bytes == layer + 4 + layer  # the layer, the index, the result; the VMEM operand not
    (elsewhere,) = step_kernels(_STACKED)
    assert elsewhere.bytes == layer + 4 + layer + layer  # no memory space is on chip off a TPU


def test_the_attained_hbm_bandwidth_is_the_chips_own_measurement() -> None:
    """x + 1 over 2^28 and 2^29 elements on the v5e (bench/data/tpu-v5e-kernels.jsonl): the bytes it
    adds over the time it adds (a call's fixed cost drops out), in float32 and bfloat16 alike."""
    from te_ckpt_audit.tpus import V5E_HBM_ATTAINED

    rows = _rows("tpu-v5e-kernels.jsonl")
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        small, large = rows[f"add-one {2**28} {dtype}"], rows[f"add-one {2**29} {dtype}"]
        moved = 2 * (2**29 - 2**28) * size  # read and written
        assert moved / (large["seconds"] - small["seconds"]) == pytest.approx(V5E_HBM_ATTAINED, rel=0.01)


def test_the_one_constant_is_the_fit_on_half_the_chips_rows_and_the_rest_are_held_out() -> None:
    """`TPU_EFFICIENCY` is the median of measured (less the step's own cost) over unscaled estimate
    on the 1st, 3rd, ... rows of the chip's timed points (bench/data/tpu-v5e-time.jsonl, the
    estimate's own `--estimate`); every row's estimate is its unscaled time at that constant plus
    the step's own cost; the held-out rows are the others."""
    import statistics

    from te_ckpt_audit.targets._steptime import TPU_EFFICIENCY, TPU_STEP_S

    rows = list(_rows("tpu-v5e-time.jsonl").values())
    assert [r["fitted"] for r in rows] == [i % 2 == 0 for i in range(len(rows))] and len(rows) == 20
    fitted = statistics.median((r["measured_seconds"] - r["overhead_seconds"]) / r["unscaled_seconds"]
                               for r in rows if r["fitted"])
    assert round(fitted, 3) == TPU_EFFICIENCY
    for name in ("tpu-v5e-time.jsonl", "tpu-v5e-probe-time.jsonl", "tpu-v5e-wide-time.jsonl",
                 "tpu-v5e-search-time.jsonl", "tpu-v5e-remat3-time.jsonl"):
        for r in _rows(name).values():
            assert r["overhead_seconds"] == pytest.approx(TPU_STEP_S, rel=1e-9)  # none of them at the host's pace
            assert r["estimated_seconds"] == pytest.approx(
                r["unscaled_seconds"] * TPU_EFFICIENCY + r["overhead_seconds"], rel=1e-9), r["case"]
            assert r["error"] == pytest.approx(r["estimated_seconds"] / r["measured_seconds"] - 1, rel=1e-9)


def test_the_per_kernel_costs_are_the_fit_on_the_chips_small_steps() -> None:
    """Issue 56, item 2: steps under 1 ms ran up to 2x the kernels' estimate on the chip. Each cost
    `_steptime` adds is the fit on the 16 fitted steps' profiles (`bench/tpu_small.py --fit-kernels`),
    on what it prices: a GEMM's fill on the GEMMs' measured time, the VMEM bandwidth, the time per
    indexed row and the cost per run on the other kernels', the DMAs' pace and the step's own cost on
    the steps' device time, the host's line on the steps it bounds. With them the fitted steps of 0.3
    ms to 1 s are within 16% (median 6.7%; 18 steps: the two with a reduce-window libtpu cannot price,
    left out of this fit, priced by `TPU_WINDOW_TAPS_PER_S`)."""
    import statistics
    import sys

    from te_ckpt_audit.targets._steptime import TPU_COSTS

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from tpu_small import fit_kernels, kernel_errors

    steps = DATA / "tpu-v5e-small-steps.jsonl.gz"
    assert fit_kernels(steps, quiet=True) == TPU_COSTS
    fitted = [abs(est / measured - 1) for _, held, measured, est in kernel_errors(steps, TPU_COSTS)
              if not held and 0.3e-3 <= measured <= 1.0]
    assert len(fitted) == 18 and max(fitted) < 0.16 and statistics.median(fitted) < 0.07


def test_a_tpu_steps_range_is_where_the_chip_ran_steps_so_estimated() -> None:
    """Issue 56, item 2 (nothing silently different): a TPU estimate's range was the sums of libtpu's
    estimates and of the rooflines, and the chip's step lay outside it on 22 of the 50 profiled steps
    (a step at the host's pace got no range at all: 0.423 ms estimated, 0.381 ms run). The range is
    now the band the lent v5e's own steps strayed in, by what bounds the estimate (the host's launch,
    the chip's work under 10 ms or over), the least and the most of every step it ran
    (`bench/tpu_small.py --bands`); each such step lies in its estimate's range."""
    import sys

    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.tpus import tpu_model

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from tpu_small import band_ratios, bands, read_steps

    steps = DATA / "tpu-v5e-small-steps.jsonl.gz"
    assert bands(steps) == {"host": steptime.TPU_HOST_BAND, "small": steptime.TPU_SMALL_BAND,
                            "large": steptime.TPU_LARGE_BAND}
    assert {k: len(v) for k, v in band_ratios(steps).items()} == {"host": 20, "small": 45, "large": 61}
    ranged = 0
    for s in read_steps(steps):
        t = steptime.tpu_estimate(s["kernels"], tpu_model("v5e"), 1, 0.0, s["arrays"])
        assert t.seconds is not None and t.seconds_low is not None and t.seconds_high is not None
        if not t.unestimated:
            assert t.seconds_low <= s["seconds_per_step"] <= t.seconds_high, s["case"]
            ranged += 1
    assert ranged == 77


def test_a_round_the_chip_ran_after_the_range_was_set_lands_in_it() -> None:
    """Issue 56, item 2: round 4 (17 steps of 0.39 ms to 47 ms, chosen after the bands were set, run
    on the lent v5e as a training loop runs them): each step whose kernels libtpu all estimated ran
    inside its estimate's range; the two that hold a kernel libtpu could not estimate (named in the
    report) ran 2x their estimate, outside it. That kernel, a reduce-window, is now priced by its
    window taps, and both steps come within 1.2% of the chip (`test_a_tpu_steps_range_...` reads
    every round under today's estimate)."""
    rows = [r for r in map(json.loads, (DATA / "tpu-v5e-small-held.jsonl").read_text().splitlines())
            if r.get("round") == 4]
    assert len(rows) == 17 and all(r["verdict"] == "ran" for r in rows)
    for r in rows:
        low, high = r["estimated_range"]
        assert (low <= r["seconds_per_step"] <= high) == (not r["unestimated"]), r["case"]
    assert sum(bool(r["unestimated"]) for r in rows) == 2


def test_the_long_sequence_decoders_jump_is_priced_window_by_window() -> None:
    """Issue 56, item 2: at sequence 8192 a decoder's step ran 11x and 32x slower at batch 2 and 3
    than at batch 1 while the estimate scaled linearly. Round 5 (bench/data/tpu-v5e-small-held.jsonl,
    8 steps of 36 ms to 0.75 s, chosen before the chip ran them): where the step's float32 scores
    reach 6 GiB, libtpu lowers the softmax's max as a reduce-window it cannot price, and the chip
    ran those steps 10-15x the same model's smaller ones. As run, the estimate already jumped with
    them (the window's taps at the lanes' rate) but read them 11-12% fast, outside their range;
    libtpu runs that window down the tile's sublanes, which the chip runs at 2.01e13 taps/s, not
    2.32e13: the four such steps now within 1%, every step of the round within 9% and in its range."""
    import sys

    from te_ckpt_audit.targets import _steptime as steptime

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from tpu_small import read_steps

    rows = {r["case"]: r for r in map(json.loads, (DATA / "tpu-v5e-small-held.jsonl").read_text().splitlines())
            if r.get("round") == 5}
    assert len(rows) == 8 and all(r["verdict"] == "ran" for r in rows.values())
    windowed = {c for c, r in rows.items() if r["unestimated"]}
    assert len(windowed) == 4
    small = max(r["seconds_per_step"] for c, r in rows.items() if c not in windowed)
    assert min(rows[c]["seconds_per_step"] for c in windowed) > 9.5 * small  # the chip's jump
    for c in windowed:  # as run: the jump, 11-12% short of it
        assert 0.87 < rows[c]["estimated_seconds"] / rows[c]["seconds_per_step"] < 0.89, c
        assert rows[c]["estimated_range"][1] < rows[c]["seconds_per_step"], c
    chip = tpu_model("v5e")
    steps = [s for s in read_steps(DATA / "tpu-v5e-small-steps.jsonl.gz") if s["held_out"] == 5]
    assert {s["case"] for s in steps} == set(rows)
    for s in steps:
        t = steptime.tpu_estimate(s["kernels"], chip, 1, 0.0, s["arrays"])
        assert t.seconds is not None and t.seconds_low is not None and t.seconds_high is not None
        error = t.seconds / s["seconds_per_step"] - 1
        assert abs(error) < (0.01 if s["case"] in windowed else 0.09), s["case"]
        assert t.seconds_low <= s["seconds_per_step"] <= t.seconds_high, s["case"]
        if s["case"] in windowed:  # the sublane window is what moved it
            [window] = [k for k in s["kernels"] if k.window_sublane and k.cycles >= steptime.UNESTIMATED_CYCLES]
            lanes = [dataclasses.replace(k, window_sublane=False) if k is window else k for k in s["kernels"]]
            before = steptime.tpu_estimate(lanes, chip, 1, 0.0, s["arrays"]).seconds
            assert before is not None and before / s["seconds_per_step"] < 0.89


@pytest.mark.parametrize(("text", "chips", "message", "hint"), [
    ("v5e-8", None, "$tpu$ 'v5e-8' is Cloud TPU's name for a slice of 8 chips; $tpu$ takes CHIP or CHIP:TOPOLOGY",
     "give v5e:2x4"),
    ("v5p-256", None, "$tpu$ 'v5p-256' is Cloud TPU's name for a slice of 128 chips", "give v5p:4x4x8"),
    ("v5e:1x3", None, "$tpu$ 'v5e:1x3' is not a slice a v5e comes in: each side is a power of two", "e.g. v5e:2x2"),
    ("v5e:2x4", 1, "$tpu$ 'v5e:2x4' has 8 chips and the mesh 1 devices", "add $mesh$ data=8"),
    ("v6e", 3, "a TPU slice of 3 chips: slices are powers of two", "v6e:2x2"),
    ("v5e", 512, "$tpu$ 'v5e': v5e:16x32 is larger than a v5e pod (16x16, 256 chips)", "v5e:16x16"),  # libtpu's SIGABRT
    ("v5e:16x32", None, "$tpu$ 'v5e:16x32': v5e:16x32 is larger than a v5e pod", "at most 256 devices"),
])
def test_a_tpu_name_the_tool_cannot_take_is_told_the_one_it_can(text: str, chips: int | None, message: str,
                                                                 hint: str) -> None:
    """Issue 56, item 5: `--tpu v5e-8` was told `v5e` (1 chip), a v6e error hinted `v5e:2x4`, and
    item 6: `--tpu v5e:1x3` was taken as a slice (v5e has none) and "fit"."""
    from te_ckpt_audit import UsageError
    from te_ckpt_audit.tpus import parse_tpu

    with pytest.raises(UsageError) as err:
        parse_tpu(text, chips)
    assert err.value.template.startswith(message) and hint in err.value.hint_template


@pytest.mark.parametrize(("call", "said"), [
    (lambda: __import__("te_ckpt_audit.tpus").tpus.parse_tpu(5), "tpu wants a chip's name"),
    (lambda: __import__("te_ckpt_audit.tpus").tpus.parse_tpu("v5e", chips="8"), "chips '8' must be a count"),
    (lambda: __import__("te_ckpt_audit.tpus").tpus.parse_tpu("v5e", chips=0), "chips 0 must be a count"),
    (lambda: __import__("te_ckpt_audit.tpus").tpus.tpu_model(None), "tpu wants a chip's name"),
    (lambda: __import__("te_ckpt_audit.config").config.load_config(123), "load_config takes a pyproject.toml's path"),
    (lambda: __import__("te_ckpt_audit").audit_target("sample_models/mlp.py:loss", tpu="v5e"),
     "tpu takes a TpuRequest, not str"),
])
def test_the_tpu_api_refuses_what_it_cannot_take_with_a_usage_error(call: object, said: str) -> None:
    """Issue 56, item 6: these raised AttributeError or TypeError, or (chips=0) were accepted."""
    from te_ckpt_audit import UsageError

    with pytest.raises(UsageError, match=said):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(("donate", "step", "said"), [("0", True, "donate wants a tuple"),
                                                      ((-1,), True, "donate wants a tuple"),
                                                      ((0,), False, "donate names the arguments")])
def test_a_tpu_request_refuses_a_donation_it_cannot_make(donate: object, step: bool, said: str) -> None:
    """Issue 56, item 6: `donate="0"` and `donate=(-1,)` were accepted, and `--tpu v5e --donate 0`
    without `--step` ignored (the GPU refuses it)."""
    from te_ckpt_audit import UsageError
    from te_ckpt_audit.tpus import TpuRequest, parse_tpu

    with pytest.raises(UsageError, match=said):
        TpuRequest(parse_tpu("v5e"), step=step, donate=donate)  # type: ignore[arg-type]


def test_an_fp8_gemm_on_a_tpu_is_timed_at_the_bf16_rate() -> None:
    """Issue 56, item 6: FP8 GEMMs on a v5e were timed at the int8 rate (2x the bf16 peak); the chip
    ran the FP8 step and its BF16 twin in the same 12.6 ms: it has no FP8 matrix unit."""
    import dataclasses as dc

    from te_ckpt_audit.records import KernelKind
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import Kernel

    chip = tpu_model("v5e")
    bf16 = Kernel("gemm", KernelKind.GEMM, 2 * 8192**3, 3 * 8192**2 * 2, cycles=10**7, precision="bf16")
    fp8 = dc.replace(bf16, precision="fp8")
    assert steptime.tpu_roofline(fp8, chip) == steptime.tpu_roofline(bf16, chip) == 2 * 8192**3 / chip.bf16_flops
    assert steptime.tpu_timed(fp8, chip).seconds == steptime.tpu_timed(bf16, chip).seconds


def test_the_synthesized_pick_beats_the_best_preset_on_the_chip() -> None:
    """Issue 58, item 5, from the chip's committed rows (bench/data/tpu-v5e-synthesis-chip.jsonl, the
    newest row of each pick): on all seven models the synthesized pick ran, at least as fast as the
    best preset's pick (the presets recommend knows, searched with the batch), 5% faster on two (the
    seq-2048 GPT with and without names: +7.4%, +6.4%), and the estimate orders the two as the chip
    does. The runner-up presets measured on that GPT: the synthesized picks +5.7% and +4.8% above the
    fastest of them; on the Llama (+1.4%) the estimate's second preset ran slower than its first."""
    rows = [json.loads(line) for line in (DATA / "tpu-v5e-synthesis-chip.jsonl").read_text().splitlines()]
    newest = {(r["case"], r["which"]): r for r in rows}
    cases = sorted({case for case, _ in newest})
    assert len(cases) == 7
    gains = {}
    for case in cases:
        made, preset = newest[(case, "synthesized")], newest[(case, "best_preset")]
        assert made["verdict"] == preset["verdict"] == "ran"
        gains[case] = made["throughput"] / preset["throughput"] - 1
        predicted = made["value"] / made["predicted_seconds"] > preset["value"] / preset["predicted_seconds"]
        assert predicted == (gains[case] > 0)
    assert min(gains.values()) > 0 and sum(g >= 0.05 for g in gains.values()) == 2
    runners = [r for r in rows if r["which"] == "runner_up"]
    seq2048 = [c for c in cases if "seq 2048" in c]
    fastest = max(r["throughput"] for r in runners if r["case"] in seq2048)
    assert len(runners) == 4 and sorted(round(newest[(c, "synthesized")]["throughput"] / fastest - 1, 3)
                                        for c in seq2048) == [0.048, 0.057]
    llama = [r for r in runners if r["case"].startswith("llama")]  # the smallest gain: the next preset is slower
    assert len(llama) == 1 and llama[0]["throughput"] < newest[(llama[0]["case"], "best_preset")]["throughput"]


def test_small_steps_kernels_the_estimate_misses_by_kind() -> None:
    """Issue 56, item 2: every profiled small step's kernels as te-ckpt-audit reads them from the
    chip's program, with the chip's time (bench/data/tpu-v5e-small-steps.jsonl.gz). Under the old
    rule the kernels libtpu keeps wholly in VMEM (no HBM bytes) were estimated at nothing, and the
    GPT's gathers and scatters (libtpu: 0 cycles) too; now they take their VMEM bytes, their indexed
    rows and a cost per run, and over the 77 steps the GEMMs come within 10% of the chip's time, the
    VMEM-resident memory kernels within 1.9x, the gathers and scatters within 20%; the reduce-windows
    libtpu gave no estimate (the gpt-mid loss's, 29x its floor; round 5's attention softmax, 33x) now
    run their window taps' time, at the rate the chip ran them along the tile's lanes or down its
    sublanes: within 2% over eight steps (two of them round 4's, priced before the chip ran them)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from tpu_small import kind_sums, read_steps, window_rates

    from te_ckpt_audit.targets._steptime import TPU_WINDOW_SUBLANE_TAPS_PER_S, TPU_WINDOW_TAPS_PER_S

    steps = DATA / "tpu-v5e-small-steps.jsonl.gz"
    assert len(read_steps(steps)) == 77
    assert window_rates(steps) == {"lanes": TPU_WINDOW_TAPS_PER_S, "sublanes": TPU_WINDOW_SUBLANE_TAPS_PER_S}
    sums = kind_sums(steps)

    def ratio(kind: str) -> float:
        found = [v for (k, size), v in sums.items() if k.startswith(kind) and size != "libtpu gave no estimate"]
        return sum(v[1] for v in found) / sum(v[0] for v in found)

    assert 0.9 < ratio("gemm") < 1.0 and 1.0 < ratio("memory (in VMEM)") < 1.9
    assert 0.8 < ratio("memory (gather, scatter)") < 1.0
    estimated, measured, runs = sums[("memory", "libtpu gave no estimate")]
    assert runs == 8 and measured == pytest.approx(estimated, rel=0.02)




def test_what_holds_the_small_steps_from_ten_percent_is_the_gemms() -> None:
    """Issue 56, item 2's goal (every step of 0.3 ms to 1 s within 10% on the chip) is held on 42 of
    the 57 held-out steps. With each GEMM at the chip's own measured time the estimate would hold it on
    52; with that and each DMA sharing HBM with the kernel beside it (a GEMM streaming its weights
    leaves a DMA little), on 55, every round's worst 10.6% or less. The DMAs' share alone makes it 37:
    it pays only once the GEMMs are right, so the estimate does not take it yet."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from tpu_small import what_if

    found = what_if(DATA / "tpu-v5e-small-steps.jsonl.gz")

    def held(name: str) -> int:
        return sum(e < 0.10 for n, es in found[name].items() if n for e in es)

    assert sum(len(es) for n, es in found["today"].items() if n) == 57
    assert (held("today"), held("shared HBM"), held("chip's GEMMs"), held("and shared HBM")) == (42, 37, 52, 55)
    assert max(max(es) for es in found["and shared HBM"].values()) < 0.112
    assert max(max(es) for es in found["today"].values()) > 0.26  # the tiny Llama at sequence 1024


def test_gemms_alone_on_the_chip_show_where_libtpu_misjudges_them() -> None:
    """Issue 56, item 2: what stands between small steps and 10% is the GEMMs (a model's run 0.7-1.5x
    libtpu's estimate). Alone on the chip, by shape (bench/tpu_gemm.py, bench/data/tpu-v5e-gemms.jsonl:
    40 programs of 8 GEMMs each, every kernel timed by the profiler): libtpu prices float32 GEMMs
    within 0.85-1.45x of the chip, but bfloat16 ones with a side of 256 or less, and attention's
    scores, at 1.4-3x (most 2.3x or more); the roofline reads attention's weighted sum over 16-wide
    heads at a fifth to a third of its time (the MXU works in 128-wide tiles); today's rule spans
    0.5-1.95x of them."""
    import sys

    from te_ckpt_audit.records import KernelKind
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import Kernel

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from tpu_gemm import cases

    chip = tpu_model("v5e")
    rows = [json.loads(line) for line in (DATA / "tpu-v5e-gemms.jsonl").read_text().splitlines()]
    assert [r["case"] for r in rows] == [c[0] for c in cases()] and all(r["kernels"] == 8 for r in rows)
    ratio: dict[str, tuple[float, float, float]] = {}
    for r in rows:
        k = Kernel(r["name"], KernelKind.GEMM, r["flops"], r["bytes"], precision=r["precision"], cycles=r["cycles"],
                   vmem_bytes=r["vmem_bytes"])
        took = r["measured_ns"] * 1e-9
        ratio[r["case"]] = (r["cycles"] / chip.clock_hz / took, steptime.tpu_roofline(k, chip) / took,
                            steptime.tpu_timed(k, chip).seconds / took)
    f32 = [v[0] for c, v in ratio.items() if c.endswith("float32")]
    assert 0.85 < min(f32) and max(f32) < 1.45
    narrow = [v[0] for c, v in ratio.items() if c.endswith("bfloat16") and (c.startswith("scores") or (
        c.startswith("matmul") and min(int(d) for d in c.split()[1].split("x")) <= 256))]
    assert len(narrow) == 10 and min(narrow) > 1.4 and sorted(narrow)[5] > 2.3
    sixteen = [v[1] for c, v in ratio.items() if c.startswith("weighted") and "x16 " in c]
    assert len(sixteen) == 4 and min(sixteen) < 0.25 and sorted(sixteen)[1] < 0.4
    today = [v[2] for v in ratio.values()]
    assert 0.5 < min(today) < 0.55 and 1.9 < max(today) < 1.95
