"""Per-device residual bytes on a device mesh (`--mesh data=8,model=4`).

The target gets that many virtual CPU devices (XLA's `--xla_force_host_platform_device_count`,
read once, when JAX first starts its CPU backend) and a `jax.sharding.Mesh` over them. Each
policy's forward pass, returning exactly the residuals JAX keeps, is then compiled for the mesh
with the inputs' shardings: the sharding XLA's SPMD partitioner gives each output is the sharding
of that residual, and its shard shape times its item size is what one device keeps. Nothing is
allocated or run; compiling is the partitioner's own answer, not a re-implementation of it.

Compiling a deep unrolled stack for hundreds of devices takes minutes. A model written for
explicit sharding (every mesh axis Explicit: each value's sharding is part of its type) needs no
partitioner: it is traced on an abstract mesh, without devices, and each residual's sharding is
read from its aval (`shardings="abstract"`). A report says which of the two gave its figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec, Sharding
from jax.tree_util import KeyEntry

from .. import _jax_compat as jc
from .._jaxpr import Shaped, aval_bytes, aval_shape
from ..errors import AuditError, DevicesUnavailable, TargetError, UsageError
from ..records import MeshAxis, MeshSpec, PolicyResult, ResidualKind, ShardingSource
from ..trace._trace import Traced, is_array_leaf
from ._analysis import Analysis, residual_outputs

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


def place_args(args: tuple[object, ...], mesh: Mesh | AbstractMesh) -> tuple[object, ...]:
    """`args` with every array leaf a ShapeDtypeStruct sharded on `mesh`: a leaf without a sharding
    is replicated; a NamedSharding must use the mesh's axes, each dividing the dimension it splits.
    Checked before tracing, so a wrong spec is named by input and dimension."""

    def place(path: tuple[KeyEntry, ...], leaf: Any) -> object:  # Any: an array leaf's shape and dtype
        if not is_array_leaf(leaf):
            return leaf
        name = "args" + jax.tree_util.keystr(path)
        try:  # a ShapeDtypeStruct resolves a bare PartitionSpec against the mesh only when asked
            sharding = getattr(leaf, "sharding", None) if isinstance(leaf, jax.ShapeDtypeStruct | jax.Array) else None
        except ValueError as exc:  # an axis the mesh does not have: JAX's message names it
            hint = "use the mesh's axes, or add AXIS=SIZE to $mesh$"
            raise UsageError(f"input {name}: {str(exc).strip()}", hint) from None
        if sharding is None or (not isinstance(sharding, NamedSharding) and sharding.is_fully_replicated):
            spec = PartitionSpec()
        elif isinstance(sharding, NamedSharding):
            spec = sharding.spec
        else:
            raise UsageError(
                f"input {name} has a {type(sharding).__name__}; on a mesh an input's sharding is a NamedSharding",
                "return ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(...)))",
            )
        shape = tuple(int(d) for d in np.shape(leaf))
        _check_spec(name, shape, spec, mesh, sharding)
        weak = bool(getattr(leaf, "weak_type", False))
        return jax.ShapeDtypeStruct(shape, leaf.dtype, weak_type=weak, sharding=NamedSharding(mesh, spec))

    return tuple(jax.tree_util.tree_map_with_path(place, args, is_leaf=is_array_leaf))


def replicated_over(args: tuple[object, ...], mesh: Mesh | AbstractMesh) -> tuple[str, ...]:
    """The mesh's axes of more than one device when no input of `args` (placed by `place_args`)
    is sharded over any of them (every device then holds every input whole: the batch too); else ()."""
    wide = tuple(name for name, size in mesh.shape.items() if size > 1)
    for leaf in jax.tree_util.tree_leaves(args, is_leaf=is_array_leaf):
        sharding = getattr(leaf, "sharding", None) if isinstance(leaf, jax.ShapeDtypeStruct) else None
        if isinstance(sharding, NamedSharding):
            named = {a for entry in sharding.spec if entry is not None
                     for a in ((entry,) if isinstance(entry, str) else entry)}
            if named & set(wide):
                return ()
    return wide


def _check_spec(
    name: str, shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh | AbstractMesh, sharding: Sharding | None
) -> None:
    sizes = dict(mesh.shape)
    own = getattr(sharding, "mesh", None)
    if own is not None and tuple(own.axis_names) != tuple(sizes):
        extra = [a for a in own.axis_names if a not in sizes]
        raise UsageError(
            f"input {name} is sharded on a mesh with axes {tuple(own.axis_names)}, not this mesh's {tuple(sizes)}"
            + (f" (axis {extra[0]!r} is not in the mesh)" if extra else ""),
            "build the sharding from the `mesh` keyword the inputs callable is given",
        )
    if len(spec) > len(shape):
        raise UsageError(f"input {name}: {spec} has {len(spec)} entries for {len(shape)} dimensions",
                         "give one PartitionSpec entry per dimension at most")
    for dim, entry in enumerate(spec):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for axis in axes:
            if axis not in sizes:
                raise UsageError(
                    f"input {name}: axis {axis!r} of {spec} is not in the mesh ({', '.join(sizes)})",
                    f"use the mesh's axes, or add {axis}=SIZE to $mesh$",
                )
            if own is not None and dict(own.shape)[axis] != sizes[axis]:
                raise UsageError(
                    f"input {name}: its mesh has {axis}={dict(own.shape)[axis]}, this mesh {axis}={sizes[axis]}",
                    "build the sharding from the `mesh` keyword the inputs callable is given",
                )
        parts = math.prod(sizes[a] for a in axes)
        if shape[dim] % parts:
            over = " x ".join(f"{a}={sizes[a]}" for a in axes)
            raise UsageError(
                f"input {name}: dimension {dim} (size {shape[dim]}) is not divisible by mesh axis {over}",
                "choose sizes the mesh divides (a $defines$ value, or the $mesh$ sizes)",
            )


def per_device(traced: Traced, analysis: Analysis, mesh: Mesh | AbstractMesh) -> PolicyResult:
    """The analysis's result with each residual's sharding and bytes per device, and the per-device
    total: its forward pass (which returns exactly the residuals) compiled for `mesh` with the
    inputs' shardings (on an abstract mesh: each residual's sharding read from its aval)."""
    result, closed = analysis.result, analysis.forward
    outputs = residual_outputs(closed.jaxpr)
    if len(outputs) != len(result.residuals):
        raise AuditError(f"{result.policy}: {len(outputs)} residuals on the mesh, {len(result.residuals)} in the audit")
    if isinstance(mesh, AbstractMesh):
        if any(e.is_te_gemm for e in traced.rows.equations()):
            raise TargetError(
                f"{result.policy} on an abstract mesh: Transformer Engine's GEMMs give their outputs no sharding "
                "of their own, so every residual after one would read as replicated",
                "use $shardings$ compiled; real TE partitions only on GPUs (docs/guide/mesh.md), its CPU stand-in "
                "on virtual CPU devices",
            )
        out_shardings: list[Sharding | None] = [
            getattr(getattr(v, "aval", None), "sharding", None) for v in closed.jaxpr.outvars
        ]
    else:
        out_shardings = list(_compiled_shardings(closed, traced, result.policy, mesh))
    residuals = []
    for r, (var, kind, i) in zip(result.residuals, outputs, strict=True):
        if kind is ResidualKind.LITERAL:
            residuals.append(dataclasses.replace(r, sharding=None, bytes_per_device=0))
            continue
        sharding = out_shardings[i]
        if sharding is None:  # an abstract value with no sharding of its own: on every device
            residuals.append(dataclasses.replace(r, sharding=str(PartitionSpec()), bytes_per_device=r.bytes))
            continue
        residuals.append(
            dataclasses.replace(r, sharding=sharding_text(sharding, len(r.shape)),
                                bytes_per_device=device_bytes(var.aval, sharding))
        )
    activation = sum(r.bytes_per_device or 0 for r in residuals if r.kind is ResidualKind.ACTIVATION)
    totals = dataclasses.replace(result.totals, activation_bytes_per_device=activation)
    return dataclasses.replace(result, residuals=tuple(residuals), totals=totals)


def _compiled_shardings(closed: jc.ClosedJaxpr, traced: Traced, policy: str, mesh: Mesh) -> list[Sharding]:
    shardings = tuple(a.sharding for a in traced.avals)
    try:
        with mesh_context(mesh):
            compiled = jax.jit(jc.jaxpr_as_fun(closed), in_shardings=shardings).lower(*traced.avals).compile()
    except AuditError:
        raise
    except Exception as exc:  # a primitive without a CPU lowering (a real TE GEMM), say
        raise TargetError(
            f"partitioning {policy} on mesh {spec_of(mesh)}: XLA could not compile its forward pass for "
            f"virtual CPU devices: {_cause(exc)}",
            "every primitive needs a CPU lowering to be partitioned here; an explicit-sharding model can "
            "use $shardings$ abstract",
        ) from exc
    return list(jax.tree_util.tree_leaves(compiled.output_shardings))


def _cause(exc: BaseException) -> str:
    """The innermost error a compile failure reports (a partitioning callback's traceback is
    folded into XLA's message; its last `SomeError: ...` line says what went wrong)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[A-Za-z_.]*(Error|Exception)\b:", line)]
    return errors[-1] if errors else f"{type(exc).__name__}: {lines[0] if lines else ''}"


def device_bytes(aval: Shaped, sharding: Sharding) -> int:
    """Bytes of one device's shard of `aval`: its shard shape (padded where a dimension does not
    divide, as XLA pads) at the aval's item size (a PRNG key's key data, as for global bytes)."""
    shape = aval_shape(aval)
    try:
        shard = tuple(sharding.shard_shape(shape))
    except ValueError:  # uneven: every device holds the padded shard (only a NamedSharding splits so)
        assert isinstance(sharding, NamedSharding)
        shard = _padded_shard(shape, sharding)
    return aval_bytes(jax.ShapeDtypeStruct(shard, getattr(aval, "dtype", None)))


def _padded_shard(shape: tuple[int, ...], sharding: NamedSharding) -> tuple[int, ...]:
    sizes = dict(sharding.mesh.shape)
    out = []
    for dim, size in enumerate(shape):
        entry = sharding.spec[dim] if dim < len(sharding.spec) else None
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        out.append(-(-size // math.prod(sizes[a] for a in axes)))
    return tuple(out)


def sharding_text(sharding: Sharding, ndim: int) -> str:
    """The PartitionSpec as JAX prints it, trailing unsharded dimensions dropped: "P('data', None,
    'model')"; "P()" when replicated."""
    if isinstance(sharding, NamedSharding):
        entries = list(sharding.spec)[:ndim]
        while entries and entries[-1] is None:
            entries.pop()
        return str(PartitionSpec(*entries))
    if getattr(sharding, "is_fully_replicated", False):
        return str(PartitionSpec())
    return str(sharding)
