"""GPT-style decoder in plain JAX: ``lax.scan`` over stacked layers, each layer remat'd.

Every layer is ``jax.checkpoint(layer, policy=policy)`` inside the scan body (default
``dots_with_no_batch_dims_saveable``), with ``checkpoint_name`` tags ``qkv_proj``,
``context``, ``out_proj``, ``ffn1`` and ``ffn2`` (``-D named=false``: none, a model that names
nothing). Attention scores and context are
batched einsums (dot_general with batch dims), so the default policy recomputes them.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name as _checkpoint_name

from sample_models._batch import batch_input

Params = dict[str, Any]
Policy = Callable[..., Any]
DEFAULT_POLICY: Policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


@dataclasses.dataclass(frozen=True)
class Config:
    """Static model settings (hashable, passed as a static positional argument)."""

    heads: int
    scan: bool = True  # False: a Python loop over layers (params["layers"] is then a list)
    named: bool = True  # False: no checkpoint_name anywhere (`-D named=false`: a model that names nothing)


def _layernorm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """LayerNorm computed in float32 for stability, returned in x's dtype."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype) * scale + bias


def _unnamed(x: jax.Array, name: str) -> jax.Array:
    return x


def _attention(h: jax.Array, p: Params, heads: int, named: bool = True) -> jax.Array:
    """Causal multi-head self-attention; the projections carry checkpoint names."""
    b, s, d = h.shape
    checkpoint_name = _checkpoint_name if named else _unnamed
    qkv = checkpoint_name(h @ p["w_qkv"], "qkv_proj")
    q, k, v = (t.reshape(b, s, heads, d // heads) for t in jnp.split(qkv, 3, axis=-1))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // heads).astype(h.dtype)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(h.dtype)
    context = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d), "context")
    return checkpoint_name(context @ p["w_o"], "out_proj")


def _layer(x: jax.Array, p: Params, heads: int, named: bool = True) -> jax.Array:
    """One pre-LN decoder block."""
    checkpoint_name = _checkpoint_name if named else _unnamed
    x = x + _attention(_layernorm(x, p["ln1_s"], p["ln1_b"]), p, heads, named)
    h = _layernorm(x, p["ln2_s"], p["ln2_b"])
    h = jax.nn.gelu(checkpoint_name(h @ p["w1"], "ffn1"))
    return x + checkpoint_name(h @ p["w2"], "ffn2")


def make_loss(policy: Policy | None = DEFAULT_POLICY) -> Callable[[Params, jax.Array, Config], jax.Array]:
    """Return the target with every layer's remat policy set to ``policy`` (None: no remat)."""

    def loss(params: Params, tokens: jax.Array, cfg: Config) -> jax.Array:
        """Next-token cross-entropy over a scan of checkpointed layers."""
        x = params["embed"][tokens] + params["pos"][: tokens.shape[1]]
        layer = functools.partial(_layer, heads=cfg.heads, named=cfg.named)
        if policy is not None:
            layer = jax.checkpoint(layer, policy=policy, prevent_cse=False)
        if cfg.scan:
            x, _ = jax.lax.scan(lambda c, p: (layer(c, p), None), x, params["layers"])
        else:
            for p in params["layers"]:
                x = layer(x, p)
        logits = _layernorm(x, params["lnf_s"], params["lnf_b"]) @ params["unembed"]
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
        target = tokens[:, 1:]
        return -jnp.take_along_axis(logp, target[..., None], axis=-1).mean()

    return loss


loss = make_loss()


def loss_inputs(layers: int = 2, batch: int = 2, seq: int = 16, d_model: int = 64,
                heads: int = 4, d_ff: int = 256, vocab: int = 128,
                dtype: str = "float32", scan: bool = True, mesh: Any = None, named: bool = True,
                ) -> tuple[Params, jax.ShapeDtypeStruct, Config]:
    """Shapes only: (params with a leading layer axis, int32 tokens [batch, seq], cfg); on a
    mesh (`--mesh data=8`) the tokens split over its data axes, as a data-parallel run holds them."""
    dt = jnp.dtype(dtype)
    sds = jax.ShapeDtypeStruct
    per_layer = {
        "ln1_s": (d_model,), "ln1_b": (d_model,), "w_qkv": (d_model, 3 * d_model),
        "w_o": (d_model, d_model), "ln2_s": (d_model,), "ln2_b": (d_model,),
        "w1": (d_model, d_ff), "w2": (d_ff, d_model),
    }
    params = {
        "embed": sds((vocab, d_model), dt), "pos": sds((seq, d_model), dt),
        "layers": (
            {k: sds((layers, *shape), dt) for k, shape in per_layer.items()}
            if scan
            else [{k: sds(shape, dt) for k, shape in per_layer.items()} for _ in range(layers)]
        ),
        "lnf_s": sds((d_model,), dt), "lnf_b": sds((d_model,), dt),
        "unembed": sds((d_model, vocab), dt),
    }
    return params, batch_input((batch, seq), jnp.int32, mesh), Config(heads=heads, scan=scan, named=named)
