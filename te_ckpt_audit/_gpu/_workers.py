"""Several policies compiled at once, in the worker processes of an executor the caller passes in
(the caller owns the processes: how they start, and what JAX does in them).

A worker builds the session again (`build`, a picklable callable: the target traced anew in that
process) and compiles one policy. Its answer is taken only if it compiled the program this
process lowered: the hash of the lowered step travels with the request and comes back with the
answer; a worker that traced another program is refused, naming the policy. A worker that dies
takes no answer with it: its policies are compiled here instead.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .._progress import Progress
from ..errors import first_line
from ..gpus import GpuRequest
from ..records import PeakMemory
from ..specs import PolicySpec, resolve_policy

_BUILT: dict[str, Any] = {}  # in a worker: the session of each build (by its key), made once
_BUILDING = threading.Lock()  # a worker of several threads (a Dask worker's) builds one session at a time


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    peak: PeakMemory
    program: str  # the hash of the step the worker lowered


def _in_worker(key: str, build: Callable[[], Any], spec_text: str, request: GpuRequest) -> Answer:
    """One policy's peak in a worker process; what fails there is that policy's error."""
    try:
        with _BUILDING:  # loading the user's code is not thread-safe
            if key not in _BUILT:
                _BUILT[key] = build()
        session = _BUILT[key]
        spec = resolve_policy(spec_text)
        scope = session.resolved_scope(spec)
        compiler = session.compiler(request)
        return Answer(compiler.peak(spec, scope), compiler.program_hash(spec, scope))
    except Exception as exc:  # noqa: BLE001 - reported per policy, as in this process
        why = f"{type(exc).__name__}: {first_line(exc)}"
        return Answer(PeakMemory(None, None, None, None, None, None, None, False, None, 0.0, why), "")


def peaks_in_workers(
    executor: concurrent.futures.Executor,
    key: str,
    build: Callable[[], Any],
    wanted: Sequence[tuple[PolicySpec, str]],
    request: GpuRequest,
    here: Callable[[PolicySpec], PeakMemory],
    progress: Progress,
) -> dict[str, PeakMemory]:
    """Each policy's peak (by spec text), from `executor`'s workers: `wanted` pairs each spec with
    the hash of the step this process lowered for it; `here` compiles one in this process."""
    out: dict[str, PeakMemory] = {}
    futures = {executor.submit(_in_worker, key, build, spec.text, request): (spec, program) for spec, program in wanted}
    broken: list[PolicySpec] = []
    for done in concurrent.futures.as_completed(futures):
        spec, program = futures[done]
        try:
            answer = done.result()
        except BrokenProcessPool:
            broken.append(spec)
            continue
        if answer.program and answer.program != program:
            why = (f"a worker process compiled another program for {spec.text} than this process lowered "
                   f"(step hash {answer.program[:12]} != {program[:12]}): the model builds differently in a new "
                   "process; compile in one process")
            out[spec.text] = PeakMemory(None, None, None, None, None, None, None, False, None, 0.0, why)
        else:
            out[spec.text] = answer.peak
        progress(f"compiled {spec.text} for {request.model.name} ({len(out)}/{len(wanted)})")
    for spec in broken:  # the worker died (killed, out of memory): compiled here instead
        progress(f"a worker process died; compiling {spec.text} in this process")
        out[spec.text] = here(spec)
    return out
