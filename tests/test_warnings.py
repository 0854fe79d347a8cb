"""Warnings for policies that silently do nothing, or not what their name promises."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

from te_ckpt_audit import WarningCode, audit, audit_target
from te_ckpt_audit.render import warning_message
from te_ckpt_audit.trace._trace import trace


def _fn(x, w):
    h = checkpoint_name(jnp.sin(x @ w), "hidden")
    return jnp.sum(jnp.tanh(h @ w))


ARGS = (jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32))


def codes(policy: str) -> list[WarningCode]:
    result = audit(_fn, *ARGS, policies=[policy]).results[0]
    assert all(w.policy == policy for w in result.warnings)
    return [w.code for w in result.warnings]


def test_a_name_no_checkpoint_name_carries() -> None:
    result = audit(_fn, *ARGS, policies=["save_only_these_names:hiden"]).results[0]
    assert [w.code for w in result.warnings] == [WarningCode.UNKNOWN_NAME, WarningCode.SAME_AS_NOTHING_SAVEABLE]
    unknown = result.warnings[0]
    assert (unknown.name, unknown.closest, unknown.model_names) == ("hiden", "hidden", ("hidden",))
    assert "'hiden'" in warning_message(unknown) and "did you mean 'hidden'" in warning_message(unknown)


def test_a_line_name_pasted_without_name_lines_says_where_it_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """`recommend --synthesize` on a model without names answers `--policy
    save_only_these_names:mlp_26 --name-lines`; pasted without --name-lines, the audit said only
    "did you mean" one of the model's own names. It says which line the tool's name is, and how to
    have it."""
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    result = audit_target("sample_models/mlp.py:loss", ["save_only_these_names:mlp_26"]).results[0]
    unknown = next(w for w in result.warnings if w.code is WarningCode.UNKNOWN_NAME)
    assert unknown.line == "sample_models/mlp.py:26"
    assert warning_message(unknown).endswith("(it is the name --name-lines gives sample_models/mlp.py:26: add "
                                             "--name-lines, or checkpoint_name there)")
    again = audit_target("sample_models/mlp.py:loss", ["save_only_these_names:mlp_26"], name_lines=True).results[0]
    assert WarningCode.UNKNOWN_NAME not in [w.code for w in again.warnings]
    typo = audit_target("sample_models/mlp.py:loss", ["save_only_these_names:fc3"]).results[0].warnings[0]
    assert typo.line is None and "did you mean 'fc2'?" in warning_message(typo)


def test_a_known_name_gives_no_warning() -> None:
    assert codes("save_only_these_names:hidden") == []


def test_jax_save_anything_except_these_names_saves_everything() -> None:
    assert WarningCode.SAVES_EVERYTHING in codes("save_anything_except_these_names:hidden")


def test_an_offload_that_did_not_happen() -> None:
    assert WarningCode.OFFLOAD_MISSING in codes("save_and_offload_only_these_names:offload=hiden")
    assert codes("save_and_offload_only_these_names:offload=hidden") == []


def test_no_dot_warning_without_te_gemms() -> None:
    assert codes("checkpoint_dots") == []


def test_remat3_is_flagged() -> None:
    """A trace made while jax_remat3 is on (JAX_REMAT3=1) is audited under the new remat, and says so."""
    from te_ckpt_audit.analysis._warnings import _spec_warnings
    from te_ckpt_audit.specs import resolve_policy

    spec = resolve_policy("checkpoint_dots")
    codes = {}
    before = jax.config.values.get("jax_remat3", False)
    try:
        for on in (False, True):
            jax.config.update("jax_remat3", on)
            traced = trace(_fn, ARGS)
            result = audit(_fn, *ARGS, policies=[spec]).results[0]
            codes[on] = [w.code for w in _spec_warnings(traced, spec, result)]
    finally:
        jax.config.update("jax_remat3", before)  # as the run set it (JAX_REMAT3)
    assert codes == {False: [], True: [WarningCode.REMAT3]}


# --- gemm-batch-dims-missed: weight GEMMs a no-batch-dims dot policy recomputes -------------------

E, C, D, F, STAGES, MICRO = 4, 8, 16, 32, 3, 4
NO_BATCH = ["dots_with_no_batch_dims_saveable", "dots_and_te_gemms_with_no_batch_dims",
            "offload_dot_with_no_batch_dims:src=device,dst=pinned_host"]


def moe_experts(w: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """An MoE expert layer: each expert's FFN over its dispatched tokens, vmapped over experts."""
    h = jax.vmap(lambda wi, xi: jax.nn.gelu(xi @ wi))(w["w_in"], x)
    return jnp.sum(jax.vmap(lambda wi, hi: hi @ wi)(w["w_out"], h) ** 2)


MOE_ARGS = ({"w_in": jax.ShapeDtypeStruct((E, D, F), jnp.float32),
             "w_out": jax.ShapeDtypeStruct((E, F, D), jnp.float32)}, jax.ShapeDtypeStruct((E, C, D), jnp.float32))


def pipeline(w: jax.Array, x: jax.Array) -> jax.Array:
    """A pipeline's stages run at once on their microbatches: one stage body vmapped over the stage
    axis of the stacked weights (as circular pipelines do)."""

    def stage(wi: jax.Array, xi: jax.Array) -> jax.Array:
        return jnp.tanh(xi @ wi)

    return jnp.sum(jax.vmap(stage)(w, x) ** 2)


PIPELINE_ARGS = (jax.ShapeDtypeStruct((STAGES, D, D), jnp.float32),
                 jax.ShapeDtypeStruct((STAGES, MICRO, D), jnp.float32))


@pytest.mark.parametrize("fn, args, gemms", [(moe_experts, MOE_ARGS, 2), (pipeline, PIPELINE_ARGS, 1)],
                         ids=["vmapped-moe-experts", "vmapped-pipeline-stages"])
def test_a_no_batch_dims_policy_misses_vmapped_weight_gemms(fn: Any, args: Any, gemms: int) -> None:
    report = audit(fn, *args, policies=[*NO_BATCH, "checkpoint_dots"])
    dots = {e.id: e for e in report.equations if e.primitive == "dot_general"}
    for result in report.results[:-1]:
        (missed,) = [w for w in result.warnings if w.code is WarningCode.GEMM_BATCH_DIMS_MISSED]
        assert len(missed.equations) == gemms and set(missed.equations) <= set(dots)
        assert missed.origins == ("vmap",) and missed.flops == sum(dots[e].flops for e in missed.equations)
        assert all("test_warnings.py" in m for m in missed.modules)
        assert "use checkpoint_dots" in warning_message(missed)
    assert not [w for w in report.results[-1].warnings if w.code is WarningCode.GEMM_BATCH_DIMS_MISSED]


@pytest.mark.parametrize("model", ["eight_names", "flax_model", "fp8_block", "gpt", "megatron_tp", "mlp",
                                   "te_transformer"])
def test_the_lint_is_silent_where_no_weight_gemm_has_batch_dims(model: str) -> None:
    """Attention scores have batch dimensions, but both operands are activations: not a weight GEMM."""
    report = audit_target(f"sample_models/{model}.py:loss", NO_BATCH)
    assert not [w for r in report.results for w in r.warnings if w.code is WarningCode.GEMM_BATCH_DIMS_MISSED]
