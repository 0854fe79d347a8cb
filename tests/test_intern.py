"""Equal checkpoint bodies become one object (an unrolled Flax stack traces one per layer), with
the same residuals as JAX and module paths merged across the layers."""

from __future__ import annotations

from collections import Counter

import pytest
from _reference import bind_static, module, saved_residuals

from te_ckpt_audit import ResidualKind, audit_target
from te_ckpt_audit import _jax_compat as jc
from te_ckpt_audit.config import parse_defines
from te_ckpt_audit.specs import resolve_policy
from te_ckpt_audit.trace._loading import load_inputs, load_target
from te_ckpt_audit.trace._trace import trace

TARGET = "sample_models/flax_model.py:loss"
UNROLLED = ["layers=4", "scan=False"]


def _traced():
    target = load_target(TARGET)
    return trace(target.fn, load_inputs(target, defines=parse_defines(UNROLLED)).args, TARGET)


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
    report = audit_target(TARGET, [policy], defines=UNROLLED)
    m = module("flax_model")
    args = m.loss_inputs(layers=4, scan=False)
    spec = resolve_policy(policy)
    fn, dyn = bind_static(m.loss if policy == "as-is" else m.make_loss(spec.policy), args)
    truth = Counter((tuple(a.shape), str(a.dtype)) for a, src in saved_residuals(fn, *dyn) if src != "from a literal")
    result = report.result(policy)
    ours = Counter((r.shape, r.dtype) for r in result.residuals if r.kind is not ResidualKind.LITERAL)
    assert ours == truth

