"""Outcomes of the zoo's exactness tests, kept for the closing table (and for a JSON file when
ZOO_RESULTS names one)."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Outcome:
    model: str
    policy: str
    status: str  # match | mismatch | error | skipped
    detail: str  # error's first line, or what differs
    audit_s: float  # te-ckpt-audit's one audit of all policies, shared by the model's rows
    reference_s: float  # JAX's saved_residuals for this policy


_OUTCOMES: list[Outcome] = []


def record(outcome: Outcome) -> None:
    _OUTCOMES.append(outcome)
    path = os.environ.get("ZOO_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({**asdict(outcome), "python": platform.python_version()}) + "\n")


def render() -> str:
    if not _OUTCOMES:
        return ""
    rows = [("model", "policy", "result", "audit s", "ref s", "detail")]
    for o in _OUTCOMES:
        rows.append((o.model, o.policy, o.status, f"{o.audit_s:.1f}", f"{o.reference_s:.1f}", o.detail[:100]))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5] for r in rows)
