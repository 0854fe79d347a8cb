"""The library's tree reads as its pipeline (issue 57): each stage package imports only the stages
before it, the targets are peers, and `Any` stays rare. Read from the source as text, nothing run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "te_ckpt_audit"
ORDER = ["trace", "analysis", "targets", "_session", "search"]  # a stage may import only those before it
PEERS = ["_cpu", "_gpu", "_tpu"]
_IMPORT = re.compile(r"^\s*from (\.+)([\w.]*) import ([^\n(]+|\([^)]*\))", re.MULTILINE)


def _imported(path: Path) -> set[str]:
    """The library modules `path` imports, as dotted names under te_ckpt_audit."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found = set()
    for dots, rest, names in _IMPORT.findall(path.read_text()):
        base = list(package[: len(package) - (len(dots) - 1)])
        module = ".".join(base + ([rest] if rest else []))
        found.add(module)
        if not rest:
            found |= {f"{module}.{n.split(' as ')[0].strip()}" for n in names.strip("()").split(",") if n.strip()}
    return found


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ORDER else None


@pytest.mark.parametrize("stage", ORDER)
def test_a_stage_imports_no_later_stage(stage: str) -> None:
    files = [LIB / f"{stage}.py"] if stage.startswith("_") else sorted((LIB / stage).glob("*.py"))
    assert files and all(f.is_file() for f in files)
    later = set(ORDER[ORDER.index(stage) + 1:])
    for f in files:
        bad = {m for m in _imported(f) if _stage(m) in later}
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)}, a later stage"


def test_the_targets_are_peers_that_import_none_of_each_other() -> None:
    for peer in PEERS:
        imported = _imported(LIB / "targets" / f"{peer}.py")
        others = {f"te_ckpt_audit.targets.{p}" for p in PEERS if p != peer}
        assert not imported & others, f"targets/{peer}.py imports {sorted(imported & others)}"


def test_any_stands_on_at_most_120_lines_of_the_library_and_cli() -> None:
    lines = [f"{p.relative_to(ROOT)}:{i}" for d in ("te_ckpt_audit", "cli") for p in sorted((ROOT / d).rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\bAny\b", line) and not line.lstrip().startswith("#")]
    assert len(lines) <= 120, f"{len(lines)} lines: {lines[:10]} ..."
