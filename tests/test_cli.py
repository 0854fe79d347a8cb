"""The command line, run in-process with Typer's runner: exit codes, one-line errors, outputs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import te_ckpt_audit_cli.audit_cmd as audit_cmd
from te_ckpt_audit_cli.app import app
from te_ckpt_audit_cli.exit_codes import ExitCode
from te_ckpt_audit_cli.options import OutputFormat
from typer.main import get_command
from typer.testing import CliRunner, Result

from te_ckpt_audit import (
    AuditError,
    Outcome,
    PolicySpecError,
    Scope,
    TargetError,
    UsageError,
    __version__,
    audit_target,
)
from te_ckpt_audit.render import TableView, render_json
from te_ckpt_audit.specs import available_policies

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "te-ckpt-audit: error: "


def _doc(report: Any) -> Any:
    """The report as `--format json` writes it (hotspots included)."""
    return json.loads(render_json(report))

MODEL = """\
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name


def loss(w, x):
    h = checkpoint_name(jnp.sin(x @ w), "hidden")
    return jnp.sum(jnp.cos(h) @ w)


def loss_inputs(batch: int = 4, width: int = 8):
    f32 = jnp.float32
    return jax.ShapeDtypeStruct((width, width), f32), jax.ShapeDtypeStruct((batch, width), f32)
"""


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small valid model, model.py:loss, in the current folder."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


# --- errors (the bad-input tables are in test_bad_input.py) --------------------------------------


def test_debug_adds_the_traceback_and_keeps_the_exit_code(model: Path) -> None:
    model.write_text(MODEL + "def broken(w, x):\n    return w.nonexistent\nbroken_inputs = loss_inputs\n")
    result = cli("model.py:broken", "--debug")
    assert result.exit_code == ExitCode.TARGET
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1].startswith(PREFIX)


def test_an_unexpected_exception_is_an_internal_error(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_: Any, **__: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(audit_cmd, "check_target", explode)
    result = cli("model.py:loss")
    assert result.exit_code == ExitCode.INTERNAL
    hint = "rerun with --debug and report the traceback"
    assert result.stderr.splitlines() == [f"{PREFIX}internal error: RuntimeError: a bug (hint: {hint})"]


def test_each_kind_of_library_error_is_its_exit_code() -> None:
    from te_ckpt_audit_cli.exit_codes import exit_code_of

    from te_ckpt_audit import PolicyError

    codes = [exit_code_of(e("x")) for e in (UsageError, PolicySpecError, TargetError, PolicyError, AuditError)]
    assert codes == [ExitCode.USAGE, ExitCode.USAGE, ExitCode.TARGET, ExitCode.TARGET, ExitCode.INTERNAL]


# --- outputs ------------------------------------------------------------------------------------


def test_json_on_stdout_is_the_report_and_nothing_else(model: Path) -> None:
    model.write_text("print('hello from the model')\n" + MODEL)
    result = cli("model.py:loss", "--format", "json", "-p", "checkpoint_dots", "-D", "batch=2")
    assert result.exit_code == 0, result.stderr
    expected = _doc(audit_target("model.py:loss", ["checkpoint_dots"], defines=["batch=2"]))
    assert json.loads(result.stdout) == expected
    assert "hello from the model" in result.stderr


def test_the_report_reaches_stdout_though_a_spinner_swapped_it(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    @contextlib.contextmanager
    def late_spinner() -> Iterator[Callable[[str], None]]:
        """Like Rich's Live started after a delay: it swaps sys.stdout, then restores what it found."""
        found: list[Any] = []

        def progress(_: str) -> None:
            if not found:
                found.append(sys.stdout)
                sys.stdout = io.StringIO()

        try:
            yield progress
        finally:
            if found:
                sys.stdout = found[0]

    monkeypatch.setattr(audit_cmd, "progress_on_stderr", late_spinner)
    result = cli("model.py:loss", "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["target"] == "model.py:loss"


def test_output_is_written_atomically(model: Path) -> None:
    result = cli("model.py:loss", "-f", "json", "-o", "report.json")
    assert result.exit_code == 0 and result.stdout == ""
    assert json.loads(Path("report.json").read_text()) == _doc(audit_target("model.py:loss"))
    assert sorted(p.name for p in model.parent.iterdir()) == ["model.py", "report.json"]


@pytest.fixture
def refused_write(model: Path, monkeypatch: pytest.MonkeyPatch) -> Result:
    def refuse(*_: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    return cli("model.py:loss", "-f", "json", "-o", "report.json")


def test_a_failed_write_leaves_no_file(model: Path, refused_write: Result) -> None:
    assert refused_write.exit_code != 0
    assert len(refused_write.stderr.splitlines()) == 1
    assert sorted(p.name for p in model.parent.iterdir()) == ["model.py"]


def test_a_failed_write_is_a_usage_error(refused_write: Result) -> None:
    assert refused_write.exit_code == ExitCode.USAGE
    assert refused_write.stderr.startswith(f"{PREFIX}cannot write report.json")


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_every_format_is_handled(model: Path, fmt: OutputFormat) -> None:
    report = audit_target("model.py:loss", ["nothing_saveable"])
    text = audit_cmd.renderer(fmt, TableView())(report, None)
    assert isinstance(text, str) and "nothing_saveable" in text
    result = cli("model.py:loss", "--format", fmt.value, "-p", "nothing_saveable")
    assert result.exit_code == 0, result.stderr
    assert "nothing_saveable" in result.stdout


@pytest.mark.parametrize("scope", list(Scope))
def test_every_scope_is_handled(model: Path, scope: Scope) -> None:
    result = cli("model.py:loss", "--scope", scope.value, "-f", "json", "-p", "checkpoint_dots")
    assert result.exit_code == 0, result.stderr
    expected = _doc(audit_target("model.py:loss", ["checkpoint_dots"], scope=scope))
    assert json.loads(result.stdout) == expected


def test_a_pipe_gets_the_width_the_tables_need(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    long = "save_only_these_names:hidden+dots_and_te_gemms_with_no_batch_dims"
    result = cli("model.py:loss", "-p", long, "-p", "checkpoint_dots_and_te_gemms")
    assert result.exit_code == 0, result.stderr
    table = result.stdout[result.stdout.index("Kept for the backward pass"):].splitlines()
    rows = [line.split() for line in table if line[:2] in ("1 ", "2 ")]
    assert [row[1] for row in rows[:2]] == [long, "checkpoint_dots_and_te_gemms"]  # neither split
    assert max(len(line) for line in result.stdout.splitlines()) > 80


def test_table_honours_columns_and_no_color(model: Path) -> None:
    for env, width, coloured in [
        ({"COLUMNS": "80"}, 80, False),
        ({"COLUMNS": "120", "FORCE_COLOR": "1"}, 120, True),
        ({"COLUMNS": "80", "FORCE_COLOR": "1", "NO_COLOR": "1"}, 80, False),
    ]:
        result = cli("model.py:loss", "--equations", env=env)
        assert result.exit_code == 0, result.stderr
        assert ("\x1b[" in result.stdout) is coloured
        plain = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
        assert max(len(line) for line in plain.splitlines()) <= width


def test_default_policies_and_the_explicit_audit_command(model: Path) -> None:
    default = cli("model.py:loss", "-f", "json")
    explicit = cli("audit", "model.py:loss", "-f", "json")
    assert default.exit_code == explicit.exit_code == 0
    assert default.stdout == explicit.stdout
    assert json.loads(default.stdout) == _doc(audit_target("model.py:loss"))


# --- the other entry points ---------------------------------------------------------------------


def test_policies_lists_every_spec_one_a_line() -> None:
    result = cli("policies")
    assert result.exit_code == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines] == [spec for spec, _ in available_policies()]


def test_version() -> None:
    for flag in ("--version", "-V"):
        result = cli(flag)
        assert result.exit_code == 0
        assert result.stdout.startswith(f"te-ckpt-audit {__version__} ")
    listed = cli("--help").stdout
    assert "-V, --version" in listed and "--install-completion" in listed and "--show-completion" in listed


def test_a_bare_command_shows_the_help() -> None:
    bare, asked = cli(), cli("--help")
    assert bare.exit_code == 0 and bare.stderr == ""
    assert bare.stdout == asked.stdout and "Commands:" in bare.stdout


@pytest.mark.parametrize(("words", "expected"), [
    ("--policy checkpoint_dots_and", {"checkpoint_dots_and_te_gemms"}),
    ("recommend m.py:f --gpu h1", {"h100", "h100-pcie", "h100-sxm"}),
    ("rec", {"recommend"}),
    ("maxtext c.yml -p minimal_with_c", {"minimal_with_context", "minimal_with_context_and_quantization"}),
])
def test_shell_completion_knows_commands_policies_and_gpus(words: str, expected: set[str]) -> None:
    argv = ["te-ckpt-audit", *words.split()]
    env = {"_TE_CKPT_AUDIT_COMPLETE": "complete_bash", "COMP_WORDS": " ".join(argv), "COMP_CWORD": str(len(argv) - 1)}
    result = CliRunner().invoke(app, [], env=env, prog_name="te-ckpt-audit")
    assert set(result.stdout.split()) == expected


def test_check_offers_only_the_formats_it_writes() -> None:
    shown = cli("check", "--help", env={"COLUMNS": "200"}).stdout
    assert "<table|json|markdown|github>" in shown and "html" not in shown
    refused = cli("check", "--format", "html")
    assert refused.exit_code == ExitCode.USAGE and "html" in refused.stderr


def test_help_lists_every_command_one_line_each() -> None:
    result = cli("--help", env={"COLUMNS": "80"})
    assert result.exit_code == 0 and result.stderr == ""
    commands = get_command(app).commands  # type: ignore[attr-defined]
    listed = result.stdout.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == list(commands)  # one line each: none wraps
    assert all(len(line) <= 80 and line.rstrip().endswith(".") for line in listed)


def test_help_describes_every_option_in_a_sentence() -> None:
    result = cli("audit", "--help")
    assert result.exit_code == 0
    audit = get_command(app).commands["audit"]  # type: ignore[attr-defined]
    for param in audit.params:
        assert param.help and param.help.rstrip().endswith("."), param.name
        for flag in getattr(param, "opts", []):
            assert flag in result.stdout or param.param_type_name == "argument", flag


# --- the Transformer Engine sample --------------------------------------------------------------


@pytest.fixture(scope="module")
def te_sample() -> tuple[Result, Result, dict[str, Any]]:
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        table = cli("sample_models/te_transformer.py:loss", env={"COLUMNS": "80"})
        as_json = cli("sample_models/te_transformer.py:loss", "-f", "json")
        expected = _doc(audit_target("sample_models/te_transformer.py:loss"))
    finally:
        os.chdir(here)
    return table, as_json, expected


def test_te_sample_json_is_the_engine_report(te_sample: tuple[Result, Result, dict[str, Any]]) -> None:
    _, as_json, expected = te_sample
    assert as_json.exit_code == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc == expected
    te = [e["id"] for e in doc["equations"] if e["is_te_gemm"]]
    outcomes = {r["policy"]: {m["equation"]: m["outcome"] for m in r["marks"]} for r in doc["results"]}
    assert te and {outcomes["checkpoint_dots"][e] for e in te} == {Outcome.RECOMPUTED.value}
    assert {outcomes["checkpoint_dots_and_te_gemms"][e] for e in te} == {Outcome.SAVED.value}


def test_te_sample_table_fits_80_columns(te_sample: tuple[Result, Result, dict[str, Any]]) -> None:
    table, _, expected = te_sample
    assert table.exit_code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert table.stdout.count("CPU stand-in") == 1
    n = sum(e["is_te_gemm"] for e in expected["equations"])
    by_policy = {line.split()[1]: line for line in lines if line[:2].strip().isdigit() and "/" in line}
    assert by_policy["checkpoint_dots"].endswith(f" {n}/{n}")
    assert by_policy["checkpoint_dots_and_te_gemms"].endswith(f" 0/{n}")
    assert "[te-gemms-recomputed] checkpoint_dots" in table.stdout


# --- hotspots by module path or line; a policy JAX cannot differentiate under -------------------

SCOPED = MODEL.replace(
    "    h = checkpoint_name(jnp.sin(x @ w), \"hidden\")",
    "    with jax.named_scope(\"encoder\"):\n        h = checkpoint_name(jnp.sin(x @ w), \"hidden\")",
)


@pytest.mark.parametrize(("by", "expected"), [(None, "module"), ("module", "module"), ("line", "line")])
def test_hotspots_by_module_path_by_default_or_by_line(model: Path, by: str | None, expected: str) -> None:
    model.write_text(SCOPED)
    args = ["model.py:loss", "-f", "json", "-p", "everything_saveable"] + (["--by", by] if by else [])
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    hot = json.loads(result.stdout)["hotspots"]
    assert hot["by"] == expected
    where = {row["where"] for row in hot["rows"]}
    lines = {w for w in where if w.startswith("model.py:")}
    if expected == "module":  # what is made outside any module keeps its line
        assert "encoder" in where and lines and where == lines | {"encoder"}
    else:
        assert where == lines


COMPLEX = """\
import jax
import jax.numpy as jnp


def loss(x):
    z = jnp.exp(1j * x.astype(jnp.complex64))
    return jnp.real(jnp.sum(z * z))


def loss_inputs():
    return (jax.ShapeDtypeStruct((4,), jnp.float32),)
"""


def test_a_policy_that_cannot_be_differentiated_reports_the_rest_and_exits_3(model: Path) -> None:
    model.write_text(COMPLEX)
    result = cli("model.py:loss", "-f", "json", "-p", "everything_saveable", "-p", "nothing_saveable")
    assert result.exit_code == ExitCode.TARGET
    doc = json.loads(result.stdout)
    assert [r["error"] is None for r in doc["results"]] == [False, True]
    assert doc["results"][1]["totals"]["argument_bytes"] == 16
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX) and "[everything_saveable]" in lines[0]


@pytest.mark.parametrize("command", ["audit", "check", "policies", "gpus", "recommend", "maxtext"])
def test_each_commands_help_ends_with_examples_that_name_bundled_files(command: str) -> None:
    """Issue 41, item 11: a short Examples epilogue, as git and pip end theirs."""
    from te_ckpt_audit_cli.app import EXAMPLES

    result = cli(command, "--help")
    assert result.exit_code == 0
    tail = result.stdout[result.stdout.rindex("Examples:"):]
    assert tail.count("te-ckpt-audit ") >= 1 and "model.py" not in EXAMPLES[command]
    for line in tail.splitlines()[1:]:
        target = next((w for w in line.split() if ".py:" in w), None)
        assert target is None or (ROOT / target.split(":")[0]).is_file(), line


@pytest.mark.parametrize("command", ["audit", "check", "recommend", "maxtext"])
def test_each_commands_options_come_in_groups_the_common_ones_first(command: str) -> None:
    """Issue 41, item 11, second half: `audit --help` was one list of 37 options. Every option is
    placed in a group (a new one must be), the groups come in one order, the common options first,
    and each option is listed once."""
    from te_ckpt_audit_cli.app import PANELS, app, panel_of
    from typer.main import get_command

    params = [p for p in get_command(app).commands[command].params if p.param_type_name == "option"]  # type: ignore[attr-defined]
    assert all(panel_of(command, p.name) for p in params), [p.name for p in params if not panel_of(command, p.name)]
    text = cli(command, "--help").stdout
    panel, placed = None, {}  # each option line's flags -> the heading above it
    for line in text[text.index("\nOptions:\n"):text.index("  Examples:")].splitlines():
        if line.endswith(":") and line[:1].isalpha():
            panel = line[:-1]
        elif line.startswith("  -"):
            for flag in line.split()[:2]:
                if flag.startswith("-"):
                    placed[flag.rstrip(",")] = panel
    shown = list(dict.fromkeys(placed.values()))
    assert shown == [p for p in PANELS if p in shown] and shown[0] == "Options" and shown[-1] == "Other"
    for p in params:
        assert placed[max(p.opts, key=len)] == panel_of(command, p.name), p.name
    assert (placed.get("--policy") == "Options") == (command in ("audit", "maxtext")) and placed["--debug"] == "Other"


def test_a_target_split_at_a_space_gets_the_target_it_surely_meant(model: Path) -> None:
    """Issue 46, item 9: `te-ckpt-audit model.py loss` said only "unexpected extra argument"."""
    for argv in (["model.py", "loss"], ["recommend", "model.py", "loss", "--budget", "1MiB"]):
        result = cli(*argv)
        assert result.exit_code == ExitCode.USAGE
        assert "did you mean model.py:loss?" in result.stderr and result.stderr.count("\n") == 1


def test_a_report_written_to_a_file_says_where(model: Path) -> None:
    """Issue 46, item 9: `-o report.html` ended in silence."""
    result = cli("model.py:loss", "-p", "none", "-f", "html", "-o", "report.html")
    assert result.exit_code == ExitCode.OK
    assert result.stderr.splitlines()[-1] == "te-ckpt-audit: report written to report.html"
    assert (model.parent / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_counts_are_worded_in_the_singular_and_the_plural() -> None:
    from te_ckpt_audit.render._common import counted

    assert [counted(n, "policy") for n in (0, 1, 2)] == ["0 policies", "1 policy", "2 policies"]
    assert counted(1, "point") == "1 point" and counted(8, "point") == "8 points"


def test_xla_flags_xla_refuses_are_a_usage_error_on_every_command_that_starts_xla() -> None:
    """Issue 56, item 6: `XLA_FLAGS=--xla_bogus_flag=1 ... --tpu` ended in XLA's fatal log, exit 1
    (a failed check, to CI); only `--gpu` checked the flags first. A plain audit starts XLA too."""
    result = cli("sample_models/mlp.py:loss", "-p", "nothing_saveable", env={"XLA_FLAGS": "--xla_bogus_flag=1"})
    assert result.exit_code == 2
    assert result.stderr.startswith("te-ckpt-audit: error: XLA_FLAGS: XLA does not know --xla_bogus_flag=1")


def test_output_to_dev_stdout_on_a_pipe_writes_the_report_there() -> None:
    """Issue 56, item 6: `-o /dev/stdout` was refused when stdout is a pipe (its real path,
    /proc/PID/fd/pipe:[N], is no file)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "sample_models/mlp.py:loss", "-p",
                           "nothing_saveable", "-f", "json", "-o", "/dev/stdout"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"][0]["policy"] == "nothing_saveable"


def test_a_librarys_chatter_on_stdout_is_dropped_and_the_rest_kept() -> None:
    """The filter `maxtext` runs MaxText's own prints through (issue 56, item 5)."""
    import io
    import re

    from te_ckpt_audit_cli.terminal import _Dropping

    out = io.StringIO()
    stream = _Dropping(out, re.compile(r"\[(?:[A-Z]+ )?NO-OP\] "))
    stream.write("[NO-OP] mldiagnostics: dependency missing; using stub.\nthe user's line\n[DECOUPLED NO-OP] x\npart")
    stream.flush()
    assert out.getvalue() == "the user's line\npart"
