"""The front door and the docs site's sources: the README starts with exactly the two commands
`.ci/run` relies on and stays short; every page the site's navigation names exists, and every
generated part a page asks for has a maker (the site itself is built, strict, in the browser lane)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest -n auto'


def test_the_readme_is_a_short_front_door_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 20_000
    first = readme.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert first == ["pip install -e . && te-ckpt-audit sample_models/te_transformer.py:loss", TEST_COMMAND]
    lane = (ROOT / ".ci" / "lane.sh").read_text()
    assert 'python3 -m pip install -q -e ".[test,dev]"\n    python3 -m pytest -n auto "$@"' in lane
    for link in re.findall(r"\]\(([^)#]+)", readme):
        assert (ROOT / link).exists(), link


def test_every_page_in_the_navigation_exists_and_every_generated_part_has_a_maker() -> None:
    import importlib.util

    config = (ROOT / "mkdocs.yml").read_text()
    pages = re.findall(r":\s+(\S+\.md)\s*$", config, re.MULTILINE)
    assert len(pages) >= 20
    for page in pages:
        assert (ROOT / "docs" / page).is_file(), page
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    asked = {m for p in (ROOT / "docs").rglob("*.md") for m in hooks.GEN.findall(p.read_text())}
    assert asked == set(hooks.MAKERS)
    policies = hooks.on_page_markdown("<!-- gen: policies -->")
    assert "| `checkpoint_dots_and_te_gemms` |" in policies


def test_the_docs_extra_has_the_formatter_the_api_pages_need() -> None:
    """Issue 41, item 9: without Black or Ruff, mkdocstrings says 'Formatting signatures requires
    either Black or Ruff' on every build."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() in ("ruff", "black") for d in extras["docs"])
