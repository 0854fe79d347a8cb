"""The front door and the docs site's sources: the README starts with exactly the two commands
`.ci/run` relies on and stays short; every page the site's navigation names exists, and every
generated part a page asks for has a maker (the site itself is built, strict, in the browser lane)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest -n auto'


def test_the_readme_is_a_short_front_door_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 8192  # issue 57, item 5: the rest lives in the docs site
    first = readme.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert first == ["pip install -e . && te-ckpt-audit sample_models/te_transformer.py:loss", TEST_COMMAND]
    lane = (ROOT / ".ci" / "lane.sh").read_text()
    assert 'python3 -m pip install -q -e ".[test,dev]"\n    python3 -m pytest -n auto "$@"' in lane
    for link in re.findall(r"\]\(([^)#]+)", readme):
        assert (ROOT / link).exists(), link


def test_the_readme_shows_check_only_after_the_install_it_needs() -> None:
    """Issue 56, item 5: `te-ckpt-audit check` failed right after the first install (`No module
    named 'flax'`, exit 3): the repository's gate audits the Flax sample, and Flax is a test extra."""
    import tomllib

    readme = (ROOT / "README.md").read_text().splitlines()
    gated = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["te-ckpt-audit"]["targets"]
    assert any("flax" in t["target"] for t in gated)
    shown = [i for i, line in enumerate(readme) if line.startswith("te-ckpt-audit check")]
    assert shown
    for i in shown:
        assert "after the second command" in readme[i - 1] and "Flax" in readme[i - 1], readme[i - 1]


def test_every_command_the_readme_shows_names_a_bundled_target() -> None:
    """Issue 41, item 10: "More commands" named model.py:loss, which a checkout does not have: every
    TARGET the README shows is a bundled file that defines the function."""
    import ast

    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"te-ckpt-audit (?:recommend )?(\S+\.py):(\w+)", readme)
    assert len(targets) >= 5
    for path, name in targets:
        tree = ast.parse((ROOT / path).read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert name in defined, f"{path}:{name}"


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
    asked = {m[0] for p in (ROOT / "docs").rglob("*.md") for m in hooks.GEN.findall(p.read_text())}
    assert asked == set(hooks.MAKERS)
    policies = hooks.on_page_markdown("<!-- gen: policies -->\n<!-- /gen -->")
    assert "| `checkpoint_dots_and_te_gemms` |" in policies


def test_the_docs_extra_has_the_formatter_the_api_pages_need() -> None:
    """Issue 41, item 9: without Black or Ruff, mkdocstrings says 'Formatting signatures requires
    either Black or Ruff' on every build."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() in ("ruff", "black") for d in extras["docs"])


def test_the_front_pages_first_audit_is_what_the_command_prints() -> None:
    """The docs' front page and the README show `te-ckpt-audit sample_models/te_transformer.py:loss`;
    every line they show is the command's own, in its order (issue 41, item 8: the front page still
    showed a `(no source)` row after item 7 had given those residuals their producer). Its
    numbers are those of the jax release its header names (jax's linearization keeps other residuals
    in other releases): on another jax the check is skipped. The command runs in a process of its
    own, as a user runs it: in a long-lived one (a test worker, a notebook) a residual that JAX's
    differentiation makes with a rule it traced before for another caller (the scatter at line 75)
    carries that caller's traceback, and its line can read "(no source)"."""
    import subprocess

    import jax

    named = {m for page in ("docs/index.md", "README.md")
             for m in re.findall(r"^24 array inputs;.*; jax (\S+)$", (ROOT / page).read_text(), re.MULTILINE)}
    assert len(named) == 1
    if jax.__version__ not in named:
        pytest.skip(f"the front page shows jax {named.pop()}'s output; this is jax {jax.__version__}")

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "sample_models/te_transformer.py:loss"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    printed = [line.rstrip() for line in result.stdout.splitlines()]
    for page in ("docs/index.md", "README.md"):
        text = (ROOT / page).read_text()
        shown = text.split("te-ckpt-audit sample_models/te_transformer.py:loss\n24 array inputs", 1)[1]
        block = ("24 array inputs" + shown.split("\n```", 1)[0]).splitlines()
        at = 0
        for line in (line.rstrip() for line in block if line.strip() != "..."):
            assert line in printed[at:], (f"{page}: {line!r} is not the command's output (in order); it printed:\n"
                                          + "\n".join(printed))  # all of it: a rare -n 2 failure to read
            at = printed.index(line, at) + 1
        assert at > 10



def _hooks() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the committed pages are made on the README's Python")
def test_the_generated_reference_blocks_in_the_repository_are_what_the_code_makes() -> None:
    """Issue 46, item 8: cli.md and config.md were only `<!-- gen: ... -->` until the site was
    built, so the config keys were nowhere a reader of the repository found them. The blocks are
    committed; UPDATE_GOLDEN=1 rewrites them."""
    hooks = _hooks()
    stale = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        made = hooks.regenerate(text)  # type: ignore[attr-defined]
        if made != text:
            stale.append(page.relative_to(ROOT).as_posix())
            if os.environ.get("UPDATE_GOLDEN"):
                page.write_text(made, encoding="utf-8")
    assert not stale, f"generated blocks out of date in {stale}: run UPDATE_GOLDEN=1 pytest tests/test_docs.py"
    config = (ROOT / "docs" / "reference" / "config.md").read_text()
    for key in ("budget", "budgets", "max_recompute", "peak_budget", "peak_budgets", "network_gbps", "donate"):
        assert f"    {key} = " in config, key
