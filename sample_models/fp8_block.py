"""An FP8 (MXFP8) feed-forward block on JAX's own block-scaled matmul.

The GEMMs go through ``jax.nn.scaled_dot_general`` with MXFP8 configs, which quantizes
and binds ``scaled_matmul_wrapper`` (``jax.nn.scaled_matmul``'s primitive) in forward
and backward. ``jax.nn.scaled_matmul`` alone has no differentiation rule in jax 0.10.2,
so it is used through ``scaled_dot_general``'s custom_vjp. MXFP8 blocks are 32 wide, so
tokens (batch * seq), d_model and d_ff must be multiples of 32.

On CPU this traces (make_jaxpr, grad, print_saved_residuals all work) but does not run:
the inner ``scaled_matmul`` primitive lowers only for CUDA/ROCm. Call
``enable_cpu_reference_lowering()`` first to run it on CPU with a dequantize-and-einsum
reference (a process-wide registration, meant for tests).
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.interpreters import mlir

Params = dict[str, jax.Array]
BLOCK = 32
_CONFIGS = [jax.nn.get_scaled_dot_general_config("mxfp8")] * 3


def _fp8_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [T, K] @ w [K, N] in MXFP8, output in x's dtype."""
    out = jax.nn.scaled_dot_general(x, w, (((1,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32, configs=_CONFIGS)
    return out.astype(x.dtype)


def make_loss() -> Callable[[Params, jax.Array], jax.Array]:
    """Return the target; no internal remat, so there is no policy to replace."""

    def loss(params: Params, x: jax.Array) -> jax.Array:
        """Mean square of a pre-LN FP8 feed-forward block with a residual."""
        b, s, d = x.shape
        xf = x.astype(jnp.float32)
        h = (xf - xf.mean(-1, keepdims=True)) * jax.lax.rsqrt(xf.var(-1, keepdims=True) + 1e-5)
        h = (h.astype(x.dtype) * params["ln"]).reshape(b * s, d)
        h = jax.nn.gelu(checkpoint_name(_fp8_matmul(h, params["w1"]), "ffn1"))
        out = checkpoint_name(_fp8_matmul(h, params["w2"]), "ffn2").reshape(b, s, d)
        return jnp.mean(jnp.square((x + out).astype(jnp.float32)))

    return loss


loss = make_loss()


def loss_inputs(batch: int = 2, seq: int = 32, d_model: int = 64, d_ff: int = 128,
                dtype: str = "float32") -> tuple[Params, jax.ShapeDtypeStruct]:
    """Shapes only: (params, x [batch, seq, d_model])."""
    if (batch * seq) % BLOCK or d_model % BLOCK or d_ff % BLOCK:
        raise ValueError(f"MXFP8 needs batch*seq, d_model and d_ff to be multiples of {BLOCK}")
    dt = jnp.dtype(dtype)
    sds = jax.ShapeDtypeStruct
    params = {"ln": sds((d_model,), dt), "w1": sds((d_model, d_ff), dt),
              "w2": sds((d_ff, d_model), dt)}
    return params, sds((batch, seq, d_model), dt)


def _reference_scaled_matmul(a: jax.Array, b: jax.Array, a_scales: jax.Array, b_scales: jax.Array,
                             *, preferred_element_type: jnp.dtype) -> list[jax.Array]:
    """Dequantize and contract: the maths scaled_matmul's docstring defines."""
    a = a.astype(jnp.float32) * jnp.repeat(a_scales.astype(jnp.float32), a.shape[-1] // a_scales.shape[-1], -1)
    b = b.astype(jnp.float32) * jnp.repeat(b_scales.astype(jnp.float32), b.shape[-1] // b_scales.shape[-1], -1)
    return [jnp.einsum("bmk,bnk->bmn", a, b).astype(preferred_element_type)]


def enable_cpu_reference_lowering() -> None:
    """Register a CPU lowering for ``scaled_matmul_wrapper`` so the block runs on CPU.

    The primitive is found through a traced jaxpr (public API) rather than jax._src.
    """
    f8, e8 = jnp.float8_e4m3fn, jnp.float8_e8m0fnu
    shapes = [((1, BLOCK, BLOCK), f8), ((1, BLOCK, BLOCK), f8), ((1, BLOCK, 1), e8), ((1, BLOCK, 1), e8)]
    jaxpr = jax.make_jaxpr(jax.nn.scaled_matmul)(*[jax.ShapeDtypeStruct(s, d) for s, d in shapes])
    todo, prim = list(jaxpr.jaxpr.eqns), None
    while todo and prim is None:
        eqn = todo.pop()
        if eqn.primitive.name == "scaled_matmul_wrapper":
            prim = eqn.primitive
        for v in eqn.params.values():  # look inside the jit that wraps it
            inner = getattr(v, "jaxpr", v)
            todo.extend(getattr(inner, "eqns", ()))
    if prim is None:
        raise RuntimeError("scaled_matmul_wrapper not found in jax.nn.scaled_matmul's jaxpr")
    mlir.register_lowering(prim, mlir.lower_fun(_reference_scaled_matmul, multiple_results=True),
                           platform="cpu")
