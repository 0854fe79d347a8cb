"""Typed errors. The library raises them; only the CLI turns them into one line and an exit code."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """The command line's exit codes, one per kind of outcome; findings and failures stay apart."""

    OK = 0
    CHECK_FAILED = 1  # a budget, recompute or baseline check failed
    USAGE = 2  # what the user typed is wrong: an option, a path, a spec
    TARGET = 3  # the user's code failed to load, trace or differentiate
    INTERNAL = 4  # a bug in te-ckpt-audit
    INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
    PIPE_CLOSED = 141  # whoever read standard output stopped reading, as shells report SIGPIPE


class AuditError(Exception):
    """Base class. `hint` says how to fix the problem; `exit_code` is the CLI's code for it."""

    exit_code = ExitCode.INTERNAL

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class UsageError(AuditError):
    """What the user typed is wrong: a path, a name, a spec, an option value. Exit 2."""

    exit_code = ExitCode.USAGE


class PolicySpecError(UsageError):
    """A policy spec that does not resolve, or a policy that misbehaves. Exit 2."""


class TargetError(AuditError):
    """The user's code failed: import, inputs callable, or tracing. Exit 3."""

    exit_code = ExitCode.TARGET


class PolicyError(TargetError):
    """A policy callable of the user's raised, or answered something that is not a verdict. Exit 3:
    it is the user's code, like the model's."""


class DevicesUnavailable(UsageError):  # noqa: N818 (a UsageError, named for what happened)
    """JAX's CPU backend started with fewer devices than a mesh needs. The command line answers by
    running itself again with XLA's device-count flag; a library caller sets
    `XLA_FLAGS=--xla_force_host_platform_device_count=N` before JAX starts its backend."""

    def __init__(self, needed: int, found: int) -> None:
        flag = "--xla_force_host_platform_device_count"
        super().__init__(
            f"the mesh needs {needed} devices, but JAX's CPU backend already started with {found}",
            f"set XLA_FLAGS={flag}={needed} before JAX starts (before its first computation)",
        )
        self.needed = needed
        self.found = found


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, also for one whose __str__ raises."""
    try:
        lines = str(exc).strip().splitlines()
    except Exception:
        return "(no message: its __str__ raised)"
    return lines[0] if lines else type(exc).__name__
