"""te-ckpt-audit: see what each JAX checkpoint policy saves, recomputes and offloads."""

from __future__ import annotations

from ._api import DEFAULT_POLICIES, audit, audit_target, check_target
from .errors import AuditError, PolicySpecError, TargetError, UsageError
from .policies import (
    checkpoint_dots_and_te_gemms,
    dots_and_te_gemms_with_no_batch_dims,
    te_gemms_saveable,
)
from .report import (
    SCHEMA,
    AuditReport,
    AuditWarning,
    Category,
    CompiledMemory,
    Equation,
    EquationMark,
    Outcome,
    PolicyResult,
    Residual,
    ResidualKind,
    Scope,
    SourceLocation,
    Totals,
    Verdict,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_POLICIES",
    "SCHEMA",
    "AuditError",
    "AuditReport",
    "AuditWarning",
    "Category",
    "CompiledMemory",
    "Equation",
    "EquationMark",
    "Outcome",
    "PolicyResult",
    "PolicySpecError",
    "Residual",
    "ResidualKind",
    "Scope",
    "SourceLocation",
    "TargetError",
    "Totals",
    "UsageError",
    "Verdict",
    "audit",
    "audit_target",
    "check_target",
    "checkpoint_dots_and_te_gemms",
    "dots_and_te_gemms_with_no_batch_dims",
    "te_gemms_saveable",
]
