"""`te-ckpt-audit policies`: every policy spec --policy understands, one a line."""

from __future__ import annotations

from te_ckpt_audit.specs import available_policies

from .exit_codes import ExitCode

ALIGN_UP_TO = 40  # longer spec forms keep one space before their description


def policies() -> int:
    """List every policy spec --policy understands, with what it does, one a line."""
    rows = available_policies()
    width = max(len(spec) for spec, _ in rows if len(spec) <= ALIGN_UP_TO)
    for spec, text in rows:
        print(f"{spec:<{width}}  {text}")
    return ExitCode.OK
