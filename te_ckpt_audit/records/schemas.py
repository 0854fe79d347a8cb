"""Every JSON schema id te-ckpt-audit writes, in one place. A document's shape changes only with
its id."""

from __future__ import annotations

AUDIT = "te-ckpt-audit/2"  # AuditReport.to_dict(), the audit's JSON
RECOMMEND = "te-ckpt-audit-recommend/1"  # Recommendation.to_dict()
CHECK = "te-ckpt-audit-check/2"  # check results; /2: unbounded growth explicit, never a non-finite number
BASELINE = "te-ckpt-audit-baseline/2"  # baseline files: one entry per audit key
BASELINE_1 = "te-ckpt-audit-baseline/1"  # {target: {policy: bytes}}: still read, never written
