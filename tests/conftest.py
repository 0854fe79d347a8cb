"""Test configuration: JAX on CPU, strict dtype promotion, and the sample models importable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Eight virtual CPU devices for the mesh tests (tests/test_mesh.py): read when JAX starts its backend.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()

import tempfile  # noqa: E402

import jax  # noqa: E402
from hypothesis import settings  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
# The suite writes nothing into the checkout: no example database, and what hypothesis keeps
# anyway (its constants cache) goes to the temporary folder, not to .hypothesis/ here.
settings.register_profile("te-ckpt-audit", database=None)
settings.load_profile("te-ckpt-audit")
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "te-ckpt-audit-hypothesis")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
