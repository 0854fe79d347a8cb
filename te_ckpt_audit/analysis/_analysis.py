"""Analyse one policy against one trace: residuals, marks, recompute FLOPs.

The truth is JAX's own partial evaluation: we apply the policy (`_apply`: by wrapping the traced
function in `jax.checkpoint`, or by swapping the policy of the checkpoints it already has), call
the same linearization `jax.vjp` uses, and read what it kept. Nothing here re-implements remat rules; it
only reads JAX's output and follows values back to the equations that made them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import cast

import jax

from .. import _jax_compat as jc
from .._jaxpr import AnyJaxpr, aval_bytes, aval_dtype, aval_shape, is_gemm, open_jaxpr, sub_jaxprs
from ..errors import AuditError, TargetError, first_line
from ..policies import QUANTIZED_OUTPUTS, SCALE_OUTPUTS, is_te_gemm, is_te_quantize, is_te_standin
from ..records import (
    Category,
    EquationMark,
    Outcome,
    PolicyResult,
    Residual,
    ResidualKind,
    Scope,
    Totals,
)
from ..specs import PolicySpec
from ..trace._source import Origin, user_location
from ..trace._trace import Row, Traced, id_key
from ._apply import policy_function, resolve_scope, row_verdict


@dataclasses.dataclass(frozen=True, slots=True)
class _Producer:
    eqn: jc.JaxprEqn | None
    name: str | None
    multiplicity: int
    argument: int | None  # index of a top-level input, when the value is an input
    tags: frozenset[str] = frozenset()  # the tags on its path: they name the call sites it was made at
    output: int | None = None  # which of the equation's outputs the value is
    body_input: tuple[int, int] | None = None  # made by no equation of a body: (id of the body, which input)

    def inside(self, call: jc.JaxprEqn) -> _Producer:
        """This producer, found inside the body `call` calls."""
        return dataclasses.replace(self, tags=self.tags | jc.eqn_tags(call)) if self.eqn is not None else self


@dataclasses.dataclass(frozen=True, slots=True)
class Analysis:
    """One policy's linearization, and what was read from it. `forward` is the forward pass that
    returns exactly the residuals (a ClosedJaxpr): the placement step compiles it for a mesh."""

    result: PolicyResult
    forward: jc.ClosedJaxpr


def analyse_policy(traced: Traced, spec: PolicySpec, scope: Scope = Scope.AUTO, remat3: bool | None = None
                   ) -> Analysis:
    """Residuals, marks and recompute cost of one policy on one trace: one linearization by JAX
    (with `remat3`, by default as the trace found JAX's flag, under JAX's new remat)."""
    remat3 = traced.remat3 if remat3 is None else remat3
    scope = resolve_scope(traced, spec, scope)
    fun = policy_function(traced, spec, scope, remat3, calls=True)
    captured: dict[str, jc.Jaxpr] = {}

    trained = traced.trained.inputs if traced.trained.arguments is not None else None

    def residuals_of(*args: jax.Array) -> list[jax.Array]:
        if trained is None:  # every input, as `saved_residuals(fn, *args)` differentiates them
            residuals, captured["tangent"] = jc.linearize_for_vjp(fun, args)
            return residuals

        def of_trained(*values: jax.Array) -> object:  # the batch is known: not differentiated
            full = list(args)
            for i, value in zip(trained, values, strict=True):
                full[i] = value
            return fun(*full)

        residuals, captured["tangent"] = jc.linearize_for_vjp(of_trained, [args[i] for i in trained])
        return residuals

    try:
        with jc.remat3(remat3):
            forward = jax.make_jaxpr(residuals_of)(*traced.avals)
    except AuditError:
        raise
    except Exception as exc:
        raise TargetError(
            f"differentiating {traced.target or 'the function'} under {spec.text} raised "
            f"{type(exc).__name__} at {user_location(exc)}: {first_line(exc)}",
            "fix the model's differentiation rules ($debug$)",
        ) from exc
    rows = traced.rows.by_id  # complete now: custom_vjp forward rules were traced just above
    residuals = _residuals(traced, forward.jaxpr)
    recomputed, recompute_flops = _recomputed(traced, captured["tangent"])

    marks = _marks(traced, spec, scope, residuals, recomputed)
    requantized = [traced.rows.equation(e) for e in sorted(recomputed, key=id_key)
                   if e in rows and rows[e].equation.is_te_quantize]
    result = PolicyResult(
        policy=spec.text,
        scope=scope,
        residuals=tuple(residuals),
        totals=_totals(residuals),
        marks=marks,
        recompute_flops=recompute_flops,
        forward_flops=traced.forward_flops,
        warnings=(),
        requantized=sum(e.multiplicity for e in requantized),
        requantize_flops=sum(e.flops * e.multiplicity for e in requantized),
        requantized_equations=tuple(e.id for e in requantized),
    )
    return Analysis(result, forward)


def _marks(traced: Traced, spec: PolicySpec, scope: Scope, residuals: Iterable[Residual], recomputed: set[str]
           ) -> tuple[EquationMark, ...]:
    """Every forward equation's verdict under the policy and what the backward pass gets from it."""
    saved: dict[str, Outcome] = {}
    for r in residuals:
        if r.equation is None or r.kind not in (ResidualKind.ACTIVATION, ResidualKind.HOST):
            continue
        outcome = Outcome.OFFLOADED if r.kind is ResidualKind.HOST else Outcome.SAVED
        if saved.get(r.equation) is not Outcome.OFFLOADED:
            saved[r.equation] = outcome
    rows = traced.rows.by_id
    return tuple(
        EquationMark(eid, row_verdict(rows[eid], spec, scope),
                     saved.get(eid) or (Outcome.RECOMPUTED if eid in recomputed else Outcome.NOT_NEEDED))
        for eid in sorted(rows, key=id_key)
    )


def analyse(traced: Traced, spec: PolicySpec, scope: Scope = Scope.AUTO) -> PolicyResult:
    """`analyse_policy`'s result alone."""
    return analyse_policy(traced, spec, scope).result


def failed(traced: Traced, spec: PolicySpec, scope: Scope, error: TargetError) -> PolicyResult:
    """The row of a policy under which JAX could not differentiate the function: empty, with why."""
    return PolicyResult(
        policy=spec.text,
        scope=resolve_scope(traced, spec, scope),
        residuals=(),
        totals=_totals(()),
        marks=(),
        recompute_flops=0,
        forward_flops=traced.forward_flops,
        warnings=(),
        error=error.message,
    )


def residual_outputs(jaxpr: jc.Jaxpr) -> list[tuple[jc.Atom, ResidualKind, int]]:
    """(value, kind, index of the forward jaxpr's output that returns it) of each residual, in
    the order and with the deduplication of JAX's own `saved_residuals` (what
    `jax.ad_checkpoint.print_saved_residuals` prints)."""
    subst = {e.outvars[0]: e.invars[0] for e in jaxpr.eqns if e.primitive is jc.reduce_precision_p}
    first: dict[jc.Atom, int] = {}  # each residual value -> the first output returning it
    for i, v in enumerate(jaxpr.outvars):
        if not isinstance(v, jc.Literal):
            first.setdefault(subst.get(v, v), i)
    out: list[tuple[jc.Atom, ResidualKind, int]]
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
class _ProducerFacts:
    """What a residual's producing equation says of it: the same for every layer sharing a body."""

    equation: str | None  # the row's id
    row: Row | None
    category: Category | None  # TE GEMM or dot; else decided by the name
    primitive: str | None
    origin: Origin
    standin: bool
    quantize: bool = False  # the producer is one of TE's quantizations


def _facts_of(traced: Traced, eqn: jc.JaxprEqn | None) -> _ProducerFacts:
    if eqn is None:
        return _ProducerFacts(None, None, None, None, Origin(None, None), False)
    eid = jc.eqn_tag(eqn)
    row = traced.rows.by_id.get(eid) if eid else None
    category = Category.TE_GEMM if is_te_gemm(eqn.primitive) else Category.DOT if is_gemm(eqn.primitive) else None
    return _ProducerFacts(eid if row is not None else None, row, category, eqn.primitive.name,
                          _origin(traced, row, eqn), is_te_standin(eqn.primitive),
                          is_te_quantize(eqn.primitive, eqn.params))


_QUANTIZED_DTYPES = ("float8_e4m3", "float8_e5m2", "float4")  # data types of quantized values (not e8m0 scales)


def _residuals(traced: Traced, jaxpr: jc.Jaxpr) -> list[Residual]:
    """The residual set exactly as JAX's own `saved_residuals` forms it (what
    `jax.ad_checkpoint.print_saved_residuals` prints), with provenance."""
    resolver = _Resolver()
    made: dict[int, tuple[jc.JaxprEqn | None, _ProducerFacts]] = {}  # id(eqn) -> (eqn, what it says): layers share them
    types: dict[jc.AbstractValue, tuple[tuple[int, ...], str, int]] = {}
    position = {v: i for i, v in enumerate(jaxpr.invars)}
    known: list[frozenset[str]] = []  # the traced program's files, once needed
    out = []
    for var, kind, _ in residual_outputs(jaxpr):
        producer = resolver.resolve(jaxpr, var) if kind not in (ResidualKind.CONSTANT, ResidualKind.LITERAL) else None
        eqn = producer.eqn if producer else None
        if id(eqn) not in made:
            made[id(eqn)] = (eqn, _facts_of(traced, eqn))
        m = made[id(eqn)][1]
        name = producer.name if producer else None
        if name is None and m.row is not None:
            name = m.row.equation.name
        module, origin = m.row.equation.module if m.row else None, m.origin
        if m.row is not None and producer is not None and m.equation is not None:  # at its own call site
            scopes, origin = traced.rows.sites.at(m.equation, producer.tags)
            module = "/".join(scopes) or None
        elif producer is not None and producer.tags and not _of_the_trace(origin, traced, known):
            # made by differentiation inside a tagged call, its traceback no line of the traced program's:
            # a rule JAX traced before for another caller keeps that caller's (a long-lived process: a
            # notebook, a test worker); the call's own site is where it was made here
            call = max((t for t in producer.tags if t in traced.rows.by_id), key=lambda t: (t.count("."), t),
                       default=None)
            if call is not None:
                scopes, origin = traced.rows.sites.at(call, producer.tags)
                module = "/".join(scopes) or None
        aval = var.aval
        if aval not in types:
            types[aval] = (aval_shape(aval), aval_dtype(aval), aval_bytes(aval))
        shape, dtype, nbytes = types[aval]
        output = producer.output if producer else None
        quantized = output in QUANTIZED_OUTPUTS if m.quantize else dtype.startswith(_QUANTIZED_DTYPES)
        scale_of = m.equation if m.quantize and output in SCALE_OUTPUTS else None
        category = m.category or (
            Category.QUANTIZED if (quantized or scale_of is not None) and kind is ResidualKind.ACTIVATION
            else Category.NAMED if name is not None else Category.OTHER
        )
        argument = None
        if kind is ResidualKind.ARGUMENT:
            at = position[cast(jc.Var, var)]
            argument = traced.arg_names[at]
            if traced.rows.input_modules:  # a parameter kept alive: the module it belongs to
                module = traced.rows.input_modules[at]
        elif producer is not None and producer.argument is not None:
            argument = traced.arg_names[producer.argument]
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
                source=origin.source,
                frame=origin.frame,
                module=module,
                multiplicity=producer.multiplicity if producer else 1,
                argument=argument,
                standin=m.standin,
                quantized=quantized,
                scale_of=scale_of,
            )
        )
    return out


def _of_the_trace(origin: Origin, traced: Traced, known: list[frozenset[str]]) -> bool:
    """Whether `origin` is a line of a file the traced program's own equations come from (`known`:
    those files, worked out on the first call)."""
    if origin.source is None:
        return False
    if not known:
        known.append(frozenset(r.equation.source.file for r in traced.rows.by_id.values() if r.equation.source))
    return origin.source.file in known[0]


def _origin(traced: Traced, row: Row | None, eqn: jc.JaxprEqn | None) -> Origin:
    if row is not None:
        return Origin(row.equation.source, row.equation.frame)
    if eqn is None:
        return Origin(None, None)
    found = traced.rows.finder(eqn)
    return Origin(found.source or found.frame, found.frame)


def _on_host(aval: jc.AbstractValue) -> bool:
    space = getattr(aval, "memory_space", None)
    return space is not None and str(space).lower().endswith("host")


class _Resolver:
    """Follows a value back to the equation that computed it, through names, offload copies,
    sharding constraints, reduce_precision, scans (counting the layers they stack), jit, checkpoint and custom calls."""

    def __init__(self) -> None:
        self._producers: dict[int, dict[jc.Var, tuple[jc.JaxprEqn, int]]] = {}
        self._inputs: dict[int, dict[jc.Var, int]] = {}  # id(jaxpr) -> position of each input
        self._subs: dict[int, tuple[jc.JaxprEqn, list[AnyJaxpr]]] = {}  # id(eqn) -> (eqn, its sub-jaxprs)
        # the jaxprs keyed by id stay alive in the forward jaxpr
        self._memo: dict[tuple[int, jc.Atom, str | None, int], _Producer] = {}

    def _sub_jaxprs(self, eqn: jc.JaxprEqn) -> list[AnyJaxpr]:
        key = id(eqn)
        if key not in self._subs:
            self._subs[key] = (eqn, [sub for _, _, sub in sub_jaxprs(eqn.params)])
        return self._subs[key][1]

    def _input_map(self, jaxpr: jc.Jaxpr) -> dict[jc.Var, int]:
        if id(jaxpr) not in self._inputs:
            self._inputs[id(jaxpr)] = {v: i for i, v in enumerate(jaxpr.invars)}
        return self._inputs[id(jaxpr)]

    def _producer_map(self, jaxpr: jc.Jaxpr) -> dict[jc.Var, tuple[jc.JaxprEqn, int]]:
        key = id(jaxpr)
        if key not in self._producers:
            self._producers[key] = {v: (e, i) for e in jaxpr.eqns for i, v in enumerate(e.outvars)}
        return self._producers[key]

    def resolve(self, jaxpr: jc.Jaxpr, var: jc.Atom) -> _Producer:
        return self._resolve(jaxpr, var, None, 1, 0, top=True)

    def _resolve(
        self, jaxpr: jc.Jaxpr, var: jc.Atom, name: str | None, mult: int, depth: int, top: bool = False
    ) -> _Producer:
        if top or isinstance(var, jc.Literal):
            return self._resolved(jaxpr, var, name, mult, depth, top)
        key = (id(jaxpr), var, name, mult)  # inside a body every layer shares: resolved once
        if key not in self._memo:
            self._memo[key] = self._resolved(jaxpr, var, name, mult, depth, top)
        return self._memo[key]

    def _resolved(self, jaxpr: jc.Jaxpr, var: jc.Atom, name: str | None, mult: int, depth: int, top: bool) -> _Producer:
        if depth > 64 or isinstance(var, jc.Literal):
            return _Producer(None, name, mult, None)
        found = self._producer_map(jaxpr).get(var)
        if found is None:
            at = self._input_map(jaxpr).get(var)
            inside = None if top or at is None else (id(jaxpr), at)
            return _Producer(None, name, mult, at if top else None, body_input=inside)
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
                out = body.outvars[i]
                inner = self._resolve(body, out, name, mult, depth + 1)
                # where the body made nothing (it passes an input on, or names it): the caller's operand
                at = None if isinstance(out, jc.Literal) else self._input_map(body).get(out)
                if at is None and inner.eqn is None and inner.body_input and inner.body_input[0] == id(body):
                    at = inner.body_input[1]
                if inner.eqn is None and at is not None and len(body.invars) == len(eqn.invars):
                    return self._resolve(jaxpr, eqn.invars[at], inner.name, mult, depth + 1, top)
                return inner.inside(eqn)
        return _Producer(eqn, name, mult, None, jc.eqn_tags(eqn), i)

    def _through_scan(
        self, jaxpr: jc.Jaxpr, eqn: jc.JaxprEqn, i: int, name: str | None, mult: int, depth: int, top: bool
    ) -> _Producer:
        body = open_jaxpr(eqn.params["jaxpr"])
        n_consts, n_carry = jc.scan_counts(eqn.params)
        length = int(eqn.params["length"])
        stacked = i >= n_carry
        inner_mult = mult * length if stacked else mult
        out = body.outvars[i]
        for _ in range(2):  # a carried value: follow the carry-out that feeds it
            inner = self._resolve(body, out, name, inner_mult, depth + 1)
            j = None if isinstance(out, jc.Literal) else self._input_map(body).get(out)
            if inner.eqn is not None or j is None:
                return inner.inside(eqn)
            if n_consts <= j < n_consts + n_carry and body.outvars[j - n_consts] is not out:
                out = body.outvars[j - n_consts]
                continue
            # a loop-invariant or per-iteration input: its producer is outside the scan (stacked,
            # it is still one value per layer)
            return self._resolve(jaxpr, eqn.invars[j], inner.name, inner_mult, depth + 1, top)
        return _Producer(eqn, name, inner_mult, None, jc.eqn_tags(eqn))


def _recomputed(traced: Traced, tangent: jc.Jaxpr) -> tuple[set[str], int]:
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
        self._memo: dict[tuple[int, tuple[bool, ...]], tuple[jc.Jaxpr, tuple[bool, ...], _Seen]] = {}

    def run(self, jaxpr: jc.Jaxpr, tangent_in: tuple[bool, ...]) -> tuple[tuple[bool, ...], _Seen]:
        key = (id(jaxpr), tangent_in)
        if key not in self._memo:
            self._memo[key] = (jaxpr, *self._run(jaxpr, tangent_in))  # keeps `jaxpr` alive: ids stay unique
        return self._memo[key][1:]

    def _run(self, jaxpr: jc.Jaxpr, tangent_in: tuple[bool, ...]) -> tuple[tuple[bool, ...], _Seen]:
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

    def _structured(self, eqn: jc.JaxprEqn, ins: tuple[bool, ...]) -> tuple[tuple[bool, ...], _Seen] | None:
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
        rerun = jc.remat3_rerun(eqn)
        if rerun is not None:  # JAX's new remat: its recompute is in the residuals' tree, all forward work
            return (True,) * len(eqn.outvars), self.run(rerun, (False,) * len(rerun.invars))[1]
        subs = list(sub_jaxprs(params))
        if len(subs) == 1 and prim is not jc.custom_jvp_call_p:
            body = open_jaxpr(subs[0][2])
            if len(body.invars) == len(eqn.invars) and len(body.outvars) == len(eqn.outvars):
                return self.run(body, ins)
        return None


def _carry_fixpoint(body: jc.Jaxpr, flags: list[bool], lo: int, hi: int, n_carry: int) -> tuple[bool, ...]:
    """Input flags with the loop carry [lo:hi] tangent wherever an iteration can make it so."""
    for _ in range(n_carry + 1):
        outs = _dataflow_only(body, flags)
        new = [a or b for a, b in zip(flags[lo:hi], outs[:n_carry], strict=True)]
        if new == flags[lo:hi]:
            break
        flags[lo:hi] = new
    return tuple(flags)


def _dataflow_only(jaxpr: jc.Jaxpr, tangent_in: list[bool]) -> list[bool]:
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
        quantized_bytes=by_cat[Category.QUANTIZED],
    )
