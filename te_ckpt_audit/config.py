"""`[tool.te-ckpt-audit]` in pyproject.toml: the targets `te-ckpt-audit check` audits.

    [tool.te-ckpt-audit]
    baseline = "ckpt-baseline.json"   # optional: fail on growth beyond `tolerance` percent
    tolerance = 2.0

    [[tool.te-ckpt-audit.targets]]
    target = "sample_models/gpt.py:loss"
    inputs = "sample_models/gpt.py:loss_inputs"   # optional
    defines = { layers = 4, seq = 128 }           # like -D
    policies = ["checkpoint_dots", "checkpoint_dots_and_te_gemms"]
    scope = "auto"
    budget = "8MiB"                               # every policy, or a table per policy:
    budgets = { checkpoint_dots = "4MiB" }
    max_recompute = 60.0
    mesh = { data = 8, model = 4 }                # per-device figures on this mesh (like --mesh)
    shardings = "compiled"                        # or "abstract" (like --shardings)

Unknown keys are errors that name the key: a typo must not turn a gate off.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from pathlib import Path
from typing import Any

from ._mesh import mesh_spec
from .errors import UsageError
from .gate import Budget, parse_size
from .report import MeshSpec, Scope, ShardingSource

_TOP_KEYS = {"targets", "baseline", "tolerance"}
_TARGET_KEYS = {"target", "inputs", "defines", "policies", "scope", "budget", "budgets", "max_recompute", "mesh",
                "shardings"}


@dataclasses.dataclass(frozen=True, slots=True)
class TargetConfig:
    """What to audit and how to gate it: one `[[tool.te-ckpt-audit.targets]]` table, or the audit
    command's options. `check_target` takes it; the CLI's audit and check commands both build one."""

    target: str
    inputs: str | None = None
    defines: tuple[str, ...] = ()  # "key=value"
    policies: tuple[str, ...] = ()  # empty: the default comparison set
    scope: Scope = Scope.AUTO
    budgets: tuple[Budget, ...] = ()
    max_recompute: float | None = None
    mesh: MeshSpec | None = None  # per-device figures on this mesh (like --mesh)
    shardings: ShardingSource = ShardingSource.COMPILED  # like --shardings
    compile: bool = False  # XLA's memory analysis per policy (like --compile)


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    path: Path
    targets: tuple[TargetConfig, ...]
    baseline: Path | None
    tolerance: float


def _unknown(keys: set[str], allowed: set[str], where: str, path: Path) -> None:
    for key in sorted(keys - allowed):
        close = difflib.get_close_matches(key, sorted(allowed), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(sorted(allowed))}"
        raise UsageError(f"{path}: unknown key {key!r} in {where}", hint)


def _number(value: Any, key: str, where: str, path: Path) -> float:
    """A finite number >= 0: TOML's nan and inf would switch a gate off."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UsageError(f"{path}: {where}.{key} must be a finite number >= 0, not {value!r}", f"e.g. {key} = 5.0")
    return float(value)


def load_config(path: str | Path = "pyproject.toml") -> Config:
    """Read and validate `[tool.te-ckpt-audit]`; every problem is a UsageError naming the key."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"no config file {p}", "run in the project folder or pass --config PATH") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{p} is not valid TOML: {exc}", "fix the file") from None
    section = doc.get("tool", {}).get("te-ckpt-audit")
    if not isinstance(section, dict):
        raise UsageError(f"{p} has no [tool.te-ckpt-audit] section", "see the README's CI section for an example")
    _unknown(set(section), _TOP_KEYS, "[tool.te-ckpt-audit]", p)
    raw_targets = section.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise UsageError(f"{p}: [tool.te-ckpt-audit] declares no targets", "add [[tool.te-ckpt-audit.targets]] tables")
    targets = tuple(_target(t, i, p) for i, t in enumerate(raw_targets))
    baseline = section.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise UsageError(f"{p}: baseline must be a path string", 'e.g. baseline = "ckpt-baseline.json"')
    tolerance = _number(section.get("tolerance", 0.0), "tolerance", "[tool.te-ckpt-audit]", p)
    return Config(p, targets, (p.parent / baseline) if baseline else None, tolerance)


def _target(raw: Any, i: int, p: Path) -> TargetConfig:
    where = f"targets[{i}]"
    if not isinstance(raw, dict):
        raise UsageError(f"{p}: {where} must be a table", "use [[tool.te-ckpt-audit.targets]]")
    _unknown(set(raw), _TARGET_KEYS, where, p)
    target = raw.get("target")
    if not isinstance(target, str) or not target:
        raise UsageError(f"{p}: {where} has no target", 'e.g. target = "model.py:loss"')
    inputs = raw.get("inputs")
    if inputs is not None and (not isinstance(inputs, str) or not inputs):
        raise UsageError(f"{p}: {where}.inputs must be a FILE.py:CALLABLE string, not {inputs!r}",
                         'e.g. inputs = "model.py:loss_inputs"')
    defines = raw.get("defines", {})
    policies = raw.get("policies", [])
    if not isinstance(defines, dict):
        raise UsageError(f"{p}: {where}.defines must be a table", "e.g. defines = { seq = 2048 }")
    if not isinstance(policies, list) or not all(isinstance(s, str) for s in policies):
        raise UsageError(f"{p}: {where}.policies must be a list of specs", 'e.g. policies = ["checkpoint_dots"]')
    try:
        scope = Scope(raw.get("scope", "auto"))
    except ValueError:
        raise UsageError(f"{p}: {where}.scope must be auto, outer or inner", "e.g. scope = \"auto\"") from None
    budgets = []
    if "budget" in raw:
        budgets.append(Budget(parse_size(raw["budget"])))
    per_policy = raw.get("budgets", {})
    if not isinstance(per_policy, dict):
        raise UsageError(f"{p}: {where}.budgets must be a table", 'e.g. budgets = { checkpoint_dots = "4MiB" }')
    budgets += [Budget(parse_size(v), k) for k, v in per_policy.items()]
    max_recompute = raw.get("max_recompute")
    mesh = raw.get("mesh")
    if mesh is not None and not isinstance(mesh, dict):
        raise UsageError(f"{p}: {where}.mesh must be a table, not {mesh!r}", "e.g. mesh = { data = 8, model = 4 }")
    try:
        shardings = ShardingSource(raw.get("shardings", "compiled"))
    except ValueError:
        hint = 'e.g. shardings = "abstract"'
        raise UsageError(f"{p}: {where}.shardings must be compiled or abstract", hint) from None
    return TargetConfig(
        target=target,
        inputs=inputs,
        defines=tuple(f"{k}={v}" for k, v in defines.items()),
        policies=tuple(policies),
        scope=scope,
        budgets=tuple(budgets),
        max_recompute=None if max_recompute is None else _number(max_recompute, "max_recompute", where, p),
        mesh=None if mesh is None else mesh_spec(mesh, f"{p}: {where}.mesh"),
        shardings=shardings,
    )
