"""Module paths from parameter names, where the name stack names no modules (Flax NNX, Equinox,
Haiku's parameters without scopes): the attribute paths of the module graph, and file paths that
never show an absolute path into site-packages."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from te_ckpt_audit import ResidualKind, audit
from te_ckpt_audit.records import AuditReport

WIDTH, FF, LAYERS = 32, 64, 2


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.up = nnx.Linear(WIDTH, FF, rngs=rngs)
        self.down = nnx.Linear(FF, WIDTH, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.down(jax.nn.gelu(self.up(self.norm(x))))


class Stack(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
        self.head = nnx.Linear(WIDTH, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = nnx.remat(lambda b, y: b(y))(block, x)  # a new module object inside the transform
        return self.head(x)


GRAPHDEF, _ = nnx.split(nnx.eval_shape(lambda: Stack(nnx.Rngs(0))))


def loss(state: nnx.State, x: jax.Array) -> jax.Array:
    return jnp.sum(nnx.merge(GRAPHDEF, state)(x))


@pytest.fixture(scope="module")
def report() -> AuditReport:
    _, state = nnx.split(nnx.eval_shape(lambda: Stack(nnx.Rngs(0))))
    return audit(loss, state, jax.ShapeDtypeStruct((4, WIDTH), jnp.float32), policies=["none", "as-is"])


def test_nnx_residuals_carry_attribute_paths(report: AuditReport) -> None:
    made = Counter(
        r.module for r in report.result("none").residuals if r.kind is ResidualKind.ACTIVATION and r.module
    )
    for layer in range(LAYERS):  # each layer's linears and norm, through nnx.remat's fresh objects
        for part in ("up", "down", "norm"):
            assert f"blocks/{layer}/{part}" in made
    assert made["blocks/0/up"] == made["blocks/1/up"]
    assert all(r.module for r in report.result("none").residuals if r.kind is ResidualKind.ACTIVATION)


def test_nnx_arguments_kept_alive_name_their_module(report: AuditReport) -> None:
    kept = {r.argument: r.module for r in report.result("as-is").residuals if r.kind is ResidualKind.ARGUMENT}
    assert any(m == "blocks/0/up" for m in kept.values()) and any(m == "blocks/1/down" for m in kept.values())


def test_nnx_rows_merge_the_layers(report: AuditReport) -> None:
    dots = [e.module for e in report.equations if e.primitive == "dot_general"]
    assert "blocks/*/up" in dots and "blocks/*/down" in dots and "head" in dots


class ScopedNorm(nnx.Module):
    """A norm whose call is a named scope and whose last step comes after its scale (Tunix's RMSNorm)."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.scale = nnx.Param(jnp.ones((WIDTH,)))

    @jax.named_scope("rms_norm")
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.scale * x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


class NormedHead(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm = ScopedNorm(rngs)
        self.head = nnx.Linear(WIDTH, FF, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(self.head(self.norm(x))))


def test_a_scoped_call_keeps_what_it_computes_after_its_parameter() -> None:
    """`scale * x / rms` uses the scale first: the division, in the same named scope, is still the
    norm's, not the head's it feeds; the head's own dot stays the head's."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: NormedHead(nnx.Rngs(0))))

    def f(state: nnx.State, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x)

    report = audit(f, state, jax.ShapeDtypeStruct((4, WIDTH), jnp.float32), policies=["none"])
    modules = {(e.primitive, e.module) for e in report.equations}
    assert ("div", "norm/rms_norm") in modules and ("sqrt", "norm/rms_norm") in modules
    assert not any(m and m.startswith("head/rms_norm") for _, m in modules)
    assert ("dot_general", "head") in modules


def test_a_dict_of_a_layers_weights_names_no_modules() -> None:
    """A plain parameter table ({'w_qkv': ..., 'w_ff': ...} per layer) names no modules: source
    lines stay the grouping, as before."""
    def f(p: dict[str, dict[str, jax.Array]], x: jax.Array) -> jax.Array:
        layer = p["layer"]
        return jnp.sum(jnp.tanh(jnp.tanh(x @ layer["a"]) @ layer["b"]) @ layer["c"])

    w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    params = {"layer": {"a": w, "b": w, "c": w, "d": w, "e": w}}
    result = audit(f, params, jax.ShapeDtypeStruct((2, 8), jnp.float32), policies=["none"]).results[0]
    assert all(r.module is None for r in result.residuals)


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("/venv/lib/python3.12/site-packages/flax/linen/module.py", "flax/linen/module.py"),
        ("/usr/lib/python3/dist-packages/numpy/core.py", "numpy/core.py"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/contextlib.py", "contextlib.py"),
        ("/home/me/project/model.py", "model.py"),
        ("/elsewhere/model.py", "/elsewhere/model.py"),
    ],
)
def test_display_paths_never_reach_into_site_packages(path: str, shown: str) -> None:
    from te_ckpt_audit.trace._source import display_path

    assert display_path(path, "/home/me/project") == shown


def test_library_frames_are_shown_from_their_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "somelib"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("import jax.numpy as jnp\n\ndef act(x):\n    return jnp.sin(jnp.sin(x))\n")
    monkeypatch.syspath_prepend(str(installed.parent))
    import somelib

    result = audit(lambda x: jnp.sum(somelib.act(x)), jax.ShapeDtypeStruct((8,), jnp.float32), policies=["none"])
    frames = {r.frame.file for r in result.results[0].residuals if r.frame}
    assert frames == {"somelib/__init__.py"}
