"""Warnings for policies that silently do nothing, or not what their name promises."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from te_ckpt_audit import WarningCode, audit
from te_ckpt_audit.render import warning_message


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
    assert (unknown.name, unknown.suggestion, unknown.known) == ("hiden", "hidden", ("hidden",))
    assert "'hiden'" in warning_message(unknown) and "did you mean 'hidden'" in warning_message(unknown)


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
    from te_ckpt_audit._trace import trace
    from te_ckpt_audit._warnings import _spec_warnings
    from te_ckpt_audit.specs import resolve_policy

    spec = resolve_policy("checkpoint_dots")
    traced = trace(_fn, ARGS)
    result = audit(_fn, *ARGS, policies=[spec]).results[0]
    before = jax.config.values.get("jax_remat3", False)
    try:  # only the warning is under test: the audit itself does not model remat3
        jax.config.update("jax_remat3", False)
        codes_off = [w.code for w in _spec_warnings(traced, spec, result)]
        jax.config.update("jax_remat3", True)
        codes_on = [w.code for w in _spec_warnings(traced, spec, result)]
    finally:
        jax.config.update("jax_remat3", before)  # as the run set it (JAX_REMAT3)
    assert codes_off == []
    assert codes_on == [WarningCode.REMAT3]
