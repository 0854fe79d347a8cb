"""Make structurally equal checkpoint bodies one object.

An unrolled stack of `nn.remat` blocks (Flax, Keras, Equinox) traces one checkpoint body per
layer: equal, but distinct objects. JAX caches its partial evaluation and JVP of a body per object,
and so do the later stages here; with one object per distinct body, each policy linearizes a
layer once instead of once per layer. Residuals are unchanged: the bodies are equal.

Bodies are compared by their printed form, which shows structure, shapes, dtypes, parameters and
literals, not variable identities, source lines or name stacks. What the shared object cannot hold
is kept beside it: each call site's own scope names of the body's equations (`_sites`), so a layer's
residuals keep their layer's module path.
"""

from __future__ import annotations

from typing import cast

from .. import _jax_compat as jc
from .._jaxpr import AnyJaxpr, map_sub_jaxprs, open_jaxpr, sub_jaxprs

# id of a checkpoint equation whose body is now shared -> (the equation, kept alive so the id stays
# unique; the scope names of each of its original body's equations)
SiteScopes = dict[int, tuple[jc.JaxprEqn, tuple[tuple[str, ...], ...]]]


def intern_bodies(jaxpr: jc.Jaxpr) -> tuple[jc.Jaxpr, SiteScopes]:
    """`jaxpr` with equal checkpoint bodies shared, and, for each checkpoint equation calling a
    shared body, its own body's scope names."""
    groups: dict[str, list[jc.Jaxpr]] = {}
    keys: dict[int, str] = {}
    _collect(jaxpr, groups, keys, set())
    shared = {key: bodies for key, bodies in groups.items() if len(bodies) > 1}
    if not shared:
        return jaxpr, {}
    canonical = {key: bodies[0] for key, bodies in shared.items()}
    sites: SiteScopes = {}
    return _rewrite(jaxpr, canonical, keys, {}, sites), sites


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
    jaxpr: jc.Jaxpr,
    canonical: dict[str, jc.Jaxpr],
    keys: dict[int, str],
    memo: dict[int, tuple[AnyJaxpr, AnyJaxpr]],
    sites: SiteScopes,
) -> jc.Jaxpr:
    if id(jaxpr) in memo:
        return cast(jc.Jaxpr, memo[id(jaxpr)][1])  # keyed by an open jaxpr: its rewrite is one too
    eqns = []
    for eqn in jaxpr.eqns:
        params = dict(eqn.params)
        own = None
        if eqn.primitive is jc.remat_p:
            body = params["jaxpr"]
            if keys.get(id(body), "") in canonical:
                params["jaxpr"] = canonical[keys[id(body)]]
                own = tuple(jc.scope_names(e) for e in body.eqns)
        params = map_sub_jaxprs(params, lambda _, sub: _rewrite(sub, canonical, keys, memo, sites), memo)
        same = all(params[k] is v for k, v in eqn.params.items())
        new = eqn if same else eqn.replace(params=params)
        if own is not None:
            sites[id(new)] = (new, own)
        eqns.append(new)
    # Unchanged jaxprs stay the same objects: JAX's caches, and the sites above, know them by id.
    out = jaxpr if all(a is b for a, b in zip(eqns, jaxpr.eqns, strict=True)) else jaxpr.replace(eqns=eqns)
    memo[id(jaxpr)] = (jaxpr, out)
    return out
