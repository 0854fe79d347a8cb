"""`--maximize throughput`: the policy and batch whose compiled step fits the GPU with the most
estimated throughput (tokens, or the batch keyword's unit, per second per GPU).

A policy that saves more may fit only a smaller batch and still run faster, or the reverse: a
larger batch raises every GEMM's arithmetic intensity, and memory-bound work costs time its FLOPs
do not show. So the two are searched together, every point compiled and timed (`--time`'s
estimate), none interpolated:

1. each policy climbs a doubling ladder of the batch from the start value (down by halves where
   the start does not fit) until a value does not fit: its edge, to a factor of two. Throughput is
   never assumed to grow with the batch: every rung is compiled and timed, and the best point may
   be any of them. The climb ends where a value does not fit (the one assumption: a batch that
   does not fit is not followed by a larger one that does, as activations grow with the batch), or
   where doubling the batch gained less than 2% (the GPU is full: said, per policy, as
   `saturated`);
2. then, best policy first, the gap between a policy's largest fitting value and its first that
   does not is bisected to within an eighth (in steps of the start value's largest power-of-two
   factor, so that a global batch a mesh splits evenly stays split evenly; in steps of 1 for a
   per-device batch, MaxText's), while compiles are left.

Points are compiled `jobs` at a time, at most `max_compiles` in all; a search the limit stopped
says so (`bounded`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from collections.abc import Callable, Sequence

from .._progress import Progress, quiet
from .._session import Session
from ..errors import AuditError, UsageError, first_line
from ..gpus import GpuRequest
from ..records import PeakMemory, Point, StepTime, Throughput
from ..specs import resolve_policy
from ..targets import LogCapture
from ..targets._steptime import TPU_ESTIMATOR
from ..tpus import TpuRequest

THROUGHPUT = "throughput"  # `--maximize throughput`
DEFAULT_MAX_COMPILES = 8  # points (each the memory compiles and the time compile of one step): ~1 min on a small model
SATURATED = 1.02  # a policy stops climbing once doubling its batch gains less than 2% throughput
ACCELERATE = 1.6  # a doubling that gained this much: the step's own cost dominates, the ladder quadruples

# (policy, value) pairs -> their points, compiled (several at once where the caller can)
Evaluate = Callable[[Sequence[tuple[str, int]]], Sequence[Point]]


@dataclasses.dataclass(slots=True)
class _Edge:
    """What the compiles so far say of one policy: its largest fitting value, its smallest value
    that does not fit."""

    fit: int | None = None
    fail: int | None = None

    def after(self, point: Point) -> None:
        if point.fits:
            self.fit = max(self.fit or 0, point.value)
        else:
            self.fail = point.value if self.fail is None else min(self.fail, point.value)


def throughput_keyword(maximize: str | None) -> str | None:
    """The batch keyword `--maximize throughput[:KEYWORD]` searches (`batch` unless named); None
    for `--maximize DEFINE`, the largest value of DEFINE that fits.

    >>> throughput_keyword("throughput"), throughput_keyword("throughput:global_batch"), throughput_keyword("batch")
    ('batch', 'global_batch', None)
    """
    if maximize is None:
        return None
    if not isinstance(maximize, str):
        raise UsageError(f"$maximize$ takes text, \"throughput\" or an inputs keyword, not {type(maximize).__name__}",
                         "e.g. $maximize$ throughput")
    head, _, keyword = maximize.partition(":")
    if head != THROUGHPUT and head.lower() == THROUGHPUT:  # `Throughput` read as an inputs keyword
        raise UsageError(f"$maximize$ {maximize[:40]!r}: did you mean {THROUGHPUT}?", "e.g. $maximize$ throughput")
    return (keyword or "batch") if head == THROUGHPUT else None


def grain_of(start: int) -> int:
    """The step bisection keeps to: the start value's largest power-of-two factor.

    >>> grain_of(12), grain_of(7), grain_of(64)
    (4, 1, 64)
    """
    return start & -start


def doubling_gain(lower: Point | None, upper: Point | None) -> float | None:
    """The throughput one doubling of the batch gained between two fitting points of a ladder
    (a jump of four is two doublings).

    >>> doubling_gain(Point("p", 8, 1, True, 1.0, 8.0), Point("p", 32, 1, True, 1.0, 32.0))
    2.0
    """
    if (lower is None or upper is None or not lower.fits or not upper.fits or not lower.throughput
            or not upper.throughput or upper.value <= lower.value):
        return None
    return float((upper.throughput / lower.throughput) ** (1 / math.log2(upper.value / lower.value)))


def ladder_step(gain: float | None) -> int:
    """How far the ladder climbs from a fitting value: twice it, four times where the last doubling
    gained at least ACCELERATE (a step its own cost dominates, as a small model's: throughput grows
    almost with the batch, and the memory edge is far); a jump past the edge is bisected back.

    >>> ladder_step(None), ladder_step(1.3), ladder_step(1.9)
    (2, 2, 4)
    """
    return 4 if gain is not None and gain >= ACCELERATE else 2


def _climb(edge: _Edge, start: int, tried: set[int], gain: float | None = None) -> int | None:
    """The policy's next value on the ladder, or None once its edge is bracketed (or 1 does not fit)."""
    if edge.fit is None:
        value = start if edge.fail is None else edge.fail // 2
        return value if value >= 1 and value not in tried else None
    if edge.fail is None:
        return edge.fit * ladder_step(gain)
    return None


def _bisect(edge: _Edge, grain: int) -> int | None:
    """The value halfway between a bracketed edge's ends, on the grain; None once they are within
    an eighth of the value that fits (or a grain) of each other."""
    if edge.fit is None or edge.fail is None or edge.fail - edge.fit <= max(grain, edge.fit // 8):
        return None
    mid = (edge.fit + edge.fail) // 2 // grain * grain
    return mid if edge.fit < mid < edge.fail else None


def search(
    evaluate: Evaluate, policies: Sequence[str], start: int, keyword: str, unit: str, *,
    max_compiles: int = DEFAULT_MAX_COMPILES, jobs: int = 1, values: Sequence[int] = (), grain: int | None = None,
) -> Throughput:
    """The fastest fitting (policy, value) of `policies` and the batch keyword, by `evaluate`'s
    compiled points: the ladder and the bisection above from `start`, or, with `values`, exactly
    those values under every policy. At most `max_compiles` points, `jobs` at a time. `grain`: the
    step the bisection keeps to (default: the start's largest power-of-two factor; 1 where any
    value splits evenly, as a per-device batch does)."""
    if not policies:
        raise UsageError("$maximize$ throughput has no policy to search", "give one with $policy$")
    if start < 1 or any(v < 1 for v in values):
        raise UsageError(f"$maximize$ throughput: the {keyword} values must be positive", f"e.g. {keyword}=8")
    points: dict[tuple[str, int], Point] = {}
    edges = {p: _Edge() for p in policies}
    saturated: list[str] = []  # policies whose climb stopped short of the memory edge
    grain = grain or grain_of(start)

    def best_of(policy: str) -> float:
        return max((p.throughput or 0.0 for (q, _), p in points.items() if q == policy and p.fits), default=0.0)

    def gain_of(policy: str) -> float | None:  # the last rung's gain per doubling
        fitting = sorted((p for (q, _), p in points.items() if q == policy and p.fits), key=lambda p: p.value)
        return doubling_gain(*fitting[-2:]) if len(fitting) >= 2 else None

    def wanted() -> list[tuple[str, int]]:
        if values:
            return [(p, v) for v in dict.fromkeys(values) for p in policies if (p, v) not in points]
        climbing = [(p, v) for p in policies if p not in saturated
                    and (v := _climb(edges[p], start, {w for q, w in points if q == p}, gain_of(p))) is not None]
        if climbing:  # the policies with the fewest points first: a bounded search stays broad
            return sorted(climbing, key=lambda w: (sum(q == w[0] for q, _ in points), policies.index(w[0])))
        ranked = sorted(policies, key=lambda p: (-best_of(p), policies.index(p)))
        return [(p, v) for p in ranked if (v := _bisect(edges[p], grain)) is not None]

    bounded = False
    while todo := [w for w in wanted() if w not in points]:
        room = max_compiles - len(points)
        if room <= 0:
            bounded = True
            break
        batch = todo[:min(max(1, jobs), room)]
        for (policy, value), point in zip(batch, evaluate(batch), strict=True):
            points[(policy, value)] = point
            edges[policy].after(point)
            below = max((p for (q, v), p in points.items() if q == policy and v < value and p.fits),
                        key=lambda p: p.value, default=None)  # the rung below (half, or a quarter after a jump)
            gain = doubling_gain(below, point) if below is not None and value in (2 * below.value, 4 * below.value) \
                else None  # a rung of the climb, not a bisection's
            if gain is not None and gain < SATURATED:
                saturated.append(policy)
    fitting = [p for p in points.values() if p.fits and p.throughput is not None]
    best = max(fitting, key=lambda p: (p.throughput or 0.0, -policies.index(p.policy), -p.value), default=None)
    return Throughput(keyword, unit, best, tuple(points.values()), tuple(policies), max_compiles, bounded,
                      tuple(dict.fromkeys(saturated)))


def throughput_of(value: int, seconds: float | None, devices: int, tokens: int | None,
                  per_device: bool = False) -> float | None:
    """Per second per GPU: the step's tokens where known, else the batch keyword's value (already
    one device's where `per_device`: a `per_device_batch`, as MaxText and the Llama sample say it).

    >>> throughput_of(8, 2.0, 8, None), throughput_of(8, 2.0, 8, None, per_device=True)
    (0.5, 4.0)
    """
    if not seconds:
        return None
    return (value if tokens is None else tokens) / seconds / (1 if per_device and tokens is None else max(devices, 1))


def per_device_keyword(keyword: str) -> bool:
    """Whether the batch keyword counts one device's examples (`per_device_batch`), not the step's."""
    return "per_device" in keyword.lower()


def point_of(policy: str, value: int, peak: PeakMemory, time: StepTime | None, tokens: int | None = None,
             per_device: bool = False) -> Point:
    """The point a compiled step makes: its peak, fit and (from its estimate) throughput."""
    seconds = None if time is None else time.seconds
    devices = 1 if time is None else time.devices
    error = peak.error or (None if time is None else time.error)
    return Point(policy, value, peak.bytes_per_device, peak.fits is True, seconds,
                 throughput_of(value, seconds, devices, tokens, per_device), error)


def spread(items: Sequence[str], most: int) -> list[str]:
    """At most `most` of `items`, evenly spaced, both ends kept.

    >>> spread(list("abcdefg"), 3)
    ['a', 'd', 'g']
    """
    if len(items) <= most:
        return list(items)
    if most == 1:
        return [items[0]]
    return [items[round(i * (len(items) - 1) / (most - 1))] for i in range(most)]


def target_search(
    build: Callable[[int], Session], first: Session, policies: Sequence[str], keyword: str, start: int,
    request: GpuRequest | TpuRequest, *, max_compiles: int = DEFAULT_MAX_COMPILES, progress: Progress = quiet,
    executor: concurrent.futures.Executor | None = None, jobs: int = 1, capture: LogCapture | None = None,
) -> Throughput:
    """`search` over a target's inputs keyword: `build(value)` traces it with that value (`first`
    is the trace at `start`); each value's policies compiled together (in `executor`'s worker
    processes, `jobs` at a time), timed."""
    evaluate = target_evaluator(build, first, keyword, start, request, progress=progress, executor=executor,
                                capture=capture)
    return per_device_of(search(evaluate, policies, start, keyword, keyword, max_compiles=max_compiles, jobs=jobs),
                         request)


def target_evaluator(
    build: Callable[[int], Session], first: Session, keyword: str, start: int, request: GpuRequest | TpuRequest, *,
    progress: Progress = quiet, executor: concurrent.futures.Executor | None = None,
    capture: LogCapture | None = None,
) -> Evaluate:
    """The points of (policy, value) pairs on a target: `build(value)` traces the inputs keyword at
    that value (`first` is the trace at `start`); each value's policies compiled together, timed. A
    keyword that changes no input is refused before any compile."""
    timed = dataclasses.replace(request, time=True)
    sessions = {start: first}
    probe = build(2 * start)  # a keyword that changes no input is no batch: its "throughput" grows with a label
    if probe.arguments == first.arguments:
        raise UsageError(f"$maximize$ throughput:{keyword}: {keyword}={2 * start} traces the same inputs as "
                         f"{keyword}={start}, so it is not a batch and the search would favour its largest value",
                         "name the inputs keyword that sets the batch, e.g. $maximize$ throughput:batch")
    sessions[2 * start] = probe
    first.prepare(timed, capture)  # what the machine lacks, or a target with no loss: before any compile

    def evaluate(batch: Sequence[tuple[str, int]]) -> list[Point]:
        found: dict[tuple[str, int], Point] = {}
        for value in dict.fromkeys(v for _, v in batch):
            names = [p for p, v in batch if v == value]
            progress(f"{keyword}={value}: tracing and compiling {', '.join(names)}")
            try:
                session = sessions.get(value) or build(value)
                sessions[value] = session
                specs = [resolve_policy(p) for p in names]
                for spec in specs:
                    session.row_of(spec)  # the policy applies (an error here is the value's)
                steps = session.compiled(specs, timed, progress, executor if len(specs) > 1 else None, capture)
            except AuditError as exc:  # a value the model cannot take (a shape it refuses)
                found.update({(p, value): Point(p, value, None, False, None, None, first_line(exc)) for p in names})
                continue
            for name, spec in zip(names, specs, strict=True):
                found[(name, value)] = point_of(name, value, steps[spec.text].peak, steps[spec.text].time,
                                                per_device=per_device_keyword(keyword))
        return [found[w] for w in batch]

    return evaluate


def per_device_of(found: Throughput, request: GpuRequest | TpuRequest) -> Throughput:
    """`found` counted per device of `request`'s kind: per GPU (XLA's cost models), or per TPU chip
    (libtpu's cycle estimates against the roofline)."""
    if isinstance(request, TpuRequest):
        return dataclasses.replace(found, device="chip", estimator=TPU_ESTIMATOR)
    return found
