"""The console script's entry point: the launcher, which owns the process.

- Standard streams closed at start (`>&-`, `2>&-`) are opened on /dev/null, so that no file the
  command opens later takes their number and receives what XLA or the model writes there; Python
  still knows them as closed (`sys.stdout is None`), and the command says so or stays quiet.
- te-ckpt-audit refuses a jax outside its supported range while importing
  (`te_ckpt_audit._jax_compat`); here, before any command exists, that refusal becomes the command
  line's one-line error and exit 2 (bad input), not an ImportError traceback.
- A JAX environment variable JAX cannot read (`JAX_REMAT3=maybe`) ends JAX's import with a
  ValueError: it becomes a usage error naming the variable (exit 2), not a traceback and exit 1.
- When the command is done, the process ends with its code, even where the model's code left a
  thread running that Python would otherwise wait for forever.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

_USAGE = 2  # ExitCode.USAGE; options.py cannot be imported before the version check passes
_BAD_TRUTH = re.compile(r"invalid truth value '(.*)' for environment '(\w+)'")  # jax's bool_env


def _version() -> str:
    """`te-ckpt-audit --version` without importing jax, typer or rich: read from the installed
    distributions' metadata, it costs milliseconds, not the seconds JAX takes to import."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"te-ckpt-audit {version('te-ckpt-audit')} (jax {version('jax')})"
    except PackageNotFoundError:  # run from a source tree that is not installed
        from te_ckpt_audit import __version__

        return f"te-ckpt-audit {__version__}"


def _hold_closed_streams() -> None:
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:  # closed: /dev/null holds its number
            with contextlib.suppress(OSError):
                opened = os.open(os.devnull, os.O_RDWR)
                if opened != fd:
                    os.dup2(opened, fd)
                    os.close(opened)


def _end(code: int) -> None:
    """Exit with `code`; where a thread the model's code started would keep the process alive,
    flush what is buffered and end it now."""
    lingering = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if not lingering:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os._exit(code)


def main() -> None:
    """Run `te-ckpt-audit`, or say in one line on stderr which jax versions it supports."""
    _hold_closed_streams()
    if sys.argv[1:] in (["--version"], ["-V"]):
        if sys.stdout is not None:
            print(_version())
        return
    try:
        from .app import run
    except ValueError as err:  # JAX reads its boolean environment variables while it imports
        bad = _BAD_TRUTH.search(str(err))
        if bad is None:
            raise
        if sys.stderr is not None:
            print(f"te-ckpt-audit: error: {bad.group(2)}={bad.group(1)} is not a value JAX takes (hint: set "
                  f"{bad.group(2)} to 1 or 0, true or false, or unset it)", file=sys.stderr)
        sys.exit(_USAGE)
    except ImportError as err:
        message = getattr(err, "message", None)
        if getattr(err, "supported", None) is None or message is None:
            raise  # not the version check: a broken install, shown as it is
        hint = getattr(err, "hint", "")
        if sys.stderr is not None:
            print(f"te-ckpt-audit: error: {message}" + (f" (hint: {hint})" if hint else ""), file=sys.stderr)
        sys.exit(_USAGE)
    _end(run(sys.argv[1:]))
