"""Checkpoint policies that know Transformer Engine's GEMMs.

Drop-in for ``jax.checkpoint(policy=...)`` and ``flax.linen.remat(policy=...)``, with the names and
contract of TE's ``transformer_engine/jax/checkpoint_policies.py``::

    import jax
    from te_ckpt_audit.policies import checkpoint_dots_and_te_gemms

    layer = jax.checkpoint(layer, policy=checkpoint_dots_and_te_gemms)

JAX's dot policies match ``dot_general`` and convolutions only, so ``checkpoint_dots`` recomputes
every TE GEMM in the backward pass. These policies also save TE's GEMM and grouped-GEMM outer
primitives, and JAX's ``scaled_matmul_wrapper`` (``jax.nn.scaled_matmul``), as TE's own module does.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping

import jax
from jax.extend.core import Primitive

from . import _jax_compat

__all__ = [
    "TE_GEMM_NAMES",
    "TE_QUANTIZE_NAMES",
    "SaveFromBoth",
    "checkpoint_dots_and_te_gemms",
    "dots_and_te_gemms_with_no_batch_dims",
    "is_te_gemm",
    "is_te_quantize",
    "te_gemms_saveable",
]

# Outer-primitive names of TE's GemmPrimitive and GroupedGemmPrimitive in every release:
# `te_gemm_ffi_wrapper` before March 2026, `te_gemm_v2_ffi_wrapper` after. The grouped GEMM's
# "d2h group sizes" primitive moves no activations and is deliberately absent.
TE_GEMM_NAMES = frozenset(
    {"te_gemm_ffi_wrapper", "te_gemm_v2_ffi_wrapper", "te_grouped_gemm_ffi_wrapper"}
)
SCALED_MATMUL_NAME = "scaled_matmul_wrapper"

# Outer-primitive names of TE's quantizing primitives (TE 2.20.2, cpp_extensions): quantize (with
# dbias), grouped quantize, and the fused norm, activation and dactivation kernels, which quantize
# when their scaling mode is not NO_SCALING (TE also binds them unquantized).
TE_QUANTIZE_NAMES = frozenset({"te_dbias_quantize_ffi_wrapper", "te_grouped_quantize_ffi_wrapper"})
TE_FUSED_QUANTIZE_NAMES = frozenset(
    {"te_norm_forward_ffi_wrapper", "te_act_lu_ffi_wrapper", "te_dact_dbias_quantize_ffi_wrapper"}
)
_QUANTIZE_CLASSES = ("BaseDBiasQuantizePrimitive", "GroupedQuantizePrimitive")
_FUSED_CLASSES = ("NormFwdPrimitive", "ActLuPrimitive", "BaseDActLuDBiasQuantizePrimitive")
QUANTIZED_OUTPUTS = (0, 1)  # rowwise and columnwise data, in every quantizing primitive's outputs
SCALE_OUTPUTS = (2, 3, 4)  # their scale_inv, columnwise scale_inv, updated amax

# A policy: (prim, *avals, **params) -> True/False, Saveable, Recompute or Offloadable(src, dst).
Policy = Callable[..., object]


@functools.cache
def _real_te_primitives() -> frozenset[Primitive] | None:
    """TE's outer GEMM primitives when TE imports, else None (then names decide)."""
    try:  # the module, not the function of the same name that cpp_extensions re-exports
        gemm = importlib.import_module("transformer_engine.jax.cpp_extensions.gemm")
    except Exception:  # TE absent, or present without CUDA: fall back to names
        return None
    prims = set()
    for cls_name in ("GemmPrimitive", "GroupedGemmPrimitive"):
        cls = getattr(gemm, cls_name, None)
        outer = getattr(cls, "outer_primitive", None)
        if outer is not None:
            prims.add(outer)
    return frozenset(prims) or None


@functools.cache
def _real_te_quantizers() -> tuple[frozenset[Primitive], frozenset[Primitive]] | None:
    """TE's outer quantize primitives and its fused ones, when TE imports."""
    found: list[set[Primitive]] = [set(), set()]
    for module, groups in (("quantization", (_QUANTIZE_CLASSES, ())), ("normalization", ((), _FUSED_CLASSES)),
                           ("activation", ((), _FUSED_CLASSES))):
        try:
            mod = importlib.import_module(f"transformer_engine.jax.cpp_extensions.{module}")
        except Exception:  # TE absent, or present without CUDA: names decide
            return None
        for kind, names in enumerate(groups):
            for cls_name in names:
                outer = getattr(getattr(mod, cls_name, None), "outer_primitive", None)
                if outer is not None:
                    found[kind].add(outer)
    return (frozenset(found[0]), frozenset(found[1])) if found[0] else None


def is_te_quantize(prim: object, params: Mapping[str, object] | None = None) -> bool:
    """True for TE's quantizing primitives (by identity where TE imports, else by name): its
    quantize and grouped quantize, and its fused norm, activation and dactivation kernels when their
    `scaling_mode` quantizes."""
    real = _real_te_quantizers()
    if real is not None and prim in real[0] | real[1]:
        plain, fused = prim in real[0], prim in real[1]
    else:  # a primitive with TE's name that is not TE's own (the CPU stand-in) matches by name
        name = getattr(prim, "name", None)
        plain, fused = name in TE_QUANTIZE_NAMES, name in TE_FUSED_QUANTIZE_NAMES
    if plain:
        return True
    mode = str((params or {}).get("scaling_mode", ""))
    return fused and bool(mode) and not mode.endswith("NO_SCALING")


def is_te_gemm(prim: object) -> bool:
    """True for TE's GEMM and grouped-GEMM outer primitives (by identity where TE imports)."""
    real = _real_te_primitives()
    if real is not None and prim in real:
        return True
    # Where TE imports, its primitives match by identity above; a primitive with a TE name that is
    # not TE's own (the CPU stand-in of the sample models) still matches by name.
    return getattr(prim, "name", None) in TE_GEMM_NAMES


def is_te_standin(prim: object) -> bool:
    """A TE GEMM or quantize primitive that is the labelled CPU stand-in of the sample models, not TE's own."""
    te = is_te_gemm(prim) or getattr(prim, "name", None) in TE_QUANTIZE_NAMES | TE_FUSED_QUANTIZE_NAMES
    return te and bool(getattr(prim, "te_ckpt_audit_standin", False))


def te_gemms_saveable(prim: object, *_: object, **__: object) -> bool:
    """Save the outputs of TE GEMMs and of JAX's ``scaled_matmul_wrapper``; recompute the rest.

    >>> import jax
    >>> from te_ckpt_audit.policies import te_gemms_saveable
    >>> te_gemms_saveable(jax.lax.dot_general_p)
    False
    """
    return is_te_gemm(prim) or getattr(prim, "name", None) == SCALED_MATMUL_NAME


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)  # JAX keeps weak references to policies
class SaveFromBoth:
    """A named policy that saves what either of two policies saves, built with JAX's
    ``save_from_both_policies``. Frozen and hashable, as JAX's own parametrised policies are: JAX
    caches partial evaluation on the policy object, and a report shows `name`.

    >>> from te_ckpt_audit.policies import checkpoint_dots_and_te_gemms
    >>> checkpoint_dots_and_te_gemms.__name__
    'checkpoint_dots_and_te_gemms'
    """

    name: str
    first: Policy
    second: Policy
    _both: Policy = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        both = jax.checkpoint_policies.save_from_both_policies(self.first, self.second)
        object.__setattr__(self, "_both", both)

    def __call__(self, prim: Primitive, *avals: object, **params: object) -> object:
        return self._both(prim, *avals, **params)

    @property
    def __name__(self) -> str:
        return self.name


dots_and_te_gemms_with_no_batch_dims = SaveFromBoth(
    "dots_and_te_gemms_with_no_batch_dims",
    jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    te_gemms_saveable,
)
"""Save dots without batch dimensions, every TE GEMM and scaled_matmul; recompute the rest."""

checkpoint_dots_and_te_gemms = SaveFromBoth(
    "checkpoint_dots_and_te_gemms", jax.checkpoint_policies.checkpoint_dots, te_gemms_saveable
)
"""Save every dot, TE GEMM and scaled_matmul output; recompute the rest."""

# JAX's new remat (`jax_remat3`) asks a policy only about primitives its table has a rule for, and
# has none for TE's GEMMs: with this rule the policies above keep them there too (where a custom_vjp,
# TE's dense, is opened, that is with `jax_custom_vjp3` on; JAX 0.12+). JAX's table, not the process.
KEPT_UNDER_REMAT3 = _jax_compat.keep_under_remat3(lambda prim: te_gemms_saveable(prim))
