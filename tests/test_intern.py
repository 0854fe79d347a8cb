"""Equal checkpoint bodies become one object (an unrolled Flax stack traces one per layer), with
the same residuals as JAX and module paths merged across the layers."""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp

import pytest

from te_ckpt_audit import ResidualKind, audit_target
from te_ckpt_audit import _jax_compat as jc
from te_ckpt_audit._analysis import _KEEP, _swap_policies
from te_ckpt_audit._jaxpr import map_sub_jaxprs
from te_ckpt_audit._loading import load_inputs, load_target
from te_ckpt_audit._trace import trace

from _reference import bind_static, module, saved_residuals
from te_ckpt_audit.specs import resolve_policy

TARGET = "sample_models/flax_model.py:loss"
UNROLLED = ["layers=4", "scan=False"]


def _traced():
    target = load_target(TARGET)
    return trace(target.fn, load_inputs(target, overrides=UNROLLED).args, TARGET)


def test_unrolled_blocks_share_one_body() -> None:
    jaxpr = _traced().jaxpr.jaxpr
    bodies = [e.params["jaxpr"] for e in jaxpr.eqns if e.primitive is jc.remat_p]
    assert len(bodies) == 4 and len({id(b) for b in bodies}) == 1


def test_shared_rows_count_every_layer_and_merge_module_paths() -> None:
    equations = _traced().rows.equations()
    dots = [e for e in equations if e.primitive == "dot_general" and e.module and "block_" in e.module]
    assert dots and all(e.multiplicity == 4 for e in dots)
    assert {e.module.split("/")[1] for e in dots} == {"block_*"}


@pytest.mark.parametrize("policy", ["as-is", "none", "nothing_saveable", "checkpoint_dots", "everything_saveable"])
def test_unrolled_residuals_equal_jax(policy: str) -> None:
    report = audit_target(TARGET, [policy], overrides=UNROLLED)
    m = module("flax_model")
    args = m.loss_inputs(layers=4, scan=False)
    spec = resolve_policy(policy)
    fn, dyn = bind_static(m.loss if policy == "as-is" else m.make_loss(spec.policy), args)
    truth = Counter((tuple(a.shape), str(a.dtype)) for a, src in saved_residuals(fn, *dyn) if src != "from a literal")
    result = report.result(policy)
    ours = Counter((r.shape, r.dtype) for r in result.residuals if r.kind is not ResidualKind.LITERAL)
    assert ours == truth


@pytest.mark.parametrize("policy", ["as-is", "none", "nothing_saveable"])
def test_repeated_layers_become_calls_of_one_jit(policy: str) -> None:
    """Each layer is a call of one shared jit (JAX linearizes that once per policy); a single
    checkpoint call stays as it was."""
    spec = resolve_policy(policy)
    jaxpr = _traced().jaxpr.jaxpr
    swapped = _swap_policies(jaxpr, _KEEP if policy == "as-is" else spec.policy)
    calls = [e for e in swapped.eqns if e.primitive is jc.jit_p and any(
        i.primitive is jc.remat_p or i.primitive.name == "dot_general" for i in e.params["jaxpr"].eqns)]
    assert len(calls) == 4 and len({id(e.params["jaxpr"]) for e in calls}) == 1
    assert not any(e.primitive is jc.remat_p for e in swapped.eqns)

    single = trace(lambda x: jax.checkpoint(jnp.sin)(x) * 2.0, (jax.ShapeDtypeStruct((3,), jnp.float32),))
    kept = _swap_policies(single.jaxpr.jaxpr, spec.policy) if policy != "as-is" else single.jaxpr.jaxpr
    assert [e.primitive.name for e in kept.eqns if e.primitive in (jc.remat_p, jc.jit_p)] == (
        [] if policy == "none" else ["remat2"]
    )


def test_a_rewrite_that_changes_nothing_keeps_the_objects() -> None:
    """JAX caches per jaxpr object: a body no policy swap touches stays the same object."""
    eqn = next(e for e in _traced().jaxpr.jaxpr.eqns if e.primitive is jc.jit_p)
    params = map_sub_jaxprs(eqn.params, lambda _, sub: sub)
    assert params["jaxpr"] is eqn.params["jaxpr"]
