"""Where an equation comes from: the module path on JAX's name stack, the innermost frame of the
user's own code, and the innermost frame overall (often a library's line)."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
import traceback
import types
from pathlib import Path

from .. import _jax_compat as jc
from ..records import SourceLocation

_HERE = str(Path(__file__).parent)


@dataclasses.dataclass(frozen=True, slots=True)
class Origin:
    source: SourceLocation | None  # innermost frame of the user's code
    frame: SourceLocation | None  # innermost frame overall (JAX's own frames left out)


def is_library_file(filename: str, marked: frozenset[str] = frozenset()) -> bool:
    """Not the user's own code: te-ckpt-audit itself, installed packages, the standard library, or a
    module `marked` as library code (`__te_ckpt_audit_library__ = True`, as the TE stand-in is)."""
    return (
        filename.startswith(_HERE)
        or filename in marked
        or any(part in filename for part in _LIBRARY_PARTS)
    )


_LIBRARY_PARTS = (
    f"{os.sep}site-packages{os.sep}",
    f"{os.sep}dist-packages{os.sep}",
    "<frozen",
    f"{os.sep}lib{os.sep}python",
)


def user_location(exc: BaseException, roots: tuple[str, ...] = ()) -> str:
    """file:line of the innermost frame of the user's code in an exception's traceback (or in the
    exceptions it was raised from); never a frame of te-ckpt-audit itself."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    for e in chain:
        user = [f for f in traceback.extract_tb(e.__traceback__) if not is_library_file(f.filename)]
        preferred = [f for f in user if any(f.filename.startswith(r) for r in roots)] or user
        if preferred:
            return f"{preferred[-1].filename}:{preferred[-1].lineno}"
    return "an unknown location (no frame of your code in the traceback)"


def raised_in_user_code(exc: BaseException) -> bool:
    """Whether the innermost frame of the traceback is the user's (their code raised it)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and not is_library_file(frames[-1].filename)


def module_globals(module: object) -> dict[str, object]:
    """A module's own namespace, read without running any of its code: `getattr` on a module can
    call its PEP 562 `__getattr__` (transformers 5 imports torch that way), and `sys.modules` may
    hold objects that are not modules at all."""
    if not issubclass(type(module), types.ModuleType):
        return {}
    try:
        namespace = object.__getattribute__(module, "__dict__")
    except Exception:  # noqa: BLE001 - not ours to fail on
        return {}
    return namespace if type(namespace) is dict else {}


def _library_files() -> frozenset[str]:
    """Files of modules that ask to be treated as library code (`__te_ckpt_audit_library__ = True`)."""
    files = set()
    for module in list(sys.modules.values()):
        namespace = module_globals(module)
        file = namespace.get("__file__")
        if namespace.get("__te_ckpt_audit_library__") is True and type(file) is str:
            files.add(file)
    return frozenset(files)


class SourceFinder:
    """Picks, for an equation, the innermost frame of the user's own code (None when its
    traceback holds none) and the innermost frame.

    Frames in installed packages (site-packages), in te-ckpt-audit itself, and in modules that set
    `__te_ckpt_audit_library__ = True` (the TE stand-in) are not the user's.
    """

    def __init__(self) -> None:
        self._library = _library_files()
        self._cache: dict[int, tuple[jc.Traceback | None, Origin]] = {}
        self._files: dict[str, bool] = {}  # file name -> a library's; a trace has few files
        self.packages: set[str] = set()  # the installed packages whose code made equations ("maxtext")

    def _is_library(self, filename: str) -> bool:
        if filename not in self._files:
            self._files[filename] = is_library_file(filename, self._library)
            installed = re.search(r"[/\\](?:site|dist)-packages[/\\]([A-Za-z_][\w]*)", filename)
            if installed:
                self.packages.add(installed.group(1))
        return self._files[filename]

    def __call__(self, eqn: jc.JaxprEqn) -> Origin:
        tb = eqn.source_info.traceback
        key = id(tb)
        if key in self._cache:
            return self._cache[key][1]
        first = chosen = None
        for frame in jc.user_frames(eqn):
            if first is None:
                first = frame
            if not self._is_library(frame.file_name):
                chosen = frame
                break
        origin = Origin(_location(chosen), _location(first))
        self._cache[key] = (tb, origin)  # the traceback is kept alive so its id stays unique
        return origin


    def user_lines(self, eqn: jc.JaxprEqn) -> tuple[SourceLocation, ...]:
        """Every frame of the user's own code that made the equation, innermost first."""
        return tuple(SourceLocation(_display_path(f.file_name), int(f.start_line), f.function_name)
                     for f in jc.user_frames(eqn) if not self._is_library(f.file_name))


def _location(frame: jc.Frame | None) -> SourceLocation | None:
    if frame is None:
        return None
    return SourceLocation(_display_path(frame.file_name), int(frame.start_line), frame.function_name)


def _display_path(filename: str) -> str:
    return display_path(filename, os.getcwd())


@functools.lru_cache(maxsize=4096)
def display_path(filename: str, cwd: str) -> str:
    """`filename` as a report shows it: relative to `cwd` when it lies below it; an installed
    package's file from its package folder on (`flax/linen/module.py`, not the absolute path into
    site-packages); a standard-library file from its `lib/pythonX.Y` folder on; else as it is.

    >>> display_path("/venv/lib/python3.12/site-packages/flax/linen/module.py", "/home/me")
    'flax/linen/module.py'
    """
    try:
        rel = os.path.relpath(filename, cwd)
    except ValueError:
        rel = ".."
    if not rel.startswith(".."):
        return rel
    for marker in _INSTALLED:
        at = filename.rfind(marker)
        if at >= 0:
            return filename[at + len(marker) :]
    found = _STDLIB.search(filename)
    return filename[found.end() :] if found else filename


_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_STDLIB = re.compile(rf"{re.escape(os.sep)}lib{re.escape(os.sep)}python\d+\.\d+t?{re.escape(os.sep)}")
