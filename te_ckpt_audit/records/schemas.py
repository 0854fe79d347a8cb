"""Every JSON schema id te-ckpt-audit writes, in one place. A document's shape changes only with
its id."""

from __future__ import annotations

AUDIT = "te-ckpt-audit/3"  # AuditReport.to_dict(), the audit's JSON; /3: gpu, step, results[].peak
RECOMMEND = "te-ckpt-audit-recommend/2"  # Recommendation.to_dict(); /2: gpu, compiles, maximized, peaks
CHECK = "te-ckpt-audit-check/3"  # check results; /2: unbounded growth explicit, never a non-finite number;
# /3: each target's report is te-ckpt-audit/3, and peak figures (--gpu) may be violated
BASELINE = "te-ckpt-audit-baseline/2"  # baseline files: one entry per audit key
BASELINE_1 = "te-ckpt-audit-baseline/1"  # {target: {policy: bytes}}: still read, never written
