"""What a stage tells its caller while it works: the stage it is in (text for a spinner), or a
compile starting or done (a record, one line in a CI log)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from .records import CompileProgress

Progress: TypeAlias = Callable[[str | CompileProgress], None]


def quiet(_: str | CompileProgress) -> None:
    """A progress callback that says nothing."""
