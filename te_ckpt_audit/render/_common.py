"""What every output shares: units, the comparison's columns, hotspots, mark symbols, notes, and
the words for warnings, so that the terminal, JSON, Markdown, GitHub and HTML show the same figures.

    >>> format_bytes(836923), format_flops(7440627)
    ('817 KiB', '7.44 MFLOP')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import assert_never

from ..records import (
    WINDOW_TAPS,
    AuditReport,
    AuditWarning,
    Calibration,
    Equation,
    GpuInfo,
    Hotspot,
    HotspotKey,
    Outcome,
    PeakMemory,
    PolicyResult,
    Recommendation,
    Remat3Row,
    Residual,
    ResidualKind,
    ShardingSource,
    StepTime,
    TpuPlan,
    findings,
)
from ._text import printable_records

# --- units ------------------------------------------------------------------------------------


def _human(value: float, units: tuple[str, ...], base: int) -> str:
    """Three significant digits in the largest unit that keeps the number under 1000."""
    i = 0
    while abs(value) >= 999.5 and i < len(units) - 1:
        value /= base
        i += 1
    return f"{value:.3g} {units[i]}" if abs(value) < 999.5 else f"{value:.0f} {units[i]}"


def format_bytes(n: int) -> str:
    """Binary units: `format_bytes(50176)` is '49 KiB'."""
    return _human(n, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"), 1024)


def format_flops(n: int) -> str:
    """Decimal units: `format_flops(1_200_000_000)` is '1.2 GFLOP'."""
    return _human(n, ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"), 1000)


def format_percent(p: float) -> str:
    return f"{p:.1f}%"


# --- the comparison: one row per policy ---------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
    header: str
    value: Callable[[AuditReport, PolicyResult], str]
    numeric: bool = True
    compiled: bool = False  # a figure of the compiled GPU step, not of the residual audit

    def cell(self, report: AuditReport, result: PolicyResult) -> str:
        """The column's text for a policy; a policy JAX could not differentiate under has no figures,
        and a training step of the target's own no residual figures."""
        if self.numeric and result.error is not None:
            return "error"
        if self.numeric and not result.audited and not self.compiled:
            return "not audited"
        return self.value(report, result)


def winner_policy(rec: Recommendation) -> str | None:
    """The starred policy of a recommendation: the throughput search's pick, else the recommended."""
    if rec.throughput is not None:
        return None if rec.throughput.best is None else rec.throughput.best.policy
    return None if rec.recommended is None else rec.recommended.policy


def counted(n: int, one: str) -> str:
    """`n` things in words: "1 policy", "3 policies".

    >>> counted(1, "policy"), counted(3, "policy"), counted(2, "point")
    ('1 policy', '3 policies', '2 points')
    """
    many = one[:-1] + "ies" if one.endswith("y") else one + "s"
    return f"{n} {one if n == 1 else many}"


def warning_message(w: AuditWarning) -> str:
    """The words for a finding, from its record: one case per kind of finding."""
    w = printable_records(w)
    match w:
        case findings.TeGemmsRecomputed():
            return (
                f"{w.policy} saves dots but recomputes all {len(w.equations)} TE GEMMs "
                f"({format_flops(w.flops)}): JAX's dot policies do not know TE's primitives; "
                "use checkpoint_dots_and_te_gemms"
            )
        case findings.InputsReplicated():
            axes = " or ".join(w.axes)
            return (f"no input is sharded over the mesh {w.mesh}: every device holds the whole batch, so the "
                    f"per-device figures are the whole model's, not a data-parallel run's; shard the batch "
                    f"over {axes} (NamedSharding(mesh, P({w.axes[0]!r})) in the inputs callable, which takes "
                    f"the keyword mesh)")
        case findings.SameAsNothingSaveable():
            return f"{w.policy} saves exactly what nothing_saveable saves: it checkpoints nothing in this model"
        case findings.UnknownName():
            hint = (
                f"it is the name --name-lines gives {w.line}: add --name-lines, or checkpoint_name there"
                if w.line
                else f"did you mean {w.closest!r}?"
                if w.closest
                else f"names in the model: {', '.join(w.model_names) or 'none'}"
            )
            return f"{w.policy}: no checkpoint_name in the model is {w.name!r} ({hint})"
        case findings.SavesEverything():
            return (
                "this jax's save_anything_except_these_names ignores its names and saves everything; "
                "use save_any_names_but_these"
            )
        case findings.OffloadMissing():
            return f"{w.policy} offloads nothing to host memory in this model"
        case findings.InnerScopeWithoutCheckpoints():
            return (
                f"--scope inner applies {w.policy} to the model's own checkpoints, and it has none: "
                "the policy changes nothing; use --scope outer (or auto)"
            )
        case findings.GemmBatchDimsMissed():
            return (
                f"{w.policy} keeps dots only without batch dimensions, so it recomputes "
                f"{len(w.equations)} weight GEMMs that have them ({', '.join(w.origins)}; "
                f"{format_flops(w.flops)}): {', '.join(w.modules)}; use checkpoint_dots (or "
                "checkpoint_dots_and_te_gemms), or name them with checkpoint_name and save the names"
            )
        case findings.TeRequantized():
            said = (f"{w.policy} quantizes again in the backward pass: {w.runs} TE quantizations "
                    f"({format_flops(w.flops)}) at {', '.join(w.modules)}")
            if w.delayed:  # saving the quantizers' names does not avoid these: say what it does
                kept = f" (it keeps {format_bytes(w.kept_bytes)} of quantized tensors all the same)"
                kept = kept if w.kept_bytes else ""
                return (f"{said}: under delayed scaling each quantize also updates the amax history, which the "
                        f"backward pass needs, so it runs again whatever is saved{kept}; current scaling "
                        "(TE's Float8CurrentScaling, MaxText's te_fp8_currentscaling) with the quantizers' "
                        "names saved runs none again")
            if w.unspellable:  # in Python, where any name can be written
                names = ", ".join(map(repr, w.quantizer_names))
                python = ("jax.checkpoint_policies.save_from_both_policies(jax.checkpoint_policies."
                          f"save_only_these_names({names}), te_ckpt_audit.policies.te_gemms_saveable)")
                return (f"{said}; save the quantizers' checkpoint names with the GEMM outputs, in Python: {python} "
                        f"(a --policy spec cannot carry the name {', '.join(map(repr, w.unspellable))})")
            if w.maxtext_policy:
                return (f"{said}; save the quantizers (MaxText's TE layers name them quantization) with the "
                        f"projections: remat_policy: '{w.maxtext_policy}' in MaxText's config (--policy "
                        f"{w.saving_spec} here)")
            if w.saving_spec:
                return f"{said}; save the quantizers' checkpoint names with the GEMM outputs: --policy {w.saving_spec}"
            return (f"{said}; name them (TE's quantization_checkpoint_name='quantization' on its layers), then "
                    "save save_only_these_names:quantization+te_gemms_saveable")
        case findings.Remat3():
            return (
                "jax_remat3 is on: these are the residuals of JAX's new remat, which recomputes every "
                "primitive it has no rule for and every custom_vjp (TE's dense) whatever the policy says, "
                "unless jax_custom_vjp3 is on too"
            )
        case findings.Remat3ChangesPolicy():
            te = (f"; TE's {len(w.te_gemms)} GEMMs saved now are recomputed under it (JAX's new remat "
                  "treats a custom_vjp, TE's dense, as one unit unless jax_custom_vjp3 is on too)"
                  if w.te_gemms else "")
            return (f"{w.policy} saves {format_bytes(w.remat3_bytes)} of activations under jax_remat3, "
                    f"{format_bytes(w.remat_bytes)} now: {len(w.equations)} equations change{te}")
        case _:
            assert_never(w)


QUANTIZATION_HEADERS = ("quantized", "requantized")  # shown where the model quantizes


def quantizes(report: AuditReport) -> bool:
    """Whether the model has TE quantizations (or keeps quantized values): its reports show them."""
    return any(e.is_te_quantize for e in report.equations) or any(r.totals.quantized_bytes for r in report.results)


def producer_headers(report: AuditReport) -> tuple[str, ...]:
    """The producer split's columns: TE GEMM, dot, quantized (where there is any), named, other."""
    q = quantizes(report)
    return ("TE GEMM", "dot", *(("quantized",) if q else ()), "named", "other", "TE GEMMs recomputed",
            *(("requantized",) if q else ()))


def _host_link(t: StepTime) -> str:
    """How the host copies were timed: a GPU's over its host link (PCIe); a v5e's over its link as
    measured on the chip; another TPU's at libtpu's estimate, which does not time the link (its link
    was not measured): said, not hidden."""
    if not t.host_link:
        return f"; libtpu's estimate, not the host link's time: the {t.hardware or 'TPU'}'s host link was not measured"
    link = f"{t.host_link / 1e9:g} GB/s"
    return (f"; each direction over the GPU's host link, PCIe, {link}" if t.device != "chip" else
            f"; each direction over the {t.hardware}'s host link, {link} as measured on the chip")


def offloaded(report: AuditReport) -> bool:
    """Whether any policy keeps bytes in host memory: the terminal shows its "host" column only then
    (at 80 columns the policy names need the room); the Markdown, HTML and JSON keep it always."""
    return any(r.totals.host_bytes for r in report.results)


def shared_arguments(report: AuditReport) -> int | None:
    """The argument bytes every policy keeps, where two or more policies were audited and all keep
    the same (the usual case: the inputs the backward pass reads do not depend on the policy): the
    terminal then says it once under the first table instead of a column of one figure (at 80
    columns the longest policy names need the room); the Markdown, HTML and JSON keep the column."""
    kept = [r.totals.argument_bytes for r in report.results if r.error is None]
    return kept[0] if len(kept) > 1 and len(set(kept)) == 1 else None


def policy_errors(report: AuditReport) -> list[tuple[str, str]]:
    """(policy, why) for each policy JAX could not differentiate the function under."""
    return [(r.policy, r.error) for r in report.results if r.error is not None]


def _te_gemms_recomputed(report: AuditReport, result: PolicyResult) -> str:
    te = {e.id for e in report.equations if e.is_te_gemm}
    if not te:
        return "-"
    recomputed = sum(m.outcome is Outcome.RECOMPUTED for m in result.marks if m.equation in te)
    return f"{recomputed}/{len(te)}"


def _compiled(field: str) -> Callable[[AuditReport, PolicyResult], str]:
    def cell(_: AuditReport, r: PolicyResult) -> str:
        value = None if r.compiled is None else getattr(r.compiled, field)
        return "n/a" if value is None else format_bytes(value)

    return cell


COMPILED_HEADERS = ("activation", "XLA temp", "XLA arguments", "XLA output", "XLA host")
GPU_HEADERS = ("activation", "peak per device", "headroom", "fits", "least fraction", "needed", "GPU temp",
               "GPU arguments", "GPU aliased", "compile s")
GPU_TERMINAL = ("peak per device", "headroom", "fits", "least fraction", "GPU temp", "compile s")  # narrower


def peak_range(p: PeakMemory | None) -> str:
    """A compiled peak as its range over the two GEMM backends (one figure where they agree)."""
    if p is None or p.bytes_per_device is None or p.bytes_per_device_min is None:
        return "n/a"
    if p.bytes_per_device_min == p.bytes_per_device:
        return format_bytes(p.bytes_per_device)
    return f"{format_bytes(p.bytes_per_device_min)}..{format_bytes(p.bytes_per_device)}"


def _headroom(report: AuditReport, r: PolicyResult) -> str:
    if report.gpu is None or r.peak is None or r.peak.bytes_per_device is None:
        return "n/a"
    left = report.gpu.usable_bytes - r.peak.bytes_per_device
    return format_bytes(left) if left >= 0 else "-" + format_bytes(-left)


def _fits(r: PolicyResult) -> str:
    if r.peak is None or r.peak.fits is None:
        return "n/a"
    return ("yes" if r.peak.fits else "NO") + (" (XLA remat)" if r.peak.xla_rematerialized else "")


def _least(report: AuditReport, r: PolicyResult) -> str:
    if r.peak is None or r.peak.bytes_per_device is None:
        return "n/a"
    if report.gpu is not None and report.gpu.allocator == "platform":
        return "n/a"
    return "none" if r.peak.least_fraction is None else f"{r.peak.least_fraction:.2f}"


FRACTION_VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # read by every jax this supports


def fraction_words(gpu: GpuInfo) -> str:
    """The run's fraction and where it came from: "0.85 (XLA_PYTHON_CLIENT_MEM_FRACTION)"."""
    match gpu.fraction_source:
        case "environment":
            return f"{gpu.mem_fraction:.2f} ({gpu.fraction_variable})"
        case "given":
            return f"{gpu.mem_fraction:.2f} (given)"
        case _:
            return f"{gpu.mem_fraction:.2f} (JAX's default)"


def fraction_advice(report: AuditReport, r: PolicyResult) -> str | None:
    """What a policy's step needs of the GPU, and what would make it fit, in words."""
    gpu, p = report.gpu, r.peak
    if gpu is None or p is None or p.bytes_per_device is None:
        return None
    memory = format_bytes(gpu.memory_bytes)
    if gpu.allocator == "platform":
        verdict = "fits" if p.fits else "does not fit"
        return (f"{r.policy}: {verdict} in {format_bytes(gpu.usable_bytes)} (the platform allocator takes no "
                f"fraction: the memory less {format_bytes(gpu.reserved_bytes)} for the CUDA context and NCCL)")
    variable = gpu.fraction_variable or FRACTION_VARIABLE
    if p.least_fraction is None:
        need = p.needed_bytes if p.needed_bytes is not None else p.bytes_per_device
        return (f"{r.policy}: does not fit at any fraction: it needs {format_bytes(need)}, and at most "
                f"{gpu.max_fraction:.2f} of {memory} can go to JAX ({format_bytes(gpu.reserved_bytes)} stay for "
                "the CUDA context and NCCL)")
    if p.fits:
        return f"{r.policy}: fits at {fraction_words(gpu)}; needs {p.least_fraction:.2f} of {memory}"
    suggested = min(gpu.max_fraction, -(-p.least_fraction * 20 // 1) / 20)
    return (f"{r.policy}: does not fit at {fraction_words(gpu)}; needs {p.least_fraction:.2f} of {memory}: "
            f"set {variable}={suggested:.2f}")


def _gpu_bytes(field: str) -> Callable[[AuditReport, PolicyResult], str]:
    def cell(_: AuditReport, r: PolicyResult) -> str:
        value = None if r.peak is None else getattr(r.peak, field)
        return "n/a" if value is None else format_bytes(value)

    return cell


_UPDATES = {"sgd": "optax.sgd, no momentum", "momentum": "optax.sgd with momentum 0.9"}  # others: optax.<name>


def update_words(report: AuditReport) -> str:
    """The update the compiled step adds and the state it keeps, in words ("no optimizer")."""
    step = report.step
    if step is None or step.optimizer is None:
        return "no optimizer"
    words = _UPDATES.get(step.optimizer, f"optax.{step.optimizer}")
    if step.state_bytes is None:
        return words
    state = "no state" if step.state_bytes == 0 else f"state {format_bytes(step.state_bytes)} over all devices"
    return f"{words}, {state}"


def gpu_title(report: AuditReport) -> str:
    assert report.gpu is not None
    if report.step is not None and report.step.own:
        return f"The target's own training step per device: XLA:GPU compile for {report.gpu.name}, no autotuning"
    return f"Training step ({update_words(report)}) per device: XLA:GPU compile for {report.gpu.name}, no autotuning"


def trained_note(report: AuditReport) -> str | None:
    """Which inputs were differentiated (and, on a GPU, trained), in words."""
    t = report.trained
    if t is None:
        return None
    if t.arguments is None:
        return f"Differentiated: every float input ({len(t.inputs)}), as jax.ad_checkpoint.print_saved_residuals does."
    shown = ", ".join(f"args[{a}]" for a in t.arguments) + f" ({len(t.inputs)} arrays)"
    why = " (the default: the first argument, as jax.grad trains it)" if t.convention else ""
    return f"Trained: {shown}{why}; the other inputs are the batch, not differentiated."


def gpu_notes(report: AuditReport) -> list[str]:
    """What the peak columns mean, the run's environment, and each policy's finding."""
    gpu = report.gpu
    assert gpu is not None
    backends = next((r.peak.backends for r in report.results if r.peak is not None and r.peak.backends), ())
    plan = ("with Triton GEMM fusions..with cuBLAS (its workspace included); gates use the larger"
            if len(backends) != 1 else f"with the GEMM backend XLA_FLAGS choose ({backends[0]})")
    pool = (f"Usable: {format_bytes(gpu.usable_bytes)} of {format_bytes(gpu.memory_bytes)}, the fraction "
            f"{fraction_words(gpu)} JAX's allocator may take; XLA plans against it, as on a real run"
            if gpu.allocator != "platform" else
            f"Usable: {format_bytes(gpu.usable_bytes)} of {format_bytes(gpu.memory_bytes)} (the platform allocator)")
    notes = [
        f"Peak: XLA:GPU's plan for one device, {plan}. {pool}. 'needed': the peak XLA plans with its own "
        "rematerialization off and unbounded memory, where the step does not fit or XLA rematerialized. "
        "Compiled without a GPU: no real GPU has checked these figures."
    ]
    if gpu.xla_flags:
        notes.append(f"XLA_FLAGS of the run applied to every compile: {gpu.xla_flags}")
    for r in report.results:
        if r.peak is None:
            continue
        if r.peak.error:
            notes.append(f"{r.policy}: not compiled for the GPU: {r.peak.error}")
            continue
        advice = fraction_advice(report, r)
        if advice:
            notes.append(advice)
        if r.peak.xla_rematerialized:
            need = r.peak.needed_bytes
            without = "" if need is None else f"; without it, it needs {format_bytes(need)}"
            notes.append(f"{r.policy}: XLA rematerialized on its own to plan "
                         f"{format_bytes(r.peak.bytes_per_device or 0)}{without}")
    return notes


PER_DEVICE = "per device"  # on a mesh: activation bytes on one device, shown first


def _per_device(_: AuditReport, r: PolicyResult) -> str:
    value = r.totals.activation_bytes_per_device
    return "n/a" if value is None else format_bytes(value)


def mesh_note(report: AuditReport) -> str:
    assert report.mesh is not None
    source = _SOURCE_WORDS.get(report.sharding_source, "") if report.sharding_source else ""
    sharded = f", each residual sharded {source}" if source else ""  # no half sentence where it is not known
    return MESH_NOTE.format(mesh=report.mesh, devices=report.mesh.devices, sharded=sharded)


def shown_columns(report: AuditReport, headers: tuple[str, ...]) -> tuple[str, ...]:
    """`headers` as a report shows them: on a mesh the per-device bytes come first, and the
    figures XLA compiled on the mesh are per device too (its memory analysis is per device)."""
    if report.mesh is None:
        return headers
    return (PER_DEVICE, *headers) if "activation" in headers else headers


MESH_NOTE = (
    "Mesh {mesh} ({devices} devices): 'per device' is the activation bytes one device keeps{sharded}. "
    "Budgets and baselines apply per device; the other byte columns are global; XLA's columns are per "
    "device."
)
_SOURCE_WORDS = {
    ShardingSource.COMPILED: "as XLA's SPMD partitioner shards it (compiled for virtual CPU devices)",
    ShardingSource.ABSTRACT: "as its aval's explicit sharding says (traced on an abstract mesh)",
}


def compiled_errors(report: AuditReport) -> list[tuple[str, str]]:
    """(policy, why) for each policy whose training step did not compile."""
    return [(r.policy, r.compiled.error) for r in report.results if r.compiled and r.compiled.error]


COLUMNS: dict[str, Column] = {
    c.header: c
    for c in (
        Column("policy", lambda _, r: r.policy, numeric=False),
        Column("scope", lambda _, r: r.scope.value, numeric=False),
        Column(PER_DEVICE, _per_device),
        Column("activation", lambda _, r: format_bytes(r.totals.activation_bytes)),
        Column("arguments", lambda _, r: format_bytes(r.totals.argument_bytes)),
        Column("host", lambda _, r: format_bytes(r.totals.host_bytes)),
        Column("TE GEMM", lambda _, r: format_bytes(r.totals.te_gemm_bytes)),
        Column("dot", lambda _, r: format_bytes(r.totals.dot_bytes)),
        Column("named", lambda _, r: format_bytes(r.totals.named_bytes)),
        Column("other", lambda _, r: format_bytes(r.totals.other_bytes)),
        Column("TE GEMMs recomputed", _te_gemms_recomputed),
        Column("quantized", lambda _, r: format_bytes(r.totals.quantized_bytes)),
        Column("requantized", lambda _, r: str(r.requantized)),
        Column("residuals", lambda _, r: str(len(r.residuals))),
        Column("recompute", lambda _, r: format_flops(r.recompute_flops)),
        Column("% of forward", lambda _, r: format_percent(r.recompute_percent)),
        Column("XLA temp", _compiled("temp_bytes")),
        Column("XLA arguments", _compiled("argument_bytes")),
        Column("XLA output", _compiled("output_bytes")),
        Column("XLA host", _compiled("host_bytes")),
        Column("peak per device", lambda _, r: peak_range(r.peak), compiled=True),
        Column("headroom", _headroom, compiled=True),
        Column("fits", lambda _, r: _fits(r), numeric=False, compiled=True),
        Column("least fraction", _least, compiled=True),
        Column("needed", _gpu_bytes("needed_bytes"), compiled=True),
        Column("GPU temp", _gpu_bytes("temp_bytes"), compiled=True),
        Column("GPU arguments", _gpu_bytes("argument_bytes"), compiled=True),
        Column("GPU aliased", _gpu_bytes("alias_bytes"), compiled=True),
        Column("compile s", lambda _, r: "n/a" if r.peak is None else f"{r.peak.compile_seconds:.1f}", compiled=True),
    )
}


# --- the step on a TPU slice (--tpu): libtpu's plan and verdict -------------------------------------

TPU_HEADERS = ("plan per chip", "fits", "required", "TPU temp", "TPU arguments", "compile s")


def _tpu(field: Callable[[TpuPlan], str]) -> Callable[[AuditReport, PolicyResult], str]:
    def cell(_: AuditReport, r: PolicyResult) -> str:
        if r.tpu_plan is None:
            return "n/a"
        if r.tpu_plan.error is not None:
            return "failed"
        return field(r.tpu_plan)

    return cell


def _bytes_or_dash(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


TPU_COLUMNS: dict[str, Column] = {
    c.header: c
    for c in (
        Column("plan per chip", _tpu(lambda p: _bytes_or_dash(p.plan_bytes)), compiled=True),
        Column("fits", _tpu(lambda p: "yes" if p.fits else "NO"), numeric=False, compiled=True),
        Column("required", _tpu(lambda p: _bytes_or_dash(p.required_bytes)), compiled=True),
        Column("TPU temp", _tpu(lambda p: _bytes_or_dash(p.temp_bytes)), compiled=True),
        Column("TPU arguments", _tpu(lambda p: _bytes_or_dash(p.argument_bytes)), compiled=True),
        Column("compile s", _tpu(lambda p: f"{p.compile_seconds:.1f}"), compiled=True),
    )
}


def tpu_title(report: AuditReport) -> str:
    t = report.tpu
    assert t is not None
    if report.step is not None and report.step.own:
        return (f"The target's own training step per chip: libtpu's compile for {t.topology} ({t.chips} x {t.name}, "
                f"libtpu {t.libtpu or 'unknown'}), no TPU needed")
    return (f"Training step ({update_words(report)}) per chip: libtpu's compile for {t.topology} "
            f"({t.chips} x {t.name}, libtpu {t.libtpu or 'unknown'}), no TPU needed")


def tpu_notes(report: AuditReport) -> list[str]:
    """What the TPU columns mean, and each policy's failure."""
    t = report.tpu
    assert t is not None
    notes = [f"fits: libtpu's own HBM check, the one the chip applies ({format_bytes(t.usable_bytes)} usable of "
             f"{format_bytes(t.hbm_bytes)}; on a real v5e it took and refused exactly what this compile did, "
             "docs/guide/tpu.md). required: the HBM a refused step needs, as libtpu says. The plan (arguments, "
             "outputs not aliased to them, temporaries) is not what the chip compares: a plan above the HBM "
             "can fit. The plan belongs to this libtpu version."]
    notes += [f"{r.policy}: not compiled: {r.tpu_plan.error}" for r in report.results
              if r.tpu_plan is not None and r.tpu_plan.error]
    return notes


# --- the compiled step, one section per target ---------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Section:
    """One table of a report after its policies: a title, the columns beside the policy, notes."""

    title: str
    columns: tuple[Column, ...]
    notes: tuple[str, ...]


def jax_text(report: AuditReport) -> str:
    """The jax a report was made with, and its new remat where the results are that one's."""
    return f"jax {report.jax_version}" + (" (jax_remat3)" if report.remat == "remat3" else "")


def target_sections(report: AuditReport, gpu_headers: tuple[str, ...] = GPU_HEADERS) -> list[Section]:
    """The compiled step's sections, one per target the report holds (its GPU's peak, its TPU
    slice's plan and verdict): every format lays them out alike; `gpu_headers` the GPU columns a
    format has room for."""
    found = [(report.gpu, gpu_title, tuple(COLUMNS[h] for h in gpu_headers), gpu_notes),
             (report.tpu, tpu_title, tuple(TPU_COLUMNS[h] for h in TPU_HEADERS), tpu_notes),
             (report.remat3 or None, _remat3_title, REMAT3_COLUMNS, _remat3_notes)]
    return [Section(title(report), columns, tuple(notes(report))) for info, title, columns, notes in found
            if info is not None]


# --- JAX's two remat implementations side by side (--remat3 both) ---------------------------------


def _remat3_cell(field: Callable[[Remat3Row], str]) -> Callable[[AuditReport, PolicyResult], str]:
    def cell(report: AuditReport, r: PolicyResult) -> str:
        row = next((x for x in report.remat3 if x.policy == r.policy), None)
        if row is None:
            return "n/a"
        return "error" if row.error is not None else field(row)

    return cell


REMAT3_COLUMNS = (
    Column("saved now", _remat3_cell(lambda x: format_bytes(x.remat_bytes))),
    Column("saved under remat3", _remat3_cell(lambda x: format_bytes(x.remat3_bytes))),
    Column("TE GEMMs now", _remat3_cell(lambda x: format_bytes(x.remat_te_gemm_bytes))),
    Column("TE GEMMs under remat3", _remat3_cell(lambda x: format_bytes(x.remat3_te_gemm_bytes))),
    Column("recompute now", _remat3_cell(lambda x: format_flops(x.remat_recompute_flops))),
    Column("recompute under remat3", _remat3_cell(lambda x: format_flops(x.remat3_recompute_flops))),
    Column("changes", _remat3_cell(lambda x: "yes" if x.changed else "no"), numeric=False),
)


def _remat3_title(report: AuditReport) -> str:
    return "JAX's remat now vs jax_remat3 (activation bytes each saves)"


def _remat3_notes(report: AuditReport) -> Iterator[str]:
    yield ("jax_remat3 saves what a primitive's rule in JAX's remat table says (dot_general, conv, names, "
           "loops): every other primitive, and a custom_vjp as a whole (TE's dense) unless jax_custom_vjp3 "
           "is on, is recomputed whatever the policy says")
    for row in report.remat3:
        if row.error is not None:
            yield f"{row.policy} under jax_remat3: {row.error}"


# --- the step's time (--time): an estimate, labelled as one --------------------------------------

TIME_HEADERS = ("s/step (estimate)", "range", "FLOP/s per GPU", "MFU", "HFU", "throughput per GPU", "exposed comm")
TIME_TERMINAL = tuple(h for h in TIME_HEADERS if h != "range")  # narrower: the range is in the notes
KERNEL_HEADERS = ("kernel", "kind", "ms per step", "runs", "set by", "what it computes")


def _time(field: Callable[[StepTime], str]) -> Callable[[AuditReport, PolicyResult], str]:
    def cell(_: AuditReport, r: PolicyResult) -> str:
        if r.time is None:
            return "n/a"
        if r.time.seconds is None:
            return "failed"
        return field(r.time)

    return cell


def format_seconds(s: float) -> str:
    """Seconds as a step time reads: 3 significant figures, ms below a second, never in exponent
    notation (a kernel of 24 ns is "< 0.001 ms", not "2.4e-05 ms").

    >>> format_seconds(1.2345), format_seconds(0.01234), format_seconds(0.0000123), format_seconds(2.39e-11)
    ('1.23 s', '12.3 ms', '0.0123 ms', '< 0.001 ms')
    """
    return f"{format_ms(s * 1e3)} ms" if s < 1 else (f"{s:.3g} s" if s < 1000 else f"{s:,.0f} s")


def format_ms(ms: float) -> str:
    """Milliseconds in a column of them: 3 significant figures, never an exponent.

    >>> format_ms(12345.6), format_ms(1.234), format_ms(0.00123), format_ms(2.39e-08), format_ms(0)
    ('12,346', '1.23', '0.00123', '< 0.001', '0')
    """
    if ms == 0:
        return "0"
    if ms < 0.001:
        return "< 0.001"
    return f"{ms:,.0f}" if ms >= 1000 else f"{ms:.3g}"


def format_rate(flops_per_second: float) -> str:
    """FLOP/s in the unit that keeps it readable (a small model's step is GFLOP/s, not "0 TFLOP/s").

    >>> format_rate(2.45e14), format_rate(3.1e9)
    ('245 TFLOP/s', '3.1 GFLOP/s')
    """
    return f"{format_flops(int(flops_per_second))}/s"


def format_utilisation(fraction: float) -> str:
    """A utilisation: one decimal, or two significant figures below 0.1% (never a bare 0.0%).

    >>> format_utilisation(0.4567), format_utilisation(0.0000123), format_utilisation(0.0)
    ('45.7%', '0.0012%', '0%')
    """
    percent = 100 * fraction
    return f"{percent:.1f}%" if percent >= 0.1 else ("0%" if percent == 0 else f"{percent:.2g}%")


def throughput_words(t: StepTime) -> str:
    """Tokens per second per GPU where the step's tokens are known, else examples (the batch's)."""
    if t.tokens_per_second_per_gpu is not None:
        return f"{_sig(t.tokens_per_second_per_gpu)} tokens/s"
    if t.examples_per_second_per_gpu is not None:
        return f"{_sig(t.examples_per_second_per_gpu)} examples/s"
    return "n/a"


def _sig(value: float) -> str:
    """Thousands separated at 1 and above, three significant figures below."""
    return f"{value:,.0f}" if value >= 1 else f"{value:.3g}"


def _optional(value: float | None, shown: Callable[[float], str]) -> str:
    return "n/a" if value is None else shown(value)


def _range(t: StepTime) -> str:
    if t.seconds_low is None or t.seconds_high is None:
        return "n/a"
    low, high = format_seconds(t.seconds_low), format_seconds(t.seconds_high)
    return low if low == high else f"{low}..{high}"


TIME_COLUMNS: dict[str, Column] = {
    c.header: c
    for c in (
        Column("s/step (estimate)", _time(lambda t: format_seconds(t.seconds or 0.0)), compiled=True),
        Column("range", _time(_range), compiled=True),
        Column("FLOP/s per GPU", _time(lambda t: _optional(t.tflops_per_gpu, lambda v: format_rate(v * 1e12))),
               compiled=True),
        Column("MFU", _time(lambda t: _optional(t.mfu, format_utilisation)), compiled=True),
        Column("HFU", _time(lambda t: _optional(t.hfu, format_utilisation)), compiled=True),
        Column("throughput per GPU", _time(throughput_words), compiled=True),
        Column("exposed comm", _time(lambda t: format_seconds(t.exposed_communication_seconds)), compiled=True),
    )
}


def timed(report: AuditReport) -> bool:
    return any(r.time is not None for r in report.results)


def _first_time(report: AuditReport) -> StepTime | None:
    return next((r.time for r in report.results if r.time is not None), None)


def time_columns(report: AuditReport, headers: tuple[str, ...] = TIME_HEADERS) -> list[Column]:
    """The time columns, each "per GPU" named by the report's own device ("per chip" on a TPU)."""
    t = _first_time(report)
    device = "GPU" if t is None else t.device
    return [dataclasses.replace(TIME_COLUMNS[h], header=h.replace("per GPU", f"per {device}")) for h in headers]


def time_section(report: AuditReport, headers: tuple[str, ...] = TIME_HEADERS) -> Section:
    """The step time per policy (an estimate) as a section: title, columns, what it means."""
    return Section(time_title(report), tuple(time_columns(report, headers)), tuple(time_notes(report)))


def time_title(report: AuditReport) -> str:
    t = _first_time(report)
    hardware = (t.hardware if t is not None and t.hardware else None) or (
        report.gpu.name if report.gpu is not None else "the GPU")
    devices = 1 if t is None else t.devices
    return f"Step time on {devices} x {hardware}: an estimate from {_estimator(report)} of the compiled step"


def _estimator(report: AuditReport) -> str:
    t = _first_time(report)
    return "XLA's cost models" if t is None else t.estimator


def time_notes(report: AuditReport) -> list[str]:
    """How the estimate was made, and each policy's failure."""
    t = _first_time(report)
    method, device = ("", "GPU") if t is None else (t.model, t.device)
    notes = [f"Estimate, not a measurement. Method: {method}. MFU: the model's FLOPs (3 x forward, recompute "
             f"left out) over the {device}s' dense BF16 peak; HFU: recompute included. 'exposed comm': what the "
             "collectives add beyond the compute, in XLA's schedule."]
    for r in report.results:
        if r.time is not None and r.time.error:
            notes.append(f"{r.policy}: no estimate: {r.time.error}")
        elif r.time is not None and r.time.seconds_low is not None and r.time.seconds_high is not None:
            notes.append(f"{r.policy}: {_range(r.time)} " + (
                         "where the chip ran steps so estimated" if r.time.device == "chip" else
                         f"over {r.time.estimator}") + "; "
                         f"{format_seconds(r.time.compute_seconds)} computing, "
                         f"{format_seconds(r.time.communication_seconds)} in collectives, "
                         f"{format_seconds(r.time.exposed_communication_seconds)} of it exposed"
                         + (f", {format_seconds(r.time.host_seconds)} copying offloaded residuals to host memory "
                            f"and back ({format_seconds(r.time.exposed_host_seconds)} of it exposed beside the "
                            f"kernels{_host_link(r.time)})" if r.time.host_seconds or r.totals.host_bytes else "")
                         + (f", {format_seconds(r.time.overhead_seconds)} the step's own cost beyond its "
                            f"{r.time.kernels:,} kernel runs" if r.time.overhead_seconds and not r.time.host_bound
                            else "")
                         + (f"; the host takes {format_seconds(r.time.dispatch_seconds)} to launch each step (per "
                            "step and per array passed), more than the chip's work: the step runs at the host's pace, "
                            "and a larger batch costs no time until the chip's work exceeds it"
                            if r.time.host_bound else ""))
            windows = [k for k in r.time.costliest if k.basis == WINDOW_TAPS]
            window_seconds = sum(k.total_seconds for k in windows)
            if windows and r.time.seconds and window_seconds >= 0.1 * r.time.seconds:
                notes.append(f"{r.policy}: {_share(window_seconds, r.time.seconds)} of the step is "
                             f"{', '.join(k.name for k in windows)}: a reduction libtpu lowered as a reduce-window "
                             "whose every output reads its whole window (n^2 work where that is a row: a softmax's "
                             "max over long rows), which libtpu could not price; it is timed at the window taps "
                             "per second a v5e ran such kernels")
            if r.time.unestimated:
                shown = ", ".join(r.time.unestimated[:5]) + (", ..." if len(r.time.unestimated) > 5 else "")
                compiler = "libtpu" if r.time.device == "chip" else "XLA"
                notes.append(f"{r.policy}: not to be trusted: {compiler} gave no estimate for "
                             f"{len(r.time.unestimated)} kernel(s) ({shown}); they are timed at their roofline "
                             "floor, and the chip may run them many times slower")
            elif r.time.floor_kernels:
                notes.append(f"{r.policy}: {format_seconds(r.time.floor_seconds)} of the computing "
                             f"({_share(r.time.floor_seconds, r.time.compute_seconds)}, {r.time.floor_kernels} kernel "
                             "runs) is kernels no cost model times (custom calls XLA does not cost, such as TE's "
                             "GEMMs and cuDNN's attention, or a GPU missing from XLA's tables), at their roofline "
                             "floor, which no real kernel reaches: there the estimate can only be fast")
        if r.time is not None and r.time.calibration is not None:
            notes.append(f"{r.policy}: {calibration_words(r.time.calibration)}")
    return notes


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "all"


def calibration_words(c: Calibration) -> str:
    """What `--calibrate`'s profile did to an estimate, in one sentence."""
    ratios = ", ".join(f"{kind.value} x{ratio:.3g}" for kind, ratio in c.ratios) or "none (it names no kernel here)"
    return (f"calibrated by {c.profile} ({c.instructions} instructions): {c.measured} kernels measured, "
            f"{c.missing} missing from the profile and scaled by their kind's measured/estimated ratio "
            f"({ratios}); {format_seconds(c.estimated_seconds)} uncalibrated")


def kernels_shown(report: AuditReport) -> tuple[PolicyResult | None, tuple[str, ...]]:
    """The one policy whose costliest kernels a report shows (the fastest estimate: policies
    share most kernels, and seven near-identical tables hid the rest), and the other policies
    with kernels, which the JSON document and the HTML page's folds hold."""
    timed_rows = [r for r in report.results if r.time is not None and r.time.costliest and r.time.seconds]
    if not timed_rows:
        return None, ()
    fastest = min(timed_rows, key=lambda r: r.time.seconds or 0.0)  # type: ignore[union-attr]
    return fastest, tuple(r.policy for r in timed_rows if r is not fastest)


def kernels_title(result: PolicyResult, others: tuple[str, ...]) -> str:
    also = "; the other policies' kernels: --format json or html" if others else ""
    device = "GPU" if result.time is None else result.time.device
    return f"Costliest kernels under {result.policy}, the fastest (of one step, per {device}){also}"


def costliest_rows(t: StepTime) -> list[list[str]]:
    """The ten costliest kernels of a step, as rows under KERNEL_HEADERS."""
    return [[k.name, k.kind.value, format_ms(k.total_seconds * 1e3), str(k.runs), k.basis, k.source or "-"]
            for k in t.costliest]


# --- hotspots: residual bytes grouped by module path or source line -----------------------------


def _kept(report: AuditReport) -> Iterator[tuple[int, Residual]]:
    for i, result in enumerate(report.results):
        for r in result.residuals:
            if r.kind in (ResidualKind.ACTIVATION, ResidualKind.HOST):
                yield i, r


def hotspot_key(report: AuditReport, by: HotspotKey | None = None) -> HotspotKey:
    """`by`, or by default the module path where the residuals carry one, else the source line."""
    if by is not None:
        return by
    return HotspotKey.MODULE if any(r.module for _, r in _kept(report)) else HotspotKey.LINE


def hotspots(report: AuditReport, top: int, by: HotspotKey | None = None) -> list[Hotspot]:
    """The `top` module paths (or source lines) whose activation and host residuals are largest
    under any policy."""
    by = hotspot_key(report, by)
    kept: dict[str, list[int]] = {}
    producers: dict[str, dict[str, None]] = {}  # ordered set
    for i, r in _kept(report):
        line = f"{r.source.file}:{r.source.line}" if r.source else "(no source)"
        # by module: a residual made outside any module (the model's own code) keeps its line
        key = (r.module or line) if by is HotspotKey.MODULE else line
        kept.setdefault(key, [0] * len(report.results))[i] += r.bytes
        producers.setdefault(key, {})[r.name or r.primitive or "?"] = None
    ranked = sorted(kept, key=lambda k: (-max(kept[k]), k))
    return [Hotspot(k, tuple(producers[k]), tuple(kept[k])) for k in ranked[:top]]


HOTSPOT_TITLES = {HotspotKey.MODULE: "module path (else line)", HotspotKey.LINE: "source line"}


# --- per-equation marks -------------------------------------------------------------------------

OUTCOME_WORDS: dict[Outcome, str] = {
    Outcome.SAVED: "saved",
    Outcome.RECOMPUTED: "recomputed",
    Outcome.OFFLOADED: "offloaded",
    Outcome.NOT_NEEDED: "not needed",
}
MARK_SYMBOLS: dict[Outcome, str] = {
    Outcome.SAVED: "S",
    Outcome.RECOMPUTED: "R",
    Outcome.OFFLOADED: "O",
    Outcome.NOT_NEEDED: "-",
}


def marks_by_equation(report: AuditReport) -> list[tuple[Equation, tuple[Outcome, ...]]]:
    """Every equation with its outcome under each policy; those whose outcomes differ come first."""
    outcomes = [{m.equation: m.outcome for m in r.marks} for r in report.results]
    rows = [(e, tuple(o[e.id] for o in outcomes)) for e in report.equations]
    return sorted(rows, key=lambda row: len(set(row[1])) == 1)  # stable: id order within each group


EMULATED_NOTE = (
    "Traced on an emulated GPU ({device}): what Transformer Engine selects by compute capability "
    "(FP8 recipes, attention backends) and its workspace sizes depend on it; residual bytes only "
    "through those selections."
)

def standin_note(report: AuditReport) -> str:
    """The stand-in's note; it names the quantizations too where the stand-in quantizes."""
    quantizing = any(e.standin and e.is_te_quantize for e in report.equations)
    return STANDIN_NOTE + (QUANTIZE_STANDIN_NOTE if quantizing else "")


QUANTIZE_STANDIN_NOTE = " So are its FP8 quantizations (TE's quantize primitive's name, current scaling)."

STANDIN_NOTE = (
    "TE GEMMs here are a CPU stand-in (transformer_engine.jax does not import): primitives with "
    "TE's names, bound as TE binds them."
)


COMPILED_NOTE = (
    "XLA's memory_analysis() of the compiled forward+backward step for this backend; XLA fuses and "
    "schedules on its own, so its temp bytes differ from the residual estimate."
)
