"""--compile: XLA's memory analysis of the compiled training step, beside the estimate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive

from te_ckpt_audit import audit, audit_target

POLICIES = [
    "nothing_saveable",
    "save_only_these_names:context",
    "dots_with_no_batch_dims_saveable",
    "checkpoint_dots",
    "everything_saveable",
]


def test_policy_order_by_activation_bytes_matches_compiled_temp_bytes() -> None:
    report = audit_target(
        "sample_models/gpt.py:loss",
        POLICIES,
        defines=["layers=4", "seq=64", "d_model=128", "d_ff=512"],
        compile=True,
    )
    estimate = [r.totals.activation_bytes for r in report.results]
    compiled = [r.compiled.temp_bytes for r in report.results if r.compiled is not None]
    assert len(compiled) == len(POLICIES) and all(c is not None and c > 0 for c in compiled)
    assert len(set(estimate)) == len(estimate)  # a strict order to compare
    by_estimate = sorted(range(len(POLICIES)), key=lambda i: estimate[i])
    by_compiled = sorted(range(len(POLICIES)), key=lambda i: compiled[i])  # type: ignore[index]
    assert by_estimate == by_compiled
    arguments = {r.compiled.argument_bytes for r in report.results if r.compiled is not None}
    assert len(arguments) == 1  # every policy compiles the same inputs


def test_a_step_that_cannot_compile_is_reported_not_raised() -> None:
    # A primitive with no lowering on any backend (jax.nn.scaled_matmul, used before, gained a CPU
    # lowering in jax 0.12): the audit stands, the compile error is kept.
    unlowered = Primitive("unlowered_here")
    unlowered.def_abstract_eval(lambda aval: aval)

    @jax.custom_jvp
    def f(x: jax.Array) -> jax.Array:
        return unlowered.bind(x)

    f.defjvp(lambda primals, tangents: (f(primals[0]), tangents[0]))
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    report = audit(lambda x: jnp.sum(jnp.sin(f(x))), x, policies=["nothing_saveable"], compile=True)
    (result,) = report.results
    assert result.compiled is not None and result.compiled.temp_bytes is None
    assert result.compiled.error is not None and "unlowered_here" in result.compiled.error
    assert result.totals.total_bytes > 0


def test_without_compile_there_is_no_compiled_figure() -> None:
    report = audit_target("sample_models/mlp.py:loss", ["nothing_saveable"])
    assert report.results[0].compiled is None
