"""Several policies compiled at once, in the worker processes of an executor the caller passes in
(the caller owns the processes: how they start, and what JAX does in them).

A worker builds the session again (`build`, a picklable callable: the target traced anew in that
process) and compiles one policy. Its answer is taken only if it compiled the program this
process lowered: the hash of the lowered step travels with the request and comes back with the
answer; a worker that traced another program is refused, naming the policy. A worker that dies
(or a cluster that is lost) takes no answer with it: its policies are compiled here instead.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .._progress import Progress
from ..errors import first_line
from ..gpus import GpuRequest
from ..records import PeakMemory, Scope
from ..specs import PolicySpec, resolve_policy
from ..trace._loading import forget_user_modules
from ._train import Compiled

if TYPE_CHECKING:
    from ._gpu import Compiler

class Rebuilt(Protocol):
    """What a worker builds again from the session's picklable `rebuild`: the session, as far as a
    worker uses it (the targets never import the session)."""

    def resolved_scope(self, spec: PolicySpec) -> Scope: ...

    def compiler(self, request: GpuRequest) -> Compiler: ...


_BUILT: dict[str, Rebuilt] = {}  # in a worker: the session of each build (by its key), made once
_BUILDING = threading.Lock()  # a worker of several threads (a Dask worker's) builds one session at a time


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    result: Compiled
    program: str  # the hash of the step the worker lowered


def _in_worker(key: str, build: Callable[[], Rebuilt], spec_text: str, request: GpuRequest,
               program: str = "") -> Answer:
    """One policy's peak in a worker process; what fails there is that policy's error. A worker
    that lives on (a Dask worker's) keeps the session it built: where its step is not the one this
    process lowered (`program`), the files may have changed since, so it builds once more, the
    user's modules imported anew, before its answer stands."""
    answer, kept = _compiled(key, build, spec_text, request)
    if kept and program and answer.program and answer.program != program:
        with _BUILDING:
            _BUILT.pop(key, None)
            forget_user_modules()
        answer, _ = _compiled(key, build, spec_text, request)
    return answer


def _compiled(key: str, build: Callable[[], Rebuilt], spec_text: str, request: GpuRequest) -> tuple[Answer, bool]:
    """The answer, and whether it came from a session built before this request."""
    kept = key in _BUILT
    try:
        with _BUILDING:  # loading the user's code is not thread-safe
            if key not in _BUILT:
                _BUILT[key] = build()
        session = _BUILT[key]
        spec = resolve_policy(spec_text)
        scope = session.resolved_scope(spec)
        compiler = session.compiler(request)
        return Answer(compiler.result(spec, scope), compiler.program_hash(spec, scope)), kept
    except Exception as exc:  # noqa: BLE001 - reported per policy, as in this process
        return Answer(_failed(f"{type(exc).__name__}: {first_line(exc)}"), ""), kept


def _failed(why: str) -> Compiled:
    return Compiled(PeakMemory.not_compiled(why), None)


def peaks_in_workers(
    executor: concurrent.futures.Executor,
    key: str,
    build: Callable[[], Rebuilt],
    wanted: Sequence[tuple[PolicySpec, str]],
    request: GpuRequest,
    here: Callable[[PolicySpec], Compiled],
    progress: Progress,
) -> dict[str, Compiled]:
    """Each policy's compiled step (by spec text), from `executor`'s workers: `wanted` pairs each
    spec with the hash of the step this process lowered for it; `here` compiles one in this process."""
    out: dict[str, Compiled] = {}
    futures = {executor.submit(_in_worker, key, build, spec.text, request, program): (spec, program)
               for spec, program in wanted}
    broken: list[PolicySpec] = []
    for done in concurrent.futures.as_completed(futures):
        spec, program = futures[done]
        try:
            answer = done.result()
        except Exception:  # noqa: BLE001 - the worker died, or the cluster was lost: no answer to take
            broken.append(spec)
            continue
        if answer.program and answer.program != program:
            why = (f"a worker process compiled another program for {spec.text} than this process lowered "
                   f"(step hash {answer.program[:12]} != {program[:12]}): the model builds differently in a new "
                   "process; compile in one process")
            out[spec.text] = _failed(why)
        else:
            out[spec.text] = answer.result
        progress(f"compiled {spec.text} for {request.model.name} ({len(out)}/{len(wanted)})")
    for spec in broken:  # the worker died (killed, out of memory) or its cluster was lost: compiled here instead
        progress(f"no answer from a worker for {spec.text}; compiling it in this process")
        out[spec.text] = here(spec)
    return out
