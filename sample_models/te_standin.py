"""CPU stand-in for Transformer Engine's JAX GEMMs and FP8 quantization, used only when TE does not import.

TE's JAX extension needs CUDA, so on CPU the TE sample model and the tests bind two
primitives carrying TE's outer-primitive names (``te_gemm_v2_ffi_wrapper``,
``te_grouped_gemm_ffi_wrapper``) inside a ``jax.custom_vjp`` shaped like TE's dense
layer: forward and backward both bind the GEMM primitive, and the residuals are the
GEMM inputs. With ``fp8``, a third primitive named as TE's quantize
(``te_dbias_quantize_ffi_wrapper``, current scaling) quantizes the GEMM inputs and the gradient,
and the residuals are the FP8 casts, as in TE's dense under an FP8 recipe. The primitive objects
carry ``te_ckpt_audit_standin = True`` so the tool can label them as a stand-in. When
``transformer_engine.jax`` imports, ``dense`` and ``grouped_dense`` call real TE instead.
"""
from __future__ import annotations

# te-ckpt-audit attributes a GEMM to the model line that called dense(), not to this file.
__te_ckpt_audit_library__ = True

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import mlir

Dims = tuple[tuple[int, ...], tuple[int, ...]]

try:  # TE raises OSError/RuntimeError too when its CUDA library cannot load.
    import transformer_engine.jax  # noqa: F401
    from transformer_engine.jax import dense as _te_dense_module

    USING_REAL_TE: bool = True
except (ImportError, OSError, RuntimeError):
    _te_dense_module = None
    USING_REAL_TE = False


# --- GEMM: out = contract(lhs, rhs) over contracting_dims, no batch dims -------------

def _gemm_impl(lhs: jax.Array, rhs: jax.Array, *scales: jax.Array, contracting_dims: Dims, out_dtype: Any = None
               ) -> jax.Array:
    """Reference maths: a plain dot_general, output in the lhs dtype; FP8 operands come with their
    scale_invs, as TE's GEMM takes them, and give `out_dtype`."""
    out = lax.dot_general(lhs.astype(jnp.float32), rhs.astype(jnp.float32), (contracting_dims, ((), ())),
                          preferred_element_type=jnp.float32)
    for scale in scales:
        out = out * scale
    return out.astype(out_dtype or lhs.dtype)


def _gemm_abstract(lhs: ShapedArray, rhs: ShapedArray, *scales: ShapedArray, contracting_dims: Dims,
                   out_dtype: Any = None) -> ShapedArray:
    """Shape rule: lhs free dims then rhs free dims, as dot_general without batch dims."""
    lc, rc = contracting_dims
    if [lhs.shape[d] for d in lc] != [rhs.shape[d] for d in rc]:
        raise TypeError(f"te_gemm stand-in: contracting sizes differ: {lhs.shape} {rhs.shape} {contracting_dims}")
    lf = [s for i, s in enumerate(lhs.shape) if i not in lc]
    rf = [s for i, s in enumerate(rhs.shape) if i not in rc]
    return ShapedArray((*lf, *rf), out_dtype or lhs.dtype)


GEMM_PRIMITIVE = Primitive("te_gemm_v2_ffi_wrapper")
GEMM_PRIMITIVE.te_ckpt_audit_standin = True
GEMM_PRIMITIVE.def_impl(_gemm_impl)
GEMM_PRIMITIVE.def_abstract_eval(_gemm_abstract)
mlir.register_lowering(GEMM_PRIMITIVE, mlir.lower_fun(_gemm_impl, multiple_results=False))


def gemm(lhs: jax.Array, rhs: jax.Array, contracting_dims: Dims) -> jax.Array:
    """Bind the stand-in GEMM with hashable (tuple) contracting dims."""
    dims = (tuple(contracting_dims[0]), tuple(contracting_dims[1]))
    return GEMM_PRIMITIVE.bind(lhs, rhs, contracting_dims=dims)


def fp8_gemm(lhs: jax.Array, lhs_scale: jax.Array, rhs: jax.Array, rhs_scale: jax.Array, contracting_dims: Dims,
             out_dtype: Any) -> jax.Array:
    """The stand-in GEMM on FP8 operands with their scale_invs (TE's GEMM rescales inside)."""
    dims = (tuple(contracting_dims[0]), tuple(contracting_dims[1]))
    return GEMM_PRIMITIVE.bind(lhs, rhs, lhs_scale, rhs_scale, contracting_dims=dims, out_dtype=jnp.dtype(out_dtype))


# --- quantize: TE's te_dbias_quantize_ffi_wrapper, current (per-tensor) scaling ----------
# Its outputs, in TE's order: rowwise data, columnwise data ([1]: not made, TE transposes the
# rowwise copy instead), scale_inv, columnwise scale_inv, updated amax, dbias ([1]: none).

FP8_MAX = {jnp.dtype(jnp.float8_e4m3fn): 448.0, jnp.dtype(jnp.float8_e5m2): 57344.0}


def _quantize_impl(x: jax.Array, *, out_dtype: Any, scaling_mode: str, q_layout: str, is_dbias: bool
                   ) -> list[jax.Array]:
    """x scaled to the format's range by its absolute maximum, cast; the inverse scale kept."""
    amax = jnp.max(jnp.abs(x.astype(jnp.float32))).reshape(1)
    scale = FP8_MAX[jnp.dtype(out_dtype)] / jnp.maximum(amax, 1e-12)
    data = (x.astype(jnp.float32) * scale).astype(out_dtype)
    one = jnp.ones((1,), jnp.float32)
    return [data, jnp.zeros((1,), out_dtype), 1.0 / scale, one, amax, jnp.zeros((1,), x.dtype)]


def _quantize_abstract(x: ShapedArray, *, out_dtype: Any, scaling_mode: str, q_layout: str, is_dbias: bool
                       ) -> list[ShapedArray]:
    f32 = jnp.dtype(jnp.float32)
    return [ShapedArray(x.shape, out_dtype), ShapedArray((1,), out_dtype), ShapedArray((1,), f32),
            ShapedArray((1,), f32), ShapedArray((1,), f32), ShapedArray((1,), x.dtype)]


QUANTIZE_PRIMITIVE = Primitive("te_dbias_quantize_ffi_wrapper")
QUANTIZE_PRIMITIVE.multiple_results = True
QUANTIZE_PRIMITIVE.te_ckpt_audit_standin = True
QUANTIZE_PRIMITIVE.def_impl(_quantize_impl)
QUANTIZE_PRIMITIVE.def_abstract_eval(_quantize_abstract)
mlir.register_lowering(QUANTIZE_PRIMITIVE, mlir.lower_fun(_quantize_impl, multiple_results=True))


def quantize(x: jax.Array, out_dtype: Any) -> tuple[jax.Array, jax.Array]:
    """(FP8 data, its scale_inv f32[1]), as TE's current-scaling quantizer binds it (rowwise)."""
    outs = QUANTIZE_PRIMITIVE.bind(x, out_dtype=jnp.dtype(out_dtype), scaling_mode="CURRENT_TENSOR_SCALING",
                                   q_layout="ROWWISE", is_dbias=False)
    return outs[0], outs[2]


# --- Grouped GEMM: three layouts, as TE's grouped dense uses them ---------------------
# ((1,), (1,)): lhs (M, K) x rhs (G, K, N) -> (M, N)     forward
# ((1,), (2,)): lhs (M, N) x rhs (G, K, N) -> (M, K)     dgrad
# ((0,), (0,)): lhs (M, K) x rhs (M, N)    -> (G, K, N)  wgrad (ragged contraction)

def _grouped_impl(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                  contracting_dims: Dims) -> jax.Array:
    """Reference maths via lax.ragged_dot / ragged_dot_general, output in the lhs dtype."""
    if contracting_dims == ((1,), (1,)):
        out = lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)
    elif contracting_dims == ((1,), (2,)):
        out = lax.ragged_dot(lhs, jnp.swapaxes(rhs, 1, 2), group_sizes,
                             preferred_element_type=jnp.float32)
    elif contracting_dims == ((0,), (0,)):
        dims = lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(((0,), (0,)), ((), ())),
            lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
        out = lax.ragged_dot_general(lhs, rhs, group_sizes, dims,
                                     preferred_element_type=jnp.float32)
    else:
        raise ValueError(f"te_grouped_gemm stand-in: unsupported contracting_dims {contracting_dims}")
    return out.astype(lhs.dtype)


def _grouped_abstract(lhs: ShapedArray, rhs: ShapedArray, group_sizes: ShapedArray, *,
                      contracting_dims: Dims) -> ShapedArray:
    """Shape rule for the three layouts above."""
    if contracting_dims == ((1,), (1,)):
        shape = (lhs.shape[0], rhs.shape[2])
    elif contracting_dims == ((1,), (2,)):
        shape = (lhs.shape[0], rhs.shape[1])
    elif contracting_dims == ((0,), (0,)):
        shape = (group_sizes.shape[0], lhs.shape[1], rhs.shape[1])
    else:
        raise ValueError(f"te_grouped_gemm stand-in: unsupported contracting_dims {contracting_dims}")
    return ShapedArray(shape, lhs.dtype)


GROUPED_GEMM_PRIMITIVE = Primitive("te_grouped_gemm_ffi_wrapper")
GROUPED_GEMM_PRIMITIVE.te_ckpt_audit_standin = True
GROUPED_GEMM_PRIMITIVE.def_impl(_grouped_impl)
GROUPED_GEMM_PRIMITIVE.def_abstract_eval(_grouped_abstract)
mlir.register_lowering(GROUPED_GEMM_PRIMITIVE,
                       mlir.lower_fun(_grouped_impl, multiple_results=False))


def grouped_gemm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
                 contracting_dims: Dims) -> jax.Array:
    """Bind the stand-in grouped GEMM."""
    dims = (tuple(contracting_dims[0]), tuple(contracting_dims[1]))
    return GROUPED_GEMM_PRIMITIVE.bind(lhs, rhs, group_sizes, contracting_dims=dims)


# --- dense layers: custom_vjp whose forward and backward bind the GEMM ----------------

@jax.custom_vjp
def _standin_dense(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x [..., K] @ kernel [K, N] through the stand-in GEMM."""
    return gemm(x, kernel, ((x.ndim - 1,), (0,)))


def _dense_fwd(x: jax.Array, kernel: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Forward binds the GEMM and keeps its inputs, as TE's dense does."""
    return gemm(x, kernel, ((x.ndim - 1,), (0,))), (x, kernel)


def _dense_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    """dgrad = g @ kernel^T, wgrad = x^T @ g, both through the GEMM."""
    x, kernel = res
    dgrad = gemm(g, kernel, ((g.ndim - 1,), (1,)))
    lead = tuple(range(x.ndim - 1))
    wgrad = gemm(x, g, (lead, lead))
    return dgrad, wgrad


_standin_dense.defvjp(_dense_fwd, _dense_bwd)


@jax.custom_vjp
def _standin_grouped_dense(x: jax.Array, kernel: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """x (M, K) rows grouped by group_sizes, @ kernel (G, K, N) -> (M, N)."""
    return grouped_gemm(x, kernel, group_sizes, ((1,), (1,)))


def _grouped_fwd(x: jax.Array, kernel: jax.Array, group_sizes: jax.Array) -> tuple[jax.Array, Any]:
    """Forward binds the grouped GEMM and keeps its inputs."""
    return grouped_gemm(x, kernel, group_sizes, ((1,), (1,))), (x, kernel, group_sizes)


def _grouped_bwd(res: Any, g: jax.Array) -> tuple[jax.Array, jax.Array, None]:
    """dgrad and wgrad through the grouped GEMM; integer group sizes get no cotangent."""
    x, kernel, group_sizes = res
    dgrad = grouped_gemm(g, kernel, group_sizes, ((1,), (2,)))
    wgrad = grouped_gemm(x, g, group_sizes, ((0,), (0,)))
    return dgrad, wgrad, None


_standin_grouped_dense.defvjp(_grouped_fwd, _grouped_bwd)


# --- FP8 dense: TE's dense under a current-scaling recipe -------------------------------
# Forward: quantize x and the kernel (E4M3), GEMM the FP8 data, rescale. It keeps what TE's keeps:
# the FP8 kernel and a transposed FP8 copy of x (TE's columnwise layout) with their scale_invs,
# each under the quantizer's checkpoint name when one is given (TE's quantization_checkpoint_name).
# Backward: quantize the gradient (E5M2), two FP8 GEMMs.

def _named(x: jax.Array, name: str | None) -> jax.Array:
    return x if name is None else checkpoint_name(x, name)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _standin_fp8_dense(x: jax.Array, kernel: jax.Array, name: str | None) -> jax.Array:
    return _fp8_dense_fwd(x, kernel, name)[0]


def _fp8_dense_fwd(x: jax.Array, kernel: jax.Array, name: str | None) -> tuple[jax.Array, Any]:
    xq, x_scale = quantize(x, jnp.float8_e4m3fn)
    kq, k_scale = quantize(kernel, jnp.float8_e4m3fn)
    out = fp8_gemm(xq, x_scale, kq, k_scale, ((x.ndim - 1,), (0,)), x.dtype)
    xt = jnp.moveaxis(xq, -1, 0)  # the columnwise copy wgrad needs
    return out, tuple(_named(r, name) for r in (xt, kq, x_scale, k_scale))


def _fp8_dense_bwd(name: str | None, res: Any, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    xt, kq, x_scale, k_scale = res
    gq, g_scale = quantize(g, jnp.float8_e5m2)
    dgrad = fp8_gemm(gq, g_scale, kq, k_scale, ((g.ndim - 1,), (1,)), g.dtype)
    lead = tuple(range(g.ndim - 1))
    wgrad = fp8_gemm(xt, x_scale, gq, g_scale, (tuple(d + 1 for d in lead), lead), g.dtype)
    return dgrad, wgrad


_standin_fp8_dense.defvjp(_fp8_dense_fwd, _fp8_dense_bwd)


def dense(x: jax.Array, kernel: jax.Array, fp8: bool = False, quantization_name: str | None = None) -> jax.Array:
    """x [..., K] @ kernel [K, N]: real TE's dense when it imports, else the stand-in. With `fp8`,
    under current scaling, its quantizers named `quantization_name` (TE's quantizer checkpoint name)."""
    if _te_dense_module is not None:
        quantizers = {}
        if fp8:
            from transformer_engine.common.recipe import Float8CurrentScaling
            from transformer_engine.jax.quantize import QuantizerFactory

            quantizers["quantizer_set"] = QuantizerFactory.create_set(
                fp8_recipe=Float8CurrentScaling(), checkpoint_name=quantization_name)
        return _te_dense_module.dense(x, kernel, contracting_dims=((x.ndim - 1,), (0,)), **quantizers)
    return _standin_fp8_dense(x, kernel, quantization_name) if fp8 else _standin_dense(x, kernel)


def grouped_dense(x: jax.Array, kernel: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Grouped x (M, K) @ kernel (G, K, N): real TE's grouped dense when it imports."""
    if _te_dense_module is not None and hasattr(_te_dense_module, "grouped_dense"):
        return _te_dense_module.grouped_dense(x, kernel, group_sizes,
                                              contracting_dims=((1,), (1,)))
    return _standin_grouped_dense(x, kernel, group_sizes)
