"""The cyclic collector is paused while a trace is made and analysed, and given back as it was,
also when the target fails; the nothing_saveable baseline of the warnings is kept with the trace."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import pytest

from te_ckpt_audit import Session, audit
from te_ckpt_audit._trace import trace
from te_ckpt_audit.errors import TargetError

X = jax.ShapeDtypeStruct((4, 8), jnp.float32)


@pytest.fixture
def collector() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def _seen(state: list[bool]):  # type: ignore[no-untyped-def]
    def f(x):  # type: ignore[no-untyped-def]
        state.append(gc.isenabled())
        return jnp.sum(jax.checkpoint(lambda y: jnp.sin(jnp.sin(y)))(x))

    return f


def test_paused_while_tracing_and_back_after(collector: None) -> None:
    state: list[bool] = []
    audit(_seen(state), X, policies=["nothing_saveable"])
    assert state == [False]
    assert gc.isenabled()


def test_back_after_a_failing_target(collector: None) -> None:
    def broken(x):  # type: ignore[no-untyped-def]
        raise ValueError("boom")

    with pytest.raises((TargetError, ValueError)):
        audit(broken, X, policies=["nothing_saveable"])
    assert gc.isenabled()


def test_a_caller_who_turned_it_off_keeps_it_off(collector: None) -> None:
    gc.disable()
    audit(_seen([]), X, policies=["nothing_saveable"])
    assert not gc.isenabled()


def test_the_warnings_baseline_is_analysed_once_per_session(monkeypatch: pytest.MonkeyPatch) -> None:
    import te_ckpt_audit._session as s

    calls: list[str] = []
    real = s.analyse_policy
    monkeypatch.setattr(s, "analyse_policy", lambda t, spec, sc: calls.append(spec.text) or real(t, spec, sc))
    session = Session(trace(_seen([]), (X,)))
    policies = ["checkpoint_dots", "dots_saveable", "checkpoint_dots_and_te_gemms"]
    for policy in policies:  # each saves nothing here: compared against nothing_saveable each time
        (result,) = session.report([policy]).results
        assert [x.code.value for x in result.warnings] == ["same-as-nothing-saveable"]
    assert calls == [policies[0], "nothing_saveable", *policies[1:]]
