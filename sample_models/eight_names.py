"""A stack of dense layers with one checkpoint name per layer (eight by default): the target of
`bench/recommend.py` and of the recommendation tests.

Layer ``i`` computes ``act(h @ w_i)`` and tags the GEMM's output ``layer{i}`` (as MaxText tags its
projections). Widths
differ from layer to layer, so each name costs different bytes to save and different FLOPs to
recompute: which subset fits a budget with the least recompute is not obvious from the names.
Every other layer is a TE GEMM (the CPU stand-in when TE does not import), so TE-aware policies
and JAX's dot policies disagree.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from sample_models.te_standin import dense

Params = list[jax.Array]
WIDTHS = (48, 160, 24, 96, 200, 40, 128, 64, 80, 32, 112, 56)  # cycled for more than 12 layers


def make_loss() -> Callable[[Params, jax.Array], jax.Array]:
    """The target; no internal remat, so scope auto wraps it in one jax.checkpoint."""

    def loss(params: Params, x: jax.Array) -> jax.Array:
        """Mean square of the last layer; odd layers are TE GEMMs, even ones jnp dots."""
        h = x
        for i, w in enumerate(params):
            z = dense(h, w) if i % 2 else h @ w
            act = jnp.tanh if i % 3 == 0 else jax.nn.relu if i % 3 == 1 else jnp.sin
            h = act(checkpoint_name(z, f"layer{i}"))
        return jnp.mean(jnp.square(h))

    return loss


loss = make_loss()


def loss_inputs(layers: int = 8, batch: int = 4, d_in: int = 32) -> tuple[Params, jax.ShapeDtypeStruct]:
    """Shapes only: (one weight per layer, x [batch, d_in])."""
    sds = jax.ShapeDtypeStruct
    widths = [d_in, *(WIDTHS[i % len(WIDTHS)] for i in range(layers))]
    params = [sds((widths[i], widths[i + 1]), jnp.float32) for i in range(layers)]
    return params, sds((batch, d_in), jnp.float32)
