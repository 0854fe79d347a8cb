"""A 3-layer MLP with no internal checkpointing: the simplest target to audit.

With no remat inside, the tool's ``auto`` scope wraps the whole loss in one
``jax.checkpoint``; ``jax.ad_checkpoint.checkpoint_name`` tags let name policies bite.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from sample_models._batch import batch_input

Params = dict[str, jax.Array]


def make_loss() -> Callable[[Params, jax.Array], jax.Array]:
    """Return the target; no internal remat, so there is no policy to replace."""

    def loss(params: Params, x: jax.Array) -> jax.Array:
        """Mean square of relu -> gelu -> linear layers."""
        h = checkpoint_name(jax.nn.relu(x @ params["w1"] + params["b1"]), "fc1")
        h = checkpoint_name(jax.nn.gelu(h @ params["w2"] + params["b2"]), "fc2")
        out = h @ params["w3"] + params["b3"]
        return jnp.mean(jnp.square(out.astype(jnp.float32)))

    return loss


loss = make_loss()


def loss_inputs(batch: int = 8, d_in: int = 32, d_hidden: int = 64, d_out: int = 16,
                dtype: str = "float32", mesh: object = None) -> tuple[Params, jax.ShapeDtypeStruct]:
    """Shapes only (nothing allocated): (params, x)."""
    dt = jnp.dtype(dtype)
    sds = jax.ShapeDtypeStruct
    params = {
        "w1": sds((d_in, d_hidden), dt), "b1": sds((d_hidden,), dt),
        "w2": sds((d_hidden, d_hidden), dt), "b2": sds((d_hidden,), dt),
        "w3": sds((d_hidden, d_out), dt), "b3": sds((d_out,), dt),
    }
    return params, batch_input((batch, d_in), dt, mesh)
