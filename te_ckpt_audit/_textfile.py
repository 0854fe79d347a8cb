"""Reading a text file the user names (a config, a baseline): a regular file of bounded size, read
once. A device (`/dev/zero`), a FIFO or a folder is refused before any byte is read: reading one
could take forever or all memory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import UsageError

MAX_BYTES = 16 * 2**20  # far above any config or baseline; a larger file is not one


def read_text(path: str | Path, what: str, hint: str, limit: int = MAX_BYTES) -> str:
    """The file's text (UTF-8, a leading byte-order mark dropped), or a UsageError naming `what`
    and why. A missing file raises FileNotFoundError, for the caller to word."""
    data = read_bytes(path, what, hint, limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start})", hint) from None


def read_bytes(path: str | Path, what: str, hint: str, limit: int = MAX_BYTES) -> bytes:
    """The file's bytes, as `read_text` reads them."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise UsageError(f"{what} {path} is a folder", hint) from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}", hint) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise UsageError(f"{what} {path} is {kind}", hint)
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}", hint) from None
    if len(data) > limit:
        raise UsageError(f"{what} {path} is larger than {limit // 2**20} MiB", hint)
    return data
