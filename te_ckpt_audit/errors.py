"""Typed errors. The library raises them; only the command line turns them into one line and an
exit code (its own: `te_ckpt_audit_cli.exit_codes`).

An error names what the caller gave by its parameter, written `$name$` in its message and hint:
the library's words are the parameter's own name (`max_compiles 0 must be at least 1`), and the
command line words it as its flag (`--max-compiles 0 must be at least 1`), through `worded`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_PARAMETER = re.compile(r"\$(\w+)\$")
# The library's words for what is not a parameter's name
LIBRARY_WORDS = {"debug": "the traceback is this error's __cause__"}


def worded(text: str, words: Mapping[str, str] = LIBRARY_WORDS) -> str:
    """`text` with each `$name$` as `words` say it (else as the name itself)."""
    return _PARAMETER.sub(lambda m: words.get(m.group(1), m.group(1)), text)


class AuditError(Exception):
    """Base class. `hint` says how to fix the problem. `template` and `hint_template` keep the
    `$name$` of each parameter they name."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.template = message
        self.hint_template = hint

    @property
    def message(self) -> str:
        return worded(self.template)

    @property
    def hint(self) -> str:
        return worded(self.hint_template)

    def say_as(self, words: Mapping[str, str]) -> None:
        """Name the parameters `words` holds as it says (a config file's keys), the others kept as
        `$name$` for whoever words the error last (the command line's flags)."""
        def sub(text: str) -> str:
            return _PARAMETER.sub(lambda m: words.get(m.group(1), m.group(0)), text)

        self.template, self.hint_template = sub(self.template), sub(self.hint_template)

    def worded(self, words: Mapping[str, str]) -> tuple[str, str]:
        """(message, hint) with each parameter as `words` say it (a command line: its flags)."""
        return worded(self.template, words), worded(self.hint_template, words)

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class UsageError(AuditError):
    """What the user typed is wrong: a path, a name, a spec, an option value. Exit 2."""



class PolicySpecError(UsageError):
    """A policy spec that does not resolve, or a policy that misbehaves. Exit 2."""


class TargetError(AuditError):
    """The user's code failed: import, inputs callable, or tracing. Exit 3."""



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


def shown(value: object, most: int = 40) -> str:
    """A value in an error message, short whatever it is (10**400 has 401 digits).

    >>> shown(10**400)[-6:]
    '000...'
    """
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, also for one whose __str__ raises."""
    try:
        lines = str(exc).strip().splitlines()
    except Exception:
        return "(no message: its __str__ raised)"
    return lines[0] if lines else type(exc).__name__


def a_or_an(word: str) -> str:
    """`word` with its indefinite article, for messages naming a type: "an int", "a float"."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"
