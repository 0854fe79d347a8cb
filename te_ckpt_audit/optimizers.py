"""The optax update a compiled training step adds (`--optimizer`), for every target alike: which
update each name means, exactly, and how many bytes of state it keeps.

Each name is optax's function of that name with its defaults, so that a user who trains with
`optax.sgd(lr)` is asked about the same program: `sgd` keeps no state; `momentum` is
`optax.sgd(lr, momentum=0.9)`, one buffer the size of the parameters.

    >>> parse_optimizer("SGD"), parse_optimizer(" Momentum ")
    (<Optimizer.SGD: 'sgd'>, <Optimizer.MOMENTUM: 'momentum'>)
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np

from .errors import UsageError, shown

INSTALL_HINT = 'install optax (it comes with the [gpu] and [tpu] extras): pip install -e ".[tpu]"'


class Optimizer(enum.StrEnum):
    """The optax update a compiled step adds (`optimizer`), its state donated in and out."""

    SGD = "sgd"  # optax.sgd(lr): no state
    MOMENTUM = "momentum"  # optax.sgd(lr, momentum=0.9): one buffer per parameter
    ADAM = "adam"  # optax.adam(lr): two moments per parameter, a step count
    ADAMW = "adamw"  # optax.adamw(lr): as adam
    ADAFACTOR = "adafactor"  # optax.adafactor(lr): factored second moments


CHOICES = ", ".join(o.value for o in Optimizer)


def parse_optimizer(value: object) -> Optimizer:
    """An Optimizer from itself or its name (any case); a UsageError naming the choices otherwise:
    a string is parsed or refused, never taken for another update."""
    if isinstance(value, Optimizer):
        return value
    if isinstance(value, str):
        try:
            return Optimizer(value.strip().lower())
        except ValueError:
            pass
    raise UsageError(f"$optimizer$ {shown(value)} is not one of {CHOICES}",
                     "e.g. $optimizer$=adamw (momentum: sgd with momentum 0.9; sgd: none)")


def optax_update(kind: Optimizer) -> object:
    """The optax GradientTransformation `kind` names (learning rate 1e-3: it moves no byte)."""
    try:
        import optax
    except ImportError:
        raise UsageError("an optimizer in the step needs optax, which is not installed", INSTALL_HINT) from None
    match kind:
        case Optimizer.SGD:
            return optax.sgd(1e-3)
        case Optimizer.MOMENTUM:
            return optax.sgd(1e-3, momentum=0.9)
        case Optimizer.ADAM:
            return optax.adam(1e-3)
        case Optimizer.ADAMW:
            return optax.adamw(1e-3)
        case Optimizer.ADAFACTOR:
            return optax.adafactor(1e-3)


def state_bytes(kind: Optimizer, params: Sequence[object]) -> int:
    """The bytes of `kind`'s state for `params` (arrays or ShapeDtypeStructs), all devices
    together: what the update adds to the step's arguments, as `optimizer.init` makes it."""
    import jax

    update = optax_update(kind)
    with jax.numpy_dtype_promotion("standard"):
        shapes = jax.eval_shape(update.init, list(params))  # type: ignore[attr-defined]
    return sum(int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
               for leaf in jax.tree_util.tree_leaves(shapes))
