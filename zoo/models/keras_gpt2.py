"""KerasHub's GPT-2 causal LM on the JAX backend, two layers, dropout 0.1, each transformer layer
under Keras' remat (``keras.RematScope``). ``make_loss(policy)`` sets the policy through Keras'
backend remat (``_keras.remat_set_to``). Keras builds its variables eagerly; the target sees them
as ShapeDtypeStructs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from zoo.models import _keras

REQUIRES = "keras_hub"

import keras_hub  # noqa: E402

_MODEL = _keras.build(
    lambda: keras_hub.models.GPT2Backbone(
        vocabulary_size=_keras.VOCAB,
        num_layers=_keras.LAYERS,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=128,
        dropout=0.1,
        max_sequence_length=_keras.SEQ,
    ),
    keras_hub.models.GPT2CausalLM,
)


def loss(trainable: list[Any], non_trainable: list[Any], tokens: jax.Array) -> jax.Array:
    """Next-token cross-entropy with Keras' remat as built (``jax.checkpoint``, no policy)."""
    return _keras.forward(_MODEL, trainable, non_trainable, tokens)


def make_loss(policy: Callable[..., Any] | None) -> Callable[..., jax.Array]:
    """The target with Keras' remat set to ``policy`` (None: no remat)."""

    def loss(trainable: list[Any], non_trainable: list[Any], tokens: jax.Array) -> jax.Array:
        with _keras.remat_set_to(policy):
            return _keras.forward(_MODEL, trainable, non_trainable, tokens)

    return loss


def loss_inputs() -> tuple[Any, ...]:
    return _keras.inputs(_MODEL)
