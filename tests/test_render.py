"""Renderers against golden data, the JSON schema, and the figures every output shares.

The golden report comes from `tiny` below, traced with the repository root as the current folder,
so its source locations read `tests/test_render.py:LINE`: moving `tiny` changes the golden files.
Regenerate them with `UPDATE_GOLDEN=1 python -m pytest tests/test_render.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

from te_ckpt_audit import SCHEMA, AuditReport, Outcome, audit
from te_ckpt_audit.records import JSON_SCHEMA
from te_ckpt_audit.render import (
    TableView,
    format_bytes,
    format_flops,
    hotspots,
    render_json,
    render_markdown,
    render_table,
)
from te_ckpt_audit.render._common import COLUMNS, MARK_SYMBOLS, marks_by_equation

# `tiny` is on line 36 and its body on 37-38: the goldens hold these source lines.

def tiny(w: jax.Array, x: jax.Array) -> jax.Array:
    h = checkpoint_name(jnp.sin(x @ w), "hidden")
    return jnp.sum(jnp.cos(h) @ w)


ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden"
POLICIES = ["none", "nothing_saveable", "checkpoint_dots", "save_only_these_names:hidden"]


def tiny_report() -> AuditReport:
    w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        report = audit(tiny, w, x, policies=POLICIES)
    finally:
        os.chdir(here)
    return dataclasses.replace(report, jax_version="0.0.0")  # golden data outlives a jax upgrade


@pytest.fixture(scope="module")
def report() -> AuditReport:
    return tiny_report()


# --- golden data ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "render"),
    [
        ("tiny.json", render_json),
        ("tiny.md", render_markdown),
        ("tiny.txt", lambda r: render_table(r, TableView(top=5, equations=True, width=80))),
    ],
)
def test_golden(report: AuditReport, name: str, render: Any) -> None:
    text = render(report)
    if os.environ.get("UPDATE_GOLDEN"):  # a rewritten golden is never compared with itself
        (GOLDEN / name).write_text(text, encoding="utf-8")
        pytest.fail(f"rewrote tests/golden/{name}: review its diff, then run again without UPDATE_GOLDEN")
    assert text == (GOLDEN / name).read_text(encoding="utf-8")


def test_json_is_the_data_model_and_deterministic(report: AuditReport) -> None:
    text = render_json(report)
    doc = json.loads(text)
    hot = doc.pop("hotspots")
    assert doc == report.to_dict()
    assert hot["by"] == "line"
    assert hot["rows"] == [json.loads(json.dumps(dataclasses.asdict(h))) for h in hotspots(report, 10)]
    assert render_json(tiny_report()) == text  # a second trace gives the same bytes


def test_table_fits_its_width_without_colour(report: AuditReport) -> None:
    for width in (80, 120):
        text = render_table(report, TableView(top=10, equations=True, width=width))
        assert max(len(line) for line in text.splitlines()) <= width
        assert "\x1b[" not in text
    assert "\x1b[" in render_table(report, TableView(color=True))


def test_host_column_only_where_something_is_offloaded() -> None:
    """Issue 56, item 5: at 80 columns the first table folded policy names to make room for a "host"
    column of 0 B on every row; the terminal shows it only where a policy offloads (the Markdown,
    HTML and JSON keep it), and a TE policy name of 28 characters stays on its line."""
    w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    kept = audit(tiny, w, x, policies=["none", "checkpoint_dots_and_te_gemms"])
    text = render_table(kept, TableView(width=80))
    first = text.split("Kept for the backward pass")[1].split("\n\n")[0]
    assert " host " not in first and "| host |" in render_markdown(kept)
    assert any(line.split()[1:2] == ["checkpoint_dots_and_te_gemms"] for line in first.splitlines())
    offloads = audit(tiny, w, x, policies=["none", "save_and_offload_only_these_names:offload=hidden"])
    assert offloads.results[1].totals.host_bytes == 4 * 8 * 4
    assert " host " in render_table(offloads, TableView(width=80)).split("Kept for the backward pass")[1]


def test_the_longest_te_policy_name_stays_on_its_line_at_80_columns() -> None:
    """Issue 56, item 5: `dots_and_te_gemms_with_no_batch_dims` (36 characters) still folded at 80
    columns. Where every policy keeps the same argument bytes (the inputs the backward pass reads),
    the terminal says it once under the first table instead of a column of one figure; where they
    differ, the column stays; the Markdown, HTML and JSON keep it always."""
    w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    both = audit(tiny, w, x, policies=["checkpoint_dots", "dots_and_te_gemms_with_no_batch_dims"])
    assert len({r.totals.argument_bytes for r in both.results}) == 1
    first = render_table(both, TableView(width=80)).split("Kept for the backward pass")[1].split("\n\n")[0]
    assert any(line.split()[1:2] == ["dots_and_te_gemms_with_no_batch_dims"] for line in first.splitlines())
    assert " arguments " not in first.splitlines()[2]  # the header row
    kept = format_bytes(both.results[0].totals.argument_bytes)
    assert f"arguments: {kept} kept by every policy" in first and "| arguments |" in render_markdown(both)

    def sine_first(w: jax.Array, x: jax.Array) -> jax.Array:  # saving sin(x) leaves x unread by the backward
        return jnp.sum(jnp.sin(x) @ w)

    differ = audit(sine_first, w, x, policies=["nothing_saveable", "everything_saveable"])
    assert len({r.totals.argument_bytes for r in differ.results}) == 2
    first = render_table(differ, TableView(width=80)).split("Kept for the backward pass")[1].split("\n\n")[0]
    assert " arguments " in first and "kept by every policy" not in first


# --- the schema ---------------------------------------------------------------------------------


class SchemaError(AssertionError):
    pass


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(doc: Any, schema: dict[str, Any], path: str = "$") -> None:
    """The subset of JSON Schema that JSON_SCHEMA uses; an unknown keyword fails, never passes."""

    def check(ok: bool, why: str) -> None:
        if not ok:
            raise SchemaError(f"{path}: {why}")

    for key, rule in schema.items():
        if key in ("$schema", "$id", "title"):
            continue
        if key == "type":
            types = rule if isinstance(rule, list) else [rule]
            check(any(_TYPES[t](doc) for t in types), f"not {rule}: {doc!r}")
        elif key == "const":
            check(doc == rule, f"{doc!r} is not {rule!r}")
        elif key == "enum":
            check(doc in rule, f"{doc!r} not in {rule}")
        elif key == "minimum":
            check(doc >= rule, f"{doc!r} < {rule}")
        elif key == "required":
            check(not set(rule) - set(doc), f"missing {sorted(set(rule) - set(doc))}")
        elif key == "additionalProperties":
            extra = set(doc) - set(schema["properties"])
            check(rule is False and not extra, f"unexpected {sorted(extra)}")
        elif key == "properties":
            for name, sub in rule.items():
                if name in doc:
                    validate(doc[name], sub, f"{path}.{name}")
        elif key == "items":
            for i, item in enumerate(doc):
                validate(item, rule, f"{path}[{i}]")
        elif key == "oneOf":
            passed = 0
            for sub in rule:
                try:
                    validate(doc, sub, path)
                    passed += 1
                except SchemaError:
                    pass
            check(passed == 1, f"matches {passed} of oneOf")
        else:
            raise SchemaError(f"the test validator does not know {key!r}")


def test_json_validates_against_the_schema(report: AuditReport) -> None:
    doc = json.loads(render_json(report))
    assert doc["schema"] == SCHEMA == JSON_SCHEMA["$id"]
    validate(doc, JSON_SCHEMA)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda d: d.update(extra=1),
        lambda d: d.pop("target"),
        lambda d: d.update(schema="te-ckpt-audit/1"),  # the shape before module, frame, error, hotspots
        lambda d: d["results"][0]["totals"].update(activation_bytes=-1),
        lambda d: d["results"][0]["marks"][0].update(outcome="KEPT"),
        lambda d: d["equations"][0].update(source={"file": "x.py"}),
        lambda d: d["results"][0]["residuals"][0].update(bytes=True),
    ],
)
def test_schema_rejects_a_spoiled_document(report: AuditReport, spoil: Any) -> None:
    doc = json.loads(render_json(report))
    spoil(doc)
    with pytest.raises(SchemaError):
        validate(doc, JSON_SCHEMA)


def test_schema_is_valid_json_schema(report: AuditReport) -> None:
    import jsonschema  # a test extra, so this cross-check runs in CI rather than skipping
    jsonschema.Draft202012Validator.check_schema(JSON_SCHEMA)
    jsonschema.validate(json.loads(render_json(report)), JSON_SCHEMA, cls=jsonschema.Draft202012Validator)


# --- shared figures -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (999, "999 B"), (1024, "1 KiB"), (50176, "49 KiB"), (836923, "817 KiB"), (3 << 30, "3 GiB")],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0 FLOP"), (1_200_000_000, "1.2 GFLOP"), (7_440_627, "7.44 MFLOP")]
)
def test_format_flops(n: int, text: str) -> None:
    assert format_flops(n) == text


def test_hotspots_add_up_to_activation_and_host_bytes(report: AuditReport) -> None:
    spots = hotspots(report, top=10**6)
    for i, result in enumerate(report.results):
        kept = sum(s.bytes_by_policy[i] for s in spots)
        assert kept == result.totals.activation_bytes + result.totals.host_bytes
    assert [s.most for s in spots] == sorted((s.most for s in spots), reverse=True)
    assert hotspots(report, top=1) == spots[:1]
    assert all(s.kept_by == tuple(i + 1 for i, b in enumerate(s.bytes_by_policy) if b) for s in spots)


def test_marks_that_differ_come_first(report: AuditReport) -> None:
    rows = marks_by_equation(report)
    differ = [len(set(outcomes)) > 1 for _, outcomes in rows]
    assert differ == sorted(differ, reverse=True)
    assert sorted(e.id for e, _ in rows) == sorted(e.id for e in report.equations)
    for equation, outcomes in rows:
        assert outcomes == tuple(r.mark(equation.id).outcome for r in report.results)


def test_every_outcome_has_a_mark_symbol() -> None:
    assert set(MARK_SYMBOLS) == set(Outcome)
    assert len(set(MARK_SYMBOLS.values())) == len(Outcome)


def test_markdown_tables_have_every_column_and_policy(report: AuditReport) -> None:
    lines = render_markdown(report).splitlines()
    header = next(line for line in lines if line.startswith("| # | policy | scope"))  # numbered: "kept by #"
    from te_ckpt_audit.render._common import GPU_HEADERS, PER_DEVICE, QUANTIZATION_HEADERS  # the goldens hold lines

    # XLA columns only with --compile, 'per device' only on a mesh, the GPU's table only with --gpu,
    # quantization only where the model quantizes
    without_xla = [h for h in COLUMNS if not h.startswith("XLA") and h != PER_DEVICE
                   and (h not in GPU_HEADERS or h == "activation") and h not in QUANTIZATION_HEADERS]
    assert header.count("|") == len(without_xla) + 2
    start = lines.index(header)
    body = [line for line in lines[start + 2 :] if line.startswith("| ")]
    numbered = [tuple(row.split(" | ")[:2]) for row in body[: len(report.results)]]
    assert numbered == [(f"| {i}", r.policy) for i, r in enumerate(report.results, 1)]


def test_the_check_table_takes_the_width_its_names_need() -> None:
    """Issue 41, item 6: piped, with -o or at any COLUMNS, a long target or spec is never split."""
    import dataclasses

    from sample_models import mlp
    from te_ckpt_audit import audit
    from te_ckpt_audit.gating import check
    from te_ckpt_audit.render import render_check_table

    spec = "save_only_these_names:fc1,fc2+checkpoint_dots_with_no_batch_dims"
    report = audit(mlp.loss, *mlp.loss_inputs(), policies=["nothing_saveable", spec], params=0)
    target = "a/very/long/path/to/some/deeply/nested/project/models/transformer_with_a_long_name.py:loss_function"
    report = dataclasses.replace(report, target=target)
    lines = render_check_table([(report, check(report))]).splitlines()
    assert any(line.startswith(target + " ") for line in lines) and any(spec in line for line in lines)
    assert all(line == line.rstrip() for line in lines)
    narrow = render_check_table([(report, check(report))], width=80)
    assert max(len(line) for line in narrow.splitlines()) <= 80  # a width given is kept


def test_a_markdown_code_span_in_a_table_keeps_its_angle_brackets() -> None:
    """Issue 46, item 14: code spans showed `&lt;` (a code span shows entities as written)."""
    from te_ckpt_audit.render.markdown import md_code, md_row

    assert md_row([md_code("jit(step)/<lambda>|x"), "a<b"]) == "| `jit(step)/<lambda>\\|x` | a&lt;b |"
