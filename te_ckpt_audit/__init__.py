"""te-ckpt-audit: see what each JAX checkpoint policy saves, recomputes and offloads.

The public API is listed here, once; the modules `policies`, `specs`, `records`, `sizes`,
`gating`, `baselines`, `config`, `gpus`, `tpus`, `render` and `testing` are public too. Everything else (names
starting with `_`) is private.
"""

from __future__ import annotations

from . import render as _render  # noqa: F401 (records print through it: records/_display.py)
from ._api import audit, audit_target, check_config, check_target
from ._session import Session
from .config import TargetConfig, parse_mesh
from .errors import AuditError, DevicesUnavailable, PolicyError, PolicySpecError, TargetError, UsageError
from .policies import checkpoint_dots_and_te_gemms, dots_and_te_gemms_with_no_batch_dims, te_gemms_saveable
from .records import (
    SCHEMA,
    AuditReport,
    AuditWarning,
    Budget,
    Candidate,
    CandidateKind,
    Category,
    CheckResult,
    CompiledMemory,
    Equation,
    EquationMark,
    MeshAxis,
    MeshSpec,
    Outcome,
    PolicyResult,
    Recommendation,
    Residual,
    ResidualKind,
    Scope,
    ShardingSource,
    SourceLocation,
    TeKind,
    Totals,
    Verdict,
    Violation,
    WarningCode,
)
from .registry import DEFAULT_POLICIES
from .search._fit import DEFAULT_MAX_COMPILES
from .search._recommend import DEFAULT_MAX_EVALS, recommend, recommend_target
from .search._throughput import throughput_keyword
from .sizes import parse_budget, parse_size
from .specs import PolicySpec, parse_policies, resolve_policy
from .trace._devices import MAX_DEVICES
from .trace._trained import parse_params

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_COMPILES",
    "throughput_keyword",
    "DEFAULT_MAX_EVALS",
    "DEFAULT_POLICIES",
    "MAX_DEVICES",
    "SCHEMA",
    "AuditError",
    "AuditReport",
    "AuditWarning",
    "Budget",
    "Candidate",
    "CandidateKind",
    "Category",
    "CheckResult",
    "CompiledMemory",
    "DevicesUnavailable",
    "Equation",
    "EquationMark",
    "MeshAxis",
    "MeshSpec",
    "Outcome",
    "PolicyError",
    "PolicyResult",
    "PolicySpec",
    "PolicySpecError",
    "Recommendation",
    "Residual",
    "ResidualKind",
    "Scope",
    "Session",
    "ShardingSource",
    "SourceLocation",
    "TargetConfig",
    "TargetError",
    "TeKind",
    "Totals",
    "UsageError",
    "Verdict",
    "Violation",
    "WarningCode",
    "audit",
    "audit_target",
    "check_config",
    "check_target",
    "checkpoint_dots_and_te_gemms",
    "dots_and_te_gemms_with_no_batch_dims",
    "parse_budget",
    "parse_mesh",
    "parse_params",
    "parse_policies",
    "parse_size",
    "recommend",
    "recommend_target",
    "resolve_policy",
    "te_gemms_saveable",
]
