"""Haiku's ResNet-18 in training mode (batch norm updating its state), as a user writes it with
``hk.transform_with_state``: a conv net, the case where auditing six policies costs most against
one ``print_saved_residuals``. It has no checkpoints of its own; its hook wraps the whole loss in
one ``jax.checkpoint`` under the policy, as the audit's outer scope does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp

REQUIRES = "haiku"
BATCH, SIZE, CLASSES = 4, 64, 100


def _forward(images: jax.Array) -> jax.Array:
    return hk.nets.ResNet18(num_classes=CLASSES)(images, is_training=True)


_NET = hk.transform_with_state(_forward)


def loss(params: Any, state: Any, images: jax.Array, labels: jax.Array) -> jax.Array:
    logits, _ = _NET.apply(params, state, None, images)
    return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, CLASSES) * jax.nn.log_softmax(logits), -1))


def make_loss(policy: Any) -> Callable[..., jax.Array]:
    return loss if policy is None else jax.checkpoint(loss, policy=policy)


def loss_inputs() -> tuple[Any, ...]:
    images = jax.ShapeDtypeStruct((BATCH, SIZE, SIZE, 3), jnp.float32)
    params, state = jax.eval_shape(lambda: _NET.init(jax.random.key(0), jnp.zeros(images.shape, images.dtype)))
    return params, state, images, jax.ShapeDtypeStruct((BATCH,), jnp.int32)
