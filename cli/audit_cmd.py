"""`te-ckpt-audit [audit] TARGET`: what each checkpoint policy saves, recomputes and offloads."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import assert_never

from rich.console import Console

from te_ckpt_audit import (
    AuditReport,
    CheckResult,
    Scope,
    ShardingSource,
    TargetConfig,
    UsageError,
    check_config,
    check_target,
    parse_policies,
)
from te_ckpt_audit.baselines import load_baseline
from te_ckpt_audit.config import files_read
from te_ckpt_audit.gating import PeakGate
from te_ckpt_audit.gpus import DEFAULT_GPUS_PER_HOST
from te_ckpt_audit.render import (
    TableView,
    render_audit_check_markdown,
    render_audit_html,
    render_check_github,
    render_json,
    render_markdown,
    render_table,
)
from te_ckpt_audit.tpus import TpuRequest, parse_tpu

from . import options as opt
from . import process
from .files import check_baseline_file, compile_cache, refuse_overwriting, same_file, save_baseline
from .options import GateOptions, GpuOptions, MeshOptions, OutputFormat, OutputOptions, TargetOptions
from .terminal import (
    at_the_edge,
    check_report_destination,
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
            return lambda report, _: render_audit_html(report, view.top, view.by)
        case _:
            assert_never(fmt)


def table_view(out: OutputOptions) -> TableView:
    """Tables fit the terminal and use colour when stdout is one (Rich honours NO_COLOR); COLUMNS
    sets the width; a pipe or a file gets the width the tables need, never a name split."""
    if out.output is not None:
        return TableView(out.top, out.by, out.equations, None)
    console = Console()
    width = console.width if console.is_terminal or os.environ.get("COLUMNS", "").isdigit() else None
    return TableView(out.top, out.by, out.equations, width, console.is_terminal and not console.no_color)


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
    gpu: opt.GpuName = None,
    tpu: opt.TpuName = None,
    gpu_config: opt.GpuConfig = None,
    gpus_per_host: opt.GpusPerHost = DEFAULT_GPUS_PER_HOST,
    optimizer: opt.OptimizerOption = None,
    mem_fraction: opt.MemFraction = None,
    fit: opt.Fit = False,
    peak_budget: opt.PeakBudgets = None,
    step: opt.Step = False,
    donate: opt.Donate = None,
    jobs: opt.Jobs = None,
    cluster: opt.Cluster = None,
    timed: opt.Time = False,
    network_gbps: opt.NetworkGbps = None,
    calibrate: opt.Calibrate = None,
    params: opt.Params = None,
    debug: opt.Debug = False,
    version: opt.Version = False,
    emulate_gpu: opt.EmulateGpu = None,
    remat3: opt.Remat3Option = None,
    name_lines: opt.NameLines = False,
) -> int:
    """Show what each checkpoint policy saves, recomputes and offloads for TARGET, side by side.

    TARGET's example inputs come from --inputs, else from NAME_inputs() or example_inputs() beside
    it. `te-ckpt-audit TARGET` is short for `te-ckpt-audit audit TARGET`. Exit codes: 0 ok, 1 a
    check failed, 2 usage or bad input, 3 the target failed to load or trace, 4 internal error.
    """
    what = TargetOptions.parse(target, inputs, define, scope, params)
    where = MeshOptions.parse(mesh, shardings)
    gate = GateOptions.parse(budget, max_recompute, baseline, tolerance, require_baseline, save_baseline_to)
    if tpu is not None and (gpu is not None or gpu_config is not None):
        raise UsageError("--tpu and --gpu both name the step's target", "give one of them")
    on_tpu = None if tpu is None else TpuRequest(parse_tpu(tpu, where.devices or 1), optimizer, timed, step,
                                                 tuple(donate or ()))
    on_gpu = GpuOptions.parse(
        gpu, gpu_config, gpus_per_host, None if on_tpu else optimizer, mem_fraction, fit and not on_tpu, peak_budget,
        compile_cache(), step and not on_tpu, None if on_tpu else donate, jobs, cluster, timed and not on_tpu,
        network_gbps, calibrate,
    )
    peak = on_gpu.peak if on_tpu is None else PeakGate(fit)  # --fit: libtpu's verdict on the slice
    out = OutputOptions(format, None if output is None else Path(output), top, by, equations)
    check_report_destination(out.output)
    reads = files_read(what.target, what.inputs, policy or (), on_gpu.request)
    refuse_overwriting(out.output, [*reads, *([("the baseline", gate.baseline)] if gate.baseline else [])])
    if out.output is not None and gate.save_baseline is not None and same_file(out.output, gate.save_baseline):
        raise UsageError(f"--output and --save-baseline both name {out.output}",
                         "write the report and the baseline to two files")
    if gate.save_baseline is not None:
        check_baseline_file(gate.save_baseline)
    specs = parse_policies(policy or (["as-is"] if step else []), what.target) or None  # once, here
    if step and (gate.gating or gate.save_baseline is not None or what.params is not None):
        given = "--params" if what.params is not None else "--budget, --max-recompute and baselines"
        raise UsageError(f"{given}: --step compiles a training step of the target's own, whose residuals are "
                         "inside it and not audited", "gate its peak with --fit or --peak-budget")
    # one gate, as `check` runs it: its limits fail before the user's code runs
    config = TargetConfig(what.target, what.inputs, what.defines, specs or (), what.scope, gate.budgets,
                          gate.max_recompute, where.mesh, where.shardings, compile, on_gpu.request, peak,
                          what.params, on_tpu, remat3.value if remat3 is not None else None, name_lines)
    check_config(config, gate.tolerance)
    reference = load_baseline(gate.baseline) if gate.baseline is not None else None
    process.prepare(emulate_gpu, where.devices, None if on_gpu.request is None else on_gpu.request.model,
                    tpu=on_tpu is not None)
    # The user's code may print, but stdout carries only the report. The spinner nests inside the
    # redirect: it swaps sys.stdout too while it runs, and must restore the redirect, not stdout.
    compiling_on = process.running(on_gpu.jobs, on_gpu.cluster)  # here, worker processes or a cluster
    with stdout_kept_for_the_report(), progress_on_stderr() as progress, compiling_on as pool:
        report, result = check_target(config, baseline=reference, tolerance=gate.tolerance,
                                      require_baseline=gate.require_baseline, progress=progress, executor=pool,
                                      capture=process.xla_log_kept_off_stderr)
    key = result.key
    assert key is not None
    gated = gate.gating or peak.active
    emit(renderer(out.format, table_view(out))(report, result if gated else None), out.output)
    if gate.save_baseline is not None:
        save_baseline(gate.save_baseline, [(key, report)])
    return report_policy_errors([report], report_gate([result], gate.baseline))
