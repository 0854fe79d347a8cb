"""`te-ckpt-audit [audit] TARGET`: what each checkpoint policy saves, recomputes and offloads."""

from __future__ import annotations

from collections.abc import Callable
from typing import assert_never

from rich.console import Console

from te_ckpt_audit import AuditReport, Scope, ShardingSource, TargetConfig, check_target, parse_mesh
from te_ckpt_audit.gate import CheckResult, load_baseline, parse_budget, save_baseline
from te_ckpt_audit.render import HotspotKey, render_json, render_markdown
from te_ckpt_audit.render import render_audit_html
from te_ckpt_audit.render import render_audit_check_markdown, render_check_github

from . import options as opt
from .options import OutputFormat
from te_ckpt_audit.render import TableView, render_table
from .terminal import (
    at_the_edge,
    emit,
    progress_on_stderr,
    report_gate,
    report_policy_errors,
    stdout_kept_for_the_report,
)


def renderer(fmt: OutputFormat, view: TableView) -> Callable[[AuditReport, CheckResult | None], str]:
    """The report's text; gate results also go to stderr, so JSON stays the report alone."""
    match fmt:
        case OutputFormat.TABLE:
            return lambda report, _: render_table(report, view)
        case OutputFormat.JSON:
            return lambda report, _: render_json(report, view.top, view.by)
        case OutputFormat.MARKDOWN:
            return lambda report, gate: (
                render_markdown(report, view.top, view.by)
                if gate is None
                else render_audit_check_markdown(report, gate)
            )
        case OutputFormat.GITHUB:
            return lambda report, gate: render_check_github([(report, gate or CheckResult(report.target, (), ()))])
        case OutputFormat.HTML:
            return lambda report, _: render_audit_html(report)
        case _:
            assert_never(fmt)


def table_view(top: int, by: HotspotKey | None, equations: bool, to_file: bool) -> TableView:
    """Tables fit the terminal and use colour when stdout is one (Rich honours NO_COLOR and COLUMNS);
    a file gets 80 plain columns."""
    if to_file:
        return TableView(top, by, equations)
    out = Console()
    return TableView(top, by, equations, out.width, out.is_terminal and not out.no_color)


@at_the_edge
def audit(
    target: opt.Target,
    policy: opt.Policies = None,
    inputs: opt.Inputs = None,
    define: opt.Defines = None,
    scope: opt.ScopeOption = Scope.AUTO,
    equations: opt.Equations = False,
    top: opt.Top = 10,
    by: opt.By = None,
    format: opt.Format = OutputFormat.TABLE,  # noqa: A002 (the option's name)
    output: opt.Output = None,
    budget: opt.Budgets = None,
    max_recompute: opt.MaxRecompute = None,
    baseline: opt.Baseline = None,
    tolerance: opt.Tolerance = 0.0,
    require_baseline: opt.RequireBaseline = False,
    save_baseline_to: opt.SaveBaseline = None,
    compile: opt.Compile = False,  # noqa: A002 (the option's name)
    mesh: opt.MeshOption = None,
    shardings: opt.Shardings = ShardingSource.COMPILED,
    debug: opt.Debug = False,
    version: opt.Version = False,
    emulate_gpu: opt.EmulateGpu = None,  # consumed by app.main before parsing; listed for --help
) -> int:
    """Show what each checkpoint policy saves, recomputes and offloads for TARGET, side by side.

    TARGET's example inputs come from --inputs, else from NAME_inputs() or example_inputs() beside
    it. `te-ckpt-audit TARGET` is short for `te-ckpt-audit audit TARGET`. Exit codes: 0 ok, 1 a
    check failed, 2 usage or bad input, 3 the target failed to load or trace, 4 internal error.
    """
    # Bad budgets and baselines fail before the user's code runs.
    budgets = [parse_budget(b) for b in budget or []]
    reference = load_baseline(baseline) if baseline is not None else None
    gating = bool(budgets) or max_recompute is not None or reference is not None
    # The user's code may print, but stdout carries only the report. The spinner nests inside the
    # redirect: it swaps sys.stdout too while it runs, and must restore the redirect, not stdout.
    with stdout_kept_for_the_report(), progress_on_stderr() as progress:
        config = TargetConfig(
            target,
            inputs,
            tuple(define or ()),
            tuple(policy or ()),
            scope,
            tuple(budgets),
            max_recompute,
            None if mesh is None else parse_mesh(mesh),
            shardings,
            compile,
        )
        report, gate = check_target(
            config, baseline=reference, tolerance=tolerance, require_baseline=require_baseline, progress=progress
        )
    emit(renderer(format, table_view(top, by, equations, output is not None))(report, gate if gating else None), output)
    if save_baseline_to is not None:
        assert gate.key is not None
        save_baseline(save_baseline_to, [(gate.key, report)])
    return report_policy_errors([report], report_gate([gate], baseline))
