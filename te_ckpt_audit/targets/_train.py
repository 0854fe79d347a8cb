"""What every target's compiled step shares, whichever compiler builds it: the loss it
differentiates, what it trains and updates (the record a report shows), and the hook that keeps a
compiler's log lines off the user's terminal. A third target imports these, never a peer's module.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import jax

from ..errors import UsageError
from ..gpus import GpuRequest
from ..optimizers import state_bytes
from ..records import PeakMemory, StepInfo, StepTime
from ..tpus import TpuRequest
from ..trace._trace import Traced
from ..trace._trained import argument_of as argument_of  # the positional argument an input path belongs to
from ._step import trained_paths

LogCapture = Callable[[], contextlib.AbstractContextManager[object]]  # keeps a compiler's log lines off stderr


@dataclasses.dataclass(frozen=True, slots=True)
class Compiled:
    """What a target says of one policy's step: its peak and (`--time`) its time."""

    peak: PeakMemory
    time: StepTime | None


def step_info(traced: Traced, request: GpuRequest | TpuRequest) -> StepInfo:
    """What the target's step trains and donates, the update it adds and the bytes of its state."""
    if request.step:
        donated = tuple(n for n in traced.arg_names if argument_of(n) in request.donate)
        return StepInfo(None, donated, True)
    paths = trained_paths(traced)
    if request.optimizer is None:
        return StepInfo(None, paths, False)
    index = {n: k for k, n in enumerate(traced.arg_names)}
    params = [jax.ShapeDtypeStruct(traced.avals[index[p]].shape, traced.avals[index[p]].dtype) for p in paths]
    return StepInfo(request.optimizer.value, paths, False, state_bytes(request.optimizer, params))


def check_loss(traced: Traced) -> None:
    """The step differentiates the target's first output: it must be a float scalar (the loss)."""
    outs = traced.jaxpr.out_avals
    first = outs[0] if outs else None
    shape, dtype = getattr(first, "shape", None), getattr(first, "dtype", None)
    if first is None or shape != () or dtype is None or not jax.numpy.issubdtype(dtype, jax.numpy.floating):
        got = "nothing" if first is None else str(first.str_short())
        raise UsageError(
            f"{traced.target} returns {got} first, not a scalar loss: the training step is value_and_grad of it",
            "return the loss first (a float scalar); other outputs may follow it",
        )
