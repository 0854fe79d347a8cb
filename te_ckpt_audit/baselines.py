"""Baseline files: the key an audit's figures are saved under, reading a file (this schema and the
older one), and merging new figures in. Reading is strict and bounded: a file that is not a
baseline this version can read is refused whole (the command line then leaves it untouched),
never half-read or replaced."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from ._textfile import read_text
from .config import parse_mesh
from .errors import UsageError
from .gating import gated_bytes
from .gpus import GpuRequest
from .records import AuditKey, AuditReport, Baseline, MeshSpec, Scope, baseline_document, is_file_target, schemas
from .trace._loading import Defines, split_target

_ENTRY_KEYS = ("target", "inputs", "defines", "scope", "mesh", "activation_bytes")
_OPTIONAL_KEYS = ("gpu", "params")  # written only when set


def _resolve(spec: str, folder: Path | None = None, what: str = "target") -> str:
    """`path.py:NAME` with an absolute, normalised path (relative to `folder` or the current
    folder); `module:NAME` unchanged."""
    where, attr = split_target(spec, what)
    if not is_file_target(where):
        return f"{where}:{attr}"
    return f"{Path(os.path.abspath((folder or Path.cwd()) / where)).as_posix()}:{attr}"


def audit_key(
    target: str,
    inputs: str | None = None,
    defines: Defines | None = None,
    scope: Scope = Scope.AUTO,
    mesh: MeshSpec | None = None,
    gpu: GpuRequest | None = None,
    params: tuple[int | str, ...] | Literal["all"] | None = None,
) -> AuditKey:
    """The canonical key of an audit. The GPU is not part of it: what JAX saves does not depend on
    the GPU a step is compiled for (the argument stays for callers that pass their request).

    >>> audit_key("pkg.model:loss", defines={"seq": "8", "batch": "2"}).defines
    (('batch', '2'), ('seq', '8'))
    """
    return AuditKey(
        _resolve(target),
        None if inputs is None else _resolve(inputs, what="$inputs$"),
        tuple(sorted((defines or {}).items())),
        Scope(scope),
        mesh,
        None,
        params_key(params),
    )


def params_key(params: tuple[int | str, ...] | Literal["all"] | None) -> str | None:
    """The trained arguments as a baseline key holds them ("0,state", "all"); None for the default."""
    if params is None:
        return None
    return params if isinstance(params, str) else ",".join(str(p) for p in params)



def merged(baseline: Baseline, runs: Iterable[tuple[AuditKey, AuditReport]]) -> Baseline:
    """`baseline` with the runs' figures merged in: other entries, and other policies of the same
    entry, are kept."""
    entries = {k: dict(v) for k, v in baseline.entries.items()}
    by_target = dict(baseline.by_target)
    for key, report in runs:
        entries.setdefault(key, dict(by_target.pop(key.target, {})))
        entries[key].update({r.policy: gated_bytes(r) for r in report.results})
    return Baseline(entries, by_target, baseline.unknown)


def baseline_text(baseline: Baseline, folder: Path) -> str:
    """The file's text, paths relative to `folder` (where it lives)."""
    return json.dumps(baseline_document(baseline, folder), indent=2, allow_nan=False) + "\n"


def load_baseline(path: str | Path) -> Baseline:
    """The baseline at `path`; a missing, unreadable, corrupt or wrong-schema file is a UsageError.
    Schema-1 files ({target: {policy: bytes}}) are still read."""
    hint = f"regenerate it with $save_baseline$ {path}, or point at another file"
    try:
        text = read_text(path, "baseline", hint)
    except FileNotFoundError:
        raise UsageError(f"baseline {path} does not exist", f"create it with $save_baseline$ {path}") from None
    return parse_baseline(text, Path(os.path.realpath(path)).parent, str(path))


def parse_baseline(text: str, folder: Path, shown: str = "baseline") -> Baseline:
    """A baseline file's text (paths in it relative to `folder`)."""
    hint = f"regenerate it with $save_baseline$ {shown}, or point at another file"
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise UsageError(f"baseline {shown} is nested too deeply to be a baseline", hint) from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"baseline {shown} is not valid JSON ({exc})", hint) from None
    except ValueError as exc:  # a duplicate key, an integer too long to read
        raise UsageError(f"baseline {shown} is malformed: {str(exc)[:200]}", hint) from None
    schema = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
    try:
        if schema == schemas.BASELINE:
            _only(doc, {"schema", "entries"})
            return _entries(doc["entries"], folder)
        if schema == schemas.BASELINE_1:
            _only(doc, {"schema", "targets"})
            return _legacy(doc["targets"], folder)
    except (KeyError, TypeError, ValueError, UsageError) as exc:
        why = exc.template if isinstance(exc, UsageError) else str(exc)
        raise UsageError(f"baseline {shown} is malformed: {why[:200]}", hint) from None
    raise UsageError(f"baseline {shown} has schema {str(schema)[:80]!r}, expected {schemas.BASELINE!r}", hint)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key[:80]!r} appears twice in one object")
        out[key] = value
    return out


def _only(doc: Mapping[str, object], allowed: set[str]) -> None:
    extra = sorted(set(doc) - allowed)
    if extra:
        raise ValueError(f"unknown key {extra[0][:80]!r} at the top level")


def _figures(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in raw.values()
    ):
        raise ValueError("figures must map policies to byte counts")
    return raw


def _entries(rows: object, folder: Path) -> Baseline:
    if not isinstance(rows, list):
        raise ValueError("entries must be a list")
    entries: dict[AuditKey, dict[str, int]] = {}
    unknown: list[Mapping[str, object]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"entry {i} is not a table")
        missing = [k for k in _ENTRY_KEYS if k not in row]
        if missing:
            raise ValueError(f"entry {i} has no {missing[0]!r}")
        if set(row) - {*_ENTRY_KEYS, *_OPTIONAL_KEYS}:  # a field of a newer version: kept as it is, never matched
            _figures(row["activation_bytes"])
            unknown.append(row)
            continue
        key = _key(row, folder)
        if key in entries:
            raise ValueError(f"two entries for {row['target']}")
        entries[key] = _figures(row["activation_bytes"])
    return Baseline(entries, unknown=tuple(unknown))


def _key(row: Mapping[str, Any], folder: Path) -> AuditKey:  # Any: JSON, checked field by field
    inputs, defines, scope, mesh, gpu = row["inputs"], row["defines"], row["scope"], row["mesh"], row.get("gpu")
    params = row.get("params")
    if not (gpu is None or isinstance(gpu, str)) or not (params is None or isinstance(params, str)):
        raise ValueError("an entry's gpu and params must be strings")
    if not isinstance(row["target"], str) or not (inputs is None or isinstance(inputs, str)):
        raise ValueError("an entry's target and inputs must be strings")
    if not isinstance(defines, dict) or not isinstance(scope, str) or not (mesh is None or isinstance(mesh, str)):
        raise ValueError("an entry's defines must be a table, its scope and mesh strings")
    return AuditKey(
        _resolve(row["target"], folder),
        None if inputs is None else _resolve(inputs, folder),
        tuple(sorted((str(k), str(v)) for k, v in defines.items())),
        Scope(scope),
        None if mesh is None else parse_mesh(mesh),
        gpu,
        params,
    )


def _legacy(targets: object, folder: Path) -> Baseline:
    if not isinstance(targets, dict):
        raise ValueError("targets must be a table")
    return Baseline({}, {_resolve(t, folder): _figures(v) for t, v in targets.items()})
