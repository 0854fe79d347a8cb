"""MkDocs hook: the reference pages' generated parts, made from the code at build time, so the
docs cannot drift from it. A page holds one as a block, `<!-- gen: NAME -->` ... `<!-- /gen -->`,
whose text is also committed, so that a reader of the repository sees it (`regenerate` rewrites
the blocks; tests/test_docs.py fails when a committed block is not what the code makes):

- `cli`: every command's `--help`, as the command line prints it;
- `policies`: every policy spec `--policy` understands (the registry's);
- `gpus`: the GPU catalog `--gpu` compiles for;
- `exit-codes`: the command line's exit codes;
- `config`: the [tool.te-ckpt-audit] keys (te_ckpt_audit.config's documentation);
- `json`: the audit document's fields (the JSON Schema the tests validate against);
- `schemas`: every schema id written, with its history.
"""

from __future__ import annotations

import json
import re
from typing import Any

GEN = re.compile(r"^<!-- gen: ([a-z-]+) -->\n(.*?)^<!-- /gen -->$", re.MULTILINE | re.DOTALL)


def _cli() -> str:
    from te_ckpt_audit_cli.app import app
    from typer.main import get_command
    from typer.testing import CliRunner

    runner = CliRunner()
    parts = []
    for argv in [[], *[[name] for name in get_command(app).commands]]:  # type: ignore[attr-defined]
        shown = runner.invoke(app, [*argv, "--help"], env={"COLUMNS": "100"}, prog_name="te-ckpt-audit")
        title = " ".join(["te-ckpt-audit", *argv])
        parts.append(f"## `{title}`\n\n```text\n{shown.stdout.rstrip()}\n```\n")
    return "\n".join(parts)


def _policies() -> str:
    from te_ckpt_audit.specs import available_policies

    rows = [f"| `{spec}` | {text} |" for spec, text in available_policies()]
    return "\n".join(["| spec | what it saves |", "|---|---|", *rows])


def _gpus() -> str:
    from te_ckpt_audit.gpus import ALIASES, CATALOG

    rows = []
    for name, m in CATALOG.items():
        also = ", ".join(f"`{a}`" for a, n in ALIASES.items() if n == name)
        rows.append(f"| `{name}` | {also} | sm_{m.compute_capability[0]}{m.compute_capability[1]} | {m.sms} | "
                    f"{m.memory_bytes / 2**30:.1f} GiB | {m.bandwidth / 1e12:.2f} TB/s | {m.description} |")
    return "\n".join(["| name | also | arch | SMs | memory | bandwidth | model |", "|---|---|---|---|---|---|---|",
                      *rows])


def _exit_codes() -> str:
    import inspect

    from te_ckpt_audit_cli import exit_codes

    said = dict(re.findall(r"^\s+([A-Z_]+) = \d+\s+# (.*)$", inspect.getsource(exit_codes.ExitCode), re.MULTILINE))
    said.setdefault("OK", "every check passed (or none was asked for)")
    rows = [f"| {c.value} | `{c.name}` | {said.get(c.name, '')} |" for c in exit_codes.ExitCode]
    return "\n".join(["| code | name | meaning |", "|---|---|---|", *rows])


def _config() -> str:
    from te_ckpt_audit import config

    return (config.__doc__ or "").strip()


def _type(schema: dict[str, Any]) -> str:
    if "type" in schema:
        t = schema["type"]
        return " or ".join(t) if isinstance(t, list) else str(t)
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " or ".join(_type(s) for s in schema[key])
    return "object" if "properties" in schema else "any"


def _fields(schema: dict[str, Any], prefix: str = "") -> list[str]:
    rows = []
    for name, sub in schema.get("properties", {}).items():
        rows.append(f"| `{prefix}{name}` | {_type(sub)} |")
        items = sub.get("items", {}) if sub.get("type") == "array" else {}
        if prefix == "" and "properties" in items:
            rows += _fields(items, f"{prefix}{name}[].")
    return rows


def _json() -> str:
    from te_ckpt_audit.records.json_schema import JSON_SCHEMA

    body = json.dumps(JSON_SCHEMA, indent=2)
    return "\n".join(["| field | type |", "|---|---|", *_fields(JSON_SCHEMA), "",
                      '??? note "The whole JSON Schema (draft 2020-12)"', "",
                      "    ```json", *("    " + line for line in body.splitlines()), "    ```"])


def _schemas() -> str:
    import inspect

    from te_ckpt_audit.records import schemas

    return f"```python\n{inspect.getsource(schemas).split(chr(10) * 2, 2)[2].strip()}\n```"


def _fenced(lines: list[str]) -> list[str]:
    """A docstring's `>>>` session as a `pycon` code block (Markdown would read its `>` as nested
    quotes): from its first prompt to the next blank line."""
    out: list[str] = []
    inside = False
    for line in lines:
        if line.lstrip().startswith(">>>") and not inside:
            out += ["", "```pycon"]
            inside = True
        elif inside and not line.strip():
            out.append("```")
            inside = False
        out.append(line.strip() if inside else line)
    return out + (["```"] if inside else [])


def _doctest_extension() -> Any:
    from markdown import Extension
    from markdown.preprocessors import Preprocessor

    class Fences(Preprocessor):
        def run(self, lines: list[str]) -> list[str]:
            return _fenced(lines)

    class DoctestFences(Extension):
        def extendMarkdown(self, md: Any) -> None:  # noqa: N802 (Markdown's name)
            md.preprocessors.register(Fences(md), "doctest_fences", 27)  # before the fenced-code one (25)

    return DoctestFences()


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(_doctest_extension())
    return config


MAKERS = {"cli": _cli, "policies": _policies, "gpus": _gpus, "exit-codes": _exit_codes, "config": _config,
          "json": _json, "schemas": _schemas}


def on_page_markdown(markdown: str, **_: Any) -> str:
    return GEN.sub(lambda m: MAKERS[m.group(1)](), markdown)


def regenerate(markdown: str) -> str:
    """The page with each generated block's text made anew, its markers kept (what is committed)."""
    return GEN.sub(lambda m: f"<!-- gen: {m.group(1)} -->\n{MAKERS[m.group(1)]().rstrip()}\n<!-- /gen -->", markdown)
