"""The library leaves Python's cyclic collector as the caller has it; the command line pauses it
while it traces and analyses, and gives it back as it was, also when the target fails. The
nothing_saveable baseline of the warnings is kept with the trace."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from te_ckpt_audit_cli.process import collector_paused

from te_ckpt_audit import Session, audit
from te_ckpt_audit.errors import TargetError
from te_ckpt_audit.trace._trace import trace

X = jax.ShapeDtypeStruct((4, 8), jnp.float32)
ROOT = Path(__file__).resolve().parent.parent


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


def test_the_library_leaves_the_collector_alone(collector: None) -> None:
    state: list[bool] = []
    audit(_seen(state), X, policies=["nothing_saveable"])
    assert state == [True]
    assert gc.isenabled()


def test_the_command_line_pauses_it_while_tracing(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import gc, sys, jax, jax.numpy as jnp\n"
        "def loss(x):\n    print('collector', gc.isenabled(), file=sys.stderr)\n"
        "    return jnp.sum(jnp.sin(jnp.sin(x)))\n"
        "def loss_inputs():\n    return (jax.ShapeDtypeStruct((4, 8), jnp.float32),)\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # PYTHONPATH: this checkout (conftest)
    run = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "m.py:loss", "-p", "none", "-f", "json"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "collector False" in run.stderr, run.stderr


def test_back_after_a_failing_target(collector: None) -> None:
    def broken(x):  # type: ignore[no-untyped-def]
        raise ValueError("boom")

    with pytest.raises((TargetError, ValueError)), collector_paused():
        audit(broken, X, policies=["nothing_saveable"])
    assert gc.isenabled()


def test_a_caller_who_turned_it_off_keeps_it_off(collector: None) -> None:
    gc.disable()
    with collector_paused():
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
