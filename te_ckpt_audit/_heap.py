"""Python's cyclic garbage collector, paused while a trace is made or analysed.

Tracing and linearizing allocate many small objects, and every so often Python's collector walks
the whole heap looking for cycles. In a process that imported a large library (MaxText, KerasHub)
one such walk costs more than a policy's analysis: on the zoo's MaxText NNX model, five further
policies took 0.42 s with the collector on and 0.22 s with it paused, the difference all in full
collections started inside JAX's scan rule. Reference counting still frees what an analysis
drops; cycles made meanwhile wait for the next collection after it (peak RSS of the GPT-3-shaped
bench is unchanged). `gc.freeze()` would spare the walk too, but unfreezing undoes a freeze of the
process's own (Python 3.12 starts with one).
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection for the duration; where it is off already (an enclosing use, or the
    caller's choice) it stays as it is."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def without_gc(fn: F) -> F:
    """`fn`, run with the collector paused."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with collector_paused():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]
