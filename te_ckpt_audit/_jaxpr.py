"""Small, generic helpers over jaxprs: sub-jaxprs of an equation, shapes, FLOPs, source lines."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

import jax
import numpy as np

from . import _jax_compat as jc
from .policies import SCALED_MATMUL_NAME, is_te_gemm

_GEMM_NAMES = {"dot_general", "conv_general_dilated", SCALED_MATMUL_NAME, "ragged_dot", "ragged_dot_general"}


AnyJaxpr: TypeAlias = jc.Jaxpr | jc.ClosedJaxpr  # a body as an equation holds it: open or closed
Shaped: TypeAlias = jc.AbstractValue | jax.ShapeDtypeStruct  # a value's type: its shape and dtype, where it has them
_JAXPR_TYPES = (jc.Jaxpr, jc.ClosedJaxpr)
_LEAF_TYPES = frozenset({bool, int, float, str, type(None)})  # what most params hold: skipped fast


def _is_jaxpr(x: object) -> bool:
    return type(x) not in _LEAF_TYPES and isinstance(x, _JAXPR_TYPES)


def sub_jaxprs(params: jc.Params) -> Iterator[tuple[str, int | None, AnyJaxpr]]:
    """(param name, index in a tuple or None, Jaxpr | ClosedJaxpr) for each sub-jaxpr param.

    Jaxprs sit in params directly or in tuples (cond's branches, custom_linear_solve's named
    tuple, whose unused slots are None); any other container is left alone."""
    for key, value in params.items():
        if _is_jaxpr(value):
            yield key, None, value
        elif isinstance(value, tuple | list):
            for i, item in enumerate(value):
                if _is_jaxpr(item):
                    yield key, i, item


def _rebuilt(container: tuple[object, ...] | list[object], items: list[object]) -> tuple[object, ...] | list[object]:
    """`container`'s own type holding `items`: a named tuple stays that named tuple."""
    if isinstance(container, tuple) and hasattr(container, "_fields"):
        named: Any = type(container)
        return named(*items)
    return type(container)(items)


def map_sub_jaxprs(
    params: jc.Params,
    fn: Callable[[int, jc.Jaxpr], jc.Jaxpr],
    memo: dict[int, tuple[AnyJaxpr, AnyJaxpr]] | None = None,
) -> jc.Params:
    """A copy of `params` with the j-th sub-jaxpr's open Jaxpr replaced by `fn(j, jaxpr)`.

    With `memo`, a sub-jaxpr object shared by several equations (JAX reuses one traced body for
    every call of the same checkpointed layer) is rewritten once and stays shared, which keeps
    JAX's own per-jaxpr caches effective when the result is differentiated.
    """
    new = dict(params)
    for j, (key, idx, sub) in enumerate(list(sub_jaxprs(params))):
        if memo is not None and id(sub) in memo:
            out = memo[id(sub)][1]
        else:
            opened = open_jaxpr(sub)
            out = fn(j, opened)
            if out is opened:  # unchanged: the same object, so that JAX's caches still know it
                out = sub
            elif isinstance(sub, jc.ClosedJaxpr):
                out = sub.replace(jaxpr=out)
            if memo is not None:
                memo[id(sub)] = (sub, out)  # the original is kept alive so its id stays unique
        if idx is None:
            new[key] = out
        else:
            items = list(new[key])
            items[idx] = out
            new[key] = _rebuilt(new[key], items)
    return new


def has_body(eqn: jc.JaxprEqn) -> bool:
    """Whether the equation holds sub-jaxprs (scan, jit, checkpoint, cond, ...)."""
    return next(iter(sub_jaxprs(eqn.params)), None) is not None


def open_jaxpr(j: AnyJaxpr) -> jc.Jaxpr:
    return j.jaxpr if isinstance(j, jc.ClosedJaxpr) else j


def _dtype(aval: Shaped) -> Any:  # np.dtype, or an extended dtype (PRNG keys)
    dtype = getattr(aval, "dtype", None)
    if dtype is None or isinstance(dtype, np.dtype):
        return dtype
    try:
        return np.dtype(dtype)
    except TypeError:  # an extended dtype (PRNG keys: key<fry>): JAX's own dtype object
        return dtype


def aval_bytes(aval: Shaped) -> int:
    """Bytes the value occupies: for a PRNG key array, its key data (key<fry> is 2 x uint32)."""
    dtype = _dtype(aval)
    if dtype is None:
        return 0
    return int(math.prod(aval_shape(aval))) * int(dtype.itemsize)


def aval_shape(aval: Shaped) -> tuple[int, ...]:
    return tuple(int(d) for d in getattr(aval, "shape", ()))


def aval_dtype(aval: Shaped) -> str:
    """The dtype as JAX prints it ("bfloat16", "key<fry>")."""
    dtype = _dtype(aval)
    return str(dtype) if dtype is not None else type(aval).__name__


def is_gemm(prim: object) -> bool:
    """A JAX matmul-like primitive (TE's GEMMs are told apart by `is_te_gemm`)."""
    return getattr(prim, "name", None) in _GEMM_NAMES


def leaf_flops(eqn: jc.JaxprEqn) -> int:
    """FLOPs of one non-structural equation.

    GEMMs (JAX's and TE's) count 2*M*N*K from shapes and contracting dims; everything else counts
    one operation per output element.
    """
    prim = eqn.primitive
    outs = [v.aval for v in eqn.outvars]
    out_elems = sum(int(math.prod(getattr(a, "shape", ()))) for a in outs)
    if prim is jc.name_p or prim is jc.reduce_precision_p or prim is jc.device_put_p:
        return 0
    if not (is_gemm(prim) or is_te_gemm(prim)) or not eqn.invars:
        return out_elems
    lhs = eqn.invars[0].aval
    lhs_shape = aval_shape(lhs)
    first_out = int(math.prod(getattr(outs[0], "shape", ()))) if outs else 0
    k = _contracted_size(eqn, lhs_shape)
    return 2 * first_out * k


def _contracted_size(eqn: jc.JaxprEqn, lhs_shape: tuple[int, ...]) -> int:
    params = eqn.params
    if "dimension_numbers" in params and eqn.primitive.name == "dot_general":
        (lhs_contract, _), _ = params["dimension_numbers"]
        return int(math.prod(lhs_shape[d] for d in lhs_contract))
    if eqn.primitive.name == "conv_general_dilated":
        rhs_shape = aval_shape(eqn.invars[1].aval)
        spec = params["dimension_numbers"].rhs_spec  # (out feature, in feature, spatial...)
        return int(math.prod(rhs_shape)) // max(rhs_shape[spec[0]], 1)
    dims = params.get("contracting_dims")
    if dims:
        lhs_dims = dims[0] if isinstance(dims[0], tuple | list) else dims
        try:
            return int(math.prod(lhs_shape[d] for d in lhs_dims))
        except (IndexError, TypeError):
            pass
    return lhs_shape[-1] if lhs_shape else 1
