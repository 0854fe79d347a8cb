"""Trace the user's function once, and tag every equation so later stages can find it again.

Every equation gets a path id ("4.1.2") pushed onto its name stack. JAX copies name stacks onto
what it derives from an equation (jvp, partial evaluation, remat's recomputation), so residuals and
recomputed equations found in the differentiated jaxpr point back at a row of the traced one.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import TypeAlias

import jax
import numpy as np
from jax.tree_util import KeyEntry

from .. import _jax_compat as jc
from .._jaxpr import (
    AnyJaxpr,
    aval_dtype,
    aval_shape,
    has_body,
    leaf_flops,
    map_sub_jaxprs,
    open_jaxpr,
    sub_jaxprs,
)
from .._progress import Progress, quiet
from ..errors import TargetError, UsageError, first_line
from ..policies import Policy, is_te_gemm, is_te_quantize, is_te_standin
from ..records import Equation
from ._devices import mesh_context
from ._intern import SiteScopes, intern_bodies
from ._loading import (
    Defines,
    Placement,
    anchored,
    is_array_leaf,
    load_inputs,
    load_target,
    place_args,
    replicated_over,
    unbindable,
    user_code,
)
from ._naming import name_lines as name_matmul_lines
from ._params import Scopes, flow, name_modules, names_own_modules, param_module
from ._sites import Sites
from ._source import Origin, SourceFinder, user_location
from ._trained import ALL, ParamsLike, TrainedInputs, parse_params, resolve_trained


@dataclasses.dataclass(slots=True)
class Row:
    """An Equation plus what analysis needs: the tagged equation and its checkpoint context.

    `equation.multiplicity` is per use of the row's scope: the whole function, or (`anchor`) the
    custom_vjp call whose forward rule holds it; `Rows.equation` gives the total.
    """

    equation: Equation
    eqn: jc.JaxprEqn
    remat_policy: Policy | None  # policy of the innermost enclosing checkpoint
    in_remat: bool
    anchor: str | None = None


class Rows:
    """The forward equations, keyed by id. custom_vjp forward rules are traced lazily by JAX (on
    first differentiation), so their rows arrive during the first analysis."""

    def __init__(self) -> None:
        self.by_id: dict[str, Row] = {}
        self.names: set[str] = set()
        self.finder = SourceFinder()
        self.uses: dict[str, int] = {}  # equation id -> times it runs, shared bodies included
        self.memo: dict[int, tuple[AnyJaxpr, AnyJaxpr]] = {}
        self.has_remat = False  # a checkpoint anywhere, custom_vjp forward rules included
        self.sites = Sites()  # where each equation is, call site by call site (_sites)
        # id of a body -> (the body, kept alive so that its id stays its own; the prefix it was tagged under):
        # a body traced later (a custom_vjp's forward rule, at each differentiation) may die, and a new
        # body given its id read as one more call of it, its equations left without rows
        self.prefix_of: dict[int, tuple[jc.Jaxpr | jc.ClosedJaxpr, str]] = {}
        self.interned: SiteScopes = {}  # checkpoints whose body _intern shared: their own scopes
        self.input_modules: tuple[str | None, ...] = ()  # each input's module, where parameters name them
        self.batched_weight_gemms: dict[str, str] | None = None  # _warnings' lint, found once per trace

    def equation(self, eid: str) -> Equation:
        row = self.by_id[eid]
        eq = row.equation
        times = self.uses.get(row.anchor, 1) * eq.multiplicity if row.anchor else self.uses.get(eid, 1)
        return eq if times == eq.multiplicity else dataclasses.replace(eq, multiplicity=times)

    def equations(self) -> tuple[Equation, ...]:
        return tuple(self.equation(k) for k in sorted(self.by_id, key=id_key))


def id_key(eid: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(p), "") if p.isdigit() else (1 << 30, p) for p in eid.split("."))


# The jit calls `_apply` makes of the work no policy touches, by (first, last, length, outputs) of
# the run of equations each holds; the entry keeps those equations alive, so their ids stay unique.
Segments: TypeAlias = dict[
    tuple[int, int, int, tuple[int, ...]], tuple[jc.JaxprEqn, jc.JaxprEqn, list[jc.Var], jc.JaxprEqn | None]
]


@dataclasses.dataclass(frozen=True)
class Traced:
    """One trace of the user's function; every policy is analysed from it. `segments` holds the
    jit calls of the work no policy touches, and `wrapped` the function inside one checkpoint
    (`_apply`): each built once and shared by every policy."""

    jaxpr: jc.ClosedJaxpr  # tagged
    avals: tuple[jax.ShapeDtypeStruct, ...]  # the array inputs, flattened
    arg_names: tuple[str, ...]
    rows: Rows
    target: str
    trained: TrainedInputs = TrainedInputs(None, ())  # the inputs differentiated (`_trained`)
    structure: Structure | None = dataclasses.field(default=None, compare=False, repr=False)
    segments: Segments = dataclasses.field(default_factory=dict, compare=False, repr=False)
    wrapped: dict[str, jc.ClosedJaxpr] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # JAX's new remat (`jax_remat3`) was on, as JAX read it, when the function was traced: the
    # policies are applied as it applies them (the trace itself is made with the flag off)
    remat3: bool = False
    custom_vjp3: bool = False  # likewise JAX's new custom_vjp (`jax_custom_vjp3`)
    line_names: tuple[tuple[str, str], ...] = ()  # the names the tool gave (`_naming`): (name, "file:line")

    @property
    def has_remat(self) -> bool:
        """A checkpoint anywhere in the function, custom_vjp forward rules included."""
        return self.rows.has_remat

    @property
    def packages(self) -> frozenset[str]:
        """The installed packages whose code made equations of the trace ("maxtext", "flax")."""
        return frozenset(self.rows.finder.packages)

    @property
    def forward_flops(self) -> int:
        """FLOPs of one forward pass: every equation, times how often it runs."""
        return sum(e.flops * e.multiplicity for e in self.rows.equations())

    @property
    def arguments(self) -> tuple[str, ...]:
        """"path: dtype[shape]" of each array input, as a report lists them."""
        return tuple(f"{n}: {a.dtype}{list(a.shape)}" for n, a in zip(self.arg_names, self.avals, strict=True))


@dataclasses.dataclass(frozen=True)
class Structure:
    """The user's arguments as pytrees: their treedef and every leaf (array leaves at `dynamic`),
    so that a training step can take them as the user passes them."""

    treedef: jax.tree_util.PyTreeDef
    leaves: tuple[object, ...]
    dynamic: tuple[int, ...]  # positions of the array leaves, in input order

    def arguments(self, values: Sequence[object], other: object = None) -> tuple[object, ...]:
        """The user's positional arguments with `values` at the array leaves, in input order,
        and `other` at every other leaf."""
        full: list[object] = [other] * len(self.leaves)
        for i, value in zip(self.dynamic, values, strict=True):
            full[i] = value
        return tuple(jax.tree_util.tree_unflatten(self.treedef, full))


def _describe(x: jax.ShapeDtypeStruct) -> str:
    return f"{np.dtype(x.dtype).name}{list(x.shape)}"


def trace(
    fn: jc.ArrayFn, args: tuple[object, ...], target: str = "", params: ParamsLike = ALL,
    differentiable: bool = True, name_lines: bool = False,
) -> Traced:
    """Trace `fn(*args)` to a tagged jaxpr. Array leaves of `args` (arrays or ShapeDtypeStructs)
    become inputs; any other leaf (ints, strings, config objects) is passed through unchanged.
    `params` names the trained arguments (`_trained`: None is `jax.grad`'s convention, "all" every
    float input); `differentiable=False` takes a function whose outputs are not differentiated
    (a training step of the user's own). `name_lines`: the matmul lines of the user's code get the
    tool's checkpoint names (`_naming`).

    >>> import jax, jax.numpy as jnp
    >>> t = trace(lambda x: jnp.sum(jnp.sin(x)), (jax.ShapeDtypeStruct((4,), jnp.float32),))
    >>> [e.primitive for e in t.rows.equations()]
    ['sin', 'reduce_sum']
    """
    found = unbindable(fn, tuple(args))
    if found is not None:  # the arguments are the mistake, not the function's code
        raise UsageError(f"{target or 'the function'} cannot take the {len(args)} argument(s) given: {found[0]}",
                         f"pass its arguments positionally, e.g. audit(fn, {', '.join(found[1])})")
    leaves_with_path, treedef = _flattened(args, target)
    dynamic = [i for i, (_, leaf) in enumerate(leaves_with_path) if is_array_leaf(leaf)]
    leaves = [leaf for _, leaf in leaves_with_path]
    for _, leaf in leaves_with_path:
        if isinstance(leaf, jax.core.Tracer):
            raise UsageError("inputs contain a JAX tracer", "return plain arrays or jax.ShapeDtypeStruct")
    names = tuple(_arg_name(leaves_with_path[i][0]) for i in dynamic)
    avals = tuple(_abstract(leaves[i], name) for i, name in zip(dynamic, names, strict=True))
    if not avals:
        got = ", ".join(sorted({type(leaf).__name__ for leaf in leaves})) or "nothing"
        raise TargetError(
            f"{target or 'the function'} has no array inputs to differentiate (the inputs are: {got})",
            "the inputs callable should return a tuple with jax.ShapeDtypeStruct (or array) leaves",
        )

    def flat_fn(*dyn: jax.Array) -> jc.Tree:
        full = list(leaves)
        for i, value in zip(dynamic, dyn, strict=True):
            full[i] = value
        out = fn(*jax.tree_util.tree_unflatten(treedef, full))
        if differentiable:
            return out
        # a step of the user's own may return what its jit filters out (an Equinox module's functions)
        return [x for x in jax.tree_util.tree_leaves(out) if isinstance(x, jax.Array | jax.core.Tracer)]

    try:
        with jc.current_autodiff():  # checkpoints and custom_vjps as the current JAX makes them; the new ones
            closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*avals)  # are made from them
    except Exception as exc:
        said = f"tracing {target or 'the function'} raised {type(exc).__name__} at {user_location(exc)}: "
        axis = re.search(r"Resource axis: (\S+) of .* is not found in mesh: \(([^)]*)\)", first_line(exc))
        if axis:  # a sharding named over the mesh of the audit's --mesh, which lacks one of the model's axes
            raise UsageError(
                f"{said}mesh axis {axis.group(1)!r} is not in the mesh ({axis.group(2).rstrip(',')})",
                f"give $mesh$ every axis the model shards over ({axis.group(1)} included), or leave $mesh$ out "
                "where the model makes its own mesh over the machine's devices",
            ) from exc
        raise TargetError(f"{said}{first_line(exc)}", "fix the model code ($debug$)") from exc
    _check_outputs(out_shape, target, differentiable)
    rows = Rows()
    line_names: dict[str, str] = {}
    if name_lines:
        named, line_names = name_matmul_lines(closed.jaxpr, rows.finder)
        closed = closed.replace(jaxpr=named)
    interned, rows.interned = intern_bodies(closed.jaxpr)
    modules = [param_module(leaves_with_path[i][0]) for i in dynamic]
    tagged = tag_jaxpr(closed.replace(jaxpr=interned), rows, modules)
    dtypes = [a.dtype for a in avals]
    trained = resolve_trained(fn, len(args), names, dtypes, parse_params(params), target or "the function")
    structure = Structure(treedef, tuple(leaves), tuple(dynamic))
    if jc.custom_vjp3_at_definition(closed.jaxpr):  # its residuals would be left out, silently
        raise UsageError(
            f"{target or 'the function'}: a custom_vjp of the model was made under jax_custom_vjp3 "
            f"(JAX_CUSTOM_VJP3) on jax {jax.__version__}, which fixes it when it is defined, as a call the "
            "audit cannot look inside", "run without JAX_CUSTOM_VJP3, or with jax >= 0.12 (it decides at each "
            "call, and the audit reads jax_custom_vjp3 there)",
        )
    replaced = jc.replaced_jax_functions()
    if replaced:  # the figures would be of another program than the one the user runs
        raise TargetError(
            f"{target or 'the function'}: the model's code replaced {', '.join(replaced)}; its checkpoints are "
            "not JAX's", "audit the model with JAX's own functions (remove the replacement)",
        )
    return Traced(tagged, avals, names, rows, target, trained, structure, remat3=jc.remat3_on(),
                  custom_vjp3=jc.custom_vjp3_on(), line_names=tuple(sorted(line_names.items())))


@dataclasses.dataclass(frozen=True, slots=True)
class Loaded:
    """What this stage hands on: the trace, and what the inputs were made of and placed on."""

    traced: Traced
    placement: Placement  # the mesh the inputs are placed on, or None
    replicated: tuple[str, ...] = ()  # the mesh's axes no input is sharded over, when none is
    keywords: Mapping[str, object] = dataclasses.field(default_factory=dict)  # the inputs callable's call
    where: str = ""  # the target anchored to its folder: a worker (a cluster's) may run in another
    inputs: str | None = None  # the inputs callable, anchored likewise


def trace_function(fn: jc.ArrayFn, args: tuple[object, ...], placement: Placement = None, params: ParamsLike = ALL,
                   own_step: bool = False, name_lines: bool = False) -> Loaded:
    """Trace `fn(*args)`, its inputs placed on `placement` (their NamedShardings, or replicated)."""
    name = getattr(fn, "__name__", "fn")
    with user_code(name), mesh_context(placement):
        traced, replicated = _placed_and_traced(fn, args, name, placement, params, own_step, name_lines)
    return Loaded(traced, placement, replicated)


def trace_target(target: str, inputs: str | None = None, defines: Defines | None = None,
                 placement: Placement = None, params: ParamsLike = None, own_step: bool = False,
                 name_lines: bool = False, progress: Progress = quiet) -> Loaded:
    """Load `file.py:fn` (or `package.module:fn`), call its inputs callable (given the mesh as
    keyword `mesh` when it declares one), place what it returns on the mesh and trace it, as the
    user's code: `sys.exit` there is the target's failure."""
    with user_code(target):
        inputs = anchored(inputs)
        where = anchored(target, "target") or target
        progress(f"loading {target}")
        loaded = load_target(target)
        with mesh_context(placement):
            made = load_inputs(loaded, inputs, defines, mesh=placement)
            progress(f"tracing {target}")
            traced, replicated = _placed_and_traced(loaded.fn, made.args, target, placement, params, own_step,
                                                    name_lines)
    return Loaded(traced, placement, replicated, made.keywords, where, inputs)


def _placed_and_traced(fn: jc.ArrayFn, args: tuple[object, ...], name: str, placement: Placement,
                       params: ParamsLike, own_step: bool, name_lines: bool) -> tuple[Traced, tuple[str, ...]]:
    """`fn(*args)` traced, its inputs placed on `placement`, and the mesh's axes no input is sharded
    over; a step of the user's own is traced as it is (every float input, not differentiated)."""
    placed = args if placement is None else place_args(args, placement)
    traced = trace(fn, placed, name, ALL if own_step else params, differentiable=not own_step, name_lines=name_lines)
    return traced, () if placement is None else replicated_over(placed, placement)


def _flattened(args: tuple[object, ...], target: str) -> tuple[list[tuple[jc.Tree, jc.Value]], jax.tree_util.PyTreeDef]:
    try:
        return jax.tree_util.tree_flatten_with_path(args)
    except (RecursionError, SystemError) as exc:  # JAX's C++ flattening gives up on deep nesting
        raise UsageError(
            f"the inputs of {target or 'the function'} are nested too deeply for JAX to flatten "
            f"({type(exc).__name__})",
            "return a pytree a few levels deep from the inputs callable",
        ) from None


def _check_outputs(out_shape: object, target: str, differentiable: bool) -> None:
    """The function returns arrays, and (to be differentiated) floating ones."""
    out_leaves = jax.tree_util.tree_leaves(out_shape)
    if not out_leaves:
        raise TargetError(
            f"{target or 'the function'} returns {'None' if out_shape is None else 'no array'}; "
            "it must return the loss",
            "return a floating-point scalar (or arrays) to differentiate",
        )
    for leaf in out_leaves if differentiable else ():
        if not jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact):
            raise TargetError(
                f"{target or 'the function'} returns a value of dtype {leaf.dtype}: it is not differentiable",
                "return a floating-point loss (drop integer or boolean outputs)",
            )


def _abstract(leaf: jc.Value, name: str) -> jax.ShapeDtypeStruct:  # an array leaf: shape and dtype
    """The leaf as a ShapeDtypeStruct that keeps what JAX keys on: weak type and sharding."""
    shape = tuple(np.shape(leaf))
    if any(not isinstance(d, int | np.integer) or d < 0 for d in shape):
        raise UsageError(
            f"input {name} has shape {shape}: every dimension must be a non-negative int",
            "check the sizes the inputs callable computes (and any $defines$ values)",
        )
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf
    sharding = getattr(leaf, "sharding", None) if isinstance(leaf, jax.Array) else None
    weak = bool(getattr(leaf, "weak_type", False))
    return jax.ShapeDtypeStruct(shape, leaf.dtype, weak_type=weak, sharding=sharding)


def _arg_name(path: tuple[KeyEntry, ...]) -> str:
    return "args" + jax.tree_util.keystr(path)




@dataclasses.dataclass(frozen=True, slots=True)
class _Context:
    multiplicity: int = 1
    remat_policy: Policy | None = None
    in_remat: bool = False
    traceback_from: jc.Traceback | None = None  # equations of a custom_vjp fwd rule take the call site's source
    origin: Origin | None = None  # the enclosing equation's, for bodies JAX traced apart (jit)
    out_names: tuple[str | None, ...] = ()  # checkpoint names given to the last outputs outside
    anchor: str | None = None  # the custom_vjp call whose forward rule this is


def tag_jaxpr(closed: jc.ClosedJaxpr, rows: Rows, params: Sequence[Scopes | None] = ()) -> jc.ClosedJaxpr:
    """The trace with every equation tagged, its rows in `rows`. `params`: the module of each
    input that is a named parameter (`_params`), for module paths where the name stack has none."""
    tagged = closed.replace(jaxpr=_tag(closed.jaxpr, "", _Context(), rows))
    _count_uses(tagged.jaxpr, 1, rows.uses)
    if name_modules(params):
        found, direct = flow(tagged.jaxpr, params)
        pairs = [(module, rows.sites.at(eid, frozenset(calls))[0]) for (eid, calls), module in direct.items()]
        if not names_own_modules(pairs):
            rows.sites.param = found
            rows.input_modules = tuple("/".join(m) if m else None for m in params)
    for eid, row in rows.by_id.items():  # every call site of a shared body is known now
        row.equation = dataclasses.replace(row.equation, module=rows.sites.merged_module(eid))
    return tagged


def _count_uses(jaxpr: jc.Jaxpr, times: int, uses: dict[str, int]) -> None:
    """How often each equation runs: shared bodies once per use, scan bodies `length` times."""
    for eqn in jaxpr.eqns:
        tag = jc.eqn_tag(eqn)
        if tag is not None:
            uses[tag] = uses.get(tag, 0) + times
        if eqn.primitive is jc.custom_jvp_call_p:
            continue
        inner = times * int(eqn.params["length"]) if eqn.primitive is jc.scan_p else times
        for _, _, sub in sub_jaxprs(eqn.params):
            _count_uses(open_jaxpr(sub), inner, uses)


def _tag(jaxpr: jc.Jaxpr, prefix: str, ctx: _Context, rows: Rows) -> jc.Jaxpr:
    consumers_named = {
        e.invars[0]: e.params["name"] for e in jaxpr.eqns if e.primitive is jc.name_p and e.invars
    }
    if ctx.out_names:
        tail = jaxpr.outvars[len(jaxpr.outvars) - len(ctx.out_names) :]
        consumers_named.update({v: n for v, n in zip(tail, ctx.out_names, strict=True) if n})
    new_eqns = []
    for i, eqn in enumerate(jaxpr.eqns):
        eid = f"{prefix}{i}"
        interned = rows.interned.get(id(eqn))
        if interned is not None:
            rows.sites.scopes_at[eid] = interned[1]
        if ctx.traceback_from is not None:
            eqn = eqn.replace(source_info=eqn.source_info.replace(traceback=ctx.traceback_from))
        here = _origin(rows.finder(eqn), ctx.origin)
        rows.sites.enter(eid, prefix, jc.module_scope_names(eqn), here)
        if eqn.primitive is jc.custom_vjp_call_p:
            params = _tag_custom_vjp(eqn, eid, here, ctx, consumers_named, rows)
        elif eqn.primitive is jc.custom_jvp_call_p:  # one row; its jvp rule's equations map to it
            params = dict(eqn.params)
            tb = eqn.source_info.traceback if ctx.traceback_from is None else ctx.traceback_from
            params["jvp_jaxpr_fun"] = jc.wrap_jaxpr_thunk(
                params["jvp_jaxpr_fun"], functools.partial(_tag_all, eid=eid, tb=tb)
            )
        else:
            params = _tag_bodies(eqn, eid, dataclasses.replace(_sub_context(eqn, ctx), origin=here, out_names=()), rows)
        tagged = jc.with_tag(eqn, eid, params)
        new_eqns.append(tagged)
        if eqn.primitive is jc.remat_p:
            rows.has_remat = True
        if eqn.primitive is jc.name_p:
            rows.names.add(eqn.params["name"])
        elif eqn.primitive is jc.custom_vjp_call_p or (
            eqn.primitive is not jc.custom_jvp_call_p and has_body(eqn)
        ):
            continue  # structural: its body's equations are the rows
        else:
            _add_row(rows, eid, tagged, ctx, consumers_named, here)
    return jaxpr.replace(eqns=new_eqns)


def _origin(found: Origin, outer: Origin | None) -> Origin:
    """Where an equation comes from: its traceback's innermost frame of the user's code, else its
    enclosing equation's (JAX may cut a body's traceback at the body: a library's jitted function
    then shows no frame of the user's), else the innermost frame of any code."""
    if outer is None:
        return Origin(found.source or found.frame, found.frame)
    return Origin(found.source or outer.source or found.frame, found.frame or outer.frame)


def _tag_bodies(eqn: jc.JaxprEqn, eid: str, ctx: _Context, rows: Rows) -> jc.Params:
    """The equation's params with each body tagged; a body another equation already called (one
    jit traced once, a shared checkpoint body) keeps its tags and this equation is one more call."""
    subs = list(sub_jaxprs(eqn.params))
    for j, (_, _, sub) in enumerate(subs):
        body = f"{eid}." if len(subs) == 1 else f"{eid}.{j}."
        first = id(sub) not in rows.prefix_of
        if first:
            rows.prefix_of[id(sub)] = (sub, body)
        rows.sites.call(eid, rows.prefix_of[id(sub)][1], first)

    def tag_body(j: int, sub: jc.Jaxpr) -> jc.Jaxpr:
        return _tag(sub, f"{eid}." if len(subs) == 1 else f"{eid}.{j}.", ctx, rows)

    return map_sub_jaxprs(eqn.params, tag_body, rows.memo)


def _tag_custom_vjp(
    eqn: jc.JaxprEqn, eid: str, here: Origin, ctx: _Context, named: dict[jc.Atom, str], rows: Rows
) -> jc.Params:
    """The custom_vjp call's params, its forward rule tagged (under `{eid}.fwd.`) when JAX traces it."""
    params = dict(eqn.params)
    inner = _Context(
        remat_policy=ctx.remat_policy,
        in_remat=ctx.in_remat,
        traceback_from=eqn.source_info.traceback,
        origin=here,
        out_names=tuple(named.get(v) for v in eqn.outvars),
        anchor=eid,
    )
    rows.sites.call(eid, f"{eid}.fwd.", first=True)
    params["fwd_jaxpr_thunk"] = jc.wrap_jaxpr_thunk(
        params["fwd_jaxpr_thunk"], functools.partial(_tag, prefix=f"{eid}.fwd.", ctx=inner, rows=rows)
    )
    # JAX traces a forward rule lazily, when it first differentiates; trace it now, for the
    # tangents a differentiation will have (floating inputs), so that its rows and any checkpoint
    # inside it are known before the first policy is analysed. Not inside a forward rule: that
    # runs undifferentiated, and one that calls its own custom_vjp function would trace itself
    # forever. JAX runs a forward rule only where a tangent reaches one of the call's inputs (not its
    # consts): a call with no floating input of its own (all closed over, as Flax's FP8 ops' scale
    # and amax history under MaxText's scan) never runs it, and its thunk may not even take none.
    if ctx.anchor is None:
        call_avals = params["call_jaxpr"].in_avals[params["num_consts"] :]
        zeros = tuple(_differentiable(a) for a in call_avals)
        if any(zeros):
            params["fwd_jaxpr_thunk"].call_wrapped(*zeros)
    return params


def _differentiable(aval: jc.AbstractValue) -> bool:
    return bool(jax.numpy.issubdtype(getattr(aval, "dtype", np.int32), jax.numpy.inexact))


def _tag_all(jaxpr: jc.Jaxpr, eid: str, tb: jc.Traceback | None) -> jc.Jaxpr:
    """Every equation, nested ones included, tagged `eid` and given the traceback `tb`."""
    eqns = []
    for eqn in jaxpr.eqns:
        params = map_sub_jaxprs(eqn.params, lambda _, sub: _tag_all(sub, eid, tb))
        eqn = eqn.replace(source_info=eqn.source_info.replace(traceback=tb))
        eqns.append(jc.with_tag(eqn, eid, params))
    return jaxpr.replace(eqns=eqns)


def _sub_context(eqn: jc.JaxprEqn, ctx: _Context) -> _Context:
    if eqn.primitive is jc.remat_p:
        return dataclasses.replace(ctx, remat_policy=eqn.params["policy"], in_remat=True)
    if eqn.primitive is jc.scan_p:
        return dataclasses.replace(ctx, multiplicity=ctx.multiplicity * int(eqn.params["length"]))
    return ctx


def _add_row(
    rows: Rows, eid: str, eqn: jc.JaxprEqn, ctx: _Context, named: dict[jc.Atom, str], origin: Origin
) -> None:
    if eid in rows.by_id:
        return
    out = eqn.outvars[0].aval if eqn.outvars else None
    flops = _nested_flops(eqn) if eqn.primitive is jc.custom_jvp_call_p else leaf_flops(eqn)
    te = is_te_gemm(eqn.primitive)
    equation = Equation(
        id=eid,
        primitive=eqn.primitive.name,
        shape=aval_shape(out) if out is not None else (),
        dtype=aval_dtype(out) if out is not None else "",
        name=next((named[v] for v in eqn.outvars if v in named), None),
        source=origin.source,
        frame=origin.frame,
        module=rows.sites.merged_module(eid),  # again once every call site is known (tag_jaxpr)
        is_te_gemm=te,
        standin=is_te_standin(eqn.primitive),
        flops=flops,
        multiplicity=ctx.multiplicity,
        is_te_quantize=is_te_quantize(eqn.primitive, eqn.params),
    )
    rows.by_id[eid] = Row(equation, eqn, ctx.remat_policy, ctx.in_remat, ctx.anchor)


def _nested_flops(eqn: jc.JaxprEqn) -> int:
    total = 0
    for _, _, sub in sub_jaxprs(eqn.params):
        for inner in open_jaxpr(sub).eqns:
            total += _nested_flops(inner) if has_body(inner) else leaf_flops(inner)
    return total
