"""The HTML report: one self-contained file (inline CSS and SVG; no script, no network, no URL).

`render_audit_html(report)` and `render_recommend_html(recommendation)` are pure functions of the
records. The page holds the frontier plot (activation bytes vs recompute FLOPs), activation bytes
by producer per policy as stacked bars, the largest residuals by module path, and the
per-equation marks table.

    >>> from te_ckpt_audit.records import AuditReport
    >>> page = render_audit_html(AuditReport("t", (), "0", "none", (), ()))
    >>> page.startswith("<!DOCTYPE html>") and "<script" not in page
    True
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence

from ..records import (
    AuditReport,
    Category,
    HotspotKey,
    MaxTextRecommendation,
    Outcome,
    PeakMemory,
    PolicyResult,
    Recommendation,
    ResidualKind,
    StepTime,
    Throughput,
)
from ._common import (
    COLUMNS,
    HOTSPOT_TITLES,
    KERNEL_HEADERS,
    Section,
    costliest_rows,
    counted,
    format_bytes,
    format_flops,
    format_percent,
    format_seconds,
    hotspot_key,
    hotspots,
    jax_text,
    kernels_shown,
    kernels_title,
    peak_range,
    target_sections,
    time_section,
    timed,
    trained_note,
    warning_message,
    winner_policy,
)
from ._text import printable
from .plot import PlotPoint, recommendation_points, report_points
from .recommend import answered, compiled_for_words, maxtext_block, no_best_words, python_snippet, rate_unit

MAX_EQUATIONS = 2000  # rows of the marks table; a note says how many more there are
TOP_MODULES = 15
NUM = ' class="num"'
COLOURS = {Category.TE_GEMM: "#c0392b", Category.DOT: "#2e86c1", Category.QUANTIZED: "#8e44ad",
           Category.NAMED: "#27ae60", Category.OTHER: "#95a5a6"}
PRODUCER_WORDS = {Category.TE_GEMM: "TE GEMM", Category.DOT: "dot", Category.QUANTIZED: "quantized",
                  Category.NAMED: "named", Category.OTHER: "other"}
OUTCOME_CLASS = {Outcome.SAVED: "s", Outcome.OFFLOADED: "o", Outcome.RECOMPUTED: "r", Outcome.NOT_NEEDED: "n"}
OUTCOME_MARK = {Outcome.SAVED: "S", Outcome.OFFLOADED: "O", Outcome.RECOMPUTED: "R", Outcome.NOT_NEEDED: "·"}

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1200px;
color:#1c2833;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d5d8dc}
.meta{color:#566573;margin:0 0 12px}
.win{background:#eafaf1;border:1px solid #82e0aa;border-radius:6px;padding:10px 14px}
.miss{background:#fdedec;border:1px solid #f1948a;border-radius:6px;padding:10px 14px}
pre{background:#f4f6f7;border:1px solid #e5e8e8;padding:8px 10px;overflow-x:auto;font-size:12.5px}
code{font-size:13px}
table{border-collapse:collapse;font-size:12.5px}
th,td{border:1px solid #e5e8e8;padding:2px 6px;text-align:left;white-space:nowrap}
th{background:#f4f6f7;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.s{background:#d4efdf}td.o{background:#d6eaf8}td.r{background:#fadbd8}td.n{color:#aab7b8}
.scroll{overflow-x:auto;max-height:720px;overflow-y:auto;border:1px solid #e5e8e8}
table.fit{width:100%}table.fit td.path{white-space:normal;overflow-wrap:anywhere}
svg text{font:11px system-ui,sans-serif;fill:#1c2833}
.legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
"""


def _e(text: object) -> str:
    return html.escape(printable(str(text)), quote=True)


def _lines(text: str) -> str:
    """A block of lines (a `<pre>`): each line escaped, the line breaks kept."""
    return "\n".join(_e(line) for line in text.split("\n"))


def _page(title: str, body: Sequence[str]) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{_e(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


# --- the frontier plot -------------------------------------------------------------------------


def frontier_svg(points: Sequence[PlotPoint], budget: int | None = None, width: int = 1000, height: int = 420) -> str:
    """Activation bytes (x) against recompute FLOPs (y): presets labelled, the frontier joined as a
    staircase, the winner a star, the budget a dashed line."""
    if not points:
        return "<p>No policy could be analysed.</p>"
    left, right, top, bottom = 90, 300, 16, 44
    pw, ph = width - left - right, height - top - bottom
    x_max = max([p.activation_bytes for p in points] + [budget or 0, 1])
    y_max = max(max(p.recompute_flops for p in points), 1)

    def x(v: int) -> float:
        return left + v / x_max * pw

    def y(v: int) -> float:
        return top + (1 - v / y_max) * ph

    out = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           'aria-label="activation bytes against recompute FLOPs">']
    out += _axes(left, top, pw, ph, x_max, y_max, height)
    if budget is not None:
        bx = x(budget)
        out.append(f'<line x1="{bx:.1f}" y1="{top}" x2="{bx:.1f}" y2="{top + ph}" stroke="#e67e22" '
                   'stroke-dasharray="5 4" stroke-width="1.5"/>')
        out.append(f'<text x="{bx + 4:.1f}" y="{top + 12}" fill="#e67e22">budget {_e(format_bytes(budget))}</text>')
    front = sorted((p for p in points if p.frontier), key=lambda p: p.activation_bytes)
    if len(front) > 1:
        path = [f"M{x(front[0].activation_bytes):.1f},{y(front[0].recompute_flops):.1f}"]
        for p in front[1:]:
            path.append(f"H{x(p.activation_bytes):.1f}V{y(p.recompute_flops):.1f}")
        out.append(f'<path d="{"".join(path)}" fill="none" stroke="#5d6d7e" stroke-width="1.2"/>')
    labels: dict[tuple[float, float], list[str]] = {}
    for p in sorted(points, key=lambda p: (p.winner, p.preset, p.frontier)):
        px, py = x(p.activation_bytes), y(p.recompute_flops)
        tip = f"{p.label}: {format_bytes(p.activation_bytes)}, {format_flops(p.recompute_flops)}"
        if p.winner:
            star = _star(px, py, 9)
            out.append(f'<polygon points="{star}" fill="#f1c40f" stroke="#7d6608"><title>{_e(tip)}</title></polygon>')
        else:
            fill = "#2c3e50" if p.frontier else "#bdc3c7"
            r = 4.5 if p.preset or p.frontier else 3
            shape = (f'<rect x="{px - r:.1f}" y="{py - r:.1f}" width="{2 * r}" height="{2 * r}"' if p.preset
                     else f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{r}"')
            out.append(f'{shape} fill="{fill}" fill-opacity="0.85"><title>{_e(tip)}</title>'
                       f'{"</rect>" if p.preset else "</circle>"}')
        if p.preset or p.winner:  # points at one place share one label
            labels.setdefault((round(px, 1), round(py, 1)), []).append(p.label)
    placed = _labels([(px, py, " = ".join(names)) for (px, py), names in labels.items()], left + pw + 40, top,
                     top + ph)
    out += placed[0]
    out.append("</svg>")
    if placed[1] > height:  # the label column ran past the plot: the picture grows to hold it
        grown = placed[1] + 8
        out[0] = out[0].replace(f'height="{height}" viewBox="0 0 {width} {height}"',
                                f'height="{grown:.0f}" viewBox="0 0 {width} {grown:.0f}"')
    keys = [(any(p.preset for p in points), "<span>■ preset</span>"),
            (any(p.frontier and not p.preset and not p.winner for p in points), "<span>● on the frontier</span>"),
            (len(front) > 1, "<span>─ frontier</span>"),
            (any(not (p.frontier or p.preset) for p in points),
             '<span style="color:#95a5a6">● other analysed</span>'),
            (any(p.winner for p in points), '<span style="color:#b7950b">★ recommended</span>'),
            (budget is not None, '<span style="color:#e67e22">┊ budget</span>')]
    return "\n".join(out) + '\n<p class="legend">' + "".join(k for shown, k in keys if shown) + "</p>"


def _axes(left: int, top: int, pw: int, ph: int, x_max: int, y_max: int, height: int) -> list[str]:
    """The plot's frame, grid, ticks and axis titles."""
    out = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfcfc" stroke="#d5d8dc"/>']
    for i in range(5):
        gx, gy = left + pw * i / 4, top + ph * i / 4
        out.append(f'<line x1="{gx:.1f}" y1="{top}" x2="{gx:.1f}" y2="{top + ph}" stroke="#eaeded"/>')
        out.append(f'<line x1="{left}" y1="{gy:.1f}" x2="{left + pw}" y2="{gy:.1f}" stroke="#eaeded"/>')
        tick = format_bytes(round(x_max * i / 4))
        # the first and last ticks stay under the plot: clear of the y ticks and of the labels
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        out.append(f'<text x="{gx:.1f}" y="{top + ph + 16}" text-anchor="{anchor}">{_e(tick)}</text>')
        out.append(f'<text x="{left - 6}" y="{gy + 4:.1f}" text-anchor="end">'
                   f'{_e(format_flops(round(y_max * (4 - i) / 4)))}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">activation bytes →</text>')
    out.append(f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
               'text-anchor="middle">recompute FLOPs →</text>')
    return out


def _star(cx: float, cy: float, r: float) -> str:
    pts = []
    for i in range(10):
        radius = r if i % 2 == 0 else r * 0.45
        angle = math.pi / 2 + i * math.pi / 5
        pts.append(f"{cx + radius * math.cos(angle):.1f},{cy - radius * math.sin(angle):.1f}")
    return " ".join(pts)


LABEL_STEP = 13  # px between label baselines


def _labels(labels: list[tuple[float, float, str]], lx: float, top: float, bottom: float) -> tuple[list[str], float]:
    """Labels in the right margin, stacked without overlap, each joined to its point by a leader,
    kept above `bottom` where they fit (moved up together); and how far down the last reaches."""
    ordered = sorted(labels, key=lambda t: (t[1], t[2]))
    placed: list[float] = []
    for py in (t[1] for t in ordered):
        placed.append(max(py + 4, (placed[-1] + LABEL_STEP) if placed else top + 8))
    if placed and placed[-1] > bottom:  # pushed past the plot's foot: move the stack up, keep the order
        placed[-1] = max(bottom, top + 8 + LABEL_STEP * (len(placed) - 1))
        for i in range(len(placed) - 2, -1, -1):
            placed[i] = min(placed[i], placed[i + 1] - LABEL_STEP)
    out = []
    for (px, py, text), ly in zip(ordered, placed, strict=True):
        out.append(f'<line x1="{px:.1f}" y1="{py:.1f}" x2="{lx - 2:.1f}" y2="{ly - 4:.1f}" stroke="#aeb6bf" '
                   'stroke-width="0.7"/>')
        short = text if len(text) <= 36 else text[:35] + "…"
        out.append(f'<text x="{lx:.1f}" y="{ly:.1f}">{_e(short)}<title>{_e(text)}</title></text>')
    return out, (placed[-1] if placed else 0.0)


# --- activation bytes by producer --------------------------------------------------------------


def _by_category(r: PolicyResult) -> list[tuple[Category, int]]:
    t = r.totals
    return [(Category.TE_GEMM, t.te_gemm_bytes), (Category.DOT, t.dot_bytes), (Category.QUANTIZED, t.quantized_bytes),
            (Category.NAMED, t.named_bytes), (Category.OTHER, t.other_bytes)]


def producer_bars_svg(results: Sequence[PolicyResult], width: int = 900) -> str:
    """One stacked bar per policy: its activation bytes split by producer."""
    ok = [r for r in results if r.error is None]
    if not ok:
        return "<p>No policy could be analysed.</p>"
    label_w, bar_h, gap, top = 300, 18, 6, 8
    pw = width - label_w - 110
    most = max([r.totals.activation_bytes for r in ok] + [1])
    height = top + len(ok) * (bar_h + gap) + 8
    out = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           'aria-label="activation bytes by producer per policy">']
    for i, r in enumerate(ok):
        y0 = top + i * (bar_h + gap)
        name = r.policy if len(r.policy) <= 46 else r.policy[:45] + "…"
        out.append(f'<text x="{label_w - 8}" y="{y0 + 13}" text-anchor="end">{_e(name)}'
                   f"<title>{_e(r.policy)}</title></text>")
        x0 = float(label_w)
        for cat, b in _by_category(r):
            if b <= 0:
                continue
            w = b / most * pw
            out.append(f'<rect x="{x0:.1f}" y="{y0}" width="{max(w, 0.5):.1f}" height="{bar_h}" fill="{COLOURS[cat]}">'
                       f'<title>{_e(PRODUCER_WORDS[cat])}: {_e(format_bytes(b))}</title></rect>')
            x0 += w
        out.append(f'<text x="{x0 + 6:.1f}" y="{y0 + 13}">{_e(format_bytes(r.totals.activation_bytes))}</text>')
    out.append("</svg>")
    legend = "".join(f'<span><i class="sw" style="background:{COLOURS[c]}"></i>{PRODUCER_WORDS[c]}</span>'
                     for c in Category)
    return "\n".join(out) + f'\n<p class="legend">{legend}</p>'


# --- tables ------------------------------------------------------------------------------------


def modules_table(report: AuditReport, top: int = TOP_MODULES, by: HotspotKey | None = None) -> str:
    """Activation and host residual bytes by module path (else source line) or by source line,
    per policy: the largest first; the same hotspots, `top` and `by` as every other output."""
    key = hotspot_key(report, by)
    spots = hotspots(report, top, key)
    if not spots:
        return "<p>No policy keeps an activation.</p>"
    # policies by number (the key above names them): a column per policy stays narrow at any name
    head = "".join(f'<th class="num" title="{_e(r.policy)}">{i + 1}</th>' for i, r in enumerate(report.results))
    rows = []
    for spot in spots:
        cells = "".join(f'<td class="num">{_e(format_bytes(b)) if b else ""}</td>' for b in spot.bytes_by_policy)
        rows.append(f'<tr><td class="path"><code>{_breakable(spot.where)}</code></td>{cells}</tr>')
    title = HOTSPOT_TITLES[key]
    return (_policy_key(report.results) + f'<table class="fit"><thead><tr><th>{_e(title)}</th>{head}</tr></thead>'
            "<tbody>" + "".join(rows) + "</tbody></table>")


def _breakable(text: str) -> str:
    """`text` escaped, with a line-break opportunity after each `/`, `_` and `:`."""
    return "".join(_e(c) + ("<wbr>" if c in "/_:" else "") for c in text)


def _policy_key(results: Sequence[PolicyResult]) -> str:
    return ('<p class="legend">' + " ".join(f"<span><b>{i + 1}</b> <code>{_e(r.policy)}</code></span>"
                                             for i, r in enumerate(results)) + "</p>")


def top_residuals_table(result: PolicyResult, top: int = 15) -> str:
    """The largest residuals of one policy, with their module path, name and source line."""
    rs = sorted((r for r in result.residuals if r.kind in (ResidualKind.ACTIVATION, ResidualKind.HOST)),
                key=lambda r: (-r.bytes, r.equation or ""))[:top]
    if not rs:
        return f"<p>{_e(result.policy)} keeps no activation.</p>"
    rows = []
    for r in rs:
        where = r.source or r.frame
        rows.append(
            f'<tr><td class="num">{_e(format_bytes(r.bytes))}</td><td><code>{_e(r.module or "")}</code></td>'
            f"<td>{_e(r.name or '')}</td><td>{_e(r.primitive or '')}</td>"
            f"<td>{_e(r.dtype)}{_e(list(r.shape))}</td><td>{_e(r.kind.value)}</td><td>{_e(where or '')}</td></tr>"
        )
    return ("<table><thead><tr><th>bytes</th><th>module path</th><th>name</th><th>producer</th><th>value</th>"
            "<th>kind</th><th>source</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def marks_table(report: AuditReport, limit: int = MAX_EQUATIONS) -> str:
    """Every forward equation and what each policy does with it: S saved, O offloaded, R recomputed."""
    ok = [r for r in report.results if r.error is None]
    outcomes = [{m.equation: m.outcome for m in r.marks} for r in ok]
    head = "".join(f'<th title="{_e(r.policy)}">{i + 1}</th>' for i, r in enumerate(ok))
    rows = []
    for e in report.equations[:limit]:
        cells = []
        for o in outcomes:
            out = o.get(e.id)
            cells.append(f'<td class="{OUTCOME_CLASS[out]}">{OUTCOME_MARK[out]}</td>' if out else "<td></td>")
        rows.append(
            f"<tr><td>{_e(e.id)}</td><td>{_e(e.primitive)}</td><td>{_e(e.dtype)}{_e(list(e.shape))}</td>"
            f"<td>{_e(e.name or '')}</td><td><code>{_e(e.module or '')}</code></td>"
            f'<td class="num">{_e(format_flops(e.flops * e.multiplicity))}</td>{"".join(cells)}</tr>'
        )
    more = len(report.equations) - limit
    note = f"<p>{more} more equations not shown.</p>" if more > 0 else ""
    key = "".join(f"<li><b>{i + 1}</b> <code>{_e(r.policy)}</code></li>" for i, r in enumerate(ok))
    return (f"<ol style=\"list-style:none;padding:0\">{key}</ol>"
            '<p class="legend"><span class="sw" style="background:#d4efdf"></span>S saved '
            '<span class="sw" style="background:#d6eaf8"></span>O offloaded '
            '<span class="sw" style="background:#fadbd8"></span>R recomputed · not needed</p>'
            '<div class="scroll"><table><thead><tr><th>equation</th><th>primitive</th><th>value</th><th>name</th>'
            f"<th>module path</th><th>FLOPs</th>{head}</tr></thead><tbody>" + "".join(rows)
            + "</tbody></table></div>" + note)


def _sections(
    report: AuditReport, points: Sequence[PlotPoint], budget: int | None, focus: PolicyResult | None,
    top: int = TOP_MODULES, by: HotspotKey | None = None,
) -> list[str]:
    key = hotspot_key(report, by)
    out = ["<h2>Frontier: activation bytes against recompute</h2>", frontier_svg(points, budget),
           "<h2>Activation bytes by producer</h2>", producer_bars_svg(report.results)]
    if top > 0:  # --top 0: no hotspots, as in the other formats
        out += [f"<h2>Largest residuals by {_e(HOTSPOT_TITLES[key])} (top {top})</h2>", modules_table(report, top, key)]
    if focus is not None:
        out += [f"<h2>Largest residuals of <code>{_e(focus.policy)}</code></h2>", top_residuals_table(focus)]
    out += ["<h2>Per-equation marks</h2>", marks_table(report)]
    return out


_ARGUMENT = re.compile(r":\s*([A-Za-z]\w*)\[([\d, ]*)\]\s*$")
LARGEST_ARGUMENTS = 3


def argument_bytes(text: str) -> int:
    """The bytes of an argument as the report names it (`args[0]['w']: float32[32, 64]`); 0 where
    its shape is not written so.

    >>> argument_bytes("args[0]['w']: bfloat16[32, 64]"), argument_bytes("x: bool[8]")
    (4096, 8)
    """
    found = _ARGUMENT.search(text)
    if found is None:
        return 0
    bits = re.search(r"(\d+)", found.group(1))
    size = max(1, int(bits.group(1)) // 8) if bits else 1
    return math.prod(int(d) for d in found.group(2).replace(" ", "").split(",") if d) * size


def _meta(report: AuditReport) -> str:
    """What the audit ran on: versions, the forward FLOPs, and its arguments counted, the largest
    few named and the rest folded."""
    args = sorted(report.arguments, key=lambda a: -argument_bytes(a))
    total = sum(argument_bytes(a) for a in args)
    shown = ", ".join(args[:LARGEST_ARGUMENTS])
    more = len(args) - LARGEST_ARGUMENTS
    folded = (f"<details><summary>all {len(args)} arguments</summary><code>{_e(', '.join(report.arguments))}</code>"
              "</details>") if more > 0 else ""
    trained = trained_note(report)
    return (f'<p class="meta">{_e(jax_text(report))} · TE: {_e(report.te)} · forward '
            f"{_e(format_flops(report.forward_flops))} · {len(args)} arguments, {_e(format_bytes(total))}"
            + (f"; the largest: <code>{_e(shown)}</code>" if args else "")
            + (f" and {more} more" if more > 0 else "") + f"</p>{folded}"
            + (f'<p class="meta">{_e(trained)}</p>' if trained else ""))


def _policies_table(report: AuditReport) -> list[str]:
    failed = any(r.error for r in report.results)  # the error column only where a policy failed
    rows = "".join(
        f"<tr><td><code>{_e(r.policy)}</code></td><td class=\"num\">{_e(format_bytes(r.totals.activation_bytes))}</td>"
        f"<td class=\"num\">{_e(format_bytes(r.totals.host_bytes))}</td>"
        f"<td class=\"num\">{_e(format_flops(r.recompute_flops))}</td>"
        f"<td class=\"num\">{_e(format_percent(r.recompute_percent))}</td>"
        + (f"<td>{_e(r.error or '')}</td>" if failed else "") + "</tr>"
        for r in report.results
    )
    out = ["<h2>Policies</h2><table><thead><tr><th>policy</th><th>activation</th><th>host</th>"
           f"<th>recompute</th><th>% of forward</th>{'<th>error</th>' if failed else ''}</tr></thead>"
           f"<tbody>{rows}</tbody></table>"]
    for section in target_sections(report):
        out += _section_table(report, section)
    return out + (_time_table(report) if timed(report) else [])


def warnings_section(report: AuditReport) -> list[str]:
    """Every finding of the audit, as the terminal and Markdown show them."""
    if not report.warnings:
        return ["<h2>Warnings</h2><p>None.</p>"]
    rows = "".join(f"<tr><td><code>{_e(w.policy or '')}</code></td><td>{_e(w.code.value)}</td>"
                   f'<td class="path">{_e(warning_message(w))}</td></tr>' for w in report.warnings)
    return [f"<h2>Warnings ({len(report.warnings)})</h2>", '<table class="fit"><thead><tr><th>policy</th>'
            f"<th>warning</th><th>message</th></tr></thead><tbody>{rows}</tbody></table>"]


def render_audit_html(report: AuditReport, top: int = TOP_MODULES, by: HotspotKey | None = None) -> str:
    """The audit as one self-contained HTML page; `top` and `by` as the other formats take them."""
    body = [f"<h1>te-ckpt-audit: {_e(report.target or 'function')}</h1>", _meta(report), *_policies_table(report),
            *warnings_section(report)]
    body += _sections(report, report_points(report), None, None, top, by)
    return _page(f"te-ckpt-audit: {report.target}", body)


def audit_html_table(report: AuditReport) -> str:
    """The HTML report's policy table (and its GPU table), for a notebook (`_repr_html_`)."""
    title = f"<b>te-ckpt-audit: <code>{_e(report.target or 'function')}</code></b>"
    return f"<div>{title}{''.join(_policies_table(report))}</div>"


def _time_cell(time: StepTime | None) -> str:
    if time is None:
        return "not compiled"
    return f"no estimate: {time.error}" if time.seconds is None else format_seconds(time.seconds)


def _peak_cell(peak: PeakMemory | None) -> str:
    if peak is None or peak.bytes_per_device is None:
        return "not compiled" if peak is None else f"not compiled: {peak.error}"
    return peak_range(peak)


def _section_table(report: AuditReport, section: Section) -> list[str]:
    """A compiled step's table (a GPU's peak per device, a TPU's plan per chip), then what it means."""
    shown = [COLUMNS["policy"], *section.columns]
    head = "".join(f"<th>{_e(c.header)}</th>" for c in shown)
    rows = "".join(
        "<tr>" + "".join(f"<td{NUM if c.numeric else ''}>{_e(c.cell(report, r))}</td>" for c in shown)
        + "</tr>"
        for r in report.results
    )
    notes = "".join(f'<p class="meta">{_e(n)}</p>' for n in section.notes)
    return [f"<h2>{_e(section.title)}</h2>",
            f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>{notes}']


def _time_table(report: AuditReport) -> list[str]:
    """The step time per policy (an estimate), what it means, and each policy's costliest kernels."""
    section = time_section(report)
    shown = [COLUMNS["policy"], *section.columns]
    out = [f"<h2>{_e(section.title)}</h2>", _html_table([c.header for c in shown],
           [[c.cell(report, r) for c in shown] for r in report.results], [c.numeric for c in shown])]
    out += [f'<p class="meta">{_e(n)}</p>' for n in section.notes]
    fastest, others = kernels_shown(report)
    numeric = [False, False, True, True, False, False]
    if fastest is not None and fastest.time is not None:
        out += [f"<h3>{_e(kernels_title(fastest, ()))}</h3>",
                _html_table(list(KERNEL_HEADERS), costliest_rows(fastest.time), numeric)]
    for r in report.results:  # the others folded: one click each, not a page of near-identical tables
        if r.policy in others and r.time is not None:
            out += [f"<details><summary>Costliest kernels under {_e(r.policy)}</summary>",
                    _html_table(list(KERNEL_HEADERS), costliest_rows(r.time), numeric), "</details>"]
    return out


def _html_table(headers: list[str], rows: list[list[str]], numeric: list[bool]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td{NUM if n else ''}>{_e(cell)}</td>" for cell, n in zip(row, numeric,
                                                                                              strict=True)) + "</tr>"
                   for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _recommendation(rec: Recommendation) -> list[str]:
    """The winner (or the closest), how to use it, the GPU it was compiled for, and the frontier."""
    shown = answered(rec)
    budget = format_bytes(rec.budget_bytes) + (" per device" if rec.mesh is not None else "")
    body = [f'<p class="meta">budget {_e(budget)} · {counted(len(rec.evaluated), "policy")} analysed (at most '
            f"{rec.max_evals}), each by JAX's own linearization</p>"]
    compiled_for = compiled_for_words(rec)
    if compiled_for is not None:
        body.append(f'<p class="meta">{_e(compiled_for)}</p>')
    if shown is not None:
        cls, word = ("win", "Recommended") if rec.recommended is not None else ("miss", "Nothing fits; closest")
        host = f" · host {format_bytes(shown.host_bytes)}" if shown.host_bytes else ""
        body.append(
            f'<div class="{cls}"><b>{word}:</b> <code>--policy {_e(shown.policy)}</code><br>'
            f"activation {_e(format_bytes(shown.activation_bytes))}{_e(host)} · recompute "
            f"{_e(format_flops(shown.recompute_flops))} ({_e(format_percent(shown.recompute_percent))} of the "
            "forward pass)</div>"
        )
        body += ["<h2>Python</h2>", f"<pre>{_lines(python_snippet(shown))}</pre>"]
        block = maxtext_block(shown, rec.names)
        if block is not None:
            body += ["<h2>MaxText remat settings</h2>", f"<pre>{_lines(block)}</pre>"]
    timed_any = any(c.time is not None for c in rec.frontier)
    rows = "".join(
        f"<tr><td>{'★' if c.policy == winner_policy(rec) else ''}</td><td><code>{_e(c.policy)}</code></td>"
        f"<td class=\"num\">{_e(format_bytes(c.activation_bytes))}</td>"
        f"<td class=\"num\">{_e(format_bytes(c.host_bytes))}</td>"
        f"<td class=\"num\">{_e(format_flops(c.recompute_flops))}</td>"
        f"<td class=\"num\">{_e(format_percent(c.recompute_percent))}</td><td>{'yes' if c.fits else 'no'}</td>"
        + (f"<td class=\"num\">{_e(_peak_cell(c.peak))}</td>" if rec.device_name is not None else "")
        + (f"<td class=\"num\">{_e(_time_cell(c.time))}</td>" if timed_any else "") + "</tr>"
        for c in rec.frontier
    )
    if rec.to_name:
        named = "".join(f"<tr><td class=\"num\">{_e(format_bytes(n.bytes))}</td><td>{_e(n.where)}</td>"
                        f"<td>{_e(n.line or '')}</td><td><code>{_e(n.code())}</code></td></tr>" for n in rec.to_name)
        body.append("<h2>Name tensors for finer choices</h2><p>The model names no tensors, so only the presets "
                    "were compared. Name its largest activations where they are made (<code>from jax.ad_checkpoint "
                    "import checkpoint_name</code>), and recommend can save, recompute or offload each:</p>"
                    "<table><thead><tr><th>activation</th><th>where</th><th>line</th><th>add</th></tr></thead>"
                    f"<tbody>{named}</tbody></table>")
    peak_head = "<th>peak per device</th>" if rec.device_name is not None else ""
    peak_head += "<th>s/step (estimate)</th>" if timed_any else ""
    body.append("<h2>Pareto frontier</h2><table><thead><tr><th></th><th>policy</th><th>activation</th><th>host</th>"
                f"<th>recompute</th><th>% of forward</th><th>fits</th>{peak_head}</tr></thead><tbody>{rows}</tbody>"
                "</table>")
    if rec.throughput is not None:
        t = rec.throughput
        paste = None if t.best is None else f"--policy {t.best.policy} -D {t.keyword}={t.best.value}"
        body += throughput_section(t, paste, rec.usable_bytes, "policy")
    return body


def throughput_svg(t: Throughput, usable: int | None, width: int = 1000, height: int = 360) -> str:
    """Peak per device (x) against throughput per GPU (y), every point compiled: the frontier
    joined, the winner a star, points that do not fit hollow, the usable memory a dashed line."""
    shown = [p for p in t.points if p.peak_bytes is not None and p.throughput is not None]
    if not shown:
        return "<p>No point compiled and timed.</p>"
    presets = () if t.synthesis is None else t.synthesis.presets
    left, right, top, bottom = 90, 40, 16, 44
    pw, ph = width - left - right, height - top - bottom
    x_max = max([p.peak_bytes or 0 for p in shown] + [usable or 0, 1])
    y_max = max(max(p.throughput or 0.0 for p in shown), 1e-12)

    def x(v: int) -> float:
        return left + v / x_max * pw

    def y(v: float) -> float:
        return top + (1 - v / y_max) * ph

    out = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="peak per device against {_e(rate_unit(t))}">',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfcfc" stroke="#d5d8dc"/>']
    for i in range(5):
        gx, gy = left + pw * i / 4, top + ph * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        out.append(f'<text x="{gx:.1f}" y="{top + ph + 16}" text-anchor="{anchor}">'
                   f'{_e(format_bytes(round(x_max * i / 4)))}</text>')
        out.append(f'<text x="{left - 6}" y="{gy + 4:.1f}" text-anchor="end">{y_max * (4 - i) / 4:,.4g}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">peak per device →</text>')
    out.append(f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
               f'text-anchor="middle">{_e(rate_unit(t))} →</text>')
    if usable is not None:
        ux = x(usable)
        out.append(f'<line x1="{ux:.1f}" y1="{top}" x2="{ux:.1f}" y2="{top + ph}" stroke="#e67e22" '
                   'stroke-dasharray="5 4" stroke-width="1.5"/>')
    front = t.frontier
    if len(front) > 1:
        path = "".join(f"{'M' if i == 0 else 'L'}{x(p.peak_bytes or 0):.1f},{y(p.throughput or 0):.1f}"
                       for i, p in enumerate(front))
        out.append(f'<path d="{path}" fill="none" stroke="#5d6d7e" stroke-width="1.2"/>')
    for p in sorted(shown, key=lambda p: p == t.best):
        px, py = x(p.peak_bytes or 0), y(p.throughput or 0.0)
        tip = (f"{p.policy}, {t.keyword}={p.value}: {format_bytes(p.peak_bytes or 0)}, {p.throughput:,.4g} "
               f"{rate_unit(t)}{'' if p.fits else ' (does not fit)'}")
        if p == t.best:
            out.append(f'<polygon points="{_star(px, py, 9)}" fill="#f1c40f" stroke="#7d6608">'
                       f"<title>{_e(tip)}</title></polygon>")
        elif p.policy in presets:  # --synthesize: the presets compiled beside the pick, squares
            fill = "#2e86c1" if p.fits else "none"
            out.append(f'<rect x="{px - 4:.1f}" y="{py - 4:.1f}" width="8" height="8" fill="{fill}" '
                       f'stroke="#1b4f72"><title>{_e(tip + " (preset)")}</title></rect>')
        else:
            fill = ("#2c3e50" if p in front else "#85929e") if p.fits else "none"
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{fill}" stroke="#2c3e50">'
                       f"<title>{_e(tip)}</title></circle>")
    out.append("</svg>")
    square = '<span style="color:#1b4f72">■ preset</span>' if presets else ""
    return "\n".join(out) + ('\n<p class="legend"><span>● fits</span><span>○ does not fit</span>'
                             f'{square}<span>─ frontier</span><span style="color:#b7950b">★ fastest that fits</span>'
                             '<span style="color:#e67e22">┊ usable memory</span></p>')


def throughput_section(t: Throughput, paste: str | None, usable: int | None, policy_word: str) -> list[str]:
    """`--maximize throughput`: the winner and what to paste, the plot, and every point compiled."""
    unit = rate_unit(t)
    body = ["<h2>Fastest that fits</h2>",
            f'<p class="meta">{counted(len(t.points), "point")} compiled of at most {t.max_compiles} '
            f"(searched: {_e(', '.join(t.policies))}); step times are estimates from {_e(t.estimator)}, "
            "each point compiled, none interpolated</p>"]
    if t.bounded:
        body.append('<p class="meta">Stopped by --max-compiles: points the search wanted were not compiled.</p>')
    if t.saturated:
        body.append(f'<p class="meta">Stopped climbing before the memory edge (doubling the {_e(t.keyword)} '
                    f"gained under 2%): {_e(', '.join(t.saturated))}</p>")
    if t.best is None or paste is None:
        body.append(f'<div class="miss"><b>No pick:</b> {_e(no_best_words(t))}</div>')
    else:
        b = t.best
        body.append(f'<div class="win"><b>Fastest that fits:</b> <code>{_e(paste)}</code><br>'
                    f"{b.throughput or 0:,.4g} {_e(unit)} · {_e(format_seconds(b.seconds or 0.0))} per step "
                    f"(estimate) · peak {_e(format_bytes(b.peak_bytes or 0))} per device</div>")
    body.append(throughput_svg(t, usable))
    body += _synthesis_html(t)
    rows = [["★" if p == t.best else "", p.policy, str(p.value),
             "n/a" if p.peak_bytes is None else format_bytes(p.peak_bytes), "yes" if p.fits else "no",
             "n/a" if p.seconds is None else format_seconds(p.seconds),
             "n/a" if p.throughput is None else f"{p.throughput:,.4g}", p.error or ""] for p in t.points]
    headers = ["", policy_word, t.keyword, "peak per device", "fits", "s/step (estimate)", unit, "error"]
    if not any(p.error for p in t.points):
        headers, rows = headers[:-1], [r[:-1] for r in rows]
    body.append(_html_table(headers, rows, [False, False, True, True, False, True, True, False][:len(headers)]))
    return body


def _synthesis_html(t: Throughput) -> list[str]:
    """`--synthesize`: the names with their costs, and each proposal against the target's verdict."""
    s = t.synthesis
    if s is None:
        return []
    names = [[n.name, format_bytes(n.bytes), format_flops(n.recompute_flops)] for n in s.names]
    proposals = [[str(p.value), p.policy, format_seconds(p.predicted_seconds),
                  format_bytes(p.predicted_extra_bytes), "fits" if p.fits else "refused"] for p in s.proposals]
    return [f"<h3>Synthesized from {counted(len(s.names), 'checkpoint name')}</h3>",
            f'<p class="meta">{_e(s.solver)}; presets compiled beside the pick: {_e(", ".join(s.presets))}</p>',
            _html_table(["name", "bytes per device", "recompute saved"], names, [False, True, True]),
            _html_table([t.keyword, "proposal", "predicted s/step", "predicted bytes over saving nothing",
                         "the target's verdict"], proposals, [True, False, True, True, False])]


def render_recommend_html(rec: Recommendation) -> str:
    """The recommendation as one self-contained HTML page: the winner (or the closest), how to
    use it, and the frontier with the full analysis of each of its points."""
    report = rec.report
    shown = rec.recommended or rec.closest
    body = [f"<h1>te-ckpt-audit recommend: {_e(rec.target or 'function')}</h1>", _meta(report), *_recommendation(rec)]
    focus = None
    if shown is not None:
        focus = next((r for r in report.results if r.policy == shown.policy), None)
    body += _sections(report, recommendation_points(rec), rec.budget_bytes, focus)
    return _page(f"te-ckpt-audit recommend: {rec.target}", body)


def recommend_html_table(rec: Recommendation) -> str:
    """The recommendation and its frontier table, for a notebook (`_repr_html_`)."""
    return (f"<div><b>te-ckpt-audit recommend: <code>{_e(rec.target or 'function')}</code></b>"
            + "".join(_recommendation(rec)) + "</div>")


OWN_LAYOUT = "the config's"


def maxtext_recommend_html_table(rec: MaxTextRecommendation) -> str:
    """`maxtext --recommend`'s points, and the config lines of the one chosen, for a notebook."""
    rows = "".join(
        f"<tr><td>{'★' if p == rec.chosen else ''}</td><td><code>{_e(p.remat_policy)}</code></td>"
        f"<td class=\"num\">{_e(p.per_device_batch_size)}</td><td>{_e(', '.join(p.layout) or OWN_LAYOUT)}</td>"
        f"<td class=\"num\">{_e(_peak_cell(p.peak))}</td><td>{'yes' if p.fits else 'no'}</td></tr>"
        for p in rec.tried
    )
    lines = f"<pre>{_lines(rec.config_lines())}</pre>" if rec.chosen is not None else "<p>Nothing tried fits.</p>"
    fastest = ""
    if rec.throughput is not None:
        usable = rec.gpu.usable_bytes if rec.gpu is not None else None if rec.tpu is None else rec.tpu.usable_bytes
        fastest = "".join(throughput_section(rec.throughput, rec.settings(), usable, "remat_policy"))
    return (f"<div><b>te-ckpt-audit maxtext --recommend: <code>{_e(rec.target)}</code></b>{lines}"
            "<table><thead><tr><th></th><th>remat_policy</th><th>per-device batch</th><th>layout</th>"
            f"<th>peak per device</th><th>fits</th></tr></thead><tbody>{rows}</tbody></table>{fastest}</div>")
