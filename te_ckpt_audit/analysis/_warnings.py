"""Warnings for policies that silently do nothing, or not what their name promises: a step of the
session, from one policy's result and the trace (and, for one warning, `nothing_saveable`'s)."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .. import _jax_compat as jc
from .._jaxpr import open_jaxpr, sub_jaxprs
from ..records import (
    AuditWarning,
    GemmBatchDimsMissed,
    InnerScopeWithoutCheckpoints,
    OffloadMissing,
    Outcome,
    PolicyResult,
    Remat3,
    Remat3ChangesPolicy,
    Remat3Row,
    SameAsNothingSaveable,
    SavesEverything,
    Scope,
    TeGemmsRecomputed,
    TeRequantized,
    UnknownName,
    Verdict,
)
from ..registry import NOTHING_SAVEABLE
from ..specs import AsIs, NoCheckpoint, PolicySpec, Preset, names_spec, spellable
from ..trace._naming import line_name
from ..trace._trace import Traced
from ._apply import row_policy, verdict_of

NOTHING = Preset(NOTHING_SAVEABLE)


@functools.cache
def _probe_dot() -> Any:
    """A real dot_general equation (no batch dims), to ask a policy whether it saves dots."""
    x = jax.ShapeDtypeStruct((2, 2), jnp.float32)
    return jax.make_jaxpr(jnp.matmul)(x, x).jaxpr.eqns[0]


def _signature(result: PolicyResult) -> list[tuple[Any, ...]]:
    return sorted(
        (r.kind.value, r.shape, r.dtype, r.equation or "", r.argument or "") for r in result.residuals
    )


def _saved(result: PolicyResult) -> list[tuple[Any, ...]]:
    """What JAX keeps, as its `saved_residuals` tells it: each residual's kind, shape and dtype."""
    return sorted((r.kind.value, r.shape, r.dtype) for r in result.residuals)


def is_policy(spec: PolicySpec) -> bool:
    """A policy of its own (not plain autodiff, not the model's own policies)."""
    return not isinstance(spec, NoCheckpoint | AsIs)


def warnings_for(
    traced: Traced,
    spec: PolicySpec,
    result: PolicyResult,
    nothing_saveable: Callable[[], PolicyResult | None],
    audited_nothing: bool,
) -> tuple[AuditWarning, ...]:
    """The warnings of one policy's result. `nothing_saveable()` gives that policy's result on the
    same trace and scope (None if JAX cannot differentiate under it); it is asked only for a
    policy that saves nothing itself, unless `audited_nothing` says it is in the report anyway."""
    warnings = _spec_warnings(traced, spec, result)
    saves = any(m.verdict in (Verdict.SAVE, Verdict.OFFLOAD) for m in result.marks)
    if is_policy(spec) and spec != NOTHING and (audited_nothing or not saves):
        base = nothing_saveable()
        if base is not None and base.error is None and _signature(base) == _signature(result):
            warnings.append(SameAsNothingSaveable(spec.text))
    return tuple(warnings)


def remat3_row(traced: Traced, spec: PolicySpec, now: PolicyResult, new: PolicyResult | None, error: str | None
               ) -> tuple[Remat3Row, Remat3ChangesPolicy | None]:
    """One policy under the current remat (`now`) and JAX's new one (`new`; None with the `error`
    that kept JAX from differentiating under it): the row, and the finding where they differ."""
    if new is None:
        return Remat3Row(spec.text, now.totals.activation_bytes, 0, now.totals.te_gemm_bytes, 0,
                         now.recompute_flops, 0, error), None
    same = (now.totals.activation_bytes == new.totals.activation_bytes and _saved(now) == _saved(new)
            and now.recompute_flops == new.recompute_flops)
    row = Remat3Row(spec.text, now.totals.activation_bytes, new.totals.activation_bytes, now.totals.te_gemm_bytes,
                    new.totals.te_gemm_bytes, now.recompute_flops, new.recompute_flops, changed=not same)
    if same:
        return row, None  # the same residuals, the same recompute: equations told apart only by attribution
    kept = (Outcome.SAVED, Outcome.OFFLOADED)
    before = {m.equation: m.outcome for m in now.marks}
    changed = tuple(m.equation for m in new.marks if (before.get(m.equation) in kept) != (m.outcome in kept))
    rows = traced.rows.by_id
    te_gemms = tuple(e for e in changed if e in rows and before.get(e) in kept and rows[e].equation.is_te_gemm)
    return row, Remat3ChangesPolicy(spec.text, changed, row.remat_bytes, row.remat3_bytes, te_gemms)


def _line_names(traced: Traced) -> dict[str, str]:
    """The name `--name-lines` would spell for each line of the user's code in the trace: name ->
    "file:line" (a pick of `recommend --synthesize` pasted without --name-lines names them)."""
    found: dict[str, str] = {}
    for row in traced.rows.by_id.values():
        at = row.equation.source
        if at is not None:
            found.setdefault(line_name(at.file, at.line), f"{at.file}:{at.line}")
    return found


def _spec_warnings(traced: Traced, spec: PolicySpec, result: PolicyResult) -> list[AuditWarning]:
    warnings: list[AuditWarning] = []
    te_rows = [r for r in traced.rows.by_id.values() if r.equation.is_te_gemm]
    if te_rows and not isinstance(spec, NoCheckpoint):
        recomputed = [r for r in te_rows if result.mark(r.equation.id).outcome is Outcome.RECOMPUTED]
        policies = {id(p): p for r in te_rows if (p := row_policy(r, spec, result.scope)) is not None}
        saves_dots = any(verdict_of(p, _probe_dot(), spec.text) is Verdict.SAVE for p in policies.values())
        if recomputed and len(recomputed) == len(te_rows) and saves_dots:
            totals = [traced.rows.equation(r.equation.id) for r in recomputed]
            flops = sum(e.flops * e.multiplicity for e in totals)
            ids = tuple(e.id for e in totals)
            warnings.append(TeGemmsRecomputed(spec.text, ids, flops))
    requantized = _requantized(traced, spec, result) if result.requantized else None
    if requantized is not None:
        warnings.append(requantized)
    missed = _batch_dims_missed(traced, spec, result) if is_policy(spec) else None
    if missed is not None:
        warnings.append(missed)
    if result.scope is Scope.INNER and is_policy(spec) and not traced.has_remat:
        warnings.append(InnerScopeWithoutCheckpoints(spec.text))
    used = set(traced.rows.names)
    missing = [n for n in (*spec.names, *spec.offload_names) if n not in used]
    lines = _line_names(traced) if missing else {}
    for name in missing:
        close = difflib.get_close_matches(name, sorted(used), n=1)
        warnings.append(UnknownName(spec.text, name, close[0] if close else None, tuple(sorted(used)),
                                    lines.get(name)))
    if spec.saves_everything_regardless:
        warnings.append(SavesEverything(spec.text))
    if spec.offloads and result.totals.host_bytes == 0:
        warnings.append(OffloadMissing(spec.text))
    if is_policy(spec) and traced.remat3:
        warnings.append(Remat3(spec.text))
    return warnings


# --- GEMMs a policy misses because of batch dimensions ------------------------------------------------

_VIEWS = {"reshape", "transpose", "convert_element_type", "broadcast_in_dim", "squeeze", "expand_dims", "copy",
          "slice", "dynamic_slice", "sharding_constraint", "name"}


def _batched_weight_gemms(traced: Traced) -> dict[str, str]:
    """The dot_generals with batch dimensions of which an operand is a weight (a view of an input of
    the function or of the body holding it; two activations, as attention scores, are not): each
    with where its batch dimensions came from (a vmap, an einsum, or the dot itself)."""
    if traced.rows.batched_weight_gemms is not None:
        return traced.rows.batched_weight_gemms
    found: dict[str, str] = {}

    def walk(jaxpr: jc.Jaxpr) -> None:
        weights = set(jaxpr.invars) | set(jaxpr.constvars)
        for eqn in jaxpr.eqns:
            args = [v for v in eqn.invars if not isinstance(v, jc.Literal)]
            if eqn.primitive is jc.dot_general_p and eqn.params["dimension_numbers"][1][0]:
                tag = jc.eqn_tag(eqn)
                if tag is not None and any(v in weights for v in args):
                    found[tag] = _origin(eqn)
            elif eqn.primitive.name in _VIEWS and args and args[0] in weights:
                weights.update(eqn.outvars)
            for _, _, sub in sub_jaxprs(eqn.params):
                walk(open_jaxpr(sub))

    walk(traced.jaxpr.jaxpr)
    traced.rows.batched_weight_gemms = found
    return found


def _origin(eqn: jc.JaxprEqn) -> str:
    if "vmap(" in str(eqn.source_info.name_stack):
        return "vmap"
    spec = next((s for s in reversed(jc.scope_names(eqn)) if "->" in s), None)
    return f"einsum {spec}" if spec else "dot_general"


def _batch_dims_missed(traced: Traced, spec: PolicySpec, result: PolicyResult) -> GemmBatchDimsMissed | None:
    """A dot policy that skips GEMMs with batch dimensions (`dots_with_no_batch_dims_saveable`,
    `dots_and_te_gemms_with_no_batch_dims`, `offload_dot_with_no_batch_dims`, or a combination)
    recomputes the weight GEMMs a vmap (per-example models, vmapped experts, pipeline stages) or an
    einsum gave batch dimensions: the user who picked it for its weight GEMMs should know."""
    missed = []
    for eid, origin in _batched_weight_gemms(traced).items():
        row = traced.rows.by_id.get(eid)
        if row is None or result.mark(eid).outcome is not Outcome.RECOMPUTED:
            continue
        policy = row_policy(row, spec, result.scope)
        if policy is None or verdict_of(policy, row.eqn, spec.text) is not Verdict.RECOMPUTE:
            continue
        if verdict_of(policy, _probe_dot(), spec.text) in (Verdict.SAVE, Verdict.OFFLOAD):
            missed.append((traced.rows.equation(eid), origin))
    if not missed:
        return None
    where = dict.fromkeys(
        e.module or (f"{e.source.file}:{e.source.line}" if e.source else e.id) for e, _ in missed
    )
    return GemmBatchDimsMissed(
        spec.text, tuple(e.id for e, _ in missed), sum(e.flops * e.multiplicity for e, _ in missed), tuple(where),
        tuple(dict.fromkeys(o for _, o in missed)),
    )


# --- TE quantizations run again in the backward pass ------------------------------------------------

def _requantized(traced: Traced, spec: PolicySpec, result: PolicyResult) -> TeRequantized | None:
    """The policy's backward pass runs TE quantizations again (the `requantized` count's): name
    them, the quantizers' checkpoint names, and a spec that saves those names with the GEMM outputs
    (the backward pass then has the quantized tensors it needs). Under delayed scaling the quantize
    also updates the amax history, which the backward pass needs: it runs again whatever is saved,
    so no spec is suggested, and what the policy keeps of quantized tensors is said."""
    if not result.requantized_equations or isinstance(spec, NoCheckpoint):
        return None
    again = [traced.rows.by_id[e] for e in result.requantized_equations]
    delayed = any("DELAYED" in str(r.eqn.params.get("scaling_mode", "")) for r in again)
    names = sorted({
        e.name for e in (r.equation for r in traced.rows.by_id.values())
        if e.name and (e.is_te_quantize or e.dtype.startswith(("float8", "float4")))
    })
    base = spec.text if isinstance(spec, Preset) and spec.known.te_aware else "te_gemms_saveable"
    # a name with `,` `+` `;` `|` `=` or spaces would read back as other names: never put in a spec
    spelled = [n for n in names if spellable(n)]
    suggestion = names_spec(spelled, base=base).text if spelled and not delayed else None
    totals = [traced.rows.equation(r.equation.id) for r in again]
    where = tuple(dict.fromkeys(e.module or (f"{e.source.file}:{e.source.line}" if e.source else e.id) for e in totals))
    return TeRequantized(spec.text, tuple(e.id for e in totals), sum(e.flops * e.multiplicity for e in totals), where,
                         tuple(names), suggestion, delayed, sum(e.multiplicity for e in totals),
                         result.totals.quantized_bytes if delayed else 0,
                         _maxtext_policy(traced, result) if suggestion and "quantization" in names else None,
                         tuple(n for n in names if n not in spelled))


def _maxtext_policy(traced: Traced, result: PolicyResult) -> str | None:
    """For a model MaxText's code built: the `remat_policy` of its `minimal` family that saves the
    quantizers (named `quantization` by its TE layers) with what the policy saves of `context`."""
    if "maxtext" not in traced.packages:
        return None
    rows = traced.rows.by_id
    saved = {rows[m.equation].equation.name for m in result.marks if m.outcome is Outcome.SAVED and m.equation in rows}
    return "minimal_with_context_and_quantization" if "context" in saved else "minimal_with_quantization"
