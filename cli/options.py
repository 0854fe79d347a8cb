"""What the user can type: the str-enums of every choice, the options shared by commands (each
defined once), and the option groups each command parses its options into, once, at the edge."""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from pathlib import Path
from typing import Annotated, Literal

import jax
import typer

from te_ckpt_audit import (
    DEFAULT_POLICIES,
    MeshSpec,
    Scope,
    ShardingSource,
    UsageError,
    __version__,
    parse_mesh,
    parse_params,
)
from te_ckpt_audit.config import Defines as DefineMap
from te_ckpt_audit.config import parse_defines
from te_ckpt_audit.gating import PeakGate
from te_ckpt_audit.gpus import (
    DEFAULT_GPUS_PER_HOST,
    GpuRequest,
    Optimizer,
    gpu_environment,
    gpu_model,
    model_of_config,
    read_profile,
)
from te_ckpt_audit.records import Budget, HotspotKey
from te_ckpt_audit.sizes import MAX_JOBS, parse_budget

from .files import check_writable

# The library names a value by its parameter (`$max_compiles$`); the command line, by its flag.
FLAGS = {
    "params": "--params", "max_evals": "--max-evals", "max_compiles": "--max-compiles", "budget_bytes": "--budget",
    "budget": "--budget", "gpu": "--gpu", "gpu_config": "--gpu-config", "maximize": "--maximize", "defines": "-D",
    "tpu": "--tpu", "synthesize": "--synthesize", "name_lines": "--name-lines", "budgets": "--budget POLICY=SIZE",
    "policies": "--policy", "tolerance": "--tolerance", "max_recompute": "--max-recompute", "fit": "--fit",
    "peak_budgets": "--peak-budget", "shardings": "--shardings", "mesh": "--mesh", "inputs": "--inputs",
    "save_baseline": "--save-baseline", "mem_fraction": "--mem-fraction", "donate": "--donate", "step": "--step",
    "optimizer": "--optimizer", "gpus_per_host": "--gpus-per-host", "jobs": "--jobs", "batch": "--batch",
    "layouts": "--layout", "time": "--time", "network_gbps": "--network-gbps", "calibrate": "--calibrate",
    "debug": "rerun with --debug for the traceback",
}


class OutputFormat(enum.StrEnum):
    TABLE = "table"
    JSON = "json"
    MARKDOWN = "markdown"
    GITHUB = "github"  # GitHub Actions annotations for check failures and warnings
    HTML = "html"  # one self-contained page (inline SVG, no network): audit only


class CheckFormat(enum.StrEnum):
    """check's formats: a check covers many targets, so no one-page html."""

    TABLE = "table"
    JSON = "json"
    MARKDOWN = "markdown"
    GITHUB = "github"


class MaxTextFormat(enum.StrEnum):
    """maxtext's formats (its step is compiled, not audited: no residual page or annotations)."""

    TABLE = "table"
    JSON = "json"
    MARKDOWN = "markdown"


def _writable_output(text: str | None) -> str | None:
    """Fail before the audit runs, not after it, when the report could not be written.
    (Paths arrive as str: Typer would load pydantic, a fifth of a second, to coerce a Path.)"""
    if text is not None:
        try:
            check_writable(text)
        except UsageError as err:
            message, hint = err.worded(FLAGS)
            raise typer.BadParameter(f"{message} ({hint})") from None
    return text


def _percent(value: float | None) -> float | None:
    """A percentage limit: NaN or infinity would switch its gate off."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number of percent")
    return value


# --- option groups ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class TargetOptions:
    """What to audit: the target, its inputs callable, -D defines, the scope policies apply at."""

    target: str
    inputs: str | None
    defines: DefineMap
    scope: Scope
    params: tuple[int | str, ...] | Literal["all"] | None = None  # the trained arguments (None: the first)

    @classmethod
    def parse(cls, target: str, inputs: str | None, define: list[str] | None, scope: Scope,
              params: list[str] | None = None) -> TargetOptions:
        return cls(target, inputs, parse_defines(define or []), scope, parse_params(params) if params else None)


@dataclasses.dataclass(frozen=True, slots=True)
class MeshOptions:
    """Where the inputs live: a mesh of virtual CPU devices or an abstract one, or none."""

    mesh: MeshSpec | None
    shardings: ShardingSource

    @classmethod
    def parse(cls, mesh: str | None, shardings: ShardingSource) -> MeshOptions:
        return cls(None if mesh is None else parse_mesh(mesh), shardings)

    @property
    def devices(self) -> int:
        """The virtual CPU devices this needs (an abstract mesh needs none)."""
        if self.mesh is None or self.shardings is ShardingSource.ABSTRACT:
            return 0
        return self.mesh.devices


@dataclasses.dataclass(frozen=True, slots=True)
class GateOptions:
    """The CI gate: budgets, a recompute ceiling, a baseline to compare with or to save."""

    budgets: tuple[Budget, ...]
    max_recompute: float | None
    baseline: Path | None
    tolerance: float
    require_baseline: bool
    save_baseline: Path | None

    @classmethod
    def parse(
        cls, budget: list[str] | None, max_recompute: float | None, baseline: str | None, tolerance: float,
        require_baseline: bool, save_baseline: str | None,
    ) -> GateOptions:
        given = None if baseline is None else Path(baseline)  # read now, before the model's code runs
        return cls(tuple(parse_budget(b) for b in budget or []), max_recompute, given, tolerance,
                   require_baseline, None if save_baseline is None else Path(save_baseline))

    @property
    def gating(self) -> bool:
        """Whether any limit is set (a report then also says pass or fail)."""
        return bool(self.budgets) or self.max_recompute is not None or self.baseline is not None


@dataclasses.dataclass(frozen=True, slots=True)
class GpuOptions:
    """`--gpu`: the GPU each policy's training step is compiled for (in the run's environment:
    XLA_FLAGS and the memory variables JAX reads, read here), the peak gate, and how many
    policies compile at once."""

    request: GpuRequest | None
    peak: PeakGate
    jobs: int = 1
    cluster: str | None = None  # a Dask scheduler's address: policies compile on its workers

    @classmethod
    def parse(
        cls, gpu: str | None, gpu_config: str | None, gpus_per_host: int, optimizer: Optimizer | None,
        mem_fraction: float | None, fit: bool, peak_budget: list[str] | None, cache: Path | None,
        step: bool = False, donate: list[int] | None = None, jobs: int | None = None, cluster: str | None = None,
        time: bool = False, network_gbps: float | None = None, calibrate: str | None = None,
    ) -> GpuOptions:
        if gpu is not None and gpu_config is not None:
            raise UsageError("--gpu and --gpu-config both name a GPU", "give one of them")
        peak = PeakGate(fit, tuple(parse_budget(b, "peak_budget") for b in peak_budget or []))
        if gpu is None and gpu_config is None:
            given = [o for o, on in (("--optimizer", optimizer is not None), ("--fit", fit),
                                     ("--peak-budget", bool(peak_budget)),
                                     ("--gpus-per-host", gpus_per_host != DEFAULT_GPUS_PER_HOST),
                                     ("--mem-fraction", mem_fraction is not None),
                                     ("--step", step), ("--donate", bool(donate)), ("--jobs", jobs is not None),
                                     ("--cluster", cluster is not None), ("--time", time),
                                     ("--network-gbps", network_gbps is not None),
                                     ("--calibrate", calibrate is not None))
                     if on]
            if given:
                hint = "add --gpu NAME (`te-ckpt-audit gpus` lists them)" + (
                    " or --tpu NAME" if given[0] in ("--time", "--optimizer", "--fit") else "")
                raise UsageError(f"{given[0]} is about the step compiled for a GPU", hint)
            return cls(None, peak)
        # the values are checked where they are made (GpuEnvironment, GpuRequest), named by their flags here
        model = gpu_model(gpu) if gpu is not None else model_of_config(str(gpu_config))
        environment = gpu_environment(os.environ, mem_fraction)
        profile = None if calibrate is None else read_profile(calibrate)
        request = GpuRequest(model, optimizer, gpus_per_host, environment, cache, step, tuple(donate or ()), time,
                             network_gbps, profile)
        if cluster is not None and jobs is not None:
            raise UsageError("--cluster and --jobs both say where policies compile", "give one of them")
        if cluster is not None and not cluster.strip():
            raise UsageError("--cluster is empty", "give the Dask scheduler's address, e.g. tcp://host:8786")
        return cls(request, peak, default_jobs() if jobs is None else jobs, cluster)


def default_jobs() -> int:
    """Policies compiled at once by default: each compiles its two GEMM backends at once, so one
    policy per two cores (one process on this 2-core machine)."""
    return max(1, (os.cpu_count() or 1) // 2)


@dataclasses.dataclass(frozen=True, slots=True)
class OutputOptions:
    """How the report is written, and where (standard output, or a file)."""

    format: OutputFormat
    output: Path | None
    top: int = 10
    by: HotspotKey | None = None
    equations: bool = False


# --- the options, each defined once --------------------------------------------------------------------


Target = Annotated[
    str,
    typer.Argument(
        metavar="TARGET",
        help="The function to audit, as path/to/file.py:NAME or package.module:NAME. "
        "Its module is imported, so its code runs.",
        show_default=False,
    ),
]
def complete_policy(incomplete: str) -> list[str]:
    """Shell completion of --policy: every spec `te-ckpt-audit policies` lists that starts so."""
    from te_ckpt_audit.specs import available_policies

    return [spec for spec, _ in available_policies() if spec.startswith(incomplete)]


def complete_gpu(incomplete: str) -> list[str]:
    """Shell completion of --gpu: the catalog's GPU names and their short forms."""
    from te_ckpt_audit.gpus import ALIASES, CATALOG

    return sorted(n for n in {*CATALOG, *ALIASES} if n.startswith(incomplete))


Policies = Annotated[
    list[str] | None,
    typer.Option(
        "--policy",
        "-p",
        metavar="SPEC",
        autocompletion=complete_policy,
        help="A checkpoint policy to compare; repeat for several. `te-ckpt-audit policies` lists "
        f"the specs. Default: {', '.join(DEFAULT_POLICIES)}; as-is first for a model with checkpoints.",
        show_default=False,
    ),
]
Inputs = Annotated[
    str | None,
    typer.Option(
        "--inputs",
        metavar="FILE:CALLABLE",
        help="A callable returning the example arguments (jax.ShapeDtypeStruct pytrees). "
        "Default: NAME_inputs, else example_inputs, beside the target.",
        show_default=False,
    ),
]
Defines = Annotated[
    list[str] | None,
    typer.Option(
        "--define",
        "-D",
        metavar="KEY=VALUE",
        help="Set a keyword parameter of the inputs callable, e.g. -D seq=8192; repeat for several.",
        show_default=False,
    ),
]
ScopeOption = Annotated[
    Scope,
    typer.Option(
        "--scope",
        help="Where the policy applies: inner replaces the policy of the model's own checkpoints, "
        "outer wraps the whole function in one jax.checkpoint, auto picks inner if it has any.",
    ),
]


class Remat3Mode(enum.StrEnum):
    ON = "on"
    OFF = "off"
    BOTH = "both"


Remat3Option = Annotated[
    Remat3Mode | None,
    typer.Option(
        "--remat3",
        help="JAX's remat implementation: on (its new remat, jax_remat3), off (the current one), or both "
        "side by side, with a finding and a failed budget where a policy changes; default: as JAX_REMAT3.",
        show_default=False,
    ),
]
NameLines = Annotated[
    bool,
    typer.Option(
        "--name-lines",
        help="Give each matmul line of the model's own code a checkpoint name, its file's stem and line "
        "(gpt_45 for gpt.py line 45), as recommend --synthesize does for a model that names nothing: "
        "policies can then save it by name before the code is edited.",
    ),
]
Equations = Annotated[
    bool,
    typer.Option("--equations", help="Add the per-equation table: what each policy does to every equation."),
]
Top = Annotated[
    int,
    typer.Option(
        "--top", min=0, metavar="N", help="Show the N module paths or source lines with the largest residuals."
    ),
]
By = Annotated[
    HotspotKey | None,
    typer.Option(
        "--by",
        case_sensitive=False,
        help="Group the largest residuals by module path (the default where the model has them) "
        "or by source line.",
    ),
]
Format = Annotated[
    OutputFormat,
    typer.Option(
        "--format",
        "-f",
        help="table for a terminal, json for machines, markdown for a CI summary, github for "
        "GitHub Actions annotations (::error at the model line of the largest residual), html for "
        "one self-contained page.",
    ),
]
CheckFormatOption = Annotated[
    CheckFormat,
    typer.Option(
        "--format",
        "-f",
        help="table for a terminal, json for machines, markdown for a CI summary, github for "
        "GitHub Actions annotations.",
    ),
]
MaxTextFormatOption = Annotated[
    MaxTextFormat,
    typer.Option("--format", "-f", help="table for a terminal, json for machines, markdown for a CI summary "
                 "(--recommend: table or json)."),
]
Budgets = Annotated[
    list[str] | None,
    typer.Option(
        "--budget",
        metavar="[POLICY=]SIZE",
        help="Fail (exit 1) when activation bytes exceed SIZE (B, KB, MB, GB, KiB, MiB, GiB), for "
        "every policy or, as POLICY=SIZE, for one; repeat for several.",
        show_default=False,
    ),
]
MaxRecompute = Annotated[
    float | None,
    typer.Option(
        "--max-recompute",
        metavar="PCT",
        min=0.0,
        callback=_percent,
        help="Fail (exit 1) when a policy recomputes more than PCT percent of the forward FLOPs.",
        show_default=False,
    ),
]
Baseline = Annotated[
    str | None,
    typer.Option(
        "--baseline",
        metavar="FILE",
        help="Compare activation bytes with a baseline saved by --save-baseline; growth beyond "
        "--tolerance fails (exit 1), shrinkage is reported, a policy not in it is noted.",
        show_default=False,
    ),
]
RequireBaseline = Annotated[
    bool,
    typer.Option(
        "--require-baseline",
        help="Fail (exit 1) when a target or policy has no figure in the baseline, instead of noting it.",
    ),
]
Tolerance = Annotated[
    float,
    typer.Option(
        "--tolerance", metavar="PCT", min=0.0, callback=_percent, help="Growth over the baseline allowed, in percent."
    ),
]
SaveBaseline = Annotated[
    str | None,
    typer.Option(
        "--save-baseline",
        metavar="FILE",
        callback=_writable_output,
        help="Write this run's activation bytes per policy to FILE, as the baseline for later runs; "
        "other entries already in FILE are kept.",
        show_default=False,
    ),
]
MeshOption = Annotated[
    str | None,
    typer.Option(
        "--mesh",
        metavar="AXIS=SIZE,...",
        help="Audit on a device mesh, e.g. data=8,model=4: that many virtual CPU devices; the inputs "
        "callable gets the jax.sharding.Mesh as keyword `mesh`. Bytes then also come per device, as "
        "XLA's SPMD partitioner shards each residual; budgets and baselines apply per device.",
        show_default=False,
    ),
]
Shardings = Annotated[
    ShardingSource,
    typer.Option(
        "--shardings",
        help="With --mesh: where residual shardings come from. compiled: XLA's SPMD partitioner, "
        "compiling for virtual CPU devices (any model). abstract: an explicit-sharding model traced on "
        "an abstract mesh, each residual's sharding read from its aval (no devices, any mesh size; "
        "fast for deep unrolled stacks).",
    ),
]
Compile = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="Also compile each policy's training step and show XLA's memory analysis (temp, "
        "argument, output, host bytes) beside the estimate. Slower.",
    ),
]
Output = Annotated[
    str | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        callback=_writable_output,
        help="Write the report to FILE instead of standard output (a regular file atomically; a "
        "symlink's target, a FIFO or a device such as /dev/null written into, never replaced).",
        show_default=False,
    ),
]
Debug = Annotated[
    bool,
    typer.Option("--debug", help="Print the full traceback of an error, not just its one line."),
]


def _print_version(value: bool) -> None:
    if value:
        print(f"te-ckpt-audit {__version__} (jax {jax.__version__})")
        raise typer.Exit()


TopVersion = Annotated[
    bool,
    typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
]
Version = Annotated[
    bool,
    typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
]


EmulateGpu = Annotated[
    str | None,
    typer.Option(
        "--emulate-gpu",
        metavar="CC:SMS",
        help="Trace real Transformer Engine on a machine without a GPU: run on an emulated device "
        "of compute capability CC with SMS multiprocessors (e.g. 9.0:132), after `bash "
        "te_cpu/setup.sh`. Handled before the other options.",
        show_default=False,
    ),
]


GpuName = Annotated[
    str | None,
    typer.Option(
        "--gpu",
        metavar="NAME",
        autocompletion=complete_gpu,
        help="Also compile each policy's training step for this GPU with XLA:GPU (no GPU needed) and "
        "show its peak memory per device: h100-sxm, h100-pcie, h200, a100-40gb, a100-80gb, l40s, b200 "
        "(`te-ckpt-audit gpus`). Needs the [gpu] extra (Linux x86_64, Python >= 3.12).",
        show_default=False,
    ),
]
TpuName = Annotated[
    str | None,
    typer.Option(
        "--tpu",
        metavar="NAME[:TOPOLOGY]",
        help="Also compile each policy's training step for this TPU slice with libtpu (no TPU needed) and "
        "show its plan per chip and libtpu's verdict, the chip's own HBM check: v5e, v5p, v6e, v4 "
        "(`te-ckpt-audit tpus`); the slice from --mesh's devices, or given (v5e:2x4). Needs the [tpu] extra "
        "(Linux x86_64).",
        show_default=False,
    ),
]
GpuConfig = Annotated[
    str | None,
    typer.Option(
        "--gpu-config",
        metavar="FILE",
        help="As --gpu, for the GPU a GpuTargetConfigProto text file describes (XLA's own GPU specs are such files).",
        show_default=False,
    ),
]
GpusPerHost = Annotated[
    int,
    typer.Option("--gpus-per-host", min=1, metavar="N", help="With --gpu and --mesh: GPUs per host of the topology."),
]
OptimizerOption = Annotated[
    Optimizer | None,
    typer.Option(
        "--optimizer",
        case_sensitive=False,
        help="With --gpu or --tpu: add an optax update to the compiled step, its state donated in and out: "
        "optax's function of that name with its defaults (sgd keeps no state; momentum is sgd with momentum 0.9).",
        show_default=False,
    ),
]
MemFraction = Annotated[
    float | None,
    typer.Option(
        "--mem-fraction",
        metavar="F",
        help="With --gpu: the share of the GPU's memory the run lets JAX use. Default: what the run's "
        "environment says (XLA_CLIENT_MEM_FRACTION or XLA_PYTHON_CLIENT_MEM_FRACTION, as JAX reads them), "
        "else JAX's 0.75. The report also gives the least fraction each policy needs.",
        show_default=False,
    ),
]
Time = Annotated[
    bool,
    typer.Option(
        "--time",
        help="With --gpu: also estimate each policy's seconds per step on the GPUs, from XLA's own cost models "
        "of the compiled step (one more compile per policy, beside the memory ones). With --tpu: from libtpu's "
        "own per-kernel cycle estimates, in the same compile.",
    ),
]
Calibrate = Annotated[
    str | None,
    typer.Option(
        "--calibrate",
        metavar="PROFILE",
        help="With --time: a profile of the same step measured on real GPUs (a ProfiledInstructionsProto, binary "
        "or text: jax.experimental.profiler.get_profiled_instructions_proto). Kernels it names take their "
        "measured time, the others scale by their kind's measured-to-estimated ratio; XLA's scheduler gets it "
        "as its fdo_profile. The kernels it lacks are counted.",
        show_default=False,
    ),
]
NetworkGbps = Annotated[
    float | None,
    typer.Option(
        "--network-gbps",
        metavar="GBPS",
        help="With --time: the network's bandwidth per GPU across hosts, in Gb/s. Default: the GPU's in the "
        "catalog (H100: 400, one 400 Gb/s NIC per GPU as in a DGX H100; Google Cloud's A3 High: 100).",
        show_default=False,
    ),
]
Fit = Annotated[
    bool,
    typer.Option("--fit", help="With --gpu: fail (exit 1) when a policy's compiled peak exceeds the usable memory."),
]
PeakBudgets = Annotated[
    list[str] | None,
    typer.Option(
        "--peak-budget",
        metavar="[POLICY=]SIZE",
        help="With --gpu: fail (exit 1) when the compiled peak per device exceeds SIZE, for every "
        "policy or, as POLICY=SIZE, for one; repeat for several.",
        show_default=False,
    ),
]
Params = Annotated[
    list[str] | None,
    typer.Option(
        "--params",
        metavar="ARG",
        help="An argument of TARGET that is trained (a position from 0, or a parameter name); repeat for "
        "several. Only they are differentiated and, with --gpu, get gradients, donation and optimizer "
        "state; the others are the batch. Default: the first, as jax.grad(loss)(params, batch) trains "
        "it; `all`: every float input.",
        show_default=False,
    ),
]
Step = Annotated[
    bool,
    typer.Option(
        "--step",
        help="With --gpu: TARGET already is a training step; compile it as it is (policy as-is only), "
        "donating the arguments --donate names.",
    ),
]
Donate = Annotated[
    list[int] | None,
    typer.Option(
        "--donate",
        metavar="N",
        min=0,
        help="With --step: a positional argument (0-based) the step donates; repeat for several.",
        show_default=False,
    ),
]
Cluster = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        metavar="ADDRESS",
        help="With --gpu: compile the policies on the running Dask cluster whose scheduler is at ADDRESS "
        "(tcp://host:8786; the [cluster] extra), each worker's program checked as --jobs checks it. Its "
        "workers need this checkout, the model's files at the same paths and one thread each.",
        show_default=False,
    ),
]
Jobs = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        metavar="N",
        min=1,
        max=MAX_JOBS,
        help="With --gpu: compile N policies at once, in worker processes that trace the target again, "
        "each checked to compile this process's program (default: half the cores; 1 compiles here).",
        show_default=False,
    ),
]
