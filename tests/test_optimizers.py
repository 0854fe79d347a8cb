"""The optimizer the user names is the one compiled (issue 56, item 1): `sgd` is optax's sgd, with
no state; momentum is a choice of its own; a name is parsed or refused, never defaulted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest

from te_ckpt_audit import UsageError
from te_ckpt_audit.gpus import GpuRequest, gpu_model
from te_ckpt_audit.optimizers import Optimizer, optax_update, state_bytes
from te_ckpt_audit.tpus import TpuRequest, parse_tpu

W = jax.ShapeDtypeStruct((256, 128), jnp.float32)  # 128 KiB
B = jax.ShapeDtypeStruct((64,), jnp.bfloat16)  # 128 B


def _optax_state_bytes(update: optax.GradientTransformation) -> int:
    state = jax.eval_shape(update.init, [W, B])
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(state))


@pytest.mark.parametrize(("kind", "expected"), [
    (Optimizer.SGD, 0),  # optax.sgd(lr): no state at all
    (Optimizer.MOMENTUM, 256 * 128 * 4 + 64 * 2),  # one buffer per parameter, in its dtype
    (Optimizer.ADAM, 2 * (256 * 128 * 4 + 64 * 2) + 4),  # two moments and an int32 count
    (Optimizer.ADAMW, 2 * (256 * 128 * 4 + 64 * 2) + 4),
])
def test_each_update_keeps_the_state_optax_gives_it(kind: Optimizer, expected: int) -> None:
    assert state_bytes(kind, [W, B]) == expected


def test_sgd_is_optax_sgd_without_momentum_and_momentum_is_its_own_choice() -> None:
    assert state_bytes(Optimizer.SGD, [W, B]) == _optax_state_bytes(optax.sgd(1e-3)) == 0
    assert state_bytes(Optimizer.MOMENTUM, [W, B]) == _optax_state_bytes(optax.sgd(1e-3, momentum=0.9))
    assert state_bytes(Optimizer.ADAFACTOR, [W, B]) == _optax_state_bytes(optax.adafactor(1e-3))


@pytest.mark.parametrize("name", list(Optimizer))
def test_every_name_builds_its_own_update(name: Optimizer) -> None:
    """No member falls through to another's update (the old chain ended in Adafactor)."""
    update = optax_update(name)
    made = jax.eval_shape(update.init, [W])  # type: ignore[attr-defined]
    reference = {Optimizer.SGD: optax.sgd(1e-3), Optimizer.MOMENTUM: optax.sgd(1e-3, momentum=0.9),
                 Optimizer.ADAM: optax.adam(1e-3), Optimizer.ADAMW: optax.adamw(1e-3),
                 Optimizer.ADAFACTOR: optax.adafactor(1e-3)}[name]
    assert jax.tree_util.tree_structure(made) == jax.tree_util.tree_structure(jax.eval_shape(reference.init, [W]))


@pytest.mark.parametrize(("given", "parsed"), [("adamw", Optimizer.ADAMW), ("SGD", Optimizer.SGD),
                                               (" momentum ", Optimizer.MOMENTUM), (Optimizer.ADAM, Optimizer.ADAM)])
def test_a_request_parses_an_optimizers_name(given: str | Optimizer, parsed: Optimizer) -> None:
    assert TpuRequest(parse_tpu("v5e"), optimizer=given).optimizer is parsed  # type: ignore[arg-type]
    assert GpuRequest(gpu_model("h100"), optimizer=given).optimizer is parsed  # type: ignore[arg-type]


@pytest.mark.parametrize("given", ["sgdd", "", "adam_w", 3, b"adamw"])
def test_a_request_refuses_any_other_optimizer_in_one_line(given: object) -> None:
    for make in (lambda: TpuRequest(parse_tpu("v5e"), optimizer=given),  # type: ignore[arg-type]
                 lambda: GpuRequest(gpu_model("h100"), optimizer=given)):  # type: ignore[arg-type]
        with pytest.raises(UsageError) as err:
            make()
        assert err.value.message.startswith("optimizer ")
        assert err.value.message.endswith(" is not one of sgd, momentum, adam, adamw, adafactor")
