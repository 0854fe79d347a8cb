"""A GPT layer stack sharded Megatron-style: tensor parallelism over mesh axis `model`, data
parallelism over `data`, optional sequence parallelism (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models").

Built so that what JAX saves for the backward pass is what the paper counts (its Section 4.1), in
16-bit activations with 1-byte dropout masks:

- attention: the QKV projection's input, Q and K (for QK^T), the softmax output, its dropout mask
  and dropout output, V, the output projection's input, and the attention dropout's mask;
- MLP: the first linear's input, the GeLU input, the GeLU output (the second linear's input), and
  the MLP dropout's mask;
- each LayerNorm keeps its input.

As in Megatron's fused kernels, LayerNorm keeps only its input, the causally masked softmax
only its output, and GeLU only its input (custom VJPs recompute the rest). Biases are
left out: they keep nothing. Layout is Megatron's [seq, batch, hidden]; layers are a Python loop
(`loss`) or a `lax.scan` over stacked weights (`scanned`, for deep stacks).

Shardings are `with_sharding_constraint`s with bare PartitionSpecs, resolved against the mesh
te-ckpt-audit sets (`--mesh data=D,model=T`); without a mesh they are skipped. On a mesh whose
axes are all Explicit (`--shardings abstract`) they are `reshard`s, and the row-parallel linears
name their output sharding. One difference then, with sequence parallelism: explicit sharding
gathers a linear's sequence-split input in the program, so JAX keeps the gathered copy (2sbh, not
2sbh/t, for each of the two column-parallel inputs), where XLA's partitioner keeps the split one.

    te-ckpt-audit sample_models/megatron_tp.py:loss --mesh data=2,model=4 --policy none
    te-ckpt-audit sample_models/megatron_tp.py:loss --mesh data=2,model=4 -D sp=True --policy none
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

Params = dict[str, Any]
Inputs = tuple[Params, jax.ShapeDtypeStruct, jax.ShapeDtypeStruct, int, bool]  # params, x, key, heads, sp
DROPOUT = 0.1
ACT = jnp.bfloat16  # 16-bit activations, as the paper assumes


def _on_mesh() -> bool:
    return not jax.sharding.get_abstract_mesh().empty


def _explicit() -> bool:
    """Every mesh axis Explicit (te-ckpt-audit's --shardings abstract): shardings are types."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and all(t == AxisType.Explicit for t in mesh.axis_types)


def _c(x: jax.Array, *spec: Any) -> jax.Array:
    """Shard `x` as `spec` says, when a mesh is set."""
    if not _on_mesh():
        return x
    return jax.sharding.reshard(x, P(*spec)) if _explicit() else jax.lax.with_sharding_constraint(x, P(*spec))


def _row_parallel(eq: str, x: jax.Array, w: jax.Array, *spec: Any) -> jax.Array:
    """A linear whose contraction is split over `model`: its partial sums are reduced (explicit
    sharding asks for the output's sharding to say so)."""
    if _on_mesh() and _explicit():
        return jnp.einsum(eq, x, w, out_sharding=P(*spec))
    return _c(jnp.einsum(eq, x, w), *spec)


# --- the fused kernels: each keeps only what Megatron's keeps -------------------------------------


def _layernorm(x: jax.Array, gamma: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + 1e-5) * gamma.astype(jnp.float32)).astype(x.dtype)


layernorm = jax.custom_vjp(_layernorm)


def _layernorm_fwd(x: jax.Array, gamma: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _layernorm(x, gamma), (x, gamma)


def _layernorm_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, gamma = res
    xf = x.astype(jnp.float32)
    n = xf.shape[-1]
    mean = xf.mean(-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.square(xf - mean).mean(-1, keepdims=True) + 1e-5)
    xhat = (xf - mean) * rstd
    gf = g.astype(jnp.float32)
    dgamma = jnp.sum(gf * xhat, axis=tuple(range(x.ndim - 1))).astype(gamma.dtype)
    gx = gf * gamma.astype(jnp.float32)
    dx = rstd * (gx - gx.mean(-1, keepdims=True) - xhat * jnp.sum(gx * xhat, -1, keepdims=True) / n)
    return dx.astype(x.dtype), dgamma


layernorm.defvjp(_layernorm_fwd, _layernorm_bwd)


def _causal_softmax(scores: jax.Array) -> jax.Array:
    """Softmax over the last axis of [b, a, s, s] scores, causally masked."""
    s, t = scores.shape[-2], scores.shape[-1]
    causal = jnp.arange(s)[:, None] >= jnp.arange(t)[None, :]
    logits = jnp.where(causal, scores.astype(jnp.float32), -1e30)
    return jax.nn.softmax(logits, axis=-1).astype(scores.dtype)


causal_softmax = jax.custom_vjp(_causal_softmax)


def _softmax_fwd(scores: jax.Array) -> tuple[jax.Array, jax.Array]:
    y = _causal_softmax(scores)
    return y, y


def _softmax_bwd(y: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    yf, gf = y.astype(jnp.float32), g.astype(jnp.float32)
    return ((yf * (gf - jnp.sum(gf * yf, -1, keepdims=True))).astype(y.dtype),)


causal_softmax.defvjp(_softmax_fwd, _softmax_bwd)

_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu(u: jax.Array) -> jax.Array:
    uf = u.astype(jnp.float32)
    return (0.5 * uf * (1.0 + jnp.tanh(_GELU_C * (uf + 0.044715 * uf**3)))).astype(u.dtype)


gelu = jax.custom_vjp(_gelu)


def _gelu_fwd(u: jax.Array) -> tuple[jax.Array, jax.Array]:
    return _gelu(u), u


def _gelu_bwd(u: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    uf = u.astype(jnp.float32)
    t = jnp.tanh(_GELU_C * (uf + 0.044715 * uf**3))
    du = 0.5 * (1.0 + t) + 0.5 * uf * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * uf * uf)
    return ((g.astype(jnp.float32) * du).astype(u.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


def _apply_mask(x: jax.Array, keep: jax.Array) -> jax.Array:
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - DROPOUT), x.dtype), jnp.zeros((), x.dtype))


apply_mask = jax.custom_vjp(_apply_mask)


def _apply_mask_fwd(x: jax.Array, keep: jax.Array) -> tuple[jax.Array, jax.Array]:
    return _apply_mask(x, keep), keep


def _apply_mask_bwd(keep: jax.Array, g: jax.Array) -> tuple[jax.Array, None]:
    return _apply_mask(g, keep), None


apply_mask.defvjp(_apply_mask_fwd, _apply_mask_bwd)


def dropout(x: jax.Array, key: jax.Array, *spec: Any) -> jax.Array:
    """Keeps only its 1-byte (bool) mask, sharded like `x` (a plain `where` would also keep the
    zeros it selects, broadcast to x's shape)."""
    return apply_mask(x, _c(jax.random.bernoulli(key, 1.0 - DROPOUT, x.shape), *spec))


# --- the layer ------------------------------------------------------------------------------------


def _gathered(x: jax.Array) -> jax.Array:
    """What a column-parallel linear takes in: under explicit sharding, a sequence-split input is
    gathered first, in the program (so the gathered copy is what JAX keeps for the backward pass);
    otherwise XLA's partitioner gathers it inside the linear and keeps the split one."""
    return _c(x, None, "data", None) if _on_mesh() and _explicit() else x


def layer(x: jax.Array, p: Params, key: jax.Array, heads: int, sp: bool) -> jax.Array:
    """One transformer layer on [s, b, h]. Without sequence parallelism the LayerNorms, the
    dropouts and what the column-parallel linears take in are replicated over `model`; with it
    they are split along the sequence (`model` on dim 0), and gathered before the linears."""
    s, b, h = x.shape
    d = h // heads
    seq = "model" if sp else None  # how [s, b, h] tensors outside the parallel regions are split
    k1, k2, k3 = jax.random.split(key, 3)

    x = _c(x, seq, "data", None)
    ln1 = _gathered(_c(layernorm(x, p["ln1"]), seq, "data", None))

    def heads_of(w: jax.Array) -> jax.Array:  # column-parallel: heads split over `model`
        y = _c(jnp.einsum("sbh,hk->sbk", ln1, w), None, "data", "model")
        return _c(y.reshape(s, b, heads, d), None, "data", "model", None)

    q, k, v = heads_of(p["wq"]), heads_of(p["wk"]), heads_of(p["wv"])
    scores = _c(jnp.einsum("sbad,tbad->bast", q * jnp.asarray(1 / math.sqrt(d), ACT), k), "data", "model")
    probs = _c(causal_softmax(scores), "data", "model")
    probs = _c(dropout(probs, k1, "data", "model"), "data", "model")
    ctx = _c(jnp.einsum("bast,tbad->sbad", probs, v), None, "data", "model", None)
    ctx = _c(ctx.reshape(s, b, h), None, "data", "model")
    out = _row_parallel("sbk,kh->sbh", ctx, p["wo"], seq, "data", None)
    x = x + dropout(out, k2, seq, "data", None)

    x = _c(x, seq, "data", None)
    ln2 = _gathered(_c(layernorm(x, p["ln2"]), seq, "data", None))
    u = _c(jnp.einsum("sbh,hf->sbf", ln2, p["w1"]), None, "data", "model")
    g = _c(gelu(u), None, "data", "model")
    out = _row_parallel("sbf,fh->sbh", g, p["w2"], seq, "data", None)
    return _c(x + dropout(out, k3, seq, "data", None), seq, "data", None)


def loss(params: Params, x: jax.Array, key: jax.Array, heads: int, sp: bool = False) -> jax.Array:
    """The layer stack on embeddings `x` ([s, b, h], float32, made 16-bit first: the first
    LayerNorm's input is then an activation, like every other layer's)."""
    h = _c(x.astype(ACT), "model" if sp else None, "data", None)
    for i, p in enumerate(params["layers"]):
        h = layer(h, p, jax.random.fold_in(key, i), heads, sp)
    return jnp.sum(h.astype(jnp.float32))


def scanned(params: Params, x: jax.Array, key: jax.Array, heads: int, sp: bool = False) -> jax.Array:
    """`loss` with the layers in one `lax.scan` over stacked weights ([L, ...]), for deep stacks."""
    h = _c(x.astype(ACT), "model" if sp else None, "data", None)

    def body(h: jax.Array, xs: tuple[Params, jax.Array]) -> tuple[jax.Array, None]:
        p, i = xs
        return layer(h, p, jax.random.fold_in(key, i), heads, sp), None

    n = params["layers"]["wq"].shape[0]
    h, _ = jax.lax.scan(body, h, (params["layers"], jnp.arange(n)))
    return jnp.sum(h.astype(jnp.float32))


# --- inputs ---------------------------------------------------------------------------------------

_WEIGHT_SPECS = {  # Megatron's split of each weight over `model`
    "ln1": P(None),
    "ln2": P(None),
    "wq": P(None, "model"),
    "wk": P(None, "model"),
    "wv": P(None, "model"),
    "wo": P("model", None),
    "w1": P(None, "model"),
    "w2": P("model", None),
}


def _weights(hidden: int, mesh: Any, stacked: int | None) -> Params:
    shapes = {
        "ln1": (hidden,),
        "ln2": (hidden,),
        "wq": (hidden, hidden),
        "wk": (hidden, hidden),
        "wv": (hidden, hidden),
        "wo": (hidden, hidden),
        "w1": (hidden, 4 * hidden),
        "w2": (4 * hidden, hidden),
    }
    out = {}
    for name, shape in shapes.items():
        spec = _WEIGHT_SPECS[name]
        if stacked is not None:
            shape, spec = (stacked, *shape), P(None, *spec)
        sharding = None if mesh is None else NamedSharding(mesh, spec)
        out[name] = jax.ShapeDtypeStruct(shape, ACT, sharding=sharding)
    return out


def _inputs(mesh: Any, layers: int, seq: int, batch: int, hidden: int, heads: int, sp: bool,
            stacked: bool) -> Inputs:
    weights: Params = (
        {"layers": _weights(hidden, mesh, layers)}
        if stacked
        else {"layers": [_weights(hidden, mesh, None) for _ in range(layers)]}
    )
    x_spec = P("model" if sp else None, "data", None)
    x = jax.ShapeDtypeStruct((seq, batch, hidden), jnp.float32,
                             sharding=None if mesh is None else NamedSharding(mesh, x_spec))
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=None if mesh is None else NamedSharding(mesh, P()))
    return weights, x, key, heads, sp


def loss_inputs(mesh: Any = None, layers: int = 2, seq: int = 32, batch: int = 4, hidden: int = 64,
                heads: int = 8, sp: bool = False) -> Inputs:
    """Shapes only; with the mesh te-ckpt-audit passes, weights and inputs carry Megatron's shardings."""
    return _inputs(mesh, layers, seq, batch, hidden, heads, sp, stacked=False)


def scanned_inputs(mesh: Any = None, layers: int = 96, seq: int = 2048, batch: int = 64, hidden: int = 12288,
                   heads: int = 96, sp: bool = False) -> Inputs:
    """GPT-3 175B's shapes by default (96 layers, hidden 12288, 96 heads, sequence 2048)."""
    return _inputs(mesh, layers, seq, batch, hidden, heads, sp, stacked=True)
