"""Files the command line writes: the report (`-o`) and baselines (`--save-baseline`).

A regular file is written atomically, through a temporary file and a rename, so it is never
half-written; a symlink is followed, so the link stays and its target gets the text; a character
device or FIFO (`/dev/null`, a pipe) is written into, never replaced; anything else is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from te_ckpt_audit import AuditReport, UsageError
from te_ckpt_audit.baselines import baseline_text, load_baseline, merged
from te_ckpt_audit.records import AuditKey, Baseline


def check_writable(path: str | Path) -> Path:
    """Where `write_output` will write `path` (symlinks followed), or a UsageError saying why it
    cannot: checked before the audit runs, so a run's work is not lost at the end."""
    try:  # a pipe or terminal behind a link (/dev/stdout -> /proc/self/fd/1 -> pipe:[N]) has no real path
        given = os.stat(path).st_mode
    except OSError:
        given = None
    if given is not None and (stat.S_ISCHR(given) or stat.S_ISFIFO(given)):
        if not os.access(path, os.W_OK):
            raise UsageError(f"cannot write {path}: permission denied", "choose a writable path")
        return Path(path)
    real = Path(os.path.realpath(path))
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}", "choose a writable path") from None
    if mode is not None and not stat.S_ISREG(mode):
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            if not os.access(real, os.W_OK):
                raise UsageError(f"cannot write {path}: permission denied", "choose a writable path")
            return real
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise UsageError(f"cannot write {path}: it is {kind}", "choose a file in a writable folder")
    if mode is not None and not os.access(real, os.W_OK):
        raise UsageError(f"cannot write {path}: the file is read-only (permission denied)", "choose a writable path")
    folder = real.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {path}: no writable folder {folder}", "choose a file in a writable folder")
    _probe(folder, path, exists=mode is not None)
    return real


def _probe(folder: Path, shown: str | Path, exists: bool) -> None:
    """A file is written through a new one beside it: make (and remove) one now, so that a folder
    where none can be made (a read-only or virtual filesystem) is refused before the run."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".te-ckpt-audit.", suffix=".probe")
    except OSError as exc:
        readonly = hasattr(os, "statvfs") and os.statvfs(folder).f_flag & os.ST_RDONLY
        why = "is on a read-only filesystem" if readonly else f"takes no new file ({exc.strerror})"
        if exists:  # the file is there: say why it cannot be replaced, not that it is missing
            why += ", and a report replaces a file whole through a new one beside it"
            raise UsageError(f"cannot write {shown}: the file exists, but its folder {folder} {why}",
                             "choose a file in a writable folder") from None
        raise UsageError(f"cannot write {shown}: {folder} {why}", "choose a file in a writable folder") from None
    os.close(fd)
    os.unlink(tmp)


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file (symlinks and hard links followed; neither need exist yet)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def refuse_overwriting(output: str | Path | None, reads: Iterable[tuple[str, str | Path]],
                       flag: str = "--output") -> None:
    """Before any work: `output` must not be a file the run reads (links followed, hard links
    too), or the report would replace it."""
    if output is None:
        return
    for what, path in reads:
        if same_file(output, path):
            raise UsageError(f"{flag} {output} is {what} ({path}), which this run reads: the report would "
                             "replace it", "write the report to another file")


def write_output(path: str | Path, text: str) -> None:
    """Write `text` to `path` (see the module's docstring)."""
    real = check_writable(path)
    if real.exists() and stat.S_ISFIFO(os.stat(real).st_mode):
        _write_fifo(real, text, shown=path)
        return
    if real.exists() and not real.is_file():  # a device: a rename would replace it
        try:
            with open(real, "w", encoding="utf-8", errors="backslashreplace") as f:
                f.write(text)
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror or exc}", "choose a writable path") from exc
        return
    _write_atomically(real, text, shown=path)


FIFO_WAIT_S = 10.0  # how long a FIFO may go without a reader, or a reader without reading


def _write_fifo(real: Path, text: str, shown: str | Path) -> None:
    """Into a FIFO, bounded: wait at most FIFO_WAIT_S seconds for a reader to open it and, between
    writes, for the reader to take more; never block forever on a pipe nobody reads."""
    wait = FIFO_WAIT_S
    data = text.encode("utf-8", errors="backslashreplace")
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(real, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise UsageError(f"cannot write {shown}: {exc.strerror}", "choose a writable path") from None
            if time.monotonic() > deadline:
                raise UsageError(f"cannot write {shown}: no process opened the FIFO to read it in {wait:g} s",
                                 "start its reader first, or write the report to a file") from None
            time.sleep(0.05)
    try:
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [fd], [], wait)
            if not ready:
                raise UsageError(f"cannot write {shown}: the FIFO's reader took nothing for {wait:g} s",
                                 "write the report to a file")
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except OSError as exc:  # the reader went away (EPIPE)
                raise UsageError(f"cannot write {shown}: {exc.strerror}", "write the report to a file") from None
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str, shown: str | Path) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write {shown}: {exc.strerror}", "choose a writable path") from exc
    try:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)  # replacing a file keeps its permissions
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # like open(): mkstemp's 0600 would surprise a CI artifact
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {shown}: {exc.strerror or exc}", "choose a writable path") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_baseline_file(path: str | Path) -> None:
    """Before any work: `path` can take a saved baseline (a new file, a device, or a baseline this
    version reads), so that a run is not lost at the end, nor a file that is something else."""
    real = check_writable(path)
    if real.is_file():
        _readable(real, path)


def _readable(real: Path, shown: str | Path) -> Baseline:
    try:
        return load_baseline(real)
    except UsageError as err:
        raise UsageError(
            f"{shown} is not a baseline this version can read, so it is left as it is: {err.template}",
            "save the baseline to another file, or remove this one if it should be replaced",
        ) from None


def save_baseline(path: str | Path, runs: Iterable[tuple[AuditKey, AuditReport]]) -> Baseline:
    """Merge the runs' figures into the baseline at `path` and write it: other entries, other
    policies of the same entry, and entries of a newer version are kept. A file there that is not
    a baseline this version can read is refused (UsageError) and left as it is. Writers of one
    file take turns: the folder is locked from reading to writing, so none loses another's entry."""
    real = check_writable(path)
    with _locked(real.parent):
        current = Baseline({})
        if real.is_file():  # never read a FIFO or a device: nothing may be writing to it
            current = _readable(real, path)
        new = merged(current, runs)
        write_output(path, baseline_text(new, real.parent))
    return new


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on `folder` (flock on the folder itself: no lock file left behind)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder we cannot open: no lock to take, the write still fails or works alone
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def compile_cache() -> Path:
    """Where GPU compiles are kept (`--gpu`): the tool's cache folder (TE_CKPT_AUDIT_CACHE, else
    XDG's, else ~/.cache/te-ckpt-audit), under gpu-compiles/; absolute, so that a model that
    changes the working folder as it is imported moves nothing."""
    root = os.environ.get("TE_CKPT_AUDIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "te-ckpt-audit"
    )
    return Path(os.path.abspath(root)) / "gpu-compiles"
