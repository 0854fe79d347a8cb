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

import dataclasses
import math
import re

import jax
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec, Sharding

from .. import _jax_compat as jc
from .._jaxpr import Shaped, aval_bytes, aval_shape
from ..errors import AuditError, TargetError
from ..records import PolicyResult, ResidualKind
from ..trace._devices import mesh_context, spec_of
from ..trace._trace import Traced
from ._analysis import Analysis, residual_outputs


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
