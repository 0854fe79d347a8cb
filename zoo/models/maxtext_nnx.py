"""MaxText's NNX Transformer (llama2 decoder block, layers scanned), in training mode with dropout,
remat policy ``minimal`` as configured. Parameters and the dropout stream's state are the abstract
NNX state of ``create_nnx_abstract_model`` (ShapeDtypeStructs).

``make_loss(policy)`` sets the policy through MaxText's own hook (``_maxtext.remat_set_to``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from maxtext.utils import model_creation_utils

from zoo.models import _maxtext as mt

REQUIRES = "maxtext"
_CFG = mt.config(scan_layers=True)
_MESH = mt.mesh(_CFG)
_GRAPHDEF, _STATE = nnx.split(model_creation_utils.create_nnx_abstract_model(_CFG, _MESH)[1])


def _forward(state: Any, tokens: jax.Array) -> jax.Array:
    model = nnx.merge(_GRAPHDEF, state)
    logits = model(tokens[:, :-1], mt.positions(), enable_dropout=True)
    return mt.cross_entropy(logits, tokens[:, 1:])


def make_loss(policy: Callable[..., Any] | None) -> Callable[..., jax.Array]:
    """The target with MaxText's remat policy set to ``policy`` (None: no remat)."""

    def loss(state: Any, tokens: jax.Array) -> jax.Array:
        with mt.remat_set_to(policy):
            return _forward(state, tokens)

    return loss


def loss(state: Any, tokens: jax.Array) -> jax.Array:
    """Next-token cross-entropy, MaxText's remat as configured (``remat_policy: minimal``)."""
    return _forward(state, tokens)


def loss_inputs() -> tuple[Any, jax.ShapeDtypeStruct]:
    return _STATE, jax.ShapeDtypeStruct((mt.BATCH, mt.SEQ + 1), jnp.int32)
