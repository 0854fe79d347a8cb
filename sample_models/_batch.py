"""The batch as a data-parallel run holds it: on the mesh te-ckpt-audit passes (`--mesh data=8`),
its first dimension split over the mesh's batch axes (`data`, `fsdp`, as MaxText names them)."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

BATCH_AXES = ("data", "fsdp")


def batch_input(shape: tuple[int, ...], dtype: Any, mesh: Any = None) -> jax.ShapeDtypeStruct:
    """A ShapeDtypeStruct of the batch; on a mesh, sharded over its batch axes where they divide
    the batch (else replicated: te-ckpt-audit's inputs-replicated finding then says so). An
    abstract mesh of explicit axes (`--shardings abstract`) is left replicated: the samples'
    embedding gathers are not written for an explicitly sharded batch."""
    if not isinstance(mesh, jax.sharding.Mesh):
        return jax.ShapeDtypeStruct(shape, dtype)
    axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
    ways = 1
    for a in axes:
        ways *= dict(mesh.shape)[a]
    if not axes or shape[0] % ways:
        return jax.ShapeDtypeStruct(shape, dtype)
    spec = PartitionSpec(axes, *([None] * (len(shape) - 1)))
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
