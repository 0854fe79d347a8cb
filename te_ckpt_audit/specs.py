"""Policy specs: the strings users type after ``--policy``, resolved to policy callables.

    >>> from te_ckpt_audit.specs import resolve_policy
    >>> resolve_policy("save_only_these_names:ffn1,context").names
    ('ffn1', 'context')
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
from collections.abc import Callable
from typing import Any

import jax

from . import policies as te_policies
from ._loading import import_attribute
from .errors import PolicySpecError, UsageError

_cp = jax.checkpoint_policies


class SpecKind(enum.StrEnum):
    NONE = "none"  # no checkpointing: plain autodiff
    AS_IS = "as-is"  # the model's own checkpoint policies, unchanged
    POLICY = "policy"


@dataclasses.dataclass(frozen=True, slots=True)
class PolicySpec:
    """A resolved spec. `names`/`offload_names`: the checkpoint names a name policy refers to."""

    text: str
    kind: SpecKind
    policy: Callable[..., Any] | None = None
    names: tuple[str, ...] = ()
    offload_names: tuple[str, ...] = ()
    saves_everything_regardless: bool = False  # jax's save_anything_except_these_names


_SIMPLE: dict[str, tuple[Callable[..., Any], str]] = {
    "everything_saveable": (_cp.everything_saveable, "save every value (no recomputation)"),
    "nothing_saveable": (_cp.nothing_saveable, "save nothing but inputs; recompute everything"),
    "dots_saveable": (_cp.dots_saveable, "save dot and convolution outputs"),
    "checkpoint_dots": (_cp.checkpoint_dots, "same as dots_saveable"),
    "dots_with_no_batch_dims_saveable": (
        _cp.dots_with_no_batch_dims_saveable,
        "save dots whose operands have no batch dimensions",
    ),
    "checkpoint_dots_with_no_batch_dims": (
        _cp.checkpoint_dots_with_no_batch_dims,
        "same as dots_with_no_batch_dims_saveable",
    ),
    "te_gemms_saveable": (te_policies.te_gemms_saveable, "save TE GEMM and scaled_matmul outputs"),
    "checkpoint_dots_and_te_gemms": (
        te_policies.checkpoint_dots_and_te_gemms,
        "save dots, TE GEMMs and scaled_matmul outputs (TE-aware checkpoint_dots)",
    ),
    "dots_and_te_gemms_with_no_batch_dims": (
        te_policies.dots_and_te_gemms_with_no_batch_dims,
        "save dots without batch dims, TE GEMMs and scaled_matmul outputs",
    ),
}

_PARAMETRIC: dict[str, tuple[str, str]] = {
    "save_only_these_names": ("save_only_these_names:NAME[,NAME...]", "save only these names"),
    "save_any_names_but_these": (
        "save_any_names_but_these:NAME[,NAME...]",
        "save every named value except these",
    ),
    "save_anything_except_these_names": (
        "save_anything_except_these_names:NAME[,NAME...]",
        "jax's policy of that name (in jax 0.10 it saves everything)",
    ),
    "offload_dot_with_no_batch_dims": (
        "offload_dot_with_no_batch_dims[:src=device,dst=pinned_host]",
        "offload dots without batch dims to host memory",
    ),
    "save_and_offload_only_these_names": (
        "save_and_offload_only_these_names:save=A,B;offload=C[;src=device;dst=pinned_host]",
        "save some names, offload others to host memory",
    ),
}

_SPECIAL = {
    "none": "no checkpointing at all: plain autodiff",
    "as-is": "the model's own checkpoint policies, unchanged",
}


def available_policies() -> list[tuple[str, str]]:
    """Every spec form understood, with a one-line description, in display order."""
    rows = [(name, text) for name, text in _SPECIAL.items()]
    rows += [(name, text) for name, (_, text) in _SIMPLE.items()]
    rows += list(_PARAMETRIC.values())
    rows.append(("SPEC+SPEC[+SPEC...]", "save what any of them saves, e.g. save_only_these_names:a+checkpoint_dots"))
    rows.append(("module:attr | path/to/file.py:attr", "any policy callable of your own"))
    return rows


def resolve_policy(text: str) -> PolicySpec:
    """Resolve one spec string; raises `PolicySpecError` with a suggestion when it does not."""
    spec = text.strip()
    if not spec:
        raise PolicySpecError("empty policy spec", "name a policy; `te-ckpt-audit policies` lists them")
    if spec in _SPECIAL:
        return PolicySpec(spec, SpecKind(spec))
    if spec in _SIMPLE:
        return PolicySpec(spec, SpecKind.POLICY, _SIMPLE[spec][0])
    if "+" in spec:
        return _combined(spec)
    head, sep, rest = spec.partition(":")
    if head in _PARAMETRIC or (head == "offload_dot_with_no_batch_dims" and not sep):
        return _parametric(spec, head, rest)
    if sep and (head.endswith(".py") or "." in head or "/" in head or head.isidentifier()):
        return _custom(spec, head, rest)
    raise PolicySpecError(f"unknown policy {spec!r}", _suggest(spec))


def _suggest(spec: str) -> str:
    known = list(_SPECIAL) + list(_SIMPLE) + list(_PARAMETRIC)
    close = difflib.get_close_matches(spec.partition(":")[0], known, n=1, cutoff=0.5)
    if close:
        return f"did you mean {close[0]!r}? `te-ckpt-audit policies` lists every spec"
    return "`te-ckpt-audit policies` lists every spec"


def _names(spec: str, raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if not names:
        raise PolicySpecError(
            f"policy {spec!r} names no checkpoint name",
            "list names after the colon, e.g. save_only_these_names:ffn1,context",
        )
    return names


def _keyvalues(spec: str, raw: str, allowed: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in raw.replace(";", "|").split("|"))):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in allowed:
            raise PolicySpecError(
                f"malformed policy spec {spec!r}: {part!r}",
                f"use {'; '.join(sorted(k + '=...' for k in allowed))}",
            )
        out[key.strip()] = value.strip()
    return out


def _parametric(spec: str, head: str, rest: str) -> PolicySpec:
    if head == "save_only_these_names":
        names = _names(spec, rest)
        return PolicySpec(spec, SpecKind.POLICY, _cp.save_only_these_names(*names), names)
    if head == "save_any_names_but_these":
        names = _names(spec, rest)
        return PolicySpec(spec, SpecKind.POLICY, _cp.save_any_names_but_these(*names), names)
    if head == "save_anything_except_these_names":
        names = _names(spec, rest)
        policy = _cp.save_anything_except_these_names(*names)
        return PolicySpec(spec, SpecKind.POLICY, policy, names, saves_everything_regardless=True)
    if head == "offload_dot_with_no_batch_dims":
        kv = _keyvalues(spec, rest.replace(",", ";"), {"src", "dst"})
        policy = _cp.offload_dot_with_no_batch_dims(
            kv.get("src", "device"), kv.get("dst", "pinned_host")
        )
        return PolicySpec(spec, SpecKind.POLICY, policy)
    # save_and_offload_only_these_names
    kv = _keyvalues(spec, rest, {"save", "offload", "src", "dst"})
    save = tuple(n for n in kv.get("save", "").split(",") if n)
    offload = tuple(n for n in kv.get("offload", "").split(",") if n)
    if not save and not offload:
        raise PolicySpecError(
            f"malformed policy spec {spec!r}: no names",
            "e.g. save_and_offload_only_these_names:save=context;offload=ffn1",
        )
    both = sorted(set(save) & set(offload))
    if both:
        raise PolicySpecError(
            f"policy spec {spec!r} both saves and offloads {', '.join(both)}",
            "a name is either kept on the device (save=) or offloaded to host (offload=), not both",
        )
    policy = _cp.save_and_offload_only_these_names(
        names_which_can_be_saved=list(save),
        names_which_can_be_offloaded=list(offload),
        offload_src=kv.get("src", "device"),
        offload_dst=kv.get("dst", "pinned_host"),
    )
    return PolicySpec(spec, SpecKind.POLICY, policy, save, offload)


_NOT_COMBINABLE = ("none", "as-is", "offload_dot_with_no_batch_dims", "save_and_offload_only_these_names")


def _combined(spec: str) -> PolicySpec:
    """`A+B[+...]`: what any part saves is saved (JAX's save_from_both_policies), as one named,
    frozen, hashable policy (`SaveFromBoth`) whose name is the whole spec."""
    parts = [resolve_policy(part) for part in spec.split("+")]
    for part in parts:
        if part.kind is not SpecKind.POLICY or part.text.partition(":")[0] in _NOT_COMBINABLE:
            raise PolicySpecError(
                f"policy spec {spec!r}: {part.text!r} cannot be combined with '+'",
                "'+' joins policies that answer save or recompute (names, dots, TE GEMMs), not offload ones",
            )
    policy = parts[0].policy
    assert policy is not None
    for part in parts[1:]:
        assert part.policy is not None
        policy = te_policies.SaveFromBoth(spec, policy, part.policy)
    names = tuple(dict.fromkeys(n for part in parts for n in part.names))
    regardless = any(part.saves_everything_regardless for part in parts)
    return PolicySpec(spec, SpecKind.POLICY, policy, names, saves_everything_regardless=regardless)


def _custom(spec: str, where: str, attr: str) -> PolicySpec:
    try:
        policy = import_attribute(where, attr)
    except UsageError as err:
        suggestion = _suggest(spec)
        hint = suggestion if "did you mean" in suggestion else err.hint
        raise PolicySpecError(f"custom policy {spec!r} does not resolve: {err.message}", hint) from err
    if not callable(policy):
        raise PolicySpecError(
            f"custom policy {spec!r} is a {type(policy).__name__}, not a callable",
            "a policy is a function (prim, *avals, **params) -> bool",
        )
    return PolicySpec(spec, SpecKind.POLICY, policy)
