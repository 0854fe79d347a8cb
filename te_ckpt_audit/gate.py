"""CI gating: budgets on activation bytes, a recompute ceiling, and baselines with a tolerance.

Pure functions of reports; reading and writing files is limited to the baseline helpers.

    >>> parse_size("6GiB"), parse_size("1.5 MB"), parse_size("512")
    (6442450944, 1500000, 512)
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._loading import split_defines, split_spec
from .errors import UsageError
from .report import AuditReport, PolicyResult

BASELINE_SCHEMA = "te-ckpt-audit-baseline/2"
BASELINE_SCHEMA_1 = "te-ckpt-audit-baseline/1"  # {target: {policy: bytes}}: still read

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
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value):
        raise UsageError(f"size {text!r} is too large", "sizes are finite byte counts, e.g. 6GiB")
    return int(math.floor(value))


def check_percent(value: float, what: str) -> float:
    """A percentage limit (tolerance, recompute ceiling): finite and >= 0, or a UsageError. A NaN
    would switch its gate off, since every comparison with NaN is false."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UsageError(f"{what} must be a finite number >= 0, not {value!r}", f"e.g. {what} 5")
    return float(value)


@dataclasses.dataclass(frozen=True, slots=True)
class Budget:
    """A limit on activation bytes, for one policy or (policy None) for every policy."""

    limit_bytes: int
    policy: str | None = None


def check_budget_policies(budgets: Sequence[Budget], policies: Sequence[str]) -> None:
    """A budget for a policy that is not audited is a mistake (a typo would switch the gate off)."""
    for b in budgets:
        if b.policy is not None and b.policy not in policies:
            raise UsageError(
                f"budget for {b.policy!r}, which is not among the audited policies",
                f"add --policy {b.policy}, or audited: {', '.join(policies)}",
            )


def parse_budget(text: str) -> Budget:
    """`6GiB` (every policy) or `checkpoint_dots=6GiB` (one policy)."""
    policy, eq, size = text.rpartition("=")
    if eq and not policy.strip():
        raise UsageError(f"budget {text!r} names no policy", "use SIZE or POLICY=SIZE, e.g. checkpoint_dots=6GiB")
    return Budget(parse_size(size), policy.strip() or None)


class Figure(enum.StrEnum):
    """What a gate limits."""

    ACTIVATION_BYTES = "activation bytes"  # a budget (per device on a mesh)
    RECOMPUTE_PERCENT = "recompute %"  # --max-recompute, % of forward FLOPs
    GROWTH = "growth over baseline"  # % of activation bytes over the baseline entry
    NOT_IN_BASELINE = "not in baseline"  # --require-baseline, and the baseline lacks the policy


@dataclasses.dataclass(frozen=True, slots=True)
class Violation:
    """A broken limit; renderers word it (`render_gate.violation_message`)."""

    target: str
    policy: str
    figure: Figure
    value: float  # bytes, %, or (growth from 0 B) math.inf
    limit: float
    per_device: bool = False  # the bytes are one device's, on a mesh
    baseline_bytes: int | None = None  # GROWTH: the baseline's figure
    bytes: int | None = None  # GROWTH, NOT_IN_BASELINE: this audit's figure


@dataclasses.dataclass(frozen=True, slots=True)
class AuditKey:
    """What a baseline entry holds the figures of. The same function audited with other inputs,
    defines or scope is another entry; `model.py:loss` and `./model.py:loss` are one.

    `target` and `inputs` are resolved: an absolute file path and `:NAME`, or `module:NAME`.
    """

    target: str
    inputs: str | None = None
    defines: tuple[tuple[str, str], ...] = ()  # sorted by key
    scope: str = "auto"
    mesh: str | None = None  # per-device figures on a mesh differ from single-device ones


def _resolve_spec(spec: str, folder: Path | None = None, what: str = "target") -> str:
    """`path.py:NAME` with an absolute, normalised path (relative to `folder` or the current
    folder); `module:NAME` unchanged."""
    where, attr = split_spec(spec, what)
    if not _is_file_spec(where):
        return f"{where}:{attr}"
    return f"{Path(os.path.abspath((folder or Path.cwd()) / where)).as_posix()}:{attr}"


def _is_file_spec(where: str) -> bool:
    return where.endswith(".py") or "/" in where or os.sep in where


def audit_key(
    target: str,
    inputs: str | None = None,
    defines: Sequence[str] = (),
    scope: str = "auto",
    mesh: str | None = None,
) -> AuditKey:
    """The canonical key of an audit (a duplicate or malformed define is a UsageError).

    >>> audit_key("pkg.model:loss", defines=["seq=8", "batch = 2"]).defines
    (('batch', '2'), ('seq', '8'))
    """
    return AuditKey(
        _resolve_spec(target),
        None if inputs is None else _resolve_spec(inputs, what="--inputs"),
        tuple(sorted(split_defines(defines).items())),
        str(scope),
        mesh,
    )


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


def gated_bytes(result: PolicyResult) -> int:
    """The activation bytes budgets and baselines hold: per device on a mesh (`--mesh`), else global."""
    per_device = result.totals.activation_bytes_per_device
    return result.totals.activation_bytes if per_device is None else per_device


def check(
    report: AuditReport,
    budgets: Sequence[Budget] = (),
    max_recompute: float | None = None,
    baseline: Mapping[str, int] | None = None,
    tolerance: float = 0.0,
    require_baseline: bool = False,
) -> CheckResult:
    """Every violation of `budgets`, `max_recompute` (% of forward FLOPs) and growth beyond
    `tolerance` percent over `baseline` ({policy: activation bytes} of this audit's entry, or {}
    when the baseline has none). With `require_baseline`, a policy missing from it is a violation."""
    tolerance = check_percent(tolerance, "--tolerance")
    if max_recompute is not None:
        max_recompute = check_percent(max_recompute, "--max-recompute")
    check_budget_policies(budgets, [r.policy for r in report.results])
    violations: list[Violation] = []
    changes: list[Change] = []
    target = report.target
    for result in report.results:
        act = gated_bytes(result)
        for b in budgets:
            if (b.policy in (None, result.policy)) and act > b.limit_bytes:
                per_device = result.totals.activation_bytes_per_device is not None
                violations.append(
                    Violation(target, result.policy, Figure.ACTIVATION_BYTES, act, b.limit_bytes, per_device)
                )
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


def _baseline_violation(change: Change, tolerance: float, required: bool) -> Violation | None:
    if change.baseline_bytes is None:
        if not required:
            return None
        return Violation(
            change.target, change.policy, Figure.NOT_IN_BASELINE, change.bytes, 0, bytes=change.bytes
        )
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


# --- writing files: reports and baselines -------------------------------------------------------


def check_writable(path: str | Path) -> Path:
    """Where `write_output` will write `path` (symlinks followed), or a UsageError saying why it
    cannot: checked before the audit runs, so a run's work is not lost at the end."""
    real = Path(os.path.realpath(path))
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}", "choose a writable path") from None
    if mode is not None and not stat.S_ISREG(mode):
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            if not os.access(real, os.W_OK):
                raise UsageError(f"cannot write {path}: permission denied", "choose a writable path")
            return real
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise UsageError(f"cannot write {path}: it is {kind}", "choose a file in a writable folder")
    folder = real.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {path}: no writable folder {folder}", "choose a file in a writable folder")
    return real


def write_output(path: str | Path, text: str) -> None:
    """Write `text` to `path`. A regular file (or a new one) is written atomically, through a
    temporary file and a rename, so it is never half-written; a symlink is followed, so the link
    stays and its target gets the text; a character device or FIFO (`/dev/null`, `/dev/stdout`,
    a pipe) is written into, never replaced; anything else is refused."""
    real = check_writable(path)
    if real.exists() and not real.is_file():  # a device or a FIFO: a rename would replace it
        try:
            with open(real, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror or exc}", "choose a writable path") from exc
        return
    _write_atomically(real, text, shown=path)


def _write_atomically(path: Path, text: str, shown: str | Path) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write {shown}: {exc.strerror}", "choose a writable path") from exc
    try:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)  # replacing a file keeps its permissions
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # like open(): mkstemp's 0600 would surprise a CI artifact
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {shown}: {exc.strerror or exc}", "choose a writable path") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- baselines ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Baseline:
    """Saved activation bytes per policy, one entry per AuditKey. `by_target` holds the entries of
    a schema-1 file, which knew only the target: they match that target audited any way."""

    entries: Mapping[AuditKey, Mapping[str, int]]
    by_target: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)

    def figures(self, key: AuditKey) -> Mapping[str, int]:
        """{policy: bytes} saved for `key`; {} when the baseline has no entry for it."""
        found = self.entries.get(key)
        return found if found is not None else self.by_target.get(key.target, {})


def baseline_document(baseline: Baseline, folder: Path) -> dict[str, Any]:
    """The file's JSON: entries sorted, file paths relative to `folder` (where the baseline file
    lives), so a committed baseline matches on every machine and from any working folder."""
    entries = dict(baseline.entries)
    for target, figures in baseline.by_target.items():  # schema-1 entries still unmatched
        entries.setdefault(AuditKey(target), figures)

    def portable(spec: str | None) -> str | None:
        if spec is None:
            return None
        where, _, attr = spec.rpartition(":")
        return f"{Path(os.path.relpath(where, folder)).as_posix()}:{attr}" if _is_file_spec(where) else spec

    def order(key: AuditKey) -> tuple[Any, ...]:
        return portable(key.target), portable(key.inputs) or "", key.defines, key.scope, key.mesh or ""

    rows = [
        {
            "target": portable(key.target),
            "inputs": portable(key.inputs),
            "defines": dict(key.defines),
            "scope": key.scope,
            "mesh": key.mesh,
            "activation_bytes": dict(entries[key]),
        }
        for key in sorted(entries, key=order)
    ]
    return {"schema": BASELINE_SCHEMA, "entries": rows}


def save_baseline(path: str | Path, runs: Iterable[tuple[AuditKey, AuditReport]]) -> Baseline:
    """Merge the runs' figures into the baseline at `path` (other entries, and other policies of the
    same entry, are kept) and write it; an unreadable file there is replaced."""
    real = check_writable(path)
    current = Baseline({})
    if real.is_file():  # never read a FIFO or a device: nothing may be writing to it
        try:
            current = load_baseline(real)
        except UsageError:
            pass
    entries = {k: dict(v) for k, v in current.entries.items()}
    by_target = dict(current.by_target)
    for key, report in runs:
        entries.setdefault(key, dict(by_target.pop(key.target, {})))
        entries[key].update({r.policy: gated_bytes(r) for r in report.results})
    merged = Baseline(entries, by_target)
    write_output(path, json.dumps(baseline_document(merged, real.parent), indent=2, allow_nan=False) + "\n")
    return merged


def load_baseline(path: str | Path) -> Baseline:
    """The baseline at `path`; a missing, corrupt or wrong-schema file is a UsageError.
    Schema-1 files ({target: {policy: bytes}}) are still read."""
    p = Path(path)
    hint = f"regenerate it with --save-baseline {path}"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"baseline {path} does not exist", f"create it with --save-baseline {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"baseline {path} is not valid JSON ({exc})", hint) from None
    schema = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
    folder = Path(os.path.realpath(p)).parent
    try:
        if schema == BASELINE_SCHEMA:
            return _entries(doc.get("entries"), folder)
        if schema == BASELINE_SCHEMA_1:
            return _legacy(doc.get("targets"), folder)
    except (KeyError, TypeError, ValueError, AttributeError, UsageError) as exc:
        raise UsageError(f"baseline {path} is malformed: {exc}", hint) from None
    raise UsageError(f"baseline {path} has schema {schema!r}, expected {BASELINE_SCHEMA!r}", hint)


def _figures(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in raw.values()
    ):
        raise ValueError("figures must map policies to byte counts")
    return raw


def _entries(rows: Any, folder: Path) -> Baseline:
    if not isinstance(rows, list):
        raise ValueError("entries must be a list")
    entries: dict[AuditKey, dict[str, int]] = {}
    for row in rows:
        inputs, defines, scope, mesh = row["inputs"], row["defines"], row["scope"], row["mesh"]
        if not isinstance(defines, dict) or not isinstance(scope, str):
            raise ValueError("an entry's defines must be a table and its scope a string")
        key = AuditKey(
            _resolve_spec(row["target"], folder),
            None if inputs is None else _resolve_spec(inputs, folder),
            tuple(sorted((str(k), str(v)) for k, v in defines.items())),
            scope,
            None if mesh is None else str(mesh),
        )
        if key in entries:
            raise ValueError(f"two entries for {row['target']}")
        entries[key] = _figures(row["activation_bytes"])
    return Baseline(entries)


def _legacy(targets: Any, folder: Path) -> Baseline:
    if not isinstance(targets, dict):
        raise ValueError("targets must be a table")
    return Baseline({}, {_resolve_spec(t, folder): _figures(v) for t, v in targets.items()})
