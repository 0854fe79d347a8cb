"""The CLI's edge with the outside: errors as one line and an exit code, the report written to
stdout or to a file, and a spinner on stderr while the audit runs.

Standard output carries the report and nothing else; every other line goes to standard error, or
nowhere when it is closed (never to standard output instead). A closed pipe ends the command
quietly, as Unix tools end (exit 141); a report that cannot be written is exit 2, naming why."""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from te_ckpt_audit import AuditError, AuditReport, CheckResult, UsageError
from te_ckpt_audit.records import CompileProgress
from te_ckpt_audit.render import policy_errors, printable, violation_message

from .exit_codes import ExitCode, exit_code_of
from .files import write_output
from .options import FLAGS

PROG = "te-ckpt-audit"


class PipeClosed(Exception):  # noqa: N818 (what happened, not an error of ours)
    """Whoever read standard output stopped reading (`te-ckpt-audit ... | head`)."""


def say(line: str) -> None:
    """One line on standard error, its control characters escaped; nothing when it is closed."""
    stream = sys.stderr
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        stream.write(printable(line) + "\n")
        stream.flush()


def error_line(message: str, hint: str = "") -> str:
    text = f"{PROG}: error: {message}" + (f" (hint: {hint})" if hint else "")
    return printable(" ".join(text.splitlines()))  # one line, whatever the message holds


def fail(message: str, hint: str, code: int) -> int:
    say(error_line(message, hint))
    return code


class Terminated(BaseException):  # noqa: N818 (an event, as KeyboardInterrupt)
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt: the command's
    contexts unwind (its worker processes ended) and it exits 143, as shells report SIGTERM. A
    BaseException, so that no `except Exception` (the model's, or a stage's) swallows it."""


def end_on_sigterm() -> None:
    """SIGTERM ends the command as Ctrl-C does (`Terminated`)."""

    def terminated(signum: int, frame: object) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, terminated)


def check_report_destination(output: str | Path | None) -> None:
    """Before any work: the report must have somewhere to go."""
    if output is None and sys.stdout is None:
        raise UsageError("standard output is closed: the report has nowhere to go",
                         "redirect standard output, or write the report with -o FILE")


def at_the_edge(command: Callable[..., int]) -> Callable[..., int]:
    """Run a command; its errors become one line on stderr and an exit code (with the traceback
    before it under its `debug` option, which every command has). A library error's code is its
    kind's; anything else is a bug: 4."""
    if "debug" not in inspect.signature(command).parameters:
        raise TypeError(f"command {command.__name__} has no debug option")

    @functools.wraps(command)
    def run(**kwargs: Any) -> int:
        try:
            return command(**kwargs)
        except AuditError as err:
            if kwargs.get("debug"):
                traceback.print_exc()
            return fail(*err.worded(FLAGS), exit_code_of(err))
        except KeyboardInterrupt:
            return fail("interrupted", "", ExitCode.INTERRUPTED)
        except Terminated:
            return fail("terminated", "", ExitCode.TERMINATED)
        except PipeClosed:
            return ExitCode.PIPE_CLOSED
        except Exception as err:
            if kwargs.get("debug"):
                traceback.print_exc()
            return fail(
                f"internal error: {type(err).__name__}: {err}",
                "rerun with --debug and report the traceback",
                ExitCode.INTERNAL,
            )

    return run


def report_gate(results: Sequence[CheckResult], baseline: str | Path | None) -> int:
    """A note per policy missing from the baseline, a line per violation; the exit code."""
    for result in results:
        missing = [p for p in result.not_in_baseline if p not in {v.policy for v in result.violations}]
        if missing:
            say(f"{PROG}: note: {result.target} [{', '.join(missing)}]: not in baseline {baseline}")
    failed = [v for result in results for v in result.violations]
    for v in failed:
        say(f"{PROG}: check failed: {violation_message(v)}")
    return ExitCode.CHECK_FAILED if failed else ExitCode.OK


def report_policy_errors(reports: Sequence[AuditReport], code: int) -> int:
    """A line per policy JAX could not differentiate a target under; the target failed (exit 3)
    unless `code` already says worse. A gate never passes over a policy it could not measure."""
    errors = [(report.target, policy, why) for report in reports for policy, why in policy_errors(report)]
    for target, policy, why in errors:
        say(f"{PROG}: error: {target} [{policy}]: not differentiable under this policy: {why}")
    return ExitCode.TARGET if errors and code in (ExitCode.OK, ExitCode.CHECK_FAILED) else code


def emit(text: str, output: str | Path | None) -> None:
    """The report goes to `output` (a regular file written atomically: on any failure no file is
    left; a device or FIFO written into), else to stdout as plain text."""
    if output is not None:
        write_output(output, text)
        if Path(output).is_file():  # -o alone would otherwise end in silence; /dev/null or a pipe needs no word
            say(f"{PROG}: report written to {output}")
        return
    check_report_destination(None)
    data = text.encode("utf-8", "backslashreplace")  # a lone surrogate (an undecodable name) as \udcff
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        with contextlib.suppress(OSError):  # nothing more can go there: not even Python's flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise PipeClosed from None
    except OSError as exc:
        raise UsageError(f"cannot write the report to standard output: {exc.strerror or exc}",
                         "write it to a file with -o FILE") from None


class _Dropping(io.TextIOBase):
    """A text stream that passes its lines on to `out`, less those `drop` matches."""

    def __init__(self, out: TextIO, drop: re.Pattern[str]) -> None:
        self.out, self.drop, self.pending = out, drop, ""

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        self.out.write("".join(line + "\n" for line in lines if not self.drop.match(line)))
        return len(text)

    def flush(self) -> None:
        if self.pending and not self.drop.match(self.pending):
            self.out.write(self.pending)
        self.pending = ""
        self.out.flush()


@contextlib.contextmanager
def stdout_kept_for_the_report(drop: re.Pattern[str] | None = None) -> Iterator[None]:
    """While the user's code runs, whatever it writes to standard output goes to stderr: Python's
    sys.stdout, and file descriptor 1 itself (os.write, subprocesses, sys.__stdout__), so that stdout
    carries only the report. Afterwards the working folder is the one it was before: the model's
    code may change it, and the paths the user gave (-o, --save-baseline) are relative to theirs.
    `drop`: lines Python writes there that are a library's chatter, not the user's (MaxText's
    "[NO-OP] ... using stub." on import), left out."""
    for stream in (sys.stdout, sys.__stdout__):
        with contextlib.suppress(Exception):
            stream.flush()  # type: ignore[union-attr]
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no fd 1 or 2 to work with: Python's own streams are still redirected
        saved = -1
    folder = os.getcwd()
    try:
        target = sys.stderr if drop is None else _Dropping(sys.stderr, drop)
        with contextlib.redirect_stdout(target):
            yield
    finally:
        if drop is not None:
            with contextlib.suppress(Exception):
                target.flush()
        with contextlib.suppress(OSError):
            os.chdir(folder)  # the model's code may have changed it: paths the user gave stay theirs
        with contextlib.suppress(Exception):
            sys.__stdout__.flush()  # type: ignore[union-attr]  # what the user left buffered goes to stderr too
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)


def compile_line(event: CompileProgress) -> str:
    """One line of a compile starting or done, as a CI log shows it."""
    what = f"{event.policy} for {event.gpu} ({event.backend})"
    if event.seconds is None:
        return f"{PROG}: compiling {what}"
    return f"{PROG}: compiled {what} in {event.seconds:.1f} s"


class _Status:
    """What the spinner shows: the stage, and every compile running now with its elapsed time."""

    def __init__(self) -> None:
        self.text = "starting"
        self.compiling: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()

    def tell(self, event: str | CompileProgress) -> None:
        with self.lock:
            if isinstance(event, str):
                self.text = event
            elif event.seconds is None:
                self.compiling[(event.policy, event.backend)] = time.monotonic()
            else:
                self.compiling.pop((event.policy, event.backend), None)

    def __rich__(self) -> Text:
        with self.lock:
            if not self.compiling:
                return Text(printable(self.text))
            now = time.monotonic()
            running = ", ".join(f"{p} ({b}, {now - t:.0f} s)" for (p, b), t in self.compiling.items())
            return Text(printable(f"compiling {running}"))


@contextlib.contextmanager
def progress_on_stderr(delay: float = 0.5) -> Iterator[Callable[[str | CompileProgress], None]]:
    """Yield a callback the library tells each stage and each compile. On a terminal a transient
    spinner shows it (once the audit has run for `delay` seconds), naming what is compiling now and
    for how long; elsewhere (a CI log) each compile's start and end is one line on stderr."""
    console = Console(stderr=True)
    if not console.is_terminal:

        def log(event: str | CompileProgress) -> None:
            if isinstance(event, CompileProgress):
                say(compile_line(event))

        yield log
        return
    now = _Status()
    status = console.status(now, spinner="dots")
    timer = threading.Timer(delay, status.start)
    timer.start()
    try:
        yield now.tell
    finally:
        timer.cancel()
        timer.join()
        status.stop()
