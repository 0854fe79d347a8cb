"""The library's entry points, each a thin client of one `Session`: audit a function (`audit`) or
a `file.py:fn` target (`audit_target`), and gate one (`check_target`)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ._args import check_target_arg, gpu_arg, mesh_arg, tpu_arg
from ._progress import Progress, quiet
from ._session import Session
from .baselines import audit_key
from .config import DefinesLike, TargetConfig
from .errors import UsageError
from .gating import check, check_budget_policies
from .gpus import GpuRequest
from .records import AuditReport, Baseline, CheckResult, MeshSpec, Scope, ShardingSource, UnknownName
from .registry import AS_IS, DEFAULT_POLICIES
from .sizes import percent_limit
from .specs import PolicyLike, parse_policies, some_policies
from .targets import LogCapture
from .tpus import TpuRequest
from .trace._trained import ALL, ParamsLike

Policies = Sequence[PolicyLike]


def audit(
    fn: Callable[..., Any],
    *args: Any,
    policies: Policies | None = None,
    scope: Scope | str = Scope.AUTO,
    compile: bool = False,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
    gpu: GpuRequest | None = None,
    params: ParamsLike = ALL,
    tpu: TpuRequest | None = None,
    remat3: str | None = None,
    name_lines: bool = False,
) -> AuditReport:
    """Audit `fn(*args)` under each policy; with `gpu`, also compile each policy's training step
    for that GPU (`te_ckpt_audit.gpus`) and report XLA:GPU's peak per device.

    `params` names the trained arguments (positions or parameter names): only they are
    differentiated and, on a GPU, given gradients, donation and optimizer state; the others are
    the batch. By default every float input is, as `jax.ad_checkpoint.print_saved_residuals(fn, *args)`
    differentiates them; pass `params=0` for `loss(params, batch)`. With `gpu` of `step=True`,
    `fn` is a training step of the user's own, compiled as it is. With `tpu` (a TpuRequest:
    `TpuRequest(parse_tpu("v5e"))`), libtpu compiles each policy's step for that slice and the
    report holds its plan per chip and its verdict (the chip's own HBM check). `remat3`: "on"
    (JAX's new remat, `jax_remat3`), "off" (the current one), or "both" (the current one's results,
    each policy under remat3 beside them); None: as JAX reads its flag (JAX_REMAT3). `name_lines`:
    each matmul line of the function's code gets the tool's checkpoint name (`<file stem>_<line>`).

    Array leaves of `args` may be `jax.ShapeDtypeStruct`s (nothing is allocated); other leaves are
    passed through as static values. With `mesh`, their NamedShardings place them on it (an input
    without one is replicated) and every figure also comes per device. Without `policies`, the
    default comparison (`as-is` first where the function has checkpoints of its own).

    >>> import jax, jax.numpy as jnp
    >>> from te_ckpt_audit import audit
    >>> x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    >>> report = audit(lambda x: jnp.sum(jnp.sin(jnp.sin(x))), x, policies=["nothing_saveable"])
    >>> report.result("nothing_saveable").totals.activation_bytes
    0
    """
    if not callable(fn):
        raise UsageError(f"audit takes the function to differentiate, not {type(fn).__name__} {fn!r}"[:120],
                         "audit(fn, *args); audit_target('model.py:loss') takes a target's text")
    gpu_arg(gpu)
    tpu_arg(tpu)  # a TpuRequest or None, before anything reads it
    specs = None if policies is None else some_policies(policies, getattr(fn, "__name__", "fn"))
    own = (gpu is not None and gpu.step) or (tpu is not None and tpu.step)
    _no_remat3_comparison_of_a_step(own, remat3)
    session = Session.of_function(fn, *args, scope=Scope(scope), mesh=mesh, params=params, own_step=own,
                                  name_lines=name_lines, remat3=remat3)
    return session.report(specs, compile=compile, gpu=gpu, tpu=tpu_arg(tpu))


def audit_target(
    target: str,
    policies: Policies | None = None,
    *,
    inputs: str | None = None,
    defines: DefinesLike = None,
    scope: Scope | str = Scope.AUTO,
    progress: Progress = quiet,
    compile: bool = False,
    mesh: MeshSpec | str | None = None,
    shardings: ShardingSource | str = ShardingSource.COMPILED,
    gpu: GpuRequest | None = None,
    params: ParamsLike = None,
    executor: concurrent.futures.Executor | None = None,
    capture: LogCapture | None = None,
    tpu: TpuRequest | None = None,
    remat3: str | None = None,
    name_lines: bool = False,
) -> AuditReport:
    """Load `file.py:fn` (or `package.module:fn`) and its example inputs, then audit it. `defines`
    set keyword parameters of the inputs callable (`{"seq": 8192}` or `["seq=8192"]`). With `mesh`
    (a MeshSpec or "data=8,model=4"), the inputs callable gets the `jax.sharding.Mesh` as keyword
    `mesh` if it declares one, and bytes also come per device: each residual's sharding compiled by
    XLA's partitioner for virtual CPU devices, or with `shardings="abstract"` read from the avals of
    an explicit-sharding model traced on an abstract mesh (no devices; the inputs callable gets it).
    `params` names the trained arguments: by default the first, as `jax.grad(loss)(params, batch)`
    trains it (the only one of a one-argument target; every float input where the first holds
    none); "all" for every float input. With `gpu`, `executor` compiles several policies at once
    in its worker processes and `capture` keeps XLA's log lines off stderr while it compiles.
    With `tpu`, libtpu compiles each policy's step for that TPU slice (see `audit`). `remat3`:
    "on" (JAX's new remat, `jax_remat3`), "off" (the current one) or "both" (the current one's
    results, each policy under remat3 beside them, and `remat3-changes-policy` where they differ);
    None: as JAX reads its flag (JAX_REMAT3). `name_lines`: each matmul line of the user's code
    gets the tool's checkpoint name (`gpt_45` for gpt.py line 45), as `recommend --synthesize`
    names a model that names nothing, so that its pick can be audited before the code is edited.

    >>> report = audit_target("sample_models/mlp.py:loss", ["nothing_saveable"])  # doctest: +SKIP
    """
    check_target_arg(target)
    placement = mesh_arg(mesh)
    gpu_arg(gpu)
    tpu_arg(tpu)
    specs = None if policies is None else some_policies(policies, target)  # bad specs fail before it runs
    own = (gpu is not None and gpu.step) or (tpu is not None and tpu.step)
    _no_remat3_comparison_of_a_step(own, remat3)
    session = Session.of_target(
        target, inputs=inputs, defines=defines, scope=Scope(scope), mesh=placement,
        shardings=ShardingSource(shardings), params=params, own_step=own, name_lines=name_lines, progress=progress,
        remat3=remat3,
    )
    return session.report(specs, compile=compile, gpu=gpu, progress=progress, executor=executor, capture=capture,
                          tpu=tpu_arg(tpu))


def _no_remat3_comparison_of_a_step(own_step: bool, remat3: str | None) -> None:
    """`remat3="both"` compares what each policy saves under JAX's two remats; a training step of
    the user's own is compiled as it is, no policy audited: there is nothing to compare (it was
    dropped without a word)."""
    if own_step and remat3 == "both":
        raise UsageError("$remat3$ both compares the policies' saved sets under JAX's two remats; $step$ compiles "
                         "a training step of the target's own, whose residuals are not audited",
                         "$remat3$ on (or off) compiles the step under that remat; drop $step$ to compare policies")


def check_config(config: TargetConfig, tolerance: float = 0.0) -> None:
    """A gate's limits checked, as `check_target` checks them before it runs the target: finite
    percentages, and budgets only for policies the audit has."""
    percent_limit(tolerance, "tolerance")
    if config.max_recompute is not None:
        percent_limit(config.max_recompute, "max_recompute")
    _no_remat3_comparison_of_a_step(bool((config.gpu and config.gpu.step) or (config.tpu and config.tpu.step)),
                                    config.remat3)
    specs = parse_policies(config.policies, config.target) if config.policies else ()
    policies = [s.text for s in specs] if specs else (AS_IS, *DEFAULT_POLICIES)  # as-is: the defaults with checkpoints
    check_budget_policies(config.budgets, policies)
    check_budget_policies(config.peak.budgets, policies)


def _no_unknown_names(report: AuditReport) -> None:
    """A gated policy that names a checkpoint name the model does not have saves nothing by that
    name: the gate would pass a policy nobody meant. The audit warns; the gate refuses."""
    for w in report.warnings:
        if isinstance(w, UnknownName):
            close = f"did you mean {w.closest!r}? " if w.closest else ""
            names = ", ".join(w.model_names[:8]) or "none"
            raise UsageError(f"{report.target}: policy {w.policy!r} names {w.name!r}, a checkpoint name the model "
                             f"does not have", f"{close}the model's names: {names}")


def check_target(
    config: TargetConfig,
    *,
    baseline: Baseline | None = None,
    tolerance: float = 0.0,
    require_baseline: bool = False,
    progress: Progress = quiet,
    executor: concurrent.futures.Executor | None = None,
    capture: LogCapture | None = None,
    known_names: bool = False,
) -> tuple[AuditReport, CheckResult]:
    """Audit a target and check it against its budgets and a baseline (the CI gate). Bad limits
    fail before the user's code runs; the result carries the baseline key of this audit. With
    `known_names` (`te-ckpt-audit check`), a policy naming a checkpoint name the model does not
    have is a UsageError rather than a warning: a gate must not pass a policy nobody meant.

    >>> from te_ckpt_audit import TargetConfig, check_target, parse_budget
    >>> report, result = check_target(TargetConfig("model.py:loss", budgets=(parse_budget("6GiB"),)))  # doctest: +SKIP
    """
    check_config(config, tolerance)  # before the user's code runs
    key = audit_key(config.target, config.inputs, config.defines, config.scope, config.mesh, config.gpu,
                    config.params)
    report = audit_target(
        config.target, config.policies or None, inputs=config.inputs, defines=config.defines, scope=config.scope,
        progress=progress, compile=config.compile, mesh=config.mesh, shardings=config.shardings, gpu=config.gpu,
        params=config.params, executor=executor, capture=capture, tpu=config.tpu, remat3=config.remat3,
        name_lines=config.name_lines,
    )
    if known_names:
        _no_unknown_names(report)
    figures = None if baseline is None else baseline.figures(key)
    result = check(report, config.budgets, config.max_recompute, figures, tolerance, require_baseline, config.peak)
    return report, dataclasses.replace(result, key=key)
