"""transformers' Flax BERT (4.57, the last release with Flax classes) for masked LM, in training mode
(dropout 0.1), with the model's own gradient checkpointing on: each ``FlaxBertLayer`` under
``flax.linen.partitioning.remat`` with JAX's default policy (as-is: nothing saveable but the
layer's inputs).

The model takes no policy. Its hook, used by ``make_loss`` alone: the module global
``modeling_flax_bert.remat``, read when the layer stack is set up at apply time, is swapped for
``remat`` with the policy while the call runs; ``make_loss(None)`` uses the same model built with
``gradient_checkpointing=False`` (the same parameter tree). Parameters come from
``jax.eval_shape`` of ``init_weights``: nothing is downloaded.

transformers 5 has no Flax: where it is installed (the MaxText lanes), this model skips.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("USE_TORCH", "0")  # transformers 4.57 imports no torch with these
os.environ.setdefault("USE_FLAX", "1")

import jax
import jax.numpy as jnp
import transformers.models.bert.modeling_flax_bert as _flax_bert

REQUIRES = "transformers.models.bert.modeling_flax_bert"
LAYERS, WIDTH, HEADS, FF, VOCAB, SEQ, BATCH = 2, 64, 4, 128, 128, 16, 2

_CONFIG = _flax_bert.BertConfig(
    vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
    intermediate_size=FF, max_position_embeddings=64,
)
_REMAT = _flax_bert.remat


def _model(checkpointing: bool) -> Any:
    return _flax_bert.FlaxBertForMaskedLM(
        _CONFIG, input_shape=(BATCH, SEQ), _do_init=False, gradient_checkpointing=checkpointing
    )


_WITH, _WITHOUT = _model(True), _model(False)


def _loss(model: Any, params: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
    logits = model(tokens, params=params, dropout_rng=key, train=True).logits
    labels = jax.nn.one_hot(tokens, VOCAB)
    return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))


def make_loss(policy: Callable[..., Any] | None) -> Callable[..., jax.Array]:
    """The target with every layer's remat policy set to ``policy`` (None: no remat)."""
    if policy is None:
        return functools.partial(_loss, _WITHOUT)

    def loss(params: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
        _flax_bert.remat = functools.partial(_REMAT, policy=policy)
        try:
            return _loss(_WITH, params, tokens, key)
        finally:
            _flax_bert.remat = _REMAT

    return loss


def loss(params: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
    """As-is: the model's own remat, with JAX's default policy."""
    return _loss(_WITH, params, tokens, key)


def loss_inputs() -> tuple[Any, jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    params = jax.eval_shape(lambda: _WITH.init_weights(jax.random.PRNGKey(0), (BATCH, SEQ)))
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32)
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    return params, tokens, key
