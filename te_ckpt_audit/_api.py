"""The library's entry points: audit a function (`audit`) or a `file.py:fn` target (`audit_target`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax

from ._analysis import analyse, failed
from ._compile import compiled_memory
from ._heap import without_gc
from ._loading import load_inputs, load_target, user_code
from ._mesh import (
    build_abstract_mesh,
    build_mesh,
    mesh_context,
    parse_mesh,
    per_device,
    place_args,
    source_of,
    spec_of,
)
from ._trace import Traced, trace
from ._warnings import add_warnings
from .config import TargetConfig
from .errors import TargetError
from .gate import Baseline, CheckResult, audit_key, check, check_budget_policies, check_percent
from .report import AuditReport, MeshSpec, Scope, ShardingSource, TeKind
from .specs import PolicySpec, SpecKind, resolve_policy

DEFAULT_POLICIES = (
    "none",
    "nothing_saveable",
    "checkpoint_dots",
    "checkpoint_dots_and_te_gemms",
    "dots_and_te_gemms_with_no_batch_dims",
    "everything_saveable",
)


def _specs(policies: Iterable[str | PolicySpec | Callable[..., Any]]) -> list[PolicySpec]:
    out = []
    for p in policies:
        if isinstance(p, PolicySpec):
            out.append(p)
        elif isinstance(p, str):
            out.append(resolve_policy(p))
        elif callable(p):
            out.append(PolicySpec(getattr(p, "__name__", repr(p)), SpecKind.POLICY, p))
        else:
            raise TypeError(f"a policy is a spec string or a callable, not {type(p).__name__}")
    return out


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@without_gc
def audit_traced(
    traced: Traced,
    policies: Sequence[str | PolicySpec | Callable[..., Any]] = DEFAULT_POLICIES,
    scope: Scope | str = Scope.AUTO,
    progress: Progress = _quiet,
    compile: bool = False,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
) -> AuditReport:
    """Analyse every policy from one trace. `progress` is told each stage as it starts; with
    `compile`, each policy's training step is also compiled for XLA's memory analysis. With `mesh`
    (the inputs traced as `place_args` placed them), residuals and totals get per-device bytes."""
    specs = _specs(policies)
    scope = Scope(scope)
    results = []
    errors: list[TargetError] = []
    for spec in specs:
        progress(f"analysing {spec.text}")
        try:
            results.append(analyse(traced, spec, scope))
        except TargetError as exc:  # JAX cannot differentiate under this policy: its row says why
            errors.append(exc)
            results.append(failed(traced, spec, scope, exc))
    if errors and len(errors) == len(specs):
        raise errors[0]  # under no policy at all: the function's own error
    results = add_warnings(traced, specs, results, scope)
    if mesh is not None:
        for spec_i, (spec, result) in enumerate(zip(specs, results, strict=True)):
            if result.error is None:
                progress(f"partitioning {spec.text} on the mesh")
                results[spec_i] = per_device(traced, spec, result, mesh)
    if compile:
        compiled = []
        for spec, result in zip(specs, results, strict=True):
            if result.error is not None:
                compiled.append(result)
                continue
            progress(f"compiling {spec.text}")
            compiled.append(dataclasses.replace(result, compiled=compiled_memory(traced, spec, result.scope)))
        results = compiled
    equations = traced.rows.equations()
    return AuditReport(
        target=traced.target,
        arguments=tuple(
            f"{n}: {a.dtype}{list(a.shape)}" for n, a in zip(traced.arg_names, traced.avals, strict=True)
        ),
        jax_version=jax.__version__,
        te=TeKind.of(equations),
        equations=equations,
        results=tuple(results),
        emulated_device=_emulated_device(),
        mesh=None if mesh is None else spec_of(mesh),
        sharding_source=None if mesh is None else source_of(mesh),
    )


def _emulated_device() -> str | None:
    from .emulation import current  # imported late: `python -m te_ckpt_audit.emulation` runs it

    return current()


def audit(
    fn: Callable[..., Any],
    *args: Any,
    policies: Sequence[str | PolicySpec | Callable[..., Any]] = DEFAULT_POLICIES,
    scope: Scope | str = Scope.AUTO,
    compile: bool = False,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
) -> AuditReport:
    """Audit `fn(*args)` under each policy.

    Array leaves of `args` may be `jax.ShapeDtypeStruct`s (nothing is allocated); other leaves are
    passed through as static values. With `mesh`, their NamedShardings place them on it (an input
    without one is replicated) and every figure also comes per device.

    >>> import jax, jax.numpy as jnp
    >>> from te_ckpt_audit import audit
    >>> x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    >>> report = audit(lambda x: jnp.sum(jnp.sin(jnp.sin(x))), x, policies=["nothing_saveable"])
    >>> report.result("nothing_saveable").totals.activation_bytes
    0
    """
    name = getattr(fn, "__name__", "fn")
    with user_code(name), mesh_context(mesh):
        traced = trace(fn, args if mesh is None else place_args(args, mesh), name)
        return audit_traced(traced, policies, scope, compile=compile, mesh=mesh)


def check_target(
    config: TargetConfig,
    *,
    baseline: Baseline | None = None,
    tolerance: float = 0.0,
    require_baseline: bool = False,
    progress: Progress = _quiet,
) -> tuple[AuditReport, CheckResult]:
    """Audit a target and check it against its budgets and a baseline (the CI gate). Bad limits
    fail before the user's code runs; the result carries the baseline key of this audit.

    >>> from te_ckpt_audit import TargetConfig, check_target, parse_budget
    >>> report, result = check_target(TargetConfig("model.py:loss", budgets=(parse_budget("6GiB"),)))  # doctest: +SKIP
    """
    policies = config.policies or DEFAULT_POLICIES
    mesh = None if config.mesh is None else str(config.mesh)
    key = audit_key(config.target, config.inputs, config.defines, config.scope, mesh)
    check_percent(tolerance, "--tolerance")
    if config.max_recompute is not None:
        check_percent(config.max_recompute, "--max-recompute")
    check_budget_policies(config.budgets, policies)  # before the user's code runs
    report = audit_target(
        config.target,
        policies,
        inputs=config.inputs,
        overrides=config.defines,
        scope=config.scope,
        progress=progress,
        compile=config.compile,
        mesh=config.mesh,
        shardings=config.shardings,
    )
    figures = None if baseline is None else baseline.figures(key)
    result = check(report, config.budgets, config.max_recompute, figures, tolerance, require_baseline)
    return report, dataclasses.replace(result, key=key)


def audit_target(
    target: str,
    policies: Sequence[str | PolicySpec | Callable[..., Any]] = DEFAULT_POLICIES,
    *,
    inputs: str | None = None,
    overrides: Mapping[str, str] | Sequence[str] = (),
    scope: Scope | str = Scope.AUTO,
    progress: Progress = _quiet,
    compile: bool = False,
    mesh: MeshSpec | str | None = None,
    shardings: ShardingSource | str = ShardingSource.COMPILED,
) -> AuditReport:
    """Load `file.py:fn` (or `package.module:fn`) and its example inputs, then audit it. With `mesh`
    (a MeshSpec or "data=8,model=4"), the inputs callable gets the `jax.sharding.Mesh` as keyword
    `mesh` if it declares one, and bytes also come per device: each residual's sharding compiled by
    XLA's partitioner for virtual CPU devices, or with `shardings="abstract"` read from the avals of
    an explicit-sharding model traced on an abstract mesh (no devices; the inputs callable gets it).

    >>> report = audit_target("sample_models/mlp.py:loss", ["nothing_saveable"])  # doctest: +SKIP
    """
    scope = Scope(scope)
    spec = parse_mesh(mesh) if isinstance(mesh, str) else mesh
    build = build_mesh if ShardingSource(shardings) is ShardingSource.COMPILED else build_abstract_mesh
    with user_code(target):  # a custom policy's module is user code too
        specs = _specs(policies)  # bad specs fail before the target's code runs
        on = None if spec is None else build(spec)
        with traced_target(target, inputs, overrides, on, progress) as traced:
            return audit_traced(traced, specs, scope, progress, compile, mesh=on)


@contextlib.contextmanager
def traced_target(
    target: str,
    inputs: str | None,
    overrides: Mapping[str, str] | Sequence[str],
    mesh: Any,
    progress: Progress = _quiet,
) -> Iterator[Traced]:
    """Load `target`, call its inputs callable and trace it, as the user's code (`sys.exit` there is
    the target's failure); with `mesh` (a built Mesh or AbstractMesh), the inputs are placed on it and
    it stays JAX's context mesh while the caller analyses the trace."""
    with user_code(target):
        progress(f"loading {target}")
        loaded = load_target(target)
        with mesh_context(mesh):
            pairs = list(overrides) if not isinstance(overrides, Mapping) else overrides
            args = load_inputs(loaded, inputs, pairs, mesh=mesh).args
            progress(f"tracing {target}")
            yield trace(loaded.fn, args if mesh is None else place_args(args, mesh), target)
