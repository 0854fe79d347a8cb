"""A profile of the step measured on real GPUs, as JAX's profile-guided latency estimator takes it:
XLA's `ProfiledInstructionsProto` (tsl/profiler/protobuf/profiled_instructions.proto, package
tensorflow.profiler), binary (what `jax.experimental.profiler.get_profiled_instructions_proto`
returns) or protobuf text:

    costs { name: "fusion.12" cost_us: 42.5 }           # repeated InstructionCost: name = 1, cost_us = 2
    latencies { source: "a" target: "b" latency_us: 3 }  # repeated Latency: source = 1, target = 2, latency_us = 3

`--calibrate PROFILE` hands it to the estimate compile (XLA's `fdo_profile`: its scheduler then
orders and overlaps by the measured costs) and to the estimate (`_steptime.calibrated`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from pathlib import Path

from . import _textproto as textproto
from ._textfile import read_bytes
from .errors import UsageError

HINT = "give a ProfiledInstructionsProto: jax.experimental.profiler.get_profiled_instructions_proto(DIR) writes one"
SCHEMA = {
    "costs*": {"name": "string", "cost_us": "float"},
    "latencies*": {"source": "string", "target": "string", "latency_us": "float"},
}


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """Measured costs of a step's instructions, by HLO instruction name (microseconds per run)."""

    source: str  # the file, as given
    costs: tuple[tuple[str, float], ...]
    latencies: tuple[tuple[str, str, float], ...] = ()

    @property
    def cost_us(self) -> dict[str, float]:
        return dict(self.costs)

    def serialized(self) -> bytes:
        """The binary message, as XLA's `fdo_profile` takes it."""
        out = bytearray()
        for name, cost in self.costs:
            out += _field(1, _string(1, name) + _double(2, cost))
        for source, target, latency in self.latencies:
            out += _field(2, _string(1, source) + _string(2, target) + _double(3, latency))
        return bytes(out)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.serialized()).hexdigest()[:16]


MAX_COST_US = 3.6e9  # an hour per run of one instruction: 1e308 would make the step's time infinite


def read_profile(path: str | Path) -> Profile:
    """The profile in `path`, binary or text; a UsageError (exit 2) names what is wrong."""
    what = "the profile"
    if not isinstance(path, str | Path):
        raise UsageError(f"$calibrate$ takes a profile's path, not {type(path).__name__} {str(path)[:40]!r}",
                         "e.g. $calibrate$ profile.pbtxt")
    try:
        data = read_bytes(path, what, HINT)
    except FileNotFoundError:
        raise UsageError(f"no such profile: {path}", HINT) from None
    try:
        costs, latencies = _decode(data)
        if data and not costs and not latencies:
            raise ValueError("no field of the message")  # text that happens to be wire format
    except ValueError:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise UsageError(f"{what} {path} is neither a binary nor a text ProfiledInstructionsProto", HINT) from None
        doc = textproto.parse(text, SCHEMA, f"{what} {path}")
        costs = [(c.get("name", ""), c.get("cost_us", 0.0)) for c in doc.get("costs", [])]
        latencies = [(x.get("source", ""), x.get("target", ""), x.get("latency_us", 0.0))
                     for x in doc.get("latencies", [])]
    bad = next(((n, c) for n, c in costs if not n or not (0 <= c <= MAX_COST_US)), None)
    if bad is not None:
        raise UsageError(f"{what} {path}: the cost of {bad[0]!r} is {bad[1]}: each needs a name and a cost_us from 0 "
                         f"to {MAX_COST_US:g} (an hour: a step measured longer is not one)", HINT)
    late = next((x for x in latencies if not (0 <= x[2] <= MAX_COST_US)), None)
    if late is not None:
        raise UsageError(f"{what} {path}: the latency from {late[0]!r} to {late[1]!r} is {late[2]}: it needs a "
                         f"latency_us from 0 to {MAX_COST_US:g}", HINT)
    if not costs:
        raise UsageError(f"{what} {path} holds no instruction costs", HINT)
    seen: dict[str, float] = {}
    for name, cost in costs:  # two costs for one instruction: which one was measured is not known
        if name in seen and seen[name] != cost:
            raise UsageError(f"{what} {path} gives {name!r} two costs ({seen[name]:g} and {cost:g} us)",
                             "keep one cost per instruction (one step's profile)")
        seen[name] = cost
    if not any(cost > 0 for _, cost in costs):  # a step of measured kernels takes time: all zero is no profile
        raise UsageError(f"{what} {path}: every cost is 0 us, so the step would take no time",
                         "give the costs a profiler measured (cost_us of each instruction)")
    return Profile(str(path), tuple(costs), tuple(latencies))


# --- protobuf's wire format, for these three messages ----------------------------------------------

def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _string(number: int, text: str) -> bytes:
    return _field(number, text.encode())


def _double(number: int, value: float) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<d", value)


def _fields(data: bytes) -> list[tuple[int, object]]:
    """(field number, value) pairs of one message: bytes for length-delimited fields, float for
    64-bit ones, int for varints; ValueError where `data` is not wire format."""
    out: list[tuple[int, object]] = []
    i = 0

    def varint() -> int:
        nonlocal i
        value = shift = 0
        while True:
            if i >= len(data) or shift > 63:
                raise ValueError("a varint runs past the message")
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while i < len(data):
        key = varint()
        number, kind = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if kind == 0:
            out.append((number, varint()))
        elif kind == 1:
            if i + 8 > len(data):
                raise ValueError("a 64-bit field runs past the message")
            out.append((number, struct.unpack_from("<d", data, i)[0]))
            i += 8
        elif kind == 2:
            size = varint()
            if i + size > len(data):
                raise ValueError("a field runs past the message")
            out.append((number, data[i:i + size]))
            i += size
        elif kind == 5:
            i += 4
        else:
            raise ValueError(f"wire type {kind}")
    return out


def _decode(data: bytes) -> tuple[list[tuple[str, float]], list[tuple[str, str, float]]]:
    costs: list[tuple[str, float]] = []
    latencies: list[tuple[str, str, float]] = []
    for number, value in _fields(data):
        if not isinstance(value, bytes):
            raise ValueError("a top-level field is not a message")
        inner = dict(_fields(value))
        if number == 1:
            costs.append((_text(inner.get(1, b"")), _float(inner.get(2, 0.0))))
        elif number == 2:
            latencies.append((_text(inner.get(1, b"")), _text(inner.get(2, b"")), _float(inner.get(3, 0.0))))
    return costs, latencies


def _text(value: object) -> str:
    if not isinstance(value, bytes):
        raise ValueError("a name is not a string")
    return value.decode()  # UnicodeDecodeError is a ValueError


def _float(value: object) -> float:
    if not isinstance(value, float):
        raise ValueError("a cost is not a double")
    return value
