"""What a text output may print of the names a model carries.

Checkpoint names, scopes, file and function names, policy specs and error messages come from the
user's code and reach line-based outputs: a newline there would start a line of its own (a forged
`::error` annotation in a GitHub log, a heading in a Markdown summary), and an escape sequence would
drive the terminal. Every text renderer prints records through `printable_records`, which writes
each such character as a visible escape (`\\n`, `\\x1b`, `\\u202e`); JSON keeps the data as it is
(its own escaping is exact).

    >>> printable("a\\nb\\x1b[31m\\u202e")
    'a\\\\nb\\\\x1b[31m\\\\u202e'
"""

from __future__ import annotations

import dataclasses
import unicodedata
from typing import TypeVar, cast

T = TypeVar("T")

_SAFE = {"Cc", "Cf", "Cs", "Zl", "Zp"}  # controls, format (bidi), lone surrogates, line separators


def printable(text: str) -> str:
    """`text` with every control, format or separator character, and every lone surrogate (an
    undecodable file name), written as its Python escape; other text as it is."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) in _SAFE or not ch.isprintable() and ch != " ":
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def printable_records(value: T) -> T:
    """A copy of `value` (records, tuples and lists of them) with every string `printable`; what
    holds no such string is kept as it is, not copied."""
    return cast(T, _clean(value))


def _clean(value: object) -> object:
    kind = type(value)
    if kind is str:
        return printable(value)  # type: ignore[arg-type]
    if kind is tuple:
        items = tuple(_clean(v) for v in value)  # type: ignore[attr-defined]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items  # type: ignore[call-overload]
    if kind is list:
        return [_clean(v) for v in value]  # type: ignore[attr-defined]
    names = _fields(kind)
    if not names:
        return value
    changes = {}
    for name in names:
        old = getattr(value, name)
        new = _clean(old)
        if new is not old:
            changes[name] = new
    return dataclasses.replace(value, **changes) if changes else value  # type: ignore[type-var]


_NO_TEXT = {"int", "bool", "float", "int | None", "float | None", "tuple[int, ...]", "bool | None"}
_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(kind: type) -> tuple[str, ...]:
    """The fields of a record type that may hold text (of other records: every field but numbers
    and enums); none for any other type."""
    if kind not in _FIELDS:
        names: tuple[str, ...] = ()
        if dataclasses.is_dataclass(kind):
            names = tuple(
                f.name for f in dataclasses.fields(kind)
                if f.init and not (isinstance(f.type, str) and (f.type in _NO_TEXT or f.type in _ENUMS))
            )
        _FIELDS[kind] = names
    return _FIELDS[kind]


_ENUMS = {
    "Outcome", "Verdict", "ResidualKind", "TeKind", "Category", "Scope", "WarningCode", "ShardingSource",
    "HotspotKey", "Figure", "CandidateKind", "Scope | None", "ShardingSource | None",
}
