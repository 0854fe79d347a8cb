"""A small Equinox ViT in training mode: attention and MLP dropout on, one example at a time under
``jax.vmap`` (Equinox's idiom), each block under ``eqx.filter_checkpoint``. Its hook is the policy
given to ``filter_checkpoint`` (as-is: save only the MLP's hidden activation, named
``mlp_hidden``). Parameters come from ``eqx.filter_eval_shape``; the dropout key is a typed
``jax.random.key``, split per example and per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

REQUIRES = "equinox"
AS_IS = jax.checkpoint_policies.save_only_these_names("mlp_hidden")
LAYERS, WIDTH, HEADS, MLP, PATCH, IMAGE, CHANNELS, CLASSES, BATCH, DROPOUT = 2, 64, 4, 128, 4, 16, 3, 10, 2, 0.1
_NO_REMAT = object()


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear
    drop: eqx.nn.Dropout

    def __init__(self, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.norm1 = eqx.nn.LayerNorm(WIDTH)
        self.attn = eqx.nn.MultiheadAttention(HEADS, WIDTH, dropout_p=DROPOUT, key=k1)
        self.norm2 = eqx.nn.LayerNorm(WIDTH)
        self.up = eqx.nn.Linear(WIDTH, MLP, key=k2)
        self.down = eqx.nn.Linear(MLP, WIDTH, key=k3)
        self.drop = eqx.nn.Dropout(DROPOUT)

    def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
        k1, k2, k3 = jax.random.split(key, 3)
        h = jax.vmap(self.norm1)(x)
        x = x + self.attn(h, h, h, key=k1, inference=False)
        h = checkpoint_name(jax.nn.gelu(jax.vmap(self.up)(jax.vmap(self.norm2)(x))), "mlp_hidden")
        h = self.drop(h, key=k2, inference=False)
        return x + self.drop(jax.vmap(self.down)(h), key=k3, inference=False)


class ViT(eqx.Module):
    patches: eqx.nn.Conv2d
    cls: jax.Array
    pos: jax.Array
    blocks: list[Block]
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        keys = jax.random.split(key, LAYERS + 4)
        n = (IMAGE // PATCH) ** 2
        self.patches = eqx.nn.Conv2d(CHANNELS, WIDTH, PATCH, stride=PATCH, key=keys[0])
        self.cls = jax.random.normal(keys[1], (1, WIDTH))
        self.pos = jax.random.normal(keys[2], (n + 1, WIDTH)) * 0.02
        self.blocks = [Block(k) for k in keys[4:]]
        self.norm = eqx.nn.LayerNorm(WIDTH)
        self.head = eqx.nn.Linear(WIDTH, CLASSES, key=keys[3])

    def __call__(self, image: jax.Array, key: jax.Array, policy: Any) -> jax.Array:
        x = self.patches(image).reshape(WIDTH, -1).T
        x = jnp.concatenate([self.cls, x]) + self.pos
        for block, k in zip(self.blocks, jax.random.split(key, LAYERS), strict=True):
            call = block if policy is _NO_REMAT else eqx.filter_checkpoint(block, policy=policy)
            x = call(x, k)
        return self.head(self.norm(x[0]))


_ABSTRACT = eqx.filter_eval_shape(ViT, jax.random.key(0))
_PARAMS, _STATIC = eqx.partition(_ABSTRACT, lambda leaf: isinstance(leaf, jax.ShapeDtypeStruct))


def make_loss(policy: Callable[..., Any] | None) -> Callable[..., jax.Array]:
    """The target with every block's ``filter_checkpoint`` policy set to ``policy`` (None: none)."""
    chosen = _NO_REMAT if policy is None else policy

    def loss(params: Any, images: jax.Array, labels: jax.Array, key: jax.Array) -> jax.Array:
        model = eqx.combine(params, _STATIC)
        keys = jax.random.split(key, images.shape[0])
        logits = jax.vmap(lambda image, k: model(image, k, chosen))(images, keys)
        onehot = jax.nn.one_hot(labels, CLASSES)
        return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))

    return loss


loss = make_loss(AS_IS)


def loss_inputs() -> tuple[Any, ...]:
    images = jax.ShapeDtypeStruct((BATCH, CHANNELS, IMAGE, IMAGE), jnp.float32)
    labels = jax.ShapeDtypeStruct((BATCH,), jnp.int32)
    return _PARAMS, images, labels, jax.eval_shape(lambda: jax.random.key(0))
