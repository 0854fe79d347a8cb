"""Every record te-ckpt-audit makes, and its serialisation: frozen dataclasses with enum codes and
typed fields, from which every output is rendered. Renderers import these and nothing else of
the library; the JSON documents are the records' `to_dict()`s, each with its schema id
(`schemas`)."""

from __future__ import annotations

from . import schemas
from .audit import (
    SCHEMA,
    AuditReport,
    AuditWarning,
    Category,
    CompiledMemory,
    CompileProgress,
    Equation,
    EquationMark,
    GpuInfo,
    Hotspot,
    HotspotKey,
    MeshAxis,
    MeshSpec,
    Outcome,
    PeakMemory,
    PolicyResult,
    Residual,
    ResidualKind,
    Scope,
    ShardingSource,
    SourceLocation,
    StepInfo,
    TeKind,
    Totals,
    Trained,
    Verdict,
    WarningCode,
)
from .baseline import AuditKey, Baseline, baseline_document, is_file_target
from .check import Budget, Change, CheckResult, Figure, Run, Violation, check_document
from .json_schema import JSON_SCHEMA
from .recommendation import Candidate, CandidateKind, Maximized, Recommendation, Trial

__all__ = [
    "JSON_SCHEMA",
    "SCHEMA",
    "AuditKey",
    "AuditReport",
    "AuditWarning",
    "Baseline",
    "Budget",
    "Candidate",
    "CandidateKind",
    "Category",
    "Change",
    "CheckResult",
    "CompiledMemory",
    "CompileProgress",
    "Equation",
    "EquationMark",
    "Figure",
    "GpuInfo",
    "Hotspot",
    "HotspotKey",
    "Maximized",
    "MeshAxis",
    "MeshSpec",
    "Outcome",
    "PeakMemory",
    "PolicyResult",
    "Recommendation",
    "Residual",
    "ResidualKind",
    "Run",
    "Scope",
    "ShardingSource",
    "SourceLocation",
    "StepInfo",
    "TeKind",
    "Trial",
    "Totals",
    "Trained",
    "Verdict",
    "Violation",
    "WarningCode",
    "baseline_document",
    "check_document",
    "is_file_target",
    "schemas",
]
