"""The console script's entry point: the launcher, which owns the process. te-ckpt-audit refuses
a jax outside its supported range while importing (`te_ckpt_audit._jax_compat`); here, before any
command exists, that refusal becomes the command line's one-line error and exit 2 (bad input),
not an ImportError traceback."""

from __future__ import annotations

import sys

_USAGE = 2  # ExitCode.USAGE; options.py cannot be imported before the version check passes


def _version() -> str:
    """`te-ckpt-audit --version` without importing jax, typer or rich: read from the installed
    distributions' metadata, it costs milliseconds, not the seconds JAX takes to import."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"te-ckpt-audit {version('te-ckpt-audit')} (jax {version('jax')})"
    except PackageNotFoundError:  # run from a source tree that is not installed
        from te_ckpt_audit import __version__

        return f"te-ckpt-audit {__version__}"


def main() -> None:
    """Run `te-ckpt-audit`, or say in one line on stderr which jax versions it supports."""
    if sys.argv[1:] == ["--version"]:
        print(_version())
        return
    try:
        from .app import run
    except ImportError as err:
        message = getattr(err, "message", None)
        if getattr(err, "supported", None) is None or message is None:
            raise  # not the version check: a broken install, shown as it is
        hint = getattr(err, "hint", "")
        print(f"te-ckpt-audit: error: {message}" + (f" (hint: {hint})" if hint else ""), file=sys.stderr)
        sys.exit(_USAGE)
    sys.exit(run(sys.argv[1:]))
