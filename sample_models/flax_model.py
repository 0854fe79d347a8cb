"""A Flax linen transformer: ``nn.scan`` over ``nn.remat``-wrapped blocks (or, with
``-D scan=False``, the same blocks unrolled: one module, and one traced body, per layer).

The remat policy is a module attribute (default ``dots_with_no_batch_dims_saveable``);
``make_loss(policy)`` swaps it. Parameters come from ``jax.eval_shape(model.init, ...)``
inside ``loss_inputs``: the documented Flax recipe for auditing without allocating.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from sample_models._batch import batch_input

Policy = Callable[..., Any]
DEFAULT_POLICY: Policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


@dataclasses.dataclass(frozen=True)
class Config:
    """Static model settings (hashable, passed as a static positional argument)."""

    layers: int
    d_model: int
    heads: int
    d_ff: int
    vocab: int
    dtype: str = "float32"
    scan: bool = True


class Block(nn.Module):
    """Pre-LN decoder block; scan carry is the residual stream."""

    cfg: Config

    @nn.compact
    def __call__(self, x: jax.Array, _: None) -> tuple[jax.Array, None]:
        cfg, dt = self.cfg, jnp.dtype(self.cfg.dtype)
        dense = lambda n, name: nn.Dense(n, use_bias=False, dtype=dt, param_dtype=dt, name=name)
        b, s, d = x.shape
        h = nn.LayerNorm(dtype=dt, param_dtype=dt)(x)
        qkv = checkpoint_name(dense(3 * d, "qkv")(h), "qkv_proj")
        q, k, v = (t.reshape(b, s, cfg.heads, d // cfg.heads) for t in jnp.split(qkv, 3, -1))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // cfg.heads).astype(dt)
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, jnp.finfo(dt).min)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(dt)
        ctx = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d), "context")
        x = x + checkpoint_name(dense(d, "out")(ctx), "out_proj")
        h = nn.LayerNorm(dtype=dt, param_dtype=dt)(x)
        h = jax.nn.gelu(checkpoint_name(dense(cfg.d_ff, "ffn1")(h), "ffn1"))
        return x + checkpoint_name(dense(d, "ffn2")(h), "ffn2"), None


class Transformer(nn.Module):
    """Embeddings, a scanned stack of remat'd blocks, and logits."""

    cfg: Config
    policy: Policy | None = DEFAULT_POLICY  # None: no remat at all

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg, dt = self.cfg, jnp.dtype(self.cfg.dtype)
        x = nn.Embed(cfg.vocab, cfg.d_model, dtype=dt, param_dtype=dt)(tokens)
        block = Block if self.policy is None else nn.remat(Block, policy=self.policy, prevent_cse=False)
        if cfg.scan:
            stack = nn.scan(block,
                            variable_axes={"params": 0}, split_rngs={"params": True},
                            length=cfg.layers)
            x, _ = stack(cfg, name="layers")(x, None)
        else:
            for i in range(cfg.layers):
                x, _ = block(cfg, name=f"block_{i}")(x, None)
        x = nn.LayerNorm(dtype=dt, param_dtype=dt)(x)
        return nn.Dense(cfg.vocab, use_bias=False, dtype=dt, param_dtype=dt)(x)


def make_loss(policy: Policy | None = DEFAULT_POLICY) -> Callable[[Any, jax.Array, Config], jax.Array]:
    """Return the target with the blocks' remat policy set to ``policy`` (None: no remat)."""

    def loss(params: Any, tokens: jax.Array, cfg: Config) -> jax.Array:
        """Next-token cross-entropy."""
        logits = Transformer(cfg, policy).apply(params, tokens)
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

    return loss


loss = make_loss()


def loss_inputs(layers: int = 2, batch: int = 2, seq: int = 16, d_model: int = 64,
                heads: int = 4, d_ff: int = 256, vocab: int = 128,
                dtype: str = "float32", scan: bool = True, mesh: Any = None,
                ) -> tuple[Any, jax.ShapeDtypeStruct, Config]:
    """Shapes only: (params from jax.eval_shape(model.init, ...), tokens, cfg)."""
    cfg = Config(layers=layers, d_model=d_model, heads=heads, d_ff=d_ff, vocab=vocab, dtype=dtype, scan=scan)
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    # eval_shape traces init abstractly: params are ShapeDtypeStructs, nothing is allocated.
    params = jax.eval_shape(Transformer(cfg).init, jax.random.key(0), tokens)
    return params, batch_input((batch, seq), jnp.int32, mesh), cfg
