"""Sizes and limits as users write them: byte counts with units, budgets, percentages. Each check
lives here once; a limit that is not a finite number would switch its gate off.

    >>> parse_size("6GiB"), parse_size("1.5 MB"), parse_size("512")
    (6442450944, 1500000, 512)
"""

from __future__ import annotations

import math
import re

from .errors import UsageError, shown
from .records import Budget

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from "6GiB", "512 MB", "1024" (units B, KB, MB, GB, TB decimal; KiB, MiB, GiB, TiB binary)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"negative size {text}", "sizes are byte counts >= 0")
        return text
    shown = str(text)
    match = _SIZE.match(shown)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(
            f"not a size: {shown[:80]!r}", "use a number with B, KB, MB, GB, KiB, MiB or GiB, e.g. 6GiB"
        )
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value):
        raise UsageError(f"size {shown[:80]!r} is too large", "sizes are finite byte counts, e.g. 6GiB")
    return int(math.floor(value))


UNITLESS_FLOOR = 2**20  # a budget written without a unit below this is surely a unit left out


def budget_size(text: str | int, what: str = "budget") -> int:
    """A budget's bytes, as `parse_size` reads them; a number with no unit below 1 MiB (`128`,
    `budget = 512`) is a UsageError: no activation or peak budget is that small, so the unit was
    left out (128 B would fail every policy, or pass none the user meant). `128B` says bytes.

    >>> budget_size("128MiB"), budget_size("128B"), budget_size(4 * 2**20)
    (134217728, 128, 4194304)
    """
    size = parse_size(text)
    unitless = not isinstance(text, str) or not re.search(r"[a-zA-Z]", text)
    if unitless and size < UNITLESS_FLOOR:
        shown = str(text).strip()
        raise UsageError(f"${what}$ {shown} has no unit: {size} bytes is surely not the budget meant",
                         f'write "{shown}MiB" (or "{shown}B" if bytes are meant)')
    return size


def parse_budget(text: str, what: str = "budget") -> Budget:
    """`6GiB` (every policy) or `checkpoint_dots=6GiB` (one policy). A policy's own budget
    replaces the every-policy one for that policy (`gating.check`)."""
    policy, eq, size = text.rpartition("=")
    if eq and not policy.strip():
        raise UsageError(f"budget {text!r} names no policy", "use SIZE or POLICY=SIZE, e.g. checkpoint_dots=6GiB")
    return Budget(budget_size(size, what), policy.strip() or None)


def percent_limit(value: object, what: str) -> float:
    """A percentage limit (tolerance, recompute ceiling): a finite number >= 0, or a UsageError. A
    NaN would switch its gate off, since every comparison with NaN is false."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UsageError(f"${what}$ must be a finite number >= 0, not {value!r}", f"e.g. ${what}$ 5")
    return float(value)


def size_arg(value: object, what: str = "budget") -> int:
    """A size as the command line takes it, from Python: bytes (an int or a float) or text
    ("6GiB"), above zero; a UsageError naming the parameter otherwise.

    >>> size_arg("6GiB"), size_arg(1024)
    (6442450944, 1024)
    """
    if isinstance(value, str):
        try:
            return positive_bytes(parse_size(value), what)
        except UsageError as err:
            raise UsageError(f"${what}$ {value!r}: {err.template}", f"e.g. ${what}$='6GiB' or a number of bytes"
                             ) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"${what}$ takes a size, \"6GiB\" or a number of bytes, not {type(value).__name__}",
                         f"e.g. ${what}$='6GiB'")
    return positive_bytes(value, what)


def positive_bytes(value: object, what: str = "budget_bytes") -> int:
    """A byte count above zero (a budget to fit into), or a UsageError."""
    if isinstance(value, str):  # text is a size with a unit: say the number it stands for
        try:
            example = f"${what}$={parse_size(value)}"
        except UsageError:
            example = f"${what}$=6442450944 (6 GiB)"
        raise UsageError(f"${what}$ is a number of bytes, not the text {value[:40]!r}", f"e.g. {example}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"${what}$ must be a number of bytes, not {value!r}", f"e.g. ${what}$ 6GiB")
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"${what}$ must be a finite size above zero, not {value!r}", f"e.g. ${what}$ 6GiB")
    return int(value)


MAX_JOBS = 256  # worker processes, each tracing the target: more is surely a mistake (2**31 overflowed)


def count_at_least_one(value: object, what: str, example: int, most: int | None = None) -> int:
    """A count that must be >= 1 (`max_evals`), and at most `most` where given, or a UsageError
    naming the parameter `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"${what}$ must be an int of at least 1, not {shown(value)}", f"e.g. ${what}$ {example}")
    if value < 1:
        raise UsageError(f"${what}$ must be at least 1, not {shown(value)}", f"e.g. ${what}$ {example}")
    if most is not None and value > most:
        raise UsageError(f"${what}$ {shown} is more than {most}", f"e.g. ${what}$ {example}")
    return value
