"""How long one training step runs on the target GPUs or TPU chips, from the program compiled
for them.

On a GPU, each kernel (`_kernels`) is timed by XLA's own performance models, which the estimate compile
asks to write into the program (`xla_gpu_collect_cost_model_stats`): `sol` (speed of light, the
cost XLA's latency-hiding scheduler uses on Hopper; its GEMMs from XLA's table measured on H100s)
and the GPU performance model. Where they are known wrong they are corrected, and no kernel is
timed below its roofline floor:

- a bf16 x bf16 -> f32 GEMM: the table has no such entry, and XLA's fallback scales the bf16 one
  by the result's bytes cubed (4^3: 64x too slow); the cube is taken out again;
- an estimate over IMPLAUSIBLE times the kernel's floor (at least a launch) is a placeholder (XLA
  gives async fusions in loops 5000 us, Triton softmax fusions minutes): dropped;
- the floor: the kernel's FLOPs at the GPU's dense tensor-core peak for its operands' type (GEMMs
  and attention), its bytes at the HBM bandwidth; a collective's bytes over its links (NVLink in
  a host, the network across hosts), as a ring moves them;
- in a training step, tensor-core kernels run at TENSOR_EFFICIENCY of their isolated time (one
  constant, fitted on published runs: see docs/guide/step-time.md).

On a TPU, each kernel is timed by libtpu's own estimate, its `estimated_cycles` at the chip's
clock, against its roofline (`tpu_timed`), times one constant (`TPU_EFFICIENCY`), with what those
cycles leave out priced on the chip (`TpuCosts`: a GEMM's fill, another kernel's VMEM bytes,
indexed rows and cost per run); a collective by its bytes over ICI, a DMA between HBM and VMEM by
its bytes at the HBM bandwidth, each beside the kernels until its wait.

On either, the step's time is its kernels run in the order the latency-hiding scheduler put them
in (the optimized HLO's order: `elapsed`): compute kernels one after another, each asynchronous collective
beside the kernels scheduled between its start and its wait, a loop's body once per trip. What
the collectives add beyond the compute is the exposed communication. `sol` where it stands; the
range where XLA's models disagree.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from .._profile import Profile
from ..gpus import BF16, F32, F64, FP8, GpuModel
from ..records import WINDOW_TAPS, Calibration, KernelKind, KernelTime, StepTime
from ..tpus import TpuModel
from . import _kernels
from ._kernels import Kernel

SOL = "sol"
ROOFLINE = "roofline"
IMPLAUSIBLE = 50.0  # times a kernel's floor: an XLA estimate beyond it is a placeholder
# What a training step's tensor-core kernels (GEMMs, attention) reach of their isolated speed (XLA's
# table, the peak): NCCL's kernels share the SMs, clocks sit under the power cap. Fitted on five of
# the nineteen published runs of docs/guide/step-time.md (marked there: the first run of each
# published table, BF16 and FP8), by least squares of the log of estimate over published (`python
# bench/step_time.py --fit`); none of the others.
TENSOR_EFFICIENCY = 0.764
METHOD = ("XLA's sol cost model per kernel (bf16 -> f32 GEMMs rescaled, FP8 GEMMs at the FP8 rate), floored at "
          f"each kernel's roofline, tensor-core kernels at {TENSOR_EFFICIENCY:.0%} of it in a training step (fitted); "
          "loops x trip count; collectives in XLA's scheduled order")
ROOFLINE_METHOD = ("each kernel's roofline: XLA's GPU cost tables have no entry for {arch}, the {gpu}'s "
                   f"architecture; tensor-core kernels at {TENSOR_EFFICIENCY:.0%} of it in a training step (fitted "
                   "on H100s); loops x trip count; collectives in XLA's scheduled order")
ROOFLINE_ESTIMATOR = "the roofline (no XLA cost table for this GPU)"
LAUNCH_S = 2e-6  # the least a kernel costs, for the placeholder test
COSTLIEST = 10
SOURCE_CHARS = 200
_PRECISION = {"fp8": FP8[0], "bf16": BF16, "tf32": F32, "fp64": F64}


@dataclasses.dataclass(frozen=True, slots=True)
class Timed:
    """One kernel's time per run: the estimate, and the range over XLA's models."""

    kernel: Kernel
    seconds: float
    low: float
    high: float
    basis: str


def link_seconds(kernel: Kernel, gpu: GpuModel) -> float:
    """A collective's bytes over its links, as NCCL's rings move them: an all-reduce sends and
    receives 2 (n-1)/n of its buffer, the others (n-1)/n (of an all-gather's result, of a
    reduce-scatter's operand); within a host over NVLink; across hosts over the network, one ring
    per NIC, so a host's share leaves through as many NICs as the group has devices there (8 GPUs
    of a host in one FSDP group: 8 x 400 Gb/s), never faster than NVLink."""
    n = max(kernel.group, 1)
    if n == 1 or gpu.rates is None:
        return 0.0
    share = (n - 1) / n * (2 if kernel.collective == "all-reduce" else 1)
    if kernel.collective == "collective-permute":
        share = 1.0
    rates = gpu.rates
    rate = rates.nvlink_bytes or rates.network_bytes
    if kernel.spans_hosts or not rates.nvlink_bytes:
        rate = min(rate, rates.network_bytes * max(kernel.nics, 1))
    return kernel.bytes * share / rate


def floor_seconds(kernel: Kernel, gpu: GpuModel) -> float:
    """The least time the kernel can take: its FLOPs at the dense peak of its operands' type (GEMMs
    and attention), its bytes at the HBM bandwidth; a collective's, its links'."""
    if kernel.kind is KernelKind.COLLECTIVE:
        return link_seconds(kernel, gpu)
    if kernel.kind is KernelKind.HOST and gpu.host_link:  # a copy to or from host memory: over the host link
        return kernel.bytes / gpu.host_link
    compute = 0.0
    if kernel.kind in (KernelKind.GEMM, KernelKind.ATTENTION) and kernel.flops:
        peak = gpu.dense_flops(_PRECISION.get(kernel.precision, BF16)) or gpu.dense_flops(BF16)
        compute = kernel.flops / peak if peak else 0.0
    return max(compute, kernel.bytes / gpu.bandwidth)


def xla_seconds(kernel: Kernel) -> dict[str, float]:
    """XLA's estimates of one run, by model, seconds; bf16 x bf16 -> f32 GEMMs' `sol` rescaled."""
    out = {name: us * 1e-6 for name, us in kernel.xla_us if us > 0 and math.isfinite(us)}
    if SOL in out and kernel.kind is KernelKind.GEMM and kernel.precision == "bf16" and kernel.widening > 1:
        out[SOL] /= (2 * kernel.widening) ** 3  # XLA's fallback: the bf16 entry times the result's bytes cubed
    return out


def timed(kernel: Kernel, gpu: GpuModel) -> Timed:
    floor = floor_seconds(kernel, gpu)
    limit = IMPLAUSIBLE * max(floor, LAUNCH_S)
    costs = {name: s for name, s in xla_seconds(kernel).items() if s <= limit}
    if SOL in costs and kernel.kind is KernelKind.GEMM and kernel.precision == "fp8":
        # XLA's `sol` times cuBLAS's FP8 GEMM at its table's BF16 speed for the shape (an H100's
        # 780 TFLOP/s on a big one, where its FP8 tensor cores run twice the BF16 rate): at FP8 rates
        costs[SOL] *= gpu.dense_flops(BF16) / (gpu.dense_flops(FP8[0]) or gpu.dense_flops(BF16))
    slower = 1 / TENSOR_EFFICIENCY if kernel.kind in (KernelKind.GEMM, KernelKind.ATTENTION) else 1.0
    if not costs:
        return Timed(kernel, floor * slower, floor * slower, floor * slower, ROOFLINE)
    picked_name = SOL if SOL in costs else min(costs)
    picked = costs[picked_name]
    seconds = max(floor, picked)
    return Timed(kernel, seconds * slower, max(floor, min(costs.values())) * slower,
                 max(floor, max(costs.values())) * slower, picked_name if picked >= floor else ROOFLINE)


# --- TPUs ---------------------------------------------------------------------------------------
# libtpu's cost model prices what the chip runs as a memory-bound kernel at about twice its time,
# and a GEMM anywhere from its time to 1.6x it (a float32 one in HBM most: the chip's profile,
# bench/data/tpu-v5e-profile.jsonl). So a kernel bound by memory is timed at the lesser of libtpu's
# estimate and its bytes at the HBM bandwidth the chip attains; a GEMM (libtpu's estimate above its
# time, its roofline below: no kernel of the profile beat its FLOPs at the peak) at the geometric
# mean of the two. One constant on top (`TPU_EFFICIENCY`), fitted on the v5e's 1st, 3rd, ... rows of
# bench/data/tpu-v5e-time.jsonl (the others are held out: docs/guide/tpu.md).
TPU_EFFICIENCY = 0.985
# What libtpu's cycles leave out, and what a step pays on the chip beyond its kernels, each priced on
# the lent v5e's profiles of 16 small steps (bench/data/tpu-v5e-small-steps.jsonl.gz: every kernel
# with its measured time, each step's device time; `bench/tpu_small.py --fit-kernels`; the held-out
# rounds never seen by the fit):
# - a GEMM runs its estimate and the MXUs' fill and drain: a share of a short one, at most a time
#   (fitted on the GEMMs' measured time);
# - any other kernel its estimate, what it moves in VMEM at VMEM's bandwidth (libtpu keeps many
#   wholly there: no HBM bytes, no roofline), the rows a gather or scatter indexes one by one, and a
#   cost per run (fitted on those kernels' measured time);
# - a DMA between HBM and VMEM (parameters and optimizer state brought in before a kernel reads
#   them, a slice of one; libtpu gives them no cycles) its bytes at the HBM bandwidth the chip
#   attains times a pace, beside the kernels scheduled until its wait; plus a cost per step (both
#   fitted on the steps' device time, and the step's lag behind it);
# - the host: launching a step costs the host a time per step and per array it passes (a jitted
#   function of N donated arrays: 0.10 ms for 1 array, 1.13 ms for 256); a step whose device time
#   is less runs at the host's pace (bench/tpu_host.py; fitted on the steps the host bounds).
# The step takes the greater.
TPU_GEMM_FILL = 0.35
TPU_GEMM_FILL_S = 5e-6
TPU_VMEM_BANDWIDTH = 6.33e12
TPU_INDEX_S = 14.65e-9
TPU_KERNEL_S = 0.097e-6
TPU_DMA_SLOWDOWN = 1.0
TPU_STEP_S = 22.9e-6
TPU_HOST_STEP_S = 0.2324e-3
TPU_HOST_ARRAY_S = 4.66e-6
# A reduce-window libtpu gives no estimate (jax.nn.log_softmax's max over a row of 8192 logits,
# lowered as a window the row's width wide at each element: n^2 work) runs its window's taps at this
# rate: fitted on the two profiled steps of the GPT with an 8192-word vocabulary at batch 8 (11.8 ms
# for 2.7e11 taps); at batch 4 and 16, held out, the chip ran it at 5.8 ms and ~22 ms, as priced.
TPU_WINDOW_TAPS_PER_S = 2.32e13
# One libtpu emits down the tile's sublanes (an attention's softmax max over 8192 keys, where the
# step's float32 scores reach 6 GiB) runs 13% slower: measured on the four such steps of the
# long-sequence round (bench/data/tpu-v5e-small-held.jsonl round 5: 1.32e13 taps, 654-657 ms each;
# at the lanes' rate the steps read 12% fast).
TPU_WINDOW_SUBLANE_TAPS_PER_S = 2.01e13


@dataclasses.dataclass(frozen=True, slots=True)
class TpuCosts:
    """What a TPU step costs beyond libtpu's cycles and the roofline: the constants above (the
    estimate's), or others where a fit tries them (`bench/tpu_small.py --fit-kernels`)."""

    efficiency: float = TPU_EFFICIENCY
    gemm_fill: float = TPU_GEMM_FILL
    gemm_fill_s: float = TPU_GEMM_FILL_S
    vmem_bandwidth: float = TPU_VMEM_BANDWIDTH
    index_s: float = TPU_INDEX_S
    kernel_s: float = TPU_KERNEL_S
    dma_slowdown: float = TPU_DMA_SLOWDOWN
    step_s: float = TPU_STEP_S
    host_step_s: float = TPU_HOST_STEP_S
    host_array_s: float = TPU_HOST_ARRAY_S


TPU_COSTS = TpuCosts()
# How far the chip's step strays from the estimate: measured over estimated, the least and the most
# of every step the lent v5e ran (the small steps' profiles and the big steps' rows of bench/data/;
# `bench/tpu_small.py --bands`), by what bounds the estimate: the host's launch (the host's pace
# varies from run to run), the chip's work under `TPU_LARGE_STEP_S` (small GEMMs, whose time libtpu
# and the roofline both miss by up to 2x), or over it. The estimate's range is this band around it.
TPU_LARGE_STEP_S = 10e-3
TPU_HOST_BAND = (0.88, 1.13)
TPU_SMALL_BAND = (0.81, 1.37)
TPU_LARGE_BAND = (0.92, 1.12)
UNESTIMATED_CYCLES = 2**62  # libtpu writes INT64_MAX (9.2e18 cycles) for a kernel it cannot estimate
NO_ESTIMATE = "no estimate"  # such a kernel's basis: its roofline, which the chip may run far above
LIBTPU = "libtpu"
TPU_ESTIMATOR = "libtpu's cycle estimates and the roofline"
TPU_METHOD = ("libtpu's estimated cycles per kernel at the chip's clock, memory-bound kernels at most their bytes at "
              "the HBM bandwidth the chip attains, GEMMs at the geometric mean of libtpu's estimate and their "
              f"roofline; x {TPU_EFFICIENCY} (fitted on a v5e); GEMMs plus their MXUs' fill ({TPU_GEMM_FILL:.0%}, at "
              f"most {TPU_GEMM_FILL_S * 1e6:.0f} us), the others plus their VMEM bytes at "
              f"{TPU_VMEM_BANDWIDTH / 1e12:.1f} TB/s, {TPU_INDEX_S * 1e9:.1f} ns per row a gather or scatter indexes "
              f"and {TPU_KERNEL_S * 1e6:.2f} us per run; loops x trip count; collectives over ICI and DMAs between HBM "
              "and VMEM beside the kernels, in the scheduled order; plus "
              f"{TPU_STEP_S * 1e6:.0f} us per step; at least the host's {TPU_HOST_STEP_S * 1e3:.2f} ms per step and "
              f"{TPU_HOST_ARRAY_S * 1e6:.2f} us per array passed (each measured on a v5e); a reduce-window libtpu "
              f"cannot price at {TPU_WINDOW_TAPS_PER_S:.3g} window taps/s along lanes, "
              f"{TPU_WINDOW_SUBLANE_TAPS_PER_S:.3g} down sublanes (measured); the range: where the "
              "lent v5e ran steps so estimated (measured over estimated: "
              f"{TPU_HOST_BAND[0]:.2f}-{TPU_HOST_BAND[1]:.2f} at the host's pace, {TPU_SMALL_BAND[0]:.2f}-"
              f"{TPU_SMALL_BAND[1]:.2f} under {TPU_LARGE_STEP_S * 1e3:.0f} ms, {TPU_LARGE_BAND[0]:.2f}-"
              f"{TPU_LARGE_BAND[1]:.2f} above)")


def ici_seconds(kernel: Kernel, chip: TpuModel) -> float:
    """A collective's bytes over the chip's ICI links, as a ring moves them (an all-reduce sends
    2 (n-1)/n of its buffer, the others (n-1)/n, a permute all of it)."""
    n = max(kernel.group, 1)
    if n == 1:
        return 0.0
    share = 1.0 if kernel.collective == "collective-permute" else (n - 1) / n * (
        2 if kernel.collective == "all-reduce" else 1)
    return kernel.bytes * share / chip.ici_bandwidth


def tpu_roofline(kernel: Kernel, chip: TpuModel) -> float:
    """A kernel's least time on a TPU chip: its bytes at the HBM bandwidth the chip attains, a
    GEMM's FLOPs at the bf16 peak if more. An FP8 GEMM too: no chip of the catalog has an FP8
    matrix unit (the v5e ran an FP8 step and its BF16 twin in the same 12.6 ms; its int8 rate is
    int8's), so libtpu converts the operands and multiplies at the bf16 rate."""
    seconds = kernel.bytes / (chip.hbm_attained or chip.hbm_bandwidth)
    if kernel.kind in (KernelKind.GEMM, KernelKind.ATTENTION):
        seconds = max(seconds, kernel.flops / chip.bf16_flops)
    return seconds


def tpu_timed(kernel: Kernel, chip: TpuModel, costs: TpuCosts = TPU_COSTS) -> Timed:
    """One kernel on a TPU chip, from libtpu's estimate (its cycles at the chip's clock) and its
    roofline: a GEMM at their geometric mean and its MXUs' fill, anything else at the lesser and
    what it moves in VMEM and the rows it indexes; the range between them."""
    if kernel.kind is KernelKind.COLLECTIVE:
        seconds = ici_seconds(kernel, chip)
        return Timed(kernel, seconds, seconds, seconds, ROOFLINE)
    if kernel.kind is KernelKind.HOST and chip.host_link:  # to or from host memory: over the host link
        seconds = kernel.bytes / chip.host_link
        return Timed(kernel, seconds, seconds, seconds, ROOFLINE)
    if kernel.vmem_copy:  # a DMA between HBM and VMEM: libtpu gives it no cycles; its bytes at the DMAs' pace
        seconds = kernel.bytes / (chip.hbm_attained or chip.hbm_bandwidth) * costs.dma_slowdown
        return Timed(kernel, seconds, seconds, seconds, ROOFLINE)
    # what libtpu's cycles miss of a kernel other than a GEMM: what it moves in VMEM, the rows it
    # indexes one by one, and its cost per run
    beside = kernel.vmem_bytes / costs.vmem_bandwidth + kernel.indices * costs.index_s + costs.kernel_s
    roofline = tpu_roofline(kernel, chip)
    if kernel.cycles >= UNESTIMATED_CYCLES and kernel.window_taps:  # a reduce-window: its taps, as the chip ran them
        rate = TPU_WINDOW_SUBLANE_TAPS_PER_S if kernel.window_sublane else TPU_WINDOW_TAPS_PER_S
        seconds = max(roofline, kernel.window_taps / rate) * costs.efficiency + beside
        return Timed(kernel, seconds, seconds, seconds, WINDOW_TAPS)
    if kernel.cycles >= UNESTIMATED_CYCLES:  # libtpu's INT64_MAX: no estimate at all, not a slow kernel
        floor = roofline * costs.efficiency + beside
        return Timed(kernel, floor, floor, floor, NO_ESTIMATE)
    libtpu = kernel.cycles / chip.clock_hz
    if kernel.kind in (KernelKind.GEMM, KernelKind.ATTENTION):
        seconds = math.sqrt(libtpu * roofline) if libtpu else roofline
        low, high = sorted((libtpu, roofline)) if libtpu else (seconds, seconds)
        filled = [x * costs.efficiency + min(costs.gemm_fill * x * costs.efficiency, costs.gemm_fill_s)
                  for x in (seconds, low, high)]
        return Timed(kernel, filled[0], filled[1], filled[2], LIBTPU)
    seconds = min(libtpu, roofline)
    low, high = sorted((libtpu, roofline)) if libtpu else (seconds, seconds)
    return Timed(kernel, seconds * costs.efficiency + beside, low * costs.efficiency + beside,
                 high * costs.efficiency + beside, LIBTPU)


def tpu_estimate(kernels: Iterable[Kernel], chip: TpuModel, devices: int, compile_seconds: float,
                 arrays: int = 0, costs: TpuCosts = TPU_COSTS) -> StepTime:
    """A TPU step's time from the kernels libtpu compiled (`tpu_timed`), in its scheduled order, plus
    the step's own cost on the chip; at least what the host takes to launch it with `arrays` arrays
    (`entry_arrays`; 0: not counted). Its range: the band the chip's steps so estimated ran in
    (`tpu_band`)."""
    found = _step([tpu_timed(k, chip, costs) for k in kernels], chip.bf16_flops, devices, compile_seconds, TPU_METHOD)
    if found.seconds is not None:
        extra = costs.step_s
        host = costs.host_step_s + costs.host_array_s * arrays if arrays else 0.0
        seconds = max(found.seconds + extra, host)
        low, high = tpu_band(seconds, host)
        found = dataclasses.replace(found, seconds=seconds, seconds_low=seconds * low, seconds_high=seconds * high,
                                    overhead_seconds=seconds - found.seconds, dispatch_seconds=host)
    return dataclasses.replace(found, device="chip", hardware=chip.name, estimator=TPU_ESTIMATOR,
                               host_link=chip.host_link)


def tpu_band(seconds: float, host: float = 0.0) -> tuple[float, float]:
    """Measured over estimated, the least and the most the lent v5e ran a step so estimated at: at
    the host's pace (`host`: the host's launch, where the estimate is that), under
    `TPU_LARGE_STEP_S`, or above.

    >>> tpu_band(0.4e-3, 0.4e-3), tpu_band(0.6e-3, 0.4e-3), tpu_band(0.2)
    ((0.88, 1.13), (0.81, 1.37), (0.92, 1.12))
    """
    if host and seconds <= host:
        return TPU_HOST_BAND
    return TPU_SMALL_BAND if seconds < TPU_LARGE_STEP_S else TPU_LARGE_BAND


def tpu_failed(why: str, chip: TpuModel, devices: int) -> StepTime:
    return dataclasses.replace(_failed(why, chip.bf16_flops, devices, TPU_METHOD), device="chip", hardware=chip.name,
                               estimator=TPU_ESTIMATOR)


MEASURED = "profile"  # a kernel's basis where the profile measured it


def calibrated(rows: list[Timed], profile: Profile) -> tuple[list[Timed], Calibration]:
    """`rows` with the profile's measurements: a kernel it names takes its measured time per run;
    the others are scaled by the ratio of measured to estimated time over the kernels of their
    kind it names (left as they are where it names none of their kind)."""
    costs = profile.cost_us
    work = [t for t in rows if not t.kernel.waits_for]
    sums: dict[KernelKind, list[float]] = {}
    for t in work:
        if t.kernel.name in costs:
            pair = sums.setdefault(t.kernel.kind, [0.0, 0.0])
            pair[0] += costs[t.kernel.name] * 1e-6 * t.kernel.runs
            pair[1] += t.seconds * t.kernel.runs
    ratios = {kind: measured / estimated for kind, (measured, estimated) in sums.items() if estimated > 0}
    out = []
    for t in rows:
        if t.kernel.waits_for:
            out.append(t)
        elif t.kernel.name in costs:
            seconds = costs[t.kernel.name] * 1e-6
            out.append(Timed(t.kernel, seconds, seconds, seconds, MEASURED))
        elif t.kernel.kind in ratios:
            r = ratios[t.kernel.kind]
            out.append(Timed(t.kernel, t.seconds * r, t.low * r, t.high * r, f"{t.basis} x profile"))
        else:
            out.append(t)
    measured = sum(t.kernel.name in costs for t in work)
    return out, Calibration(profile.source, len(profile.costs), measured, len(work) - measured,
                            tuple(sorted(ratios.items())), 0.0)


def estimate(kernels: Iterable[Kernel], gpu: GpuModel, devices: int, compile_seconds: float,
             profile: Profile | None = None, no_table: str | None = None) -> StepTime:
    """The step's time from its kernels, in XLA's scheduled order (`elapsed`); with `profile`,
    calibrated by it (`calibrated`). Model FLOPs, recompute and tokens are the caller's to set.
    `no_table`: the GPU architecture XLA's cost tables lack (sm_80): every kernel at its roofline,
    and the method says so."""
    rows = [timed(k, gpu) for k in kernels]
    peak = gpu.dense_flops(BF16)
    method = METHOD if no_table is None else ROOFLINE_METHOD.format(arch=no_table, gpu=gpu.name)
    named: dict[str, object] = {"hardware": gpu.name, "host_link": gpu.host_link}
    if no_table is not None:
        named["estimator"] = ROOFLINE_ESTIMATOR
    if profile is not None:  # the measured costs win over either model (XLA's tables, or the roofline alone)
        uncalibrated = _step(rows, peak, devices, compile_seconds, method)
        rows, calibration = calibrated(rows, profile)
        found = _step(rows, peak, devices, compile_seconds, method)
        return dataclasses.replace(found, calibration=dataclasses.replace(
            calibration, estimated_seconds=uncalibrated.seconds or 0.0), **named)  # type: ignore[arg-type]
    return dataclasses.replace(_step(rows, peak, devices, compile_seconds, method), **named)  # type: ignore[arg-type]


def _step(rows: list[Timed], peak: float, devices: int, compile_seconds: float, method: str) -> StepTime:
    """The step of timed kernels: `peak` the utilisations' denominator (one device's dense BF16
    FLOP/s), `method` what timed them."""
    work = [t for t in rows if not t.kernel.waits_for]
    dma = [t for t in work if t.kernel.vmem_copy and t.kernel.asynchronous]  # a TPU's, beside its kernels
    compute = [t for t in work if t.kernel.kind not in (KernelKind.COLLECTIVE, KernelKind.HOST)
               and not (t.kernel.vmem_copy and t.kernel.asynchronous)]
    talk = [t for t in work if t.kernel.kind is KernelKind.COLLECTIVE]
    carry = [t for t in work if t.kernel.kind is KernelKind.HOST]  # offloaded residuals to host memory and back

    def total(ts: Iterable[Timed], field: str) -> float:
        return sum(getattr(t, field) * t.kernel.runs for t in ts)

    unseen = [t for t in compute if (t.basis == ROOFLINE and not t.kernel.xla_us and not t.kernel.cycles)
              or t.basis == NO_ESTIMATE]
    unestimated = sorted({t.kernel.name for t in compute if t.basis == NO_ESTIMATE})
    computing = total(compute, "seconds")
    communicating = total(talk, "seconds")
    hosting = total(carry, "seconds")
    beyond = max(0.0, elapsed(rows) - computing)  # what collectives, host copies and DMAs add, in XLA's schedule
    exposed = min(communicating, beyond)
    exposed_host = min(hosting, beyond - exposed)
    waited = min(total(dma, "seconds"), beyond - exposed - exposed_host)  # a TPU's waits on its DMAs: compute's
    computing += waited
    costliest = sorted((t for t in work if not (t.kernel.vmem_copy and t.kernel.asynchronous)),
                       key=lambda t: -t.seconds * t.kernel.runs)[:COSTLIEST]  # a TPU's DMAs: not kernels
    if not all(math.isfinite(x) for x in (computing, communicating, total(compute, "high"))):
        # every input is bounded where it comes in; should a sum still overflow, no figure is shown
        return _failed("the estimate is not finite: a kernel's time overflowed", peak, devices, method)
    return StepTime(
        seconds=computing + exposed + exposed_host,
        seconds_low=total(compute, "low") + waited + exposed + exposed_host,
        seconds_high=total(compute, "high") + waited + exposed + exposed_host,
        compute_seconds=computing,
        communication_seconds=communicating,
        exposed_communication_seconds=exposed,
        host_seconds=hosting,
        exposed_host_seconds=exposed_host,
        kernels=sum(t.kernel.runs for t in work) - sum(t.kernel.runs for t in dma),
        hlo_flops=sum(t.kernel.flops * t.kernel.runs for t in work),
        model_flops=0,
        recompute_flops=0,
        peak_flops=peak,
        tokens=None,
        devices=devices,
        costliest=tuple(_row(t) for t in costliest),
        model=method,
        compile_seconds=round(compile_seconds, 2),
        gemm_seconds=total((t for t in compute if t.kernel.kind is KernelKind.GEMM), "seconds"),
        attention_seconds=total((t for t in compute if t.kernel.kind is KernelKind.ATTENTION), "seconds"),
        floor_seconds=total(unseen, "seconds"),
        floor_kernels=sum(t.kernel.runs for t in unseen),
        unestimated=tuple(unestimated),
    )


def elapsed(rows: list[Timed], depth: int = 0, runs: int = 1) -> float:
    """The time the kernels take in the order XLA's latency-hiding scheduler put them: compute
    kernels one after another on the compute stream; an asynchronous collective starts on the
    collective stream (after the one before it there) and runs beside the kernels scheduled
    between it and its wait; a synchronous one waits for the collective stream and blocks; a copy to
    or from host memory (an offloaded residual) runs on its own copy stream the same way, and a
    TPU's DMAs between HBM and VMEM on theirs. A loop's
    body (its rows, contiguous) takes its own elapsed time once per trip: where a collective it
    starts is waited for in the next trip (XLA's pipelined collectives), it runs beside that trip's
    kernels, so a trip takes its compute and waits, or its collectives' (or host copies') time,
    whichever is longer."""
    now = stream = copying = busy = carried = dma = moved = 0.0
    ends: dict[str, float] = {}
    i = 0
    while i < len(rows):
        t = rows[i]
        k = t.kernel
        if len(k.loop) > depth:
            key = k.loop[:depth + 1]
            j = i
            while j < len(rows) and rows[j].kernel.loop[:depth + 1] == key:
                j += 1
            trips = _trips(rows[i:j], runs)
            now += elapsed(rows[i:j], depth + 1, runs * trips) * trips
            i = j
            continue
        if k.waits_for:
            now = max(now, ends.get(k.waits_for, now))
        elif k.kind is KernelKind.HOST and k.asynchronous:  # on the copy engine, beside the kernels
            copying = max(now, copying) + t.seconds
            carried += t.seconds
            ends[k.name] = copying
        elif k.vmem_copy and k.asynchronous:  # a TPU's DMA between HBM and VMEM, beside the kernels
            dma = max(now, dma) + t.seconds
            moved += t.seconds
            ends[k.name] = dma
        elif k.kind is KernelKind.COLLECTIVE and k.asynchronous:
            stream = max(now, stream) + t.seconds
            busy += t.seconds
            ends[k.name] = stream
        elif k.kind is KernelKind.COLLECTIVE:
            now = stream = max(now, stream) + t.seconds
            busy += t.seconds
        else:
            now += t.seconds
        i += 1
    return max(now, busy, carried, moved) if depth else max(now, stream, copying, dma)


def _trips(rows: list[Timed], runs: int) -> int:
    """The trip count of the loop whose body's rows are `rows`, `runs` the runs outside it: a row
    directly in its body (the fewest loops around it) runs outside runs x trips."""
    inner = min(rows, key=lambda t: len(t.kernel.loop))
    return max(1, inner.kernel.runs // runs)


@functools.cache
def revision() -> str:
    """A hash of the estimate's own code (this module and the kernel reader): cached estimates are
    keyed by it, so a change to either makes them again."""
    h = hashlib.sha256()
    for module in (__file__, _kernels.__file__):
        h.update(Path(module).read_bytes())
    return h.hexdigest()


def _row(t: Timed) -> KernelTime:
    k = t.kernel
    return KernelTime(k.name, k.kind, t.seconds, k.runs, k.flops, k.bytes, t.basis, k.source[:SOURCE_CHARS])


def failed(why: str, gpu: GpuModel, devices: int) -> StepTime:
    return dataclasses.replace(_failed(why, gpu.dense_flops(BF16), devices, METHOD), hardware=gpu.name)


def _failed(why: str, peak: float, devices: int, method: str) -> StepTime:
    return StepTime(None, None, None, 0.0, 0.0, 0.0, 0, 0, 0, 0, peak, None, devices, (), method, 0.0, why)


# --- the cache's entries ---------------------------------------------------------------------------

def _number(value: object) -> float | None:
    if type(value) not in (int, float):
        return None
    number = float(value)  # type: ignore[arg-type]
    return number if math.isfinite(number) and 0 <= number < 1e30 else None


def _count(value: object) -> int | None:
    return value if type(value) is int and 0 <= value < 2**80 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


class _Invalid(Exception):
    pass


def _need(value: object) -> object:
    if value is None:
        raise _Invalid
    return value


def from_plain(raw: Mapping[str, object]) -> StepTime | None:
    """A StepTime from its plain form (`to_plain`'s, as the cache keeps it), or None where any
    field is missing or out of range."""
    def number(key: str) -> float:
        return float(_need(_number(raw.get(key))))  # type: ignore[arg-type]

    def count(key: str) -> int:
        return int(_need(_count(raw.get(key))))  # type: ignore[call-overload]

    def optional(key: str, check: Callable[[object], object]) -> object:
        value = raw.get(key)
        return None if value is None else _need(check(value))

    try:
        rows = raw.get("costliest")
        if not isinstance(rows, list):
            return None
        if raw.get("seconds") is not None and not (_number(raw.get("seconds")) or 0) > 0:
            return None  # a step takes time: a cached 0 s is a planted or broken entry, estimated again
        return StepTime(
            seconds=optional("seconds", _number),  # type: ignore[arg-type]
            seconds_low=optional("seconds_low", _number),  # type: ignore[arg-type]
            seconds_high=optional("seconds_high", _number),  # type: ignore[arg-type]
            compute_seconds=number("compute_seconds"),
            communication_seconds=number("communication_seconds"),
            exposed_communication_seconds=number("exposed_communication_seconds"),
            kernels=count("kernels"),
            hlo_flops=count("hlo_flops"),
            model_flops=count("model_flops"),
            recompute_flops=count("recompute_flops"),
            peak_flops=number("peak_flops"),
            tokens=optional("tokens", _count),  # type: ignore[arg-type]
            devices=count("devices"),
            costliest=tuple(_kernel(r) for r in rows),
            model=str(_need(_text(raw.get("model")))),
            compile_seconds=number("compile_seconds"),
            error=optional("error", _text),  # type: ignore[arg-type]
            gemm_seconds=number("gemm_seconds"),
            attention_seconds=number("attention_seconds"),
            calibration=optional("calibration", _calibration),  # type: ignore[arg-type]
            examples=optional("examples", _count),  # type: ignore[arg-type]
            device=str(raw.get("device", "GPU")) if raw.get("device", "GPU") in ("GPU", "chip") else "GPU",
            hardware=str(raw.get("hardware") or ""),
            estimator=str(raw.get("estimator") or "XLA's cost models"),
            floor_seconds=number("floor_seconds"),
            floor_kernels=count("floor_kernels"),
            unestimated=_names(raw.get("unestimated", [])),
            overhead_seconds=number("overhead_seconds"),  # an entry made before it: estimated again
            host_seconds=number("host_seconds"),
            exposed_host_seconds=number("exposed_host_seconds"),
            host_link=number("host_link"),
            dispatch_seconds=number("dispatch_seconds"),
        )
    except _Invalid:
        return None


def _names(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise _Invalid
    return tuple(raw)


def _calibration(raw: object) -> Calibration:
    if not isinstance(raw, dict) or not isinstance(raw.get("ratios"), list):
        raise _Invalid
    ratios = []
    for pair in raw["ratios"]:
        if not (isinstance(pair, list) and len(pair) == 2 and pair[0] in {k.value for k in KernelKind}):
            raise _Invalid
        ratios.append((KernelKind(pair[0]), float(_need(_number(pair[1])))))  # type: ignore[arg-type]
    return Calibration(
        profile=str(_need(_text(raw.get("profile")))),
        instructions=int(_need(_count(raw.get("instructions")))),  # type: ignore[call-overload]
        measured=int(_need(_count(raw.get("measured")))),  # type: ignore[call-overload]
        missing=int(_need(_count(raw.get("missing")))),  # type: ignore[call-overload]
        ratios=tuple(ratios),
        estimated_seconds=float(_need(_number(raw.get("estimated_seconds")))),  # type: ignore[arg-type]
    )


def _kernel(raw: object) -> KernelTime:
    if not isinstance(raw, dict) or raw.get("kind") not in {k.value for k in KernelKind}:
        raise _Invalid
    return KernelTime(
        name=str(_need(_text(raw.get("name")))),
        kind=KernelKind(raw["kind"]),
        seconds=float(_need(_number(raw.get("seconds")))),  # type: ignore[arg-type]
        runs=int(_need(_count(raw.get("runs")))),  # type: ignore[call-overload]
        flops=int(_need(_count(raw.get("flops")))),  # type: ignore[call-overload]
        bytes=int(_need(_count(raw.get("bytes")))),  # type: ignore[call-overload]
        basis=str(_need(_text(raw.get("basis")))),
        source=str(_need(_text(raw.get("source")))),
    )
