"""Per-device residual bytes on a mesh (`--mesh`), checked against the Megatron paper's formulas.

tests/conftest.py gives this process eight virtual CPU devices before JAX starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import jax
import jax.numpy as jnp
import jsonschema
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from te_ckpt_audit_cli.process import with_device_count

from te_ckpt_audit import (
    MeshAxis,
    MeshSpec,
    ResidualKind,
    ShardingSource,
    TargetError,
    UsageError,
    audit,
    audit_target,
    parse_mesh,
)
from te_ckpt_audit._jax_compat import JAX_VERSION
from te_ckpt_audit.analysis._mesh import device_bytes
from te_ckpt_audit.config import load_config
from te_ckpt_audit.errors import DevicesUnavailable
from te_ckpt_audit.gating import check
from te_ckpt_audit.records import JSON_SCHEMA, Budget
from te_ckpt_audit.render import render_json, violation_message
from te_ckpt_audit.trace._devices import MAX_DEVICES, build_mesh, cpu_devices

ROOT = Path(__file__).resolve().parent.parent
MEGATRON = str(ROOT / "sample_models" / "megatron_tp.py") + ":loss"
# megatron_tp.loss_inputs' defaults: seq, batch, hidden, heads (two layers)
S, B, H, A, LAYERS = 32, 4, 64, 8, 2


@pytest.fixture(scope="module")
def megatron() -> dict[tuple[str, bool], object]:
    return {}


def _megatron(cache: dict, mesh: str, sp: bool, shardings: str = "compiled"):  # type: ignore[no-untyped-def]
    if (mesh, sp, shardings) not in cache:
        cache[(mesh, sp, shardings)] = audit_target(
            MEGATRON, ["none"], mesh=mesh, defines=[f"sp={sp}"], shardings=shardings
        )
    return cache[(mesh, sp, shardings)]


def paper_bytes_per_layer(s: int, b: int, h: int, a: int, t: int, sp: bool) -> Fraction:
    """Korthikanti et al. 2022, Table 2: activation bytes per layer on one device, tensor
    parallel size t, 16-bit activations and 1-byte dropout masks; `b` is the batch one device
    holds (data parallelism divides it)."""
    if sp:
        return s * b * h * (Fraction(34, t) + Fraction(5 * a * s, h * t))
    return s * b * h * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("data,model", [(2, 4), (1, 8)])
def test_megatron_per_device_bytes_are_the_papers(megatron: dict, data: int, model: int, sp: bool) -> None:
    """No recomputation (`none`: everything JAX needs is kept). Per device, the activation bytes
    of the layer stack are exactly LAYERS x the paper's per-layer formula, and globally exactly
    LAYERS x its t=1 figure, s*b*h*(34 + 5*a*s/h): the sample keeps what the paper counts
    (megatron_tp's docstring lists each term), and the first LayerNorm's input is an activation
    (the float32 embeddings are cast to 16 bits first), so no byte differs."""
    report = _megatron(megatron, f"data={data},model={model}", sp)
    result = report.result("none")
    assert report.mesh == MeshSpec((MeshAxis("data", data), MeshAxis("model", model)))
    assert report.sharding_source is ShardingSource.COMPILED
    per_layer = paper_bytes_per_layer(S, B // data, H, A, model, sp)
    assert per_layer.denominator == 1
    assert result.totals.activation_bytes_per_device == LAYERS * per_layer
    assert result.totals.activation_bytes == LAYERS * paper_bytes_per_layer(S, B, H, A, 1, False)


@pytest.mark.parametrize("data,model", [(2, 4), (1, 8)])
def test_abstract_mesh_gives_the_papers_bytes_without_devices(megatron: dict, data: int, model: int) -> None:
    """The sample in explicit-sharding mode, traced on an abstract mesh (no devices, no compile):
    each residual's sharding read from its aval gives the same per-device bytes, the paper's."""
    report = _megatron(megatron, f"data={data},model={model}", False, "abstract")
    assert report.sharding_source is ShardingSource.ABSTRACT
    assert report.result("none").totals.activation_bytes_per_device == LAYERS * paper_bytes_per_layer(
        S, B // data, H, A, model, False
    )


def test_abstract_mesh_with_sequence_parallelism_keeps_the_gathered_inputs(megatron: dict) -> None:
    """Explicit sharding gathers the sequence-split LayerNorm output in the program, before each
    column-parallel linear (QKV, and the first MLP linear), so JAX keeps the gathered copy for the
    linear's weight gradient: 2sbh where the paper (and XLA's partitioner, which gathers inside the
    linear) keeps 2sbh/t. Two such inputs per layer: exactly 2 * 2sbh * (1 - 1/t) bytes more per
    layer than Table 2; every other residual is the paper's."""
    t, b = 4, B // 2
    report = _megatron(megatron, "data=2,model=4", True, "abstract")
    extra = 2 * 2 * S * b * H * Fraction(t - 1, t)
    assert report.result("none").totals.activation_bytes_per_device == LAYERS * (
        paper_bytes_per_layer(S, b, H, A, t, True) + extra
    )
    compiled = _megatron(megatron, "data=2,model=4", True)
    assert compiled.result("none").totals.activation_bytes_per_device == LAYERS * paper_bytes_per_layer(
        S, b, H, A, t, True
    )


def test_abstract_mesh_has_no_device_cap() -> None:
    """8192 devices (twice the virtual-device cap): one sample per device, exactly the paper's."""
    report = audit_target(MEGATRON, ["none"], mesh="data=1024,model=8", defines=["batch=1024", "layers=1"],
                          shardings="abstract")
    assert report.mesh is not None and report.mesh.devices == 8192
    assert report.result("none").totals.activation_bytes_per_device == paper_bytes_per_layer(S, 1, H, A, 8, False)


def test_te_gemms_on_an_abstract_mesh_are_refused() -> None:
    """TE's GEMM primitives (the CPU stand-in here, real TE alike) carry no explicit sharding: what
    follows one would read as replicated, so the abstract mesh refuses rather than over-count."""
    target = str(ROOT / "sample_models" / "te_transformer.py") + ":loss"
    with pytest.raises(TargetError, match="Transformer Engine's GEMMs give their outputs no sharding"):
        audit_target(target, ["none"], mesh="data=2,model=4", shardings="abstract")


def test_megatron_residuals_one_by_one(megatron: dict) -> None:
    """Each residual of one layer (tensor parallel 4, data parallel 2, no sequence parallelism):
    its sharding and bytes on one device, against the paper's term it stands for (sbh is
    s * b * h = 32 * 2 * 64 = 4096 on one device, as*s*b = 8 * 32 * 32 * 2 = 16384)."""
    result = _megatron(megatron, "data=2,model=4", False).result("none")
    acts = [r for r in result.residuals if r.kind is ResidualKind.ACTIVATION]
    sbh, assb, t = 4096, 16384, 4
    layer = [
        ("bfloat16", "P(None, 'data')", 2 * sbh),  # LayerNorm 1 input
        ("bfloat16", "P(None, 'data')", 2 * sbh),  # QKV projection input (LayerNorm 1 output)
        ("bfloat16", "P(None, 'data', 'model')", 2 * sbh // t),  # K
        ("bfloat16", "P(None, 'data', 'model')", 2 * sbh // t),  # V
        ("bfloat16", "P(None, 'data', 'model')", 2 * sbh // t),  # Q (scaled by 1/sqrt(d))
        ("bfloat16", "P('data', 'model')", 2 * assb // t),  # softmax output
        ("bool", "P('data', 'model')", assb // t),  # softmax dropout mask
        ("bfloat16", "P('data', 'model')", 2 * assb // t),  # softmax dropout output
        ("bfloat16", "P(None, 'data', 'model')", 2 * sbh // t),  # output projection input
        ("bool", "P(None, 'data')", sbh),  # attention dropout mask
        ("bfloat16", "P(None, 'data')", 2 * sbh),  # LayerNorm 2 input
        ("bfloat16", "P(None, 'data')", 2 * sbh),  # first MLP linear input (LayerNorm 2 output)
        ("bfloat16", "P(None, 'data', 'model')", 8 * sbh // t),  # GeLU input
        ("bfloat16", "P(None, 'data', 'model')", 8 * sbh // t),  # GeLU output (second linear input)
        ("bool", "P(None, 'data')", sbh),  # MLP dropout mask
    ]
    assert [(r.dtype, r.sharding, r.bytes_per_device) for r in acts] == layer * LAYERS
    assert all(r.bytes == r.bytes_per_device * (2 if "data" in (r.sharding or "") else 1) *
               (t if "model" in (r.sharding or "") else 1) for r in acts)


def test_per_device_fields_on_a_small_function() -> None:
    """Inputs sharded by the caller, an intermediate constrained: every figure exact."""
    mesh = build_mesh(parse_mesh("data=2,model=4"))

    def f(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jnp.tanh(jax.lax.with_sharding_constraint(x @ w1, P("data", None, "model")))
        return jnp.sum(h @ w2)

    x = jax.ShapeDtypeStruct((8, 16, 32), jnp.bfloat16, sharding=NamedSharding(mesh, P("data")))
    w1 = jax.ShapeDtypeStruct((32, 64), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "model")))
    w2 = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16)  # no sharding: replicated
    report = audit(f, x, w1, w2, policies=["none", "nothing_saveable"], mesh=mesh)
    none = report.result("none")
    assert [(r.kind, r.sharding, r.bytes, r.bytes_per_device) for r in none.residuals] == [
        (ResidualKind.ARGUMENT, "P('data',)", 8192, 4096),
        (ResidualKind.ARGUMENT, "P(None, 'model')", 4096, 1024),
        (ResidualKind.ARGUMENT, "P()", 4096, 4096),
        (ResidualKind.ACTIVATION, "P('data', None, 'model')", 16384, 2048),
        (ResidualKind.ACTIVATION, "P('data', None, 'model')", 16384, 2048),
    ]
    assert none.totals.activation_bytes_per_device == 4096
    assert report.result("nothing_saveable").totals.activation_bytes_per_device == 0
    doc = json.loads(render_json(report))
    jsonschema.validate(doc, JSON_SCHEMA)
    assert doc["mesh"] == {"axes": [{"name": "data", "size": 2}, {"name": "model", "size": 4}], "devices": 8}
    assert doc["sharding_source"] == "compiled"
    assert doc["results"][0]["totals"]["activation_bytes_per_device"] == 4096
    assert render_json(report) == render_json(audit(f, x, w1, w2, policies=["none", "nothing_saveable"], mesh=mesh))


def test_compile_on_a_mesh_is_per_device() -> None:
    """--compile partitions the training step with the inputs' shardings: XLA's argument bytes are
    one device's shards (x 4096 + w1 1024 + w2 replicated 4096), not the global 16384."""
    mesh = build_mesh(parse_mesh("data=2,model=4"))
    x = jax.ShapeDtypeStruct((8, 16, 32), jnp.bfloat16, sharding=NamedSharding(mesh, P("data")))
    w1 = jax.ShapeDtypeStruct((32, 64), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "model")))
    w2 = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16)
    report = audit(lambda x, w1, w2: jnp.sum(jnp.tanh(x @ w1) @ w2), x, w1, w2, policies=["none"], mesh=mesh,
                   compile=True)
    compiled = report.result("none").compiled
    assert compiled is not None and compiled.error is None
    assert compiled.argument_bytes == 4096 + 1024 + 4096


def test_shard_map_bodies_are_per_device() -> None:
    """JAX stacks a shard_map body's residuals one slice per device ([8 * 32, 16] for w's [32, 16]
    slice); the partitioner gives each device its slice, so per device is the body's own size."""
    mesh = build_mesh(parse_mesh("data=2,model=4"))

    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        body = jax.shard_map(lambda x, w: jnp.tanh(x @ w), mesh=mesh, in_specs=(P("data", None), P(None, "model")),
                             out_specs=P("data", "model"))
        return jnp.sum(jnp.sin(body(x, w)))

    x = jax.ShapeDtypeStruct((8, 32), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    w = jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "model")))
    result = audit(f, x, w, policies=["none"], mesh=mesh).result("none")
    expected = [
        ((256, 16), 16384, 32 * 16 * 4),  # w's slice on each device
        ((32, 32), 4096, 4 * 32 * 4),  # x's slice on each device
        ((32, 16), 2048, 4 * 16 * 4),  # 1 - tanh^2, in the body
        ((8, 64), 2048, 4 * 16 * 4),  # tanh output (sin's input), sharded data x model
        ((8, 64), 2048, 4 * 16 * 4),  # cos, for sin's derivative
    ]
    if JAX_VERSION >= (0, 11, 2):  # from jax 0.11.2, JAX keeps only cos for sin's derivative
        expected.remove(((8, 64), 2048, 4 * 16 * 4))
    # sorted: JAX's residual order changes between releases (jax 0.11.1 puts sin's input first)
    assert sorted((r.shape, r.bytes, r.bytes_per_device) for r in result.residuals) == sorted(expected)


def test_without_a_mesh_the_fields_are_null() -> None:
    report = audit(lambda x: jnp.sum(jnp.sin(x)), jax.ShapeDtypeStruct((4,), jnp.float32), policies=["none"])
    assert report.mesh is None and report.sharding_source is None
    assert report.results[0].totals.activation_bytes_per_device is None
    assert all(r.sharding is None and r.bytes_per_device is None for r in report.results[0].residuals)
    doc = json.loads(render_json(report))
    jsonschema.validate(doc, JSON_SCHEMA)
    assert doc["mesh"] is None


def test_device_bytes_keys_and_uneven_dimensions() -> None:
    mesh = build_mesh(parse_mesh("data=2,model=4"))
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), 8))  # key<fry>: 8 bytes each
    assert device_bytes(keys, NamedSharding(mesh, P("model"))) == 2 * 8
    # XLA pads a dimension its axis does not divide: each device holds ceil(6 / 4) rows
    assert device_bytes(jax.ShapeDtypeStruct((6, 8), jnp.float32), NamedSharding(mesh, P("model"))) == 2 * 8 * 4


def test_budgets_are_per_device(megatron: dict) -> None:
    report = _megatron(megatron, "data=2,model=4", False)
    per_device = report.result("none").totals.activation_bytes_per_device
    result = check(report, [Budget(per_device - 1)])
    (violation,) = result.violations
    assert violation.value == per_device
    assert violation.per_device and "activation bytes per device" in violation_message(violation)
    assert check(report, [Budget(per_device)]).ok


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,named",
    [("data=8,model", "'model' is not AXIS=SIZE"), ("data=x", "'data=x' is not AXIS=SIZE"),
     ("data=0", "axis 'data' has size 0"), ("data=2,data=4", "axis 'data' is given twice"),
     ("1x=2", "axis name '1x'"), ("", "'' is not AXIS=SIZE")],
)
def test_malformed_mesh(text: str, named: str) -> None:
    with pytest.raises(UsageError, match=named.replace("(", r"\(")) as err:
        parse_mesh(text)
    assert isinstance(err.value, UsageError)  # exit 2


def test_mesh_too_large() -> None:
    with pytest.raises(UsageError, match=f"a mesh of 8192 devices is more than the {MAX_DEVICES} virtual CPU"):
        build_mesh(parse_mesh("data=64,model=128"))


def test_too_few_devices_started() -> None:
    with pytest.raises(DevicesUnavailable, match="needs 16 devices, but JAX's CPU backend already started with 8"):
        cpu_devices(16)


def test_device_count_flag() -> None:
    assert with_device_count("", 8) == "--xla_force_host_platform_device_count=8"
    assert with_device_count("--xla_force_host_platform_device_count=4 --x=1", 8) == (
        "--xla_force_host_platform_device_count=8 --x=1"
    )
    assert with_device_count("--xla_force_host_platform_device_count=16", 8) == (
        "--xla_force_host_platform_device_count=16"
    )


def test_config_mesh(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    body = '[tool.te-ckpt-audit]\n[[tool.te-ckpt-audit.targets]]\ntarget = "m.py:loss"\nmesh = {mesh}\n'
    path.write_text(body.replace("{mesh}", "{ data = 8, model = 4 }"))
    assert load_config(path).targets[0].mesh == parse_mesh("data=8,model=4")
    path.write_text(body.replace("{mesh}", '{ data = 8 }\nshardings = "abstract"'))
    assert load_config(path).targets[0].shardings is ShardingSource.ABSTRACT
    path.write_text(body.replace("{mesh}", '{ data = 8 }\nshardings = "guessed"'))
    with pytest.raises(UsageError, match=r"targets\[0\].shardings must be compiled or abstract"):
        load_config(path)
    path.write_text(body.replace("{mesh}", '"data=8"'))
    with pytest.raises(UsageError, match=r"targets\[0\].mesh must be a table"):
        load_config(path)
    path.write_text(body.replace("{mesh}", "{ data = 8, model = true }"))
    with pytest.raises(UsageError, match="axis 'model' has size True"):
        load_config(path)


MODEL = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    def loss(x):
        return jnp.sum(jnp.sin(jnp.sin(x)))

    def loss_inputs(mesh=None, axis="model", rows=8):
        return (jax.ShapeDtypeStruct((rows, 8), jnp.float32, sharding=NamedSharding(mesh, P(axis))),)
    """
)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "model.py").write_text(MODEL)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the CLI provides the devices
    return subprocess.run(
        [sys.executable, "-m", "te_ckpt_audit_cli", "model.py:loss", "--policy", "none", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.parametrize(
    "args,code,named",
    [
        (["--mesh", "data=2,model"], 2, "--mesh 'data=2,model': 'model' is not AXIS=SIZE"),
        (["--mesh", "data=64,model=128"], 2, "a mesh of 8192 devices is more than the 2048 virtual CPU devices"),
        (["--mesh", "data=2,model=4", "-D", "axis=tensor"], 3, "Resource axis: tensor of P('tensor',) is not found"),
        (["--mesh", "data=2,model=4", "-D", "rows=6"], 2,
         "input args[0]: dimension 0 (size 6) is not divisible by mesh axis model=4"),
    ],
    ids=["malformed", "too-large", "axis-not-in-mesh", "indivisible"],
)
def test_cli_bad_input_is_one_line(tmp_path: Path, args: list[str], code: int, named: str) -> None:
    run = _cli(tmp_path, *args)
    assert run.returncode == code, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], run.stderr
    assert run.stdout == ""


def test_cli_mesh_json(tmp_path: Path) -> None:
    """The CLI gives itself the devices (XLA_FLAGS unset here) and reports per device."""
    run = _cli(tmp_path, "--mesh", "data=2,model=4", "--format", "json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["mesh"]["devices"] == 8
    # x is an argument of loss (rows split over `model`); the two sin's keep cos(x) and cos(sin(x))
    (result,) = doc["results"]
    assert [(r["kind"], r["sharding"], r["bytes"], r["bytes_per_device"]) for r in result["residuals"]] == [
        ("activation", "P('model',)", 256, 64),
        ("activation", "P('model',)", 256, 64),
    ]
    assert result["totals"]["activation_bytes_per_device"] == 128


def test_cli_runs_itself_again_when_jax_started_with_too_few_devices() -> None:
    code = (
        "import sys, jax; jax.devices();"
        "from te_ckpt_audit_cli.process import provide_cpu_devices;"
        "provide_cpu_devices(16, [sys.executable, '-c', 'import jax; print(len(jax.devices(\"cpu\")))'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "16"


REPLICATED = """\
import jax
import jax.numpy as jnp


def loss(w, x):
    return jnp.sum(jnp.sin(x @ w) @ w)


def loss_inputs(batch: int = 16):
    return jax.ShapeDtypeStruct((32, 32), jnp.float32), jax.ShapeDtypeStruct((batch, 32), jnp.float32)
"""


def test_a_mesh_without_a_sharded_input_is_a_finding_in_every_format(tmp_path: Path, monkeypatch) -> None:
    """Issue 46, item 4: on data=8 with nothing sharded, every device holds the whole batch."""
    from te_ckpt_audit.records import InputsReplicated
    from te_ckpt_audit.render import render_json, render_markdown, render_table
    from te_ckpt_audit.render.html import render_audit_html

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rep.py").write_text(REPLICATED)
    report = audit_target("rep.py:loss", ["nothing_saveable"], mesh=parse_mesh("data=8,model=1"))
    assert report.findings == (InputsReplicated("data=8,model=1", ("data",)),)
    (row,) = report.results
    assert row.totals.activation_bytes_per_device == row.totals.activation_bytes  # the symptom it names
    doc = json.loads(render_json(report))
    jsonschema.validate(doc, JSON_SCHEMA)
    assert doc["findings"][0]["code"] == "inputs-replicated" and doc["findings"][0]["known"] == ["data"]
    for text in (render_markdown(report), " ".join(render_table(report).split()), render_audit_html(report)):
        assert "inputs-replicated" in text and "whole batch" in text
    # off a mesh, or with the batch sharded, no finding
    assert audit_target("rep.py:loss", ["nothing_saveable"]).findings == ()


@pytest.mark.parametrize("sample", ["gpt", "te_transformer", "flax_model", "mlp"])
def test_the_samples_shard_their_batch_on_a_mesh(sample: str) -> None:
    """The README's `gpt.py:loss -D batch=16 --mesh data=8` is data-parallel: a device keeps an eighth."""
    report = audit_target(f"sample_models/{sample}.py:loss", ["checkpoint_dots"], defines={"batch": 16},
                          mesh=parse_mesh("data=8"))
    assert report.findings == ()
    totals = report.results[0].totals
    assert totals.activation_bytes_per_device is not None
    assert totals.activation_bytes_per_device * 7 < totals.activation_bytes  # an eighth, and what a device keeps whole
