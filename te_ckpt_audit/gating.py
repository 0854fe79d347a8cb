"""CI gating: the violations of budgets, a recompute ceiling and a baseline's tolerance, from an
audit's records. Pure functions; no file is read or written here."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping, Sequence

from .errors import UsageError
from .records import AuditReport, Budget, Change, CheckResult, Figure, PolicyResult, Remat3Row, Violation
from .sizes import percent_limit


def gated_bytes(result: PolicyResult) -> int:
    """The activation bytes budgets and baselines hold: per device on a mesh (`--mesh`), else global."""
    return result.totals.gated_bytes


def check_budget_policies(budgets: Sequence[Budget], policies: Sequence[str]) -> None:
    """A budget for a policy that is not audited is a mistake (a typo would switch the gate off)."""
    for b in budgets:
        if b.policy is not None and b.policy not in policies:
            close = difflib.get_close_matches(b.policy, policies, n=1)
            raise UsageError(
                f"$budgets$ names {b.policy!r}, which is not among the audited policies",
                (f"did you mean {close[0]!r}? " if close else "audit it too ($policies$), or budget ")
                + f"one of the audited: {', '.join(policies)}",
            )


def applying(budgets: Sequence[Budget], policy: str) -> list[Budget]:
    """The budgets that bind `policy`: its own where it has any, which replace the every-policy
    ones (`budget = "64MiB"` with `budgets = { checkpoint_dots = "80MiB" }` lets checkpoint_dots
    keep 80 MiB), else the every-policy ones.

    >>> applying([Budget(64), Budget(80, "checkpoint_dots")], "checkpoint_dots")
    [Budget(limit_bytes=80, policy='checkpoint_dots')]
    """
    own = [b for b in budgets if b.policy == policy]
    return own or [b for b in budgets if b.policy is None]


@dataclasses.dataclass(frozen=True, slots=True)
class PeakGate:
    """Limits on XLA:GPU's compiled peak per device (`--gpu`): `fit` within the GPU's usable
    memory, and `budgets` on the peak itself."""

    fit: bool = False
    budgets: tuple[Budget, ...] = ()

    @property
    def active(self) -> bool:
        return self.fit or bool(self.budgets)


def check(
    report: AuditReport,
    budgets: Sequence[Budget] = (),
    max_recompute: float | None = None,
    baseline: Mapping[str, int] | None = None,
    tolerance: float = 0.0,
    require_baseline: bool = False,
    peak: PeakGate = PeakGate(),
) -> CheckResult:
    """Every violation of `budgets`, `max_recompute` (% of forward FLOPs) and growth beyond
    `tolerance` percent over `baseline` ({policy: activation bytes} of this audit's entry, or {}
    when the baseline has none), and of the `peak` gate. With `require_baseline`, a policy missing
    from the baseline is a violation."""
    tolerance = percent_limit(tolerance, "tolerance")
    if max_recompute is not None:
        max_recompute = percent_limit(max_recompute, "max_recompute")
    check_budget_policies(budgets, [r.policy for r in report.results])
    check_budget_policies(peak.budgets, [r.policy for r in report.results])
    if peak.active and report.gpu is None and not (report.tpu is not None and not peak.budgets):
        raise UsageError("$fit$ and $peak_budgets$ limit the compiled peak on a GPU ($fit$: on a TPU too)",
                         "add $gpu$ (or $tpu$ for $fit$)")
    violations: list[Violation] = []
    changes: list[Change] = []
    target = report.target
    for result in report.results:
        if peak.active and result.error is None:
            violations += _peak_violations(report, result, peak) if report.gpu is not None else _tpu_violations(
                report, result)
        act = gated_bytes(result)
        for b in applying(budgets, result.policy):
            if act > b.limit_bytes:
                per_device = result.totals.activation_bytes_per_device is not None
                violations.append(
                    Violation(target, result.policy, Figure.ACTIVATION_BYTES, act, b.limit_bytes, per_device)
                )
        under = next((x for x in report.remat3 if x.policy == result.policy), None)
        if under is not None and any(True for _ in applying(budgets, result.policy)):  # --remat3 both
            violations += _remat3_violations(target, under)
        if max_recompute is not None and result.recompute_percent > max_recompute:
            violations.append(
                Violation(target, result.policy, Figure.RECOMPUTE_PERCENT, result.recompute_percent, max_recompute)
            )
        if baseline is not None:
            change = Change(target, result.policy, baseline.get(result.policy), act)
            changes.append(change)
            violation = _baseline_violation(change, tolerance, require_baseline)
            if violation is not None:
                violations.append(violation)
    return CheckResult(target, tuple(violations), tuple(changes))


def _remat3_violations(target: str, row: Remat3Row) -> list[Violation]:
    """A budgeted policy that JAX's new remat changes (another saved set, equal bytes or not) or
    cannot differentiate under: the budget would stop meaning what it says when JAX flips its flag."""
    if row.error is not None:
        return [Violation(target, row.policy, Figure.FAILS_UNDER_REMAT3, 0, 0, detail=row.error)]
    if row.changed:
        return [Violation(target, row.policy, Figure.CHANGES_UNDER_REMAT3, row.remat3_bytes, row.remat_bytes)]
    return []


def _tpu_violations(report: AuditReport, result: PolicyResult) -> list[Violation]:
    """`fit` on a TPU: libtpu's verdict; a step it could not compile fails the gate (never off)."""
    assert report.tpu is not None
    plan = result.tpu_plan
    if plan is None or plan.fits is None:
        return [Violation(report.target, result.policy, Figure.NOT_COMPILED, 0, 0)]
    if not plan.fits:
        return [Violation(report.target, result.policy, Figure.DOES_NOT_FIT, plan.required_bytes or 0,
                          report.tpu.usable_bytes, True)]
    return []


def _peak_violations(report: AuditReport, result: PolicyResult, gate: PeakGate) -> list[Violation]:
    """The peak gate for one policy: a step that did not compile fails it (a gate is never off)."""
    assert report.gpu is not None
    peak = None if result.peak is None else result.peak.bytes_per_device
    if peak is None:
        return [Violation(report.target, result.policy, Figure.NOT_COMPILED, 0, 0)]
    out = []
    if gate.fit and peak > report.gpu.usable_bytes:
        out.append(Violation(report.target, result.policy, Figure.DOES_NOT_FIT, peak, report.gpu.usable_bytes, True))
    for b in applying(gate.budgets, result.policy):
        if peak > b.limit_bytes:
            out.append(Violation(report.target, result.policy, Figure.PEAK_BYTES, peak, b.limit_bytes, True))
    return out


def _baseline_violation(change: Change, tolerance: float, required: bool) -> Violation | None:
    if change.baseline_bytes is None:
        if not required:
            return None
        return Violation(change.target, change.policy, Figure.NOT_IN_BASELINE, change.bytes, 0, bytes=change.bytes)
    pct = change.percent
    if not change.unbounded and (pct is None or pct <= tolerance):
        return None
    return Violation(
        change.target,
        change.policy,
        Figure.GROWTH,
        math.inf if pct is None else pct,
        tolerance,
        baseline_bytes=change.baseline_bytes,
        bytes=change.bytes,
    )
