"""`te-ckpt-audit maxtext CONFIG [KEY=VALUE ...] --gpu h100`: MaxText's own train step, compiled
for the GPUs its parallelism names, per `remat_policy`.

The form is MaxText's own command line (`python -m maxtext.trainers.pre_train.train CONFIG
key=value ...`), with `compile_topology_num_slices=N` for N hosts of 8 GPUs, as MaxText's
ahead-of-time compile takes it."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from te_ckpt_audit import UsageError
from te_ckpt_audit.gating import PeakGate, check
from te_ckpt_audit.gpus import DEFAULT_GPUS_PER_HOST
from te_ckpt_audit.maxtext import (
    REMAT_POLICIES,
    MaxTextRun,
    audit_maxtext,
    check_config_file,
    check_layouts,
    check_remat_policies,
    config_files,
    recommend_maxtext,
    resolved,
)
from te_ckpt_audit.render import render_maxtext_recommend_json, render_maxtext_recommend_text
from te_ckpt_audit.tpus import TpuRequest, parse_tpu

from . import options as opt
from . import process
from .audit_cmd import renderer, table_view
from .exit_codes import ExitCode
from .files import compile_cache, refuse_overwriting
from .options import GpuOptions, MaxTextFormat, OutputFormat, OutputOptions
from .terminal import (
    at_the_edge,
    check_report_destination,
    emit,
    progress_on_stderr,
    report_gate,
    stdout_kept_for_the_report,
)


def complete_remat_policy(incomplete: str) -> list[str]:
    """Shell completion of maxtext --policy: as-is, all and MaxText's remat_policy values."""
    return [p for p in ("as-is", "all", *REMAT_POLICIES) if p.startswith(incomplete)]


RematPolicies = Annotated[
    list[str] | None,
    typer.Option(
        "--policy",
        "-p",
        metavar="REMAT_POLICY",
        autocompletion=complete_remat_policy,
        help="A MaxText remat_policy to compile the step under; repeat for several, `all` for every one "
        f"({', '.join(REMAT_POLICIES)}). Default: as-is, the config's own.",
        show_default=False,
    ),
]
Recommend = Annotated[
    bool,
    typer.Option("--recommend", help="Find the remat_policy and per-device batch (--batch) that fit (--gpu, or "
                 "--tpu: libtpu's verdict on compile_topology) with the least recompute, in MaxText's own order of "
                 "its policies; print the config lines to paste."),
]
Batches = Annotated[
    list[str] | None,
    typer.Option("--batch", metavar="N", help="With --recommend: a per_device_batch_size to try (repeat; the "
                 "largest that fits wins). Default: the config's own.", show_default=False),
]
Layouts = Annotated[
    list[str] | None,
    typer.Option("--layout", metavar="KEY=N,...", help="With --recommend: a parallelism over the run's devices to "
                 "try, as MaxText's ici_*/dcn_*_parallelism settings (ici_fsdp_parallelism=4,"
                 "ici_tensor_parallelism=2), laid over the config's own (what it does not name stays the config's); "
                 "repeat for several, tried in order, each checked against the devices before the first compile. "
                 "Default: the config's own.",
                 show_default=False),
]
MaxCompiles = Annotated[
    int, typer.Option("--max-compiles", metavar="N", help="With --recommend: compile the step at most N times."),
]
Maximize = Annotated[
    str | None,
    typer.Option("--maximize", metavar="throughput", help="With --recommend: search remat_policy (all of MaxText's, "
                 "or those given with --policy) and per_device_batch_size together for the most estimated tokens "
                 "per second per GPU or TPU chip among the points that fit (--time's estimate; each point compiled), "
                 "on the config's layout.", show_default=False),
]

Synthesize = Annotated[
    bool,
    typer.Option("--synthesize", help="With --recommend --maximize throughput: make the remat policy instead of "
                 "choosing among MaxText's: remat_policy=custom, each of its tensor keys the model names kept on the "
                 "device or recomputed, with the per-device batch, solved on a per-key model of bytes and time "
                 "fitted on compiles, every pick compiled; MaxText's policies (--policy, else a few of each family) "
                 "compiled beside it."),
]

AllowOffload = Annotated[
    bool,
    typer.Option("--allow-offload", help="With --synthesize on GPUs and v5e: a tensor key may be offloaded to host "
                 "memory too (its copies over the host link: a GPU's PCIe, the v5e's as measured on the chip); on "
                 "another TPU nothing is offloaded (its host link was not measured), and the solver line says so."),
]


# What MaxText prints of itself on import (its optional cloud dependencies stubbed), not the user's
MAXTEXT_CHATTER = re.compile(r"\[(?:[A-Z]+ )?NO-OP\] ")


@contextlib.contextmanager
def maxtexts_absl_quiet() -> Iterator[None]:
    """MaxText's absl warnings of its own setup ("base_output_directory is not provided") and
    transformers' import notes kept off stderr while it runs; errors still show."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # the command line owns its process
    try:
        yield
    finally:
        absl.setLevel(level)


@at_the_edge
def maxtext(
    config: Annotated[str, typer.Argument(metavar="CONFIG", help="A MaxText config file (YAML), such as "
                                          "MaxText's configs/gpu/models/llama2_7b.yml.", show_default=False)],
    settings: Annotated[list[str] | None, typer.Argument(metavar="[KEY=VALUE]...", help="MaxText settings, as "
                                                         "its command line takes them.", show_default=False)] = None,
    policy: RematPolicies = None,
    gpu: opt.GpuName = None,
    gpu_config: opt.GpuConfig = None,
    mem_fraction: opt.MemFraction = None,
    recommend: Recommend = False,
    batch: Batches = None,
    layout: Layouts = None,
    max_compiles: MaxCompiles = 24,
    maximize: Maximize = None,
    synthesize: Synthesize = False,
    allow_offload: AllowOffload = False,
    fit: opt.Fit = False,
    peak_budget: opt.PeakBudgets = None,
    timed: opt.Time = False,
    network_gbps: opt.NetworkGbps = None,
    calibrate: opt.Calibrate = None,
    format: opt.MaxTextFormatOption = MaxTextFormat.TABLE,  # noqa: A002 (the option's name)
    output: opt.Output = None,
    debug: opt.Debug = False,
    version: opt.Version = False,
    tpu: opt.TpuName = None,
) -> int:
    """Audit MaxText's own train step under each remat_policy: what the loss it differentiates
    keeps for the backward pass, and (--gpu) the step compiled for GPUs (no GPU needed): the peak
    per device, whether it fits at the run's memory fraction, and the least fraction it needs.

    The step is MaxText's: its model, abstract train state and `train_step`, built as its
    ahead-of-time compile builds them, traced on this machine's CPUs and laid on the GPU topology
    of its mesh (compile_topology_num_slices=N: N hosts of 8 GPUs), or (--tpu v5e, with MaxText's
    compile_topology=v5e-256) compiled by libtpu for that TPU slice: its plan per chip, libtpu's
    verdict and (--time) its time. Exit codes: 0 ok, 1 a check failed, 2 usage or bad input, 3
    MaxText failed to build the step, 4 internal error.
    """
    run = MaxTextRun(config, tuple(settings or ()), tpu=tpu)
    if tpu is not None and (gpu is not None or gpu_config is not None):
        raise UsageError("--tpu and --gpu both name the step's target", "give one of them")
    if recommend and gpu is None and gpu_config is None and tpu is None:
        raise UsageError("maxtext --recommend compiles MaxText's train step for a GPU or a TPU slice",
                         "add --gpu h100, or --tpu v5e with compile_topology=v5e-256")
    compiled = gpu is not None or gpu_config is not None  # MaxText's own step, its state donated
    on_gpu = GpuOptions.parse(gpu, gpu_config, DEFAULT_GPUS_PER_HOST, None, mem_fraction, fit and tpu is None,
                              peak_budget, compile_cache(), step=compiled, donate=[0] if compiled else None,
                              time=(timed or maximize is not None) and tpu is None,  # throughput is the estimate's
                              network_gbps=network_gbps, calibrate=calibrate)
    peak = on_gpu.peak if tpu is None else PeakGate(fit)  # --fit on a TPU: libtpu's verdict on the slice
    policies = list(policy or ["as-is"])
    if "all" in policies:
        policies = ["as-is", *REMAT_POLICIES]
    check_remat_policies(policies)
    check_layouts(layout or ())
    check_config_file(run)
    if maximize is not None and maximize != "throughput":
        raise UsageError(f"--maximize {maximize}: MaxText's search maximizes throughput", "--maximize throughput")
    if synthesize and maximize is None:
        raise UsageError("--synthesize makes the remat policy of the fastest step that fits",
                         "add --recommend --maximize throughput")
    if allow_offload and not synthesize:
        raise UsageError("--allow-offload lets --synthesize offload MaxText's tensor keys",
                         "add --recommend --maximize throughput --synthesize")
    if (batch or layout or max_compiles != 24 or maximize) and not recommend:
        raise UsageError("--batch, --layout, --max-compiles and --maximize are about --recommend's search",
                         "add --recommend")
    if recommend and timed and maximize is None:
        raise UsageError("maxtext --recommend searches by memory; --time is for the policies it compiles",
                         "drop --recommend and give --policy, or search by time: --maximize throughput")
    if recommend and peak.active:
        raise UsageError("--recommend searches what fits the GPU or the TPU itself", "drop --fit, --peak-budget")
    if recommend and policy and maximize is None:
        raise UsageError("--recommend searches MaxText's remat policies itself",
                         "drop --policy, or name what --maximize throughput searches")
    if recommend and format is MaxTextFormat.MARKDOWN:
        raise UsageError("--format markdown: --recommend writes table or json", "--format json")
    out = OutputOptions(OutputFormat(format.value), None if output is None else Path(output), 10, None, False)
    check_report_destination(out.output)
    chain = config_files(run)
    profile = on_gpu.request.profile if on_gpu.request is not None else None
    refuse_overwriting(out.output, [("the MaxText config" if i == 0 else "a base_config of the MaxText config", p)
                                    for i, p in enumerate(chain)]
                       + ([] if profile is None else [("the profile --calibrate reads", Path(profile.source))]))
    run = process.in_a_child(resolved, run)  # MaxText's own values, before this process sets its devices
    on_tpu = None if tpu is None else TpuRequest(parse_tpu(tpu, run.devices), None, timed or maximize is not None)
    process.prepare(None, run.devices, None if on_gpu.request is None else on_gpu.request.model,
                    tpu=on_tpu is not None)
    if recommend:
        searched = on_gpu.request if on_tpu is None else on_tpu
        assert searched is not None
        with stdout_kept_for_the_report(MAXTEXT_CHATTER), maxtexts_absl_quiet(), progress_on_stderr() as progress:
            found = recommend_maxtext(run, searched, tuple(batch or ()), tuple(layout or ()),
                                      max_compiles=max_compiles, progress=progress,
                                      capture=process.xla_log_kept_off_stderr, maximize=maximize,
                                      remat_policies=tuple(policies) if policy else (), synthesize=synthesize,
                                      allow_offload=allow_offload)
        text = render_maxtext_recommend_json if out.format is OutputFormat.JSON else render_maxtext_recommend_text
        emit(text(found), out.output)
        return ExitCode.OK if found.chosen is not None else ExitCode.CHECK_FAILED
    with stdout_kept_for_the_report(MAXTEXT_CHATTER), maxtexts_absl_quiet(), progress_on_stderr() as progress:
        report = audit_maxtext(run, policies, on_gpu.request, progress=progress,
                               capture=process.xla_log_kept_off_stderr, tpu=on_tpu)
    gate = check(report, peak=peak)
    emit(renderer(out.format, table_view(out))(report, gate if peak.active else None), out.output)
    return report_gate([gate], None)
