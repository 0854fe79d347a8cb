"""Protocol-buffer text format, read strictly against a schema: any layout the format allows
(one line or many, fields in any order, `:` before a message or not, `{}` or `<>`, `,` or `;`
between fields, comments), and nothing it does not (an unknown field, a scalar given twice, a
number out of its type's range, a negative count). Written back canonically, so that one field
can be replaced without touching text around it.

The schema is a table of fields: a scalar kind (`int32`, `int64`, `float`, `bool`, `string`),
an enum (a tuple of names), a message (a nested table), or `OPAQUE` (a message kept as written).
A field whose name ends in `*` is repeated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, TypeAlias

from .errors import UsageError

OPAQUE = "opaque"
Schema: TypeAlias = Mapping[str, Any]
Message: TypeAlias = dict[str, Any]  # field -> value, or list of values where repeated

_TOKEN = re.compile(
    r"""\s+|\#[^\n]*|(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')"""
    r"""|(?P<num>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?|inf(?:inity)?|nan)(?![\w.]))"""
    r"""|(?P<id>[A-Za-z_][\w]*)|(?P<sym>[{}<>:,;\[\]])""",
    re.IGNORECASE,
)
_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\", "a": "\a", "b": "\b", "f": "\f",
            "v": "\v", "?": "?"}


class TextProtoError(UsageError):
    """The text is not a message of the schema."""


def _tokens(text: str, what: str) -> list[tuple[str, str, int]]:
    """Each token with its line, counted as the scan goes (linear: counting from the text's start
    at every token took minutes on a 1 MiB file)."""
    out, pos, line = [], 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise TextProtoError(f"{what}: line {line}: {text[pos:pos + 20]!r} is not protocol-buffer text",
                                 "write it as XLA's GPU specs are written (text format)")
        kind = m.lastgroup
        if kind is not None:
            out.append((kind, m.group(kind), line))
        line += text.count("\n", pos, m.end())
        pos = m.end()
    return out


def _unquote(token: str) -> str:
    body, out, i = token[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "xX":
            digits = re.match(r"[0-9a-fA-F]{1,2}", body[i + 2:])
            out.append(chr(int(digits.group(0), 16)) if digits else "x")
            i += 2 + (len(digits.group(0)) if digits else 0)
        elif nxt in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i + 1:])
            assert digits is not None  # nxt is an octal digit
            out.append(chr(int(digits.group(0), 8)))
            i += 1 + len(digits.group(0))
        else:
            raise TextProtoError(f"unknown escape \\{nxt} in a string", "use \\n, \\t, \\\\ or \\\"")
    return "".join(out)


class _Parser:
    def __init__(self, text: str, what: str) -> None:
        self.text, self.what = text, what
        self.tokens = _tokens(text, what)
        self.i = 0

    def fail(self, message: str, hint: str = "copy the field from one of XLA's GPU specs") -> TextProtoError:
        line = self.tokens[min(self.i, len(self.tokens) - 1)][2] if self.tokens else 1
        return TextProtoError(f"{self.what}: line {line}: {message}", hint)

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str, int]:
        tok = self.peek()
        if tok is None:
            raise self.fail("the text ends inside a message")
        if value is not None and tok[1] != value:
            raise self.fail(f"expected {value!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def message(self, schema: Schema, close: str | None, path: str) -> Message:
        out: Message = {}
        while True:
            tok = self.peek()
            if tok is None or (close is not None and tok[1] == close):
                if close is not None:
                    self.take(close)
                elif tok is not None:
                    raise self.fail(f"unexpected {tok[1]!r}")
                return out
            if close is None and tok[1] in "}>":
                raise self.fail(f"unexpected {tok[1]!r}")
            kind, name, _ = self.take()
            if kind != "id":
                raise self.fail(f"expected a field name, found {name!r}")
            field = f"{path}{name}"
            repeated = f"{name}*" in schema
            spec = schema.get(f"{name}*", schema.get(name))
            if spec is None:
                known = ", ".join(sorted(k.rstrip("*") for k in schema))
                raise self.fail(f"unknown field {field!r}", f"fields there: {known}")
            if name in out and not repeated:
                raise self.fail(f"{field} is given twice", "give each field once")
            value = self.value(spec, field)
            if repeated:
                out.setdefault(name, []).extend(value if isinstance(value, list) else [value])
            else:
                out[name] = value
            if self.peek() is not None and self.peek()[1] in ",;":  # type: ignore[index]
                self.take()

    def value(self, spec: Any, field: str) -> Any:
        if isinstance(spec, Mapping) or spec == OPAQUE:
            if self.peek() is not None and self.peek()[1] == ":":  # type: ignore[index]
                self.take(":")
            opener = self.take()[1]
            if opener not in "{<":
                raise self.fail(f"{field} is a message: expected {{ after it")
            close = "}" if opener == "{" else ">"
            if spec == OPAQUE:
                return self.opaque(close)
            return self.message(spec, close, f"{field}.")
        self.take(":")
        if self.peek() is not None and self.peek()[1] == "[":  # type: ignore[index]
            self.take("[")
            items = []
            while self.peek() is not None and self.peek()[1] != "]":  # type: ignore[index]
                items.append(self.scalar(spec, field))
                if self.peek() is not None and self.peek()[1] == ",":  # type: ignore[index]
                    self.take(",")
            self.take("]")
            return items
        return self.scalar(spec, field)

    def opaque(self, close: str) -> str:
        """A message kept as written: its tokens up to the matching close."""
        start, depth = self.i, 1
        while depth:
            tok = self.take()
            depth += tok[1] in "{<" and tok[0] == "sym"
            depth -= tok[1] in "}>" and tok[0] == "sym"
        return " ".join(t[1] for t in self.tokens[start:self.i - 1])

    def scalar(self, spec: Any, field: str) -> Any:
        kind, text, _ = self.take()
        if isinstance(spec, tuple):  # an enum: a name (or its number)
            if kind == "id" and text in spec:
                return text
            if kind == "num" and text.isdigit() and int(text) < len(spec):
                return spec[int(text)]
            raise self.fail(f"{field}: {text!r} is not one of {', '.join(spec)}")
        if spec == "string":
            if kind != "str":
                raise self.fail(f"{field} is a string: quote it")
            parts = [_unquote(text)]
            while self.peek() is not None and self.peek()[0] == "str":  # type: ignore[index]
                parts.append(_unquote(self.take()[1]))
            return "".join(parts)
        if spec == "bool":
            if text in ("true", "True", "t", "1"):
                return True
            if text in ("false", "False", "f", "0"):
                return False
            raise self.fail(f"{field} is true or false, not {text!r}")
        if kind != "num":
            raise self.fail(f"{field} is a number, not {text!r}")
        if spec == "float":
            value = float(text.rstrip("fF")) if not text.lower().lstrip("+-").startswith("0x") else float(int(text, 16))
            if not math.isfinite(value):
                raise self.fail(f"{field} is {text}: a finite number is needed")
            return value
        try:
            value = int(text, 0) if not re.fullmatch(r"[-+]?0\d+", text) else int(text, 8)
        except ValueError:
            raise self.fail(f"{field} is an integer, not {text!r}") from None
        lo, hi = _RANGES[spec]
        if not lo <= value <= hi:
            raise self.fail(f"{field} is {text}: out of range for {spec}")
        return value


def parse(text: str, schema: Schema, what: str) -> Message:
    """The message `text` holds, checked against `schema`; a TextProtoError names what is wrong,
    and where: every error starts with `what` (the file)."""
    try:
        return _Parser(text, what).message(schema, None, "")
    except TextProtoError as err:
        if err.template.startswith(what):
            raise
        raise TextProtoError(f"{what}: {err.template}", err.hint_template) from None


def _quote(value: str) -> str:
    return '"' + "".join(f"\\{ord(c):03o}" if ord(c) < 32 or c in '"\\' else c for c in value) + '"'


def write(message: Message, schema: Schema, indent: str = "") -> str:
    """`message` in canonical text format: one field per line, in the schema's order."""
    lines = []
    for key, spec in schema.items():
        name = key.rstrip("*")
        if name not in message:
            continue
        values = message[name] if key.endswith("*") else [message[name]]
        for value in values:
            if isinstance(spec, Mapping):
                lines.append(f"{indent}{name} {{\n{write(value, spec, indent + '  ')}{indent}}}")
            elif spec == OPAQUE:
                lines.append(f"{indent}{name} {{ {value} }}")
            elif spec == "string":
                lines.append(f"{indent}{name}: {_quote(value)}")
            elif spec == "bool":
                lines.append(f"{indent}{name}: {'true' if value else 'false'}")
            else:
                lines.append(f"{indent}{name}: {value!r}" if spec == "float" else f"{indent}{name}: {value}")
    return "".join(line + "\n" for line in lines)
