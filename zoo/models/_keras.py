"""Shared by the KerasHub targets: a causal LM built inside ``keras.RematScope(mode="activations")``
(Keras' own remat: every layer's activation function is rematerialised), called with
``stateless_call`` in training mode.

Why not ``mode="list_of_layers"`` over the transformer layers: Keras then wraps the layer's whole
``call`` in ``jax.checkpoint``, its ``training=True`` keyword becomes a tracer, and the layer's
dropout fails (``TracerBoolConversionError``) in JAX itself, te-ckpt-audit or not (keras 3.15.1).

Keras' remat has no policy argument: its JAX backend's ``remat(f)`` is ``jax.checkpoint(f)``. That
backend function is the hook: while the target traces it becomes ``jax.checkpoint(f,
policy=policy)``, or ``f`` itself for no remat.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
from keras.src import backend as keras_backend  # noqa: E402

LAYERS, SEQ, BATCH, VOCAB = 2, 16, 2, 128


def causal_lm(family: str, **config: Any) -> tuple[Callable[..., jax.Array], Callable[..., Any], Callable[[], Any]]:
    """KerasHub's `{family}CausalLM` over its `{family}Backbone` (two layers, dropout 0.1, the
    zoo's vocabulary), as the zoo's three callables: `loss`, `make_loss` and `loss_inputs`."""
    import keras_hub

    backbone = getattr(keras_hub.models, f"{family}Backbone")
    lm = getattr(keras_hub.models, f"{family}CausalLM")
    model = build(lambda: backbone(vocabulary_size=VOCAB, num_layers=LAYERS, dropout=0.1, **config), lm)
    return targets(model)


def build(make_backbone: Callable[[], Any], causal_lm: Any) -> Any:
    """The causal LM, its activations under Keras' remat."""
    with keras.RematScope(mode="activations"):
        return causal_lm(backbone=make_backbone(), preprocessor=None)


@contextlib.contextmanager
def remat_set_to(policy: Any) -> Iterator[None]:
    """While tracing: Keras' backend remat applies ``policy`` (a callable; None: no remat)."""
    saved = keras_backend.core.remat
    if policy is None:
        keras_backend.core.remat = lambda f: f
    else:
        keras_backend.core.remat = lambda f: jax.checkpoint(f, policy=policy)
    try:
        yield
    finally:
        keras_backend.core.remat = saved


def forward(model: Any, trainable: list[Any], non_trainable: list[Any], tokens: jax.Array) -> jax.Array:
    """Next-token cross-entropy, dropout on (``training=True``)."""
    inputs = {"token_ids": tokens[:, :-1], "padding_mask": jnp.ones((BATCH, SEQ), bool)}
    logits, _ = model.stateless_call(trainable, non_trainable, inputs, training=True)
    onehot = jax.nn.one_hot(tokens[:, 1:], VOCAB, dtype=logits.dtype)
    return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))


def targets(model: Any) -> tuple[Callable[..., jax.Array], Callable[..., Any], Callable[[], Any]]:
    """``loss``, ``make_loss`` and ``loss_inputs`` for one causal LM."""

    def loss(trainable: list[Any], non_trainable: list[Any], tokens: jax.Array) -> jax.Array:
        """Next-token cross-entropy with Keras' remat as built (``jax.checkpoint``, no policy)."""
        return forward(model, trainable, non_trainable, tokens)

    def make_loss(policy: Callable[..., Any] | None) -> Callable[..., jax.Array]:
        """The target with Keras' remat set to ``policy`` (None: no remat)."""

        def loss(trainable: list[Any], non_trainable: list[Any], tokens: jax.Array) -> jax.Array:
            with remat_set_to(policy):
                return forward(model, trainable, non_trainable, tokens)

        return loss

    return loss, make_loss, lambda: inputs(model)


def inputs(model: Any) -> tuple[list[jax.ShapeDtypeStruct], list[jax.ShapeDtypeStruct], jax.ShapeDtypeStruct]:
    """Variables as ShapeDtypeStructs (the dropout seed states among the non-trainable ones)."""
    spec = lambda v: jax.ShapeDtypeStruct(tuple(v.shape), v.value.dtype)
    return (
        [spec(v) for v in model.trainable_variables],
        [spec(v) for v in model.non_trainable_variables],
        jax.ShapeDtypeStruct((BATCH, SEQ + 1), jnp.int32),
    )
