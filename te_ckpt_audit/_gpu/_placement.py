"""Placing a trace on GPUs that are not here: a mesh over a CUDA topology of the same axes as the
audit's CPU mesh, the inputs on it, and every sharding the trace names moved onto it."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import _jax_compat as jc
from .._jaxpr import map_sub_jaxprs
from .._trace import Traced
from ..records import MeshSpec


def gpu_mesh(topology: Any, mesh: MeshSpec | None) -> Mesh:
    """The GPU devices of `topology` as a mesh of `mesh`'s axes (one axis `gpu` without one)."""
    from jax.experimental import topologies

    if mesh is None:
        return topologies.make_mesh(topology, (1,), ("gpu",))
    return topologies.make_mesh(topology, tuple(a.size for a in mesh.axes), tuple(a.name for a in mesh.axes))


def on(mesh: Mesh, aval: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """`aval` with its NamedSharding's spec on `mesh` (replicated without one)."""
    sharding = getattr(aval, "sharding", None)
    spec = sharding.spec if isinstance(sharding, NamedSharding) else PartitionSpec()
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=NamedSharding(mesh, spec))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def rehomed(traced: Traced, mesh: Mesh) -> Traced:
    """The trace with every sharding and mesh it names (a `with_sharding_constraint`, a
    `shard_map`, made on the audit's CPU mesh) moved to the GPU mesh of the same axes."""

    def value(v: object) -> object:
        if isinstance(v, NamedSharding) and isinstance(v.mesh, Mesh) and v.mesh.axis_names == mesh.axis_names:
            return NamedSharding(mesh, v.spec, memory_kind=v.memory_kind)
        if isinstance(v, Mesh) and v.axis_names == mesh.axis_names:
            return mesh
        if isinstance(v, tuple) and any(isinstance(x, NamedSharding | Mesh) for x in v):
            return tuple(value(x) for x in v)
        return v

    memo: dict[int, tuple[Any, Any]] = {}

    def walk(jaxpr: jc.Jaxpr) -> jc.Jaxpr:
        eqns = []
        for eqn in jaxpr.eqns:
            params = {k: value(v) for k, v in eqn.params.items()}
            params = map_sub_jaxprs(params, lambda _, sub: walk(sub), memo)
            eqns.append(eqn.replace(params=params))
        return jaxpr.replace(eqns=eqns)

    closed = traced.jaxpr
    return dataclasses.replace(traced, jaxpr=closed.replace(jaxpr=walk(closed.jaxpr)), segments={}, wrapped={})
