"""RecurrentGemma's Griffin (Flax Linen): two recurrent (RG-LRU) blocks and one local-attention
block, with the library's own remat (``gradient_checkpointing=True``: ``nn.remat`` of each
residual block, JAX's default policy). Griffin has no dropout; the target drops out logits before
the loss (training mode, a raw uint32 key), so a PRNG key is in the traced program all the same.

Griffin's hook is ``gradient_checkpointing`` (``make_loss(None)`` turns it off); a policy goes to
the ``nn.remat`` call Griffin makes in its ``setup``, which sees ``flax.linen`` as its module-level
``nn``: while the target traces, that ``nn.remat`` is ``nn.remat(..., policy=policy)``.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

REQUIRES = "recurrentgemma"

from recurrentgemma import jax as rg  # noqa: E402
from recurrentgemma.jax import griffin as griffin_module  # noqa: E402

SEQ, BATCH, VOCAB, DROPOUT = 16, 2, 128, 0.1
_CONFIG = rg.GriffinConfig(
    vocab_size=VOCAB,
    width=64,
    mlp_expanded_width=128,
    num_heads=4,
    block_types=(rg.TemporalBlockType.RECURRENT, rg.TemporalBlockType.RECURRENT, rg.TemporalBlockType.ATTENTION),
    embeddings_scale_by_sqrt_dim=True,
    attention_window_size=8,
    logits_soft_cap=30.0,
    scan_type=rg.ScanType.LINEAR_NATIVE,
)
_TOKENS = jax.ShapeDtypeStruct((BATCH, SEQ + 1), jnp.int32)


class _LinenWithPolicy(types.ModuleType):
    """``flax.linen`` as Griffin's module sees it, with ``nn.remat`` given ``policy``."""

    def __init__(self, policy: Callable[..., Any]) -> None:
        super().__init__("flax.linen")
        self.remat = functools.partial(nn.remat, policy=policy)

    def __getattr__(self, name: str) -> Any:
        return getattr(nn, name)


@contextlib.contextmanager
def remat_set_to(policy: Callable[..., Any]) -> Iterator[None]:
    saved = griffin_module.nn
    griffin_module.nn = _LinenWithPolicy(policy)
    try:
        yield
    finally:
        griffin_module.nn = saved


def _forward(model: Any, params: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
    positions = jnp.broadcast_to(jnp.arange(SEQ), (BATCH, SEQ))
    logits, _ = model.apply(params, tokens[:, :-1], positions, return_cache=False)
    keep = jax.random.bernoulli(key, 1.0 - DROPOUT, logits.shape)
    logits = jnp.where(keep, logits / (1.0 - DROPOUT), 0.0)
    onehot = jax.nn.one_hot(tokens[:, 1:], VOCAB, dtype=logits.dtype)
    return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))


def make_loss(policy: Callable[..., Any] | None) -> Callable[..., jax.Array]:
    """The target with Griffin's remat set to ``policy`` (None: ``gradient_checkpointing=False``)."""

    def loss(params: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
        if policy is None:
            return _forward(rg.Griffin(_CONFIG, gradient_checkpointing=False), params, tokens, key)
        with remat_set_to(policy):
            return _forward(rg.Griffin(_CONFIG), params, tokens, key)

    return loss


def loss(params: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
    """Next-token cross-entropy, Griffin's remat as the library sets it up."""
    return _forward(rg.Griffin(_CONFIG), params, tokens, key)


def loss_inputs() -> tuple[Any, ...]:
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    positions = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32)
    init = lambda k, t, p: rg.Griffin(_CONFIG).init(k, t[:, :-1], p, return_cache=False)
    return jax.eval_shape(init, key, _TOKENS, positions), _TOKENS, key
