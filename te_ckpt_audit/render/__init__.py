"""Renderers: pure functions from records to text, one module per format. They import the records
(`te_ckpt_audit.records`) and nothing else of the library; the command line only picks one.

- `terminal`: Rich tables (`render_table`, `render_check_table`)
- `json_doc`: the audit's JSON (`render_json`)
- `markdown`: a CI summary (`render_markdown`)
- `check`: the gate's summary in every format, GitHub annotations included
- `recommend`: the recommendation as text and JSON, with its Python and MaxText settings
- `plot`, `html`: the frontier plot (Unicode and SVG), and one self-contained HTML page
- `_common`: what they share (units, columns, hotspots, the words for warnings)
"""

from __future__ import annotations

from ..records import AuditReport, MaxTextRecommendation, Recommendation
from ..records._display import shown_by
from ._common import format_bytes, format_flops, format_percent, hotspots, policy_errors, warning_message
from ._text import printable, printable_records
from .check import (
    render_audit_check_markdown,
    render_check_github,
    render_check_json,
    render_check_markdown,
    violation_message,
)
from .html import (
    audit_html_table,
    maxtext_recommend_html_table,
    recommend_html_table,
    render_audit_html,
    render_recommend_html,
)
from .json_doc import render_json
from .markdown import render_markdown
from .recommend import (
    maxtext_config,
    python_snippet,
    render_maxtext_recommend_json,
    render_maxtext_recommend_text,
    render_recommend_json,
    render_recommend_text,
)
from .terminal import TableView, render_check_table, render_table


def text_of(record: object) -> str:
    """What `print(record)` shows: the table the command line prints (as wide as it needs)."""
    if isinstance(record, AuditReport):
        return render_table(record, TableView(width=None))
    if isinstance(record, Recommendation):
        return render_recommend_text(record)
    if isinstance(record, MaxTextRecommendation):
        return render_maxtext_recommend_text(record)
    raise TypeError(f"no table for {type(record).__name__}")


def html_of(record: object) -> str:
    """What a notebook shows for `record`: the HTML report's table."""
    if isinstance(record, AuditReport):
        return audit_html_table(record)
    if isinstance(record, Recommendation):
        return recommend_html_table(record)
    if isinstance(record, MaxTextRecommendation):
        return maxtext_recommend_html_table(record)
    raise TypeError(f"no HTML table for {type(record).__name__}")


shown_by(text_of, html_of)  # print(report) and a notebook's view, without the records importing us

__all__ = [
    "TableView",
    "audit_html_table",
    "html_of",
    "maxtext_recommend_html_table",
    "recommend_html_table",
    "text_of",
    "format_bytes",
    "format_flops",
    "format_percent",
    "hotspots",
    "maxtext_config",
    "policy_errors",
    "printable",
    "printable_records",
    "python_snippet",
    "render_audit_check_markdown",
    "render_audit_html",
    "render_check_github",
    "render_check_json",
    "render_check_markdown",
    "render_check_table",
    "render_json",
    "render_markdown",
    "render_recommend_html",
    "render_maxtext_recommend_json",
    "render_maxtext_recommend_text",
    "render_recommend_json",
    "render_recommend_text",
    "render_table",
    "violation_message",
    "warning_message",
]
