"""CI gating from the command line: --budget, --max-recompute, baselines, and `check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from te_ckpt_audit_cli.exit_codes import ExitCode
from test_cli import MODEL, cli  # the same small model and runner as the CLI tests

from te_ckpt_audit import audit_target

ROOT = Path(__file__).resolve().parent.parent

POLICIES = ["checkpoint_dots", "everything_saveable"]


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path / "model.py"


@pytest.fixture
def figures(model: Path) -> dict[str, int]:
    report = audit_target("model.py:loss", POLICIES)
    return {r.policy: r.totals.activation_bytes for r in report.results}


def audit_args(*extra: str) -> list[str]:
    return ["model.py:loss", *[a for p in POLICIES for a in ("-p", p)], "-f", "json", *extra]


def test_within_budget_exits_0(model: Path, figures: dict[str, int]) -> None:
    result = cli(*audit_args("--budget", f"{max(figures.values())}B"))
    assert result.exit_code == ExitCode.OK, result.stderr
    assert json.loads(result.stdout)["schema"] == "te-ckpt-audit/15"  # stdout stays the report


def test_over_budget_exits_1_with_a_line_per_violation(model: Path, figures: dict[str, int]) -> None:
    limit = figures["checkpoint_dots"]
    result = cli(*audit_args("--budget", f"{limit}B"))
    assert result.exit_code == ExitCode.CHECK_FAILED
    lines = [line for line in result.stderr.splitlines() if "check failed" in line]
    assert len(lines) == 1
    assert "model.py:loss [everything_saveable]" in lines[0] and f"({limit} B)" in lines[0]
    assert json.loads(result.stdout)["results"][1]["totals"]["activation_bytes"] == figures["everything_saveable"]


def test_per_policy_budget(model: Path, figures: dict[str, int]) -> None:
    ok = cli(*audit_args("--budget", f"checkpoint_dots={figures['checkpoint_dots']}B"))
    assert ok.exit_code == ExitCode.OK
    tight = cli(*audit_args("--budget", f"checkpoint_dots={figures['checkpoint_dots'] - 1}B"))
    assert tight.exit_code == ExitCode.CHECK_FAILED
    assert "[checkpoint_dots]" in tight.stderr
    unknown = cli(*audit_args("--budget", "dots_saveable=1GiB"))
    assert unknown.exit_code == ExitCode.USAGE and "not among the audited" in unknown.stderr


def test_bad_budget_is_a_usage_error(model: Path) -> None:
    result = cli(*audit_args("--budget", "six gigs"))
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.count("\n") == 1 and "not a size" in result.stderr


def test_max_recompute(model: Path) -> None:
    result = cli("model.py:loss", "-p", "nothing_saveable", "--max-recompute", "1", "-f", "json")
    assert result.exit_code == ExitCode.CHECK_FAILED
    assert "recompute" in result.stderr and "--max-recompute 1%" in result.stderr


def _entry(figures: dict[str, int], target: str = "model.py:loss", **key: object) -> dict[str, object]:
    return {"target": target, "inputs": None, "defines": {}, "scope": "auto", "mesh": None,
            **key, "activation_bytes": figures}


def _baseline(path: Path, figures: dict[str, int], scale: dict[str, float]) -> None:
    scaled = {p: round(v * scale.get(p, 1.0)) for p, v in figures.items()}
    path.write_text(json.dumps({"schema": "te-ckpt-audit-baseline/2", "entries": [_entry(scaled)]}))


def test_save_and_compare_baseline(model: Path, figures: dict[str, int]) -> None:
    saved = cli(*audit_args("--save-baseline", "base.json"))
    assert saved.exit_code == ExitCode.OK
    doc = json.loads(Path("base.json").read_text())
    assert doc == {"schema": "te-ckpt-audit-baseline/2", "entries": [_entry(figures)]}
    again = cli(*audit_args("--baseline", "base.json"))
    assert again.exit_code == ExitCode.OK and again.stderr == ""


def test_a_schema_1_baseline_is_still_read(model: Path, figures: dict[str, int]) -> None:
    doc = {"schema": "te-ckpt-audit-baseline/1", "targets": {"./model.py:loss": {
        p: v // 2 for p, v in figures.items()}}}
    Path("base.json").write_text(json.dumps(doc))
    result = cli(*audit_args("--baseline", "base.json", "-D", "batch=4"))
    assert result.exit_code == ExitCode.CHECK_FAILED
    assert result.stderr.count("grew +100.00%") == len(POLICIES)


def test_save_baseline_merges_into_a_shared_file(model: Path, figures: dict[str, int]) -> None:
    Path("other.py").write_text(MODEL)
    assert cli("other.py:loss", "-p", "checkpoint_dots", "--save-baseline", "base.json").exit_code == 0
    assert cli(*audit_args("--save-baseline", "base.json", "-D", "batch=2")).exit_code == 0
    assert cli(*audit_args("--save-baseline", "base.json")).exit_code == 0
    assert cli("./model.py:loss", "-p", "nothing_saveable", "--save-baseline", "base.json").exit_code == 0
    entries = json.loads(Path("base.json").read_text())["entries"]
    assert [(e["target"], e["defines"], sorted(e["activation_bytes"])) for e in entries] == [
        ("model.py:loss", {}, sorted([*POLICIES, "nothing_saveable"])),
        ("model.py:loss", {"batch": "2"}, sorted(POLICIES)),
        ("other.py:loss", {}, ["checkpoint_dots"]),
    ]
    assert entries[0]["activation_bytes"]["checkpoint_dots"] == figures["checkpoint_dots"]


def test_baseline_keys_are_canonical(model: Path, figures: dict[str, int]) -> None:
    """Another spelling of the same file matches; other defines are another entry: noted, or failed."""
    _baseline(Path("base.json"), figures, {"checkpoint_dots": 0.01})
    Path("sub").mkdir()
    grown = cli("sub/../model.py:loss", *audit_args("--baseline", "base.json")[1:])
    assert grown.exit_code == ExitCode.CHECK_FAILED and "grew" in grown.stderr
    other = cli(*audit_args("--baseline", "base.json", "-D", "batch=2"))
    assert other.exit_code == ExitCode.OK
    assert f"note: model.py:loss [{', '.join(POLICIES)}]: not in baseline base.json" in other.stderr
    required = cli(*audit_args("--baseline", "base.json", "-D", "batch=2", "--require-baseline"))
    assert required.exit_code == ExitCode.CHECK_FAILED
    assert required.stderr.count("not in the baseline, and --require-baseline is given") == len(POLICIES)


def test_baseline_growth_past_tolerance_fails(model: Path, figures: dict[str, int]) -> None:
    _baseline(Path("base.json"), figures, {"checkpoint_dots": 0.5})  # now +100%
    result = cli(*audit_args("--baseline", "base.json", "--tolerance", "99"))
    assert result.exit_code == ExitCode.CHECK_FAILED
    assert "grew +100.00%" in result.stderr and "[checkpoint_dots]" in result.stderr


def test_growth_exactly_at_tolerance_passes(model: Path, figures: dict[str, int]) -> None:
    _baseline(Path("base.json"), figures, {"checkpoint_dots": 0.5})
    assert cli(*audit_args("--baseline", "base.json", "--tolerance", "100")).exit_code == ExitCode.OK


def test_shrinkage_passes_and_is_reported(model: Path, figures: dict[str, int]) -> None:
    _baseline(Path("base.json"), figures, {"checkpoint_dots": 2.0})
    result = cli("model.py:loss", "-p", "checkpoint_dots", "-p", "everything_saveable",
                 "--baseline", "base.json", "-f", "markdown")
    assert result.exit_code == ExitCode.OK
    assert "-50.00%" in result.stdout


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("{oops", "not valid JSON"), ('{"schema": "x/1", "targets": {}}', "expected 'te-ckpt-audit-baseline/2'")],
)
def test_corrupt_baseline_exits_2_before_tracing(model: Path, content: str, fragment: str) -> None:
    Path("base.json").write_text(content)
    Path("model.py").write_text(MODEL + "\nraise SystemExit('user code ran')\n")
    result = cli(*audit_args("--baseline", "base.json"))
    assert result.exit_code == ExitCode.USAGE
    assert fragment in result.stderr and "user code ran" not in result.stderr


def test_github_annotations_point_at_the_model_line(model: Path) -> None:
    result = cli("model.py:loss", "-p", "everything_saveable", "--budget", "1B", "-f", "github")
    assert result.exit_code == ExitCode.CHECK_FAILED
    (error,) = [line for line in result.stdout.splitlines() if line.startswith("::error")]
    assert error.startswith("::error file=model.py,line=7,")  # h = checkpoint_name(jnp.sin(x @ w), ...)
    assert "exceed the budget 1 B" in error


CONFIG = """\
[tool.te-ckpt-audit]
baseline = "base.json"
tolerance = 5

[[tool.te-ckpt-audit.targets]]
target = "model.py:loss"
defines = {{ batch = 8 }}
policies = ["checkpoint_dots", "everything_saveable"]
{budget}
"""


def test_check_command(model: Path) -> None:
    Path("pyproject.toml").write_text(CONFIG.format(budget='budget = "1MiB"'))
    missing = cli("check")
    assert missing.exit_code == ExitCode.USAGE and "--save-baseline" in missing.stderr
    assert cli("check", "--save-baseline").exit_code == ExitCode.OK
    ok = cli("check", "-f", "markdown")
    assert ok.exit_code == ExitCode.OK
    assert "**passed**: 1 target(s), 0 violation(s)." in ok.stdout
    assert "| model.py:loss | checkpoint_dots |" in ok.stdout
    Path("pyproject.toml").write_text(CONFIG.format(budget='budget = "100B"'))
    failed = cli("check", "-f", "json")
    assert failed.exit_code == ExitCode.CHECK_FAILED
    doc = json.loads(failed.stdout)
    assert doc["ok"] is False and {v["policy"] for v in doc["targets"][0]["violations"]} == set(POLICIES)
    assert doc["targets"][0]["report"]["arguments"][1].endswith("[8, 8]")  # defines applied


def test_check_rejects_unknown_keys(model: Path) -> None:
    Path("pyproject.toml").write_text(CONFIG.format(budget='budgit = "1MiB"'))
    result = cli("check")
    assert result.exit_code == ExitCode.USAGE
    assert "unknown key 'budgit'" in result.stderr and "did you mean 'budget'" in result.stderr


def test_check_with_a_malformed_config(model: Path) -> None:
    Path("cfg.toml").write_text("[tool.te-ckpt-audit\n")
    result = cli("check", "--config", "cfg.toml")
    assert result.exit_code == ExitCode.USAGE and "not valid TOML" in result.stderr


UNBASED = CONFIG.replace('baseline = "base.json"\n', "")  # the gates alone, no baseline to save first


def test_check_fails_a_policy_naming_a_checkpoint_name_the_model_lacks(model: Path) -> None:
    # the model's name is "hidden": "hiden" saves nothing by name, and the gate would pass it
    Path("pyproject.toml").write_text(UNBASED.format(budget='budget = "1MiB"').replace(
        '"everything_saveable"]', '"save_only_these_names:hiden"]'))
    result = cli("check")
    assert result.exit_code == ExitCode.USAGE, result.stdout
    assert "'hiden'" in result.stderr and "did you mean 'hidden'?" in result.stderr
    assert result.stderr.count("\n") == 1
    Path("pyproject.toml").write_text(UNBASED.format(budget='budget = "1MiB"').replace(
        '"everything_saveable"]', '"save_only_these_names:hidden"]'))
    assert cli("check").exit_code == ExitCode.OK


def test_a_policys_own_budget_replaces_the_every_policy_budget(model: Path) -> None:
    report = audit_target("model.py:loss", POLICIES, defines={"batch": 8})  # CONFIG's batch
    dots, everything = (r.totals.activation_bytes for r in report.results)
    assert dots < everything
    # every policy at most `dots` bytes, everything_saveable its own, larger, budget: one passes both
    own = f'budget = "{dots}B"\nbudgets = {{ everything_saveable = "{everything}B" }}'
    Path("pyproject.toml").write_text(UNBASED.format(budget=own))
    result = cli("check", "-f", "json")
    assert result.exit_code == ExitCode.OK, result.stdout
    # and it tightens as well as it loosens: one byte under its own budget fails it alone
    tight = f'budget = "1MiB"\nbudgets = {{ everything_saveable = "{everything - 1}B" }}'
    Path("pyproject.toml").write_text(UNBASED.format(budget=tight))
    failed = cli("check", "-f", "json")
    assert failed.exit_code == ExitCode.CHECK_FAILED
    (violation,) = json.loads(failed.stdout)["targets"][0]["violations"]
    assert violation["policy"] == "everything_saveable" and violation["limit"] == everything - 1


@pytest.mark.parametrize("given", ["budget = 128", 'budget = "128"', 'budgets = { checkpoint_dots = 512 }',
                                   "peak_budget = 64"])
def test_a_budget_without_a_unit_below_a_mib_is_an_error(model: Path, given: str) -> None:
    extra = '\ngpu = "h100"' if given.startswith("peak") else ""
    Path("pyproject.toml").write_text(UNBASED.format(budget=given + extra))
    result = cli("check")
    assert result.exit_code == ExitCode.USAGE
    assert "has no unit" in result.stderr and "MiB" in result.stderr and "pyproject.toml" in result.stderr
    assert cli("model.py:loss", "--budget", "128").exit_code == ExitCode.USAGE
    assert cli("model.py:loss", "--budget", "128B", "-f", "json").exit_code == ExitCode.CHECK_FAILED


def _project(tmp_path: Path, table: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        f'[[tool.te-ckpt-audit.targets]]\ntarget = "{ROOT / "sample_models" / "mlp.py"}:loss"\n{table}\n')
    (tmp_path / "src" / "deep").mkdir(parents=True)
    return tmp_path


def test_check_finds_the_projects_pyproject_in_a_folder_above(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 56, item 5: `check` from a subfolder said "no config file"; git, ruff and pytest look up."""
    project = _project(tmp_path, 'budget = "1GiB"')
    monkeypatch.chdir(project / "src" / "deep")
    result = cli("check", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert f"using {project / 'pyproject.toml'}" in result.stderr


@pytest.mark.parametrize(("table", "said"), [
    ('budgets = { checkpoint_dot = "1MiB" }',
     "pyproject.toml: targets[0].budgets names 'checkpoint_dot', which is not among the audited policies "
     "(hint: did you mean 'checkpoint_dots'?"),
    ("defines = { hiden = 256 }",
     "pyproject.toml: targets[0].defines hiden: the inputs callable has no parameter 'hiden'"),
    ('budget = "-1MiB"', "pyproject.toml: targets[0].budget not a size: '-1MiB'"),
])
def test_a_config_mistake_is_said_in_the_configs_own_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            table: str, said: str) -> None:
    """Issue 56, item 5: a pyproject mistake was told as a command-line flag (`add --policy
    checkpoint_dot`, `-D hiden`) or garbled (`targets[0].not a size`)."""
    monkeypatch.chdir(_project(tmp_path, table))
    result = cli("check")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"te-ckpt-audit: error: {said}"), result.stderr
    assert "--policy" not in result.stderr and "-D " not in result.stderr


def test_a_tpu_targets_time_is_the_estimate_on_the_slice_not_a_gpu_key(tmp_path: Path) -> None:
    """Issue 56, items 5 and 6: `time = true` on a TPU target was told to add gpu = "h100", and
    dropped where it passed."""
    from te_ckpt_audit.config import load_config

    project = _project(tmp_path, 'tpu = "v5e"\ntime = true')
    (t,) = load_config(project / "pyproject.toml").targets
    assert t.tpu is not None and t.tpu.time and t.gpu is None
