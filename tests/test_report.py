"""The data model: to_dict is the versioned, deterministic JSON schema."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp

from te_ckpt_audit import SCHEMA, audit


def _fn(x, w):
    return jnp.sum(jnp.tanh(x @ w))


ARGS = (jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32))


def test_to_dict_is_versioned_and_deterministic() -> None:
    a = audit(_fn, *ARGS, policies=["nothing_saveable", "checkpoint_dots"]).to_dict()
    b = audit(_fn, *ARGS, policies=["nothing_saveable", "checkpoint_dots"]).to_dict()
    assert a["schema"] == SCHEMA == "te-ckpt-audit/15"
    assert json.dumps(a) == json.dumps(b)
    assert [r["policy"] for r in a["results"]] == ["nothing_saveable", "checkpoint_dots"]
    dots = a["results"][1]
    assert dots["totals"]["activation_bytes"] == 4 * 8 * 4  # x @ w saved
    assert dots["totals"]["total_bytes"] == 4 * 8 * 4 + (4 * 8 + 8 * 8) * 4
    assert dots["residuals"][-1]["kind"] == "activation"
    assert dots["residuals"][-1]["primitive"] == "dot_general"


def test_recompute_figures() -> None:
    report = audit(_fn, *ARGS, policies=["nothing_saveable", "everything_saveable"])
    gemm = 2 * 4 * 8 * 8
    assert report.forward_flops == gemm + 4 * 8 + 1  # dot, tanh, reduce_sum
    nothing = report.result("nothing_saveable")
    assert nothing.recompute_flops == gemm + 4 * 8  # the dot and tanh run again; the sum does not
    assert nothing.recompute_percent == 100.0 * (gemm + 4 * 8) / (gemm + 4 * 8 + 1)
    assert report.result("everything_saveable").recompute_flops == 0


def test_print_shows_the_comparison_table_and_repr_is_one_line() -> None:
    from te_ckpt_audit.render import TableView, render_table

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(x @ w) @ w)

    report = audit(loss, jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((4, 8), jnp.float32),
                   policies=["dots_and_te_gemms_with_no_batch_dims", "nothing_saveable"])
    text = str(report)
    assert text == render_table(report, TableView(width=None))
    assert "Kept for the backward pass" in text
    table = text[text.index("Kept for the backward pass"):].splitlines()
    rows = [line.split() for line in table if line[:2] in ("1 ", "2 ")]
    assert [row[1] for row in rows[:2]] == ["dots_and_te_gemms_with_no_batch_dims", "nothing_saveable"]  # unbroken
    said = repr(report)
    assert "\n" not in said and len(said) < 300 and "2 policies" in said and "print()" in said
