"""A Flax NNX decoder in training mode: attention and residual dropout on, each block under
``nnx.remat``. Its hook is the policy passed to ``nnx.remat`` (as-is: JAX's
``dots_with_no_batch_dims_saveable``); ``make_loss(None)`` calls the blocks without remat.

Parameters and the dropout stream's state come from ``nnx.eval_shape``: ShapeDtypeStructs, the
dropout key among them (a typed ``key<fry>``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

REQUIRES = "flax"
AS_IS = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
LAYERS, WIDTH, HEADS, FF, VOCAB, SEQ, BATCH, DROPOUT = 2, 64, 4, 128, 128, 16, 2, 0.1
_NO_REMAT = object()


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm1 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(HEADS, WIDTH, dropout_rate=DROPOUT, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.up = nnx.Linear(WIDTH, FF, rngs=rngs)
        self.down = nnx.Linear(FF, WIDTH, rngs=rngs)
        self.drop = nnx.Dropout(DROPOUT)

    def __call__(self, x: jax.Array, rngs: nnx.Rngs) -> jax.Array:
        mask = nnx.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        h = self.attn(self.norm1(x), mask=mask, deterministic=False, rngs=rngs)
        x = x + self.drop(h, deterministic=False, rngs=rngs)
        h = self.down(jax.nn.gelu(self.up(self.norm2(x))))
        return x + self.drop(h, deterministic=False, rngs=rngs)


class Decoder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
        self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)

    def __call__(self, tokens: jax.Array, rngs: nnx.Rngs, policy: Any) -> jax.Array:
        x = self.embed(tokens)
        for block in self.blocks:
            if policy is _NO_REMAT:
                x = block(x, rngs)
            else:
                x = nnx.remat(lambda b, y, r: b(y, r), policy=policy)(block, x, rngs)
        return self.embed.attend(self.norm(x))


_GRAPHDEF, _ = nnx.split(nnx.eval_shape(lambda: Decoder(nnx.Rngs(0))))


def make_loss(policy: Callable[..., Any] | None) -> Callable[..., jax.Array]:
    """The target with every block's ``nnx.remat`` policy set to ``policy`` (None: no remat)."""
    chosen = _NO_REMAT if policy is None else policy

    def loss(state: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
        model = nnx.merge(_GRAPHDEF, state)
        logits = model(tokens[:, :-1], nnx.Rngs(dropout=key), chosen)
        labels = jax.nn.one_hot(tokens[:, 1:], VOCAB)
        return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))

    return loss


loss = make_loss(AS_IS)


def loss_inputs() -> tuple[Any, jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    _, state = nnx.split(nnx.eval_shape(lambda: Decoder(nnx.Rngs(0))))
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ + 1), jnp.int32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    return state, tokens, key
