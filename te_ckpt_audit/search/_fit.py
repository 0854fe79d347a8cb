"""`recommend --gpu`: the policy with the least recompute whose compiled step fits the GPU, and
`--maximize DEFINE`: the largest value of an inputs keyword that still fits under it.

The residual estimates choose what to compile: the Pareto frontier `recommend` verified (activation
bytes against recompute, each point JAX's own linearization), least recompute first. Compiling is
the cost (two XLA:GPU compiles a point, at once), so points are compiled in order of recompute,
several at a time where processes are given, until the first that fits; no point is skipped: a
policy that keeps fewer activation bytes can peak higher (a checkpoint around a whole scanned
loss: saving nothing peaked 302 MB above saving everything). At most `max_compiles` points are
compiled. Every point shown as fitting was compiled; the others say
nothing about the GPU.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable

from .._progress import Progress, quiet
from .._session import Session
from ..errors import AuditError, UsageError, first_line
from ..gpus import GpuRequest
from ..records import Candidate, Maximized, Recommendation, Trial
from ..specs import resolve_policy
from ..targets import LogCapture
from ..tpus import TpuRequest

DEFAULT_MAX_COMPILES = 8


def fit_on_gpu(
    session: Session, rec: Recommendation, request: GpuRequest | TpuRequest, max_compiles: int = DEFAULT_MAX_COMPILES,
    progress: Progress = quiet, executor: concurrent.futures.Executor | None = None, jobs: int = 1,
    capture: LogCapture | None = None,
) -> Recommendation:
    """`rec` with its frontier compiled for `request`'s GPU (or TPU slice) as far as needed:
    `recommended` is the least-recompute point whose peak fits the usable memory (on a TPU: that
    libtpu takes), `closest` (when none does) the compiled point with the smallest peak. Points are
    compiled in order of recompute, `jobs` at a time (in `executor`'s processes), until one fits:
    a policy that keeps fewer activation bytes can peak higher, so no point is skipped on the
    assumption that it would not."""
    if max_compiles < 1:
        raise UsageError(f"$max_compiles$ {max_compiles} must be at least 1", "e.g. $max_compiles$ 8")
    session.prepare(request, capture)  # what the machine lacks, or a target with no loss: before any compile
    order = sorted((c for c in rec.frontier if c.error is None), key=lambda c: (c.recompute_flops, -c.activation_bytes))
    compiled: dict[str, Candidate] = {}
    best: Candidate | None = None
    width = max(1, jobs)
    while best is None and len(compiled) < min(max_compiles, len(order)):
        batch = order[len(compiled):len(compiled) + min(width, max_compiles - len(compiled))]
        specs = [resolve_policy(c.policy) for c in batch]
        steps = session.compiled(specs, request, progress, executor if len(batch) > 1 else None, capture)
        for c, spec in zip(batch, specs, strict=True):
            peak = steps[spec.text].peak
            time = session.timed(c.forward_flops, c.recompute_flops, steps[spec.text].time)
            compiled[c.policy] = dataclasses.replace(c, peak=peak, fits=peak.fits is True, time=time)
        best = next((compiled[c.policy] for c in batch if compiled[c.policy].fits), None)

    def shown(c: Candidate) -> Candidate:
        return compiled.get(c.policy) or dataclasses.replace(c, fits=False)

    peaks_seen = [c for c in compiled.values() if c.peak is not None and c.peak.bytes_per_device is not None]
    closest = None if best is not None else min(peaks_seen, key=_peak_bytes, default=None)
    return dataclasses.replace(
        rec,
        recommended=best,
        closest=closest,
        frontier=tuple(shown(c) for c in rec.frontier),
        evaluated=tuple(shown(c) for c in rec.evaluated),
        compiles=len(compiled),
        **session.target_info(request),  # type: ignore[arg-type]
    )


def _peak_bytes(c: Candidate) -> int:
    return (c.peak.bytes_per_device if c.peak is not None else None) or 0


def largest_fitting(
    build: Callable[[int], Session], define: str, start: int, policy: str, request: GpuRequest | TpuRequest,
    max_compiles: int = DEFAULT_MAX_COMPILES, progress: Progress = quiet, capture: LogCapture | None = None,
) -> Maximized:
    """The largest value of the inputs keyword `define` whose step fits under `policy`: doubling
    from `start` until one does not fit, then bisecting (from `start` down when it does not fit).
    `build(value)` traces the target with that value."""
    spec = resolve_policy(policy)
    trials: dict[int, Trial] = {}
    bounded = False
    sessions: dict[int, Session] = {}
    try:  # a keyword that changes no input never stops fitting: the search would double to its cap
        sessions = {start: build(start), 2 * start: build(2 * start)}
    except AuditError:
        sessions = {}  # a value the model cannot take: the trials below say which
    if len(sessions) == 2 and sessions[start].arguments == sessions[2 * start].arguments:
        raise UsageError(f"$maximize$ {define}: {define}={2 * start} traces the same inputs as {define}={start}, so "
                         "no value of it changes what the step holds", "name the inputs keyword that sets a size, "
                         "e.g. $maximize$ batch")

    def fits(value: int) -> bool | None:
        nonlocal bounded
        if value not in trials:
            if len(trials) >= max_compiles:
                bounded = True
                return None
            progress(f"{define}={value}: tracing and compiling {policy}")
            try:
                session = sessions.pop(value, None) or build(value)
                session.row_of(spec)  # the policy applies (an error here is the value's)
                peak = session.compiled([spec], request, progress, capture=capture)[spec.text].peak
            except AuditError as exc:  # a value the model cannot take (a shape it refuses)
                trials[value] = Trial(value, None, False, first_line(exc))
                return False
            size = None if peak is None else peak.bytes_per_device
            trials[value] = Trial(value, size, peak is not None and peak.fits is True, peak.error if peak else None)
        return trials[value].fits

    good, bad = (start, None) if fits(start) else (None, start)
    while good is not None and bad is None:  # grow until something does not fit
        verdict = fits(good * 2)
        if verdict is None:
            break
        good, bad = (good * 2, None) if verdict else (good, good * 2)
    low, high = (good or 0), (bad if bad is not None else (good or 0) + 1)
    while high - low > 1:
        mid = (low + high) // 2
        verdict = fits(mid)
        if verdict is None:
            break
        low, high = (mid, high) if verdict else (low, mid)
    best = max((t.value for t in trials.values() if t.fits), default=None)
    return Maximized(define, policy, best, tuple(sorted(trials.values(), key=lambda t: t.value)), bounded)
