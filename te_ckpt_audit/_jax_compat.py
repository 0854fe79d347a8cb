"""Every private JAX import of te-ckpt-audit lives here, behind a version check.

JAX moves its internals between releases. Keeping them in one module means a JAX upgrade breaks
one file, and `tests/test_jax_compat.py` names exactly which symbol moved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend.core as jex
from jax.extend.core import primitives as _prims

SUPPORTED = ((0, 10, 0), (0, 11, 0))  # [lowest, highest) jax versions this module was written for


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


JAX_VERSION = _version_tuple(jax.__version__)
if not (SUPPORTED[0] <= JAX_VERSION < SUPPORTED[1]):  # pragma: no cover - depends on the install
    raise ImportError(
        f"te-ckpt-audit supports jax >= 0.10.0, < 0.11 (found {jax.__version__}); "
        "install a supported jax: pip install 'jax>=0.10.2,<0.11'"
    )

from jax._src import linear_util as _lu  # noqa: E402
from jax._src import source_info_util as _siu  # noqa: E402
from jax._src.ad_checkpoint import saved_residuals as _saved_residuals  # noqa: E402
from jax._src.interpreters import ad as _ad  # noqa: E402
from jax._src.interpreters import partial_eval as _pe  # noqa: E402
from jax._src.tree_util import FlatTree as _FlatTree  # noqa: E402

# Public names re-exported so the rest of the package imports JAX's jaxpr types from one place.
Jaxpr = jex.Jaxpr
ClosedJaxpr = jex.ClosedJaxpr
JaxprEqn = jex.JaxprEqn
Literal = jex.Literal
Var = jex.Var
Primitive = jex.Primitive
jaxpr_as_fun = jex.jaxpr_as_fun

remat_p = _prims.remat_p
name_p = _prims.name_p
reduce_precision_p = _prims.reduce_precision_p
device_put_p = _prims.device_put_p
scan_p = _prims.scan_p
while_p = _prims.while_p
cond_p = _prims.cond_p
custom_vjp_call_p = _prims.custom_vjp_call_p
custom_jvp_call_p = _prims.custom_jvp_call_p
dot_general_p = _prims.dot_general_p
conv_general_dilated_p = _prims.conv_general_dilated_p

Saveable = _pe.Saveable
Recompute = _pe.Recompute
Offloadable = _pe.Offloadable
SaveableType = _pe.SaveableType
RecomputeType = _pe.RecomputeType

TAG_PREFIX = "tca:"


def eqn_tag(eqn: Any) -> str | None:
    """The innermost te-ckpt-audit tag in an equation's name stack, if any."""
    for elem in reversed(eqn.source_info.name_stack.stack):
        if isinstance(elem, _siu.Scope) and elem.name.startswith(TAG_PREFIX):
            return elem.name[len(TAG_PREFIX) :]
    return None


def with_tag(eqn: Any, tag: str, params: dict[str, Any]) -> Any:
    """A copy of `eqn` whose name stack ends in `tag`.

    Transformations (jvp, partial evaluation, remat's recompute) copy name stacks onto the
    equations they derive, so the tag lets us find the original equation in their output.
    """
    info = eqn.source_info
    tagged = info.replace(name_stack=info.name_stack.extend(TAG_PREFIX + tag))
    return eqn.replace(params=params, source_info=tagged)


def user_frames(eqn: Any) -> Iterator[Any]:
    """Frames of the equation's traceback outside JAX (innermost first)."""
    return _siu.user_frames(eqn.source_info.traceback)


def wrap_jaxpr_thunk(thunk: Any, transform: Callable[[Any], Any]) -> Any:
    """Wrap a custom_vjp `fwd_jaxpr_thunk` or custom_jvp `jvp_jaxpr_fun` (each returns a tuple
    whose first item is a jaxpr) so that the jaxpr passes through `transform`; memoized."""
    cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def wrapped(*zeros: Any) -> tuple[Any, ...]:
        if zeros not in cache:
            jaxpr, *rest = thunk.call_wrapped(*zeros)
            cache[zeros] = (transform(jaxpr), *rest)
        return cache[zeros]

    return _lu.wrap_init(wrapped, debug_info=thunk.debug_info)


def linearize_for_vjp(fun: Callable[..., Any], args: Sequence[Any]) -> tuple[list[Any], Any]:
    """Residuals and tangent jaxpr of `fun` at `args`, exactly as `jax.vjp` computes them.

    `jax.vjp` calls this very function (`ad.linearize(..., is_vjp=True)`) and keeps the returned
    residuals; `jax.ad_checkpoint.print_saved_residuals` lists them. The tangent jaxpr's constvars
    are the residuals, in order; remat's recomputation lives in its equations.
    """
    _, _, tangent_jaxpr, residuals = _ad.linearize(
        lambda *xs: fun(*xs), _FlatTree.flatten(tuple(args)), is_vjp=True
    )
    return list(residuals), tangent_jaxpr


def saved_residuals(fn: Callable[..., Any], *args: Any) -> list[tuple[Any, str]]:
    """JAX's own residual list (the data behind `print_saved_residuals`); the tests' ground truth."""
    return _saved_residuals(fn, *args)


DropVar = jex.DropVar
