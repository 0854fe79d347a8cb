"""The frontier plot: activation bytes (x) against recompute FLOPs (y), as a Unicode scatter for
the terminal. Pure functions of the records; the HTML report draws the same points as SVG.

Presets are letters (named in the legend), the frontier's other points `●`, every other point
analysed `·`, the winner `★`, and the budget a dotted vertical line `┊`.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Sequence

from ..records import AuditReport, CandidateKind, Recommendation
from ._common import format_bytes, format_flops, winner_policy


@dataclasses.dataclass(frozen=True, slots=True)
class PlotPoint:
    label: str  # the policy spec
    activation_bytes: int
    recompute_flops: int
    preset: bool  # a named policy: labelled in the plot
    frontier: bool
    winner: bool
    fits: bool
    rank: int | None = None  # where a named policy stands in the frontier's order (letters follow it)


def recommendation_points(rec: Recommendation) -> tuple[PlotPoint, ...]:
    """Every candidate analysed, the frontier and the winner marked."""
    front = set(rec.frontier)
    order = {p: i for i, p in enumerate(rec.presets)}
    return tuple(
        PlotPoint(c.policy, c.activation_bytes, c.recompute_flops, c.kind is CandidateKind.PRESET,
                  c in front, c.policy == winner_policy(rec), c.fits, order.get(c.policy))
        for c in rec.evaluated if c.error is None
    )


def report_points(report: AuditReport) -> tuple[PlotPoint, ...]:
    """An audit's policies as points: each is labelled (they are what the user asked for)."""
    ok = [r for r in report.results if r.error is None]
    # the frontier: no other policy keeps fewer bytes with less recompute (ties: fewer host bytes,
    # then the spec), as `recommend` ranks its candidates
    ranked = sorted(ok, key=lambda r: (r.totals.activation_bytes, r.recompute_flops, r.totals.host_bytes,
                                       r.totals.activation_bytes, 0, r.policy))
    front: set[str] = set()
    best: int | None = None
    for r in ranked:
        if best is None or r.recompute_flops < best:
            front.add(r.policy)
            best = r.recompute_flops
    return tuple(
        PlotPoint(r.policy, r.totals.activation_bytes, r.recompute_flops, True, r.policy in front, False, True, i)
        for i, r in enumerate(ok)
    )


def _letters(points: Sequence[PlotPoint]) -> dict[str, str]:
    """A letter per labelled point, in their order (the frontier's for presets, the report's for an
    audit's policies), the others after them by name."""
    order = {p.label: p.rank for p in points if p.rank is not None}
    labels = sorted({p.label for p in points if p.preset}, key=lambda s: (order.get(s, len(points)), s))
    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits
    return {label: alphabet[i] if i < len(alphabet) else "?" for i, label in enumerate(labels)}


def render_plot(points: Sequence[PlotPoint], budget: int | None = None, width: int = 80, height: int = 14) -> str:
    """The scatter, `width` columns at most (80 by default), with its legend below."""
    if not points:
        return "(nothing to plot)"
    letters = _letters(points)
    y_labels = [format_flops(max(p.recompute_flops for p in points)), format_flops(0)]
    gutter = max(len(s) for s in y_labels) + 1
    cols = max(10, width - gutter - 2)
    x_max = max([p.activation_bytes for p in points] + [budget or 0, 1])
    y_max = max(max(p.recompute_flops for p in points), 1)

    def col(x: int) -> int:
        return min(cols - 1, round(x / x_max * (cols - 1)))

    def row(y: int) -> int:
        return min(height - 1, round((1 - y / y_max) * (height - 1)))

    grid = [[" "] * cols for _ in range(height)]
    if budget is not None and budget <= x_max:
        for r in range(height):
            grid[r][col(budget)] = "┊"
    rank = {"·": 0, "●": 1}  # letters and the star win a shared cell
    under: dict[str, str] = {}  # a letter hidden by another point in its cell -> what hides it
    for p in sorted(points, key=lambda p: (p.winner, p.preset, p.frontier)):
        mark = "★" if p.winner else letters[p.label] if p.preset else "●" if p.frontier else "·"
        r, c = row(p.recompute_flops), col(p.activation_bytes)
        old = grid[r][c]
        if rank.get(old, 0 if old in " ┊" else 2) <= rank.get(mark, 2) or p.winner:
            grid[r][c] = mark
            if old not in " ┊·●":
                under[old] = mark
    for hidden, top in list(under.items()):
        while top in under:
            top = under[top]
        under[hidden] = top
    lines = []
    for r in range(height):
        label = y_labels[0] if r == 0 else y_labels[1] if r == height - 1 else ""
        lines.append(f"{label:>{gutter - 1}} │" + "".join(grid[r]).rstrip())
    lines.append(" " * (gutter - 1) + " └" + "─" * cols)
    left, right = format_bytes(0), format_bytes(x_max)
    lines.append(" " * (gutter + 1) + left + right.rjust(cols - len(left)))
    lines.append(" " * (gutter + 1) + "activation bytes →   ↑ recompute FLOPs"
                 + (f"   ┊ budget {format_bytes(budget)}" if budget is not None else ""))
    winners = {p.label for p in points if p.winner}
    legend = [f"{letter} {label}" + (" (★)" if label in winners else f" (under {under[letter]})"
                                     if letter in under else "")
              for label, letter in letters.items()]
    legend += ["★ recommended", "● frontier", "· other analysed"]
    line = ""
    for item in legend:
        if line and len(line) + 3 + len(item) > width:
            lines.append(line)
            line = ""
        line = f"{line}   {item}" if line else f"  {item}"
    if line:
        lines.append(line)
    return "\n".join(lines)


def render_frontier_plot(rec: Recommendation, width: int = 80) -> str:
    return render_plot(recommendation_points(rec), rec.budget_bytes, width)
