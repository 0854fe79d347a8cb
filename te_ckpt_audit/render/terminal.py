"""The terminal report: Rich tables built from the same columns, hotspots and marks as every other
output, rendered to a string (`render_table` is pure: same report and view, same text).

The tables fit the width they are given (80 columns included): numbers never wrap, multi-word
headers stack on two lines, and policy specs and paths break after `_` or `/`, not mid-word.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from collections.abc import Mapping, Sequence

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..records import AuditReport, HotspotKey, Outcome, Run, StepTime, TeKind
from ._common import (
    COLUMNS,
    COMPILED_HEADERS,
    COMPILED_NOTE,
    EMULATED_NOTE,
    GPU_TERMINAL,
    HOTSPOT_TITLES,
    KERNEL_HEADERS,
    MARK_SYMBOLS,
    OUTCOME_WORDS,
    TIME_TERMINAL,
    Column,
    compiled_errors,
    costliest_rows,
    format_bytes,
    format_flops,
    hotspot_key,
    hotspots,
    jax_text,
    kernels_shown,
    kernels_title,
    marks_by_equation,
    mesh_note,
    offloaded,
    policy_errors,
    producer_headers,
    shared_arguments,
    shown_columns,
    standin_note,
    target_sections,
    time_section,
    timed,
    trained_note,
    warning_message,
)
from ._text import printable_records
from .check import SUMMARY_HEADERS, SUMMARY_NUMERIC, summary_rows

MARK_STYLES = {
    Outcome.SAVED: "green",
    Outcome.RECOMPUTED: "yellow",
    Outcome.OFFLOADED: "cyan",
    Outcome.NOT_NEEDED: "dim",
}
TE_STYLE = "bold magenta"
MIN_TEXT_WIDTH = 12
MADE_BY_WIDTH = 24  # the hotspots' last column keeps at least this much
NATURAL = 100_000  # a width no table reaches: each takes the width its cells need


@dataclasses.dataclass(frozen=True, slots=True)
class TableView:
    top: int = 10  # hotspot lines shown; 0 for none
    by: HotspotKey | None = None  # hotspots by module path or source line; None: module where known
    equations: bool = False  # add the per-equation table
    width: int | None = 80  # None: as wide as the tables need (at least 80), no name split
    color: bool = False


def _stack(header: str, widest_cell: int) -> str:
    """A multi-word header wider than its cells goes on two lines, split where they come out most even."""
    words = header.split(" ")
    if len(words) == 1 or len(header) <= widest_cell:
        return header
    splits = [(" ".join(words[:i]), " ".join(words[i:])) for i in range(1, len(words))]
    top, bottom = min(splits, key=lambda s: max(len(s[0]), len(s[1])))
    return f"{top}\n{bottom}"


def _break(text: str, width: int, after: str = "_/,:;") -> str:
    """Lines of at most `width`, broken after one of `after` (Rich folds any longer piece)."""
    lines = [""]
    for piece in re.findall(rf"[^{after}]+[{after}]?|[{after}]", text):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(lines)


def _table() -> Table:
    return Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 0),  # one space between columns (the box's divider): room for the names at 80
    )


def _titled(title: str, table: Table) -> Group:
    """The title above the table, wrapped to the console's width rather than the table's."""
    return Group(Text(title, style="bold"), table)


def _width(header: str, cells: list[str]) -> int:
    return max(len(line) for line in [*_stack(header, max(map(len, cells), default=0)).splitlines(), *cells])


def _fixed(table: Table, header: str, cells: list[str], justify: str = "right") -> int:
    """Add a column that never wraps; return its width."""
    header = _stack(header, max(map(len, cells), default=0))
    table.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    return _width(header, cells)


def _named(columns: list[Column], width: int) -> tuple[tuple[str, ...], int, dict[str, Column]]:
    """`_comparison`'s headers, width and columns for columns made for one report."""
    return tuple(c.header for c in columns), width, {c.header: c for c in columns}


def _comparison(report: AuditReport, title: str, headers: tuple[str, ...], width: int,
                columns: Mapping[str, Column] = COLUMNS) -> Group:
    """One row per policy, numbered: the other tables refer to policies by that number."""
    table = _table()
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("policy", overflow="fold")
    rows = [[c.cell(report, r) for r in report.results] for c in (columns[h] for h in headers)]
    used = len(str(len(report.results))) + len(headers) + 1  # numbers and dividers
    used += sum(_fixed(table, h, cells) for h, cells in zip(headers, rows, strict=True))
    name_width = max(MIN_TEXT_WIDTH, width - used)
    for i, result in enumerate(report.results):
        table.add_row(str(i + 1), Text(_break(result.policy, name_width)), *(cells[i] for cells in rows))
    return _titled(title, table)


def _kernels(title: str, time: StepTime, width: int) -> Group:
    rows = costliest_rows(time)
    table = _table()
    table.add_column("kernel", overflow="fold")
    table.add_column("kind", no_wrap=True)
    columns = list(zip(*rows, strict=True))
    for header, column in zip(KERNEL_HEADERS[2:5], columns[2:5], strict=True):
        _fixed(table, header, list(column))
    table.add_column("what it computes", overflow="fold")
    for row in rows:
        table.add_row(Text(row[0]), row[1], row[2], row[3], row[4], Text(_break(row[5], max(MIN_TEXT_WIDTH, width // 2),
                                                                              after="/")))
    return _titled(title, table)


def _hotspots(report: AuditReport, top: int, width: int, by: HotspotKey | None) -> Group:
    table = _table()
    by = hotspot_key(report, by)
    spots = hotspots(report, top, by)
    sizes = [format_bytes(s.most) for s in spots]
    kept = [" ".join(map(str, s.kept_by)) for s in spots]
    fixed = _width("bytes", sizes) + _width("kept by #", kept) + 3  # and the dividers
    where = [_break(s.where, max(MIN_TEXT_WIDTH, width - fixed - MADE_BY_WIDTH), after="/") for s in spots]
    table.add_column(HOTSPOT_TITLES[by], no_wrap=True)  # broken after `/` above; only "made by" wraps
    _fixed(table, "bytes", sizes)
    _fixed(table, "kept by #", kept)
    table.add_column("made by", overflow="fold")
    for place, size, numbers, spot in zip(where, sizes, kept, spots, strict=True):
        table.add_row(Text(place), size, numbers, Text(", ".join(spot.producers)))
    title = f"Largest residuals by {HOTSPOT_TITLES[by]} (top {top}; bytes: the most a policy keeps there)"
    return _titled(title, table)


def _short_dtype(dtype: str) -> str:
    return dtype.replace("bfloat", "bf").replace("float", "f").replace("uint", "u").replace("int", "i")


def _equations(report: AuditReport, width: int) -> Group:
    """Every equation's outcome under each policy; the primitive column takes what the rest leave."""
    legend = ", ".join(f"{s} {OUTCOME_WORDS[o]}" for o, s in MARK_SYMBOLS.items())
    table = _table()
    rows = marks_by_equation(report)
    equations = [e for e, _ in rows]
    used = _fixed(table, "eqn", [e.id for e in equations], justify="left")
    table.add_column("primitive", overflow="fold")
    shapes = [f"{_short_dtype(e.dtype)}[{','.join(map(str, e.shape))}]" for e in equations]
    sources = [f"{os.path.basename(e.source.file)}:{e.source.line}" if e.source else "" for e in equations]
    used += _fixed(table, "shape", shapes, "left") + _fixed(table, "source", sources, "left")
    for n in range(1, len(report.results) + 1):
        used += _fixed(table, str(n), ["S"])
    used += 3 + len(report.results)  # dividers
    for i, (equation, outcomes) in enumerate(rows):
        if i and len(set(outcomes)) == 1 and len(set(rows[i - 1][1])) > 1:
            table.add_section()  # below: the equations every policy treats alike
        what = ("*" if equation.is_te_gemm else "") + equation.primitive
        what = _break(what, max(MIN_TEXT_WIDTH, width - used))
        what += f" {equation.name}" if equation.name else ""
        marks = [Text(MARK_SYMBOLS[o], style=MARK_STYLES[o]) for o in outcomes]
        te_style = TE_STYLE if equation.is_te_gemm else ""
        table.add_row(equation.id, Text(what, style=te_style), shapes[i], sources[i], *marks)
    return _titled(f"Outcome per equation and policy # ({legend}; *TE GEMM); differing first", table)


def _header(report: AuditReport) -> Text:
    scopes = ", ".join(dict.fromkeys(r.scope.value for r in report.results))
    return Text.assemble(
        ("te-ckpt-audit ", "bold"),
        report.target,
        f"\n{len(report.arguments)} array inputs; forward pass {format_flops(report.forward_flops)}; "
        f"scope {scopes}; {jax_text(report)}",
    )


def _warnings(report: AuditReport) -> list[RenderableType]:
    if not report.warnings:
        return [Text("No warnings.", style="green")]
    return [Text("Warnings", style="bold"), *[
        Text.assemble(("! ", "bold yellow"), (f"[{w.code.value}] ", "yellow"), warning_message(w))
        for w in report.warnings
    ]]


def render_check_table(runs: Sequence[Run], width: int | None = None) -> str:
    """The gate's summary: one row per target and policy (the target named once), then the verdict;
    at `width`, or (None) at the width its names need, as the audit's tables take it."""
    runs = printable_records(tuple(runs))
    table = _table()
    rows = summary_rows(runs)
    table.add_column("target", overflow="fold")
    table.add_column("policy", overflow="fold")
    used = len(SUMMARY_HEADERS) + 1
    for i, (header, numeric) in enumerate(zip(SUMMARY_HEADERS, SUMMARY_NUMERIC, strict=True)):
        if i >= 2:
            used += _fixed(table, header, [row[i] for row in rows], "right" if numeric else "left")
    names = [len(row[i]) for row in rows for i in (0, 1)]
    text_width = max(MIN_TEXT_WIDTH, (width - used) // 2) if width is not None else max([MIN_TEXT_WIDTH, *names])
    previous = None
    for target, policy, *figures in rows:
        shown = "" if target == previous else _break(target, text_width)
        previous = target
        table.add_row(Text(shown), Text(_break(policy, text_width)), *figures)
    failed = sum(len(result.violations) for _, result in runs)
    verdict = f"{'FAILED' if failed else 'passed'}: {len(runs)} target(s), {failed} violation(s)"
    buffer = io.StringIO()
    console = Console(file=buffer, width=width or NATURAL, color_system=None, force_terminal=False)
    console.print(_titled("te-ckpt-audit check", table))
    console.print(verdict)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


def _sections(report: AuditReport, view: TableView) -> list[list[RenderableType]]:
    """The report's parts, in order: each a list of renderables printed one below the other."""
    width = NATURAL if view.width is None else view.width
    arguments = shared_arguments(report)
    sections: list[list[RenderableType]] = [
        [_header(report)],
        [
            _comparison(
                report,
                "Kept for the backward pass, and recomputed",
                shown_columns(report, ("activation", *(("arguments",) if arguments is None else ()),
                                       *(("host",) if offloaded(report) else ()),
                                       "residuals", "recompute", "% of forward")),
                width,
            ),
            *((Text(f"arguments: {format_bytes(arguments)} kept by every policy (inputs the backward pass "
                    "reads)", style="dim"),) if arguments is not None else ()),
        ],
        [
            _comparison(
                report,
                "Activation bytes by producer",
                producer_headers(report),
                width,
            )
        ],
    ]
    if any(r.compiled is not None for r in report.results):
        backend = next(r.compiled.backend for r in report.results if r.compiled is not None)
        sections.append(
            [
                _comparison(
                    report,
                    f"Compiled training step ({backend}): XLA memory analysis",
                    shown_columns(report, COMPILED_HEADERS),
                    width,
                ),
                Text(COMPILED_NOTE, style="dim"),
                *(Text(f"{p}: not compiled: {why}", style="yellow") for p, why in compiled_errors(report)),
            ]
        )
    timing = [time_section(report, TIME_TERMINAL)] if timed(report) else []
    for section in [*target_sections(report, GPU_TERMINAL), *timing]:
        sections.append([
            _comparison(report, section.title, *_named(list(section.columns), width)),
            *(Text(note, style="dim") for note in section.notes),
        ])
    if timed(report):
        fastest, others = kernels_shown(report)
        if fastest is not None and fastest.time is not None:
            sections.append([_kernels(kernels_title(fastest, others), fastest.time, width)])
    if policy_errors(report):
        notes = [f"{p}: not differentiable under this policy: {why}" for p, why in policy_errors(report)]
        sections.append([Text(note, style="yellow") for note in notes])
    if view.top:
        sections.append([_hotspots(report, view.top, width, view.by)])
    if view.equations:
        sections.append([_equations(report, width)])
    sections.append(_warnings(report))
    if report.te is TeKind.STANDIN:
        sections.append([Text(f"Note: {standin_note(report)}", style="dim")])
    if trained_note(report) is not None:
        sections.append([Text(f"Note: {trained_note(report)}", style="dim")])
    if report.mesh is not None:
        sections.append([Text(f"Note: {mesh_note(report)}", style="dim")])
    if report.emulated_device:
        sections.append([Text(f"Note: {EMULATED_NOTE.format(device=report.emulated_device)}", style="dim")])
    return sections


def _printed(sections: list[list[RenderableType]], width: int, color: bool) -> str:
    out = io.StringIO()
    console = Console(
        file=out,
        width=width,
        force_terminal=color,
        color_system="standard" if color else None,
        no_color=not color,
        markup=False,
        highlight=False,
        emoji=False,
    )
    for i, section in enumerate(sections):
        if i:
            console.print()
        console.print(*section, sep="\n")
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())


def natural_width(report: AuditReport, view: TableView) -> int:
    """The width at which no table of the report breaks a cell: its widest table line, at least 80
    (the notes and warnings then wrap at it)."""
    wide = dataclasses.replace(view, width=NATURAL, color=False)
    tables = [s for s in _sections(printable_records(report), wide) if not all(isinstance(x, Text) for x in s)]
    return max([80, *(len(line) for line in _printed(tables, NATURAL, False).splitlines())])


def render_table(report: AuditReport, view: TableView = TableView()) -> str:
    """The comparison, the hotspots, the per-equation table (if asked), then the warnings; at
    `view.width`, or (None) at the width the tables need."""
    if view.width is None:
        view = dataclasses.replace(view, width=natural_width(report, view))
    assert view.width is not None
    return _printed(_sections(printable_records(report), view), view.width, view.color)
