"""JSON: `report.to_dict()` with its hotspots and each warning's words (schema ``te-ckpt-audit/10``,
described by `records.JSON_SCHEMA`): strict, deterministic."""

from __future__ import annotations

import dataclasses
import json

from ..records import AuditReport, HotspotKey
from ._common import hotspot_key, hotspots, warning_message


def render_json(report: AuditReport, top: int = 10, by: HotspotKey | None = None) -> str:
    """The report as JSON (schema ``te-ckpt-audit/10``), with its hotspots; the same report gives
    the same bytes."""
    key = hotspot_key(report, by)
    spots = [dataclasses.asdict(h) for h in hotspots(report, top, key)]
    doc = {**report.to_dict(), "hotspots": {"by": key.value, "rows": spots}}
    for w, w_doc in zip(report.findings, doc["findings"], strict=True):
        w_doc["message"] = warning_message(w)
    for result, result_doc in zip(report.results, doc["results"], strict=True):
        for w, w_doc in zip(result.warnings, result_doc["warnings"], strict=True):
            w_doc["message"] = warning_message(w)  # the words beside the fields, for people
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"  # strict JSON: no NaN
