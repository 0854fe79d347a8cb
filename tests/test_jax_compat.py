"""The compatibility module is the only place that touches jax._src; these fail loudly when JAX
moves what it imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from te_ckpt_audit import _jax_compat as jc

PACKAGE = Path(jc.__file__).parent


def test_every_private_import_is_in_the_compat_module() -> None:
    offenders = [
        p.name
        for p in PACKAGE.rglob("*.py")
        if p.name != "_jax_compat.py" and "jax._src" in p.read_text()
    ]
    cli = PACKAGE.parent / "cli"
    offenders += [p.name for p in cli.rglob("*.py") if "jax._src" in p.read_text()]
    assert offenders == []


def test_primitives_are_jax_primitives() -> None:
    for prim in (jc.remat_p, jc.name_p, jc.reduce_precision_p, jc.device_put_p, jc.scan_p,
                 jc.custom_vjp_call_p, jc.custom_jvp_call_p, jc.dot_general_p):
        assert isinstance(prim, jc.Primitive)
    assert jc.remat_p.name == "remat2"
    assert jc.name_p.name == "name"


def test_linearize_for_vjp_returns_residuals_and_tangent_jaxpr() -> None:
    x = jax.ShapeDtypeStruct((3,), jnp.float32)
    seen = {}

    def f(x):
        residuals, tangent = jc.linearize_for_vjp(lambda x: jnp.sin(x), [x])
        seen["tangent"] = tangent
        return residuals

    out = jax.make_jaxpr(f)(x)
    assert len(out.jaxpr.outvars) == 1  # cos(x)
    assert len(seen["tangent"].constvars) == 1
    assert [e.primitive.name for e in seen["tangent"].eqns] == ["mul"]


def test_saved_residuals_matches_print_saved_residuals_length() -> None:
    x = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert len(jc.saved_residuals(lambda x: jnp.sin(jnp.sin(x)), x)) == 2


def test_eqn_tags_survive_differentiation() -> None:
    from te_ckpt_audit._trace import trace

    t = trace(lambda x: jnp.sum(jnp.sin(x)), (jax.ShapeDtypeStruct((3,), jnp.float32),))
    assert [jc.eqn_tag(e) for e in t.jaxpr.jaxpr.eqns] == ["0", "1"]


def test_unsupported_jax_version_is_refused_with_a_hint() -> None:
    code = (
        "import jax; jax.__version__ = '0.9.0'\n"
        "try:\n    import te_ckpt_audit._jax_compat\nexcept ImportError as e:\n    print('REFUSED', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "REFUSED" in out.stdout and "pip install" in out.stdout
