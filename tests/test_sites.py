"""A body shared by several call sites (one jit called in every layer, equal checkpoint bodies made
one object) keeps each call site's own module path and source line for the residuals made there.
Totals never depended on it; hotspots, `--by module` and the HTML table do."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from te_ckpt_audit import ResidualKind, audit
from te_ckpt_audit.records import AuditReport, PolicyResult

X = jax.ShapeDtypeStruct((32, 32), jnp.float32)
HELPER = jax.jit(lambda x: jnp.sin(x) * x)


def _two_scopes(x: Any) -> Any:
    with jax.named_scope("layer0"):
        a = HELPER(x)
    with jax.named_scope("layer1"):
        b = HELPER(a * 2.0)
    return jnp.sum(b)


def _bytes_by_module(result: PolicyResult) -> dict[str | None, int]:
    out: Counter[str | None] = Counter()
    for r in result.residuals:
        if r.kind is ResidualKind.ACTIVATION:
            out[r.module] += r.bytes
    return dict(out)


def test_a_jitted_helper_called_in_two_scopes() -> None:
    report = audit(_two_scopes, X, policies=["none"])
    # layer0: the helper's sin and cos of x; layer1: the input a * 2 and the helper's sin and cos of it
    assert _bytes_by_module(report.results[0]) == {"layer0": 2 * 4096, "layer1": 3 * 4096}
    shared = [e for e in report.equations if e.primitive == "sin"]
    assert [e.module for e in shared] == ["layer*"] and shared[0].multiplicity == 2  # one row, both calls


def _two_lines(x: Any) -> Any:
    a = jax.nn.silu(x)  # line A
    b = jax.nn.silu(a * 2.0)  # line B
    return jnp.sum(b)


def _line_of(fragment: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if fragment in line and "def " not in line)


def test_a_library_jit_called_on_two_lines_keeps_each_line() -> None:
    report = audit(_two_lines, X, policies=["none"])
    made = Counter(
        r.source.line for r in report.results[0].residuals if r.kind is ResidualKind.ACTIVATION and r.source
    )
    a, b = _line_of("# line A"), _line_of("# line B")
    assert set(made) == {a, b} and made[a] >= 1 and made[b] >= 1
    assert all(
        r.source is not None and "site-packages" not in r.source.file
        for r in report.results[0].residuals
        if r.kind is ResidualKind.ACTIVATION
    )


@pytest.fixture(scope="module")
def unrolled() -> AuditReport:
    from sample_models import flax_model

    return audit(flax_model.loss, *flax_model.loss_inputs(scan=False, layers=3),
                 policies=["as-is", "none", "checkpoint_dots"])


@pytest.mark.parametrize("policy", ["as-is", "none", "checkpoint_dots"])
def test_interned_layers_keep_their_own_module_paths(unrolled: AuditReport, policy: str) -> None:
    result = unrolled.result(policy)
    blocks = Counter(r.module.split("/")[1] for r in result.residuals if r.module and "block_" in r.module)
    assert "block_*" not in blocks
    # every layer keeps as much as the next (the last one's output goes to the loss, not to a block)
    assert set(blocks) >= {"block_0", "block_1"}
    assert blocks["block_0"] == blocks["block_1"]


def test_rows_of_an_interned_body_read_as_every_layer(unrolled: AuditReport) -> None:
    modules = {e.module for e in unrolled.equations if e.module and "block" in e.module}
    assert modules and all("block_*" in m for m in modules)


def _layer(x: Any) -> Any:
    return HELPER(jnp.tanh(x))


def _nested(x: Any) -> Any:
    for i in range(3):
        with jax.named_scope(f"block_{i}"):
            x = jax.checkpoint(_layer, policy=jax.checkpoint_policies.nothing_saveable)(x)
    return jnp.sum(x)


@pytest.mark.parametrize("policy", ["none", "everything_saveable"])
def test_a_shared_jit_inside_each_of_several_checkpoints(policy: str) -> None:
    result = audit(_nested, X, policies=[policy]).results[0]
    by = _bytes_by_module(result)
    per_block = {k.split("/")[0]: v for k, v in by.items() if k}
    assert set(per_block) == {"block_0", "block_1", "block_2"}
    assert per_block["block_0"] == per_block["block_1"] == per_block["block_2"] > 0


LIBRARY = """\
import jax, jax.numpy as jnp

def body(x):
    return jnp.sin(jnp.sin(x) * 2.0)

ckpt = jax.checkpoint(body)
jitted = jax.jit(body)
"""

MODEL = """\
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).parent / "site-packages"))
import jax, jax.numpy as jnp
import mylib

def loss(x):
    a = mylib.ckpt(x)
    b = mylib.jitted(x)
    return jnp.sum(a + b)

def loss_inputs():
    return (jax.ShapeDtypeStruct((8,), jnp.float32),)
"""


def test_code_inside_a_librarys_own_body_is_placed_at_the_users_call(tmp_path: Path, monkeypatch: Any) -> None:
    """JAX may keep only the body's own frames in a body's tracebacks (a library's jitted or
    checkpointed function): the user's line is then the call's."""
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "mylib.py").write_text(LIBRARY)
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    from te_ckpt_audit import audit_target

    result = audit_target("model.py:loss", ["everything_saveable"]).results[0]
    lines = Counter(r.source.line for r in result.residuals if r.kind is ResidualKind.ACTIVATION and r.source)
    assert set(lines) == {7, 8}  # the calls of mylib.ckpt and mylib.jitted
    assert {r.source.file for r in result.residuals if r.source} == {"model.py"}
    assert {r.frame.file for r in result.residuals if r.frame and r.kind is ResidualKind.ACTIVATION} == {
        "site-packages/mylib.py"
    }


def test_an_einsum_spec_is_not_a_module() -> None:
    """`jnp.einsum` names its call by its spec (`bqd,bkd->bqk`): what it computes, not where; the
    module path is the enclosing scope's."""

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        with jax.named_scope("attn"):
            scores = jnp.einsum("bqd,bkd->bqk", x @ w, x)
        return jnp.sum(jnp.tanh(scores))

    f32 = jnp.float32
    report = audit(loss, jax.ShapeDtypeStruct((8, 8), f32), jax.ShapeDtypeStruct((2, 4, 8), f32), policies=["none"])
    modules = {e.module for e in report.equations if e.module}
    assert modules == {"attn"}
    assert {r.module for r in report.result("none").residuals if r.module} == {"attn"}
