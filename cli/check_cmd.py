"""`te-ckpt-audit check`: every target of `[tool.te-ckpt-audit]`, one summary, one exit code."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, assert_never

import typer

from te_ckpt_audit import ShardingSource, UsageError, check_target
from te_ckpt_audit.baselines import load_baseline
from te_ckpt_audit.config import load_config
from te_ckpt_audit.errors import AuditError
from te_ckpt_audit.gpus import FractionSource, GpuRequest, gpu_environment
from te_ckpt_audit.records import Run
from te_ckpt_audit.render import render_check_github, render_check_json, render_check_markdown, render_check_table

from . import options as opt
from . import process, terminal
from .files import check_baseline_file, compile_cache, refuse_overwriting, same_file, save_baseline
from .options import CheckFormat, default_jobs

ConfigPath = Annotated[
    str,
    typer.Option("--config", metavar="PATH",
                 help="The pyproject.toml holding [tool.te-ckpt-audit]; by default the nearest one, in this folder "
                 "or the first above it that has one (as git, ruff and pytest look), run from its folder."),
]
DEFAULT_CONFIG = "pyproject.toml"
# the keys of a target's table, by the parameter names the library's errors give them
_TARGET_WORDS = ("defines", "policies", "budgets", "budget", "inputs", "mesh", "params", "max_recompute",
                 "peak_budgets", "tpu", "gpu", "optimizer", "donate", "step", "time", "scope", "shardings")


def nearest_config(start: Path) -> Path | None:
    """The nearest pyproject.toml holding [tool.te-ckpt-audit]: in `start` or a folder above it."""
    for folder in (start, *start.parents):
        candidate = folder / DEFAULT_CONFIG
        if candidate.is_file() and "[tool.te-ckpt-audit" in candidate.read_text(errors="replace"):
            return candidate
    return None


@contextlib.contextmanager
def said_of_target(origin: str) -> Iterator[None]:
    """A target's error in the config file's words: `-D hiden` is its `targets[0].defines hiden`,
    `--policy` its `targets[0].policies` (the command line's flags are not what the user wrote)."""
    try:
        yield
    except AuditError as err:
        err.say_as({k: f"{origin}.{k}" for k in _TARGET_WORDS})
        raise
SaveFlag = Annotated[
    bool,
    typer.Option(
        "--save-baseline",
        help="Write this run's figures to the config's baseline file instead of comparing with it.",
    ),
]


def _in_this_environment(request: GpuRequest) -> GpuRequest:
    """A target's GPU request in this run's environment (XLA_FLAGS, the memory variables), its
    own mem_fraction winning over the variables, compiled into the tool's cache."""
    given = request.mem_fraction if request.environment.fraction_source is FractionSource.GIVEN else None
    return dataclasses.replace(request, environment=gpu_environment(os.environ, given), cache=compile_cache())


def check_renderer(fmt: CheckFormat) -> Callable[[Sequence[Run]], str]:
    match fmt:
        case CheckFormat.TABLE:
            return render_check_table
        case CheckFormat.JSON:
            return render_check_json
        case CheckFormat.MARKDOWN:
            return render_check_markdown
        case CheckFormat.GITHUB:
            return render_check_github
        case _:
            assert_never(fmt)


@terminal.at_the_edge
def check(
    config: ConfigPath = "pyproject.toml",
    format: opt.CheckFormatOption = CheckFormat.TABLE,  # noqa: A002 (the option's name)
    output: opt.Output = None,
    save_baseline_flag: SaveFlag = False,
    require_baseline: opt.RequireBaseline = False,
    debug: opt.Debug = False,
    emulate_gpu: opt.EmulateGpu = None,
) -> int:
    """Audit every target declared in [tool.te-ckpt-audit] of pyproject.toml against its budgets
    and the baseline; exit 1 if any check fails. --format markdown suits $GITHUB_STEP_SUMMARY,
    --format github prints annotations."""
    render = check_renderer(format)
    written = output
    terminal.check_report_destination(written)
    if config == DEFAULT_CONFIG and not Path(config).exists():
        found = nearest_config(Path.cwd())
        if found is not None:  # the project's own folder, as pytest runs from its rootdir
            written = None if written is None else str(Path(written).resolve())
            os.chdir(found.parent)
            terminal.say(f"{terminal.PROG}: using {found}")
    cfg = load_config(config)
    baseline = cfg.baseline
    reads = [("the config file", cfg.path), *([("the baseline", baseline)] if baseline is not None else [])]
    refuse_overwriting(written, [*reads, *(r for t in cfg.targets for r in t.reads())])
    reference = None
    if save_baseline_flag and baseline is None:
        raise UsageError(f"{config} names no baseline file", 'add baseline = "ckpt-baseline.json"')
    if save_baseline_flag and written is not None and baseline is not None and same_file(written, baseline):
        raise UsageError(f"--output names the baseline file {baseline}", "write the summary to another file")
    if save_baseline_flag and baseline is not None:
        check_baseline_file(baseline)
    if baseline is not None and not save_baseline_flag:
        if not baseline.exists():
            raise UsageError(
                f"baseline {cfg.baseline} (named in {config}) does not exist",
                f"create it with `{terminal.PROG} check --save-baseline`, and commit it",
            )
        reference = load_baseline(baseline)
    meshes = [t.mesh.devices for t in cfg.targets if t.mesh is not None and t.shardings is ShardingSource.COMPILED]
    # JAX reads its device count once: enough for the largest mesh, before the first target
    gpus = [t.gpu.model for t in cfg.targets if t.gpu is not None]
    process.prepare(emulate_gpu, max(meshes, default=0), gpus[0] if gpus else None,
                    tpu=any(t.tpu is not None for t in cfg.targets))
    targets = [t if t.gpu is None else dataclasses.replace(t, gpu=_in_this_environment(t.gpu)) for t in cfg.targets]
    runs: list[Run] = []
    jobs = default_jobs() if any(t.gpu is not None for t in targets) else 1
    quiet_stdout, compiling_on = terminal.stdout_kept_for_the_report(), process.running(jobs)
    with quiet_stdout, terminal.progress_on_stderr() as progress, compiling_on as pool:
        for i, t in enumerate(targets):
            with said_of_target(f"{cfg.path}: targets[{i}]"):
                runs.append(
                    check_target(t, baseline=reference, tolerance=cfg.tolerance, require_baseline=require_baseline,
                                 progress=progress, executor=pool, capture=process.xla_log_kept_off_stderr,
                                 known_names=True)
                )
    terminal.emit(render(runs), written)
    if save_baseline_flag:
        assert baseline is not None
        save_baseline(baseline, [(result.key, report) for report, result in runs if result.key is not None])
        terminal.say(f"{terminal.PROG}: baseline written to {cfg.baseline}")
    code = terminal.report_gate([result for _, result in runs], cfg.baseline)
    return terminal.report_policy_errors([report for report, _ in runs], code)
