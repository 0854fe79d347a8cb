"""te-ckpt-audit: see what each JAX checkpoint policy saves, recomputes and offloads."""

from __future__ import annotations

from ._api import DEFAULT_POLICIES, audit, audit_target, check_target
from ._mesh import parse_mesh
from ._recommend import Candidate, CandidateKind, Recommendation, recommend, recommend_target
from .errors import AuditError, ExitCode, PolicySpecError, TargetError, UsageError
from .config import TargetConfig
from .gate import Budget, CheckResult, Violation, parse_budget
from .policies import (
    checkpoint_dots_and_te_gemms,
    dots_and_te_gemms_with_no_batch_dims,
    te_gemms_saveable,
)
from .specs import PolicySpec, resolve_policy
from .report import (
    SCHEMA,
    AuditReport,
    AuditWarning,
    Category,
    CompiledMemory,
    Equation,
    EquationMark,
    MeshAxis,
    MeshSpec,
    Outcome,
    PolicyResult,
    Residual,
    ResidualKind,
    Scope,
    ShardingSource,
    SourceLocation,
    TeKind,
    Totals,
    Verdict,
    WarningCode,
)

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "TargetConfig",
    "parse_budget",
    "CheckResult",
    "PolicySpec",
    "Violation",
    "resolve_policy",
    "DEFAULT_POLICIES",
    "SCHEMA",
    "AuditError",
    "AuditReport",
    "AuditWarning",
    "Category",
    "Candidate",
    "CandidateKind",
    "CompiledMemory",
    "Equation",
    "ExitCode",
    "EquationMark",
    "MeshAxis",
    "MeshSpec",
    "Outcome",
    "PolicyResult",
    "PolicySpecError",
    "Recommendation",
    "Residual",
    "ResidualKind",
    "Scope",
    "ShardingSource",
    "SourceLocation",
    "TeKind",
    "TargetError",
    "Totals",
    "UsageError",
    "Verdict",
    "WarningCode",
    "audit",
    "audit_target",
    "check_target",
    "checkpoint_dots_and_te_gemms",
    "dots_and_te_gemms_with_no_batch_dims",
    "parse_mesh",
    "recommend",
    "recommend_target",
    "te_gemms_saveable",
]
