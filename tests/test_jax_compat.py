"""The compatibility module is the only place that touches jax._src. These fail loudly, naming the
symbol, when a jax release moves what it uses, and check the supported range end to end."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from te_ckpt_audit import _jax_compat as jc

PACKAGE = Path(jc.__file__).parent
ROOT = PACKAGE.parent

# Every private name _jax_compat.py reads, with the jax versions [since, until) whose branch reads
# it. A release that moves one fails its own test case, named after the symbol.
PRIVATE = [
    ("jax._src.linear_util", "wrap_init", None, None),
    ("jax._src.source_info_util", "Scope", None, None),
    ("jax._src.source_info_util", "user_frames", None, None),
    ("jax._src.ad_checkpoint", "saved_residuals", None, None),
    ("jax._src.interpreters.ad", "linearize", None, None),
    ("jax._src.interpreters.partial_eval", "Saveable", None, None),
    ("jax._src.interpreters.partial_eval", "Recompute", None, None),
    ("jax._src.interpreters.partial_eval", "Offloadable", None, None),
    ("jax._src.interpreters.partial_eval", "SaveableType", None, None),
    ("jax._src.interpreters.partial_eval", "RecomputeType", None, None),
    ("jax._src.tree_util", "FlatTree", None, (0, 11, 0)),
    ("jax._src.flattree", "flatten", (0, 11, 0), None),
    ("jax._src.interpreters.ad", "VJPNode", (0, 12, 0), None),
    ("jax._src.config", "persistent_cache_min_compile_time_secs", None, None),
]
PUBLIC = [
    ("jax.extend.core", name)
    for name in ("Jaxpr", "ClosedJaxpr", "JaxprEqn", "Literal", "Var", "Primitive", "DropVar", "jaxpr_as_fun")
] + [
    ("jax.extend.core.primitives", name)
    for name in (
        "remat_p", "name_p", "reduce_precision_p", "device_put_p", "scan_p", "while_p", "cond_p",
        "custom_vjp_call_p", "custom_jvp_call_p", "dot_general_p", "conv_general_dilated_p",
    )
]


def _read_here(since: tuple[int, ...] | None, until: tuple[int, ...] | None) -> bool:
    return (since is None or jc.JAX_VERSION >= since) and (until is None or jc.JAX_VERSION < until)


@pytest.mark.parametrize(
    ("module", "name"),
    [(m, n) for m, n, since, until in PRIVATE if _read_here(since, until)] + PUBLIC,
    ids=lambda x: x,
)
def test_each_jax_symbol_is_where_the_compat_module_reads_it(module: str, name: str) -> None:
    try:
        found = importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - a jax release moved it
        pytest.fail(f"jax {jax.__version__} has no module {module} (for {name}): {exc}; branch in _jax_compat.py")
    assert hasattr(found, name), f"jax {jax.__version__} moved {module}.{name}: add a branch in _jax_compat.py"


def test_every_private_import_is_in_the_compat_module() -> None:
    offenders = [
        p.name
        for p in PACKAGE.rglob("*.py")
        if p.name != "_jax_compat.py" and "jax._src" in p.read_text()
    ]
    offenders += [p.name for p in (ROOT / "cli").rglob("*.py") if "jax._src" in p.read_text()]
    assert offenders == []


def test_supported_range_is_the_one_pyproject_declares() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "jax>=0.10.2,<0.13" in deps and "jaxlib>=0.10.2,<0.13" in deps
    assert jc.SUPPORTED == ((0, 10, 2), (0, 13, 0))
    assert jc.SUPPORTED_TEXT == "jax >= 0.10.2, < 0.13"
    assert jc.SUPPORTED[0] <= jc.JAX_VERSION < jc.SUPPORTED[1]


@pytest.mark.parametrize(
    ("text", "version"),
    [("0.10.2", (0, 10, 2)), ("0.12.0.1", (0, 12, 0)), ("0.13.0.dev20261201", (0, 13, 0)), ("0.11.0rc1", (0, 11, 0))],
)
def test_version_tuple(text: str, version: tuple[int, ...]) -> None:
    assert jc._version_tuple(text) == version


def test_primitives_are_jax_primitives() -> None:
    for prim in (jc.remat_p, jc.name_p, jc.reduce_precision_p, jc.device_put_p, jc.scan_p,
                 jc.custom_vjp_call_p, jc.custom_jvp_call_p, jc.dot_general_p):
        assert isinstance(prim, jc.Primitive)
    assert jc.remat_p.name == "remat2"
    assert jc.name_p.name == "name"


def _linearized(fun, *avals):
    seen = {}

    def f(*xs):
        residuals, seen["tangent"] = jc.linearize_for_vjp(fun, xs)
        return residuals

    return jax.make_jaxpr(f)(*avals).jaxpr, seen["tangent"]


def _primitive_names(jaxpr) -> list[str]:
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                if isinstance(sub, jc.Jaxpr | jc.ClosedJaxpr):
                    names += _primitive_names(sub.jaxpr)
    return names


def test_linearize_for_vjp_returns_residuals_and_tangent_jaxpr() -> None:
    x = jax.ShapeDtypeStruct((3,), jnp.float32)
    forward, tangent = _linearized(lax.sin, x)
    assert len(forward.outvars) == 1  # cos(x)
    assert len(tangent.constvars) == 1 and len(tangent.invars) == 1
    assert [e.primitive.name for e in tangent.eqns] == ["mul"]


def test_tangent_jaxpr_has_the_same_shape_on_every_jax() -> None:
    # jax 0.11.1 binds residuals as leading invars and 0.12 wraps a jit's tangent in vjp_node[jit]:
    # the compat module hands the engine constvars = residuals, invars = tangents, JAX's primitives.
    x = jax.ShapeDtypeStruct((3,), jnp.float32)
    w = jax.ShapeDtypeStruct((3,), jnp.float32)

    @jax.jit
    def inner(x, w):
        return jnp.sin(x) * w

    def body(c, _):
        return jnp.tanh(c), None

    def fun(x, w):
        c, _ = lax.scan(body, inner(x, w), None, length=2)
        return jnp.sum(c)

    forward, tangent = _linearized(fun, x, w)
    assert len(tangent.invars) == 2
    assert [v.aval for v in tangent.constvars] == [v.aval for v in forward.outvars]
    names = _primitive_names(tangent)
    assert "jit" in names and "scan" in names
    assert not [n for n in names if n.startswith("vjp_node")]
    (scan,) = [e for e in forward.eqns if e.primitive is jc.scan_p]
    assert jc.scan_counts(scan.params) == (0, 1)


def test_scan_counts_reads_consts_and_carry() -> None:
    x = jax.ShapeDtypeStruct((4,), jnp.float32)

    def fun(x):
        w = jnp.cos(x)
        return lax.scan(lambda c, xs: (c * w + xs, c), x, jnp.stack([x, x, x]))

    (scan,) = [e for e in jax.make_jaxpr(fun)(x).jaxpr.eqns if e.primitive is jc.scan_p]
    assert jc.scan_counts(scan.params) == (1, 1)
    assert len(scan.invars) == 3


def test_saved_residuals_matches_print_saved_residuals_length() -> None:
    x = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert len(jc.saved_residuals(lambda x: jnp.sin(jnp.sin(x)), x)) == 2


def test_eqn_tags_survive_differentiation() -> None:
    from te_ckpt_audit.trace._trace import trace

    t = trace(lambda x: jnp.sum(jnp.sin(x)), (jax.ShapeDtypeStruct((3,), jnp.float32),))
    assert [jc.eqn_tag(e) for e in t.jaxpr.jaxpr.eqns] == ["0", "1"]


def _run_with_jax_version(version: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter whose jax reports `version` (what the check reads)."""
    prelude = f"import jax\njax.__version__ = {version!r}\n"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )


@pytest.mark.parametrize("version", ["0.10.1", "0.13.0", "0.13.0.dev20261201"])
def test_unsupported_jax_is_refused_on_import_with_a_hint(version: str) -> None:
    out = _run_with_jax_version(
        version,
        "try:\n    import te_ckpt_audit\nexcept ImportError as e:\n    print('REFUSED', e)\n",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("REFUSED te-ckpt-audit supports jax >= 0.10.2, < 0.13")
    assert f"(found jax {version})" in out.stdout and "pip install 'jax>=0.10.2,<0.13'" in out.stdout


@pytest.mark.parametrize(
    "entry",
    [
        "from te_ckpt_audit_cli._launch import main\nmain()",  # the console script
        "import runpy\nrunpy.run_module('te_ckpt_audit_cli', run_name='__main__')",  # python -m
    ],
    ids=["console-script", "python-m"],
)
def test_cli_refuses_unsupported_jax_in_one_line_with_exit_2(entry: str) -> None:
    code = "import sys\nsys.argv = ['te-ckpt-audit', 'sample_models/mlp.py:loss']\n" + entry
    out = _run_with_jax_version("0.13.0", code)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert lines == [
        "te-ckpt-audit: error: te-ckpt-audit supports jax >= 0.10.2, < 0.13 (found jax 0.13.0) "
        "(hint: install a supported jax: pip install 'jax>=0.10.2,<0.13' 'jaxlib>=0.10.2,<0.13')"
    ]


def test_cli_runs_on_the_installed_jax() -> None:
    out = _run_with_jax_version(
        jax.__version__,
        "import sys\nsys.argv = ['te-ckpt-audit', '--help']\nfrom te_ckpt_audit_cli._launch import main\nmain()",
    )
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout
