"""Every private JAX import of te-ckpt-audit lives here, behind a version check.

JAX moves its internals between releases. Keeping them in one module means a JAX upgrade breaks
one file, and `tests/test_jax_compat.py` names exactly which symbol moved.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

import jax
import jax.ad_checkpoint as _ad_checkpoint
import jax.extend.core as jex
from jax.extend.core import primitives as _prims

# [lowest, highest) jax versions this module was written and tested for: both ends run in CI.
SUPPORTED = ((0, 10, 2), (0, 13, 0))
SUPPORTED_TEXT = "jax >= 0.10.2, < 0.13"


class UnsupportedJaxError(ImportError):
    """The installed jax is outside `SUPPORTED`. An ImportError, raised while this module imports;
    `message` and `hint` let the command line turn it into its one-line error (exit 2)."""

    def __init__(self, found: str) -> None:
        self.supported = SUPPORTED_TEXT
        self.message = f"te-ckpt-audit supports {SUPPORTED_TEXT} (found jax {found})"
        self.hint = "install a supported jax: pip install 'jax>=0.10.2,<0.13' 'jaxlib>=0.10.2,<0.13'"
        super().__init__(f"{self.message}; {self.hint}")


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = ""
        for ch in piece:  # "0rc1" -> 0, "0.dev2026" stops at the dev tag
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    return tuple(parts)


JAX_VERSION = _version_tuple(jax.__version__)
if not (SUPPORTED[0] <= JAX_VERSION < SUPPORTED[1]):
    raise UnsupportedJaxError(jax.__version__)

# One branch per jax release that moved or changed something used here (0.10.2 is the base).
# tests/test_jax_compat.py checks each private name on the installed jax, by name.
from jax._src import ad_util as _ad_util  # noqa: E402
from jax._src import config as _config  # noqa: E402
from jax._src import core as _core  # noqa: E402
from jax._src import linear_util as _lu  # noqa: E402
from jax._src import source_info_util as _siu  # noqa: E402
from jax._src.ad_checkpoint import saved_residuals as _saved_residuals  # noqa: E402
from jax._src.interpreters import ad as _ad  # noqa: E402
from jax._src.interpreters import partial_eval as _pe  # noqa: E402

# 0.11.0: FlatTree left jax._src.tree_util for jax._src.flattree (`flatten` is a function there).
# 0.11.0: scan's params give its inputs as FlatTrees (ft_in: consts, carry, xs), not as counts
#         (num_consts, num_carry).
# 0.11.0: Jaxpr and ClosedJaxpr are one class (`.jaxpr` is the jaxpr itself; its constvars are the
#         invars with values attached): nothing here depends on the difference.
if JAX_VERSION >= (0, 11, 0):
    from jax._src import flattree as _flattree  # type: ignore[attr-defined, unused-ignore]

    _flatten: Callable[[Any], Any] = _flattree.flatten
else:
    from jax._src.tree_util import FlatTree as _FlatTree  # type: ignore[attr-defined, unused-ignore]

    _flatten = _FlatTree.flatten
SCAN_PARAMS_ARE_FLAT_TREES = JAX_VERSION >= (0, 11, 0)

# 0.11.1: ad.linearize also returns the structured residuals (those of hijax rules), and its
#         tangent jaxpr binds the residuals as leading invars, no longer as constvars.
LINEARIZE_HAS_STRUCTURED_RESIDUALS = JAX_VERSION >= (0, 11, 1)

# 0.12.0: in a vjp's tangent jaxpr, the equation of jit, scan, cond, shard_map, ... is a
#         `vjp_node[prim]`: a primitive wrapping `prim`, with `prim`'s params.
_VJPNode: Any = _ad.VJPNode if JAX_VERSION >= (0, 12, 0) else None  # type: ignore[attr-defined, unused-ignore]


def scan_counts(params: Params) -> tuple[int, int]:
    """(number of consts, number of carry values) among a scan equation's inputs; the xs follow."""
    if SCAN_PARAMS_ARE_FLAT_TREES:
        consts, carry, _ = params["ft_in"].unpack()
        return len(consts), len(carry)
    return params["num_consts"], params["num_carry"]


# Captured when te-ckpt-audit is imported, before any user code runs: what the audit applies stays
# JAX's own checkpoint even where a model replaces `jax.checkpoint` (`replaced_jax_functions`).
checkpoint = jax.checkpoint
_GUARDED = {  # what a model's checkpointing code calls: replaced, its checkpoints are not JAX's
    "jax.checkpoint": (jax, "checkpoint"),
    "jax.remat": (jax, "remat"),
    "jax.ad_checkpoint.checkpoint": (_ad_checkpoint, "checkpoint"),
    "jax.ad_checkpoint.remat": (_ad_checkpoint, "remat"),
    "jax.ad_checkpoint.checkpoint_name": (_ad_checkpoint, "checkpoint_name"),
}
_ORIGINALS = {name: vars(module).get(attr) for name, (module, attr) in _GUARDED.items()}


def replaced_jax_functions() -> list[str]:
    """JAX's checkpointing functions that something (the model's code) replaced since te-ckpt-audit
    was imported."""
    return [name for name, (module, attr) in _GUARDED.items() if vars(module).get(attr) is not _ORIGINALS[name]]

# Public names re-exported so the rest of the package imports JAX's jaxpr types from one place.
Jaxpr = jex.Jaxpr
ClosedJaxpr = jex.ClosedJaxpr  # 0.11.0: = Jaxpr
JaxprEqn = jex.JaxprEqn
Literal = jex.Literal
Var = jex.Var
Atom: TypeAlias = Var | Literal  # what an equation takes: a variable or a literal
Primitive = jex.Primitive
AbstractValue = _core.AbstractValue
Params: TypeAlias = dict[str, Any]  # an equation's parameters: JAX's own, of any type
Frame = _siu.Frame
Traceback = _siu.Traceback
ArrayFn: TypeAlias = Callable[..., Any]  # what JAX traces: arrays (or tracers) in, a pytree of them out
Value: TypeAlias = Any  # what JAX binds and returns: an array, a tracer or a Python scalar
Tree: TypeAlias = Any  # a pytree of Values, in whatever structure the user's code gives it
Topology: TypeAlias = Any  # jax.experimental.topologies' description of devices that are not here
jaxpr_as_fun = jex.jaxpr_as_fun
new_jaxpr_eqn = jex.new_jaxpr_eqn

remat_p = _prims.remat_p
jit_p = _prims.jit_p
name_p = _prims.name_p
reduce_precision_p = _prims.reduce_precision_p
device_put_p = _prims.device_put_p
sharding_constraint_p = _prims.sharding_constraint_p
scan_p = _prims.scan_p
while_p = _prims.while_p
cond_p = _prims.cond_p
custom_vjp_call_p = _prims.custom_vjp_call_p
custom_jvp_call_p = _prims.custom_jvp_call_p
dot_general_p = _prims.dot_general_p
conv_general_dilated_p = _prims.conv_general_dilated_p

Saveable = _pe.Saveable
Recompute = _pe.Recompute
Offloadable = _pe.Offloadable
SaveableType = _pe.SaveableType
RecomputeType = _pe.RecomputeType

TAG_PREFIX = "tca:"


def eqn_tag(eqn: JaxprEqn) -> str | None:
    """The innermost te-ckpt-audit tag in an equation's name stack, if any."""
    for elem in reversed(eqn.source_info.name_stack.stack):
        if isinstance(elem, _siu.Scope) and elem.name.startswith(TAG_PREFIX):
            return elem.name[len(TAG_PREFIX) :]
    return None


def eqn_tags(eqn: JaxprEqn) -> frozenset[str]:
    """Every te-ckpt-audit tag in an equation's name stack: an equation JAX derived inside a call
    carries the call's tag too."""
    return frozenset(
        e.name[len(TAG_PREFIX) :]
        for e in eqn.source_info.name_stack.stack
        if isinstance(e, _siu.Scope) and e.name.startswith(TAG_PREFIX)
    )


def under(outer: JaxprEqn, eqn: JaxprEqn) -> JaxprEqn:
    """`eqn` with `outer`'s name stack before its own: a body's equation moved out to its caller's
    level (a checkpoint inlined) keeps the call's scopes and tag."""
    info = eqn.source_info
    return eqn.replace(source_info=info.replace(name_stack=outer.source_info.name_stack + info.name_stack))


def scope_names(eqn: JaxprEqn) -> tuple[str, ...]:
    """The `jax.named_scope`s on the equation's name stack (transformations and our tags left out)."""
    return tuple(
        e.name
        for e in eqn.source_info.name_stack.stack
        if isinstance(e, _siu.Scope) and not e.name.startswith(TAG_PREFIX)
    )


def module_scope_names(eqn: JaxprEqn) -> tuple[str, ...]:
    """`scope_names` that are modules: without the scopes `jnp.einsum` names its call by (its
    spec, `bqhd,bkhd->bhqk`), which say what the equation computes, not where."""
    return tuple(s for s in scope_names(eqn) if "->" not in s)


def with_tag(eqn: JaxprEqn, tag: str, params: Params) -> JaxprEqn:
    """A copy of `eqn` whose name stack ends in `tag`.

    Transformations (jvp, partial evaluation, remat's recompute) copy name stacks onto the
    equations they derive, so the tag lets us find the original equation in their output.
    """
    info = eqn.source_info
    tagged = info.replace(name_stack=info.name_stack.extend(TAG_PREFIX + tag))
    return eqn.replace(params=params, source_info=tagged)


def user_frames(eqn: JaxprEqn) -> Iterator[Frame]:
    """Frames of the equation's traceback outside JAX (innermost first)."""
    return _siu.user_frames(eqn.source_info.traceback)


def wrap_jaxpr_thunk(thunk: _lu.WrappedFun, transform: Callable[[Jaxpr], Jaxpr]) -> _lu.WrappedFun:
    """Wrap a custom_vjp `fwd_jaxpr_thunk` or custom_jvp `jvp_jaxpr_fun` (each returns a tuple
    whose first item is a jaxpr) so that the jaxpr passes through `transform`; memoized."""
    cache: dict[tuple[Value, ...], tuple[Value, ...]] = {}

    def wrapped(*zeros: Value) -> tuple[Value, ...]:
        if zeros not in cache:
            with current_autodiff():  # the rule's checkpoints as the trace holds them (remat3's are made from it)
                jaxpr, *rest = thunk.call_wrapped(*zeros)
            cache[zeros] = (transform(jaxpr), *rest)
        return cache[zeros]

    return _lu.wrap_init(wrapped, debug_info=thunk.debug_info)


def linearize_for_vjp(fun: ArrayFn, args: Sequence[jax.Array]) -> tuple[list[jax.Array], Jaxpr]:
    """Residuals and tangent jaxpr of `fun` at `args`, exactly as `jax.vjp` computes them.

    `jax.vjp` calls this very function (`ad.linearize(..., is_vjp=True)`) and keeps the returned
    residuals; `jax.ad_checkpoint.print_saved_residuals` lists them. On every supported jax the
    tangent jaxpr comes back in one shape: its constvars are the residuals, in order, its invars
    the input tangents, and its equations name JAX's own primitives (remat's recomputation lives
    there).
    """
    out = _ad.linearize(lambda *xs: fun(*xs), _flatten(tuple(args)), is_vjp=True)
    tangent, residuals = out[2], list(out[3])
    if LINEARIZE_HAS_STRUCTURED_RESIDUALS:
        structured = jax.tree_util.tree_leaves(out[4])
        n_res, n_in = len(residuals), len(tangent.invars) - len(residuals) - len(structured)
        # Its invars: the residuals, the input tangents, then one per structured residual leaf.
        # A jaxpr's constvars are, since 0.11.0, the invars with values attached: attach the
        # residuals (this jaxpr is for reading; it never runs).
        residuals += structured
        tangent = tangent.replace(
            constvars=[*tangent.constvars, *tangent.invars[:n_res], *tangent.invars[n_res + n_in :]],
            invars=tangent.invars[n_res : n_res + n_in],
            consts=[*tangent.consts, *residuals],
        )
    if _VJPNode is not None:
        tangent = _unwrap_vjp_nodes(tangent, {})
    return residuals, tangent


def _is_jaxpr(value: object) -> bool:
    return isinstance(value, jex.Jaxpr | ClosedJaxpr)


def _unwrap_vjp_nodes(jaxpr: Jaxpr, memo: dict[int, tuple[Jaxpr, Jaxpr]]) -> Jaxpr:
    """`jaxpr` with every `vjp_node[prim]` equation (at any depth) made a `prim` equation; a body
    shared by several equations stays shared (memoized by identity), an unchanged one is kept."""
    key = id(jaxpr)
    if key in memo:
        return memo[key][1]
    eqns = [_unwrap_eqn(e, memo) for e in jaxpr.eqns]
    same = all(a is b for a, b in zip(eqns, jaxpr.eqns, strict=True))
    new = jaxpr if same else jaxpr.replace(eqns=eqns)  # since 0.11.0 a Jaxpr keeps its consts
    memo[key] = (jaxpr, new)  # keeps `jaxpr` alive, so its id is not reused
    return new


def _unwrap_eqn(eqn: JaxprEqn, memo: dict[int, tuple[Jaxpr, Jaxpr]]) -> JaxprEqn:
    params: Params = {}
    value: Value
    for name, value in eqn.params.items():
        if _is_jaxpr(value):
            value = _unwrap_vjp_nodes(value, memo)
        elif isinstance(value, tuple | list) and any(_is_jaxpr(v) for v in value):
            items: list[Value] = [_unwrap_vjp_nodes(v, memo) if _is_jaxpr(v) else v for v in value]
            if any(a is not b for a, b in zip(items, value, strict=True)):  # a named tuple stays one
                value = type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        params[name] = value
    prim = eqn.primitive
    changed = any(params[k] is not v for k, v in eqn.params.items())
    if _VJPNode is not None and isinstance(prim, _VJPNode):
        return eqn.replace(primitive=prim.prim, params=params)
    return eqn.replace(params=params) if changed else eqn


def saved_residuals(fn: ArrayFn, *args: jax.Array | jax.ShapeDtypeStruct) -> list[tuple[AbstractValue, str]]:
    """JAX's own residual list (the data behind `print_saved_residuals`); the tests' ground truth."""
    return _saved_residuals(fn, *args)


DropVar = jex.DropVar


def _spec_of(aval: AbstractValue) -> jax.ShapeDtypeStruct:
    """The aval as a ShapeDtypeStruct; one without a shape (a token, a reference) raises."""
    shaped: Any = aval  # AbstractValue declares no shape; a ShapedArray has one
    return jax.ShapeDtypeStruct(shaped.shape, shaped.dtype, weak_type=getattr(aval, "weak_type", False))


def jit_call(fun: ArrayFn, avals: Sequence[AbstractValue]) -> JaxprEqn | None:
    """A `jit` equation calling `fun` on inputs of types `avals` (its variables fresh), or None
    where those types cannot be rebuilt exactly."""
    try:
        specs = [_spec_of(a) for a in avals]
        closed = jax.make_jaxpr(jax.jit(fun))(*specs)
    except Exception:  # noqa: BLE001 - a type make_jaxpr cannot take: the caller keeps the equation
        return None
    if len(closed.jaxpr.eqns) != 1 or [v.aval for v in closed.jaxpr.eqns[0].invars] != list(avals):
        return None
    return closed.jaxpr.eqns[0]


def part_of(jaxpr: Jaxpr, eqns: Sequence[JaxprEqn], invars: Sequence[Var], outvars: Sequence[Var]) -> Jaxpr:
    """A jaxpr of some of `jaxpr`'s equations (in order), taking `invars` and returning `outvars`."""
    debug = jaxpr.debug_info._replace(arg_names=("",) * len(invars), result_paths=("",) * len(outvars))
    return jaxpr.replace(constvars=[], invars=list(invars), outvars=list(outvars), eqns=list(eqns), debug_info=debug)


def run_body(jaxpr: Jaxpr) -> ArrayFn:
    """An open jaxpr without constvars as a function (a checkpoint's body)."""
    return lambda *xs: _core.eval_jaxpr(jaxpr, (), *xs)


def bind_alone(eqn: JaxprEqn) -> ArrayFn:
    """A function that binds `eqn`'s primitive with its params and its name stack."""

    def alone(*xs: Value) -> Value:
        with _siu.user_context(eqn.source_info.traceback, name_stack=eqn.source_info.name_stack):
            return eqn.primitive.bind(*xs, **eqn.params)

    return alone


# --- compiling for a GPU that is not here (`--gpu`): jax >= 0.12 with its CUDA plugin -------------
GPU_TARGET_SINCE = (0, 12, 0)  # the release where a device-less CUDA topology was verified


class CudaPluginMissing(ImportError):
    """jax's CUDA plugin (jax-cuda12-plugin, jax-cuda12-pjrt) is not installed, or not for this jax."""


def cuda_topology(config_text: str, shape: str) -> Topology:
    """JAX's description of `shape` ("PARTITIONS x HOSTS x DEVICES") GPUs of the kind
    `config_text` (a GpuTargetConfigProto) describes: no driver and no device needed. The CUDA
    plugin is registered first, without its check of the local CUDA installation."""
    _register_cuda_plugin()
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="cuda", target_config=config_text, topology=shape)


def cudnn_version() -> int | None:
    """The version of the cuDNN that JAX's CUDA plugin loads (its fused attention needs cuDNN to
    compile, with or without a GPU), or None where there is none to load."""
    from jax._src.lib import cuda_versions

    if cuda_versions is None:
        return None
    try:
        return int(cuda_versions.cudnn_get_version())
    except RuntimeError:  # "cuDNN not found"
        return None


def no_persistent_cache_entry() -> contextlib.AbstractContextManager[None]:
    """A compile in this thread that writes no entry into JAX's persistent compilation cache (where
    the process turned it on: a model file, MaxText's `jax_cache_dir`). An executable compiled for a
    device-less topology is written, but reading it back needs a client the topology has not, so
    every later compile of the same program would fail its read."""
    from jax._src import config as _config

    return _config.persistent_cache_min_compile_time_secs(math.inf)


def _register_cuda_plugin() -> None:
    """JAX registers its plugins once, when a backend is first asked for. With `jax_platforms`
    "cpu" the CUDA plugin registers without checking the local CUDA (there is none here): the
    setting is made only for that discovery and put back. Where the discovery already ran and the
    plugin's check failed (no GPU), its `initialize` runs again without the check."""
    from jax._src import xla_bridge as _xb

    if not _xb._plugins_registered:
        before = jax.config.jax_platforms  # type: ignore[attr-defined, unused-ignore]
        jax.config.update("jax_platforms", "cpu")
        try:
            _xb._discover_and_register_pjrt_plugins()
        finally:
            jax.config.update("jax_platforms", before)
    if "cuda" in _xb._topology_factories:
        return
    try:
        import jax_plugins.xla_cuda12 as _cuda  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        raise CudaPluginMissing(str(exc)) from None
    check = _cuda._check_cuda_versions
    _cuda._check_cuda_versions = lambda *_, **__: None
    try:
        _cuda.initialize()
    finally:
        _cuda._check_cuda_versions = check
    if "cuda" not in _xb._topology_factories:
        raise CudaPluginMissing("jax's CUDA plugin did not register a topology for cuda")


def with_context_mesh(eqn: JaxprEqn, mesh_of: Callable[[Value], Value]) -> JaxprEqn:
    """`eqn` whose context's abstract mesh (the mesh its rule runs under when the equation is
    evaluated again: a shard_map body's manual mesh, `jax.set_mesh`'s) is `mesh_of(mesh)`; the
    rest of its context (compute type, metadata, ...) kept. Unchanged where JAX records none."""
    ctx = getattr(eqn, "ctx", None)
    mesh = getattr(ctx, "cur_abstract_mesh", None)
    if ctx is None or mesh is None:
        return eqn
    new = mesh_of(mesh)
    if new is mesh:
        return eqn
    with ctx.manager, jax.sharding.use_abstract_mesh(new):
        fresh = _core.JaxprEqnContext()
    return eqn.replace(ctx=fresh)


# --- JAX's new remat (`jax_remat3`) ------------------------------------------------------------------
# Under the flag, `jax.checkpoint` makes a `RematTraced` (a hijax primitive) and `checkpoint_name` a
# `CheckpointName`; each primitive's residual is then decided by its rule in
# `jax._src.interpreters.remat.rules` (dot_general, conv, scan, cond, jit, ...; any other primitive,
# and a custom_vjp unless `jax_custom_vjp3` is on, is recomputed whatever the policy says).


def remat3(on: bool) -> contextlib.AbstractContextManager[None]:
    """`jax_remat3` set to `on` inside the block (JAX's config, not the process environment)."""
    return _config.remat3(on)


@contextlib.contextmanager
def current_autodiff() -> Iterator[None]:
    """JAX's current remat and custom_vjp inside the block (`jax_remat3`, `jax_custom_vjp3` off): how
    the audit traces; the new ones are made from that trace (`rebuilt`)."""
    with remat3(False), _custom_vjp3(False):
        yield


def remat3_on() -> bool:
    """Whether `jax_remat3` is on, as JAX reads it (JAX_REMAT3, jax.config.update)."""
    return bool(_config.remat3.value)


def custom_vjp3_on() -> bool:
    state = getattr(_config, "custom_vjp3", None)
    return state is not None and bool(state.value)


def custom_vjp3_at_definition(jaxpr: Jaxpr) -> bool:
    """Whether `jaxpr` calls a custom_vjp that jax < 0.12 made a `jax_custom_vjp3` one when it was
    defined (`jax.custom_vjp` under the flag: a hijax call, closed to the audit, whose residuals
    would go unread). jax 0.12 decides at each call, so the audit traces the current custom_vjp."""
    if JAX_VERSION >= (0, 12, 0):
        return False
    seen: set[int] = set()  # a body called many times (a layer's jit) is read once
    todo = [jaxpr]
    while todo:
        body = todo.pop()
        if id(body) in seen:
            continue
        seen.add(id(body))
        for eqn in body.eqns:
            if eqn.primitive.name == "call_hi_primitive":
                return True
            todo.extend(_open(sub) for sub in _subs(eqn.params))
    return False


def rebuilt(closed: ClosedJaxpr, remat3: bool, custom_vjp3: bool) -> ArrayFn:
    """`closed` as a function whose checkpoints, checkpoint names and custom_vjp calls are made, when
    it is traced, exactly as JAX makes them under its flags: with `remat3`, each `checkpoint`
    equation becomes `jax.checkpoint(body, policy=..., prevent_cse=...)` and each `name` equation
    `checkpoint_name` under `jax_remat3`; with `custom_vjp3`, each custom_vjp call a `jax.custom_vjp`
    made under `jax_custom_vjp3` from its own primal, forward rule and backward rule. Every other
    equation is bound as it is, with its name stack (the audit's tags), and bodies holding any of
    these are rebuilt the same way."""
    rebuild = _Rebuild(remat3, custom_vjp3)

    def fun(*xs: Value) -> Value:
        with _config.remat3(remat3), _custom_vjp3(custom_vjp3):
            return rebuild.eval(closed.jaxpr, closed.consts, xs)

    return fun


def _custom_vjp3(on: bool) -> contextlib.AbstractContextManager[None]:
    state = getattr(_config, "custom_vjp3", None)
    return contextlib.nullcontext() if state is None else state(on)


def _open(j: Value) -> Jaxpr:
    return j.jaxpr if isinstance(j, ClosedJaxpr) and j.jaxpr is not j else j


def _subs(params: Params) -> Iterator[Value]:
    for value in params.values():
        if _is_jaxpr(value):
            yield value
        elif isinstance(value, tuple | list):
            yield from (v for v in value if _is_jaxpr(v))


class Remat3Unsupported(Exception):
    """A body the audit cannot rebuild as JAX's new remat would make it."""


class _Rebuild:
    """One rebuild of a jaxpr for JAX's new remat (`remat3`: its checkpoints and names) and new
    custom_vjp (`custom_vjp3`: its custom_vjp calls)."""

    def __init__(self, remat3: bool, custom_vjp3: bool) -> None:
        self.remat3, self.custom_vjp3 = remat3, custom_vjp3
        self.memo: dict[int, bool] = {}

    def _rebuilt_here(self, eqn: JaxprEqn) -> bool:
        return ((self.remat3 and (eqn.primitive is remat_p or eqn.primitive is name_p))
                or (self.custom_vjp3 and eqn.primitive is custom_vjp_call_p))

    def holds(self, jaxpr: Jaxpr) -> bool:
        key = id(jaxpr)
        if key not in self.memo:
            self.memo[key] = any(self._rebuilt_here(e) or any(self.holds(_open(sub)) for sub in _subs(e.params))
                                 or (e.primitive is remat_p and self.custom_vjp3)
                                 for e in jaxpr.eqns)
        return self.memo[key]

    def body(self, sub: Value) -> Value:
        """A body (Jaxpr or ClosedJaxpr) holding what is rebuilt, traced again."""
        opened = _open(sub)
        if not self.holds(opened):
            return sub
        consts = sub.consts if isinstance(sub, ClosedJaxpr) else ()
        if opened.constvars and not consts:
            raise Remat3Unsupported("a body with free constants")
        specs = [_spec_of(v.aval) for v in opened.invars]
        made = jax.make_jaxpr(lambda *xs: self.eval(opened, consts, xs))(*specs)
        if isinstance(sub, ClosedJaxpr) and sub.jaxpr is not sub:
            return made
        if made.consts:
            raise Remat3Unsupported("a body whose rebuilt form closes over constants")
        return made.jaxpr

    def with_consts(self, jaxpr: Jaxpr) -> Jaxpr:
        """An open jaxpr whose constvars stay constvars (a custom_vjp's forward rule), rebuilt."""
        if not self.holds(jaxpr):
            return jaxpr
        n = len(jaxpr.constvars)
        specs = [_spec_of(v.aval) for v in [*jaxpr.constvars, *jaxpr.invars]]
        made = jax.make_jaxpr(lambda *xs: self.eval(jaxpr, xs[:n], xs[n:]))(*specs)
        if made.consts:
            raise Remat3Unsupported("a forward rule whose rebuilt form closes over constants")
        opened = _open(made)
        return opened.replace(constvars=list(opened.invars[:n]), invars=list(opened.invars[n:]))

    def checkpoint_body(self, body: Value) -> ArrayFn:
        opened = _open(body)
        consts = body.consts if opened is not body else ()
        return lambda *xs: self.eval(opened, consts, xs)

    def eval(self, jaxpr: Jaxpr, consts: Sequence[Value], args: Sequence[Value]) -> list[Value]:
        env: dict[Var, Value] = {}

        def read(v: Atom) -> Value:
            return v.val if isinstance(v, Literal) else env[v]

        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            stack = _siu.current_name_stack() + eqn.source_info.name_stack
            with _siu.user_context(eqn.source_info.traceback, name_stack=stack), eqn.ctx.manager:
                outs = self._bind(eqn, ins)
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(v) for v in jaxpr.outvars]

    def _bind(self, eqn: JaxprEqn, ins: list[Value]) -> list[Value]:
        if self.remat3 and eqn.primitive is remat_p:
            policy = eqn.params["policy"] or jax.checkpoint_policies.nothing_saveable
            body = self.checkpoint_body(eqn.params["jaxpr"])
            return jax.checkpoint(body, policy=policy, prevent_cse=eqn.params["prevent_cse"])(*ins)
        if self.remat3 and eqn.primitive is name_p:
            return [_ad_checkpoint.checkpoint_name(ins[0], eqn.params["name"])]
        params = eqn.params
        if next(_subs(params), None) is not None:
            params = _map_subs(params, self.body)
        if eqn.primitive is custom_vjp_call_p:  # checkpoints (and custom_vjps) inside its forward rule
            params = {**params, "fwd_jaxpr_thunk": wrap_jaxpr_thunk(params["fwd_jaxpr_thunk"], self.with_consts)}
            if self.custom_vjp3:
                return self._custom_vjp3(params, ins)
        outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(params))
        return outs if eqn.primitive.multiple_results else [outs]

    def _custom_vjp3(self, params: Params, ins: list[Value]) -> list[Value]:
        """A custom_vjp call made again as `jax.custom_vjp` makes it under `jax_custom_vjp3`: its
        primal, its forward rule (as the trace tagged it) and its backward rule, flat."""
        n = params["num_consts"]
        if n:
            raise Remat3Unsupported("a custom_vjp call that closes over traced values (num_consts > 0)")
        call, thunk = params["call_jaxpr"], params["fwd_jaxpr_thunk"]
        bwd, out_trees = params["bwd"], params["out_trees"]
        call_open, call_consts = _open(call), getattr(call, "consts", ())
        avals = call_open.in_avals if hasattr(call_open, "in_avals") else [v.aval for v in call_open.invars]
        nonzeros = tuple(bool(jax.numpy.issubdtype(getattr(a, "dtype", int), jax.numpy.inexact)) for a in avals)

        def primal(*xs: Value) -> list[Value]:
            return list(_core.eval_jaxpr(call_open, call_consts, *xs))

        def forward(*xs: Value) -> tuple[list[Value], list[Value]]:
            fwd_jaxpr, fwd_consts = thunk.call_wrapped(*nonzeros)[:2]
            outs = _core.eval_jaxpr(fwd_jaxpr, fwd_consts, *xs)
            _, res_tree, input_fwds = out_trees()
            made = res_tree.num_leaves - sum(i is not None for i in input_fwds)
            res_out = iter(outs[:made])
            res = [xs[i] if i is not None else next(res_out) for i in input_fwds]
            return list(outs[made:]), res

        def backward(res: list[Value], cts: list[Value]) -> tuple[Value, ...]:
            got = bwd.call_wrapped(*res, *cts)
            cts_in = got[0] if isinstance(got, tuple) else got
            return tuple(jax.numpy.zeros(a.shape, a.dtype) if c is None or isinstance(c, _ad_util.Zero) else c
                         for c, a in zip(cts_in, avals, strict=True))

        fn = jax.custom_vjp(primal)
        fn.defvjp(forward, backward)
        return fn(*ins)


def remat3_rerun(eqn: JaxprEqn) -> Jaxpr | None:
    """What JAX's new remat runs again in the backward pass for one linearized checkpoint (a
    `RematTraced` equation of a tangent jaxpr): the forward work it recomputes, kept in the
    residuals' tree (its `_dced` jaxpr); None for any other equation."""
    tree = eqn.params.get("residuals_tree")
    if tree is None or type(eqn.params.get("_prim")).__name__ != "RematTraced":
        return None
    skeleton = jax.tree_util.tree_unflatten(tree, [None] * tree.num_leaves)
    for node in jax.tree_util.tree_leaves(skeleton, is_leaf=lambda x: isinstance(x, jax.tree_util.Partial)):
        fn = getattr(node, "func", None)
        fn = getattr(fn, "fun", fn)  # a Partial's function behind JAX's hashable shim
        if isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") == "_dced" and fn.args:
            return _primal_live(_open(fn.args[0]))
    return None


def _is_primal_left(eqn: JaxprEqn) -> bool:
    """remat3's `PrimalLeftTangentRight`: its value is its left operand (a saved value); its right
    one (the same computed again) only gives the tangent."""
    prim = eqn.params.get("_prim")
    return "PrimalLeftTangentRight" in (getattr(eqn.primitive, "name", ""), type(prim).__name__)


def _primal_live(jaxpr: Jaxpr) -> Jaxpr:
    """`jaxpr` without the equations whose values only reach a `PrimalLeftTangentRight`'s right
    operand: what runs again there is dead where no tangent is taken (XLA drops it)."""
    live = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if not any(v in live for v in eqn.outvars) and not eqn.effects:
            continue
        kept.append(eqn)
        ins = eqn.invars[:1] if _is_primal_left(eqn) else eqn.invars
        live.update(v for v in ins if not isinstance(v, Literal))
    if len(kept) == len(jaxpr.eqns):
        return jaxpr
    return jaxpr.replace(eqns=kept[::-1])


def _map_subs(params: Params, fn: Callable[[Value], Value]) -> Params:
    new = dict(params)
    for key, value in params.items():
        if _is_jaxpr(value):
            new[key] = fn(value)
        elif isinstance(value, tuple | list) and any(_is_jaxpr(v) for v in value):
            items = [fn(v) if _is_jaxpr(v) else v for v in value]
            new[key] = type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return new


# 0.12.0: jax_remat3 asks a policy only about the primitives its remat table has a rule for
#         (`rules[prim](trace, *args, **params)`); jax 0.10's prototype asks its own policy classes only.
REMAT3_RULES_TAKE_POLICIES = JAX_VERSION >= (0, 12, 0)


def keep_under_remat3(picks: Callable[[Primitive], bool]) -> bool:
    """Give JAX's new remat a rule, as its dot_general's, for every primitive `picks` (TE's GEMMs):
    the checkpoint's policy then decides whether its outputs are saved, offloaded or recomputed,
    where without one they are always recomputed. JAX's table of rules is wrapped once, so a
    primitive registered after this (TE imported later) is found too. False where this jax's remat3
    asks no policy of a primitive's rule (jax 0.10)."""
    if not REMAT3_RULES_TAKE_POLICIES:
        return False
    from jax._src.interpreters import remat as _remat

    rules = _remat.rules
    if not isinstance(rules, _RematRules):
        rules = _RematRules(rules)
        _remat.rules = rules
    if picks not in rules.picks:
        rules.picks.append(picks)
    return True


class _RematRules(dict[Primitive, Callable[..., Value]]):
    """JAX's remat table, with a rule made on demand for the primitives `picks` chooses."""

    def __init__(self, table: dict[Primitive, Callable[..., Value]]) -> None:
        super().__init__(table)
        self.picks: list[Callable[[Primitive], bool]] = []

    def _made(self, prim: Primitive) -> Callable[..., Value] | None:
        return _policy_rule(prim) if any(p(prim) for p in self.picks) else None

    def __contains__(self, prim: object) -> bool:
        return dict.__contains__(self, prim) or (isinstance(prim, Primitive) and self._made(prim) is not None)

    def __getitem__(self, prim: Primitive) -> Callable[..., Value]:
        if dict.__contains__(self, prim):
            return dict.__getitem__(self, prim)
        made = self._made(prim)
        if made is None:
            raise KeyError(prim)
        self[prim] = made
        return made


def _policy_rule(prim: Primitive) -> Callable[..., Value]:
    """A remat3 rule that asks the policy about `prim`, as JAX's rule for dot_general does."""
    from jax._src.ad_checkpoint import primal_left_tangent_right
    from jax._src.interpreters import remat as _remat

    def rule(trace: Value, *args: Value, **params: Value) -> tuple[Value, Value, Callable[..., Value]]:
        def bind(*xs: Value) -> Value:
            return prim.bind(*xs, **params)

        out = bind(*args)
        if trace.policy is None:
            return out, (), lambda _, *xs: bind(*xs)
        case = _pe.ensure_enum(trace.policy(prim, *map(_core.typeof, args), **params))
        if not isinstance(case, _pe.SaveableType | _pe.Offloadable):
            return out, (), lambda _, *xs: bind(*xs)
        outs = [_remat.reduce_precision(o) for o in (out if prim.multiple_results else [out])]
        kept = outs
        if isinstance(case, _pe.Offloadable):
            kept = [jax.device_put(o, _core.mem_kind_to_space(case.dst), may_alias=False) for o in outs]

        def rem(res: Value, *xs: Value) -> Value:
            if isinstance(case, _pe.Offloadable):
                res = [jax.device_put(r, _core.mem_kind_to_space(case.src), may_alias=False) for r in res]
            again = bind(*xs)
            both = [primal_left_tangent_right(r, a) for r, a in
                    zip(res, again if prim.multiple_results else [again], strict=True)]
            return both if prim.multiple_results else both[0]

        return (outs if prim.multiple_results else outs[0]), kept, rem

    return rule
