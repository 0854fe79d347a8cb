"""What the GPU-target tests share: whether this machine can compile for a GPU (the [gpu] extra:
jax 0.12, its CUDA plugin, NVIDIA's ptxas, optax), the gpu-target lane's rule that a missing
piece fails instead of skipping (TE_CKPT_AUDIT_GPU_LANE=1), and the command line as a user runs it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from te_ckpt_audit._jax_compat import GPU_TARGET_SINCE, JAX_VERSION

ROOT = Path(__file__).resolve().parent.parent
LANE = os.environ.get("TE_CKPT_AUDIT_GPU_LANE") == "1"


def gpu_target_missing() -> str | None:
    """Why a step cannot be compiled for a GPU here, or None."""
    if JAX_VERSION < GPU_TARGET_SINCE:
        return f"jax {jax.__version__} < 0.12"
    for module in ("jax_plugins.xla_cuda12", "nvidia.cuda_nvcc", "optax"):
        try:
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed"
        except ImportError:
            return f"{module} is not installed"
    return None


MISSING_GPU_TARGET = gpu_target_missing()
# a test that compiles for a GPU: skipped where the [gpu] extra is missing, except in the lane
compiles = pytest.mark.skipif(MISSING_GPU_TARGET is not None and not LANE,
                              reason=f"no GPU target here: {MISSING_GPU_TARGET}")


def stack(w: jax.Array, x: jax.Array) -> jax.Array:
    """Eight wide layers: what saving everything keeps (512 MiB) dwarfs cuBLAS's workspace."""
    for i in range(w.shape[0]):
        x = jnp.tanh(x @ w[i])
    return jnp.mean(x)


STACK_ARGS = (jax.ShapeDtypeStruct((8, 1024, 1024), jnp.float32), jax.ShapeDtypeStruct((8192, 1024), jnp.float32))


def cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`te-ckpt-audit ARGS` in a fresh process, as a user's shell runs it: no XLA_FLAGS, no
    JAX_PLATFORMS (the command keeps JAX on CPU itself), unless `env` sets them."""
    run_env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    run_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", *args], cwd=cwd, env=run_env,
                          capture_output=True, text=True, timeout=timeout)
