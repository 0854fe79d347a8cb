"""Baselines: saved activation bytes per policy, one entry per audit key; `baseline_document` is
the file's JSON (schema ``te-ckpt-audit-baseline/2``). Reading a file, its keys and its older
schema live in `te_ckpt_audit.baselines`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .audit import MeshSpec, Scope
from .schemas import BASELINE


@dataclasses.dataclass(frozen=True, slots=True)
class AuditKey:
    """What a baseline entry holds the figures of. The same function audited with other inputs,
    defines, scope or mesh is another entry; `model.py:loss` and `./model.py:loss` are one.

    `target` and `inputs` are resolved: an absolute file path and `:NAME`, or `module:NAME`.
    """

    target: str
    inputs: str | None = None
    defines: tuple[tuple[str, str], ...] = ()  # sorted by key
    scope: Scope = Scope.AUTO
    mesh: MeshSpec | None = None  # per-device figures on a mesh differ from single-device ones
    # Files written before activation bytes were known not to depend on the GPU keyed entries by
    # it ("h100-sxm+adamw"); such an entry still matches the same audit, with or without a GPU.
    gpu: str | None = None
    params: str | None = None  # the trained arguments when not the default ("0,2", "all")


@dataclasses.dataclass(frozen=True, slots=True)
class Baseline:
    """Saved activation bytes per policy, one entry per AuditKey. `by_target` holds the entries of
    a schema-1 file, which knew only the target: they match that target audited any way.
    `unknown` holds entries with fields this version does not know (a newer key field, say): never
    matched, and written back as they were."""

    entries: Mapping[AuditKey, Mapping[str, int]]
    by_target: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    unknown: tuple[Mapping[str, Any], ...] = ()

    def figures(self, key: AuditKey) -> Mapping[str, int]:
        """{policy: bytes} saved for `key`; {} when the baseline has no entry for it. The GPU a step
        was compiled for changes nothing JAX saves: an entry saved with or without one (or for
        another) holds the same audit's figures."""
        found = self.entries.get(key)
        if found is not None:
            return found
        plain = dataclasses.replace(key, gpu=None)
        same = sorted((k for k in self.entries if dataclasses.replace(k, gpu=None) == plain),
                      key=lambda k: (k.gpu is not None, k.gpu or ""))
        if same:
            return self.entries[same[0]]
        return self.by_target.get(key.target, {})


def is_file_target(where: str) -> bool:
    """Whether the part of a `WHERE:NAME` spec before the colon names a file (else a module)."""
    return where.endswith(".py") or "/" in where or os.sep in where


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
        return f"{Path(os.path.relpath(where, folder)).as_posix()}:{attr}" if is_file_target(where) else spec

    def order(key: AuditKey) -> tuple[Any, ...]:
        mesh = "" if key.mesh is None else str(key.mesh)
        return (portable(key.target), portable(key.inputs) or "", key.defines, key.scope.value, mesh, key.gpu or "",
                key.params or "")

    rows: list[Mapping[str, Any]] = [
        {
            "target": portable(key.target),
            "inputs": portable(key.inputs),
            "defines": dict(key.defines),
            "scope": key.scope.value,
            "mesh": None if key.mesh is None else str(key.mesh),
            **({} if key.gpu is None else {"gpu": key.gpu}),  # older files' entries, kept as they were
            **({} if key.params is None else {"params": key.params}),  # absent for the default
            "activation_bytes": dict(entries[key]),
        }
        for key in sorted(entries, key=order)
    ]
    return {"schema": BASELINE, "entries": [*rows, *baseline.unknown]}
