"""Tunix's Llama 3 (a Flax NNX model from another library than Flax itself), tiny config, with its
own remat on: ``RematConfig.DECODER`` puts each decoder layer under ``nnx.remat`` with no policy
(as-is: JAX's default, nothing saveable but the layer's inputs). Grouped-query attention, RoPE,
SwiGLU, untied head.

The model takes no policy. Its hook, used by ``make_loss`` alone: ``flax.nnx.remat``, which each
layer looks up when it is called, is ``nnx.remat`` with the policy while the call runs;
``make_loss(None)`` builds the model with ``RematConfig.NONE`` (the same parameter tree).
Parameters come from ``nnx.eval_shape``: ShapeDtypeStructs, nothing downloaded.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from tunix.models.llama3 import model as _llama

REQUIRES = "tunix"
LAYERS, WIDTH, HIDDEN, HEADS, KV_HEADS, HEAD, VOCAB, SEQ, BATCH = 2, 64, 128, 4, 2, 16, 128, 16, 2

_CONFIG = _llama.ModelConfig(
    num_layers=LAYERS, vocab_size=VOCAB, embed_dim=WIDTH, hidden_dim=HIDDEN, num_heads=HEADS,
    head_dim=HEAD, num_kv_heads=KV_HEADS, rope_theta=10_000, norm_eps=1e-5,
    remat_config=_llama.RematConfig.DECODER,
)


def _graphdef(remat: Any) -> Any:
    config = dataclasses.replace(_CONFIG, remat_config=remat)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: _llama.Llama3(config, rngs=nnx.Rngs(0))))
    return graphdef


_WITH, _WITHOUT = _graphdef(_llama.RematConfig.DECODER), _graphdef(_llama.RematConfig.NONE)
_REMAT = nnx.remat


def _loss(graphdef: Any, state: Any, tokens: jax.Array) -> jax.Array:
    model = nnx.merge(graphdef, state)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    positions = jnp.broadcast_to(jnp.arange(SEQ), inputs.shape)
    causal = jnp.tril(jnp.ones((SEQ, SEQ), jnp.bool_))[None]
    logits, _ = model(inputs, positions, None, jnp.broadcast_to(causal, (BATCH, SEQ, SEQ)))
    return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, VOCAB) * jax.nn.log_softmax(logits), axis=-1))


def make_loss(policy: Callable[..., Any] | None) -> Callable[..., jax.Array]:
    """The target with every decoder layer's remat policy set to ``policy`` (None: no remat)."""
    if policy is None:
        return functools.partial(_loss, _WITHOUT)

    def loss(state: Any, tokens: jax.Array) -> jax.Array:
        nnx.remat = functools.partial(_REMAT, policy=policy)
        try:
            return _loss(_WITH, state, tokens)
        finally:
            nnx.remat = _REMAT

    return loss


def loss(state: Any, tokens: jax.Array) -> jax.Array:
    """As-is: the model's own remat, with JAX's default policy."""
    return _loss(_WITH, state, tokens)


def loss_inputs() -> tuple[Any, jax.ShapeDtypeStruct]:
    _, state = nnx.split(nnx.eval_shape(lambda: _llama.Llama3(_CONFIG, rngs=nnx.Rngs(0))))
    return state, jax.ShapeDtypeStruct((BATCH, SEQ + 1), jnp.int32)
