"""The command line's exit codes, one per kind of outcome (findings and failures kept apart), and
which code each of the library's typed errors is."""

from __future__ import annotations

import enum

from te_ckpt_audit import AuditError, TargetError, UsageError


class ExitCode(enum.IntEnum):
    OK = 0
    CHECK_FAILED = 1  # a budget, recompute or baseline check failed
    USAGE = 2  # what the user typed is wrong: an option, a path, a spec
    TARGET = 3  # the user's code failed to load, trace or differentiate
    INTERNAL = 4  # a bug in te-ckpt-audit
    INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
    PIPE_CLOSED = 141  # whoever read standard output stopped reading, as shells report SIGPIPE
    TERMINATED = 143  # SIGTERM, as shells report it


def exit_code_of(err: AuditError) -> ExitCode:
    """A usage error (a PolicySpecError among them) is 2, the user's code failing (a policy of
    theirs too) 3, anything else of the library's 4."""
    if isinstance(err, UsageError):
        return ExitCode.USAGE
    if isinstance(err, TargetError):
        return ExitCode.TARGET
    return ExitCode.INTERNAL
