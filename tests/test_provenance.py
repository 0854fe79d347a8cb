"""Residuals are followed to the equation that made them: into scans, jit and custom_vjp bodies,
through offload copies, with the layers a scan stacks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from te_ckpt_audit import Category, Outcome, ResidualKind, audit, audit_target

LAYERS = 3


@pytest.fixture(scope="module")
def gpt():
    return audit_target(
        "sample_models/gpt.py:loss",
        ["checkpoint_dots", "save_and_offload_only_these_names:save=context;offload=ffn1"],
        defines=[f"layers={LAYERS}"],
    )


def _layer_lines() -> range:
    import inspect

    from sample_models import gpt

    first = min(inspect.getsourcelines(gpt._attention)[1], inspect.getsourcelines(gpt._layer)[1])
    last = max(
        inspect.getsourcelines(f)[1] + len(inspect.getsourcelines(f)[0]) for f in (gpt._attention, gpt._layer)
    )
    return range(first, last)


def test_scan_body_residuals_name_producer_line_and_layers(gpt) -> None:
    result = gpt.result("checkpoint_dots")
    stacked = [r for r in result.residuals if r.kind is ResidualKind.ACTIVATION and r.shape[:1] == (LAYERS,)]
    names = {r.name for r in stacked}
    assert {"qkv_proj", "out_proj", "ffn1"} <= names
    lines = _layer_lines()
    for r in stacked:
        assert r.multiplicity == LAYERS
        assert r.primitive not in (None, "scan")  # never "output of scan"
        assert r.source is not None and r.source.file.endswith("gpt.py")
        assert r.source.line in lines
        assert r.source.function in ("_attention", "_layer")
        assert r.equation is not None
    dots = [r for r in stacked if r.category is Category.DOT]
    assert {r.primitive for r in dots} == {"dot_general"}


def test_arguments_are_reported_apart(gpt) -> None:
    result = gpt.result("checkpoint_dots")
    args = [r for r in result.residuals if r.kind is ResidualKind.ARGUMENT]
    assert args and all(r.argument and r.argument.startswith("args[0]") for r in args)
    assert result.totals.argument_bytes == sum(r.bytes for r in args)


def test_offloaded_residuals_count_as_host_bytes(gpt) -> None:
    result = gpt.result("save_and_offload_only_these_names:save=context;offload=ffn1")
    host = [r for r in result.residuals if r.kind is ResidualKind.HOST]
    assert [r.name for r in host] == ["ffn1"]
    (r,) = host
    assert r.primitive == "dot_general" and r.multiplicity == LAYERS
    assert r.shape == (LAYERS, 2, 16, 256) and r.bytes == LAYERS * 2 * 16 * 256 * 4
    assert result.totals.host_bytes == r.bytes
    ffn1_rows = [e for e in gpt.equations if e.name == "ffn1"]
    assert [result.mark(e.id).outcome for e in ffn1_rows] == [Outcome.OFFLOADED]
    assert all(x.name != "ffn1" for x in result.residuals if x.kind is ResidualKind.ACTIVATION)


def test_jit_and_custom_vjp_bodies() -> None:
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (g * c,))

    @jax.jit
    def inner(x, w):
        return jnp.tanh(f(x @ w))

    def loss(x, w):
        return jnp.sum(inner(x, w) ** 2)

    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    result = audit(loss, x, w, policies=["none"]).results[0]
    prims = sorted(r.primitive for r in result.residuals if r.kind is ResidualKind.ACTIVATION)
    assert "jit" not in prims and "custom_vjp_call" not in prims
    assert "cos" in prims  # the custom_vjp's residual, from its fwd rule
    for r in result.residuals:
        if r.kind is ResidualKind.ACTIVATION:
            assert r.source is not None and r.source.file.endswith("test_provenance.py")


def test_a_residuals_producer_and_line_do_not_depend_on_the_policy() -> None:
    """Issue 41, item 7: under `none` the TE GEMM outputs named ffn1 and moe_ffn1 (made inside a
    jit whose body names them) had no equation, primitive or line; under everything_saveable the
    same tensors were the GEMMs at lines 73 and 82."""
    report = audit_target("sample_models/te_transformer.py:loss", ["none", "everything_saveable"])
    none, everything = report.results

    def named(result: object) -> list[tuple[str, str | None, str | None, int | None]]:
        return sorted((r.name, r.equation, r.primitive, r.source.line if r.source else None)
                      for r in result.residuals if r.name in ("ffn1", "moe_ffn1"))  # type: ignore[attr-defined]

    assert len(named(none)) == 4 and named(none) == named(everything)
    assert all(eq is not None and prim is not None and line in (73, 82) for _, eq, prim, line in named(none))


def test_a_residual_differentiation_makes_keeps_its_line_in_a_long_lived_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The te_transformer sample's scatter at line 75: JAX's differentiation makes an `add` residual
    by a rule it may have traced before for another caller, whose traceback it then carries (in a
    notebook or a test worker: the front page read "(no source)" for it in 3 of 5 parallel suite
    runs). Such a producer, untagged inside a tagged call, takes the call's own site when its
    traceback names no line of the traced program; here the tracebacks are made to name none."""
    from pathlib import Path

    from te_ckpt_audit import Session
    from te_ckpt_audit.specs import resolve_policy
    from te_ckpt_audit.trace._source import Origin, SourceFinder

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    session = Session.of_target("sample_models/te_transformer.py:loss")  # traced: every row has its line

    def stale(self: SourceFinder, eqn: object) -> Origin:  # a differentiation rule traced for another caller
        return Origin(None, None)

    monkeypatch.setattr(SourceFinder, "__call__", stale)
    result = session.result(resolve_policy("none"))
    adds = [r for r in result.residuals if r.primitive == "add" and r.equation is None and r.bytes == 8192]
    assert adds and all(r.source is not None and (r.source.file, r.source.line) == (
        "sample_models/te_transformer.py", 75) for r in adds)
