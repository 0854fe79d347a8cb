"""CPU stand-in for Transformer Engine's JAX GEMMs, used only when TE does not import.

TE's JAX extension needs CUDA, so on CPU the TE sample model and the tests bind two
primitives carrying TE's outer-primitive names (``te_gemm_v2_ffi_wrapper``,
``te_grouped_gemm_ffi_wrapper``) inside a ``jax.custom_vjp`` shaped like TE's dense
layer: forward and backward both bind the GEMM primitive, and the residuals are the
GEMM inputs. Both primitive objects carry ``te_ckpt_audit_standin = True`` so the tool
can label them as a stand-in. When ``transformer_engine.jax`` imports, ``dense`` and
``grouped_dense`` call real TE instead (best effort; not testable without CUDA).
"""
from __future__ import annotations

# te-ckpt-audit attributes a GEMM to the model line that called dense(), not to this file.
__te_ckpt_audit_library__ = True

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
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

def _gemm_impl(lhs: jax.Array, rhs: jax.Array, *, contracting_dims: Dims) -> jax.Array:
    """Reference maths: a plain dot_general, output in the lhs dtype."""
    out = lax.dot_general(lhs, rhs, (contracting_dims, ((), ())),
                          preferred_element_type=jnp.float32)
    return out.astype(lhs.dtype)


def _gemm_abstract(lhs: ShapedArray, rhs: ShapedArray, *, contracting_dims: Dims) -> ShapedArray:
    """Shape rule: lhs free dims then rhs free dims, as dot_general without batch dims."""
    lc, rc = contracting_dims
    if [lhs.shape[d] for d in lc] != [rhs.shape[d] for d in rc]:
        raise TypeError(f"te_gemm stand-in: contracting sizes differ: {lhs.shape} {rhs.shape} {contracting_dims}")
    lf = [s for i, s in enumerate(lhs.shape) if i not in lc]
    rf = [s for i, s in enumerate(rhs.shape) if i not in rc]
    return ShapedArray((*lf, *rf), lhs.dtype)


GEMM_PRIMITIVE = Primitive("te_gemm_v2_ffi_wrapper")
GEMM_PRIMITIVE.te_ckpt_audit_standin = True
GEMM_PRIMITIVE.def_impl(_gemm_impl)
GEMM_PRIMITIVE.def_abstract_eval(_gemm_abstract)
mlir.register_lowering(GEMM_PRIMITIVE, mlir.lower_fun(_gemm_impl, multiple_results=False))


def gemm(lhs: jax.Array, rhs: jax.Array, contracting_dims: Dims) -> jax.Array:
    """Bind the stand-in GEMM with hashable (tuple) contracting dims."""
    dims = (tuple(contracting_dims[0]), tuple(contracting_dims[1]))
    return GEMM_PRIMITIVE.bind(lhs, rhs, contracting_dims=dims)


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


def dense(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x [..., K] @ kernel [K, N]: real TE's dense when it imports, else the stand-in."""
    if _te_dense_module is not None:
        return _te_dense_module.dense(x, kernel, contracting_dims=((x.ndim - 1,), (0,)))
    return _standin_dense(x, kernel)


def grouped_dense(x: jax.Array, kernel: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Grouped x (M, K) @ kernel (G, K, N): real TE's grouped dense when it imports."""
    if _te_dense_module is not None and hasattr(_te_dense_module, "grouped_dense"):
        return _te_dense_module.grouped_dense(x, kernel, group_sizes,
                                              contracting_dims=((1,), (1,)))
    return _standin_grouped_dense(x, kernel, group_sizes)
