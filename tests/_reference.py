"""JAX's own answer for a sample model and policy, built from the user's Python directly (never
through te-ckpt-audit's jaxpr rewriting), for the exactness invariant."""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from te_ckpt_audit._jax_compat import JAX_VERSION, remat3, remat3_on, saved_residuals
from te_ckpt_audit.specs import AsIs, resolve_policy

INNER = {"gpt", "flax_model"}  # models with their own jax.checkpoint / nn.remat

# A checkpoint name each model uses, for save_only_these_names / offload specs.
NAMES = {
    "mlp": "fc1",
    "gpt": "context",
    "flax_model": "ffn1",
    "te_transformer": "ffn1",
    "fp8_block": "ffn1",
}
MODELS = tuple(NAMES)


def policies_for(model: str) -> list[str]:
    name = NAMES[model]
    return [
        "none",
        "as-is",
        "nothing_saveable",
        "everything_saveable",
        "checkpoint_dots",
        "checkpoint_dots_with_no_batch_dims",
        "te_gemms_saveable",
        "checkpoint_dots_and_te_gemms",
        "dots_and_te_gemms_with_no_batch_dims",
        f"save_only_these_names:{name}",
        f"save_any_names_but_these:{name}",
        f"save_and_offload_only_these_names:offload={name}",
        "offload_dot_with_no_batch_dims",
    ]


def module(model: str) -> Any:
    return importlib.import_module(f"sample_models.{model}")


def bind_static(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Callable[..., Any], list[Any]]:
    """`fn` as a function of the ShapeDtypeStruct leaves of `args` only (others closed over)."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    dynamic = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.ShapeDtypeStruct)]

    def f(*dyn: Any) -> Any:
        full = list(leaves)
        for i, value in zip(dynamic, dyn, strict=True):
            full[i] = value
        return fn(*jax.tree_util.tree_unflatten(tree, full))

    return f, [leaves[i] for i in dynamic]


def trained_only(fn: Callable[..., Any], trained: set[int] | None) -> Callable[..., Any]:
    """`fn` with every array of an argument not in `trained` under stop_gradient: JAX's own
    linearization then treats it as known, as `jax.grad(loss)(params, batch)` does (None: every
    argument is differentiated, as `saved_residuals(fn, *args)` does)."""
    if trained is None:
        return fn

    def stopped(x: Any) -> Any:
        return jax.lax.stop_gradient(x) if isinstance(x, jax.Array) else x

    def partial(*args: Any) -> Any:
        return fn(*(a if i in trained else jax.tree_util.tree_map(stopped, a) for i, a in enumerate(args)))

    return partial


def reference(model: str, spec_text: str, args: tuple[Any, ...],
              trained: set[int] | None = frozenset({0})) -> Counter[tuple[tuple[int, ...], str]]:  # type: ignore[assignment]
    """(shape, dtype) multiset of JAX's saved residuals with only the `trained` arguments
    differentiated (a target's default: the first), literals left out (they are compile-time
    scalars, listed or not depending on how a Python number entered the trace)."""
    m = module(model)
    spec = resolve_policy(spec_text)
    if isinstance(spec, AsIs):
        fn, dyn = bind_static(trained_only(m.loss, trained), args)
    elif model in INNER:
        fn, dyn = bind_static(trained_only(m.make_loss(spec.policy), trained), args)  # policy None: no remat at all
    else:
        fn, dyn = bind_static(trained_only(m.loss, trained), args)
        if spec.policy is not None:
            fn = jax.checkpoint(fn, policy=spec.policy)
    return Counter(
        (tuple(aval.shape), str(np.dtype(aval.dtype)))
        for aval, src in saved_residuals(fn, *dyn)
        if src != "from a literal"
    )


# jax 0.10's and 0.11's remat3 (prototypes) keep other residuals where an input is left out of
# differentiation by stop_gradient (`reference`'s way) than in the step `jax.grad(loss)(params, x)`
# runs, where the batch is an argument not differentiated (as the audit takes it): there, the truth
# is that step's own residuals (`as_a_step`). 0.10 differs on the dot policies, 0.11 where everything
# is saved (the stop_gradient's output kept beside the batch it copies); 0.12 on none.
PROTOTYPE = ({("mlp", "checkpoint_dots"), ("mlp", "checkpoint_dots_with_no_batch_dims")} if JAX_VERSION < (0, 11, 0)
             else {("mlp", "everything_saveable")} if JAX_VERSION < (0, 12, 0) else set())


def as_a_step(model: str, spec_text: str) -> Counter[tuple[tuple[int, ...], str]]:
    """What JAX's remat3 keeps for the backward pass of the checkpointed loss, differentiated in its
    first argument (the rest plain arguments of the traced step): the leaves of `jax.vjp`'s backward
    function."""
    m = module(model)
    params, *rest = jax.tree.map(lambda s: jax.numpy.ones(s.shape, s.dtype), m.loss_inputs())
    with remat3(True):
        f = jax.checkpoint(m.loss, policy=resolve_policy(spec_text).policy)
        kept = jax.make_jaxpr(lambda p, *r: jax.tree.leaves(jax.vjp(lambda p: f(p, *r), p)[1]))(params, *rest)
    return Counter((tuple(a.shape), str(a.dtype)) for a in kept.out_avals)


def truth(model: str, spec_text: str) -> Counter[tuple[tuple[int, ...], str]]:
    """JAX's own residuals for a sample model's default target: `reference`, or under a remat3
    prototype where stop_gradient keeps other residuals than the step, the step's (`as_a_step`)."""
    if remat3_on() and (model, spec_text) in PROTOTYPE:
        return as_a_step(model, spec_text)
    return reference(model, spec_text, module(model).loss_inputs())


def nbytes(counter: Counter[tuple[tuple[int, ...], str]]) -> int:
    return sum(int(np.prod(shape)) * _itemsize(dtype) * n for (shape, dtype), n in counter.items())


def _itemsize(dtype: str) -> int:
    return 0 if "float0" in dtype else np.dtype(dtype).itemsize  # float0: a tangent of no bytes


def with_jax_flags(flags: tuple[str, ...], fn: Callable[[], Any]) -> Any:
    """`fn()` with JAX's boolean config flags `flags` on (jax_remat3, jax_custom_vjp3), then as they were."""
    before = {f: jax.config.values.get(f, False) for f in flags}
    try:
        for f in flags:
            jax.config.update(f, True)
        return fn()
    finally:
        for f, v in before.items():
            jax.config.update(f, v)
