"""The CI gate's records: limits (`Budget`), what broke one (`Violation`), each policy's figure
against the baseline (`Change`), and one target's verdict (`CheckResult`); `check_document` is the
JSON document of a run over several targets (schema ``te-ckpt-audit-check/2``)."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from typing import Any

from .audit import AuditReport
from .baseline import AuditKey
from .schemas import CHECK


@dataclasses.dataclass(frozen=True, slots=True)
class Budget:
    """A limit on activation bytes, for one policy or (policy None) for every policy."""

    limit_bytes: int
    policy: str | None = None


class Figure(enum.StrEnum):
    """What a gate limits."""

    ACTIVATION_BYTES = "activation bytes"  # a budget (per device on a mesh)
    RECOMPUTE_PERCENT = "recompute %"  # --max-recompute, % of forward FLOPs
    GROWTH = "growth over baseline"  # % of activation bytes over the baseline entry
    NOT_IN_BASELINE = "not in baseline"  # --require-baseline, and the baseline lacks the policy
    PEAK_BYTES = "peak bytes per device"  # --peak-budget: XLA:GPU's compiled peak (the range's top)
    DOES_NOT_FIT = "does not fit"  # --fit: the peak over the GPU's usable memory
    NOT_COMPILED = "not compiled"  # --fit or --peak-budget, and the step did not compile for the GPU
    CHANGES_UNDER_REMAT3 = "changes under remat3"  # --remat3 both: a budgeted policy saves other values there
    FAILS_UNDER_REMAT3 = "fails under remat3"  # --remat3 both: JAX cannot differentiate under the budgeted policy


@dataclasses.dataclass(frozen=True, slots=True)
class Violation:
    """A broken limit; renderers word it (`render.violation_message`)."""

    target: str
    policy: str
    figure: Figure
    value: float  # bytes, %, or (growth from 0 B) math.inf
    limit: float
    per_device: bool = False  # the bytes are one device's, on a mesh
    baseline_bytes: int | None = None  # GROWTH: the baseline's figure
    bytes: int | None = None  # GROWTH, NOT_IN_BASELINE: this audit's figure
    detail: str | None = None  # FAILS_UNDER_REMAT3: JAX's error

    def to_dict(self) -> dict[str, Any]:
        """`value` is null, and `unbounded` true, for growth from a 0-byte baseline: JSON has no Infinity."""
        finite = math.isfinite(self.value)
        return {
            "policy": self.policy,
            "figure": self.figure.value,
            "value": self.value if finite else None,
            "unbounded": not finite,
            "limit": self.limit,
            "detail": self.detail,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """Activation bytes of one target and policy against the baseline."""

    target: str
    policy: str
    baseline_bytes: int | None  # None: not in the baseline
    bytes: int

    @property
    def unbounded(self) -> bool:
        """Growth from 0 bytes: no percentage measures it, and it exceeds every tolerance."""
        return self.baseline_bytes == 0 and self.bytes > 0

    @property
    def percent(self) -> float | None:
        """Growth in percent; None when not in the baseline or unbounded."""
        if self.baseline_bytes is None or self.unbounded:
            return None
        if self.baseline_bytes == 0:
            return 0.0
        return 100.0 * (self.bytes - self.baseline_bytes) / self.baseline_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "baseline_bytes": self.baseline_bytes,
            "bytes": self.bytes,
            "percent": self.percent,  # null: not in the baseline, or unbounded
            "unbounded": self.unbounded,
            "in_baseline": self.baseline_bytes is not None,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class CheckResult:
    target: str
    violations: tuple[Violation, ...]
    changes: tuple[Change, ...]
    key: AuditKey | None = None  # the baseline entry this audit's figures belong to

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def not_in_baseline(self) -> tuple[str, ...]:
        """Policies a baseline was given for but that have no figure in it."""
        return tuple(c.policy for c in self.changes if c.baseline_bytes is None)


Run = tuple[AuditReport, CheckResult]  # one target of a check: its report and its verdict


def check_document(runs: Sequence[Run]) -> dict[str, Any]:
    """The check's JSON document: every target's verdict, violations, changes and full report."""
    return {
        "schema": CHECK,
        "ok": all(result.ok for _, result in runs),
        "targets": [
            {
                "target": report.target,
                "ok": result.ok,
                "violations": [v.to_dict() for v in result.violations],
                "changes": [c.to_dict() for c in result.changes],
                "report": report.to_dict(),
            }
            for report, result in runs
        ],
    }
