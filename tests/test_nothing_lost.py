"""Nothing lost, nothing hangs (issue 38): an output never replaces a file the run reads, settings
are read as the tool that owns them reads them, and bad values are refused before any work.

Each case ends in exit 2 with one line on stderr naming what is wrong, nothing on stdout, and every
file in the folder as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from te_ckpt_audit_cli.exit_codes import ExitCode
from test_bad_input import Case, _set_up, case, config
from test_cli import PREFIX, cli

from te_ckpt_audit.config import files_read
from te_ckpt_audit.gpus import gpu_model

USAGE = ExitCode.USAGE
BASELINE = '{"schema": "te-ckpt-audit-baseline/2", "entries": []}'
HELPER = "def helper(x):\n    return x\n"
INPUTS = "from model import loss_inputs\n\ndef mk():\n    return loss_inputs()\n"
POLICY = "def save_all(prim, *avals, **params):\n    return True\n"
USES_HELPER = "from helper import helper\n"
CHILD = "base_config: 'parent.yml'\nper_device_batch_size: 2\n"

# -o naming each kind of file a run reads
OVERWRITES = [
    case("the-target", "model.py:loss -o model.py", USAGE, "is the target's module"),
    case("a-module-the-target-imports", "model.py:loss -o helper.py", USAGE, "a module the target imports",
         model=USES_HELPER, helper__py=HELPER),
    case("the-inputs-module", "model.py:loss --inputs inp.py:mk -o inp.py", USAGE, "is the inputs module",
         inp__py=INPUTS),
    case("a-custom-policy", "model.py:loss -p pol.py:save_all -o pol.py", USAGE, "the module of policy",
         pol__py=POLICY),
    case("the-baseline", "model.py:loss --baseline b.json -o b.json", USAGE, "is the baseline", b__json=BASELINE),
    case("recommend-the-target", "recommend model.py:loss --budget 1GiB -o model.py", USAGE,
         "is the target's module"),
    case("check-the-config", "check -o pyproject.toml", USAGE, "is the config file", pyproject__toml=config()),
    case("check-a-target", "check -o model.py", USAGE, "is the target's module", pyproject__toml=config()),
    case("check-the-baseline", "check -o b.json", USAGE, "is the baseline",
         pyproject__toml=config('baseline = "b.json"'), b__json=BASELINE),
    case("maxtext-the-config", "maxtext child.yml -o child.yml", USAGE, "is the MaxText config",
         child__yml=CHILD, parent__yml="steps: 1\n"),
    case("maxtext-its-base-config", "maxtext child.yml -o parent.yml", USAGE, "a base_config of the MaxText config",
         child__yml=CHILD, parent__yml="steps: 1\n"),
]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _refused(folder: Path, c: Case) -> str:
    _set_up(folder, c)
    before = {p: p.read_bytes() for p in folder.iterdir()}
    result = cli(*c.argv)
    assert result.exit_code == c.code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), result.stderr
    assert result.stdout == ""
    assert {p: p.read_bytes() for p in folder.iterdir()} == before
    return lines[0]


@pytest.mark.parametrize("c", OVERWRITES, ids=lambda c: c.id)
def test_an_output_over_a_file_the_run_reads_is_refused(folder: Path, c: Case) -> None:
    assert c.fragment in _refused(folder, c)


def test_the_gpu_config_is_not_overwritten(folder: Path) -> None:
    (folder / "gpu.txtpb").write_text(gpu_model("h100").config_text())
    c = case("the-gpu-config", "model.py:loss --gpu-config gpu.txtpb -o gpu.txtpb", USAGE, "is the GPU config")
    assert "is the GPU config" in _refused(folder, c)


@pytest.mark.parametrize("link", [os.symlink, os.link], ids=["symlink", "hard-link"])
def test_a_link_to_the_model_is_the_model(folder: Path, link: object) -> None:
    _set_up(folder, case("x", "", USAGE, ""))
    link(folder / "model.py", folder / "alias.py")  # type: ignore[operator]
    assert "is the target's module" in _refused(folder, case("link", "model.py:loss -o alias.py", USAGE, ""))


def test_what_a_target_reads_is_found_without_running_it(folder: Path) -> None:
    (folder / "pkg").mkdir()
    (folder / "pkg" / "__init__.py").write_text("raise SystemExit('never imported')\n")
    (folder / "pkg" / "model.py").write_text("from . import layers\nfrom pkg.util import f\nimport numpy\n")
    (folder / "pkg" / "layers.py").write_text("from .deep import g\n")
    (folder / "pkg" / "deep.py").write_text("")
    (folder / "pkg" / "util.py").write_text("import pkg.layers\n")
    found = {(what, p.relative_to(folder).as_posix()) for what, p in files_read("pkg.model:loss")}
    assert found == {("the target's module", "pkg/model.py"), *(("a module the target imports", f) for f in (
        "pkg/__init__.py", "pkg/layers.py", "pkg/deep.py", "pkg/util.py"))}
    assert {p.name for _, p in files_read("pkg/model.py:loss")} == {"model.py", "__init__.py", "layers.py",
                                                                     "deep.py", "util.py"}
    assert files_read("no_such_module_here:loss") == ()


@pytest.mark.skipif(not os.path.isfile("/proc/version"), reason="no /proc here")
def test_an_output_no_file_can_be_made_beside_is_refused_before_the_run(folder: Path) -> None:
    line = _refused(folder, case("proc", "model.py:loss -o /proc/version", USAGE, ""))
    assert "cannot write /proc/version: the file exists, but its folder /proc takes no new file" in line


def test_the_least_fraction_is_never_below_a_hundredth() -> None:
    from te_ckpt_audit.gpus import least_fraction

    assert least_fraction(1, 10**18) == least_fraction(0, 80 * 2**30) == 0.01  # was 0.0, against the schema
    assert least_fraction(63 * 2**30, 80 * 2**30) == 0.79


# --- XLA_FLAGS: refused before any work, XLA's last words kept (item 5) -------------------------------


@pytest.mark.parametrize(("flags", "said"), [
    ("--xla_no_such_flag_here=1", "XLA_FLAGS: XLA does not know --xla_no_such_flag_here=1"),
    ("--xla_gpu_enable_triton_gemm=maybe", "XLA_FLAGS: XLA cannot take the value 'maybe' for "
                                           "--xla_gpu_enable_triton_gemm"),
    ("--xla_gpu_enable_triton_gemm='false", "XLA_FLAGS cannot be split into flags: No closing quotation"),
], ids=["unknown", "bad-value", "unbalanced-quote"])
def test_xla_flags_xla_refuses_are_one_line_before_any_work(folder: Path, flags: str, said: str) -> None:
    _set_up(folder, case("x", "", USAGE, ""))
    env = {**os.environ, "XLA_FLAGS": flags}
    env.pop("JAX_PLATFORMS", None)
    done = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "model.py:loss", "--gpu", "h100"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    lines = done.stderr.splitlines()
    assert done.returncode == USAGE and len(lines) == 1 and said in lines[0], done.stderr  # was exit 1, silent
    assert done.stdout == ""


def test_flags_xla_takes_pass() -> None:
    from te_ckpt_audit_cli.process import check_xla_flags

    check_xla_flags("--xla_gpu_enable_triton_gemm=false --xla_dump_hlo_as_text")


_CAPTURED = """
import os, sys
from te_ckpt_audit_cli.process import xla_log_kept_off_stderr
with xla_log_kept_off_stderr():
    os.write(2, b"I1205 08:46:54.954686    7300 x.cc:93] XLA's log line\\nthe user's line\\n")
    if sys.argv[1] == "abort":
        os.write(2, b"F1205 08:46:54.954686    7300 x.cc:93] XLA's last words\\n")
        os.abort()
    if sys.argv[1] == "stack":
        os.write(2, b"F1205 08:46:54.954686    7300 x.cc:93] Check failed: the reason\\n")
        frames = b"".join(b"    @ 0x%x xla::Frame\\n" % i for i in range(40))
        os.write(2, b"*** Check failure stack trace: ***\\n" + frames)
        os.abort()
print("after", file=sys.stderr)
"""


def test_xla_log_is_kept_off_stderr_and_its_last_words_outlive_the_process() -> None:
    ok = subprocess.run([sys.executable, "-c", _CAPTURED, "ok"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stderr == "the user's line\nafter\n"
    died = subprocess.run([sys.executable, "-c", _CAPTURED, "abort"], capture_output=True, text=True, timeout=120)
    assert died.returncode != 0 and "XLA ended the process while it compiled" in died.stderr
    assert died.stderr.rstrip().endswith("XLA's last words")  # was lost with the process
    # a stack trace after the fatal line: its reason still shown (was only the trace's last frames)
    stack = subprocess.run([sys.executable, "-c", _CAPTURED, "stack"], capture_output=True, text=True, timeout=120)
    said = stack.stderr.splitlines()
    assert said[1].endswith("Check failed: the reason") and said[2] == "..." and said[-1].endswith("xla::Frame")
    assert len(said) == 1 + 1 + 1 + 20


# --- the Python API: sizes as the command line takes them, wrong types named (items 14, 15) -----------


def test_recommend_target_takes_the_budget_the_docs_show() -> None:
    from te_ckpt_audit import recommend_target

    by_text = recommend_target("sample_models/mlp.py:loss", budget="6GiB")  # was a TypeError
    by_bytes = recommend_target("sample_models/mlp.py:loss", budget_bytes=6 * 2**30)
    assert by_text.budget_bytes == by_bytes.budget_bytes == 6 * 2**30
    assert by_text.recommended == by_bytes.recommended


def _wrong_types() -> list[tuple[str, Any, str]]:
    import jax
    import jax.numpy as jnp

    from te_ckpt_audit import audit, audit_target, recommend_target
    from te_ckpt_audit.gpus import GpuEnvironment

    x = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    mlp = "sample_models/mlp.py:loss"
    return [
        ("target-int", lambda: audit_target(123), "target takes text"),
        ("gpu-as-text", lambda: audit_target(mlp, gpu="h100"), "gpu takes a GpuRequest, not str 'h100'"),
        ("mesh-int", lambda: audit_target(mlp, mesh=8), "mesh takes text such as 'data=8,model=4'"),
        ("policies-int", lambda: audit_target(mlp, policies=5), "policies takes a policy"),
        ("policies-empty", lambda: audit(jnp.sin, x, policies=[]), "policies is empty"),
        ("params-float", lambda: audit_target(mlp, params=1.5), "params takes argument positions or names"),
        ("fraction-text", lambda: GpuEnvironment(mem_fraction="0.5"), "mem_fraction takes a number in (0, 1]"),
        ("budget-text", lambda: recommend_target(mlp, budget="lots"), "budget 'lots': not a size"),
        ("budget-twice", lambda: recommend_target(mlp, budget="1GiB", budget_bytes=2**30), "both give the budget"),
        ("fn-not-callable", lambda: audit(123, x), "audit takes the function to differentiate"),
    ]


@pytest.mark.parametrize("i", range(10), ids=lambda i: _wrong_types()[i][0])
def test_a_wrong_type_is_a_usage_error_naming_the_parameter(i: int) -> None:
    from te_ckpt_audit import UsageError

    _, call, said = _wrong_types()[i]
    with pytest.raises(UsageError) as caught:
        call()
    assert said in caught.value.message


def test_one_policy_as_text_is_one_policy() -> None:
    import jax
    import jax.numpy as jnp

    from te_ckpt_audit import audit

    report = audit(lambda x: jnp.sum(jnp.sin(x)), jax.ShapeDtypeStruct((4,), jnp.float32), policies="nothing_saveable")
    assert [r.policy for r in report.results] == ["nothing_saveable"]  # was read as its letters


# --- writes only where asked (item 13) ------------------------------------------------------------------


def test_a_relative_cache_folder_is_made_absolute_before_the_model_runs(folder: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from te_ckpt_audit_cli.files import compile_cache

    monkeypatch.setenv("TE_CKPT_AUDIT_CACHE", "rel-cache")
    assert compile_cache() == folder / "rel-cache" / "gpu-compiles"  # a model's os.chdir moves nothing
