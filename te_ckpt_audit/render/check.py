"""Renderers for CI gate results (`te-ckpt-audit check`, and `--budget`/`--baseline` on an audit):
pure functions of (report, CheckResult) pairs, like the report renderers beside them."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import assert_never

from ..records import (
    AuditReport,
    Change,
    CheckResult,
    Figure,
    PolicyResult,
    ResidualKind,
    Run,
    SourceLocation,
    Violation,
    check_document,
)
from ._common import format_bytes, format_percent, warning_message
from ._text import printable_records
from .markdown import md_table, md_text, render_markdown


def violation_message(v: Violation) -> str:
    """The words for a broken limit, naming target, policy, figure and limit."""
    v = printable_records(v)
    where = f"{v.target} [{v.policy}]"
    match v.figure:
        case Figure.ACTIVATION_BYTES:
            figure = "activation bytes per device" if v.per_device else "activation bytes"
            return _over(where, figure, v, "exceed the budget")
        case Figure.RECOMPUTE_PERCENT:
            return f"{where}: recompute {v.value:.1f}% of forward FLOPs exceeds --max-recompute {v.limit:g}%"
        case Figure.GROWTH:
            grew = "from 0 B (unbounded growth)" if math.isinf(v.value) else f"{v.value:+.2f}% over the baseline"
            return (
                f"{where}: activation bytes grew {grew} ({format_bytes(v.baseline_bytes or 0)} -> "
                f"{format_bytes(v.bytes or 0)}), beyond the tolerance {v.limit:g}%"
            )
        case Figure.NOT_IN_BASELINE:
            return f"{where}: not in the baseline, and --require-baseline is given"
        case Figure.PEAK_BYTES:
            return _over(where, "peak per device", v, "exceeds the peak budget")
        case Figure.DOES_NOT_FIT:
            # on a GPU, the peak against the usable memory; on a TPU, libtpu's required bytes against its HBM
            return _over(where, "the step needs", v, "and does not fit the device's usable")
        case Figure.NOT_COMPILED:
            return f"{where}: the step did not compile for the device, so whether it fits is not known"
        case Figure.CHANGES_UNDER_REMAT3:
            other = "other values: " if v.value == v.limit else ""
            return (f"{where}: under jax_remat3 the policy saves {other}{format_bytes(int(v.value))} of activations, "
                    f"{format_bytes(int(v.limit))} now: it changes meaning when JAX turns its new remat on")
        case Figure.FAILS_UNDER_REMAT3:
            return (f"{where}: under jax_remat3 JAX cannot differentiate the function with this policy "
                    f"({v.detail}): it fails when JAX turns its new remat on")
        case _:
            assert_never(v.figure)


def _over(where: str, figure: str, v: Violation, verb: str) -> str:
    value, limit = int(v.value), int(v.limit)
    return f"{where}: {figure} {format_bytes(value)} ({value} B) {verb} {format_bytes(limit)} ({limit} B)"


def _change_text(change: Change | None) -> str:
    if change is None:
        return ""
    if change.baseline_bytes is None:
        return "not in baseline"
    if change.unbounded:
        return "+inf (from 0 B)"
    pct = change.percent
    return "=" if pct == 0 else f"{pct:+.2f}%"


def summary_rows(runs: Sequence[Run]) -> list[list[str]]:
    """One row per target and policy: target, policy, activation, recompute %, vs baseline, status."""
    rows = []
    for report, result in runs:
        failed = {v.policy for v in result.violations}
        changes = {c.policy: c for c in result.changes}
        for r in report.results:
            rows.append(
                [
                    report.target,
                    r.policy,
                    _gated(r),
                    format_percent(r.recompute_percent),
                    _change_text(changes.get(r.policy)),
                    "FAIL" if r.policy in failed else "ok",
                ]
            )
    return rows



def _gated(r: PolicyResult) -> str:
    """The activation bytes the gate holds: "84 KiB/device" on a mesh."""
    return format_bytes(r.totals.gated_bytes) + ("" if r.totals.activation_bytes_per_device is None else "/device")


SUMMARY_HEADERS = ["target", "policy", "activation", "recompute", "vs baseline", "status"]
SUMMARY_NUMERIC = [False, False, True, True, True, False]


def render_check_markdown(runs: Sequence[Run]) -> str:
    """A summary for `$GITHUB_STEP_SUMMARY`: the verdict, one table, the violations."""
    runs = printable_records(tuple(runs))
    failed = [v for _, result in runs for v in result.violations]
    lines = [
        "## te-ckpt-audit check",
        "",
        f"**{'FAILED' if failed else 'passed'}**: {len(runs)} target(s), {len(failed)} violation(s).",
        "",
        *md_table(SUMMARY_HEADERS, summary_rows(runs), SUMMARY_NUMERIC),
    ]
    if failed:
        lines += ["", "### Violations", ""] + [f"- {md_text(violation_message(v))}" for v in failed]
    return "\n".join(lines) + "\n"


def render_audit_check_markdown(report: AuditReport, result: CheckResult) -> str:
    """An audit's Markdown report followed by its gate verdict."""
    return render_markdown(report) + "\n" + render_check_markdown([(report, result)])


def _largest_source(report: AuditReport, policy: str) -> SourceLocation | None:
    """Where the policy's largest activation (or offloaded) residual is made."""
    residuals = [
        r
        for r in report.result(policy).residuals
        if r.source is not None and r.kind in (ResidualKind.ACTIVATION, ResidualKind.HOST)
    ]
    return max(residuals, key=lambda r: r.bytes).source if residuals else None


def _escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def github_annotation(report: AuditReport, v: Violation) -> str:
    """`::error file=...,line=...::message`, at the model line of the largest residual."""
    where = _largest_source(report, v.policy)
    props = [f"title={_escape(f'te-ckpt-audit: {v.policy}', prop=True)}"]
    if where is not None:
        props = [f"file={_escape(where.file, True)}", f"line={where.line}", *props]
    return f"::error {','.join(props)}::{_escape(violation_message(v))}"


def render_check_github(runs: Sequence[Run]) -> str:
    """GitHub Actions workflow commands: an error per violation, a warning per audit warning, a
    notice per target and policy with its figures."""
    runs = printable_records(tuple(runs))
    lines = [github_annotation(report, v) for report, result in runs for v in result.violations]
    lines += [
        f"::notice title={_escape('te-ckpt-audit: ' + report.target, True)}::"
        + _escape(
            f"{r.policy}: activation {_gated(r)}, "
            f"recompute {format_percent(r.recompute_percent)} of forward FLOPs"
        )
        for report, _ in runs
        for r in report.results
    ]
    lines += [
        f"::warning title={_escape('te-ckpt-audit: ' + (w.policy or ''), True)}::{_escape(warning_message(w))}"
        for report, _ in runs
        for w in report.warnings
    ]
    failed = sum(len(result.violations) for _, result in runs)
    lines.append(f"te-ckpt-audit check: {len(runs)} target(s), {failed} violation(s)")
    return "\n".join(lines) + "\n"


def render_check_json(runs: Sequence[Run]) -> str:
    """The check's JSON document, each violation with its words beside its fields."""
    doc = check_document(runs)
    for (_, result), target in zip(runs, doc["targets"], strict=True):
        for v, v_doc in zip(result.violations, target["violations"], strict=True):
            v_doc["message"] = violation_message(v)
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"
