"""Warnings for policies that silently do nothing, or not what their name promises."""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._analysis import analyse, row_policy, verdict_of
from ._trace import Traced
from .report import AuditWarning, WarningCode, Outcome, PolicyResult, Scope, Verdict
from .specs import PolicySpec, SpecKind, resolve_policy


@functools.cache
def _probe_dot() -> Any:
    """A real dot_general equation (no batch dims), to ask a policy whether it saves dots."""
    x = jax.ShapeDtypeStruct((2, 2), jnp.float32)
    return jax.make_jaxpr(jnp.matmul)(x, x).jaxpr.eqns[0]


def _signature(result: PolicyResult) -> list[tuple[Any, ...]]:
    return sorted(
        (r.kind.value, r.shape, r.dtype, r.equation or "", r.argument or "") for r in result.residuals
    )


def add_warnings(
    traced: Traced, specs: Sequence[PolicySpec], results: Sequence[PolicyResult], scope: Scope
) -> list[PolicyResult]:
    """Each result with its warnings attached."""
    given = {(p.text, r.scope): r for p, r in zip(specs, results, strict=True)}
    # kept with the trace: the next audit of it (one policy at a time, as a search does) reuses it
    memo: dict[Scope, PolicyResult] = traced.memo.setdefault("nothing_saveable", {})

    def nothing_saveable(s: Scope) -> PolicyResult:
        if ("nothing_saveable", s) in given:
            return given["nothing_saveable", s]
        if s not in memo:
            memo[s] = analyse(traced, resolve_policy("nothing_saveable"), s)
        return memo[s]

    out = []
    for spec, result in zip(specs, results, strict=True):
        if result.error is not None:  # an empty row: nothing to compare or warn about
            out.append(result)
            continue
        warnings = [*_spec_warnings(traced, spec, result)]
        # Only a policy that saves nothing itself can match nothing_saveable, unless the latter
        # was audited anyway: the extra analysis is spent only on likely cases.
        saves = any(m.verdict in (Verdict.SAVE, Verdict.OFFLOAD) for m in result.marks)
        audited = ("nothing_saveable", result.scope) in given
        if spec.kind is SpecKind.POLICY and spec.text != "nothing_saveable" and (audited or not saves):
            if _signature(nothing_saveable(result.scope)) == _signature(result):
                warnings.append(AuditWarning(WarningCode.SAME_AS_NOTHING_SAVEABLE, spec.text))
        out.append(dataclasses.replace(result, warnings=tuple(warnings)))
    return out


def _spec_warnings(traced: Traced, spec: PolicySpec, result: PolicyResult) -> list[AuditWarning]:
    warnings = []
    te_rows = [r for r in traced.rows.by_id.values() if r.equation.is_te_gemm]
    if te_rows and spec.kind is not SpecKind.NONE:
        recomputed = [r for r in te_rows if result.mark(r.equation.id).outcome is Outcome.RECOMPUTED]
        policies = {id(p): p for r in te_rows if (p := row_policy(r, spec, result.scope)) is not None}
        saves_dots = any(verdict_of(p, _probe_dot(), spec.text) is Verdict.SAVE for p in policies.values())
        if recomputed and len(recomputed) == len(te_rows) and saves_dots:
            totals = [traced.rows.equation(r.equation.id) for r in recomputed]
            flops = sum(e.flops * e.multiplicity for e in totals)
            ids = tuple(e.id for e in totals)
            warnings.append(AuditWarning(WarningCode.TE_GEMMS_RECOMPUTED, spec.text, equations=ids, flops=flops))
    if result.scope is Scope.INNER and spec.kind is SpecKind.POLICY and not traced.has_remat:
        warnings.append(AuditWarning(WarningCode.INNER_SCOPE_WITHOUT_CHECKPOINTS, spec.text))
    used = set(traced.rows.names)
    for name in (*spec.names, *spec.offload_names):
        if name not in used:
            close = difflib.get_close_matches(name, sorted(used), n=1)
            warnings.append(
                AuditWarning(
                    WarningCode.UNKNOWN_NAME,
                    spec.text,
                    name=name,
                    suggestion=close[0] if close else None,
                    known=tuple(sorted(used)),
                )
            )
    if spec.saves_everything_regardless:
        warnings.append(AuditWarning(WarningCode.SAVES_EVERYTHING, spec.text))
    wants_offload = bool(spec.offload_names) or spec.text.startswith("offload_")
    if wants_offload and result.totals.host_bytes == 0:
        warnings.append(AuditWarning(WarningCode.OFFLOAD_MISSING, spec.text))
    if spec.kind is SpecKind.POLICY and jax.config.values.get("jax_remat3"):
        warnings.append(AuditWarning(WarningCode.REMAT3, spec.text))
    return warnings
