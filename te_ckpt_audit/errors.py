"""Typed errors. The library raises them; only the CLI turns them into one line and an exit code."""

from __future__ import annotations


class AuditError(Exception):
    """Base class. `hint` says how to fix the problem; `exit_code` is the CLI's code for it."""

    exit_code = 4

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class UsageError(AuditError):
    """What the user typed is wrong: a path, a name, a spec, an option value. Exit 2."""

    exit_code = 2


class PolicySpecError(UsageError):
    """A policy spec that does not resolve, or a policy that misbehaves. Exit 2."""


class TargetError(AuditError):
    """The user's code failed: import, inputs callable, or tracing. Exit 3."""

    exit_code = 3


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, also for one whose __str__ raises."""
    try:
        lines = str(exc).strip().splitlines()
    except Exception:
        return "(no message: its __str__ raised)"
    return lines[0] if lines else type(exc).__name__
