"""Policy specs: the strings users type after ``--policy``, parsed once into a sum type.

Each form is its own frozen record: `NoCheckpoint` (`none`), `AsIs` (`as-is`), `Preset` (a named
policy), `NamePolicy` (`save_only_these_names:...` and its kin), `OffloadDots`
(`offload_dot_with_no_batch_dims`), `SaveAndOffload` (`save_and_offload_only_these_names:...`),
`Combined` (`A+B`) and `Custom` (`module:attr`, `file.py:attr`). `text` is the spec as given,
which reports show; `canonical()` spells the record back as a spec that parses to an equal one.

    >>> from te_ckpt_audit.specs import resolve_policy
    >>> resolve_policy("save_only_these_names:ffn1,context").names
    ('ffn1', 'context')
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import policies as te_policies
from .errors import PolicySpecError, UsageError, a_or_an
from .policies import Policy
from .registry import AS_IS, KNOWN, NONE, NOTHING_SAVEABLE, KnownPolicy, known

_cp = jax.checkpoint_policies



@dataclasses.dataclass(frozen=True, slots=True)
class PolicySpec:
    """A parsed spec. `policy` is the callable JAX is given (None for `none` and `as-is`)."""

    text: str

    @property
    def policy(self) -> Policy | None:
        return None

    @property
    def names(self) -> tuple[str, ...]:
        """Checkpoint names the spec keeps on the device (or, for a name rule, refers to)."""
        return ()

    @property
    def offload_names(self) -> tuple[str, ...]:
        """Checkpoint names the spec offloads to host memory."""
        return ()

    @property
    def offloads(self) -> bool:
        """Whether it asks for anything to be offloaded to host memory."""
        return bool(self.offload_names)

    @property
    def saves_everything_regardless(self) -> bool:
        """jax's save_anything_except_these_names, which ignores its names."""
        return False

    def canonical(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True, slots=True)
class NoCheckpoint(PolicySpec):
    """`none`: no checkpointing at all, plain autodiff (the model's own checkpoints inlined)."""

    text: str = NONE


@dataclasses.dataclass(frozen=True, slots=True)
class AsIs(PolicySpec):
    """`as-is`: the model's own checkpoint policies, unchanged."""

    text: str = AS_IS


@dataclasses.dataclass(frozen=True, slots=True)
class Preset(PolicySpec):
    """A policy known by name: JAX's and the TE-aware ones."""

    @property
    def policy(self) -> Policy:
        found = _PRESETS[self.text].policy
        assert found is not None
        return found

    @property
    def known(self) -> KnownPolicy:
        """The registry's entry for it."""
        return _PRESETS[self.text]


class NameRule(enum.StrEnum):
    ONLY = "save_only_these_names"
    ANY_BUT = "save_any_names_but_these"
    ANYTHING_EXCEPT = "save_anything_except_these_names"


@dataclasses.dataclass(frozen=True, slots=True)
class _BuiltPolicy(PolicySpec):
    """A spec whose policy callable is made once from its fields: JAX caches partial evaluation on
    the policy object, so one spec keeps one."""

    _policy: Policy = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_policy", self._make())

    def _make(self) -> Policy:
        raise NotImplementedError

    @property
    def policy(self) -> Policy:
        return self._policy


@dataclasses.dataclass(frozen=True, slots=True)
class NamePolicy(_BuiltPolicy):
    """A rule over checkpoint names: save only these, every name but these, or jax's
    save_anything_except_these_names."""

    rule: NameRule = NameRule.ONLY
    rule_names: tuple[str, ...] = ()

    def _make(self) -> Policy:
        factory: Callable[..., Policy] = getattr(_cp, self.rule.value)
        return factory(*self.rule_names)

    @property
    def names(self) -> tuple[str, ...]:
        return self.rule_names

    @property
    def saves_everything_regardless(self) -> bool:
        return self.rule is NameRule.ANYTHING_EXCEPT

    def canonical(self) -> str:
        return f"{self.rule.value}:{','.join(self.rule_names)}"


# JAX offloads from device memory to pinned host memory (its remat knows no other pair): any other
# pair either fails inside JAX or silently keeps the value on the device.
OFFLOAD_SRC = "device"
OFFLOAD_DST = "pinned_host"


@dataclasses.dataclass(frozen=True, slots=True)
class OffloadDots(_BuiltPolicy):
    """`offload_dot_with_no_batch_dims`: dots without batch dimensions go to host memory."""

    def _make(self) -> Policy:
        entry = known("offload_dot_with_no_batch_dims")
        assert entry is not None and entry.policy is not None
        return entry.policy

    @property
    def offloads(self) -> bool:
        return True

    def canonical(self) -> str:
        return "offload_dot_with_no_batch_dims"


@dataclasses.dataclass(frozen=True, slots=True)
class SaveAndOffload(_BuiltPolicy):
    """`save_and_offload_only_these_names`: some names kept on the device, others offloaded."""

    save: tuple[str, ...] = ()
    offload: tuple[str, ...] = ()

    def _make(self) -> Policy:
        return _cp.save_and_offload_only_these_names(
            names_which_can_be_saved=list(self.save),
            names_which_can_be_offloaded=list(self.offload),
            offload_src=OFFLOAD_SRC,
            offload_dst=OFFLOAD_DST,
        )

    @property
    def names(self) -> tuple[str, ...]:
        return self.save

    @property
    def offload_names(self) -> tuple[str, ...]:
        return self.offload

    def canonical(self) -> str:
        return f"save_and_offload_only_these_names:save={','.join(self.save)};offload={','.join(self.offload)}"


@dataclasses.dataclass(frozen=True, slots=True)
class Combined(_BuiltPolicy):
    """`A+B[+...]`: what any part saves is saved (JAX's save_from_both_policies), as one named,
    frozen, hashable policy (`SaveFromBoth`) whose name is the whole spec."""

    parts: tuple[PolicySpec, ...] = ()

    def _make(self) -> Policy:
        policy = self.parts[0].policy
        assert policy is not None
        for part in self.parts[1:]:
            assert part.policy is not None
            policy = te_policies.SaveFromBoth(self.text, policy, part.policy)
        return policy

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for part in self.parts for n in part.names))

    @property
    def saves_everything_regardless(self) -> bool:
        return any(part.saves_everything_regardless for part in self.parts)

    def canonical(self) -> str:
        return "+".join(part.canonical() for part in self.parts)


@dataclasses.dataclass(frozen=True, slots=True)
class Custom(PolicySpec):
    """A policy callable of the user's own, `module:attr` or `file.py:attr` (or given directly)."""

    function: Policy | None = None  # compared by identity: two callables are two policies

    @property
    def policy(self) -> Policy | None:
        return self.function


# A preset is a named policy with a callable and no arguments; the registry holds each once.
_PRESETS: dict[str, KnownPolicy] = {k.name: k for k in KNOWN if k.policy is not None and k.form is None}

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
    "save_and_offload_only_these_names": (
        "save_and_offload_only_these_names:save=A,B;offload=C[;src=device;dst=pinned_host]",
        "save some names, offload others to host memory",
    ),
}

_SPECIAL: dict[str, type[PolicySpec]] = {NONE: NoCheckpoint, AS_IS: AsIs}


def available_policies() -> list[tuple[str, str]]:
    """Every spec form understood, with a one-line description, in display order."""
    rows = [(k.form or k.name, k.doc) for k in KNOWN]
    rows += list(_PARAMETRIC.values())
    rows.append(("SPEC+SPEC[+SPEC...]", "save what any of them saves, e.g. save_only_these_names:a+checkpoint_dots"))
    rows.append(("module:attr | path/to/file.py:attr", "any policy callable of your own"))
    return rows


def is_preset(name: str) -> bool:
    return name in _PRESETS


def resolve_policy(text: str) -> PolicySpec:
    """Parse one spec string; raises `PolicySpecError` with a suggestion when it does not parse."""
    spec = text.strip()
    if not spec:
        raise PolicySpecError("empty policy spec", "name a policy; `te-ckpt-audit policies` lists them")
    if spec in _SPECIAL:
        return _SPECIAL[spec](spec)
    if spec in _PRESETS:
        return Preset(spec)
    if "+" in spec:
        return _combined(spec)
    head, sep, rest = spec.partition(":")
    if head in _PARAMETRIC or (known(head) is not None and known(head).form is not None):  # type: ignore[union-attr]
        return _parametric(spec, head, rest)
    if sep and (head.endswith(".py") or "." in head or "/" in head or head.isidentifier()):
        return _custom(spec, head, rest)
    raise PolicySpecError(f"unknown policy {spec!r}", _list_hint(_close_to(spec)))


PolicyLike = str | PolicySpec | Policy  # what an API takes: a spec string, a parsed spec, a callable


def policy_spec(policy: PolicyLike) -> PolicySpec:
    """A spec string parsed, a spec as it is, or a policy callable as a `Custom` spec named after it."""
    if isinstance(policy, PolicySpec):
        return policy
    if isinstance(policy, str):
        return resolve_policy(policy)
    if callable(policy):
        return Custom(getattr(policy, "__name__", repr(policy)), policy)
    raise TypeError(f"a policy is a spec string or a callable, not {type(policy).__name__}")


def policy_specs(policies: Sequence[PolicyLike]) -> tuple[PolicySpec, ...]:
    return tuple(policy_spec(p) for p in policies)


def parse_policies(policies: Sequence[PolicyLike], what: str) -> tuple[PolicySpec, ...]:
    """Policy specs parsed once, at the edge: a spec already parsed passes as it is. A custom
    policy's module (`file.py:attr`) is the user's code, as `what` (the target) is: its failure is
    a TargetError naming it."""
    from .trace._loading import user_code  # the user's module runs under its rule

    if isinstance(policies, str | PolicySpec) or callable(policies):
        policies = (policies,)  # one policy, not its letters
    elif not isinstance(policies, Sequence | set | frozenset):
        raise UsageError(f"$policies$ takes a policy (a spec string, a PolicySpec, a callable) or a list of them, "
                         f"not {type(policies).__name__} {policies!r}"[:160], "e.g. $policies$=['checkpoint_dots']")
    for p in policies:
        if not (isinstance(p, str | PolicySpec) or callable(p)):
            raise UsageError(f"$policies$ holds {type(p).__name__} {p!r}, which is not a policy"[:160],
                             "a spec string, a PolicySpec or a policy callable")
    with user_code(what):
        return policy_specs(list(policies))


def some_policies(policies: Sequence[PolicyLike], what: str) -> tuple[PolicySpec, ...]:
    """`parse_policies`, and at least one: a report compares at least one policy."""
    specs = parse_policies(policies, what)
    if not specs:
        raise UsageError("$policies$ is empty: a report compares at least one policy",
                         "give one, or leave $policies$ out for the default set")
    return specs


def _close_to(spec: str) -> str | None:
    names = [k.name for k in KNOWN] + list(_PARAMETRIC)
    close = difflib.get_close_matches(spec.partition(":")[0], names, n=1, cutoff=0.5)
    return close[0] if close else None


def _list_hint(close: str | None) -> str:
    if close:
        return f"did you mean {close!r}? `te-ckpt-audit policies` lists every spec"
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


def _memory_kinds(spec: str, kv: dict[str, str]) -> None:
    src, dst = kv.get("src", OFFLOAD_SRC), kv.get("dst", OFFLOAD_DST)
    if (src, dst) != (OFFLOAD_SRC, OFFLOAD_DST):
        raise PolicySpecError(
            f"policy spec {spec!r}: JAX offloads from src={OFFLOAD_SRC} to dst={OFFLOAD_DST} only, "
            f"not from src={src} to dst={dst}",
            f"drop src= and dst=, or give src={OFFLOAD_SRC},dst={OFFLOAD_DST}",
        )


def _parametric(spec: str, head: str, rest: str) -> PolicySpec:
    if head in NameRule.__members__.values():
        return NamePolicy(spec, NameRule(head), _names(spec, rest))
    if head == "offload_dot_with_no_batch_dims":
        _memory_kinds(spec, _keyvalues(spec, rest.replace(",", ";"), {"src", "dst"}))
        return OffloadDots(spec)
    # save_and_offload_only_these_names
    kv = _keyvalues(spec, rest, {"save", "offload", "src", "dst"})
    _memory_kinds(spec, kv)
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
    return SaveAndOffload(spec, save, offload)


def _combined(spec: str) -> PolicySpec:
    parts = tuple(resolve_policy(part) for part in spec.split("+"))
    for part in parts:
        if not isinstance(part, Preset | NamePolicy | Custom | Combined):
            raise PolicySpecError(
                f"policy spec {spec!r}: {part.text!r} cannot be combined with '+'",
                "'+' joins policies that answer save or recompute (names, dots, TE GEMMs), not offload ones",
            )
    return Combined(spec, parts)


def _custom(spec: str, where: str, attr: str) -> PolicySpec:
    from .trace._loading import import_attribute  # the user's module: imported only for a custom spec

    try:
        policy = import_attribute(where, attr)
    except UsageError as err:
        close = _close_to(spec)
        hint = _list_hint(close) if close else err.hint_template
        raise PolicySpecError(f"custom policy {spec!r} does not resolve: {err.template}", hint) from err
    if not callable(policy):
        raise PolicySpecError(
            f"custom policy {spec!r} is {a_or_an(type(policy).__name__)}, not a callable",
            "a policy is a function (prim, *avals, **params) -> bool",
        )
    return Custom(spec, policy)


def names_spec(saved: Sequence[str] = (), offloaded: Sequence[str] = (), base: str | None = None) -> PolicySpec:
    """The spec that keeps `saved` names on the device (with a preset `base`), or offloads
    `offloaded` ones: what `recommend` searches over. Spelled canonically.

    >>> names_spec(["ffn1", "context"], base="checkpoint_dots").text
    'save_only_these_names:ffn1,context+checkpoint_dots'
    """
    if offloaded:
        if base is not None:
            raise ValueError("an offload policy cannot be combined with a preset")
        spec: PolicySpec = SaveAndOffload("", tuple(saved), tuple(offloaded))
    elif saved:
        names = NamePolicy("", NameRule.ONLY, tuple(saved))
        spec = names if base is None else Combined("", (names, Preset(base)))
    else:
        spec = Preset(base or NOTHING_SAVEABLE)
    return _respelled(spec)


def _respelled(spec: PolicySpec) -> PolicySpec:
    """`spec` with its text set to its canonical spelling (parts too)."""
    if isinstance(spec, Combined):
        parts = tuple(_respelled(p) for p in spec.parts)
        return Combined("+".join(p.text for p in parts), parts)
    return dataclasses.replace(spec, text=spec.canonical())


def spellable(name: str) -> bool:
    """Whether a checkpoint name survives every spec `recommend` writes it into: parsing the
    spelled spec gives back exactly this name (a name with `,` `;` `|` `+` `=`, spaces around it,
    or none at all does not)."""
    forms = [names_spec([name]), names_spec([name], base="checkpoint_dots"), names_spec(offloaded=[name]),
             names_spec([name], ["x" if name != "x" else "y"])]
    for spec in forms:
        try:
            again = resolve_policy(spec.text)
        except UsageError:
            return False
        if _shape(again) != _shape(spec):
            return False
    return True


def _shape(spec: PolicySpec) -> Any:
    """What a spec means, its spelling left out: equal for a spec and its parse."""
    if isinstance(spec, Combined):
        return ("+", tuple(_shape(p) for p in spec.parts))
    return (type(spec).__name__, spec.canonical() if isinstance(spec, Preset) else None, spec.names,
            spec.offload_names)
