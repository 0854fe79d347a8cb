"""The core invariant: on every sample model and policy, the residuals te-ckpt-audit reports are
exactly the ones JAX keeps (same shapes and dtypes, same byte total)."""

from __future__ import annotations

from collections import Counter

import pytest
from _reference import MODELS, module, nbytes, policies_for, reference
from _reference import truth as jax_truth

from te_ckpt_audit import ResidualKind, audit_target
from te_ckpt_audit._jax_compat import JAX_VERSION, remat3_on

_reports = {}


def _report(model: str):
    if model not in _reports:
        _reports[model] = audit_target(f"sample_models/{model}.py:loss", policies_for(model))
    return _reports[model]


CASES = [(m, p) for m in MODELS for p in policies_for(m)]


@pytest.mark.parametrize(("model", "policy"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_residuals_equal_jax(model: str, policy: str) -> None:
    result = _report(model).result(policy)
    truth = jax_truth(model, policy)
    ours = Counter((r.shape, r.dtype) for r in result.residuals)
    assert ours == truth
    assert result.totals.total_bytes == nbytes(truth)
    assert sum(r.bytes for r in result.residuals) == result.totals.total_bytes


@pytest.mark.parametrize("model", MODELS)
def test_totals_split_adds_up(model: str) -> None:
    for result in _report(model).results:
        t = result.totals
        assert t.te_gemm_bytes + t.dot_bytes + t.quantized_bytes + t.named_bytes + t.other_bytes == t.activation_bytes
        assert t.host_bytes == sum(r.bytes for r in result.residuals if r.kind is ResidualKind.HOST)
        assert t.argument_bytes == sum(r.bytes for r in result.residuals if r.kind is ResidualKind.ARGUMENT)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.skipif(remat3_on() and JAX_VERSION < (0, 11, 0),
                    reason="jax 0.10's remat3 prototype saves dots for its own policy class alone: its checkpoint_dots "
                    "can keep more than everything_saveable (the residuals still equal JAX's, above)")
def test_policies_order_by_memory(model: str) -> None:
    """Sanity of the invariant's inputs: saving everything keeps the most, nothing the least."""
    report = _report(model)
    everything = report.result("everything_saveable").totals.activation_bytes
    nothing = report.result("nothing_saveable").totals.activation_bytes
    dots = report.result("checkpoint_dots").totals.activation_bytes
    assert nothing <= dots <= everything
    assert nothing < everything


_everything: dict[str, object] = {}


@pytest.mark.parametrize(("model", "policy"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_residuals_equal_jax_with_every_input_trained(model: str, policy: str) -> None:
    """`params="all"` (`--params all`): every float input differentiated, data included, as
    `saved_residuals(fn, *args)` differentiates them; the residuals are still JAX's."""
    if model not in _everything:
        _everything[model] = audit_target(f"sample_models/{model}.py:loss", policies_for(model), params="all")
    result = _everything[model].result(policy)  # type: ignore[attr-defined]
    truth = reference(model, policy, module(model).loss_inputs(), trained=None)
    assert Counter((r.shape, r.dtype) for r in result.residuals) == truth
    assert result.totals.total_bytes == nbytes(truth)
