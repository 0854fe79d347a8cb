"""Compiled results kept on disk, keyed by what decides them (the lowered program, the GPU's
config, the compile options, XLA_FLAGS, the versions). JAX's own persistent cache cannot serve
these compiles: reading an entry back needs a client, which a device-less topology has not.

Trust model: a cache entry is input from disk, so it is read only from a folder owned by this
user that no one else may write into, only as a regular file (never through a link) owned by this
user and at most `MAX_ENTRY` bytes, and only if it names the key it is filed under and every field
is in range; anything else is a miss, compiled again and replaced. Writes go to a private
temporary file first and are renamed over the entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import stat
import threading
from pathlib import Path

SCHEMA = "te-ckpt-audit/gpu-compile/2"
MAX_ENTRY = 16 * 1024  # bytes: an entry is a few hundred
MAX_BYTES = 2**62  # no device plans more


@dataclasses.dataclass(frozen=True, slots=True)
class Measured:
    """What one compile of one step says: XLA's memory analysis, and how long it took."""

    argument: int
    output: int
    alias: int
    temp: int
    peak: int
    remat: int  # instructions XLA rematerialized
    seconds: float


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_BYTES


def _entry(raw: object, key: str) -> Measured | None:
    """The entry's figures, if it is one of this schema filed under `key` and every field is in range."""
    fields = [f.name for f in dataclasses.fields(Measured)]
    if not isinstance(raw, dict) or set(raw) != {"schema", "key", *fields}:
        return None
    if raw["schema"] != SCHEMA or raw["key"] != key:
        return None
    seconds = raw["seconds"]
    if not all(_count(raw[f]) for f in fields if f != "seconds"):
        return None
    if type(seconds) not in (int, float) or not math.isfinite(seconds) or not 0 <= seconds < 1e7:
        return None
    if raw["alias"] > min(raw["argument"], raw["output"]):  # aliased bytes are both an argument and an output
        return None
    if raw["peak"] < max(raw["argument"], raw["temp"]):  # the arguments and the temp are live at the peak's plan
        return None
    return Measured(**{f: raw[f] for f in fields})


def _constant(text: str) -> float:
    raise ValueError(f"{text} is not a number JSON allows")


class CompileCache:
    """Entries under `folder` (created private if missing); `None` keeps nothing."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def _trusted_folder(self) -> bool:
        if self.folder is None:
            return False
        try:
            info = os.lstat(self.folder)
        except OSError:
            return False
        return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
                and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))

    def read(self, key: str) -> Measured | None:
        """The entry filed under `key`, or None (a miss) for anything that is not a valid one."""
        return _entry(self._raw(key), key)

    def read_plain(self, key: str, schema: str) -> dict[str, object] | None:
        """The payload of an entry of `schema` filed under `key` (its own fields, the caller's to
        check), or None."""
        raw = self._raw(key)
        if not isinstance(raw, dict) or raw.get("schema") != schema or raw.get("key") != key:
            return None
        return {k: v for k, v in raw.items() if k not in ("schema", "key")}

    def _raw(self, key: str) -> object:
        if not self._trusted_folder():
            return None
        assert self.folder is not None
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(self.folder / f"{key}.json", flags)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size > MAX_ENTRY:
                return None
            data = os.read(fd, MAX_ENTRY + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) > MAX_ENTRY:
            return None
        try:
            return json.loads(data.decode("utf-8"), parse_constant=_constant)
        except (ValueError, RecursionError):
            return None

    def write(self, key: str, measured: Measured) -> None:
        """File `measured` under `key`; a cache that cannot be written costs a compile next time."""
        self.write_plain(key, SCHEMA, dataclasses.asdict(measured))

    def write_plain(self, key: str, schema: str, payload: dict[str, object]) -> None:
        """File a payload of `schema` under `key`."""
        if self.folder is None:
            return
        with contextlib.suppress(OSError):
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self._trusted_folder():
            return
        try:
            text = json.dumps({"schema": schema, "key": key, **payload}, allow_nan=False)
        except ValueError:
            return
        if len(text.encode()) > MAX_ENTRY:
            return
        part = self.folder / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(part, self.folder / f"{key}.json")
        except OSError:
            with contextlib.suppress(OSError):
                part.unlink()
