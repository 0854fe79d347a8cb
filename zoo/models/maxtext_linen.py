"""MaxText through its Linen API (``transformer_as_linen``, with ``enable_nnx: false`` where it exists: the pure
Linen decoder up to MaxText 0.2.4, the NNX decoder behind ``ToLinen`` from 0.2.5), layers not
scanned, in training mode with dropout (a raw uint32 key in ``rngs``), remat policy ``minimal`` as
configured. Parameters come from ``jax.eval_shape(model.init, ...)``.

``make_loss(policy)`` sets the policy through MaxText's own hook (``_maxtext.remat_set_to``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from maxtext.models import models

from zoo.models import _maxtext as mt

REQUIRES = "maxtext"
_CFG = mt.config(scan_layers=False, enable_nnx=False, pure_nnx=False, pure_nnx_decoder=False)
_MESH = mt.mesh(_CFG)
_MODEL = models.transformer_as_linen(_CFG, _MESH, quant=None)
_TOKENS = jax.ShapeDtypeStruct((mt.BATCH, mt.SEQ + 1), jnp.int32)


def _forward(params: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
    logits = _MODEL.apply(
        params, tokens[:, :-1], mt.positions(), enable_dropout=True, rngs={"dropout": key, "aqt": key}
    )
    return mt.cross_entropy(logits, tokens[:, 1:])


def make_loss(policy: Callable[..., Any] | None) -> Callable[..., jax.Array]:
    """The target with MaxText's remat policy set to ``policy`` (None: no remat)."""

    def loss(params: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
        with mt.remat_set_to(policy):
            return _forward(params, tokens, key)

    return loss


def loss(params: Any, tokens: jax.Array, key: jax.Array) -> jax.Array:
    """Next-token cross-entropy, MaxText's remat as configured (``remat_policy: minimal``)."""
    return _forward(params, tokens, key)


def loss_inputs() -> tuple[Any, jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    init = lambda k, t: _MODEL.init({"params": k, "dropout": k, "aqt": k}, t[:, :-1], mt.positions())
    params = jax.eval_shape(init, key, _TOKENS)
    return params, _TOKENS, key
