"""Can this machine compile for a GPU target: jax >= 0.12, Linux on x86_64, JAX's CUDA plugin and
NVIDIA's ptxas (the [gpu] extra)."""

from __future__ import annotations

import functools
import importlib.util
import platform
import sys

import jax

from .. import _jax_compat as jc
from ..errors import UsageError

INSTALL_HINT = 'from a checkout: pip install -e ".[gpu]" (Linux x86_64, Python >= 3.12, jax 0.12)'


def check_available() -> None:
    """What the machine lacks, as a UsageError naming the install (exit 2)."""
    if jc.JAX_VERSION < jc.GPU_TARGET_SINCE:
        raise UsageError(f"compiling for a GPU needs jax >= 0.12 (found jax {jax.__version__})", INSTALL_HINT)
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise UsageError(f"compiling for a GPU needs Linux on x86_64 (this is {sys.platform} on {platform.machine()})",
                         "JAX's CUDA plugin and NVIDIA's ptxas ship for it alone")
    needed = (("jax_plugins.xla_cuda12", "jax-cuda12-plugin"), ("nvidia.cuda_nvcc", "nvidia-cuda-nvcc-cu12"))
    for module, package in needed:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            raise UsageError(f"compiling for a GPU needs {package}, which is not installed", INSTALL_HINT)


@functools.cache
def versions() -> str:
    """The versions a compiled result depends on: jax, jaxlib and the CUDA plugin."""
    from importlib.metadata import PackageNotFoundError, version

    found = [jax.__version__]
    for package in ("jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "nvidia-cuda-nvcc-cu12"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} -")
    return "; ".join(found)
