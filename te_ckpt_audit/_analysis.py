"""Analyse one policy against one trace: residuals, marks, recompute FLOPs.

The truth is JAX's own partial evaluation: we apply the policy (by wrapping the traced function in
`jax.checkpoint`, or by swapping the policy of the checkpoints it already has), call the same
linearization `jax.vjp` uses, and read what it kept. Nothing here re-implements remat rules; it
only reads JAX's output and follows values back to the equations that made them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import jax

from . import _jax_compat as jc
from ._jaxpr import aval_bytes, aval_dtype, aval_shape, is_gemm, map_sub_jaxprs, open_jaxpr, sub_jaxprs
from ._source import Origin, user_location
from ._trace import Row, Traced, id_key
from .errors import AuditError, PolicySpecError, TargetError, first_line
from .policies import is_te_gemm, is_te_standin
from .report import (
    Category,
    EquationMark,
    Outcome,
    PolicyResult,
    Residual,
    ResidualKind,
    Scope,
    Totals,
    Verdict,
)
from .specs import PolicySpec, SpecKind


def resolve_scope(traced: Traced, spec: PolicySpec, scope: Scope) -> Scope:
    if spec.kind is SpecKind.AS_IS:
        return Scope.INNER
    if scope is Scope.AUTO:
        return Scope.INNER if traced.has_remat else Scope.OUTER
    return scope


def policy_function(traced: Traced, spec: PolicySpec, scope: Scope) -> Callable[..., Any]:
    """The traced function with `spec` applied, as a function of the flat array inputs."""
    closed = traced.jaxpr
    if spec.kind is SpecKind.AS_IS:
        return jc.jaxpr_as_fun(closed.replace(jaxpr=_swap_policies(closed.jaxpr, _KEEP, traced.memo)))
    if spec.kind is SpecKind.NONE:  # plain autodiff: the function's own checkpoints are inlined
        return jc.jaxpr_as_fun(closed.replace(jaxpr=_swap_policies(closed.jaxpr, None, traced.memo)))
    policy = _guarded(spec)
    if scope is Scope.INNER:
        return jc.jaxpr_as_fun(closed.replace(jaxpr=_swap_policies(closed.jaxpr, policy, traced.memo)))
    return jax.checkpoint(jc.jaxpr_as_fun(closed), policy=policy)


def _guarded(spec: PolicySpec) -> Callable[..., Any]:
    """The spec's policy, with its errors and bad answers turned into a PolicySpecError naming it."""
    policy = spec.policy
    assert policy is not None

    def guarded(prim: Any, *avals: Any, **params: Any) -> Any:
        return ask_policy(policy, spec.text, prim, avals, params)

    return guarded


def ask_policy(policy: Callable[..., Any], spec_text: str, prim: Any, avals: Any, params: dict[str, Any]) -> Any:
    """`policy(prim, *avals, **params)`, checked: what it raises or wrongly returns is the policy's
    fault, said in one PolicySpecError."""
    name = getattr(prim, "name", prim)
    try:
        answer = policy(prim, *avals, **params)
    except Exception as exc:
        raise PolicySpecError(
            f"policy {spec_text!r} raised {type(exc).__name__} on {name}: {exc}",
            "a policy is called as policy(prim, *avals, **params) and must return a bool",
        ) from exc
    if not isinstance(answer, bool | jc.SaveableType | jc.RecomputeType | jc.Offloadable):
        raise PolicySpecError(
            f"policy {spec_text!r} returned {answer!r} for {name}",
            "return True/False, Saveable, Recompute or Offloadable(src, dst) "
            "(did you return Offloadable instead of Offloadable(...)?)",
        )
    return answer


_KEEP: Any = object()  # as a policy: every checkpoint keeps its own


def _swap_policies(jaxpr: Any, policy: Callable[..., Any] | None, shared: dict[Any, Any] | None = None) -> Any:
    """Every checkpoint gets `policy` (_KEEP: keeps its own); with None, checkpoints are inlined
    (plain autodiff). `shared` (one per trace) keeps what every policy can reuse: the segments."""
    segments = None if shared is None else shared.setdefault("segments", {})
    return _Swap(policy, _repeated_sites(jaxpr), segments).run(jaxpr, direct=True)


_SiteKey = tuple[int, Any, bool, tuple[Any, ...]]


def _site_key(eqn: Any) -> _SiteKey:
    return (id(eqn.params["jaxpr"]), eqn.params["prevent_cse"], eqn.params["differentiated"],
            tuple(v.aval for v in eqn.invars))


def _repeated_sites(jaxpr: Any) -> set[_SiteKey]:
    """Checkpoint calls that occur more than once (an unrolled stack's layers) where JAX linearizes
    each equation by itself: in the top-level function and in the jit calls it makes."""
    seen: set[_SiteKey] = set()
    repeated: set[_SiteKey] = set()

    def walk(j: Any) -> None:
        for eqn in j.eqns:
            if eqn.primitive is jc.remat_p:
                key = _site_key(eqn)
                (repeated if key in seen else seen).add(key)
            elif eqn.primitive is jc.jit_p:
                walk(open_jaxpr(eqn.params["jaxpr"]))

    walk(jaxpr)
    return repeated


class _Swap:
    """`_swap_policies`' rewrite. Bodies shared by several equations stay shared (JAX caches per
    body object), and so does a body the rewrite leaves as it was, across policies too.

    A checkpoint called more than once, where JAX linearizes equation by equation, becomes a call
    of one `jit` holding it: JAX linearizes a jit body once per body object and input pattern, so
    an unrolled stack costs one layer per policy instead of every layer. The residuals are the
    same values (jit forwards residuals that are its inputs or outputs); a body that returns an
    input or one value twice is left unwrapped, where jit's forwarding does not match remat's.
    """

    def __init__(
        self, policy: Callable[..., Any] | None, repeated: set[_SiteKey], segments: dict[Any, Any] | None = None
    ) -> None:
        self.policy = policy
        self.repeated = repeated
        self.segments = segments
        self.memos: dict[bool, dict[int, tuple[Any, Any]]] = {True: {}, False: {}}  # by context
        self.sites: dict[tuple[Any, ...], Any] = {}

    def _direct(self, _: int, jaxpr: Any) -> Any:
        return self.run(jaxpr, direct=True)

    def _within(self, _: int, jaxpr: Any) -> Any:
        return self.run(jaxpr, direct=False)

    def run(self, jaxpr: Any, direct: bool) -> Any:
        eqns: list[Any] = []
        alias: dict[Any, Any] = {}  # an inlined checkpoint's output -> the value it passed through
        changed = False

        def look(v: Any) -> Any:
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
                if self.policy is not None and self.policy is not _KEEP:
                    params["policy"] = self.policy
                eqn = eqn.replace(params=params)
                site = self._site(eqn, inline=self.policy is None) if direct else None
                if site is not None:
                    eqn = site.replace(invars=eqn.invars, outvars=eqn.outvars)
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

    def _site(self, eqn: Any, inline: bool = False) -> Any | None:
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


def _segmented(jaxpr: Any, eqns: list[Any], outvars: list[Any], original: set[int], cache: dict[Any, Any]) -> list[Any]:
    """`eqns` with each run of equations no policy touches (no checkpoint inside, no effects) made a
    call of one jit, the same jit object for every policy of this trace.

    JAX linearizes a jit body once per body object and input pattern: what lies around the
    checkpoints (embeddings, the loss, a Keras layer's work outside its rematerialised activation)
    is then linearized by the first policy only; the next ones reuse it. The residuals are the same
    values: a segment's outputs are values it computes (never an input, each once), and jit
    forwards residuals that are its inputs or outputs."""
    last_use: dict[Any, int] = {}
    for i, eqn in enumerate(eqns):
        for v in eqn.invars:
            if not isinstance(v, jc.Literal):
                last_use[v] = i
    for v in outvars:
        if not isinstance(v, jc.Literal):
            last_use[v] = len(eqns)
    out: list[Any] = []
    run: list[Any] = []

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


def _segment(jaxpr: Any, run: list[Any], end: int, last_use: dict[Any, int], cache: dict[Any, Any]) -> Any | None:
    defined = [v for e in run for v in e.outvars if not isinstance(v, jc.DropVar)]
    own = set(defined)
    inputs = list(dict.fromkeys(v for e in run for v in e.invars if not isinstance(v, jc.Literal) and v not in own))
    outputs = [v for v in defined if last_use.get(v, -1) > end]
    if not outputs:
        return None
    key = (id(run[0]), id(run[-1]), len(run), tuple(map(id, outputs)))
    if key not in cache:
        call = jc.jit_call(jc.run_body(jc.part_of(jaxpr, run, inputs, outputs)), [v.aval for v in inputs])
        cache[key] = (run[0], run[-1], outputs, call.replace(invars=inputs, outvars=outputs) if call else None)
    return cache[key][3]


def _inline(eqn: Any, body: Any, alias: dict[Any, Any]) -> list[Any]:
    """The body's equations in place of the checkpoint equation, with fresh variables (the same
    body is shared by every call of a layer, and each copy needs its own).

    An output that is an input passed through, a literal, or a value returned twice becomes an
    alias of that value (recorded in `alias`), as in the function without the checkpoint: no copy
    is made, so no extra residual appears."""
    env: dict[Any, Any] = dict(zip(body.invars, eqn.invars, strict=True))
    results: dict[Any, Any] = {}  # the body's results take the checkpoint's own output variables
    for body_v, outer_v in zip(body.outvars, eqn.outvars, strict=True):
        if not isinstance(body_v, jc.Literal) and body_v not in env and not isinstance(outer_v, jc.DropVar):
            results.setdefault(body_v, outer_v)

    def bind(v: Any) -> Any:
        if v in results and v not in env:
            env[v] = results[v]
        else:
            env[v] = jc.DropVar(v.aval) if isinstance(v, jc.DropVar) else jc.Var(v.aval)
        return env[v]

    out = []
    for inner in body.eqns:
        invars = [v if isinstance(v, jc.Literal) else env[v] for v in inner.invars]
        out.append(inner.replace(invars=invars, outvars=[bind(v) for v in inner.outvars]))
    for body_v, outer_v in zip(body.outvars, eqn.outvars, strict=True):
        src = body_v if isinstance(body_v, jc.Literal) else env[body_v]
        if src is not outer_v and not isinstance(outer_v, jc.DropVar):
            alias[outer_v] = src
    return out


def verdict_of(policy: Callable[..., Any] | None, eqn: Any, spec_text: str) -> Verdict:
    if policy is None:
        return Verdict.NONE
    answer = ask_policy(policy, spec_text, eqn.primitive, [v.aval for v in eqn.invars], eqn.params)
    if answer is True or isinstance(answer, jc.SaveableType):
        return Verdict.SAVE
    if answer is False or isinstance(answer, jc.RecomputeType):
        return Verdict.RECOMPUTE
    return Verdict.OFFLOAD


def row_policy(row: Row, spec: PolicySpec, scope: Scope) -> Callable[..., Any] | None:
    """The policy JAX applies to this row's equation under `spec`."""
    if spec.kind is SpecKind.NONE:
        return None
    if spec.kind is SpecKind.AS_IS or (scope is Scope.OUTER and row.in_remat):
        return row.remat_policy
    if scope is Scope.INNER and not row.in_remat:
        return None
    return spec.policy


@dataclasses.dataclass(frozen=True, slots=True)
class _Producer:
    eqn: Any | None
    name: str | None
    multiplicity: int
    argument: int | None  # index of a top-level input, when the value is an input


def analyse(traced: Traced, spec: PolicySpec, scope: Scope = Scope.AUTO) -> PolicyResult:
    """Residuals, marks and recompute cost of one policy on one trace."""
    scope = resolve_scope(traced, spec, scope)
    fun = policy_function(traced, spec, scope)
    captured: dict[str, Any] = {}

    def residuals_of(*args: Any) -> list[Any]:
        residuals, captured["tangent"] = jc.linearize_for_vjp(fun, args)
        return residuals

    try:
        forward = jax.make_jaxpr(residuals_of)(*traced.avals).jaxpr
    except AuditError:
        raise
    except Exception as exc:
        raise TargetError(
            f"differentiating {traced.target or 'the function'} under {spec.text} raised "
            f"{type(exc).__name__} at {user_location(exc)}: {first_line(exc)}",
            "fix the model's differentiation rules (rerun with --debug for the traceback)",
        ) from exc
    rows = traced.rows.by_id  # complete now: custom_vjp forward rules were traced just above
    residuals = _residuals(traced, forward)
    recomputed, recompute_flops = _recomputed(traced, captured["tangent"])

    saved: dict[str, Outcome] = {}
    for r in residuals:
        if r.equation is None or r.kind not in (ResidualKind.ACTIVATION, ResidualKind.HOST):
            continue
        outcome = Outcome.OFFLOADED if r.kind is ResidualKind.HOST else Outcome.SAVED
        if saved.get(r.equation) is not Outcome.OFFLOADED:
            saved[r.equation] = outcome
    marks = []
    for eid in sorted(rows, key=id_key):
        row = rows[eid]
        verdict = verdict_of(row_policy(row, spec, scope), row.eqn, spec.text)
        outcome = saved.get(eid) or (Outcome.RECOMPUTED if eid in recomputed else Outcome.NOT_NEEDED)
        marks.append(EquationMark(eid, verdict, outcome))
    forward_flops = sum(e.flops * e.multiplicity for e in traced.rows.equations())
    return PolicyResult(
        policy=spec.text,
        scope=scope,
        residuals=tuple(residuals),
        totals=_totals(residuals),
        marks=tuple(marks),
        recompute_flops=recompute_flops,
        forward_flops=forward_flops,
        warnings=(),
    )


def failed(traced: Traced, spec: PolicySpec, scope: Scope, error: TargetError) -> PolicyResult:
    """The row of a policy under which JAX could not differentiate the function: empty, with why."""
    return PolicyResult(
        policy=spec.text,
        scope=resolve_scope(traced, spec, scope),
        residuals=(),
        totals=_totals(()),
        marks=(),
        recompute_flops=0,
        forward_flops=sum(e.flops * e.multiplicity for e in traced.rows.equations()),
        warnings=(),
        error=error.message,
    )


def residual_outputs(jaxpr: Any) -> list[tuple[Any, ResidualKind, int]]:
    """(value, kind, index of the forward jaxpr's output that returns it) of each residual, in
    the order and with the deduplication of `jax.ad_checkpoint.saved_residuals`."""
    subst = {e.outvars[0]: e.invars[0] for e in jaxpr.eqns if e.primitive is jc.reduce_precision_p}
    first: dict[Any, int] = {}  # each residual value -> the first output returning it
    for i, v in enumerate(jaxpr.outvars):
        if not isinstance(v, jc.Literal):
            first.setdefault(subst.get(v, v), i)
    out = [(v, ResidualKind.LITERAL, i) for i, v in enumerate(jaxpr.outvars) if isinstance(v, jc.Literal)]
    out += [(v, ResidualKind.CONSTANT, first[v]) for v in jaxpr.constvars if v in first]
    out += [(v, ResidualKind.ARGUMENT, first[v]) for v in jaxpr.invars if v in first]
    out += [
        (v, ResidualKind.HOST if _on_host(v.aval) else ResidualKind.ACTIVATION, first[v])
        for e in jaxpr.eqns
        for v in e.outvars
        if v in first
    ]
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class _Made:
    """What a residual's producing equation says of it: the same for every layer sharing a body."""

    equation: str | None  # the row's id
    row: Row | None
    category: Category | None  # TE GEMM or dot; else decided by the name
    primitive: str | None
    origin: Origin
    standin: bool


def _made(traced: Traced, eqn: Any | None) -> _Made:
    if eqn is None:
        return _Made(None, None, None, None, Origin(None, None), False)
    eid = jc.eqn_tag(eqn)
    row = traced.rows.by_id.get(eid) if eid else None
    category = Category.TE_GEMM if is_te_gemm(eqn.primitive) else Category.DOT if is_gemm(eqn.primitive) else None
    return _Made(eid if row is not None else None, row, category, eqn.primitive.name, _origin(traced, row, eqn),
                 is_te_standin(eqn.primitive))


def _residuals(traced: Traced, jaxpr: Any) -> list[Residual]:
    """The residual set exactly as `jax.ad_checkpoint.saved_residuals` forms it, with provenance."""
    resolver = _Resolver()
    made: dict[int, tuple[Any, _Made]] = {}  # id(eqn) -> (eqn, what it says): layers share equations
    types: dict[Any, tuple[tuple[int, ...], str, int]] = {}
    out = []
    for var, kind, _ in residual_outputs(jaxpr):
        producer = resolver.resolve(jaxpr, var) if kind not in (ResidualKind.CONSTANT, ResidualKind.LITERAL) else None
        eqn = producer.eqn if producer else None
        if id(eqn) not in made:
            made[id(eqn)] = (eqn, _made(traced, eqn))
        m = made[id(eqn)][1]
        name = producer.name if producer else None
        if name is None and m.row is not None:
            name = m.row.equation.name
        category = m.category or (Category.NAMED if name is not None else Category.OTHER)
        argument = None
        if kind is ResidualKind.ARGUMENT:
            argument = traced.arg_names[jaxpr.invars.index(var)]
        elif producer is not None and producer.argument is not None:
            argument = traced.arg_names[producer.argument]
        aval = var.aval
        if aval not in types:
            types[aval] = (aval_shape(aval), aval_dtype(aval), aval_bytes(aval))
        shape, dtype, nbytes = types[aval]
        out.append(
            Residual(
                shape=shape,
                dtype=dtype,
                bytes=0 if kind is ResidualKind.LITERAL else nbytes,
                kind=kind,
                category=category,
                primitive=m.primitive,
                name=name,
                equation=m.equation,
                source=m.origin.source,
                frame=m.origin.frame,
                module=m.row.equation.module if m.row else None,
                multiplicity=producer.multiplicity if producer else 1,
                argument=argument,
                standin=m.standin,
            )
        )
    return out


def _origin(traced: Traced, row: Row | None, eqn: Any) -> Origin:
    if row is not None:
        return Origin(row.equation.source, row.equation.frame)
    return traced.rows.finder(eqn) if eqn is not None else Origin(None, None)


def _on_host(aval: Any) -> bool:
    space = getattr(aval, "memory_space", None)
    return space is not None and str(space).lower().endswith("host")


class _Resolver:
    """Follows a value back to the equation that computed it, through names, offload copies,
    sharding constraints, reduce_precision, scans (counting the layers they stack), jit, checkpoint and custom calls."""

    def __init__(self) -> None:
        self._producers: dict[int, dict[Any, tuple[Any, int]]] = {}
        self._subs: dict[int, tuple[Any, list[Any]]] = {}  # id(eqn) -> (eqn, its sub-jaxprs)

    def _sub_jaxprs(self, eqn: Any) -> list[Any]:
        key = id(eqn)
        if key not in self._subs:
            self._subs[key] = (eqn, [sub for _, _, sub in sub_jaxprs(eqn.params)])
        return self._subs[key][1]

    def _producer_map(self, jaxpr: Any) -> dict[Any, tuple[Any, int]]:
        key = id(jaxpr)
        if key not in self._producers:
            self._producers[key] = {v: (e, i) for e in jaxpr.eqns for i, v in enumerate(e.outvars)}
        return self._producers[key]

    def resolve(self, jaxpr: Any, var: Any) -> _Producer:
        return self._resolve(jaxpr, var, None, 1, 0, top=True)

    def _resolve(self, jaxpr: Any, var: Any, name: str | None, mult: int, depth: int, top: bool = False) -> _Producer:
        if depth > 64 or isinstance(var, jc.Literal):
            return _Producer(None, name, mult, None)
        found = self._producer_map(jaxpr).get(var)
        if found is None:
            argument = jaxpr.invars.index(var) if top and var in jaxpr.invars else None
            return _Producer(None, name, mult, argument)
        eqn, i = found
        prim = eqn.primitive
        if prim is jc.name_p:
            return self._resolve(jaxpr, eqn.invars[0], name or eqn.params["name"], mult, depth + 1, top)
        if prim is jc.reduce_precision_p or prim is jc.device_put_p or prim is jc.sharding_constraint_p:
            return self._resolve(jaxpr, eqn.invars[i], name, mult, depth + 1, top)
        if prim is jc.scan_p:
            return self._through_scan(jaxpr, eqn, i, name, mult, depth, top)
        subs = self._sub_jaxprs(eqn)
        if len(subs) == 1 and prim is not jc.custom_jvp_call_p:
            body = open_jaxpr(subs[0])
            if len(body.outvars) == len(eqn.outvars):
                inner = self._resolve(body, body.outvars[i], name, mult, depth + 1)
                if inner.eqn is None and body.outvars[i] in body.invars and len(body.invars) == len(eqn.invars):
                    outer = eqn.invars[body.invars.index(body.outvars[i])]
                    return self._resolve(jaxpr, outer, inner.name, mult, depth + 1, top)
                return inner
        return _Producer(eqn, name, mult, None)

    def _through_scan(
        self, jaxpr: Any, eqn: Any, i: int, name: str | None, mult: int, depth: int, top: bool
    ) -> _Producer:
        body = open_jaxpr(eqn.params["jaxpr"])
        n_consts, n_carry = jc.scan_counts(eqn.params)
        length = int(eqn.params["length"])
        stacked = i >= n_carry
        inner_mult = mult * length if stacked else mult
        out = body.outvars[i]
        for _ in range(2):  # a carried value: follow the carry-out that feeds it
            inner = self._resolve(body, out, name, inner_mult, depth + 1)
            if inner.eqn is not None or out not in body.invars:
                return inner
            j = body.invars.index(out)
            if n_consts <= j < n_consts + n_carry and body.outvars[j - n_consts] is not out:
                out = body.outvars[j - n_consts]
                continue
            # a loop-invariant or per-iteration input: its producer is outside the scan (stacked,
            # it is still one value per layer)
            return self._resolve(jaxpr, eqn.invars[j], inner.name, inner_mult, depth + 1, top)
        return _Producer(eqn, name, inner_mult, None)


def _recomputed(traced: Traced, tangent: Any) -> tuple[set[str], int]:
    """Forward equations that run again in the backward pass, and their FLOPs.

    In the tangent jaxpr every equation either depends on a tangent (linear work) or only on
    residuals: the latter is remat's recomputation, which the backward pass runs before the
    transposed linear work. An equation counts as recomputed when the tangent jaxpr runs its own
    primitive again; what a derivative rule adds (`cos` for `sin`) is not a rerun of the forward
    pass. FLOPs are each recomputed equation's forward FLOPs, once per run of the forward pass,
    so recomputation is at most 100% of the forward FLOPs.
    """
    rows = traced.rows.by_id
    seen = _Walk().run(tangent, (True,) * len(tangent.invars))[1]
    tags = {
        tag
        for tag, prim in seen
        if tag in rows and (rows[tag].equation.primitive == prim or rows[tag].eqn.primitive is jc.custom_jvp_call_p)
    }
    flops = 0
    for tag in tags:
        eq = traced.rows.equation(tag)
        flops += eq.flops * eq.multiplicity
    return tags, flops


_Seen = frozenset[tuple[str, str]]  # (tag, primitive) of equations that depend on no tangent


class _Walk:
    """Tangent-dependence through a jaxpr, memoized per (body, input flags): a layer body shared by
    every layer is walked once."""

    def __init__(self) -> None:
        self._memo: dict[tuple[int, tuple[bool, ...]], tuple[Any, tuple[bool, ...], _Seen]] = {}

    def run(self, jaxpr: Any, tangent_in: tuple[bool, ...]) -> tuple[tuple[bool, ...], _Seen]:
        key = (id(jaxpr), tangent_in)
        if key not in self._memo:
            self._memo[key] = (jaxpr, *self._run(jaxpr, tangent_in))  # keeps `jaxpr` alive: ids stay unique
        return self._memo[key][1:]

    def _run(self, jaxpr: Any, tangent_in: tuple[bool, ...]) -> tuple[tuple[bool, ...], _Seen]:
        tangent_vars = {v for v, t in zip(jaxpr.invars, tangent_in, strict=True) if t}
        seen: set[tuple[str, str]] = set()
        for eqn in jaxpr.eqns:
            ins = tuple(not isinstance(v, jc.Literal) and v in tangent_vars for v in eqn.invars)
            structured = self._structured(eqn, ins)
            if structured is None:  # a leaf equation
                outs = (any(ins),) * len(eqn.outvars)
                has_var_input = any(not isinstance(v, jc.Literal) for v in eqn.invars)
                if not any(ins) and has_var_input and eqn.primitive is not jc.name_p:
                    tag = jc.eqn_tag(eqn)
                    if tag is not None:
                        seen.add((tag, eqn.primitive.name))
            else:
                outs, inner = structured
                seen |= inner
            tangent_vars.update(v for v, t in zip(eqn.outvars, outs, strict=True) if t)
        outs = tuple(not isinstance(v, jc.Literal) and v in tangent_vars for v in jaxpr.outvars)
        return outs, frozenset(seen)

    def _structured(self, eqn: Any, ins: tuple[bool, ...]) -> tuple[tuple[bool, ...], _Seen] | None:
        """(output flags, equations seen) of a structured equation; None for a leaf."""
        prim = eqn.primitive
        params = eqn.params
        if prim is jc.scan_p:
            body = open_jaxpr(params["jaxpr"])
            n_consts, n_carry = jc.scan_counts(params)
            flags = _carry_fixpoint(body, list(ins), n_consts, n_consts + n_carry, n_carry)
            return self.run(body, flags)
        if prim is jc.while_p:
            body = open_jaxpr(params["body_jaxpr"])
            lo = params["cond_nconsts"] + params["body_nconsts"]
            own = list(ins[params["cond_nconsts"] :])  # the body's inputs: its consts, then the carry
            flags = _carry_fixpoint(body, own, params["body_nconsts"], len(own), len(ins) - lo)
            return self.run(body, flags)
        if prim is jc.cond_p:
            results = [self.run(open_jaxpr(b), ins[1:]) for b in params["branches"]]
            outs = tuple(any(col) for col in zip(*(r[0] for r in results), strict=True))
            return outs, frozenset().union(*(r[1] for r in results))
        subs = list(sub_jaxprs(params))
        if len(subs) == 1 and prim is not jc.custom_jvp_call_p:
            body = open_jaxpr(subs[0][2])
            if len(body.invars) == len(eqn.invars) and len(body.outvars) == len(eqn.outvars):
                return self.run(body, ins)
        return None


def _carry_fixpoint(body: Any, flags: list[bool], lo: int, hi: int, n_carry: int) -> tuple[bool, ...]:
    """Input flags with the loop carry [lo:hi] tangent wherever an iteration can make it so."""
    for _ in range(n_carry + 1):
        outs = _dataflow_only(body, flags)
        new = [a or b for a, b in zip(flags[lo:hi], outs[:n_carry], strict=True)]
        if new == flags[lo:hi]:
            break
        flags[lo:hi] = new
    return tuple(flags)


def _dataflow_only(jaxpr: Any, tangent_in: list[bool]) -> list[bool]:
    """Coarse tangent-dependence (any tangent input taints every output), for carry fixpoints."""
    tangent_vars = {v for v, t in zip(jaxpr.invars, tangent_in, strict=True) if t}
    for eqn in jaxpr.eqns:
        if any(not isinstance(v, jc.Literal) and v in tangent_vars for v in eqn.invars):
            tangent_vars.update(eqn.outvars)
    return [not isinstance(v, jc.Literal) and v in tangent_vars for v in jaxpr.outvars]


def _totals(residuals: Iterable[Residual]) -> Totals:
    by_kind = {k: 0 for k in ResidualKind}
    by_cat = {c: 0 for c in Category}
    for r in residuals:
        by_kind[r.kind] += r.bytes
        if r.kind is ResidualKind.ACTIVATION:
            by_cat[r.category] += r.bytes
    return Totals(
        activation_bytes=by_kind[ResidualKind.ACTIVATION],
        argument_bytes=by_kind[ResidualKind.ARGUMENT],
        host_bytes=by_kind[ResidualKind.HOST],
        constant_bytes=by_kind[ResidualKind.CONSTANT],
        te_gemm_bytes=by_cat[Category.TE_GEMM],
        dot_bytes=by_cat[Category.DOT],
        named_bytes=by_cat[Category.NAMED],
        other_bytes=by_cat[Category.OTHER],
    )
