"""Apply a policy to a trace: the traced function as JAX should differentiate it under the policy.

A policy goes where the function's own checkpoints are (their policy swapped; `none` inlines
them), or around the whole function. What every policy of one trace shares is built so that JAX's
per-object caches see it once: equal checkpoints repeated across layers become calls of one jit,
and the equations no policy touches become calls of jits shared by every policy. Residuals are
unchanged: see `_Swap` and `_segmented`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import jax

from .. import _jax_compat as jc
from .._jaxpr import AnyJaxpr, map_sub_jaxprs, open_jaxpr
from ..errors import PolicyError
from ..policies import Policy
from ..records import Scope, Verdict
from ..specs import AsIs, NoCheckpoint, PolicySpec
from ..trace._trace import Row, Segments, Traced

# --- the scope rules: where a policy goes ---------------------------------------------------------


def resolve_scope(traced: Traced, spec: PolicySpec, scope: Scope) -> Scope:
    """OUTER (one checkpoint around the whole function) or INNER (the function's own checkpoints):
    `as-is` is always INNER; AUTO is INNER where the function has checkpoints."""
    if isinstance(spec, AsIs):
        return Scope.INNER
    if scope is Scope.AUTO:
        return Scope.INNER if traced.has_remat else Scope.OUTER
    return scope


def row_policy(row: Row, spec: PolicySpec, scope: Scope) -> Policy | None:
    """The policy JAX applies to this row's equation under `spec` at the resolved `scope`."""
    if isinstance(spec, NoCheckpoint):
        return None
    if isinstance(spec, AsIs) or (scope is Scope.OUTER and row.in_remat):
        return row.remat_policy
    if scope is Scope.INNER and not row.in_remat:
        return None
    return spec.policy


def verdict_of(policy: Policy | None, eqn: jc.JaxprEqn, spec_text: str) -> Verdict:
    """What `policy` says of `eqn`: save, recompute or offload (NONE outside any checkpoint)."""
    if policy is None:
        return Verdict.NONE
    answer = ask_policy(policy, spec_text, eqn.primitive, [v.aval for v in eqn.invars], eqn.params)
    if answer is True or isinstance(answer, jc.SaveableType):
        return Verdict.SAVE
    if answer is False or isinstance(answer, jc.RecomputeType):
        return Verdict.RECOMPUTE
    return Verdict.OFFLOAD


def row_verdict(row: Row, spec: PolicySpec, scope: Scope) -> Verdict:
    """What `spec` at the resolved `scope` says of this row's equation."""
    return verdict_of(row_policy(row, spec, scope), row.eqn, spec.text)


def policy_function(traced: Traced, spec: PolicySpec, scope: Scope, remat3: bool | None = None,
                    calls: bool = False) -> jc.ArrayFn:
    """The traced function with `spec` applied at the resolved `scope`, as a function of the flat
    array inputs; with `remat3` (by default: as the trace found JAX's flag), its checkpoints made
    as JAX's new remat makes them. By default the function as written: what a compile target and a
    measurement compile. `calls` (the analysis's): with the jit calls that let JAX linearize a
    repeated checkpoint, and what lies between checkpoints, once for every policy
    (`swap_policies`): the same residuals, sooner, but another program for XLA (a ResNet-34 with a
    checkpoint per block, as-is at batch 128: 516,096 B fewer temporaries on a v5e than the user's
    own step)."""
    remat3 = traced.remat3 if remat3 is None else remat3
    closed = policy_jaxpr(traced, spec, scope, remat3, calls)
    if remat3 or traced.custom_vjp3:
        return jc.rebuilt(closed, remat3, traced.custom_vjp3)
    return jc.jaxpr_as_fun(closed)


def policy_jaxpr(traced: Traced, spec: PolicySpec, scope: Scope, remat3: bool = False,
                 calls: bool = False) -> jc.ClosedJaxpr:
    """The traced jaxpr with `spec` applied at the resolved `scope` (`calls`: `policy_function`'s).
    For JAX's new remat the policy goes in as the user's object (jax 0.10's remat3 asks what class a
    policy is)."""
    closed = traced.jaxpr

    def swapped(policy: Swapped) -> jc.ClosedJaxpr:
        return closed.replace(jaxpr=swap_policies(closed.jaxpr, policy, traced.segments, calls))

    if isinstance(spec, AsIs):
        return swapped(KEEP)
    if isinstance(spec, NoCheckpoint):  # plain autodiff: the function's own checkpoints are inlined
        return swapped(None)
    policy = spec.policy if remat3 and spec.policy is not None else _guarded(spec)
    if scope is Scope.INNER:
        return swapped(policy)
    wrapped = _wrapped(traced)
    (outer,) = wrapped.jaxpr.eqns
    return wrapped.replace(jaxpr=wrapped.jaxpr.replace(eqns=[outer.replace(params={**outer.params, "policy": policy})]))


def _wrapped(traced: Traced) -> jc.ClosedJaxpr:
    """The traced function inside one checkpoint, made once per trace: every policy applied around
    the whole function swaps the policy of this one equation, so its body stays one object and
    JAX's per-body caches (the body's JVP) serve every policy after the first."""
    if "outer" not in traced.wrapped:
        with jc.current_autodiff():  # a checkpoint equation, as the trace holds them (remat3's are made from it)
            fun = jc.checkpoint(jc.jaxpr_as_fun(traced.jaxpr), policy=jax.checkpoint_policies.nothing_saveable)
            traced.wrapped["outer"] = jax.make_jaxpr(fun)(*traced.avals)
    return traced.wrapped["outer"]


_CONSTANT = (jax.checkpoint_policies.everything_saveable, jax.checkpoint_policies.nothing_saveable)


def _guarded(spec: PolicySpec) -> Policy:
    """The spec's policy, with its errors and bad answers turned into a PolicyError naming it."""
    policy = spec.policy
    assert policy is not None
    if policy in _CONSTANT:  # JAX tells these two apart by identity (remat3 differentiates plainly)
        return policy

    def guarded(prim: jc.Primitive, *avals: jc.AbstractValue, **params: Any) -> object:
        return ask_policy(policy, spec.text, prim, avals, params)

    return guarded


def ask_policy(
    policy: Policy, spec_text: str, prim: jc.Primitive, avals: Sequence[jc.AbstractValue], params: jc.Params
) -> object:
    """`policy(prim, *avals, **params)`, checked: what it raises or wrongly returns is the policy's
    fault (the user's code, like the model), said in one PolicyError."""
    name = getattr(prim, "name", prim)
    try:
        answer = policy(prim, *avals, **params)
    except Exception as exc:
        raise PolicyError(
            f"policy {spec_text!r} raised {type(exc).__name__} on {name}: {exc}",
            "a policy is called as policy(prim, *avals, **params) and must return a bool",
        ) from exc
    if not isinstance(answer, bool | jc.SaveableType | jc.RecomputeType | jc.Offloadable):
        raise PolicyError(
            f"policy {spec_text!r} returned {answer!r} for {name}",
            "return True/False, Saveable, Recompute or Offloadable(src, dst) "
            "(did you return Offloadable instead of Offloadable(...)?)",
        )
    return answer


# --- applying it: the rewrite -----------------------------------------------------------------------


class _Keep:
    """As a policy: every checkpoint keeps its own."""


KEEP = _Keep()
Swapped: TypeAlias = Policy | _Keep | None  # a policy, the model's own (KEEP), or none (inline)


def swap_policies(jaxpr: jc.Jaxpr, policy: Swapped, segments: Segments | None = None, calls: bool = True) -> jc.Jaxpr:
    """Every checkpoint gets `policy` (KEEP: keeps its own); with None, checkpoints are inlined
    (plain autodiff). `segments` (one per trace) keeps the jit calls every policy reuses; `calls`
    False: no jit calls at all (`_Swap`), the function as written."""
    if not calls:
        return _Swap(policy, set()).run(jaxpr, direct=True)
    return _Swap(policy, _repeated_sites(jaxpr), segments).run(jaxpr, direct=True)


_SiteKey: TypeAlias = tuple[int, bool, bool, tuple[jc.AbstractValue, ...]]  # body, prevent_cse, differentiated, types


def _site_key(eqn: jc.JaxprEqn) -> _SiteKey:
    return (id(eqn.params["jaxpr"]), eqn.params["prevent_cse"], eqn.params["differentiated"],
            tuple(v.aval for v in eqn.invars))


def _repeated_sites(jaxpr: jc.Jaxpr) -> set[_SiteKey]:
    """Checkpoint calls that occur more than once (an unrolled stack's layers) where JAX linearizes
    each equation by itself: in the top-level function and in the jit calls it makes."""
    seen: set[_SiteKey] = set()
    repeated: set[_SiteKey] = set()

    def walk(j: jc.Jaxpr) -> None:
        for eqn in j.eqns:
            if eqn.primitive is jc.remat_p:
                key = _site_key(eqn)
                (repeated if key in seen else seen).add(key)
            elif eqn.primitive is jc.jit_p:
                walk(open_jaxpr(eqn.params["jaxpr"]))

    walk(jaxpr)
    return repeated


class _Swap:
    """`swap_policies`' rewrite. Bodies shared by several equations stay shared (JAX caches per
    body object), and so does a body the rewrite leaves as it was, across policies too.

    A checkpoint called more than once, where JAX linearizes equation by equation, becomes a call
    of one `jit` holding it: JAX linearizes a jit body once per body object and input pattern, so
    an unrolled stack costs one layer per policy instead of every layer. The residuals are the
    same values (jit forwards residuals that are its inputs or outputs); a body that returns an
    input or one value twice is left unwrapped, where jit's forwarding does not match remat's.
    """

    def __init__(
        self, policy: Swapped, repeated: set[_SiteKey], segments: Segments | None = None
    ) -> None:
        self.policy = policy
        self.repeated = repeated
        self.segments = segments
        self.memos: dict[bool, dict[int, tuple[AnyJaxpr, AnyJaxpr]]] = {True: {}, False: {}}  # by context
        self.sites: dict[tuple[object, ...], jc.JaxprEqn | None] = {}

    def _direct(self, _: int, jaxpr: jc.Jaxpr) -> jc.Jaxpr:
        return self.run(jaxpr, direct=True)

    def _within(self, _: int, jaxpr: jc.Jaxpr) -> jc.Jaxpr:
        return self.run(jaxpr, direct=False)

    def run(self, jaxpr: jc.Jaxpr, direct: bool) -> jc.Jaxpr:
        eqns: list[jc.JaxprEqn] = []
        alias: dict[jc.Var, jc.Atom] = {}  # an inlined checkpoint's output -> the value it passed through
        changed = False

        def look(v: jc.Atom) -> jc.Atom:
            return v if isinstance(v, jc.Literal) else alias.get(v, v)

        for old in jaxpr.eqns:
            eqn = old.replace(invars=[look(v) for v in old.invars]) if alias else old
            params = dict(eqn.params)
            if eqn.primitive is jc.custom_vjp_call_p:
                params["fwd_jaxpr_thunk"] = jc.wrap_jaxpr_thunk(
                    params["fwd_jaxpr_thunk"], lambda fwd: _Swap(self.policy, set()).run(fwd, direct=False)
                )
            else:
                inner = direct and eqn.primitive is jc.jit_p  # a jit body is linearized like its caller
                params = map_sub_jaxprs(params, self._direct if inner else self._within, self.memos[inner])
            if eqn.primitive is jc.remat_p:
                if self.policy is not None and self.policy is not KEEP:
                    params["policy"] = self.policy
                eqn = eqn.replace(params=params)
                site = self._site(eqn, inline=self.policy is None) if direct else None
                if site is not None:  # the call keeps this checkpoint's name stack: its tag names the site
                    eqn = site.replace(invars=eqn.invars, outvars=eqn.outvars, source_info=eqn.source_info)
                elif self.policy is None:
                    eqns.extend(_inline(eqn, params["jaxpr"], alias))
                    changed = True
                    continue
            elif any(params[k] is not eqn.params[k] for k in params):
                eqn = eqn.replace(params=params)
            changed = changed or eqn is not old
            eqns.append(eqn)
        if not changed:
            return jaxpr
        outvars = [look(v) for v in jaxpr.outvars]
        if direct and self.segments is not None:
            eqns = _segmented(jaxpr, eqns, outvars, {id(e) for e in jaxpr.eqns}, self.segments)
        return jaxpr.replace(eqns=eqns, outvars=outvars)

    def _site(self, eqn: jc.JaxprEqn, inline: bool = False) -> jc.JaxprEqn | None:
        """The jit equation that calls this checkpoint (`inline`: its body, plain autodiff), for a
        checkpoint repeated where JAX linearizes equation by equation."""
        key = _site_key(eqn)
        if key not in self.repeated:
            return None
        site = (*key, id(eqn.params["policy"]), inline)  # as-is, equal layers may differ in policy
        if site not in self.sites:
            body = eqn.params["jaxpr"]
            outs = [v for v in body.outvars if not isinstance(v, jc.Literal)]
            plain = len(outs) == len(body.outvars) == len(set(outs)) and not set(outs) & set(body.invars)
            fun = jc.run_body(body) if inline else jc.bind_alone(eqn)
            avals = [v.aval for v in eqn.invars]
            self.sites[site] = jc.jit_call(fun, avals) if plain and not eqn.effects else None
        return self.sites[site]


_MIN_SEGMENT = 4  # equations; a shorter run costs less to linearize than to call


def _segmented(
    jaxpr: jc.Jaxpr, eqns: list[jc.JaxprEqn], outvars: list[jc.Atom], original: set[int], cache: Segments
) -> list[jc.JaxprEqn]:
    """`eqns` with each run of equations no policy touches (no checkpoint inside, no effects) made a
    call of one jit, the same jit object for every policy of this trace.

    JAX linearizes a jit body once per body object and input pattern: what lies around the
    checkpoints (embeddings, the loss, a Keras layer's work outside its rematerialised activation)
    is then linearized by the first policy only; the next ones reuse it. The residuals are the same
    values: a segment's outputs are values it computes (never an input, each once), and jit
    forwards residuals that are its inputs or outputs."""
    last_use: dict[jc.Var, int] = {}
    for i, eqn in enumerate(eqns):
        for v in eqn.invars:
            if not isinstance(v, jc.Literal):
                last_use[v] = i
    for v in outvars:
        if not isinstance(v, jc.Literal):
            last_use[v] = len(eqns)
    out: list[jc.JaxprEqn] = []
    run: list[jc.JaxprEqn] = []

    def flush(end: int) -> None:
        if len(run) >= _MIN_SEGMENT:
            call = _segment(jaxpr, run, end, last_use, cache)
            if call is not None:
                out.append(call)
                run.clear()
                return
        out.extend(run)
        run.clear()

    for i, eqn in enumerate(eqns):
        if id(eqn) in original and not eqn.effects:
            run.append(eqn)
            continue
        flush(i - 1)
        out.append(eqn)
    flush(len(eqns) - 1)
    return out


def _segment(
    jaxpr: jc.Jaxpr, run: list[jc.JaxprEqn], end: int, last_use: dict[jc.Var, int], cache: Segments
) -> jc.JaxprEqn | None:
    defined = [v for e in run for v in e.outvars if not isinstance(v, jc.DropVar)]
    own = set(defined)
    inputs: list[jc.Atom] = list(
        dict.fromkeys(v for e in run for v in e.invars if not isinstance(v, jc.Literal) and v not in own)
    )
    outputs = [v for v in defined if last_use.get(v, -1) > end]
    if not outputs:
        return None
    key = (id(run[0]), id(run[-1]), len(run), tuple(map(id, outputs)))
    if key not in cache:
        body = jc.part_of(jaxpr, run, [v for v in inputs if isinstance(v, jc.Var)], outputs)
        call = jc.jit_call(jc.run_body(body), [v.aval for v in inputs])
        cache[key] = (run[0], run[-1], outputs, call.replace(invars=inputs, outvars=outputs) if call else None)
    return cache[key][3]


def _inline(eqn: jc.JaxprEqn, body: jc.Jaxpr, alias: dict[jc.Var, jc.Atom]) -> list[jc.JaxprEqn]:
    """The body's equations in place of the checkpoint equation, with fresh variables (the same
    body is shared by every call of a layer, and each copy needs its own).

    An output that is an input passed through, a literal, or a value returned twice becomes an
    alias of that value (recorded in `alias`), as in the function without the checkpoint: no copy
    is made, so no extra residual appears."""
    env: dict[jc.Var, jc.Atom] = dict(zip(body.invars, eqn.invars, strict=True))
    results: dict[jc.Var, jc.Var] = {}  # the body's results take the checkpoint's own output variables
    for body_v, outer_v in zip(body.outvars, eqn.outvars, strict=True):
        if not isinstance(body_v, jc.Literal) and body_v not in env and not isinstance(outer_v, jc.DropVar):
            results.setdefault(body_v, outer_v)

    def bind(v: jc.Var) -> jc.Var:
        if v in results and v not in env:
            fresh = results[v]
        else:
            fresh = jc.DropVar(v.aval) if isinstance(v, jc.DropVar) else jc.Var(v.aval)
        env[v] = fresh
        return fresh

    out = []
    for inner in body.eqns:  # under the checkpoint's name stack: its scopes and tag stay on the path
        invars = [v if isinstance(v, jc.Literal) else env[v] for v in inner.invars]
        out.append(jc.under(eqn, inner).replace(invars=invars, outvars=[bind(v) for v in inner.outvars]))
    for body_v, outer_v in zip(body.outvars, eqn.outvars, strict=True):
        src = body_v if isinstance(body_v, jc.Literal) else env[body_v]
        if src is not outer_v and not isinstance(outer_v, jc.DropVar):
            alias[outer_v] = src
    return out
