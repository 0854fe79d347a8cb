"""Every policy te-ckpt-audit knows by name, once, as JAX keeps its own in one namespace
(`jax.checkpoint_policies`): the callable, a one-line doc, whether it knows Transformer Engine's
GEMMs, what `recommend` does with it, whether the default comparison shows it, and what other
tools call it (MaxText's `remat_policy`). Specs, the search, the warnings and the command line's
`policies` listing read it: a new named policy is one entry here.

    >>> from te_ckpt_audit.registry import known
    >>> known("checkpoint_dots_and_te_gemms").te_aware, known("nothing_saveable").maxtext
    (True, ('full',))
"""

from __future__ import annotations

import dataclasses
import enum

import jax

from . import policies as te
from .policies import Policy

_cp = jax.checkpoint_policies


class Search(enum.Enum):
    """What `recommend` does with a named policy."""

    NO = enum.auto()  # listed and parsed, never searched (an alias, or a form of a parametric one)
    PRESET = enum.auto()  # tried on its own
    BASE = enum.auto()  # tried on its own, and name subsets are combined with it
    OFFLOAD = enum.auto()  # tried on its own where offloading is allowed


@dataclasses.dataclass(frozen=True, slots=True)
class KnownPolicy:
    name: str  # the spec that names it
    doc: str
    policy: Policy | None  # None: `none` and `as-is`, which are no callable
    te_aware: bool = False  # it saves TE's GEMMs (it ships in te_ckpt_audit.policies)
    search: Search = Search.NO
    maxtext: tuple[str, ...] = ()  # MaxText's remat_policy values that are exactly it
    form: str | None = None  # how a spec may write it, where it takes arguments


_OFFLOAD = _cp.offload_dot_with_no_batch_dims("device", "pinned_host")

# In the order a frontier lists them (fewest saved first); the default comparison keeps this order.
KNOWN: tuple[KnownPolicy, ...] = (
    KnownPolicy("none", "no checkpointing at all: plain autodiff", None),
    KnownPolicy("as-is", "the model's own checkpoint policies, unchanged", None),
    KnownPolicy("nothing_saveable", "save nothing but inputs; recompute everything", _cp.nothing_saveable,
                search=Search.PRESET, maxtext=("full",)),
    KnownPolicy("checkpoint_dots_with_no_batch_dims", "same as dots_with_no_batch_dims_saveable",
                _cp.checkpoint_dots_with_no_batch_dims, search=Search.BASE),
    KnownPolicy("checkpoint_dots", "same as dots_saveable", _cp.checkpoint_dots, search=Search.BASE),
    KnownPolicy("te_gemms_saveable", "save TE GEMM and scaled_matmul outputs", te.te_gemms_saveable, te_aware=True,
                search=Search.BASE),
    KnownPolicy("dots_and_te_gemms_with_no_batch_dims",
                "save dots without batch dims, TE GEMMs and scaled_matmul outputs",
                te.dots_and_te_gemms_with_no_batch_dims, te_aware=True, search=Search.BASE),
    KnownPolicy("checkpoint_dots_and_te_gemms",
                "save dots, TE GEMMs and scaled_matmul outputs (TE-aware checkpoint_dots)",
                te.checkpoint_dots_and_te_gemms, te_aware=True, search=Search.BASE),
    KnownPolicy("everything_saveable", "save every value (no recomputation)", _cp.everything_saveable,
                search=Search.PRESET),
    KnownPolicy("dots_saveable", "save dot and convolution outputs", _cp.dots_saveable),
    KnownPolicy("dots_with_no_batch_dims_saveable", "save dots whose operands have no batch dimensions",
                _cp.dots_with_no_batch_dims_saveable),
    KnownPolicy("offload_dot_with_no_batch_dims", "offload dots without batch dims to host memory", _OFFLOAD,
                search=Search.OFFLOAD, form="offload_dot_with_no_batch_dims[:src=device,dst=pinned_host]"),
)
_BY_NAME = {k.name: k for k in KNOWN}
# The default comparison (`as-is` goes first for a model with checkpoints of its own).
DEFAULT_POLICIES = ("none", "nothing_saveable", "checkpoint_dots", "checkpoint_dots_and_te_gemms",
                    "dots_and_te_gemms_with_no_batch_dims", "everything_saveable")
NONE, AS_IS, NOTHING_SAVEABLE = "none", "as-is", "nothing_saveable"


def known(name: str) -> KnownPolicy | None:
    """The named policy, or None."""
    return _BY_NAME.get(name)


def searched(kind: Search) -> tuple[str, ...]:
    """The names `recommend` treats as `kind`, in the frontier's order."""
    return tuple(k.name for k in KNOWN if k.search is kind)


def bases(te_aware: bool) -> tuple[str, ...]:
    """The presets name subsets are combined with: the TE-aware ones on a model with TE GEMMs
    (what JAX's dot policies would miss there), JAX's elsewhere."""
    return tuple(k.name for k in KNOWN if k.search is Search.BASE and k.te_aware == te_aware)


def presets() -> tuple[str, ...]:
    """Every policy `recommend` tries on its own (offloading ones aside), in the frontier's order."""
    return tuple(k.name for k in KNOWN if k.search in (Search.PRESET, Search.BASE))


def maxtext(value: str) -> KnownPolicy | None:
    """The named policy a MaxText `remat_policy` value is exactly, if any."""
    return next((k for k in KNOWN if value in k.maxtext), None)
