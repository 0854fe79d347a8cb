"""A Transformer-Engine-style transformer: projection GEMMs through TE's dense layer.

The qkv / out / ffn1 / ffn2 projections call ``te_standin.dense`` and each layer's
top-1 MoE block calls ``te_standin.grouped_dense``. Unless ``transformer_engine.jax``
imports, those GEMMs are a labelled CPU stand-in (primitives named like TE's, bound in a
custom_vjp as TE binds them); see ``te_standin.USING_REAL_TE``. Attention scores and context are
plain batched einsums. Layers are unrolled; there is no internal remat, so ``checkpoint_dots``
around this loss recomputes every TE GEMM. With ``-D fp8=True`` the projections run in FP8 (TE's
current scaling): the FP8 casts of their inputs are what the dense layers keep (name ``quantization``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from sample_models._batch import batch_input
from sample_models.te_standin import dense, grouped_dense

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Config:
    """Static model settings (hashable, passed as a static positional argument)."""

    heads: int
    experts: int
    fp8: bool = False  # the projections in FP8 (current scaling), their quantizers named "quantization"


QUANTIZATION = "quantization"  # the quantizers' checkpoint name, as MaxText sets TE's


def _fp8(cfg: Config) -> dict[str, Any]:
    """`dense`'s FP8 settings (called on each projection's own line, which its residuals name)."""
    return {"fp8": cfg.fp8, "quantization_name": QUANTIZATION if cfg.fp8 else None}


def _layernorm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """Bias-free LayerNorm in float32, returned in x's dtype."""
    xf = x.astype(jnp.float32)
    xf = (xf - xf.mean(-1, keepdims=True)) * jax.lax.rsqrt(xf.var(-1, keepdims=True) + 1e-5)
    return xf.astype(x.dtype) * scale


def _attention(h: jax.Array, p: Params, cfg: Config) -> jax.Array:
    """Causal attention: TE GEMM projections around batched-einsum scores."""
    b, s, d = h.shape
    heads = cfg.heads
    qkv = checkpoint_name(dense(h, p["w_qkv"], **_fp8(cfg)), "qkv_proj")
    q, k, v = (t.reshape(b, s, heads, d // heads) for t in jnp.split(qkv, 3, axis=-1))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // heads).astype(h.dtype)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, jnp.finfo(h.dtype).min)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(h.dtype)
    ctx = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d), "context")
    return checkpoint_name(dense(ctx, p["w_o"], **_fp8(cfg)), "out_proj")


def _moe(h: jax.Array, p: Params, experts: int) -> jax.Array:
    """Top-1 MoE: sort tokens by expert, two grouped GEMMs, unsort and gate."""
    b, s, d = h.shape
    flat = h.reshape(b * s, d)
    probs = jax.nn.softmax((flat @ p["w_router"]).astype(jnp.float32), axis=-1)
    expert = jnp.argmax(probs, axis=-1)
    gate = jnp.max(probs, axis=-1).astype(h.dtype)
    order = jnp.argsort(expert)
    group_sizes = jnp.bincount(expert, length=experts).astype(jnp.int32)
    y = jax.nn.gelu(checkpoint_name(grouped_dense(flat[order], p["w_in"], group_sizes), "moe_ffn1"))
    y = checkpoint_name(grouped_dense(y, p["w_out"], group_sizes), "moe_ffn2")
    out = jnp.zeros_like(y).at[order].set(y) * gate[:, None]
    return out.reshape(b, s, d)


def _layer(x: jax.Array, p: Params, cfg: Config) -> jax.Array:
    """Attention, dense FFN and MoE, each pre-LN with a residual."""
    x = x + _attention(_layernorm(x, p["ln1"]), p, cfg)
    h = jax.nn.gelu(checkpoint_name(dense(_layernorm(x, p["ln2"]), p["w1"], **_fp8(cfg)), "ffn1"))
    x = x + checkpoint_name(dense(h, p["w2"], **_fp8(cfg)), "ffn2")
    return x + _moe(_layernorm(x, p["ln3"]), p, cfg.experts)


def make_loss() -> Callable[[Params, jax.Array, Config], jax.Array]:
    """Return the target; no internal remat, so there is no policy to replace."""

    def loss(params: Params, tokens: jax.Array, cfg: Config) -> jax.Array:
        """Next-token cross-entropy over unrolled layers."""
        x = params["embed"][tokens]
        for p in params["layers"]:
            x = _layer(x, p, cfg)
        logits = _layernorm(x, params["lnf"]) @ params["unembed"]
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

    return loss


loss = make_loss()


def loss_inputs(layers: int = 2, batch: int = 2, seq: int = 16, d_model: int = 64,
                heads: int = 4, d_ff: int = 128, experts: int = 4, vocab: int = 128,
                dtype: str = "float32", fp8: bool = False, mesh: Any = None,
                ) -> tuple[Params, jax.ShapeDtypeStruct, Config]:
    """Shapes only: (params with a list of per-layer dicts, int32 tokens, cfg). `fp8`: the
    projections quantized to FP8 (TE's current scaling), their quantizers named "quantization"."""
    dt = jnp.dtype(dtype)
    sds = jax.ShapeDtypeStruct
    layer = {
        "ln1": (d_model,), "w_qkv": (d_model, 3 * d_model), "w_o": (d_model, d_model),
        "ln2": (d_model,), "w1": (d_model, d_ff), "w2": (d_ff, d_model),
        "ln3": (d_model,), "w_router": (d_model, experts),
        "w_in": (experts, d_model, d_ff), "w_out": (experts, d_ff, d_model),
    }
    params = {
        "embed": sds((vocab, d_model), dt),
        "layers": [{k: sds(shape, dt) for k, shape in layer.items()} for _ in range(layers)],
        "lnf": sds((d_model,), dt), "unembed": sds((d_model, vocab), dt),
    }
    return params, batch_input((batch, seq), jnp.int32, mesh), Config(heads=heads, experts=experts, fp8=fp8)
