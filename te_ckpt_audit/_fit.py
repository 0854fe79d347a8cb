"""`recommend --gpu`: the policy with the least recompute whose compiled step fits the GPU, and
`--maximize DEFINE`: the largest value of an inputs keyword that still fits under it.

The residual estimates choose what to compile: the Pareto frontier `recommend` verified (activation
bytes against recompute, each point JAX's own linearization), least recompute first. Compiling is
the cost (two XLA:GPU compiles a point), so the first point that fits is found by bisection,
assuming that a policy which keeps fewer activation bytes never peaks higher; at most
`max_compiles` points are compiled. Every point shown as fitting was compiled; the others say
nothing about the GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ._gpu import gpu_info
from ._session import Progress, Session, quiet
from .errors import AuditError, UsageError, first_line
from .gpus import GpuRequest
from .records import Candidate, Maximized, Recommendation, Trial
from .specs import resolve_policy

DEFAULT_MAX_COMPILES = 8


def fit_on_gpu(
    session: Session, rec: Recommendation, request: GpuRequest, max_compiles: int = DEFAULT_MAX_COMPILES,
    progress: Progress = quiet,
) -> Recommendation:
    """`rec` with its frontier compiled for `request`'s GPU as far as needed: `recommended` is the
    least-recompute point whose peak fits the usable memory, `closest` (when none does) the compiled
    point with the smallest peak."""
    if max_compiles < 1:
        raise UsageError(f"--max-compiles {max_compiles} must be at least 1", "e.g. --max-compiles 8")
    session.compiler(request)  # what the machine lacks, or a target with no loss: before any compile
    order = sorted((c for c in rec.frontier if c.error is None), key=lambda c: (c.recompute_flops, -c.activation_bytes))
    compiled: dict[str, Candidate] = {}

    def compile_point(c: Candidate) -> Candidate | None:
        if c.policy not in compiled:
            if len(compiled) >= max_compiles:
                return None
            spec = resolve_policy(c.policy)
            peak = session.peaked(spec, session.row(spec), request, progress).peak
            fits = peak is not None and peak.fits is True
            compiled[c.policy] = dataclasses.replace(c, peak=peak, fits=fits)
        return compiled[c.policy]

    best: Candidate | None = None
    lo, hi = 0, len(order) - 1
    while lo <= hi:  # the first index that fits; indices after it keep fewer bytes
        mid = (lo + hi) // 2
        point = compile_point(order[mid])
        if point is None:
            break
        if point.fits:
            best, hi = point, mid - 1
        else:
            lo = mid + 1

    def shown(c: Candidate) -> Candidate:
        return compiled.get(c.policy) or dataclasses.replace(c, fits=False)

    peaks = [c for c in compiled.values() if c.peak is not None and c.peak.bytes_per_device is not None]
    closest = None if best is not None else min(peaks, key=_peak_bytes, default=None)
    return dataclasses.replace(
        rec,
        recommended=best,
        closest=closest,
        frontier=tuple(shown(c) for c in rec.frontier),
        evaluated=tuple(shown(c) for c in rec.evaluated),
        gpu=gpu_info(request),
        compiles=len(compiled),
    )


def _peak_bytes(c: Candidate) -> int:
    return (c.peak.bytes_per_device if c.peak is not None else None) or 0


def largest_fitting(
    build: Callable[[int], Session], define: str, start: int, policy: str, request: GpuRequest,
    max_compiles: int = DEFAULT_MAX_COMPILES, progress: Progress = quiet,
) -> Maximized:
    """The largest value of the inputs keyword `define` whose step fits under `policy`: doubling
    from `start` until one does not fit, then bisecting (from `start` down when it does not fit).
    `build(value)` traces the target with that value."""
    spec = resolve_policy(policy)
    trials: dict[int, Trial] = {}
    bounded = False

    def fits(value: int) -> bool | None:
        nonlocal bounded
        if value not in trials:
            if len(trials) >= max_compiles:
                bounded = True
                return None
            progress(f"{define}={value}: tracing and compiling {policy}")
            try:
                session = build(value)
                peak = session.peaked(spec, session.row(spec), request, progress).peak
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
