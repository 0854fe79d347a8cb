"""Shared by the MaxText targets: a tiny config, MaxText's own remat hook, and the loss.

MaxText picks its remat policy in the decoder's ``get_remat_policy`` (from the ``remat_policy``
config: ``full``, ``minimal``, ``save_qkv_proj``, ...). Any other policy is set through the same
hook: the decoder class's ``get_remat_policy`` returns it while the target traces. No config turns
MaxText's remat off, so ``None`` (plain autodiff) makes the decoder's own ``jax.checkpoint`` /
``nn.remat`` call sites pass the layer through unchanged.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import maxtext.configs
from maxtext.configs import pyconfig
from maxtext.layers import nnx_decoders, nnx_scan
from maxtext.utils import maxtext_utils

AS_IS = "minimal"  # the config's remat_policy for the target as written
LAYERS, WIDTH, HEADS, HEAD_DIM, MLP, VOCAB, SEQ, BATCH, DROPOUT = 2, 64, 4, 16, 128, 128, 16, 2, 0.1


def config(**overrides: Any) -> Any:
    """A two-layer llama2-style MaxText config on CPU, dropout on, nothing to download. Overrides
    that this MaxText's base.yml does not know are left out (0.2.5 dropped the NNX switches: its
    decoder is NNX only)."""
    base = os.path.join(os.path.dirname(maxtext.configs.__file__), "base.yml")
    with open(base) as f:
        known = {line.split(":", 1)[0] for line in f if line[:1].isalpha()}
    settings: dict[str, Any] = {
        "run_name": "zoo",
        "hardware": "cpu",
        "skip_jax_distributed_system": True,
        "enable_checkpointing": False,
        "base_emb_dim": WIDTH,
        "base_num_query_heads": HEADS,
        "base_num_kv_heads": HEADS,
        "head_dim": HEAD_DIM,
        "base_mlp_dim": MLP,
        "base_num_decoder_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_target_length": SEQ,
        "per_device_batch_size": BATCH,
        "dropout_rate": DROPOUT,
        "enable_dropout": True,
        "attention": "dot_product",
        "dtype": "float32",
        "remat_policy": AS_IS,
        **{k: v for k, v in overrides.items() if k in known},
    }
    return pyconfig.initialize([None, base] + [f"{k}={v}" for k, v in settings.items()])


def mesh(cfg: Any) -> Any:
    return maxtext_utils.get_mesh_from_config(cfg)


class _JaxWithoutCheckpoint(types.ModuleType):
    """``jax`` as a MaxText module sees it, with ``jax.checkpoint`` a pass-through (no remat)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jax, name)

    @staticmethod
    def checkpoint(fun: Callable[..., Any], **_: Any) -> Callable[..., Any]:
        return fun


def _linen_decoder() -> Any:
    try:  # MaxText <= 0.2.4: the pure Linen decoder
        from maxtext.layers import decoders
    except ImportError:
        return None
    return decoders.Decoder


@contextlib.contextmanager
def remat_set_to(policy: Any) -> Iterator[None]:
    """While tracing: MaxText's decoders use ``policy`` (a callable; None removes their remat)."""
    patches: list[tuple[Any, str, Any]] = [(nnx_decoders.NNXDecoder, "get_remat_policy", lambda self: policy)]
    linen = _linen_decoder()
    if linen is not None:
        patches.append((linen, "get_remat_policy", lambda self: policy))
    if policy is None:
        patches.append((nnx_decoders, "jax", _JaxWithoutCheckpoint("jax")))
        patches.append((nnx_scan, "jax", _JaxWithoutCheckpoint("jax")))
        if linen is not None:
            patches.append((linen, "set_remat_policy", lambda self, layers, _: list(layers)))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    onehot = jax.nn.one_hot(labels, VOCAB, dtype=logits.dtype)
    return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))


def positions() -> jax.Array:
    return jnp.broadcast_to(jnp.arange(SEQ), (BATCH, SEQ))
