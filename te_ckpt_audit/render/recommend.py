"""Renderers of a `Recommendation`: pure functions of the record.

`render_recommend_json` is `Recommendation.to_dict()` plus, for the winner (or the closest
candidate), the Python that builds it and its MaxText remat settings; `render_recommend_text` is
the terminal report: the winner, its snippet, its MaxText settings, the frontier and its plot.

    >>> print(python_snippet(Candidate("save_only_these_names:a", CandidateKind.NAMES, None, ("a",), (),
    ...     0, 0, 0, 0, True)).splitlines()[1])
    policy = jax.checkpoint_policies.save_only_these_names("a")
"""

from __future__ import annotations

import json

from ..records import (
    Candidate,
    CandidateKind,
    MaxTextPoint,
    MaxTextRecommendation,
    Point,
    Recommendation,
    SynthesisName,
    Throughput,
)
from ._common import (
    counted,
    format_bytes,
    format_flops,
    format_seconds,
    fraction_words,
    peak_range,
    warning_message,
    winner_policy,
)
from ._text import printable_records
from .plot import render_frontier_plot

# The per-tensor keys of MaxText's `remat_policy: 'custom'` (src/MaxText/configs/base.yml), each
# 'device' (saved), 'offload' (host memory) or 'remat' (recomputed). decoder_layer_input is the scan
# carry MaxText always keeps on the device.
MAXTEXT_KEYS = (
    "decoder_layer_input", "context", "mlpwi", "mlpwi_0", "mlpwi_1", "mlpwo", "query_proj",
    "key_proj", "value_proj", "qkv_proj", "out_proj", "mla_q", "mla_kv",
)


def _quoted(names: tuple[str, ...]) -> str:
    return ", ".join(json.dumps(n) for n in names)


def _preset_expr(c: Candidate, name: str) -> str:
    if name == c.te_policy:
        return name
    if name == "offload_dot_with_no_batch_dims":
        return 'jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")'
    return f"jax.checkpoint_policies.{name}"


def python_snippet(c: Candidate) -> str:
    """Python that builds the candidate's policy, ending in its use with `jax.checkpoint`."""
    lines = ["import jax"]
    if c.te_policy is not None:
        lines.append(f"from te_ckpt_audit.policies import {c.te_policy}")
    if c.kind is CandidateKind.PRESET:
        lines.append(f"policy = {_preset_expr(c, c.policy)}")
    elif c.kind is CandidateKind.OFFLOAD:
        lines += [
            "policy = jax.checkpoint_policies.save_and_offload_only_these_names(",
            f"    names_which_can_be_saved=[{_quoted(c.saved)}],",
            f"    names_which_can_be_offloaded=[{_quoted(c.offloaded)}],",
            '    offload_src="device",',
            '    offload_dst="pinned_host",',
            ")",
        ]
    elif c.base is None:
        lines.append(f"policy = jax.checkpoint_policies.save_only_these_names({_quoted(c.saved)})")
    else:
        lines += [
            "policy = jax.checkpoint_policies.save_from_both_policies(",
            f"    jax.checkpoint_policies.save_only_these_names({_quoted(c.saved)}),",
            f"    {_preset_expr(c, c.base)},",
            ")",
        ]
    lines.append("layer = jax.checkpoint(layer, policy=policy)")
    return "\n".join(lines)


# MaxText's `minimal` family (layers/decoders.py, `minimal_policy`): these names, plus `context` and
# `quantization` (the name MaxText's TE layers give their quantizers) in the `_with_...` variants.
MAXTEXT_MINIMAL = ("query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj", "out_proj", "mlpwi_0", "mlpwi_1",
                   "mlpwi", "mlpwo")
QUANTIZATION = "quantization"


def _minimal_with_quantization(c: Candidate) -> str | None:
    """The MaxText policy of the `minimal` family that saves the candidate's names, quantization
    included: the custom policy has no key for TE's quantizers, these do."""
    saved = set(c.saved)
    if c.kind is not CandidateKind.NAMES or QUANTIZATION not in saved or c.offloaded:
        return None
    if not saved <= {*MAXTEXT_MINIMAL, "context", QUANTIZATION}:
        return None
    return "minimal_with_context_and_quantization" if "context" in saved else "minimal_with_quantization"


def maxtext_config(c: Candidate, names: tuple[str, ...]) -> str:
    """The candidate as MaxText's `remat_policy: 'custom'` settings (YAML lines). Names that are not
    MaxText keys, and what a preset saves beyond names, are comments: MaxText cannot take them. A
    candidate that saves TE's quantizers (`quantization`) with MaxText's projections is its
    `minimal_with_quantization` policy (or `minimal_with_context_and_quantization`)."""
    if c.maxtext_policy is not None:
        return f"remat_policy: '{c.maxtext_policy}'"
    minimal = _minimal_with_quantization(c)
    if minimal is not None:
        extra = sorted(set(MAXTEXT_MINIMAL) & set(names) - set(c.saved))
        lines = [f"remat_policy: '{minimal}'",
                 "# saves the projections MaxText names, context where asked, and the quantizers' 'quantization'"]
        if extra:
            lines.append(f"# it also saves {', '.join(extra)}, which this candidate recomputes")
        return "\n".join(lines)
    setting = {n: "remat" for n in names}
    setting.update({n: "device" for n in c.saved})
    setting.update({n: "offload" for n in c.offloaded})
    lines = ["remat_policy: 'custom'"]
    if "decoder_layer_input" not in setting:
        lines.append("decoder_layer_input: 'device'")
    lines += [f"{k}: '{setting[k]}'" for k in MAXTEXT_KEYS if k in setting]
    others = [f"{n}: '{setting[n]}'" for n in names if n not in MAXTEXT_KEYS]
    if others:
        lines.append("# names of this model that are not MaxText keys:")
        lines += [f"#   {o}" for o in others]
    preset = c.policy if c.kind is CandidateKind.PRESET else c.base
    if preset is not None:
        lines.append(f"# {preset} saves more than names: MaxText's custom policy has no key for it")
    return "\n".join(lines)


def maxtext_block(c: Candidate, names: tuple[str, ...]) -> str | None:
    """The candidate as MaxText's remat settings where the model is MaxText's (every one of its
    names is a MaxText key, or the candidate is one of MaxText's policies), else None: a plain Flax
    or JAX model gets no MaxText block, also where a few of its names happen to be MaxText's
    (`context`, `out_proj` beside `ffn1`). A preset MaxText has no setting for is said plainly,
    never written as a custom policy that recomputes every key."""
    maxtext_named = bool(names) and set(names) <= set(MAXTEXT_KEYS)
    if c.maxtext_policy is None and not maxtext_named and _minimal_with_quantization(c) is None:
        return None
    if c.kind is CandidateKind.PRESET and c.maxtext_policy is None:
        return (f"# MaxText has no remat_policy for {c.policy}: its custom policy saves, offloads or recomputes\n"
                "# the tensors MaxText names, and nothing else (remat_policy: 'custom' with those keys 'device'\n"
                "# is the nearest; it recomputes what no key names)")
    return maxtext_config(c, names)


def render_recommend_json(rec: Recommendation) -> str:
    """Strict JSON (no NaN), keys in a fixed order: the same record always gives the same text."""
    doc = rec.to_dict()
    shown = rec.recommended or rec.closest
    key = "recommended" if rec.recommended is not None else "closest"
    if shown is not None:
        doc[key] = {**shown.to_dict(), "python": python_snippet(shown),
                    "maxtext": maxtext_block(shown, rec.names)}
    winner, t = throughput_winner(rec), rec.throughput
    if t is not None and t.best is not None and doc.get("throughput") is not None:
        doc["throughput"]["pick"] = {  # what to paste: the command line's, Python's, MaxText's
            "cli": pick_cli(t),
            "python": None if winner is None else python_snippet(winner),
            "maxtext": None if winner is None else maxtext_block(winner, rec.names),
            "add": [{"at": n.line, "code": n.code()} for n in tool_names_picked(t)],
        }
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def render_recommend_text(rec: Recommendation, width: int | None = None) -> str:
    """The terminal report, plain text within `width` columns, or (None) as wide as its lines need
    (the plot is 80 wide at most)."""
    rec = printable_records(rec)
    if width is None:
        width = 100_000  # no line of the frontier is split
    out = [f"recommend {rec.target or 'function'}: budget {format_bytes(rec.budget_bytes)}"
           + (" per device" if rec.mesh is not None else ""),
           f"{counted(len(rec.evaluated), 'policy')} analysed (at most {rec.max_evals}), "
           "each by JAX's own linearization"]
    if rec.skipped_names:
        out.append(f"names a spec cannot spell, left out: {', '.join(rec.skipped_names)}")
    line = compiled_for_words(rec)
    if line is not None:
        out.append(line)
    # what the audit says of the trace itself (its inputs on the mesh), as the audit prints it
    out += [f"! [{w.code.value}] {warning_message(w)}" for w in rec.report.findings]
    shown = answered(rec)
    if shown is not None and rec.recommended is None:
        out.append(f"nothing fits the {rec.device_name or 'budget'}; the closest candidate:")
    if shown is not None:
        out += [
            "",
            f"{'recommended' if rec.recommended is not None else 'closest'}: --policy {shown.policy}",
            f"  activation bytes {format_bytes(shown.activation_bytes)} ({shown.activation_bytes} B)"
            + (f", host {format_bytes(shown.host_bytes)}" if shown.host_bytes else ""),
            f"  recompute {format_flops(shown.recompute_flops)} ({shown.recompute_percent:.1f}% of the forward pass)",
            *([f"  peak per device {_peak(shown)}"] if shown.peak is not None else []),
            *([f"  step time {_time(shown)}"] if shown.time is not None else []),
            "",
            "python:",
            _indent(python_snippet(shown)),
        ]
        block = maxtext_block(shown, rec.names)
        if block is not None:
            out += ["", "MaxText (base.yml remat settings):", _indent(block)]
    if rec.to_name:
        out += ["", "The model names no tensors (checkpoint_name), so only the presets were compared. Name its",
                "largest activations where they are made, and recommend can save, recompute or offload each",
                "(or add --name-lines: the tool names each matmul line itself and searches those, unedited):"]
        for n in rec.to_name:
            at = f" ({n.line})" if n.line and n.line != n.where else ""
            out.append(f"  {format_bytes(n.bytes):>10}  {n.where}{at}: {n.code()}")
        out.append("  (from jax.ad_checkpoint import checkpoint_name)")
    out += ["", "Pareto frontier (activation bytes vs recompute FLOPs, every point analysed):"]
    for c in rec.frontier:
        mark = "*" if c.policy == winner_policy(rec) else " "
        host = f"  host {format_bytes(c.host_bytes)}" if c.host_bytes else ""
        fit = "" if c.fits else "  over budget"
        if rec.device_name is not None:
            fit = f"  peak {_peak(c)}" if c.peak is not None else "" if rec.throughput else "  (not compiled)"
            fit += f", {_time(c)}" if c.time is not None else ""
        figures = f" {mark} {format_bytes(c.activation_bytes):>10}  {format_flops(c.recompute_flops):>12}" \
                  f"  {c.recompute_percent:5.1f}%"
        line = f"{figures}  {c.policy}{host}{fit}"
        # a long spec goes on its own line: the figures stay in their columns within `width`
        out += [line] if len(line) <= width else [figures + host + fit, f"{'':6}{c.policy}"]
    out += ["", render_frontier_plot(rec, width=min(width, 80))]
    if rec.maximized is not None:
        m = rec.maximized
        tried = ", ".join(f"{t.value} {'fits' if t.fits else 'no'}" for t in m.trials)
        best = "no value tried fits" if m.value is None else f"the largest that fits: {m.define}={m.value}"
        more = "; stopped by --max-compiles, larger values may fit" if m.bounded else ""
        out += ["", f"--maximize {m.define} under {m.policy}: {best} (tried {tried}){more}"]
    if rec.throughput is not None:
        t = rec.throughput
        out += ["", *throughput_lines(t, None if t.best is None else pick_cli(t), "policy")]
        winner = throughput_winner(rec)
        added = tool_names_picked(t)
        if added:
            out += ["the pick saves names the tool gave (--name-lines); to give your model them, add "
                    "(from jax.ad_checkpoint import checkpoint_name):"]
            out += [f"    at {n.line}: {n.code()}" for n in added]
        if winner is not None:
            out += ["python:", _indent(python_snippet(winner))]
            block = maxtext_block(winner, rec.names) if t.synthesis is not None else None
            if block is not None:
                out += ["MaxText (remat settings):", _indent(block)]
    return "\n".join(out) + "\n"


def tool_names_picked(t: Throughput) -> list[SynthesisName]:
    """The names of the tool's own (`--name-lines`) that the pick saves: the calls to paste."""
    if t.best is None or t.synthesis is None:
        return []
    head, _, saved = t.best.policy.partition("+")[0].partition(":")
    picked = set(saved.split(",")) if head == "save_only_these_names" else set()
    return [n for n in t.synthesis.names if n.line is not None and n.name in picked]


def pick_cli(t: Throughput) -> str:
    """The pick as the command line takes it; with names of the tool's own, --name-lines gives them."""
    assert t.best is not None
    lines = " --name-lines" if tool_names_picked(t) else ""
    return f"--policy {t.best.policy} -D {t.keyword}={t.best.value}{lines}"


def throughput_winner(rec: Recommendation) -> Candidate | None:
    """The candidate of `--maximize throughput`'s pick (for its code), from the frontier or, for a
    synthesized policy, the candidates evaluated."""
    t = rec.throughput
    if t is None or t.best is None:
        return None
    return next((c for c in (*rec.frontier, *rec.evaluated) if c.policy == t.best.policy), None)


def synthesis_lines(t: Throughput) -> list[str]:
    """`--synthesize`: the names decided on, each proposal against its compile, and the pick against
    the best preset compiled beside it."""
    s = t.synthesis
    if s is None:
        return []
    out = ["", f"Synthesized from {counted(len(s.names), 'checkpoint name')} ({s.solver}):",
           f"  {'name':24} {'bytes/device':>12}  {'recompute saved':>15}"]
    out += [f"  {n.name:24} {format_bytes(n.bytes):>12}  {format_flops(n.recompute_flops):>15}" for n in s.names]
    out += ["", "  proposals (the model's prediction, then the target's verdict on the compiled step):"]
    for p in s.proposals:
        verdict = "fits" if p.fits else "refused"
        out.append(f"  {t.keyword}={p.value}: {p.policy}: predicted {format_seconds(p.predicted_seconds)}, "
                   f"+{format_bytes(p.predicted_extra_bytes)} over saving nothing; {verdict}")
    presets = [p for p in t.points if p.fits and p.throughput and p.policy in s.presets]
    best = t.best
    if best is not None and presets:
        if best.policy in s.presets:
            out.append(f"  no set of names beats the presets here: the fastest is the preset {best.policy} "
                       f"at {t.keyword}={best.value} (estimates)")
        else:
            b = max(presets, key=lambda p: p.throughput or 0.0)
            gain = 100 * ((best.throughput or 0.0) / (b.throughput or 1.0) - 1)
            out.append(f"  synthesized {best.policy} at {t.keyword}={best.value}: {gain:+.1f}% against the best "
                       f"preset compiled, {b.policy} at {t.keyword}={b.value} (estimates)")
    return out


def answered(rec: Recommendation) -> Candidate | None:
    """The policy the report answers with for the least-recompute question (the winner, else the
    closest); None under --maximize throughput, whose one answer is the fastest point."""
    return None if rec.throughput is not None else (rec.recommended or rec.closest)


def compiled_for_words(rec: Recommendation) -> str | None:
    """What the points were compiled for, its memory and what "fits" means there; None: nothing compiled."""
    how = ("each point below compiled" if rec.throughput is not None else
           f"{counted(rec.compiles, 'policy')} compiled")
    order = "" if rec.throughput is not None else ", in order of recompute"
    if rec.gpu is not None:
        return (f"GPU: {rec.gpu.name}, {format_bytes(rec.gpu.usable_bytes)} usable of "
                f"{format_bytes(rec.gpu.memory_bytes)} at {fraction_words(rec.gpu)}; {how} (XLA:GPU, no autotuning)"
                f"{order}; fits: the compiled peak per device")
    if rec.tpu is not None:
        return (f"TPU: {rec.tpu.topology} ({rec.tpu.chips} x {rec.tpu.name}), {format_bytes(rec.tpu.usable_bytes)} "
                f"usable of {format_bytes(rec.tpu.hbm_bytes)} per chip; {how} (libtpu {rec.tpu.libtpu}){order}; "
                "fits: libtpu's verdict, the chip's own HBM check (peak: its plan per chip, or what a refused "
                "step requires)")
    return None


def no_best_words(t: Throughput, gpu: str | None = None) -> str:
    """Why a throughput search has no pick, as it failed: a step that fits but could not be timed
    is a failure of the time estimate, not of memory (an A100 without XLA's cost tables)."""
    gpu = gpu or t.device
    untimed = [p for p in t.points if p.fits and p.seconds is None]
    if untimed:
        why = f": {untimed[0].error}" if untimed[0].error else ""
        return f"the steps fit the {gpu} but their time could not be estimated{why}"
    if not t.points:
        return f"no point was compiled: the limit of {t.max_compiles} compile(s) ended the search first (raise it)"
    if all(p.peak_bytes is None for p in t.points):
        why = f": {t.points[0].error}" if t.points[0].error else ""
        return f"no point compiled{why}"
    more = "a smaller batch or more chips" if t.device == "chip" else \
        "a smaller batch, more GPUs or a larger memory fraction"
    return f"no point compiled fits the {gpu}: {more}"


def rate_unit(t: Throughput) -> str:
    """What a point's throughput counts, per second per device: "tokens/s/GPU", "batch/s/chip"."""
    return f"{t.unit}/s/{t.device}"


def _rate(p: Point) -> str:
    return "n/a" if p.throughput is None else f"{p.throughput:,.4g}" if p.throughput < 1000 else f"{p.throughput:,.0f}"


def throughput_lines(t: Throughput, paste: str | None, policy_word: str) -> list[str]:
    """`--maximize throughput` for a terminal: the winner and what to paste, the frontier of
    throughput against peak, and every point compiled (each an estimate, none interpolated)."""
    unit = rate_unit(t)
    out = [f"Fastest that fits (--maximize throughput; step times are estimates from {t.estimator}, "
           f"{counted(len(t.points), 'point')} compiled of at most {t.max_compiles}):"]
    if t.best is None:
        out.append(f"  {no_best_words(t)}")
    else:
        b = t.best
        out += [f"  {paste}",
                f"  {_rate(b)} {unit}, {format_seconds(b.seconds or 0.0)} per step, peak "
                f"{format_bytes(b.peak_bytes or 0)} per device"]
    if t.bounded:
        out.append("  stopped by --max-compiles: points the search wanted were not compiled (raise it)")
    if t.saturated:
        out.append(f"  stopped climbing before the memory edge (doubling the {t.keyword} gained under 2%): "
                   f"{', '.join(t.saturated)}")
    key = max(8, len(t.keyword))
    head = f"  {'peak/device':>12}  {unit:>15}  {'s/step':>10}  {t.keyword:>{key}}  {policy_word}"
    out += synthesis_lines(t)
    presets = () if t.synthesis is None else t.synthesis.presets
    out += ["", f"Throughput frontier (fitting points no other beats on both peak and {unit}"
            + ("; (preset) marks a preset" if presets else "") + "):", head]
    for p in t.frontier:
        mark = "*" if p == t.best else " "
        tag = "  (preset)" if p.policy in presets else ""
        out.append(f"{mark} {format_bytes(p.peak_bytes or 0):>12}  {_rate(p):>15}  "
                   f"{format_seconds(p.seconds or 0.0):>10}  {p.value:>{key}}  {p.policy}{tag}")
    out += ["", f"Every point compiled, in order (searched: {', '.join(t.policies)}):",
            head.replace(f"  {policy_word}", f"  fits  {policy_word}")]
    for p in t.points:
        peak = "n/a" if p.peak_bytes is None else format_bytes(p.peak_bytes)
        seconds = "n/a" if p.seconds is None else format_seconds(p.seconds)
        fits = "yes" if p.fits else "no"
        out.append(f"  {peak:>12}  {_rate(p):>15}  {seconds:>10}  {p.value:>{key}}  {fits:>4}  {p.policy}")
        if p.error:
            out.append(f"      {p.error}")
    return out


def _time(c: Candidate) -> str:
    """A compiled candidate's step time, labelled as the estimate it is."""
    t = c.time
    if t is None or t.seconds is None:
        return f"no estimate: {t.error}" if t is not None and t.error else "n/a"
    mfu = "" if t.mfu is None else f", MFU {100 * t.mfu:.1f}%"
    return f"{format_seconds(t.seconds)} per step (estimate, {t.estimator}{mfu})"


def _peak(c: Candidate) -> str:
    p = c.peak
    if p is None or p.bytes_per_device is None:
        return f"not compiled: {p.error}" if p is not None and p.error else "n/a"
    return f"{peak_range(p)} ({'fits' if p.fits else 'does not fit'})"


def _maxtext_label(p: MaxTextPoint) -> str:
    """A point's remat_policy; a custom one with the tensor keys it keeps on the device (their
    count where the list would not fit the column)."""
    if not p.custom:
        return p.remat_policy
    kept = [key for key, _, value in (c.partition("=") for c in p.custom) if value == "device"]
    label = f"{p.remat_policy}: {','.join(kept) or 'every key remat'}"
    return label if len(label) <= 40 else f"{p.remat_policy}: {len(kept)} of {len(p.custom)} keys on device"


def render_maxtext_recommend_text(rec: MaxTextRecommendation) -> str:
    """`maxtext --recommend` for a terminal: every point compiled, then the config lines to paste."""
    lines = [f"{rec.target}: MaxText's train step compiled for {rec.device_name or 'the GPU'}, per device"]
    if rec.gpu is not None:
        lines.append(f"usable at {fraction_words(rec.gpu)}: {format_bytes(rec.gpu.usable_bytes)} of "
                     f"{format_bytes(rec.gpu.memory_bytes)}")
    if rec.tpu is not None:
        lines.append(f"{rec.tpu.chips} x {rec.tpu.name}: {format_bytes(rec.tpu.usable_bytes)} usable of "
                     f"{format_bytes(rec.tpu.hbm_bytes)} per chip; fits: libtpu's verdict (libtpu {rec.tpu.libtpu}), "
                     "its HBM check on temporaries; peak: the plan per chip, or what a refused step requires")
    lines.append("")
    lines.append(f"{'remat_policy':<40} {'batch':>6} {'peak per device':>22} {'fits':>5} {'least':>6}")
    for p in rec.tried:
        least = "n/a" if p.peak.least_fraction is None else f"{p.peak.least_fraction:.2f}"
        fits = "yes" if p.fits else ("n/a" if p.peak.error else "no")
        where = f"  {','.join(p.layout)}" if p.layout else ""
        lines.append(f"{_maxtext_label(p):<40} {p.per_device_batch_size:>6} {peak_range(p.peak):>22} {fits:>5} "
                     f"{least:>6}{where}")
        if p.peak.error:
            lines.append(f"  not compiled: {p.peak.error}")
    lines.append("")
    if rec.throughput is not None:
        lines += [*throughput_lines(rec.throughput, rec.settings(), "remat_policy"), ""]
    if rec.chosen is None:
        lines.append("No point tried fits: a smaller per-device batch (--batch), or a larger slice "
                     "(compile_topology)." if rec.tpu is not None else
                     "No point tried fits: a smaller per-device batch (--batch), more GPUs "
                     "(compile_topology_num_slices) or a larger memory fraction.")
    else:
        lines.append("Paste into the MaxText config (or pass as key=value):")
        lines += [f"  {line}" for line in rec.config_lines().splitlines()]
    return "\n".join(lines) + "\n"


def render_maxtext_recommend_json(rec: MaxTextRecommendation) -> str:
    return json.dumps(rec.to_dict(), indent=2) + "\n"
