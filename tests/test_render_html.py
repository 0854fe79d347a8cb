"""The HTML report: one self-contained file (inline SVG, no script, no URL), holding the frontier
plot, the producer bars, the residuals by module path and the per-equation marks."""

from __future__ import annotations

import dataclasses
import functools
import html
import html.parser
import re

import pytest

from sample_models import eight_names, mlp, te_transformer
from te_ckpt_audit import AuditReport, Recommendation, Session, audit, recommend
from te_ckpt_audit.records import Category
from te_ckpt_audit.render import format_bytes, render_audit_html, render_recommend_html
from te_ckpt_audit.render.html import COLOURS, PRODUCER_WORDS
from te_ckpt_audit.trace._trace import trace

# wbr: a line-break opportunity, void in HTML
VOID = {"meta", "br", "line", "rect", "circle", "polygon", "path", "img", "hr", "input", "link", "wbr"}


@functools.cache
def audit_report() -> AuditReport:
    return audit(te_transformer.loss, *te_transformer.loss_inputs())


@functools.cache
def recommendation() -> Recommendation:
    return recommend(Session(trace(eight_names.loss, eight_names.loss_inputs(layers=4), "eight_names:loss")), 3328)


class _Structure(html.parser.HTMLParser):
    """Tags open and close in order (SVG shapes may close themselves); counts every tag."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.count: dict[str, int] = {}
        self.errors: list[str] = []
        self.svg_text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.count[tag] = self.count.get(tag, 0) + 1
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.count[tag] = self.count.get(tag, 0) + 1

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if "svg" in self.stack and "title" in self.stack:
            self.svg_text.append(data)


def _parse(page: str) -> _Structure:
    p = _Structure()
    p.feed(page)
    p.close()
    return p


def _pages() -> list[tuple[str, str]]:
    return [("audit", render_audit_html(audit_report())), ("recommend", render_recommend_html(recommendation()))]


@pytest.mark.parametrize("which", ["audit", "recommend"])
def test_one_self_contained_file(which: str) -> None:
    page = dict(_pages())[which]
    assert page.startswith("<!DOCTYPE html>\n") and page.endswith("</html>\n")
    assert page.count("<html") == 1 and page.count("<body") == 1
    assert not re.search(r"https?://", page)  # no network, no CDN: inline SVG needs no xmlns either
    for banned in ("<script", "<link", "<iframe", "<img", "@import", "src=", "url("):
        assert banned not in page
    parsed = _parse(page)
    assert parsed.errors == [] and parsed.stack == []
    assert parsed.count["svg"] == 2  # the frontier plot and the producer bars
    assert parsed.count["style"] == 1


def test_audit_page_sections_follow_the_report() -> None:
    report = audit_report()
    page = render_audit_html(report)
    for heading in ("Frontier: activation bytes against recompute", "Activation bytes by producer",
                    "Largest residuals by source line (top 15)", "Per-equation marks"):  # the sample has no modules
        assert f"<h2>{heading}</h2>" in page
    marks = page[page.index("<h2>Per-equation marks</h2>"):]
    assert marks.count("<tr>") == len(report.equations) + 1  # a row per equation, and the header
    # a bar segment per producer that keeps bytes, each titled with its exact size
    bars = page[page.index("<h2>Activation bytes by producer</h2>"):page.index("<h2>Largest residuals")]
    for cat, field in [(Category.TE_GEMM, "te_gemm_bytes"), (Category.DOT, "dot_bytes"),
                       (Category.NAMED, "named_bytes"), (Category.OTHER, "other_bytes")]:
        kept = [getattr(r.totals, field) for r in report.results if getattr(r.totals, field)]
        assert bars.count(f'fill="{COLOURS[cat]}"') == len(kept)
        for b in kept:
            assert f"<title>{PRODUCER_WORDS[cat]}: {format_bytes(b)}</title>" in bars
    assert sum(1 for r in report.results if r.totals.te_gemm_bytes) >= 1


def test_recommend_page_shows_winner_snippet_and_frontier() -> None:
    rec = recommendation()
    page = render_recommend_html(rec)
    assert "<b>Recommended:</b> <code>--policy save_only_these_names:layer1,layer2</code>" in page
    assert "save_only_these_names(&quot;layer1&quot;, &quot;layer2&quot;)" in page
    assert "MaxText remat settings" not in page  # eight_names is no MaxText model
    frontier = page[page.index("<h2>Pareto frontier</h2>"):page.index("<h2>Frontier:")]
    assert frontier.count("<tr>") == len(rec.frontier) + 1
    assert page.count("<polygon") == 1  # the winner's star
    assert "budget 3.25 KiB" in page


def test_points_at_one_place_share_one_label_and_the_legend_shows_what_is_drawn() -> None:
    report = audit_report()
    none, everything = report.result("none"), report.result("everything_saveable")
    assert (none.totals.activation_bytes, none.recompute_flops) == (
        everything.totals.activation_bytes, everything.recompute_flops)
    page = render_audit_html(report)
    plot = page[page.index("<h2>Frontier:"):page.index("<h2>Activation bytes by producer")]
    assert ">none = everything_saveable<" in plot and ">none<" not in plot
    assert "■ preset" in plot and "● on the frontier" not in plot  # every point here is a preset's square
    assert "─ frontier" in plot


def test_the_modules_table_numbers_its_policy_columns_and_can_wrap_its_paths() -> None:
    report = audit_report()
    page = render_audit_html(report)
    table = page[page.index("<h2>Largest residuals by"):page.index("<h2>Per-equation marks")]
    for i, r in enumerate(report.results):
        assert f'<th class="num" title="{r.policy}">{i + 1}</th>' in table
        assert f"<b>{i + 1}</b> <code>{r.policy}</code>" in table
    assert 'class="scroll"' not in table and "<wbr>" in table


def test_a_notebook_shows_the_policy_table() -> None:
    report = audit_report()
    shown = report._repr_html_()
    assert shown.startswith("<div>") and "<!DOCTYPE" not in shown and "<style" not in shown
    parsed = _parse(shown)
    assert parsed.errors == [] and parsed.stack == []
    for r in report.results:
        assert f"<td><code>{r.policy}</code></td><td class=\"num\">{format_bytes(r.totals.activation_bytes)}</td>" \
            in shown
    rec = recommendation()
    assert "<b>Recommended:</b> <code>--policy save_only_these_names:layer1,layer2</code>" in rec._repr_html_()
    assert _parse(rec._repr_html_()).errors == []


def test_print_of_a_recommendation_is_its_text_and_a_maxtext_one_shows_its_config_lines() -> None:
    from te_ckpt_audit.records import MaxTextPoint, MaxTextRecommendation, PeakMemory
    from te_ckpt_audit.render import render_maxtext_recommend_text, render_recommend_text

    rec = recommendation()
    assert str(rec) == render_recommend_text(rec) and "\n" not in repr(rec)
    peak = PeakMemory(2**30, 2**30, 2**29, 0, 0, 2**29, True, False, None, 1.0)
    chosen = MaxTextPoint("minimal", "4", peak, ("ici_fsdp_parallelism=8",))
    found = MaxTextRecommendation("maxtext c.yml", chosen, (chosen,), None)
    assert str(found) == render_maxtext_recommend_text(found)
    shown = found._repr_html_()
    assert _parse(shown).errors == [] and "remat_policy: &#x27;minimal&#x27;" in shown
    assert "ici_fsdp_parallelism: 8" in shown and shown.count("<tr>") == 2


# --- issue 41, item 1: every format shows every finding ---------------------------------------------

def _one_of_each_finding(policy: str) -> list[object]:
    from te_ckpt_audit.records import findings as f

    made = [
        f.TeGemmsRecomputed(policy, ("te_gemm_1",), 10), f.SameAsNothingSaveable(policy),
        f.UnknownName(policy, "hiden", "hidden", ("hidden",)), f.SavesEverything(policy), f.OffloadMissing(policy),
        f.InnerScopeWithoutCheckpoints(policy), f.Remat3(policy),
        f.TeRequantized(policy, ("quantize_1",), 5, ("mlp",), ("quantization",), None, False, 1),
        f.GemmBatchDimsMissed(policy, ("dot_general_1",), 7, ("mlp",), ("vmap",)),
        f.InputsReplicated("data=8", ("data",)),  # the audit's own: shown in the report's findings
        f.Remat3ChangesPolicy(policy, ("te_gemm_1", "dot_1"), 2048, 0, ("te_gemm_1",)),
    ]
    assert {type(w) for w in made} == set(f.WARNINGS)  # a new kind of finding is added here too
    return made


def test_every_format_shows_every_finding() -> None:
    from te_ckpt_audit.render import render_json, render_markdown, render_table

    report = audit(mlp.loss, *mlp.loss_inputs(), policies=["nothing_saveable"], params=0)
    row = report.results[0]
    made = tuple(_one_of_each_finding(row.policy))
    own = tuple(w for w in made if not w.policy)
    shown = dataclasses.replace(report, findings=own, results=(dataclasses.replace(
        row, warnings=tuple(w for w in made if w.policy)),))
    for name, text in (("html", render_audit_html(shown)), ("markdown", render_markdown(shown)),
                       ("terminal", " ".join(render_table(shown).split())), ("json", render_json(shown))):
        for w in made:
            assert w.code.value in text, (name, w.code.value)
    assert "<h2>Warnings (11)</h2>" in render_audit_html(shown)
    assert "<h2>Warnings</h2><p>None.</p>" in render_audit_html(report)


def test_the_html_policy_table_has_an_error_column_only_where_a_policy_failed() -> None:
    report = audit(mlp.loss, *mlp.loss_inputs(), policies=["nothing_saveable"], params=0)
    assert "<th>error</th>" not in render_audit_html(report)
    row = report.results[0]
    failed = dataclasses.replace(report, results=(row, dataclasses.replace(row, policy="broken", error="it broke")))
    page = render_audit_html(failed)
    assert "<th>error</th>" in page and "it broke" in page


def test_the_recommend_frontier_keeps_each_spec_on_its_figures_line() -> None:
    """Issue 41, item 6: at the default width every frontier line holds its figures and its spec."""
    from te_ckpt_audit.render import render_recommend_text

    rec = recommendation()
    lines = render_recommend_text(rec).splitlines()
    start = lines.index("Pareto frontier (activation bytes vs recompute FLOPs, every point analysed):")
    for c in rec.frontier:
        assert any(c.policy in line and format_bytes(c.activation_bytes) in line for line in lines[start:]), c.policy
    assert max(len(line) for line in render_recommend_text(rec, width=60).splitlines()[start:start + 4]) <= 80


def test_the_html_header_counts_the_arguments_names_the_largest_and_folds_the_rest() -> None:
    """Issue 41, item 2: not every argument path before anything a reader came for."""
    report = audit_report()
    page = render_audit_html(report)
    head = page[page.index("<h1>"):page.index("<h2>")]
    assert f"{len(report.arguments)} arguments" in head and "<details><summary>all" in head
    shown = head[head.index("the largest:"):head.index("</p>")]
    assert sum(a in html.unescape(shown) for a in report.arguments) == 3


def test_the_html_hotspots_follow_top_and_by_and_say_what_their_rows_are() -> None:
    """Issue 41, item 4: one heading that says what the rows are, and --top/--by as elsewhere."""
    from te_ckpt_audit.records import HotspotKey

    report = audit_report()
    page = render_audit_html(report, top=4, by=HotspotKey.LINE)
    assert "<h2>Largest residuals by source line (top 4)</h2>" in page
    table = page[page.index("(top 4)</h2>"):]
    table = table[:table.index("</table>")]
    assert table.count('<td class="path">') == 4
    assert "Largest residuals by module path (else line) (top 15)" in render_audit_html(report, by=HotspotKey.MODULE)
    assert "Largest residuals" not in render_audit_html(report, top=0)
