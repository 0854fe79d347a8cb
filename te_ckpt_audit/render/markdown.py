"""Markdown: the comparison, the largest residuals and the warnings as GitHub tables."""

from __future__ import annotations

import re

from ..records import AuditReport, HotspotKey, TeKind
from ._common import (
    COLUMNS,
    COMPILED_NOTE,
    EMULATED_NOTE,
    GPU_HEADERS,
    HOTSPOT_TITLES,
    KERNEL_HEADERS,
    PER_DEVICE,
    QUANTIZATION_HEADERS,
    Section,
    compiled_errors,
    costliest_rows,
    format_bytes,
    format_flops,
    hotspot_key,
    hotspots,
    jax_text,
    kernels_shown,
    kernels_title,
    mesh_note,
    policy_errors,
    quantizes,
    shown_columns,
    standin_note,
    target_sections,
    time_section,
    timed,
    trained_note,
    warning_message,
)
from ._text import printable_records

# --- Markdown -----------------------------------------------------------------------------------


def md_text(text: str) -> str:
    """Text as Markdown shows it, not as it would read it: no HTML tag (`<img>`), no cell break (`|`)."""
    return text.replace("<", "&lt;").replace("|", "\\|")


def md_code(text: str) -> str:
    """`text` as a code span whatever backticks it holds (CommonMark: a longer fence)."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_cell(cell: str) -> str:
    """A table cell: text as `md_text` shows it; a whole code span (`md_code`'s) keeps its `<` as
    written (a code span shows no HTML, and would show `&lt;` as those four characters), only its
    `|` escaped, which GitHub's tables split cells at even inside code."""
    if re.fullmatch(r"(`+).*\1", cell, re.DOTALL):
        return cell.replace("|", "\\|")
    return md_text(cell)


def md_row(cells: list[str]) -> str:
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


def md_table(headers: list[str], rows: list[list[str]], numeric: list[bool]) -> list[str]:
    rule = ["---:" if n else "---" for n in numeric]
    return [md_row(headers), "| " + " | ".join(rule) + " |", *(md_row(r) for r in rows)]


def render_markdown(report: AuditReport, top: int = 10, by: HotspotKey | None = None) -> str:
    """The comparison, the largest residuals and the warnings as GitHub tables, for a pull-request
    or CI summary."""
    report = printable_records(report)
    compiled = any(r.compiled is not None for r in report.results)
    columns = [
        c
        for c in COLUMNS.values()
        if (compiled or not c.header.startswith("XLA")) and (report.mesh is not None or c.header != PER_DEVICE)
        and (c.header not in GPU_HEADERS or c.header == "activation")
        and (c.header not in QUANTIZATION_HEADERS or quantizes(report))
    ]
    lines = [
        f"## te-ckpt-audit: {md_code(report.target)}",
        "",
        f"Forward pass: {format_flops(report.forward_flops)}; {jax_text(report)}. "
        "Bytes are residuals kept for the backward pass; TE GEMM, dot, named and other split "
        "the activation bytes.",
        "",
        *md_table(  # numbered, as the terminal's: the residuals' "kept by #" refers to these numbers
            ["#", *(c.header for c in columns)],
            [[str(i), *(c.cell(report, r) for c in columns)] for i, r in enumerate(report.results, 1)],
            [True, *(c.numeric for c in columns)],
        ),
        "",
    ]
    if report.te is TeKind.STANDIN:
        lines += [f"> {standin_note(report)}", ""]
    if trained_note(report) is not None:
        lines += [f"> {md_text(trained_note(report) or '')}", ""]
    if report.mesh is not None:
        lines += [f"> {mesh_note(report)}", ""]
    if report.emulated_device:
        lines += [f"> {md_text(EMULATED_NOTE.format(device=report.emulated_device))}", ""]
    if policy_errors(report):
        errors = [f"{policy}: not differentiable under this policy: {why}" for policy, why in policy_errors(report)]
        lines += [f"> {md_text(e)}" for e in errors]
        lines += [""]
    if compiled:
        lines += [f"> XLA columns: {COMPILED_NOTE}", ""]
        lines += [f"> {md_text(f'{policy}: not compiled: {why}')}" for policy, why in compiled_errors(report)]
        lines += [""] if compiled_errors(report) else []
    for section in target_sections(report, shown_columns(report, GPU_HEADERS)):
        lines += _section(report, section)
    if timed(report):
        lines += _time_section(report)
    if top:
        key = hotspot_key(report, by)
        spots = hotspots(report, top, key)
        lines += [f"### Largest residuals by {HOTSPOT_TITLES[key]}", ""]
        rows = [[s.where, format_bytes(s.most), " ".join(map(str, s.kept_by)), ", ".join(s.producers)] for s in spots]
        lines += [*md_table([HOTSPOT_TITLES[key], "bytes", "kept by #", "made by"], rows, [False, True, False, False])]
        lines += [""]
    lines += ["### Warnings", ""]
    if report.warnings:
        rows = [[w.policy or "", w.code.value, warning_message(w)] for w in report.warnings]
        lines += [*md_table(["policy", "warning", "message"], rows, [False] * 3), ""]
    else:
        lines += ["None.", ""]
    return "\n".join(lines)


def _section(report: AuditReport, section: Section) -> list[str]:
    """A compiled step's table (a GPU's peak, a TPU's plan), then what it means."""
    shown = [COLUMNS["policy"], *section.columns]
    lines = [f"### {md_text(section.title)}", ""]
    lines += md_table([c.header for c in shown], [[c.cell(report, r) for c in shown] for r in report.results],
                      [c.numeric for c in shown])
    return [*lines, "", *(f"> {md_text(note)}" for note in section.notes), ""]


def _time_section(report: AuditReport) -> list[str]:
    """The step time per policy (an estimate), what it means, then each policy's costliest kernels."""
    lines = _section(report, time_section(report))
    fastest, others = kernels_shown(report)
    if fastest is not None and fastest.time is not None:
        lines += [f"#### {md_text(kernels_title(fastest, others))}", ""]
        rows = [[md_code(row[0]), *row[1:5], md_code(row[5])] for row in costliest_rows(fastest.time)]
        lines += [*md_table(list(KERNEL_HEADERS), rows, [False, False, True, True, False, False]), ""]
    return lines

