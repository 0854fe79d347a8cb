"""The CLI's edge with the outside: errors as one line and an exit code, the report written to
stdout or to a file, and a spinner on stderr while the audit runs."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from te_ckpt_audit import AuditError
from te_ckpt_audit.gate import write_atomically

from .options import ExitCode

PROG = "te-ckpt-audit"


def error_line(message: str, hint: str = "") -> str:
    text = f"{PROG}: error: {message}" + (f" (hint: {hint})" if hint else "")
    return " ".join(text.splitlines())  # one line, whatever the message holds


def fail(message: str, hint: str, code: int) -> int:
    print(error_line(message, hint), file=sys.stderr)
    return code


def at_the_edge(command: Callable[..., int]) -> Callable[..., int]:
    """Run a command; its errors become one line on stderr and an exit code (with the traceback
    before it under --debug). Library errors carry their code; anything else is a bug: 4."""

    @functools.wraps(command)
    def run(**kwargs: Any) -> int:
        try:
            return command(**kwargs)
        except AuditError as err:
            if kwargs.get("debug"):
                traceback.print_exc()
            return fail(err.message, err.hint, err.exit_code)
        except Exception as err:
            if kwargs.get("debug"):
                traceback.print_exc()
            return fail(
                f"internal error: {type(err).__name__}: {err}",
                "rerun with --debug and report the traceback",
                ExitCode.INTERNAL,
            )

    return run


def emit(text: str, output: str | Path | None) -> None:
    """The report goes to `output` (written atomically: on any failure no file is left), else to
    stdout as plain text."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomically(output, text)


@contextlib.contextmanager
def progress_on_stderr(delay: float = 0.5) -> Iterator[Callable[[str], None]]:
    """Yield a callback the library tells each stage; a transient spinner shows it on stderr, only
    when stderr is a terminal and only once the audit has run for `delay` seconds."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda _: None
        return
    status = console.status("starting", spinner="dots")
    timer = threading.Timer(delay, status.start)
    timer.start()
    try:
        yield status.update
    finally:
        timer.cancel()
        timer.join()
        status.stop()
