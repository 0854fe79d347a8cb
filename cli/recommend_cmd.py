"""`te-ckpt-audit recommend TARGET --budget SIZE`: the policy that fits with the least recompute."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Annotated, assert_never

import typer

from te_ckpt_audit import (
    DEFAULT_MAX_EVALS,
    Recommendation,
    Scope,
    ShardingSource,
    recommend_target,
    throughput_keyword,
)
from te_ckpt_audit.config import files_read
from te_ckpt_audit.errors import UsageError
from te_ckpt_audit.gpus import DEFAULT_GPUS_PER_HOST
from te_ckpt_audit.render import format_bytes, render_recommend_html, render_recommend_json, render_recommend_text
from te_ckpt_audit.render.recommend import no_best_words
from te_ckpt_audit.sizes import budget_size, count_at_least_one, positive_bytes
from te_ckpt_audit.tpus import TpuRequest, parse_tpu

from . import options as opt
from . import process
from .exit_codes import ExitCode
from .files import compile_cache, refuse_overwriting
from .options import GpuOptions, MeshOptions, TargetOptions
from .terminal import (
    PROG,
    at_the_edge,
    check_report_destination,
    emit,
    progress_on_stderr,
    say,
    stdout_kept_for_the_report,
)


class RecommendFormat(enum.StrEnum):
    TABLE = "table"
    JSON = "json"
    HTML = "html"  # one self-contained file: inline SVG, no network


def renderer(fmt: RecommendFormat) -> Callable[[Recommendation], str]:
    match fmt:
        case RecommendFormat.TABLE:
            return render_recommend_text
        case RecommendFormat.JSON:
            return render_recommend_json
        case RecommendFormat.HTML:
            return render_recommend_html
        case _:
            assert_never(fmt)


Budget = Annotated[
    str | None,
    typer.Option(
        "--budget",
        metavar="SIZE",
        help="Device memory for activations (B, KB, MB, GB, KiB, MiB, GiB), per device with --mesh. "
        "With --gpu or --tpu it only bounds which points are compiled (default: the device's usable memory).",
        show_default=False,
    ),
]
MaxCompiles = Annotated[
    int | None,
    typer.Option("--max-compiles", metavar="N", help="With --gpu or --tpu: compile at most N points (policy, and "
                 "batch with --maximize throughput). Default: 8.", show_default=False),
]
Maximize = Annotated[
    str | None,
    typer.Option(
        "--maximize",
        metavar="DEFINE|throughput[:KEYWORD]",
        help="With --gpu or --tpu: DEFINE: also find the largest value of this inputs keyword (e.g. batch) whose step "
        "fits under the recommended policy, by compiled peak. throughput: the policy and batch (the inputs "
        "keyword batch, or KEYWORD) whose compiled step fits with the most estimated throughput per GPU "
        "(--time's estimate; each point compiled; on a TPU, libtpu's verdict and cycle estimates).",
        show_default=False,
    ),
]
AllowOffload = Annotated[
    bool,
    typer.Option("--allow-offload", help="Also search policies that offload names to host memory (with "
                 "--synthesize on a GPU or a v5e: each name saved, offloaded over the host link, or recomputed)."),
]
MaxEvals = Annotated[
    int,
    typer.Option("--max-evals", metavar="N", help="Analyse at most N policies (each is one JAX linearization)."),
]
NoPresets = Annotated[
    bool,
    typer.Option("--no-presets", help="Search name subsets only, not the named presets."),
]
Synthesize = Annotated[
    bool,
    typer.Option(
        "--synthesize",
        help="With --maximize throughput: make the policy instead of choosing among presets: which of the "
        "model's checkpoint names to save, with the batch, solved exactly on a per-name model of bytes and "
        "time fitted on compiles, every pick compiled (--max-compiles, 20 by default); the presets are "
        "compiled beside the pick, and the names solved once more on top of the best of them.",
    ),
]
RecommendFormatOption = Annotated[
    RecommendFormat,
    typer.Option("--format", "-f", help="table for a terminal, json for machines, html for one self-contained page."),
]


@at_the_edge
def recommend(
    target: opt.Target,
    budget: Budget = None,
    mesh: opt.MeshOption = None,
    allow_offload: AllowOffload = False,
    max_evals: MaxEvals = DEFAULT_MAX_EVALS,
    no_presets: NoPresets = False,
    inputs: opt.Inputs = None,
    define: opt.Defines = None,
    scope: opt.ScopeOption = Scope.AUTO,
    format: RecommendFormatOption = RecommendFormat.TABLE,  # noqa: A002 (the option's name)
    output: opt.Output = None,
    gpu: opt.GpuName = None,
    gpu_config: opt.GpuConfig = None,
    gpus_per_host: opt.GpusPerHost = DEFAULT_GPUS_PER_HOST,
    optimizer: opt.OptimizerOption = None,
    mem_fraction: opt.MemFraction = None,
    max_compiles: MaxCompiles = None,
    maximize: Maximize = None,
    jobs: opt.Jobs = None,
    cluster: opt.Cluster = None,
    timed: opt.Time = False,
    network_gbps: opt.NetworkGbps = None,
    calibrate: opt.Calibrate = None,
    params: opt.Params = None,
    debug: opt.Debug = False,
    emulate_gpu: opt.EmulateGpu = None,
    tpu: opt.TpuName = None,
    synthesize: Synthesize = False,
    name_lines: opt.NameLines = False,
) -> int:
    """Find the checkpoint policy whose activation bytes fit --budget with the least recompute.

    Searches the named presets, save_only_these_names over the model's checkpoint names (alone and
    with dots and TE GEMMs) and, with --allow-offload, offloading; every point shown is JAX's own
    linearization. Prints the winner as a --policy spec, Python that builds it, MaxText's remat
    settings and the Pareto frontier. With --gpu, the winner is the least-recompute frontier point
    whose training step, compiled for that GPU, fits its usable memory (points compiled in order of
    recompute, --jobs at a time, until one fits); with --maximize throughput, the policy and batch whose
    compiled step fits with the most estimated throughput. With --tpu, the same on a TPU slice
    (libtpu's verdict, its cycle estimates). Exit codes: 0 something
    fits, 1 nothing fits (the closest is shown), 2 usage or bad input, 3 the target failed to load or
    trace, 4 internal error.
    """
    size = None if budget is None else positive_bytes(budget_size(budget))  # fails before the user's code runs
    if tpu is not None and (gpu is not None or gpu_config is not None):
        raise UsageError("--tpu and --gpu both name the step's target", "give one of them")
    wants_time = timed or throughput_keyword(maximize) is not None
    on_gpu = GpuOptions.parse(gpu, gpu_config, gpus_per_host, None if tpu else optimizer, mem_fraction, False, None,
                              compile_cache(), jobs=jobs, cluster=cluster, time=wants_time and tpu is None,
                              network_gbps=network_gbps, calibrate=calibrate)
    count_at_least_one(max_evals, "max_evals", 64)
    what = TargetOptions.parse(target, inputs, define, scope, params)
    where = MeshOptions.parse(mesh, ShardingSource.COMPILED)
    on_tpu = None if tpu is None else TpuRequest(parse_tpu(tpu, where.devices or 1), optimizer, wants_time)
    written = output
    check_report_destination(written)
    refuse_overwriting(written, files_read(what.target, what.inputs, (), on_gpu.request))
    process.prepare(emulate_gpu, where.devices, None if on_gpu.request is None else on_gpu.request.model,
                    tpu=on_tpu is not None)
    compiling_on = process.running(on_gpu.jobs, on_gpu.cluster)  # here, worker processes or a cluster
    with stdout_kept_for_the_report(), progress_on_stderr() as progress, compiling_on as pool:
        rec = recommend_target(
            what.target,
            size,
            inputs=what.inputs,
            defines=what.defines,
            allow_offload=allow_offload,
            max_evals=max_evals,
            scope=what.scope,
            presets=() if no_presets else None,
            progress=progress,
            mesh=where.mesh,
            gpu=on_gpu.request,
            max_compiles=max_compiles,
            maximize=maximize,
            params=what.params,
            executor=pool,
            jobs=on_gpu.jobs,
            capture=process.xla_log_kept_off_stderr,
            tpu=on_tpu,
            synthesize=synthesize,
            name_lines=True if name_lines else None,
        )
    emit(renderer(format)(rec), written)
    if rec.throughput is not None:
        if rec.throughput.best is None:
            say(f"{PROG}: {no_best_words(rec.throughput, rec.device_name or 'GPU')}")
            return ExitCode.CHECK_FAILED
        return ExitCode.OK
    if rec.recommended is None:
        closest = rec.closest
        near = f"; closest: {closest.policy} at {format_bytes(closest.activation_bytes)}" if closest else ""
        limit = f"the {rec.device_name}" if rec.device_name is not None else format_bytes(rec.budget_bytes)
        say(f"{PROG}: nothing fits {limit}{near}")
        return ExitCode.CHECK_FAILED
    return ExitCode.OK
