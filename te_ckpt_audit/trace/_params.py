"""Module paths from parameter names, for models whose name stack does not name their modules.

Flax linen, Keras and MaxText push each module's name onto JAX's name stack; Flax NNX, Equinox,
Haiku's parameters and penzai do not. Their parameters are named, though: the input pytree's
paths are the attribute paths of the module graph (`['blocks'][0]['attn']['query']['kernel']`,
`.layers[0].attention.query_proj.weight`). An equation that uses a parameter belongs to the module
that owns it (`blocks/0/attn/query`). An equation that uses none belongs with what it feeds (the
deepest module all its consumers share: a norm's statistics belong to the norm whose scale they
meet, a softmax to its attention), else with what it computes from (the loss's tail). Where a
library names its calls (`jax.named_scope("rms_norm")` on a norm's `__call__`), what a call computes
after using its parameter stays with that call's module: a norm's `x * scale / rms` is the norm's,
not the layer's it feeds.

A trace is read this way only where its name stack does not already name the parameters' modules
(`names_own_modules`); the name stack's own scopes (a library's named scopes, an einsum's spec)
then follow the module path. Each call of a shared body is followed on its own: the layers of an
unrolled stack share one body, and each layer's parameters come in through its own call.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence

from jax.tree_util import DictKey, GetAttrKey, KeyEntry, SequenceKey

from .. import _jax_compat as jc
from .._jaxpr import open_jaxpr, sub_jaxprs

Scopes = tuple[str, ...]
Flow = dict[tuple[str, tuple[str, ...]], Scopes]  # (equation id, its calls from the top) -> module
_VALUE_ATTRS = {"value", "raw_value", "_value", "data_array"}  # a variable's array (NNX, penzai)
_VIEWS = {
    "convert_element_type", "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "copy",
    "copy_p", "reduce_precision", "sharding_constraint", "device_put", "name", "optimization_barrier",
}


def param_module(path: Sequence[KeyEntry]) -> Scopes | None:
    """The module owning the parameter at `path` (an input's pytree path, the argument's position
    first): its named path without the parameter's own name. None where the path names nothing."""
    parts: list[str] = []
    for entry in list(path)[1:]:
        if isinstance(entry, DictKey):
            parts.append(str(entry.key))
        elif isinstance(entry, GetAttrKey):
            parts.append(entry.name)
        elif isinstance(entry, SequenceKey):
            parts.append(str(entry.idx))
    parts = [p for p in parts if p not in _VALUE_ATTRS]
    if len(parts) < 2 or not any(not p.isdigit() for p in parts[:-1]):
        return None
    return tuple(parts[:-1])


def _common(paths: Iterable[Scopes]) -> Scopes | None:
    out: Scopes | None = None
    for p in paths:
        if out is None:
            out = p
            continue
        n = 0
        while n < min(len(out), len(p)) and out[n] == p[n]:
            n += 1
        out = out[:n]
    return out or None


_Value = tuple[Scopes | None, bool]  # (module, whether it is a parameter or a view of one)
_Key = tuple[str, tuple[str, ...]]  # (equation id, its calls from the top)


class _Walk:
    """One pass over the trace, every call of a body followed on its own."""

    def __init__(self) -> None:
        self.found: Flow = {}
        self.direct: set[_Key] = set()  # equations that use a parameter themselves
        self.consumers: dict[_Key, list[_Key]] = {}
        self.producers: dict[_Key, list[_Key]] = {}
        self.scopes: dict[_Key, tuple[str, ...]] = {}  # the named scopes of each equation
        self.order: list[_Key] = []  # every equation walked, in program order

    def body(self, jaxpr: jc.Jaxpr, ins: Sequence[_Value], chain: tuple[str, ...]) -> list[_Value]:
        env: dict[jc.Var, _Value] = dict(zip(jaxpr.invars, ins, strict=False))
        producer: dict[jc.Var, _Key] = {}

        def read(v: jc.Atom) -> _Value:
            return (None, False) if isinstance(v, jc.Literal) else env.get(v, (None, False))

        for eqn in jaxpr.eqns:
            eid = jc.eqn_tag(eqn)
            args = [read(v) for v in eqn.invars]
            subs = [open_jaxpr(s) for _, _, s in sub_jaxprs(eqn.params)]
            if subs and eqn.primitive is not jc.custom_jvp_call_p and eid is not None:
                outs = self.call(eqn, subs, args, chain + (eid,))
                params = [m for m, is_param in args if is_param and m]
                if params:  # the call's own module: what a body the walk does not see takes (`Sites.module`)
                    self.found.setdefault((eid, chain), _common(params) or ())
            else:
                outs = self.leaf(eqn, eid, args, chain, producer)
            env.update(zip(eqn.outvars, outs, strict=False))
        return [read(v) for v in jaxpr.outvars]

    def leaf(
        self, eqn: jc.JaxprEqn, eid: str | None, args: list[_Value], chain: tuple[str, ...],
        producer: dict[jc.Var, _Key],
    ) -> list[_Value]:
        params = [m for m, is_param in args if is_param and m]
        values = [m for m, is_param in args if not is_param and m]
        module = _common(params) if params else _common(values)
        if eid is not None:
            key = (eid, chain)
            self.order.append(key)
            if module:
                self.found[key] = module
            if params:
                self.direct.add(key)
            self.scopes[key] = jc.module_scope_names(eqn)
            for v in eqn.invars:  # who feeds whom: the refinements' ways back and forth
                if not isinstance(v, jc.Literal) and v in producer:
                    self.consumers.setdefault(producer[v], []).append(key)
                    self.producers.setdefault(key, []).append(producer[v])
            for v in eqn.outvars:
                producer[v] = key
        view = eqn.primitive.name in _VIEWS and bool(args) and args[0][1]
        return [(module, view)] * len(eqn.outvars)

    def call(
        self, eqn: jc.JaxprEqn, subs: list[jc.Jaxpr], args: list[_Value], chain: tuple[str, ...]
    ) -> list[_Value]:
        """A call's outputs, its bodies walked with its operands' modules (a body taking fewer
        inputs, a cond's branches, takes the last ones)."""
        results = [
            self.body(b, args[len(args) - len(b.invars) :] if len(b.invars) <= len(args) else args, chain)
            for b in subs
        ]
        outs: list[_Value] = []
        for i in range(len(eqn.outvars)):
            column = [r[i] for r in results if len(r) == len(eqn.outvars)]
            outs.append((_common(m for m, _ in column if m), bool(column) and all(p for _, p in column)))
        return outs


def flow(jaxpr: jc.Jaxpr, inputs: Sequence[Scopes | None]) -> tuple[Flow, Flow]:
    """The module of every tagged equation at each of its calls, from the parameters' modules
    (`inputs`: one per input of the traced function, None for an input that is no parameter);
    and, of those, the equations that use a parameter themselves."""
    walk = _Walk()
    walk.body(jaxpr, [(m, m is not None) for m in inputs], ())
    direct = {k: walk.found[k] for k in walk.direct if k in walk.found}
    fixed = walk.direct | _same_call(walk)
    for key in reversed(walk.order):  # consumers first: each takes the module of what it feeds
        if key not in fixed:
            theirs = _common(walk.found[c] for c in walk.consumers.get(key, ()) if c in walk.found)
            if theirs:
                walk.found[key] = theirs
    return walk.found, direct


def _same_call(walk: _Walk) -> set[_Key]:
    """An equation in the same named scope as a producer that used a parameter there (or follows
    one that did) belongs to that producer's module: the rest of one scoped call of a module."""
    rooted = set(walk.direct)
    for key in walk.order:
        scopes = walk.scopes.get(key)
        if key in walk.direct or not scopes:
            continue
        same = [p for p in walk.producers.get(key, ()) if p in rooted and walk.scopes.get(p) == scopes]
        module = _common(walk.found[p] for p in same if p in walk.found)
        if module:
            walk.found[key] = module
            rooted.add(key)
    return rooted - walk.direct


MOST_PER_MODULE = 4  # arrays a module owns, typically: a linear's kernel and bias, a norm's scale and bias


def name_modules(inputs: Sequence[Scopes | None]) -> bool:
    """Whether the inputs' paths name modules: most named owners hold a few arrays each (a dict of
    a layer's eight weights names a table, not the modules that use them)."""
    owned = Counter(m for m in inputs if m is not None)
    if len(owned) < 2:
        return False
    return statistics.median(owned.values()) <= MOST_PER_MODULE


def names_own_modules(pairs: Iterable[tuple[Scopes, Scopes]]) -> bool:
    """Whether the name stack already names the modules that own the parameters: for most
    (parameter module, name-stack path) pairs of the equations that use a parameter, the module's
    own name is on the name stack (Flax linen's `Dense_0`, Haiku's `conv_0` of `res_net/~/conv_0`)."""
    hits = total = 0
    for module, scopes in pairs:
        last = [p for p in module[-1].split("/") if p and p != "~"][-1:]
        names = {p for s in scopes for p in s.split("/")}
        total += 1
        hits += bool(last) and last[0] in names
    return total > 0 and 2 * hits >= total
