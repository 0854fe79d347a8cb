"""A model that makes its own mesh over the machine's devices (MaxText's way: its config's
parallelism over `jax.devices()`) and shards its activations on it: `--gpu` lays that mesh's axes
and sizes over the GPU topology, or refuses in one line that says what to pass.

The compiles run where the [gpu] extra is (the gpu-target lane); the refusals everywhere.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _gpu_lane import LANE, MISSING_GPU_TARGET, cli, compiles
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from te_ckpt_audit import UsageError, audit
from te_ckpt_audit.gpus import GpuRequest, gpu_model

OWN = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("data", "model"))
W, X = jax.ShapeDtypeStruct((512, 512), jnp.float32), jax.ShapeDtypeStruct((64, 512), jnp.float32)


def sharded(w: jax.Array, x: jax.Array) -> jax.Array:
    x = jax.lax.with_sharding_constraint(x, NamedSharding(OWN, PartitionSpec("data", None)))
    h = jnp.tanh(x @ w)
    h = jax.lax.with_sharding_constraint(h, NamedSharding(OWN, PartitionSpec("data", "model")))
    return jnp.mean(h @ w)


def h100() -> GpuRequest:
    return GpuRequest(gpu_model("h100"))


@pytest.fixture(scope="module", autouse=True)
def _the_lane_has_everything() -> None:
    if LANE and MISSING_GPU_TARGET is not None:
        pytest.fail(f"the gpu-target lane cannot compile for a GPU: {MISSING_GPU_TARGET}")


@compiles
def test_the_models_own_mesh_is_laid_over_as_many_gpus() -> None:
    """No --mesh: the step runs on 4 GPUs as data=2,model=2, the model's own; its peak is the one
    the same mesh given as `mesh=` gets (the inputs replicated in both), byte for byte."""
    own = audit(sharded, W, X, policies=["nothing_saveable"], gpu=h100(), params=0)
    given = audit(sharded, W, X, policies=["nothing_saveable"], gpu=h100(), params=0, mesh=OWN)
    peak, peak_given = own.results[0].peak, given.results[0].peak
    assert peak is not None and peak.error is None and peak.bytes_per_device is not None, peak
    assert own.gpu is not None and (own.gpu.mesh, own.gpu.mesh_source) == ("data=2,model=2", "model")
    assert given.gpu is not None and (given.gpu.mesh, given.gpu.mesh_source) == ("data=2,model=2", "given")
    assert dataclasses.replace(peak, compile_seconds=0) == dataclasses.replace(peak_given, compile_seconds=0)
    assert own.gpu.usable_bytes == given.gpu.usable_bytes  # the reserve of a run of several GPUs
    # in: the parameters and the batch, replicated (no --mesh places them; the model shards inside)
    assert peak.argument_bytes == W.size * 4 + X.size * 4


ROW = Mesh(np.array(jax.devices("cpu")[:4]), ("data",))


def mapped(w: jax.Array, x: jax.Array) -> jax.Array:
    """A shard_map over a mesh the model made: its equations run under that mesh's manual axes."""
    f = jax.shard_map(lambda w, x: jnp.tanh(x @ w), mesh=ROW, in_specs=(PartitionSpec(), PartitionSpec("data")),
                      out_specs=PartitionSpec("data"))
    return jnp.mean(f(w, x) @ w)


@compiles
def test_a_shard_map_over_the_models_own_mesh_compiles_on_the_gpus() -> None:
    """The shard_map's mesh, and the mesh each of its equations runs under, are the GPUs': the step
    compiles (it used to be "not compiled": the body's context mesh was the CPU devices'), to the
    same plan as the mesh given as `mesh=`."""
    own = audit(mapped, W, X, policies=["nothing_saveable", "none"], gpu=h100(), params=0)
    given = audit(mapped, W, X, policies=["nothing_saveable", "none"], gpu=h100(), params=0, mesh=ROW)
    assert own.gpu is not None and (own.gpu.mesh, own.gpu.mesh_source) == ("data=4", "model")
    for mine, theirs in zip(own.results, given.results, strict=True):
        assert mine.peak is not None and mine.peak.error is None and mine.peak.bytes_per_device, mine.peak
        assert theirs.peak is not None
        assert dataclasses.replace(mine.peak, compile_seconds=0) == dataclasses.replace(theirs.peak, compile_seconds=0)


def test_a_mesh_of_other_devices_than_the_models_is_refused() -> None:
    """--mesh of 2 devices for a model that shards over its own 4: one line naming the option."""
    two = Mesh(np.array(jax.devices("cpu")[:2]).reshape(2), ("data",))
    from te_ckpt_audit.targets import step_mesh
    from te_ckpt_audit.trace._devices import spec_of
    from te_ckpt_audit.trace._trace import trace

    traced = trace(sharded, (W, X), "own.py:sharded")
    assert step_mesh(traced, None) is not None and str(step_mesh(traced, None)) == "data=2,model=2"
    with pytest.raises(UsageError) as exc:
        step_mesh(traced, spec_of(two))
    assert "shards over a mesh of 4 devices (data=2,model=2) and $mesh$ data=2 has 2" in exc.value.template
    assert "give $mesh$ data=2,model=2" in exc.value.hint_template


MODEL = """\
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P

MESH = Mesh(np.array(jax.devices()).reshape(-1, 1, 1), ("data", "fsdp", "tensor"))

def loss(w, x):
    with MESH:
        h = jax.lax.with_sharding_constraint(jnp.tanh(x @ w), P("data", "tensor"))
        return jnp.mean(h)

def loss_inputs():
    return jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((8, 64), jnp.float32)
"""


def test_a_mesh_without_the_models_axes_is_exit_2_naming_the_option(tmp_path: Path) -> None:
    """MaxText's case with `--mesh data=1`: the model names `tensor`, the mesh given has none."""
    (tmp_path / "model.py").write_text(MODEL)
    run = cli("model.py:loss", "--mesh", "data=2", cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "mesh axis 'tensor' is not in the mesh ('data')" in lines[0]
    assert "give --mesh every axis the model shards over (tensor included)" in lines[0]
    assert "leave --mesh out" in lines[0]
