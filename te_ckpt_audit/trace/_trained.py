"""Which inputs a training step trains (`--params`): they are differentiated, and the GPU step
gives them gradients, donation and optimizer state; the other inputs are the batch, passed in and
not differentiated.

A target follows `jax.grad`'s convention (`argnums=0`, `loss(params, batch)`): its first argument
is trained, or its only one; where the first argument holds no float array, every float input is.
A function given to `audit(fn, *args)` is differentiated in every float input, as
`jax.ad_checkpoint.print_saved_residuals(fn, *args)` differentiates it, unless `params` says otherwise.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

import jax.numpy as jnp

from ..errors import UsageError

ALL = "all"  # every float input
ParamsLike: TypeAlias = Sequence[int | str] | Literal["all"] | int | str | None
_ARGUMENT = re.compile(r"args\[(\d+)\]")


@dataclasses.dataclass(frozen=True, slots=True)
class TrainedInputs:
    """The arguments trained, resolved against the function and its inputs.

    `arguments` are positional indices (None: every float input); `inputs` the flat input
    positions differentiated; `convention` says the choice was the default, not the caller's."""

    arguments: tuple[int, ...] | None
    inputs: tuple[int, ...]
    convention: bool = False


def argument_of(name: str) -> int:
    """The positional argument an input's path starts in: `args[1]['w']` is in argument 1."""
    found = _ARGUMENT.match(name)
    return int(found.group(1)) if found else -1


def parse_params(given: ParamsLike) -> tuple[int | str, ...] | Literal["all"] | None:
    """`--params` values as given (repeatable): ints stay ints, digits become ints, `all` is every
    float input, other text a parameter name.

    >>> parse_params(["0", "state"]), parse_params("all"), parse_params(None)
    ((0, 'state'), 'all', None)
    """
    if given is None:
        return None
    if not isinstance(given, int | str | Sequence) or isinstance(given, bytes):
        raise UsageError(f"$params$ takes argument positions or names, not {type(given).__name__} {given!r}"[:120],
                         "e.g. $params$=0, or $params$=['params', 'state']")
    items: Sequence[int | str] = [given] if isinstance(given, int | str) else list(given)
    if any(isinstance(i, str) and i.strip() == ALL for i in items):
        if len(items) > 1:
            raise UsageError("$params$ all trains every float input: it takes no other argument", "give all alone")
        return "all"
    out: list[int | str] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise UsageError(f"$params$ {item!r} is not an argument position or name", "e.g. $params$ 0")
        value: int | str = item.strip() if isinstance(item, str) else item
        if isinstance(value, str) and re.fullmatch(r"[-+]?\d+", value):
            value = int(value)
        if isinstance(value, int) and value < 0:
            raise UsageError(f"$params$ {value}: a position is 0 or more", "e.g. $params$ 0")
        if isinstance(value, str) and not value.isidentifier():
            raise UsageError(f"$params$ {value[:80]!r} is neither a position nor a parameter name", "e.g. $params$ 0")
        out.append(value)
    if not out:
        raise UsageError("$params$ names no argument", "e.g. $params$ 0")
    return tuple(out)


def _positional_names(fn: Callable[..., Any]) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


def resolve_trained(
    fn: Callable[..., Any],
    n_args: int,
    names: Sequence[str],
    dtypes: Sequence[Any],
    given: tuple[int | str, ...] | Literal["all"] | None,
    target: str,
) -> TrainedInputs:
    """The trained arguments and inputs of `fn` called with `n_args` positional arguments whose
    flat array inputs have paths `names` and `dtypes`. `given` None is the convention."""
    floats = [i for i, d in enumerate(dtypes) if jnp.issubdtype(d, jnp.inexact)]
    if given == ALL or (given is None and n_args < 2):
        return TrainedInputs(None, tuple(range(len(names))), given is None)
    if given is None:
        first = tuple(i for i in floats if argument_of(names[i]) == 0)
        if not first:  # no float array in argument 0 (tokens first, say): every float input
            return TrainedInputs(None, tuple(range(len(names))), True)
        return TrainedInputs((0,), first, True)
    positional = _positional_names(fn)
    chosen: list[int] = []
    for item in given:
        if isinstance(item, str):
            if item not in positional[:n_args]:
                takes = ", ".join(positional[:n_args]) or "no named positional parameters"
                raise UsageError(f"$params$ {item}: {target} has no positional parameter {item!r}",
                                 f"it takes: {takes}")
            item = positional.index(item)
        if item >= n_args:
            raise UsageError(f"$params$ {item}: {target} is called with {n_args} positional argument(s)",
                             f"a position from 0 to {n_args - 1}")
        chosen.append(item)
    arguments = tuple(sorted(set(chosen)))
    for a in arguments:
        if not any(argument_of(names[i]) == a for i in floats):
            shown = f" ({positional[a]})" if a < len(positional) else ""
            raise UsageError(f"$params$ {a}: argument {a}{shown} of {target} holds no float array to train",
                             "name the arguments that hold the parameters")
    return TrainedInputs(arguments, tuple(i for i in floats if argument_of(names[i]) in arguments))
