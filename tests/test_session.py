"""The session: one JAX linearization per policy and run, whatever steps reuse it (per-device bytes
on a mesh, warnings, a search), and one report made the same way for every client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import te_ckpt_audit._jax_compat as jc
from te_ckpt_audit import (
    Session,
    ShardingSource,
    TargetError,
    UsageError,
    audit_target,
    parse_mesh,
    recommend,
    recommend_target,
)
from te_ckpt_audit.specs import resolve_policy

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def linearizations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every call of the linearization `jax.vjp` uses (one per analysed policy, if nothing repeats)."""
    calls: list[int] = []
    real = jc.linearize_for_vjp
    monkeypatch.setattr(jc, "linearize_for_vjp", lambda *a, **k: calls.append(1) or real(*a, **k))
    yield calls


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def test_audit_linearizes_each_policy_once(linearizations: list[int]) -> None:
    report = audit_target("sample_models/gpt.py:loss", defines={"layers": 2})
    assert [r.policy for r in report.results][:2] == ["as-is", "none"]  # its own checkpoints come first
    assert len(report.results) == 7
    assert len(linearizations) == 7  # nothing_saveable, in the set, is the warnings' baseline too


def test_the_default_set_puts_as_is_first_only_where_the_model_has_checkpoints() -> None:
    assert audit_target("sample_models/mlp.py:loss").results[0].policy == "none"  # no checkpoints of its own
    with_own = audit_target("sample_models/flax_model.py:loss").results
    assert [r.policy for r in with_own][:2] == ["as-is", "none"]


def test_the_mesh_reuses_the_analysis(linearizations: list[int]) -> None:
    report = audit_target("sample_models/megatron_tp.py:loss", mesh="data=2,model=4")
    assert report.mesh == parse_mesh("data=2,model=4") and report.sharding_source is ShardingSource.COMPILED
    assert all(r.totals.activation_bytes_per_device is not None for r in report.results)
    assert len(linearizations) == len(report.results) == 6  # before the session: 12


def test_recommend_linearizes_each_candidate_once(linearizations: list[int]) -> None:
    rec = recommend_target("sample_models/megatron_tp.py:loss", 1 << 20, mesh="data=2,model=4")
    assert len(linearizations) == len(rec.evaluated)  # before the session: twice as many on a mesh
    assert rec.report.sharding_source is ShardingSource.COMPILED and rec.report.mesh == rec.mesh


def test_a_session_keeps_every_analysis(linearizations: list[int]) -> None:
    session = Session.of_target("sample_models/eight_names.py:loss", defines={"layers": "4"})
    first = session.report(["nothing_saveable", "checkpoint_dots"])
    again = session.report(["checkpoint_dots", "nothing_saveable"])
    assert len(linearizations) == 2
    assert first.results == tuple(reversed(again.results))
    rec = recommend(session, 3328)  # the search reuses what the audits analysed
    assert len(linearizations) == len(rec.evaluated)
    assert session.result(resolve_policy("checkpoint_dots")) is session.result(resolve_policy("checkpoint_dots"))


def test_a_policy_jax_cannot_differentiate_under_is_tried_once(linearizations: list[int]) -> None:
    import jax
    import jax.numpy as jnp

    def loss(x: jax.Array) -> jax.Array:  # remat's reduce_precision refuses complex values
        z = jnp.exp(1j * x.astype(jnp.complex64))
        return jnp.real(jnp.sum(z * z))

    session = Session.of_function(loss, jax.ShapeDtypeStruct((4,), jnp.float32))
    report = session.report(["everything_saveable", "none"])
    assert report.results[0].error is not None and report.results[1].error is None
    with pytest.raises(TargetError, match="reduce_precision"):  # under no policy at all: the target fails
        session.report(["everything_saveable"])
    assert len(linearizations) == 2


def test_as_is_of_a_model_without_checkpoints_is_plain_autodiffs_linearization() -> None:
    """Without checkpoints of its own, the model as it is is plain autodiff: its row is that one
    linearization's, relabelled, and equal to a linearization of its own."""
    import dataclasses

    from te_ckpt_audit.analysis._analysis import analyse_policy
    from te_ckpt_audit.specs import AsIs

    for model in ("mlp", "fp8_block", "eight_names"):
        session = Session.of_target(f"sample_models/{model}.py:loss")
        shared = session.report(["none", "as-is"]).results[1]
        alone = analyse_policy(Session.of_target(f"sample_models/{model}.py:loss")._traced, AsIs()).result
        assert shared.policy == "as-is" and dataclasses.replace(shared, warnings=()) == alone


def test_a_session_takes_defines_as_values_or_as_the_command_line_types_them() -> None:
    """`Session.of_target(defines={"layers": 4})` raised TypeError ('int' object is not subscriptable)
    where audit_target took the same mapping: every entry point takes {key: value} or ["key=value"]."""
    shapes = []
    for defines in ({"layers": 4}, {"layers": "4"}, ["layers=4"]):
        session = Session.of_target("sample_models/eight_names.py:loss", defines=defines)
        shapes.append(session.report(["checkpoint_dots"]).results[0].totals.activation_bytes)
    assert shapes[0] == shapes[1] == shapes[2]
    eight = Session.of_target("sample_models/eight_names.py:loss").report(["checkpoint_dots"]).results[0]
    assert 0 < shapes[0] < eight.totals.activation_bytes
    with pytest.raises(UsageError, match="not an int"):
        Session.of_target("sample_models/eight_names.py:loss", defines={"layers": 2.5})
