"""Where an equation is, call site by call site.

One traced body can serve many call sites: a jitted helper (`jax.nn.silu`) called in every layer
is one body JAX traced once, and equal checkpoint bodies of an unrolled stack are made one object
(`_intern`). Its equations are tagged once, under the first call site, so a row stands for every
call. A residual, though, is made at one call: the tags on its path through the linearized jaxpr
name that call, and its module path and source line are that call's own.

Each tagged equation records the body it sits in (`body_of`, by the body's tag prefix), its own
scopes relative to that body (`rel`) and where it comes from as tagged (`origin`). Each body
records the equation it was first tagged under (`owner`) and the other equations that call it
(`aliases`). Interned checkpoint bodies also keep each call site's own scopes of the body's
equations (`scopes_at`), which the one shared object cannot.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from ._source import Origin

Scopes = tuple[str, ...]
_MOST_SITES = 4096  # module paths merged for one row at the most (a row of a body called everywhere)


@dataclasses.dataclass(slots=True)
class Sites:
    body_of: dict[str, str] = dataclasses.field(default_factory=dict)  # eid -> its body's prefix
    owner: dict[str, str] = dataclasses.field(default_factory=dict)  # body prefix -> first caller
    aliases: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # body prefix -> other callers
    rel: dict[str, Scopes] = dataclasses.field(default_factory=dict)  # eid -> own scopes in its body
    origin: dict[str, Origin] = dataclasses.field(default_factory=dict)  # eid -> as tagged
    scopes_at: dict[str, tuple[Scopes, ...]] = dataclasses.field(default_factory=dict)  # interned site
    # modules from parameter names, by (eid, its calls), where the name stack names none (_params)
    param: dict[tuple[str, tuple[str, ...]], Scopes] = dataclasses.field(default_factory=dict)
    _memo: dict[tuple[str, frozenset[str]], tuple[Scopes, Origin, tuple[str, ...]]] = dataclasses.field(
        default_factory=dict
    )

    def enter(self, eid: str, prefix: str, rel: Scopes, origin: Origin) -> None:
        """An equation tagged `eid` in the body tagged under `prefix` ("" at the top level)."""
        if prefix:
            self.body_of[eid] = prefix
        self.rel[eid] = rel
        self.origin[eid] = origin

    def call(self, eid: str, prefix: str, first: bool) -> None:
        """Equation `eid` calls the body tagged under `prefix`; `first`: it is tagged there now."""
        if first:
            self.owner[prefix] = eid
        else:
            self.aliases.setdefault(prefix, set()).add(eid)
            self._memo.clear()

    def _site(self, prefix: str, tags: frozenset[str]) -> str:
        """The equation whose call of this body the tags name; the first caller if none does."""
        others = self.aliases.get(prefix)
        if others:
            called = others & tags
            if called:
                return min(called)
        return self.owner[prefix]

    def _own(self, eid: str, prefix: str, site: str) -> Scopes:
        at = self.scopes_at.get(site)
        rest = eid[len(prefix) :]
        if at is not None and rest.isdigit() and int(rest) < len(at):
            return at[int(rest)]
        return self.rel.get(eid, ())

    def at(self, eid: str, tags: frozenset[str]) -> tuple[Scopes, Origin]:
        """The module path and origin of equation `eid` at the call the tags name."""
        scopes, origin, calls = self._at(eid, tags)
        return self.module(eid, calls, scopes), origin

    def module(self, eid: str, calls: tuple[str, ...], scopes: Scopes) -> Scopes:
        """The module path of `eid` reached through `calls`: its name-stack `scopes`, after the
        module its parameters name where the name stack names none. An equation the parameters'
        flow does not reach (a custom_vjp's forward rule: TE's dense) takes the module of the
        innermost call that it reaches."""
        named = self.param.get((eid, calls))
        for i in range(len(calls), 0, -1):
            if named:
                break
            named = self.param.get((calls[i - 1], calls[: i - 1]))
        return named + scopes if named else scopes

    def _at(self, eid: str, tags: frozenset[str]) -> tuple[Scopes, Origin, tuple[str, ...]]:
        key = (eid, tags)
        if key in self._memo:
            return self._memo[key]
        base = self.origin.get(eid, Origin(None, None))
        prefix = self.body_of.get(eid)
        found: tuple[Scopes, Origin, tuple[str, ...]]
        if prefix is None:
            found = self.rel.get(eid, ()), base, ()
        else:
            site = self._site(prefix, tags)
            outer_scopes, outer_origin, calls = self._at(site, tags)
            # A body equation whose line is its caller's (a library's jitted function, seen from
            # the user's code) was made at whichever call the tags name: its line is that call's.
            first = self.origin.get(self.owner[prefix], Origin(None, None))
            origin = Origin(
                outer_origin.source if base.source == first.source else base.source,
                outer_origin.frame if base.frame == first.frame else base.frame,
            )
            found = outer_scopes + self._own(eid, prefix, site), origin, calls + (site,)
        self._memo[key] = found
        return found

    def calls(self, eid: str) -> list[tuple[Scopes, tuple[str, ...]]]:
        """(name-stack path, calls from the top) of `eid` at each of its call sites."""
        prefix = self.body_of.get(eid)
        if prefix is None:
            return [(self.rel.get(eid, ()), ())]
        out: dict[tuple[Scopes, tuple[str, ...]], None] = {}
        for site in [self.owner[prefix], *sorted(self.aliases.get(prefix, ()))]:
            own = self._own(eid, prefix, site)
            for outer, path in self.calls(site):
                out[(outer + own, path + (site,))] = None
                if len(out) >= _MOST_SITES:
                    return list(out)
        return list(out)

    def merged_module(self, eid: str) -> str | None:
        """The row's module path: equal at every call site, or with what differs read as `*`."""
        return "/".join(merged([self.module(eid, path, scopes) for scopes, path in self.calls(eid)])) or None


def merged(stacks: Sequence[Scopes]) -> Scopes:
    """Scope names equal in every stack stay; ones that differ read as their common prefix and
    suffix around a `*` ("block_0", "block_1" -> "block_*"). Stacks of different depths: the first.

    >>> merged([("model", "block_0", "mlp"), ("model", "block_1", "mlp")])
    ('model', 'block_*', 'mlp')
    """
    if not stacks:
        return ()
    if len(stacks) == 1 or len({len(s) for s in stacks}) != 1:
        return stacks[0]
    out = []
    for names in zip(*stacks, strict=True):
        if len(set(names)) == 1:
            out.append(names[0])
            continue
        head = os.path.commonprefix(list(names))
        tail = os.path.commonprefix([n[len(head) :][::-1] for n in names])[::-1]
        out.append(f"{head}*{tail}")
    return tuple(out)
