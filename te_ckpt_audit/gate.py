"""CI gating: budgets on activation bytes, a recompute ceiling, and baselines with a tolerance.

Pure functions of reports; reading and writing files is limited to the baseline helpers.

    >>> parse_size("6GiB"), parse_size("1.5 MB"), parse_size("512")
    (6442450944, 1500000, 512)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import UsageError
from .render import format_bytes
from .report import AuditReport, PolicyResult

BASELINE_SCHEMA = "te-ckpt-audit-baseline/1"

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from "6GiB", "512 MB", "1024" (units B, KB, MB, GB, TB decimal; KiB, MiB, GiB, TiB binary)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"negative size {text}", "sizes are byte counts >= 0")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(
            f"not a size: {text!r}", "use a number with B, KB, MB, GB, KiB, MiB or GiB, e.g. 6GiB"
        )
    return int(math.floor(float(match.group(1)) * _UNITS[unit]))


@dataclasses.dataclass(frozen=True, slots=True)
class Budget:
    """A limit on activation bytes, for one policy or (policy None) for every policy."""

    limit_bytes: int
    policy: str | None = None


def parse_budget(text: str) -> Budget:
    """`6GiB` (every policy) or `checkpoint_dots=6GiB` (one policy)."""
    policy, eq, size = text.rpartition("=")
    if eq and not policy.strip():
        raise UsageError(f"budget {text!r} names no policy", "use SIZE or POLICY=SIZE, e.g. checkpoint_dots=6GiB")
    return Budget(parse_size(size), policy.strip() or None)


@dataclasses.dataclass(frozen=True, slots=True)
class Violation:
    target: str
    policy: str
    figure: str  # "activation bytes", "recompute %", "growth over baseline"
    value: float
    limit: float
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """Activation bytes of one target and policy against the baseline."""

    target: str
    policy: str
    baseline_bytes: int | None  # None: not in the baseline
    bytes: int

    @property
    def percent(self) -> float | None:
        if not self.baseline_bytes:
            return None if self.baseline_bytes is None else (0.0 if self.bytes == 0 else math.inf)
        return 100.0 * (self.bytes - self.baseline_bytes) / self.baseline_bytes


@dataclasses.dataclass(frozen=True, slots=True)
class CheckResult:
    target: str
    violations: tuple[Violation, ...]
    changes: tuple[Change, ...]

    @property
    def ok(self) -> bool:
        return not self.violations


def gated_bytes(result: PolicyResult) -> int:
    """The activation bytes budgets and baselines hold: per device on a mesh (`--mesh`), else global."""
    per_device = result.totals.activation_bytes_per_device
    return result.totals.activation_bytes if per_device is None else per_device


def gated_figure(result: PolicyResult) -> str:
    return "activation bytes" if result.totals.activation_bytes_per_device is None else "activation bytes per device"


def check(
    report: AuditReport,
    budgets: Sequence[Budget] = (),
    max_recompute: float | None = None,
    baseline: Mapping[str, Mapping[str, int]] | None = None,
    tolerance: float = 0.0,
) -> CheckResult:
    """Every violation of `budgets`, `max_recompute` (% of forward FLOPs) and growth beyond
    `tolerance` percent over `baseline` ({target: {policy: activation bytes}})."""
    known = {r.policy for r in report.results}
    for b in budgets:
        if b.policy is not None and b.policy not in known:
            raise UsageError(
                f"budget for {b.policy!r}, which is not among the audited policies",
                f"audited: {', '.join(sorted(known))}",
            )
    violations: list[Violation] = []
    changes: list[Change] = []
    target = report.target
    before = (baseline or {}).get(target, {})
    for result in report.results:
        act = gated_bytes(result)
        for b in budgets:
            if (b.policy in (None, result.policy)) and act > b.limit_bytes:
                violations.append(
                    Violation(
                        target, result.policy, "activation bytes", act, b.limit_bytes,
                        f"{target} [{result.policy}]: {gated_figure(result)} {format_bytes(act)} ({act} B) "
                        f"exceed the budget {format_bytes(b.limit_bytes)} ({b.limit_bytes} B)",
                    )
                )
        if max_recompute is not None and result.recompute_percent > max_recompute:
            violations.append(
                Violation(
                    target, result.policy, "recompute %", result.recompute_percent, max_recompute,
                    f"{target} [{result.policy}]: recompute {result.recompute_percent:.1f}% of forward "
                    f"FLOPs exceeds --max-recompute {max_recompute:g}%",
                )
            )
        if baseline is not None:
            change = Change(target, result.policy, before.get(result.policy), act)
            changes.append(change)
            pct = change.percent
            if pct is not None and pct > tolerance:
                violations.append(
                    Violation(
                        target, result.policy, "growth over baseline", pct, tolerance,
                        f"{target} [{result.policy}]: activation bytes grew {pct:+.2f}% over the "
                        f"baseline ({format_bytes(change.baseline_bytes or 0)} -> {format_bytes(act)}), "
                        f"beyond the tolerance {tolerance:g}%",
                    )
                )
    return CheckResult(target, tuple(violations), tuple(changes))


def baseline_document(reports: Iterable[AuditReport]) -> dict[str, Any]:
    targets: dict[str, dict[str, int]] = {}
    for report in reports:
        targets.setdefault(report.target, {}).update(
            {r.policy: gated_bytes(r) for r in report.results}
        )
    return {"schema": BASELINE_SCHEMA, "targets": targets}


def write_atomically(path: str | Path, text: str) -> None:
    """Write `text` to `path` via a temporary file and a rename: never a half-written file."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: no folder {folder}", "create the folder or choose another path")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}", "choose a writable path") from exc
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # like open(): mkstemp's 0600 would surprise a CI artifact
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", "choose a writable path") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_baseline(path: str | Path, reports: Iterable[AuditReport]) -> None:
    write_atomically(path, json.dumps(baseline_document(reports), indent=2) + "\n")


def load_baseline(path: str | Path) -> dict[str, dict[str, int]]:
    """{target: {policy: activation bytes}}; a missing, corrupt or wrong-schema file is a UsageError."""
    p = Path(path)
    hint = "regenerate it with --save-baseline"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"baseline {path} does not exist", f"create it with --save-baseline {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"baseline {path} is not valid JSON ({exc})", hint) from None
    if not isinstance(doc, dict) or doc.get("schema") != BASELINE_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise UsageError(f"baseline {path} has schema {found!r}, expected {BASELINE_SCHEMA!r}", hint)
    targets: Any = doc.get("targets")
    ok = isinstance(targets, dict) and all(
        isinstance(pols, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pols.values())
        for pols in targets.values()
    )
    if not ok:
        raise UsageError(f"baseline {path} is malformed: targets must map policies to byte counts", hint)
    return targets
