"""Test configuration: JAX on CPU, strict dtype promotion, and the sample models importable."""

from __future__ import annotations

import hashlib
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


def _this_checkout_first() -> None:
    """The suite tests this checkout, installed or not: this checkout goes first on sys.path and
    on PYTHONPATH for the commands the tests run, and since `cli/` installs as the package
    `te_ckpt_audit_cli`, a folder with a link of that name to it goes there too."""
    shim = Path(tempfile.gettempdir()) / f"te-ckpt-audit-checkout-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"
    shim.mkdir(exist_ok=True)
    for name, folder in (("te_ckpt_audit_cli", ROOT / "cli"),):
        link = shim / name
        if not (link.is_symlink() and link.resolve() == folder.resolve()):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(folder)
    for entry in (str(ROOT), str(shim)):
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)
    paths = [str(shim), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


_this_checkout_first()
