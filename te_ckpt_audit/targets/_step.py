"""The training step of a traced function, written over the user's own pytrees: what `--gpu`
compiles for a GPU, and `--compile` for this machine.

    step(*args)          -> (loss, grads)                    value_and_grad w.r.t. the trained arguments
    step(*args, state)   -> (loss, new params, new state)    with an optax update

Each argument is the user's pytree as the inputs callable returned it, in the user's order: its
array leaves keep their names and order, every other leaf is None (as `equinox.filter` leaves a
module). A trained argument carries only its float leaves; any other array in it (an integer
step count) goes in one more argument after the user's. One trained argument is differentiated
as `jax.grad(loss)(params, batch)` does, its gradients and optimizer state in its own structure;
several are differentiated as a tuple (`argnums=(0, 2)`). The trained arguments and the state are
donated; the batch is passed in as it is. The target's own step (`--step`) is compiled as the
user calls it, donating the arguments they name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeAlias

import jax
import jax.numpy as jnp

from .. import _jax_compat as jc
from ..trace._trace import Traced
from ..trace._trained import argument_of

Tree: TypeAlias = jc.Tree  # a pytree of arrays or ShapeDtypeStructs: the user's, whatever its types
Fn: TypeAlias = Callable[..., Tree]


@dataclasses.dataclass(frozen=True)
class TrainingStep:
    """A step to lower: `jax.jit(fn, donate_argnums=donate).lower(*args)`."""

    fn: Fn
    args: tuple[Tree, ...]
    donate: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where each flat input goes among the step's arguments."""

    trained_args: tuple[int, ...]  # the positional arguments differentiated
    frozen: tuple[int, ...]  # inputs inside a trained argument that are not differentiated

    def split(self, traced: Traced, values: Sequence[Tree]) -> tuple[list[Tree], list[Tree]]:
        """The user's arguments holding `values` (frozen inputs left out), and the frozen inputs."""
        frozen = set(self.frozen)
        kept = [None if k in frozen else v for k, v in enumerate(values)]
        return _arguments(traced, kept), [values[k] for k in self.frozen]

    def flat(self, traced: Traced, args: Sequence[Tree], frozen: Sequence[Tree]) -> list[Tree]:
        """The flat inputs, in the trace's order, from the step's arguments."""
        leaves = [iter(jax.tree_util.tree_leaves(a)) for a in args]
        stuck = iter(frozen)
        skip = set(self.frozen)
        return [next(stuck) if k in skip else next(leaves[argument_of(name)])
                for k, name in enumerate(traced.arg_names)]


def _arguments(traced: Traced, values: Sequence[Tree]) -> list[Tree]:
    """The user's positional arguments with `values` at their array leaves (None elsewhere); a
    pytree whose own code refuses None leaves becomes the list of its array leaves."""
    structure = traced.structure
    if structure is not None:
        try:
            return list(structure.arguments(values))
        except Exception:  # noqa: BLE001 - a custom node that validates its leaves: flat, in order
            pass
    n = 1 + max((argument_of(n) for n in traced.arg_names), default=-1)
    out: list[list[Tree]] = [[] for _ in range(n)]
    for name, value in zip(traced.arg_names, values, strict=True):
        if value is not None:
            out[argument_of(name)].append(value)
    return list(out)


def _layout(traced: Traced) -> _Layout:
    trained = set(traced.trained.inputs)
    floats = {k for k, a in enumerate(traced.avals) if jnp.issubdtype(a.dtype, jnp.inexact)}
    differentiated = trained & floats
    trained_args = tuple(sorted({argument_of(traced.arg_names[k]) for k in differentiated}))
    frozen = tuple(k for k, name in enumerate(traced.arg_names)
                   if argument_of(name) in trained_args and k not in differentiated)
    return _Layout(trained_args, frozen)


def trained_paths(traced: Traced) -> tuple[str, ...]:
    """The paths of the inputs the step differentiates, donates and updates."""
    layout = _layout(traced)
    skip = set(layout.frozen)
    return tuple(n for k, n in enumerate(traced.arg_names) if argument_of(n) in layout.trained_args and k not in skip)


def training_step(
    traced: Traced, fun: jc.ArrayFn, avals: Sequence[Tree], optimizer: Tree | None = None,
    state_sharding: Callable[[Tree, Tree], Tree] | None = None,
) -> TrainingStep:
    """`value_and_grad` of `fun`'s first output (the loss) w.r.t. the trained arguments, and with
    an optax `optimizer` its update; `state_sharding(params, state_shapes)` places the state."""
    layout = _layout(traced)
    args, frozen = layout.split(traced, avals)
    argnums: int | tuple[int, ...] = layout.trained_args[0] if len(layout.trained_args) == 1 else layout.trained_args
    n = len(args)

    def loss(*given: Tree) -> Tree:
        return fun(*layout.flat(traced, given[:n], given[n] if len(given) > n else []))[0]

    extra = [frozen] if frozen else []
    if optimizer is None:

        def step(*given: Tree) -> Tree:
            return jax.value_and_grad(loss, argnums=argnums)(*given)

        return TrainingStep(step, (*args, *extra), layout.trained_args)

    import optax

    def params_of(given: Sequence[Tree]) -> Tree:
        return given[argnums] if isinstance(argnums, int) else tuple(given[i] for i in argnums)

    def update(*given: Tree) -> Tree:
        *inputs, state = given
        value, grads = jax.value_and_grad(loss, argnums=argnums)(*inputs)
        params = params_of(inputs)
        updates, state = optimizer.update(grads, state, params)
        return value, optax.apply_updates(params, updates), state

    params = params_of(args)
    # optax mixes Python scalars with its counts: the optimizer is ours, whatever the caller's promotion
    with jax.numpy_dtype_promotion("standard"):
        shapes = jax.eval_shape(optimizer.init, params)
    state = shapes if state_sharding is None else state_sharding(params, shapes)
    all_args = (*args, *extra, state)
    return TrainingStep(_standard(update), all_args, (*layout.trained_args, len(all_args) - 1))


def own_step(traced: Traced, fun: jc.ArrayFn, avals: Sequence[Tree], donate: Sequence[int]) -> TrainingStep:
    """The target's own training step, called with the user's arguments, donating `donate`."""
    args = _arguments(traced, list(avals))

    def step(*given: Tree) -> Tree:
        leaves = [iter(jax.tree_util.tree_leaves(a)) for a in given]
        return fun(*(next(leaves[argument_of(name)]) for name in traced.arg_names))

    return TrainingStep(step, tuple(args), tuple(sorted(set(donate))))


def _standard(fn: Fn) -> Fn:
    """`fn` traced under standard dtype promotion (optax's updates need it)."""

    def run(*args: Tree) -> Tree:
        with jax.numpy_dtype_promotion("standard"):
            return fn(*args)

    return run


def state_on(params: Tree, shapes: Tree, replicated: Tree) -> Tree:
    """Optimizer-state shapes, each leaf sharded as the parameter it keeps a moment of (the
    parameter's path is a suffix of the leaf's, with the same shape), else `replicated` (a step
    count, Adafactor's factored moments)."""
    by_path = {jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}

    def place(path: Sequence[Tree], leaf: Tree) -> Tree:
        for start in range(len(path)):
            param = by_path.get(jax.tree_util.keystr(tuple(path[start:])))
            if param is not None and tuple(param.shape) == tuple(leaf.shape):
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=param.sharding)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated)

    return jax.tree_util.tree_map_with_path(place, shapes)
