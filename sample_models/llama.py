"""Llama 2 and 3 as MaxText builds them, in plain JAX, sized and sharded as published GPU runs set
them (the README's truth set: runs that happened, checked with `--gpu`).

What is MaxText's, and where from (AI-Hypercomputer/maxtext, 2024 releases):
- the decoder: RMSNorm (eps 1e-5, computed in float32), RoPE on q and k, causal attention through
  a fused flash kernel (MaxText's `attention=cudnn_flash_te`: TE's fused attention, which keeps the
  output and its log-sum-exp, tagged `context`), gated SiLU MLP (`wi_0`, `wi_1`, `wo`), untied
  output layer; `use_iota_embed` (a one-hot matmul) and float32 logits and targets;
- weights in float32, activations in bfloat16 (base.yml's `weight_dtype`, `dtype`);
- checkpoint names `query_proj`, `key_proj`, `value_proj` (q, k after RoPE), `out_proj`, `mlpwi`
  (silu(wi_0) * wi_1) and `mlpwo`, and each `remat_policy` as MaxText's layers/models.py maps it;
  one `jax.checkpoint` per layer (`prevent_cse` off when scanned), scanned or unrolled;
- FSDP as MaxText's logical rules shard it: every weight's `embed` dimension over the `fsdp`
  axis, the batch over (`data`, `fsdp`).

The attention kernel is a blockwise flash attention (custom_vjp; 512 x 512 tiles): like cuDNN's,
it keeps only the output and the log-sum-exp for the backward pass, which recomputes the scores.

    te-ckpt-audit sample_models/llama.py:loss -D model=llama2-7b --mesh data=1,fsdp=8 --gpu h100 ...
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

MODELS = {  # MaxText's configs/models/*.yml
    "llama2-7b": dict(emb=4096, heads=32, kv_heads=32, head_dim=128, mlp=11008, layers=32, vocab=32000),
    "llama2-70b": dict(emb=8192, heads=64, kv_heads=8, head_dim=128, mlp=28672, layers=80, vocab=32000),
    "llama3-8b": dict(emb=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336, layers=32, vocab=128256),
    "llama3-70b": dict(emb=8192, heads=64, kv_heads=8, head_dim=128, mlp=28672, layers=80, vocab=128256),
    "llama-1b": dict(emb=2048, heads=16, kv_heads=16, head_dim=128, mlp=5504, layers=24, vocab=32000),  # bench
    "tiny": dict(emb=64, heads=4, kv_heads=2, head_dim=16, mlp=128, layers=2, vocab=256),
}
BATCH_AXES = ("data", "fsdp")
_NAMES = {
    "save_qkv_proj": ("query_proj", "value_proj", "key_proj", "qkv_proj"),
    "save_dot_except_mlp": ("query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj"),
    "save_dot_except_mlpwi": ("query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj", "mlpwo"),
}


@dataclasses.dataclass(frozen=True)
class Config:
    emb: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    layers: int
    vocab: int
    remat: str = "full"
    scan: bool = True
    block: int = 512


def remat_policy(name: str) -> Any:
    """MaxText's `remat_policy` as the JAX policy its decoder passes to `nn.remat` (2024)."""
    cp = jax.checkpoint_policies
    if name == "minimal":
        return cp.checkpoint_dots_with_no_batch_dims
    if name == "minimal_flash":
        return cp.save_from_both_policies(cp.checkpoint_dots_with_no_batch_dims, cp.save_only_these_names("context"))
    if name in _NAMES:
        return cp.save_only_these_names(*_NAMES[name])
    if name == "full":
        return None  # nn.remat without a policy: nothing saved but the layer's inputs
    raise ValueError(f"no MaxText remat_policy {name!r}")


# --- flash attention: the output and its log-sum-exp kept, the scores recomputed ----------------------


def _tiles(x: jax.Array, b: int) -> jax.Array:
    """(B, S, ...) as (S/b, B, b, ...)."""
    return jnp.moveaxis(x.reshape(x.shape[0], x.shape[1] // b, b, *x.shape[2:]), 1, 0)


def _untile(x: jax.Array) -> jax.Array:
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _scores(qi: jax.Array, kj: jax.Array, i: jax.Array, j: jax.Array, b: int) -> jax.Array:
    """Causal scores of query tile i against key tile j: (B, KV, G, bq, bk), float32."""
    s = jnp.einsum("bqkgd,bskd->bkgqs", qi, kj, preferred_element_type=jnp.float32) / jnp.sqrt(qi.shape[-1])
    keep = (i * b + jnp.arange(b))[:, None] >= (j * b + jnp.arange(b))[None, :]
    return jnp.where(keep, s, -1e30)


def _flash_forward(q: jax.Array, k: jax.Array, v: jax.Array, b: int) -> tuple[jax.Array, jax.Array]:
    """q (B, S, KV, G, D); k, v (B, S, KV, D): the output like q and the log-sum-exp (n, B, KV, G, b)."""
    qt, kt, vt = _tiles(q, b), _tiles(k, b), _tiles(v, b)
    n = qt.shape[0]
    batch, _, kv, g, d = q.shape

    def row(_: None, xs: tuple[jax.Array, jax.Array]) -> tuple[None, tuple[jax.Array, jax.Array]]:
        qi, i = xs

        def col(carry: tuple[jax.Array, ...], ys: tuple[jax.Array, ...]) -> tuple[tuple[jax.Array, ...], None]:
            m, total, acc = carry
            kj, vj, j = ys
            s = _scores(qi, kj, i, j, b)
            top = jnp.maximum(m, s.max(-1))
            p = jnp.exp(s - top[..., None])
            scale = jnp.exp(m - top)
            acc = acc * scale[..., None] + jnp.einsum("bkgqs,bskd->bkgqd", p.astype(vj.dtype), vj,
                                                      preferred_element_type=jnp.float32)
            return (top, total * scale + p.sum(-1), acc), None

        init = (jnp.full((batch, kv, g, b), -1e30), jnp.zeros((batch, kv, g, b)), jnp.zeros((batch, kv, g, b, d)))
        (m, total, acc), _ = jax.lax.scan(col, init, (kt, vt, jnp.arange(n)))
        out = jnp.moveaxis((acc / total[..., None]).astype(q.dtype), 3, 1)  # (B, b, KV, G, D)
        return None, (out, m + jnp.log(total))

    _, (out, lse) = jax.lax.scan(row, None, (qt, jnp.arange(n)))
    return _untile(out), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, block: int) -> jax.Array:
    return _flash_forward(q, k, v, block)[0]


def _flash_fwd(q: jax.Array, k: jax.Array, v: jax.Array, block: int) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    out, lse = _flash_forward(q, k, v, block)
    out, lse = checkpoint_name(out, "context"), checkpoint_name(lse, "context")  # as TE's fused attention names them
    return out, (q, k, v, out, lse)


def _flash_bwd(block: int, res: tuple[jax.Array, ...], dout: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    q, k, v, out, lse = res
    b = block
    delta = jnp.moveaxis(jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1), 1, -1)  # (B, KV, G, S)
    qt, kt, vt, dot = _tiles(q, b), _tiles(k, b), _tiles(v, b), _tiles(dout, b)
    deltat = jnp.moveaxis(delta.reshape(*delta.shape[:-1], -1, b), -2, 0)  # (n, B, KV, G, b)
    n = qt.shape[0]

    def col(dq: jax.Array, ys: tuple[jax.Array, ...]) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        kj, vj, j = ys

        def row(carry: tuple[jax.Array, jax.Array], xs: tuple[jax.Array, ...]
                ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
            dk, dv = carry
            qi, doi, lsei, deltai, i = xs
            p = jnp.exp(_scores(qi, kj, i, j, b) - lsei[..., None])
            dv = dv + jnp.einsum("bkgqs,bqkgd->bskd", p.astype(doi.dtype), doi, preferred_element_type=jnp.float32)
            dp = jnp.einsum("bqkgd,bskd->bkgqs", doi, vj, preferred_element_type=jnp.float32)
            ds = (p * (dp - deltai[..., None]) / jnp.sqrt(qi.shape[-1])).astype(qi.dtype)
            dk = dk + jnp.einsum("bkgqs,bqkgd->bskd", ds, qi, preferred_element_type=jnp.float32)
            return (dk, dv), jnp.einsum("bkgqs,bskd->bqkgd", ds, kj, preferred_element_type=jnp.float32)

        zero = jnp.zeros(kj.shape, jnp.float32)
        (dk, dv), dqs = jax.lax.scan(row, (zero, zero), (qt, dot, lse, deltat, jnp.arange(n)))
        return dq + dqs, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(col, jnp.zeros(qt.shape, jnp.float32), (kt, vt, jnp.arange(n)))
    return _untile(dq).astype(q.dtype), _untile(dk).astype(k.dtype), _untile(dv).astype(v.dtype)


flash_attention.defvjp(_flash_fwd, _flash_bwd)


# --- the decoder ------------------------------------------------------------------------------------------


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-5)
    return (normed * scale.astype(jnp.float32)).astype(x.dtype)


def _rope(x: jax.Array) -> jax.Array:
    """Rotary position embedding over the last axis of (B, S, ..., D), positions 0..S-1."""
    d = x.shape[-1]
    positions = jnp.arange(x.shape[1], dtype=jnp.float32)
    inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angle = positions[:, None] * inv[None, :]
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 3) + (d // 2,)
    sin, cos = jnp.sin(angle).reshape(shape), jnp.cos(angle).reshape(shape)
    first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], -1).astype(x.dtype)


def _batch_axes(names: Any) -> tuple[str, ...]:
    return tuple(a for a in BATCH_AXES if a in names)


def _constrain(x: jax.Array) -> jax.Array:
    """The batch over (`data`, `fsdp`), as MaxText's `activation_batch` rule puts it."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, P(_batch_axes(mesh.axis_names), *([None] * (x.ndim - 1))))


def _layer(x: jax.Array, p: dict[str, jax.Array], cfg: Config) -> jax.Array:
    bf16 = jnp.bfloat16
    g = cfg.heads // cfg.kv_heads
    h = _rms_norm(x, p["attn_norm"])
    q = jnp.einsum("bse,ehd->bshd", h, p["query"].astype(bf16))
    k = jnp.einsum("bse,ehd->bshd", h, p["key"].astype(bf16))
    v = jnp.einsum("bse,ehd->bshd", h, p["value"].astype(bf16))
    q = checkpoint_name(_rope(q), "query_proj")
    k = checkpoint_name(_rope(k), "key_proj")
    v = checkpoint_name(v, "value_proj")
    q = q.reshape(*q.shape[:2], cfg.kv_heads, g, cfg.head_dim)
    ctx = flash_attention(q, k, v, min(cfg.block, x.shape[1]))
    ctx = ctx.reshape(*ctx.shape[:2], cfg.heads, cfg.head_dim)
    out = checkpoint_name(jnp.einsum("bshd,hde->bse", ctx, p["out"].astype(bf16)), "out_proj")
    x = _constrain(x + out)
    h = _rms_norm(x, p["mlp_norm"])
    gate = jnp.einsum("bse,ef->bsf", h, p["wi_0"].astype(bf16))
    up = jnp.einsum("bse,ef->bsf", h, p["wi_1"].astype(bf16))
    hidden = checkpoint_name(jax.nn.silu(gate) * up, "mlpwi")
    down = checkpoint_name(jnp.einsum("bsf,fe->bse", hidden, p["wo"].astype(bf16)), "mlpwo")
    return _constrain(x + down)


def loss(params: dict[str, Any], tokens: jax.Array, targets: jax.Array, cfg: Config) -> jax.Array:
    bf16 = jnp.bfloat16
    one_hot = jax.nn.one_hot(tokens, cfg.vocab, dtype=bf16)  # use_iota_embed
    x = _constrain(jnp.einsum("bsv,ve->bse", one_hot, params["embedding"].astype(bf16)))
    layer = jax.checkpoint(functools.partial(_layer, cfg=cfg), policy=remat_policy(cfg.remat),
                           prevent_cse=not cfg.scan)
    if cfg.scan:
        x, _ = jax.lax.scan(lambda carry, p: (layer(carry, p), None), x, params["layers"])
    else:
        for p in params["layers"]:
            x = layer(x, p)
    h = _rms_norm(x, params["final_norm"])
    logits = jnp.einsum("bse,ev->bsv", h, params["logits"].astype(bf16)).astype(jnp.float32)
    labels = jax.nn.one_hot(targets, cfg.vocab)  # float32, as MaxText's cross entropy takes them
    return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))


def loss_inputs(model: str = "tiny", per_device_batch: int = 2, seq: int = 64, remat: str = "full",
                scan: bool = True, mesh: Any = None, layers: int = 0) -> tuple[Any, ...]:
    """The parameters (float32, MaxText's FSDP sharding on `mesh`), a batch of `per_device_batch`
    sequences per device, and the config; `layers` (when not 0) replaces the model's layer count."""
    cfg = Config(**{**MODELS[model], **({"layers": layers} if layers else {})}, remat=remat, scan=scan)
    devices = 1 if mesh is None else mesh.devices.size

    def sds(shape: tuple[int, ...], *spec: Any, dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
        sharding = None if mesh is None else NamedSharding(mesh, P(*spec))
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    e, hd = cfg.emb, cfg.head_dim
    stack = (cfg.layers,) if scan else ()
    lead = (None,) if scan else ()

    def layer() -> dict[str, jax.ShapeDtypeStruct]:
        return {
            "attn_norm": sds((*stack, e), *lead, None),
            "query": sds((*stack, e, cfg.heads, hd), *lead, "fsdp", None, None),
            "key": sds((*stack, e, cfg.kv_heads, hd), *lead, "fsdp", None, None),
            "value": sds((*stack, e, cfg.kv_heads, hd), *lead, "fsdp", None, None),
            "out": sds((*stack, cfg.heads, hd, e), *lead, None, None, "fsdp"),
            "mlp_norm": sds((*stack, e), *lead, None),
            "wi_0": sds((*stack, e, cfg.mlp), *lead, "fsdp", None),
            "wi_1": sds((*stack, e, cfg.mlp), *lead, "fsdp", None),
            "wo": sds((*stack, cfg.mlp, e), *lead, None, "fsdp"),
        }

    params = {
        "embedding": sds((cfg.vocab, e), None, "fsdp"),
        "layers": layer() if scan else [layer() for _ in range(cfg.layers)],
        "final_norm": sds((e,), None),
        "logits": sds((e, cfg.vocab), "fsdp", None),
    }
    batch = per_device_batch * devices
    tokens = sds((batch, seq), _batch_axes(mesh.axis_names) if mesh is not None else None, None, dtype=jnp.int32)
    return params, tokens, tokens, cfg
