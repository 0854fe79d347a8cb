"""`te-ckpt-audit recommend TARGET --budget SIZE`: the policy that fits with the least recompute."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Annotated, assert_never

import typer

from te_ckpt_audit import DEFAULT_MAX_EVALS, ExitCode, Recommendation, Scope, ShardingSource, recommend_target
from te_ckpt_audit.render import format_bytes, render_recommend_html, render_recommend_json, render_recommend_text
from te_ckpt_audit.sizes import count_at_least_one, parse_size, positive_bytes

from . import options as opt
from . import process
from .options import MeshOptions, TargetOptions
from .terminal import PROG, at_the_edge, emit, progress_on_stderr, report_to, say, stdout_kept_for_the_report


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
    str,
    typer.Option(
        "--budget",
        metavar="SIZE",
        help="Device memory for activations (B, KB, MB, GB, KiB, MiB, GiB), per device with --mesh.",
        show_default=False,
    ),
]
AllowOffload = Annotated[
    bool,
    typer.Option("--allow-offload", help="Also search policies that offload names to host memory."),
]
MaxEvals = Annotated[
    int,
    typer.Option("--max-evals", metavar="N", help="Analyse at most N policies (each is one JAX linearization)."),
]
NoPresets = Annotated[
    bool,
    typer.Option("--no-presets", help="Search name subsets only, not the named presets."),
]
RecommendFormatOption = Annotated[
    RecommendFormat,
    typer.Option("--format", "-f", help="table for a terminal, json for machines, html for one self-contained page."),
]


@at_the_edge
def recommend(
    target: opt.Target,
    budget: Budget,
    mesh: opt.MeshOption = None,
    allow_offload: AllowOffload = False,
    max_evals: MaxEvals = DEFAULT_MAX_EVALS,
    no_presets: NoPresets = False,
    inputs: opt.Inputs = None,
    define: opt.Defines = None,
    scope: opt.ScopeOption = Scope.AUTO,
    format: RecommendFormatOption = RecommendFormat.TABLE,  # noqa: A002 (the option's name)
    output: opt.Output = None,
    debug: opt.Debug = False,
    emulate_gpu: opt.EmulateGpu = None,
) -> int:
    """Find the checkpoint policy whose activation bytes fit --budget with the least recompute.

    Searches the named presets, save_only_these_names over the model's checkpoint names (alone and
    with dots and TE GEMMs) and, with --allow-offload, offloading; every point shown is JAX's own
    linearization. Prints the winner as a --policy spec, Python that builds it, MaxText's remat
    settings and the Pareto frontier. Exit codes: 0 something fits, 1 nothing fits (the closest is
    shown), 2 usage or bad input, 3 the target failed to load or trace, 4 internal error.
    """
    size = positive_bytes(parse_size(budget))  # a bad budget fails before the user's code runs
    count_at_least_one(max_evals, "max evaluations", "e.g. --max-evals 64")
    what = TargetOptions.parse(target, inputs, define, scope)
    where = MeshOptions.parse(mesh, ShardingSource.COMPILED)
    written = output
    report_to(written)
    process.prepare(emulate_gpu, where.devices)
    with stdout_kept_for_the_report(), progress_on_stderr() as progress:
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
        )
    emit(renderer(format)(rec), written)
    if rec.recommended is None:
        closest = rec.closest
        near = f"; closest: {closest.policy} at {format_bytes(closest.activation_bytes)}" if closest else ""
        say(f"{PROG}: nothing fits {format_bytes(size)}{near}")
        return ExitCode.CHECK_FAILED
    return ExitCode.OK
