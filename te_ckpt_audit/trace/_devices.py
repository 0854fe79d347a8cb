"""The mesh a target's inputs are placed on (`--mesh data=8,model=4`): a `jax.sharding.Mesh` over
virtual CPU devices (XLA's `--xla_force_host_platform_device_count`, read once, when JAX first starts
its CPU backend; the command line sets it), or an abstract mesh of axis names and sizes for a model
written for explicit sharding (no devices, any size); and the mesh as JAX's context mesh.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh

from ..errors import DevicesUnavailable, UsageError
from ..records import MeshAxis, MeshSpec, ShardingSource

# More virtual devices cost seconds and memory at start-up, and XLA's CPU client runs a mesh of
# more than 2048 devices as a multi-process computation, which it does not implement.
MAX_DEVICES = 2048


def cpu_devices(n: int) -> list[jax.Device]:
    """`n` of JAX's CPU devices. How many there are is fixed when JAX starts its backend (the
    command line sets XLA's flag for it first); too few is `DevicesUnavailable`."""
    if n > MAX_DEVICES:
        raise UsageError(
            f"a mesh of {n} devices is more than the {MAX_DEVICES} virtual CPU devices te-ckpt-audit provides",
            "audit a smaller mesh with the same per-device shapes (fewer data-parallel replicas), or an "
            "explicit-sharding model with $shardings$ abstract (no devices needed)",
        )
    devices = jax.devices("cpu")
    if len(devices) < n:
        raise DevicesUnavailable(n, len(devices))
    return list(devices[:n])


def build_mesh(spec: MeshSpec) -> Mesh:
    """A `jax.sharding.Mesh` over virtual CPU devices. Its axes are Auto (the partitioner
    propagates shardings), so `with_sharding_constraint` and logical axis rules work as on GPUs."""
    devices = np.array(cpu_devices(spec.devices)).reshape([a.size for a in spec.axes])
    return Mesh(devices, tuple(a.name for a in spec.axes))


def build_abstract_mesh(spec: MeshSpec) -> AbstractMesh:
    """A mesh of axis names and sizes only, every axis Explicit: no devices, any size."""
    return AbstractMesh(
        tuple(a.size for a in spec.axes), tuple(a.name for a in spec.axes),
        axis_types=(AxisType.Explicit,) * len(spec.axes),
    )


def spec_of(mesh: Mesh | AbstractMesh) -> MeshSpec:
    return MeshSpec(tuple(MeshAxis(str(n), int(s)) for n, s in mesh.shape.items()))


@contextlib.contextmanager
def mesh_context(mesh: Mesh | AbstractMesh | None) -> Iterator[None]:
    """The mesh as JAX's context mesh (bare PartitionSpecs then resolve against it), or nothing."""
    if mesh is None:
        yield
        return
    with jax.sharding.use_abstract_mesh(mesh) if isinstance(mesh, AbstractMesh) else jax.sharding.set_mesh(mesh):
        yield


def source_of(mesh: Mesh | AbstractMesh) -> ShardingSource:
    return ShardingSource.ABSTRACT if isinstance(mesh, AbstractMesh) else ShardingSource.COMPILED
