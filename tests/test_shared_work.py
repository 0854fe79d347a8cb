"""Work every policy shares is done once: a checkpoint repeated in an unrolled stack is a call of
one jit (JAX linearizes it once per policy, not once per layer), and the equations around the
checkpoints are calls of jits that are the same objects for every policy of a trace (JAX
linearizes them for the first policy only). Residuals stay exactly JAX's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from test_programs import assert_exact, ours, truth

from te_ckpt_audit import _jax_compat as jc
from te_ckpt_audit import audit
from te_ckpt_audit._jaxpr import map_sub_jaxprs
from te_ckpt_audit.analysis._apply import KEEP, swap_policies
from te_ckpt_audit.config import parse_defines
from te_ckpt_audit.specs import resolve_policy
from te_ckpt_audit.trace._loading import load_inputs, load_target
from te_ckpt_audit.trace._trace import trace

SDS = jax.ShapeDtypeStruct
TARGET = "sample_models/flax_model.py:loss"
NOTHING = jax.checkpoint_policies.nothing_saveable


def _unrolled() -> Any:
    target = load_target(TARGET)
    return trace(target.fn, load_inputs(target, defines=parse_defines(["layers=4", "scan=False"])).args, TARGET)


def _policy(spec: str) -> Any:
    return KEEP if spec == "as-is" else resolve_policy(spec).policy


def _jits(jaxpr: Any) -> list[Any]:
    return [e for e in jaxpr.eqns if e.primitive is jc.jit_p]


@pytest.mark.parametrize("policy", ["as-is", "none", "nothing_saveable"])
def test_repeated_layers_become_calls_of_one_jit(policy: str) -> None:
    """Each layer is a call of one shared jit; a checkpoint called once stays as it was."""
    swapped = swap_policies(_unrolled().jaxpr.jaxpr, _policy(policy))
    layers = [
        e for e in _jits(swapped)
        if any(i.primitive is jc.remat_p or i.primitive is jc.dot_general_p for i in e.params["jaxpr"].eqns)
    ]
    assert len(layers) == 4 and len({id(e.params["jaxpr"]) for e in layers}) == 1
    assert not any(e.primitive is jc.remat_p for e in swapped.eqns)

    single = trace(lambda x: jax.checkpoint(jnp.sin)(x) * 2.0, (SDS((3,), jnp.float32),))
    kept = swap_policies(single.jaxpr.jaxpr, _policy(policy))
    assert [e.primitive.name for e in kept.eqns if e.primitive in (jc.remat_p, jc.jit_p)] == (
        [] if policy == "none" else ["remat2"]
    )


@pytest.mark.parametrize("policy", ["as-is", "none", "nothing_saveable"])
def test_a_compiled_step_is_the_function_as_written_without_the_shared_calls(policy: str) -> None:
    """Issue 56, item 2: the calls that share work change the program XLA compiles (a ResNet with a
    checkpoint per block planned 516,096 B fewer temporaries on a v5e than the user's own step), so a
    compile target takes the function as written (`calls=False`, `policy_function`'s default; the
    analysis asks for the calls): no layer becomes a jit call, the checkpoints stay where the model
    put them, the work around them is not cut into calls."""
    from te_ckpt_audit.analysis._apply import policy_function, policy_jaxpr
    from te_ckpt_audit.records import Scope

    def bodies(jaxpr: Any) -> set[int]:  # every jit body called anywhere: the model's own
        found = set()
        for e in jaxpr.eqns:
            if e.primitive is jc.jit_p:
                found.add(id(e.params["jaxpr"]))
            inner = e.params.get("jaxpr")  # a jit's body or a checkpoint's
            if inner is not None:
                found |= bodies(getattr(inner, "jaxpr", inner))
        return found

    traced = _unrolled()
    written = swap_policies(traced.jaxpr.jaxpr, _policy(policy), traced.segments, calls=False)
    assert {id(e.params["jaxpr"]) for e in _jits(written)} <= bodies(traced.jaxpr.jaxpr)  # no call of ours
    kept = [e for e in written.eqns if e.primitive is jc.remat_p]
    assert len(kept) == (0 if policy == "none" else 4)  # each layer's checkpoint where it was
    shared = swap_policies(traced.jaxpr.jaxpr, _policy(policy), traced.segments)
    assert not {id(e.params["jaxpr"]) for e in _jits(shared)} <= bodies(traced.jaxpr.jaxpr)  # the analysis's

    spec = resolve_policy(policy)  # by default, policy_function is the function as written: what any compile takes
    assert {id(e.params["jaxpr"]) for e in _jits(policy_jaxpr(traced, spec, Scope.INNER).jaxpr)} <= bodies(
        traced.jaxpr.jaxpr)
    fun = policy_function(traced, spec, Scope.INNER)
    args = [jnp.ones(a.shape, a.dtype) for a in traced.avals]
    ran, own = jax.jit(fun)(*args), jc.jaxpr_as_fun(traced.jaxpr)(*args)
    assert [float(x) for x in jax.tree.leaves(ran)] == pytest.approx([float(x) for x in jax.tree.leaves(own)])


def test_a_rewrite_that_changes_nothing_keeps_the_objects() -> None:
    """JAX caches per jaxpr object: a body no policy swap touches stays the same object."""
    eqn = next(e for e in _unrolled().jaxpr.jaxpr.eqns if e.primitive is jc.jit_p)
    assert map_sub_jaxprs(eqn.params, lambda _, sub: sub)["jaxpr"] is eqn.params["jaxpr"]


def _wrapped(policy: Any) -> Callable[..., Any]:
    """Work before, between and after two checkpointed layers (as in a Keras model whose
    activations alone are rematerialised)."""
    remat = (lambda f: f) if policy is None else (lambda f: jax.checkpoint(f, policy=policy))

    def f(w: Any, x: Any) -> Any:
        h = jnp.tanh(x @ w) * 2.0 + 1.0
        h = jnp.exp(jnp.sin(h) @ w)
        h = remat(lambda y: jnp.cos(y @ w) @ w)(h)
        h = jnp.sin(h) * jnp.exp(h) - h @ w
        h = jnp.log1p(h * h) @ w
        h = remat(lambda y: jax.nn.gelu(y @ w))(h)
        return jnp.sum(jnp.tanh(h @ w) ** 2 + jnp.sin(h))

    return f


ARGS = (SDS((8, 8), jnp.float32), SDS((4, 8), jnp.float32))


def test_work_around_the_checkpoints_is_one_jit_per_run_shared_by_every_policy() -> None:
    traced = trace(_wrapped(NOTHING), ARGS)
    first = swap_policies(traced.jaxpr.jaxpr, NOTHING, traced.segments)
    second = swap_policies(traced.jaxpr.jaxpr, jax.checkpoint_policies.everything_saveable, traced.segments)
    segments = [e for e in _jits(first) if not any(i.primitive is jc.remat_p for i in e.params["jaxpr"].eqns)]
    assert len(segments) == 3  # before, between and after the two checkpoints
    assert [id(e) for e in segments] == [id(e) for e in _jits(second)]
    assert [e.primitive.name for e in first.eqns] == ["jit", "remat2", "jit", "remat2", "jit"]


def test_around_the_checkpoints_residuals_equal_jax() -> None:
    assert_exact(_wrapped(NOTHING), *ARGS, inner=_wrapped)
    as_is = audit(_wrapped(NOTHING), *ARGS, policies=["as-is"]).results[0]
    assert ours(as_is) == truth(_wrapped(NOTHING), ARGS, "nothing_saveable", _wrapped)  # its own policy


def test_an_equation_with_effects_stays_outside_the_segments() -> None:
    def f(w: Any, x: Any) -> Any:
        h = jnp.tanh(x @ w) * 2.0 + 1.0
        jax.debug.callback(lambda v: None, h)
        h = jnp.exp(jnp.sin(h) @ w) - 1.0
        return jnp.sum(jax.checkpoint(lambda y: jnp.cos(y @ w))(h) ** 2)

    traced = trace(f, ARGS)
    swapped = swap_policies(traced.jaxpr.jaxpr, NOTHING, traced.segments)
    assert any(e.effects for e in swapped.eqns)
    assert not any(e.effects for j in _jits(swapped) for e in j.params["jaxpr"].eqns)


