"""Placing a trace on GPUs that are not here: a mesh over a CUDA topology of the same axes as the
audit's CPU mesh (or, without one, the mesh the model made over this machine's devices), the
inputs on it, and every mesh the trace names moved onto GPUs of the same axes and sizes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from .. import _jax_compat as jc
from .._jaxpr import map_sub_jaxprs, open_jaxpr, sub_jaxprs
from ..errors import UsageError
from ..records import MeshAxis, MeshSpec
from ..trace._trace import Traced


def gpu_mesh(topology: jc.Topology, mesh: MeshSpec | None) -> Mesh:
    """The GPU devices of `topology` as a mesh of `mesh`'s axes (one axis `gpu` without one)."""
    if mesh is None:
        return _over(topology, ("gpu",), (1,))
    return _over(topology, tuple(a.name for a in mesh.axes), tuple(a.size for a in mesh.axes))


def _over(topology: jc.Topology, names: tuple[str, ...], shape: tuple[int, ...],
          axis_types: tuple[jax.sharding.AxisType, ...] | None = None) -> Mesh:
    from jax.experimental import topologies

    made = topologies.make_mesh(topology, shape, names)
    return made if axis_types is None else Mesh(made.devices, names, axis_types=axis_types)


def _meshes(value: object) -> Iterator[Mesh]:
    """The concrete meshes `value` names (an equation's context mesh may be the empty one)."""
    if isinstance(value, NamedSharding) and isinstance(value.mesh, Mesh):
        yield from _meshes(value.mesh)
    elif isinstance(value, Mesh):
        if value.axis_names:
            yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _meshes(item)


def _layout(mesh: Mesh) -> MeshSpec:
    return MeshSpec(tuple(MeshAxis(str(n), int(s)) for n, s in zip(mesh.axis_names, mesh.devices.shape, strict=True)))


def model_meshes(traced: Traced) -> list[MeshSpec]:
    """The meshes the trace names, by axes and sizes, in the order it first names them: the
    audit's own (`--mesh`) and any the model made over this machine's devices."""
    found: dict[MeshSpec, None] = {}
    seen: set[int] = set()

    def walk(jaxpr: jc.Jaxpr) -> None:
        for eqn in jaxpr.eqns:
            for value in eqn.params.values():
                for mesh in _meshes(value):
                    found.setdefault(_layout(mesh))
            for _, _, sub in sub_jaxprs(eqn.params):
                if id(sub) not in seen:
                    seen.add(id(sub))
                    walk(open_jaxpr(sub))

    walk(traced.jaxpr.jaxpr)
    return list(found)


def step_mesh(traced: Traced, given: MeshSpec | None) -> MeshSpec | None:
    """The mesh the GPU step is laid on: `given` (`--mesh`), else the one the model made over
    the machine's devices. Meshes of another device count cannot be laid on the same GPUs."""
    named = model_meshes(traced)
    mesh = given if given is not None or not named else named[0]
    if mesh is None:
        return None
    other = next((m for m in named if m.devices != mesh.devices), None)
    if other is not None:
        origin = f"$mesh$ {given}" if given is not None else f"its mesh {mesh}"
        raise UsageError(
            f"{traced.target} shards over a mesh of {other.devices} devices ({other}) and {origin} has "
            f"{mesh.devices}: one GPU step is laid over one set of GPUs",
            f"give $mesh$ {other}, the model's own axes and sizes" if given is not None
            else "build the model's meshes over the same devices",
        )
    return mesh


def on(mesh: Mesh, aval: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """`aval` with its NamedSharding's spec on `mesh` (replicated without one)."""
    sharding = getattr(aval, "sharding", None)
    spec = sharding.spec if isinstance(sharding, NamedSharding) else PartitionSpec()
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=NamedSharding(mesh, spec))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def rehomed(traced: Traced, topology: jc.Topology) -> Traced:
    """The trace with every mesh it names (a `with_sharding_constraint`'s, a `shard_map`'s: the
    audit's CPU mesh, or one the model made over the machine's devices) replaced by a mesh of the
    same axes, sizes and axis types over the GPUs of `topology`."""
    meshes: dict[tuple[MeshSpec, jc.Tree], Mesh] = {}

    def gpus(mesh: Mesh) -> Mesh:
        key = (_layout(mesh), mesh.axis_types)
        if key not in meshes:
            meshes[key] = _over(topology, mesh.axis_names, mesh.devices.shape, mesh.axis_types)
        return meshes[key]

    def abstract(mesh: AbstractMesh) -> AbstractMesh:
        """A shard_map's mesh, as its equation holds it: the GPUs' abstract mesh of its axes (its
        body runs under it, and its values' types carry the GPUs' kind)."""
        key = (tuple(mesh.axis_names), tuple(mesh.axis_sizes), tuple(mesh.axis_types))
        if key not in abstracts:
            abstracts[key] = _over(topology, mesh.axis_names, tuple(mesh.axis_sizes), mesh.axis_types).abstract_mesh
        return abstracts[key]

    abstracts: dict[tuple[Any, ...], AbstractMesh] = {}

    def context(mesh: Any) -> Any:
        """An equation's context mesh: the GPUs' where it names axes, else as it is."""
        return abstract(mesh) if isinstance(mesh, AbstractMesh) and mesh.axis_names else mesh

    def value(v: object) -> object:
        if isinstance(v, AbstractMesh) and not isinstance(v, Mesh) and v.axis_names:
            return abstract(v)
        if isinstance(v, NamedSharding) and isinstance(v.mesh, Mesh) and v.mesh.axis_names:
            return NamedSharding(gpus(v.mesh), v.spec, memory_kind=v.memory_kind)
        if isinstance(v, Mesh) and v.axis_names:  # not the empty mesh an equation's context may be
            return gpus(v)
        if isinstance(v, tuple) and any(isinstance(x, NamedSharding | Mesh) for x in v):
            return tuple(value(x) for x in v)
        return v

    memo: dict[int, tuple[Any, Any]] = {}

    def walk(jaxpr: jc.Jaxpr) -> jc.Jaxpr:
        eqns = []
        for eqn in jaxpr.eqns:
            params = {k: value(v) for k, v in eqn.params.items()}
            params = map_sub_jaxprs(params, lambda _, sub: walk(sub), memo)
            eqns.append(jc.with_context_mesh(eqn.replace(params=params), context))
        return jaxpr.replace(eqns=eqns)

    closed = traced.jaxpr
    return dataclasses.replace(traced, jaxpr=closed.replace(jaxpr=walk(closed.jaxpr)), segments={}, wrapped={})
