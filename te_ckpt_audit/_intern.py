"""Make structurally equal checkpoint bodies one object.

An unrolled stack of `nn.remat` blocks (Flax, Keras, Equinox) traces one checkpoint body per
layer: equal, but distinct objects. JAX caches its partial evaluation and JVP of a body per object,
and so do the later stages here; with one object per distinct body, each policy linearizes a
layer once instead of once per layer. Residuals are unchanged: the bodies are equal.

Bodies are compared by their printed form, which shows structure, shapes, dtypes, parameters and
literals, not variable identities, source lines or name stacks. The name stacks of the merged
bodies' equations are kept merged: a scope that differs between layers ("block_0", "block_1")
reads "block_*".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import cast

from . import _jax_compat as jc
from ._jaxpr import AnyJaxpr, map_sub_jaxprs, open_jaxpr, sub_jaxprs


def intern_bodies(jaxpr: jc.Jaxpr) -> tuple[jc.Jaxpr, dict[int, tuple[str, ...]]]:
    """`jaxpr` with equal checkpoint bodies shared, and the merged scope names of the equations
    of every shared body, keyed by id of the (kept-alive) equation."""
    groups: dict[str, list[jc.Jaxpr]] = {}
    keys: dict[int, str] = {}
    _collect(jaxpr, groups, keys, set())
    shared = {key: bodies for key, bodies in groups.items() if len(bodies) > 1}
    if not shared:
        return jaxpr, {}
    scopes: dict[int, tuple[str, ...]] = {}
    canonical: dict[str, jc.Jaxpr] = {}
    for key, bodies in shared.items():
        first = bodies[0]
        canonical[key] = first
        for j, eqn in enumerate(first.eqns):
            scopes[id(eqn)] = _merged([jc.scope_names(b.eqns[j]) for b in bodies])
    return _rewrite(jaxpr, canonical, keys, {}), scopes


def _collect(jaxpr: jc.Jaxpr, groups: dict[str, list[jc.Jaxpr]], keys: dict[int, str], visited: set[int]) -> None:
    if id(jaxpr) in visited:
        return
    visited.add(id(jaxpr))
    for eqn in jaxpr.eqns:
        if eqn.primitive is jc.remat_p:
            body = eqn.params["jaxpr"]
            if id(body) not in keys:
                keys[id(body)] = str(body)
                groups.setdefault(keys[id(body)], []).append(body)
        for _, _, sub in sub_jaxprs(eqn.params):
            _collect(open_jaxpr(sub), groups, keys, visited)


def _rewrite(
    jaxpr: jc.Jaxpr, canonical: dict[str, jc.Jaxpr], keys: dict[int, str], memo: dict[int, tuple[AnyJaxpr, AnyJaxpr]]
) -> jc.Jaxpr:
    if id(jaxpr) in memo:
        return cast(jc.Jaxpr, memo[id(jaxpr)][1])  # keyed by an open jaxpr: its rewrite is one too
    eqns = []
    for eqn in jaxpr.eqns:
        params = dict(eqn.params)
        if eqn.primitive is jc.remat_p:
            body = params["jaxpr"]
            params["jaxpr"] = canonical.get(keys.get(id(body), ""), body)
        params = map_sub_jaxprs(params, lambda _, sub: _rewrite(sub, canonical, keys, memo), memo)
        same = all(params[k] is v for k, v in eqn.params.items())
        eqns.append(eqn if same else eqn.replace(params=params))
    # Unchanged jaxprs stay the same objects: the merged scopes are keyed by their equations.
    out = jaxpr if all(a is b for a, b in zip(eqns, jaxpr.eqns, strict=True)) else jaxpr.replace(eqns=eqns)
    memo[id(jaxpr)] = (jaxpr, out)
    return out


def _merged(stacks: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """Scope names equal in every stack stay; ones that differ read as their common prefix and
    suffix around a `*` ("block_0", "block_1" -> "block_*")."""
    if len({len(s) for s in stacks}) != 1:
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
