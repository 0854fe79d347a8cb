"""`--tpu`: each policy's step compiled by libtpu for a TPU slice that is not here (the [tpu] extra;
the tpu-target CI lane, where a missing libtpu fails instead of skipping). The verdict is libtpu's
own HBM check; tests/test_tpus.py holds the rows a real v5e measured."""

from __future__ import annotations

import html
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from test_cli import MODEL, cli

from te_ckpt_audit import UsageError, audit, audit_target
from te_ckpt_audit.gpus import Optimizer
from te_ckpt_audit.targets._steptime import (
    TPU_ESTIMATOR,
    TPU_HOST_ARRAY_S,
    TPU_HOST_STEP_S,
    TPU_STEP_S,
)
from te_ckpt_audit.tpus import TpuRequest, parse_tpu

ROOT = Path(__file__).resolve().parent.parent
LANE = os.environ.get("TE_CKPT_AUDIT_TPU_LANE") == "1"
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU and not LANE, reason="no libtpu here (the [tpu] extra)")
MIB, GIB = 2**20, 2**30
WIDE = {"d_in": 4096, "d_hidden": 16384, "d_out": 4096}  # bench/tpu_truth.py's MLP


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path / "model.py"


@pytest.fixture(scope="module", autouse=True)
def _the_lane_has_libtpu() -> None:
    if LANE and not HAS_LIBTPU:
        pytest.fail("the tpu-target lane has no libtpu: install the [tpu] extra")


@pytest.mark.parametrize(("args", "said"), [
    (["--tpu", "v5f"], "--tpu 'v5f' is not a TPU this tool knows (hint: did you mean v5p or v5e?)"),
    (["--tpu", "v5e:2x"], "--tpu 'v5e:2x': '2x' is not a topology"),
    (["--tpu", "v5e:2x2"], "--tpu 'v5e:2x2' has 4 chips and the mesh 1 devices"),
    (["--tpu", "v5e", "--gpu", "h100"], "--tpu and --gpu both name the step's target"),
    (["--tpu", "v5e", "--peak-budget", "1GiB"], "--peak-budget is about the step compiled for a GPU"),
])
def test_bad_tpu_names_and_topologies_are_one_line_and_exit_2(args: list[str], said: str, model: Path) -> None:
    result = cli("model.py:loss", *args)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"te-ckpt-audit: error: {said}") and result.stderr.count("\n") == 1


@pytest.mark.skipif(HAS_LIBTPU, reason="libtpu is installed here")
def test_without_libtpu_tpu_says_what_to_install() -> None:
    with pytest.raises(UsageError, match=r"libtpu, which is not installed") as err:
        audit_target("sample_models/mlp.py:loss", ["none"], tpu=TpuRequest(parse_tpu("v5e")))
    assert "[tpu]" in err.value.hint


def _matmul(w: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.sum(x @ w)


@needs_libtpu
def test_a_single_matmuls_plan_by_hand() -> None:
    """value_and_grad of sum(x @ w) w.r.t. w: the arguments are w and x (4 MiB + 1 MiB, no padding
    on a TPU's tiles), the gradient is w's shape, written into w's donated buffer."""
    w, x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32), jax.ShapeDtypeStruct((256, 1024), jnp.float32)
    report = audit(_matmul, w, x, policies=["nothing_saveable"], params=0, tpu=TpuRequest(parse_tpu("v5e")))
    plan = report.results[0].tpu_plan
    assert plan is not None and plan.fits is True and plan.error is None
    assert plan.argument_bytes == 5 * MIB and plan.alias_bytes == 4 * MIB
    assert 4 * MIB <= (plan.output_bytes or 0) < 4 * MIB + 4096  # the gradient and the loss
    assert report.tpu is not None and report.tpu.topology == "v5e:1x1" and report.tpu.libtpu


def _chip(case: str) -> dict[str, Any]:
    rows = (ROOT / "bench" / "data" / "tpu-v5e-chip.jsonl").read_text().splitlines()
    return next(r for r in map(json.loads, rows) if r["case"] == case)


@needs_libtpu
def test_the_fit_is_the_chips_verdict_just_under_and_just_over_its_hbm() -> None:
    """The wide MLP with AdamW at batch 65536 ran on the lent v5e (its plan 13.5 GiB) and at 98304
    was refused, "18.00G" required: `--tpu v5e` gives the same plan, the same verdict and bytes."""
    request = TpuRequest(parse_tpu("v5e"), Optimizer.ADAMW)
    under = audit_target("sample_models/mlp.py:loss", ["nothing_saveable"], defines={**WIDE, "batch": 65536},
                         tpu=request).results[0].tpu_plan
    over = audit_target("sample_models/mlp.py:loss", ["nothing_saveable"], defines={**WIDE, "batch": 98304},
                        tpu=request).results[0].tpu_plan
    ran, refused = _chip("mlp nothing_saveable b65536"), _chip("mlp nothing_saveable b98304")
    assert under is not None and under.fits is True
    assert (under.argument_bytes, under.output_bytes, under.alias_bytes, under.temp_bytes) == tuple(
        ran["plan"][f] for f in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                                 "temp_size_in_bytes"))
    assert under.plan_bytes is not None and under.plan_bytes < parse_tpu("v5e").model.usable_bytes
    assert over is not None and over.fits is False and over.required_bytes == 18 * GIB
    assert refused["verdict"] == "refused at compile" and "(18.00G)" in refused["refusal"]


@needs_libtpu
def test_a_mesh_of_four_chips_compiles_on_a_slice_of_four(model: Path) -> None:
    result = cli("model.py:loss", "-D", "batch=16", "--mesh", "data=4", "--tpu", "v5e", "-p", "none",
                 "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["tpu"]["topology"] == "v5e:2x2" and doc["tpu"]["chips"] == 4
    assert doc["results"][0]["tpu_plan"]["fits"] is True


@needs_libtpu
def test_every_format_names_the_tpu_and_stderr_stays_clean(model: Path, tmp_path: Path) -> None:
    import jsonschema

    from te_ckpt_audit.records import JSON_SCHEMA

    for fmt in ("table", "markdown", "html", "json"):
        out = tmp_path / f"r.{fmt}"
        result = cli("model.py:loss", "--tpu", "v5e", "-p", "none", "-p", "nothing_saveable", "-f", fmt,
                     "-o", str(out))
        assert result.exit_code == 0, result.stderr
        *compiles, written = result.stderr.splitlines()  # libtpu said nothing; a log shows each compile
        assert written == f"te-ckpt-audit: report written to {out}"
        assert [c.split(" in ")[0] for c in compiles] == [
            f"te-ckpt-audit: {verb} {policy} for v5e:1x1 (libtpu)"
            for policy in ("none", "nothing_saveable") for verb in ("compiling", "compiled")]
        text = out.read_text()
        assert "v5e:1x1" in text and "libtpu" in text
        if fmt == "json":
            jsonschema.validate(json.loads(text), JSON_SCHEMA)


@needs_libtpu
def test_check_gates_a_tpu_target_on_libtpus_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tpu = "v5e"` with `fit = true` in [tool.te-ckpt-audit]: the step the chip refused fails CI."""
    monkeypatch.chdir(tmp_path)
    target = ROOT / "sample_models" / "mlp.py"
    for batch, code in ((65536, 0), (98304, 1)):
        defines = ", ".join(f"{k} = {v}" for k, v in {**WIDE, "batch": batch}.items())
        (tmp_path / "pyproject.toml").write_text(
            f'[tool.te-ckpt-audit]\n[[tool.te-ckpt-audit.targets]]\ntarget = "{target}:loss"\n'
            f'defines = {{ {defines} }}\npolicies = ["nothing_saveable"]\ntpu = "v5e"\noptimizer = "adamw"\n'
            "fit = true\n")
        result = cli("check", "-f", "json")
        assert result.exit_code == code, result.stderr
        doc = json.loads(result.stdout)
        assert doc["targets"][0]["report"]["tpu"]["topology"] == "v5e:1x1"
        assert [v["figure"] for v in doc["targets"][0]["violations"]] == (["does not fit"] if code else [])


def _scan_loss(w: jax.Array, x: jax.Array, layers: int) -> jax.Array:
    """`layers` residual layers of one weight under one lax.scan: a TPU while loop with no known
    trip count, the same body whatever the count."""
    def layer(h: jax.Array, _: None) -> tuple[jax.Array, None]:
        return h + jnp.tanh(h @ w), None

    h, _ = jax.lax.scan(layer, x, None, length=layers)
    return jnp.sum(h)


def _scan_time(layers: int) -> Any:
    w = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    x = jax.ShapeDtypeStruct((2048, 512), jnp.bfloat16)  # 8 layers' residuals fit VMEM as 4 do: the same body
    report = audit(_scan_loss, w, x, layers, policies=["nothing_saveable"], params=0,
                   tpu=TpuRequest(parse_tpu("v5e"), time=True))
    time = report.results[0].time
    assert time is not None and time.seconds is not None and time.error is None, time
    return time


@needs_libtpu
def test_a_scan_of_8_layers_is_estimated_twice_a_scan_of_4() -> None:
    """libtpu's loops carry no known trip count: the estimate reads it from the loop's condition,
    so the layers' kernels count 8 times in one and 4 in the other, the rest (the step around the
    loops) once in each; the step's own cost (per step; at least the host's launch of its two
    arrays) is not the layers' work."""
    four, eight = _scan_time(4), _scan_time(8)
    work = [t.seconds - t.overhead_seconds for t in (four, eight) if t.seconds is not None]
    assert work[1] == pytest.approx(2 * work[0], rel=0.02)
    for t, w in zip((four, eight), work, strict=True):
        assert t.dispatch_seconds == pytest.approx(TPU_HOST_STEP_S + 2 * TPU_HOST_ARRAY_S)
        assert t.seconds == pytest.approx(max(w + TPU_STEP_S, t.dispatch_seconds))
    assert eight.kernels > four.kernels
    assert four.device == "chip" and four.hardware == "v5e" and four.estimator == TPU_ESTIMATOR
    assert four.peak_flops == parse_tpu("v5e").model.bf16_flops
    assert any(k.runs == 8 for k in eight.costliest) and not any(k.runs == 8 for k in four.costliest)


@needs_libtpu
def test_a_mesh_of_four_chips_adds_ici_collective_time() -> None:
    """The sample MLP's batch split over 4 chips: each chip's gradients are all-reduced over ICI,
    which the estimate times; one chip alone has no collective."""
    def time_of(*args: str) -> dict[str, Any]:
        result = cli(str(ROOT / "sample_models" / "mlp.py") + ":loss", "-D", "batch=64", "-p", "nothing_saveable",
                     "--tpu", "v5e", "--time", "-f", "json", *args)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)["results"][0]["time"]

    one, four = time_of(), time_of("--mesh", "data=4")
    assert one["communication_seconds"] == 0 and one["devices"] == 1
    assert four["communication_seconds"] > 0 and four["devices"] == 4
    assert four["seconds"] >= four["compute_seconds"]


@needs_libtpu
def test_a_step_that_does_not_fit_gets_no_time_and_says_why() -> None:
    request = TpuRequest(parse_tpu("v5e"), Optimizer.ADAMW, time=True)
    result = audit_target("sample_models/mlp.py:loss", ["nothing_saveable"], defines={**WIDE, "batch": 98304},
                          tpu=request).results[0]
    assert result.tpu_plan is not None and result.tpu_plan.fits is False
    assert result.time is not None and result.time.seconds is None
    assert result.time.error == "the step does not fit the chip's HBM"


@needs_libtpu
def test_time_on_a_tpu_is_named_per_chip_in_every_format(model: Path, tmp_path: Path) -> None:
    import jsonschema

    from te_ckpt_audit.records import JSON_SCHEMA

    for fmt in ("table", "markdown", "html", "json"):
        out = tmp_path / f"t.{fmt}"
        result = cli("model.py:loss", "--tpu", "v5e", "--time", "-p", "nothing_saveable", "-f", fmt, "-o", str(out))
        assert result.exit_code == 0, result.stderr
        text = html.unescape(out.read_text())
        if fmt == "json":
            doc = json.loads(text)
            jsonschema.validate(doc, JSON_SCHEMA)
            time = doc["results"][0]["time"]
            assert (time["device"], time["hardware"], time["estimator"]) == ("chip", "v5e", TPU_ESTIMATOR)
            assert time["model"].startswith("libtpu's estimated cycles") and time["seconds"] > 0
            # a tiny step: the host's launch of it is longer than the chip's work (issue 56, item 2)
            assert time["seconds"] == pytest.approx(time["dispatch_seconds"]) and time["dispatch_seconds"] > 2e-4
        else:
            assert "Step time on 1 x v5e: an estimate from libtpu's cycle estimates and the roofline" in text
            assert "per chip" in text and "per GPU" not in text and "XLA's cost models" not in text
            assert "the step runs at the host's pace" in " ".join(text.split())


@needs_libtpu
def test_recommend_on_a_tpu_picks_the_least_recompute_that_libtpu_takes() -> None:
    """The wide MLP at batch 49152 with AdamW: saving everything needs more HBM than the v5e has
    (the chip refused it), so the pick is a policy that recomputes, and it fits by libtpu's verdict."""
    mlp = str(ROOT / "sample_models" / "mlp.py") + ":loss"
    result = cli("recommend", mlp, *(f"-D{k}={v}" for k, v in WIDE.items()), "-D", "batch=49152",
                 "--tpu", "v5e", "--optimizer", "adamw", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["tpu"]["topology"] == "v5e:1x1" and doc["gpu"] is None
    pick = doc["recommended"]
    assert pick["peak"]["fits"] is True and pick["recompute_flops"] > 0
    refused = [c for c in doc["frontier"] if c["peak"] is not None and c["peak"]["fits"] is False]
    assert all(c["recompute_flops"] < pick["recompute_flops"] for c in refused) and refused
    assert all(c["peak"]["needed_bytes"] > parse_tpu("v5e").model.usable_bytes for c in refused)


@needs_libtpu
def test_maximize_throughput_on_a_tpu_searches_policy_and_batch_per_chip() -> None:
    result = cli("recommend", str(ROOT / "sample_models" / "mlp.py") + ":loss", "-D", "batch=4096",
                 "--tpu", "v5e", "--maximize", "throughput", "--max-compiles", "4", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    t = doc["throughput"]
    assert (t["device"], t["estimator"]) == ("chip", TPU_ESTIMATOR) and len(t["points"]) == 4
    best = t["best"]
    assert best["fits"] and best["throughput"] == max(p["throughput"] for p in t["points"] if p["fits"])
    assert best["throughput"] == pytest.approx(best["value"] / best["seconds"])
    assert doc["compiles"] == len(t["points"]) > 0  # issue 56, item 6: it said 0 for the points compiled
    text = cli("recommend", str(ROOT / "sample_models" / "mlp.py") + ":loss", "-D", "batch=4096",
               "--tpu", "v5e", "--maximize", "throughput", "--max-compiles", "4")
    assert "batch/s/chip" in text.stdout and "libtpu's cycle estimates and the roofline" in text.stdout
    assert "TPU: v5e:1x1 (1 x v5e)" in text.stdout


_OWN_STEP = """\
import jax, jax.numpy as jnp


def step(w, x):
    grads = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * grads


def step_inputs():
    return jax.ShapeDtypeStruct((1024, 1024), jnp.float32), jax.ShapeDtypeStruct((256, 1024), jnp.float32)
"""


@needs_libtpu
def test_a_training_step_of_the_users_own_compiles_as_it_is_on_a_tpu(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`--step --donate 0 --tpu v5e`: the user's step compiled by libtpu as it is (w donated and
    written in place: its 4 MiB aliased), timed; a policy other than as-is is refused per row."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "own.py").write_text(_OWN_STEP)
    result = cli("own.py:step", "--step", "--donate", "0", "--tpu", "v5e", "--time", "-f", "json")
    assert result.exit_code == 0, result.stderr
    row = json.loads(result.stdout)["results"][0]
    plan = row["tpu_plan"]
    assert plan["fits"] is True and plan["alias_bytes"] == 4 * MIB and plan["argument_bytes"] == 5 * MIB
    assert row["time"]["seconds"] > 0 and row["time"]["device"] == "chip"


_BLOCKS = """
import jax
import jax.numpy as jnp


def _conv(x, w, stride=1):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        preferred_element_type=jnp.float32).astype(x.dtype)


def _block(x, block, stride):
    h = _conv(jax.nn.relu(_conv(x, block["a"], stride)), block["b"])
    return jax.nn.relu(h + (_conv(x, block["down"], stride) if "down" in block else x))


def loss(params, images):
    x = jax.nn.relu(_conv(images, params["stem"], 2))
    for stage in params["stages"]:
        for k, b in enumerate(stage):
            block = jax.checkpoint(_block, static_argnums=(2,),
                                   policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
            x = block(x, b, 2 if k == 0 and "down" in b else 1)
    logits = jnp.mean(x.astype(jnp.float32), axis=(1, 2)) @ params["head"].astype(jnp.float32)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[:, 0])


def loss_inputs(batch=128):
    sds, bf16 = jax.ShapeDtypeStruct, jnp.bfloat16
    stages, prev = [], 64
    for i, (width, count) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        stage = []
        for k in range(count):
            b = {"a": sds((3, 3, prev, width), bf16), "b": sds((3, 3, width, width), bf16)}
            if k == 0 and i > 0:
                b["down"] = sds((1, 1, prev, width), bf16)
            stage.append(b)
            prev = width
        stages.append(stage)
    return {"stem": sds((7, 7, 3, 64), bf16), "stages": stages, "head": sds((512, 1000), bf16)}, sds(
        (batch, 64, 64, 3), bf16)
"""


def _own_plan(loss: Any, params: Any, batch: Any) -> tuple[int, int, int, int]:
    """The user's own plain step (`value_and_grad` of `loss` in `params`, optax's adamw), compiled
    deviceless for one v5e: its (argument, output, alias, temp) bytes, as a TpuPlan orders them."""
    import optax
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    update = optax.adamw(1e-3)

    def step(params: Any, batch: Any, state: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, state = update.update(grads, state, params)
        return value, optax.apply_updates(params, updates), state

    chip = topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1).devices[0]
    with jax.numpy_dtype_promotion("standard"):  # optax mixes Python scalars with its counts
        placed = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=SingleDeviceSharding(chip)),
                              (params, batch, jax.eval_shape(update.init, params)))
        own = jax.jit(step, donate_argnums=(0, 2)).lower(*placed).compile().memory_analysis()
    return (own.argument_size_in_bytes, own.output_size_in_bytes, own.alias_size_in_bytes, own.temp_size_in_bytes)


@needs_libtpu
def test_a_model_with_a_checkpoint_per_block_compiles_as_its_own_step_does(tmp_path: Path) -> None:
    """Issue 56, item 2: a ResNet as-is at batch 128 planned 32,256 B more temporaries than the chip,
    whose own plain step the deviceless compile matched. The tool compiled its analysis's function:
    a checkpoint repeated block after block made one jit call (JAX linearizes it once: the same
    residuals, sooner), which changes the program XLA compiles (this ResNet-34-shaped net with a
    checkpoint per block, as-is at batch 128 on a v5e: 516,096 B fewer temporaries than its own
    step). Now the compiled step is the function as written: its plan is the user's own step's,
    byte for byte."""
    (tmp_path / "blocks.py").write_text(_BLOCKS)
    report = audit_target(f"{tmp_path / 'blocks.py'}:loss", ["as-is"], defines={"batch": 128},
                          tpu=TpuRequest(parse_tpu("v5e"), Optimizer.ADAMW))
    plan = report.results[0].tpu_plan
    assert plan is not None and plan.fits is True
    spec = importlib.util.spec_from_file_location("blocks", tmp_path / "blocks.py")
    assert spec is not None and spec.loader is not None
    blocks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blocks)
    params, images = blocks.loss_inputs(128)
    assert (plan.argument_bytes, plan.output_bytes, plan.alias_bytes, plan.temp_bytes) == _own_plan(
        blocks.loss, params, images)


_STACK = """
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name


def make_loss(policy):
    def layer(x, w):
        h = jax.nn.gelu(checkpoint_name(x @ w["up"], "up"))
        return x + checkpoint_name(h @ w["down"], "down")

    def loss(params, x):
        for w in params:
            x = jax.checkpoint(layer, policy=policy)(x, w)
        return jnp.mean(jnp.square(x.astype(jnp.float32)))

    return loss


loss = make_loss(jax.checkpoint_policies.nothing_saveable)


def loss_inputs(layers=2, rows=4096, width=1024):
    sds, bf16 = jax.ShapeDtypeStruct, jnp.bfloat16
    return [{"up": sds((width, 4 * width), bf16), "down": sds((4 * width, width), bf16)}
            for _ in range(layers)], sds((rows, width), bf16)
"""


@needs_libtpu
def test_a_policy_the_tool_puts_in_compiles_as_the_model_written_with_it(tmp_path: Path) -> None:
    """What `--tpu` plans for a policy is what the chip would run had the user written that policy
    in their model: a stack of checkpointed layers (one checkpoint each, written with
    nothing_saveable), each policy the tool swaps in compiled as `make_loss(policy)` writes it, plans
    equal byte for byte; and the policies' plans differ (what they save is past the VMEM)."""
    (tmp_path / "stack.py").write_text(_STACK)
    spec = importlib.util.spec_from_file_location("stack", tmp_path / "stack.py")
    assert spec is not None and spec.loader is not None
    stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stack)
    written = {"checkpoint_dots": jax.checkpoint_policies.checkpoint_dots,
               "nothing_saveable": jax.checkpoint_policies.nothing_saveable}
    report = audit_target(f"{tmp_path / 'stack.py'}:loss", list(written), tpu=TpuRequest(parse_tpu("v5e"),
                                                                                          Optimizer.ADAMW))
    temps = []
    for row, policy in zip(report.results, written.values(), strict=True):
        plan = row.tpu_plan
        assert plan is not None and plan.fits is True
        assert (plan.argument_bytes, plan.output_bytes, plan.alias_bytes, plan.temp_bytes) == _own_plan(
            stack.make_loss(policy), *stack.loss_inputs()), row.policy
        temps.append(plan.temp_bytes)
    assert temps[0] > temps[1] > 0, temps  # checkpoint_dots saves more: the swap is seen


@needs_libtpu
def test_sgd_compiles_no_state_and_momentum_one_buffer_and_the_report_says_which() -> None:
    """Issue 56, item 1: `sgd` compiled SGD with momentum 0.9, a state the size of the parameters that
    the chip refused on steps whose plain SGD ran. Now the plan's arguments grow by exactly the state
    the report names: none for sgd, w's 4 MiB for momentum, two moments and a count for adamw."""
    w, x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32), jax.ShapeDtypeStruct((256, 1024), jnp.float32)
    grown = {}
    for name in (None, "sgd", "momentum", "adamw"):
        report = audit(_matmul, w, x, policies=["nothing_saveable"], params=0,
                       tpu=TpuRequest(parse_tpu("v5e"), optimizer=name))  # type: ignore[arg-type]
        plan = report.results[0].tpu_plan
        assert plan is not None and plan.argument_bytes is not None and report.step is not None
        assert report.step.optimizer == name
        grown[name] = (plan.argument_bytes - 5 * MIB, report.step.state_bytes)
    adamw = grown.pop("adamw")
    assert grown == {None: (0, None), "sgd": (0, 0), "momentum": (4 * MIB, 4 * MIB)}
    assert adamw[1] == 8 * MIB + 4 and 8 * MIB + 4 <= adamw[0] <= 8 * MIB + 4096  # the count padded to a tile


_HOLDER = """
import os, sys, time
os.environ.update(TPU_ACCELERATOR_TYPE="v5litepod-1", TPU_WORKER_HOSTNAMES="localhost", TPU_SKIP_MDS_QUERY="1")
import jax
jax.config.update("jax_platforms", "cpu")
from jax.experimental import topologies
try:
    topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
                                 chips_per_host_bounds=(1, 1, 1), num_slices=1)
except Exception as exc:  # the test's own process already holds it (it loaded libtpu before)
    print("held" if "lockfile" in str(exc) else repr(exc), flush=True)
    sys.exit(0)
print("held", flush=True)
time.sleep(120)
"""


def _env_without_libtpu_leave() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ALLOW_MULTIPLE_LIBTPU_LOAD", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = str(ROOT)
    return env


@needs_libtpu
def test_two_tpu_runs_at_once_on_one_machine(tmp_path: Path) -> None:
    """Issue 56, item 3: with another process holding libtpu (a notebook, a second CI job), --tpu
    failed with libtpu's "sudo rm /tmp/libtpu_lockfile" and a hint about slice shapes. The command
    line compiles beside it; the library, whose process it does not own, says what to set."""
    import subprocess
    import sys

    env = _env_without_libtpu_leave()
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        command = [sys.executable, "-m", "te_ckpt_audit_cli", str(ROOT / "sample_models/mlp.py") + ":loss",
                   "--tpu", "v5e", "-p", "nothing_saveable", "--format", "json"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["results"][0]["tpu_plan"]["fits"] is True
        library = ("from te_ckpt_audit import audit_target, UsageError\n"
                   "from te_ckpt_audit.tpus import TpuRequest, parse_tpu\n"
                   "try:\n"
                   f"    audit_target({str(ROOT / 'sample_models/mlp.py')!r} + ':loss', ['none'],"
                   " tpu=TpuRequest(parse_tpu('v5e')))\n"
                   "except UsageError as e:\n"
                   "    print(e.message); print(e.hint)\n")
        said = subprocess.run([sys.executable, "-c", library], env=dict(env, JAX_PLATFORMS="cpu"),
                              capture_output=True, text=True, timeout=300, cwd=tmp_path).stdout.splitlines()
        assert said[0] == "libtpu is in use by another process: it refuses a second one on this machine"
        assert "ALLOW_MULTIPLE_LIBTPU_LOAD=1" in said[1] and "slice" not in said[1]
    finally:
        holder.kill()
        holder.communicate()


@needs_libtpu
@pytest.mark.parametrize(("made", "why"), [
    (lambda p: p.write_bytes(b"hello"), "it is not a shared library (no ELF header)"),
    (lambda p: p.write_bytes(b"\x7fELF\x02\x01" + bytes(12) + b"\xb7\x00" + bytes(44)),
     "it is built for another machine (ELF machine 183, not x86-64)"),
    ("truncated", "it is cut short"),
])
def test_a_libtpu_that_cannot_load_is_said_to_be_libtpus_problem(made: Any, why: str, tmp_path: Path) -> None:
    """A truncated libtpu.so ended the process with SIGBUS (exit 135, no word); a foreign one got the
    hint about slice shapes."""
    import subprocess
    import sys

    from te_ckpt_audit.targets._tpu import libtpu_file

    library = tmp_path / "libtpu.so"
    if made == "truncated":
        real = libtpu_file()
        assert real is not None
        with real.open("rb") as f:
            library.write_bytes(f.read(1 << 20))
    else:
        made(library)
    command = [sys.executable, "-m", "te_ckpt_audit_cli", str(ROOT / "sample_models/mlp.py") + ":loss",
               "--tpu", "v5e", "-p", "nothing_saveable"]
    done = subprocess.run(command, env=dict(_env_without_libtpu_leave(), TPU_LIBRARY_PATH=str(library)),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"te-ckpt-audit: error: libtpu at {library} cannot be loaded: {why}")
    assert done.stderr.count("\n") == 1 and "TPU_LIBRARY_PATH" in done.stderr


@needs_libtpu
def test_synthesize_makes_a_policy_from_the_names_and_compiles_every_point_on_libtpu() -> None:
    """Issue 58: the pick is made from the model's checkpoint names with the batch, each point
    libtpu's own compile; the presets compiled beside it; what to paste in JSON."""
    from te_ckpt_audit import recommend_target
    from te_ckpt_audit.render.recommend import render_recommend_json

    rec = recommend_target("sample_models/llama.py:loss", tpu=TpuRequest(parse_tpu("v5e"), Optimizer.ADAMW),
                           maximize="throughput", synthesize=True, max_compiles=10)
    t = rec.throughput
    assert t is not None and t.synthesis is not None and t.keyword == "per_device_batch"  # the one batch keyword
    assert {n.name for n in t.synthesis.names} == set(rec.names) and rec.names
    assert t.best is not None and t.best.fits and t.best in t.points and len(t.points) <= 10
    assert all(p.policy in rec.presets or p.policy.startswith("save_only_these_names:") for p in t.points)
    doc = json.loads(render_recommend_json(rec))
    assert doc["throughput"]["pick"]["cli"] == f"--policy {t.best.policy} -D per_device_batch={t.best.value}"
    assert doc["throughput"]["synthesis"]["solver"].startswith("exact 0/1 knapsack")



@needs_libtpu
def test_synthesize_under_no_presets_compiles_no_preset_and_picks_names() -> None:
    """`--no-presets` ("search name subsets only") with --synthesize compiled every preset beside
    the pick and answered one (everything_saveable): the presets it searched are none, none is
    compiled, and the pick is the model's names."""
    result = cli("recommend", "sample_models/gpt.py:loss", "-D", "layers=2", "-D", "seq=128", "-D", "d_model=128",
                 "-D", "batch=8", "--tpu", "v5e", "--maximize", "throughput", "--synthesize", "--no-presets",
                 "--max-compiles", "6", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    t = doc["throughput"]
    assert doc["presets"] == [] and t["synthesis"]["presets"] == []
    assert {p["policy"] for p in t["points"]} <= {"nothing_saveable"} | {
        p["policy"] for p in t["points"] if p["policy"].startswith("save_only_these_names:")}
    assert t["best"]["policy"] != "everything_saveable" and 0 < len(t["points"]) <= 6


@needs_libtpu
def test_synthesize_names_the_matmul_lines_of_a_model_that_names_nothing_and_says_what_to_paste() -> None:
    """Issue 58, items 1 and 3: a GPT without one checkpoint_name; the tool names its matmul lines,
    the search decides on them on libtpu, and the JSON says the calls to add, file and line."""
    result = cli("recommend", "sample_models/gpt.py:loss", "-D", "named=false", "-D", "layers=2", "-D", "seq=128",
                 "-D", "d_model=128", "-D", "batch=8", "--tpu", "v5e", "--maximize", "throughput", "--synthesize",
                 "--max-compiles", "8", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    names = doc["throughput"]["synthesis"]["names"]
    assert names and all(n["name"] == "gpt_" + n["line"].rsplit(":", 1)[1] for n in names)
    source = Path("sample_models/gpt.py").read_text().splitlines()
    made = [source[int(n["line"].rsplit(":", 1)[1]) - 1] for n in names]
    assert all("@" in line or "einsum" in line for line in made), made
    pick = doc["throughput"]["pick"]
    saved = {n["name"] for n in names} & set(pick["cli"].split()[1].partition(":")[2].split("+")[0].split(","))
    assert [a["at"] for a in pick["add"]] == sorted(n["line"] for n in names if n["name"] in saved)
    assert pick["cli"].endswith(" --name-lines") == bool(saved)


@needs_libtpu
def test_an_offloading_step_on_a_v5e_is_timed_as_the_chip_ran_it() -> None:
    """Issue 58: the lent v5e ran a 6-layer GPT step (batch 8) 3.1x slower offloading its five names
    than saving them, and 1.8x with ffn1 alone (bench/data/tpu-v5e-host.jsonl); libtpu's estimate had
    both as fast as saving. Compiled here for the same chip, each is within 5% of the chip's time,
    its copies over the v5e's host link (out and back: twice the host bytes)."""
    rows = [json.loads(line) for line in (ROOT / "bench/data/tpu-v5e-host.jsonl").read_text().splitlines()]
    chip = {r["policy"]: r for r in rows if r["study"] == "offload"}
    policies = [p for p in chip if p.startswith("save_and_offload")]
    defines = {k: str(v) for k, v in chip[policies[0]]["defines"].items()}
    report = audit_target(str(ROOT / "sample_models/gpt.py") + ":loss", policies, defines=defines,
                          tpu=TpuRequest(parse_tpu("v5e"), Optimizer.ADAMW, time=True))
    for r in report.results:
        t = r.time
        assert t is not None and t.seconds is not None and t.host_link == 14e9
        assert t.host_seconds == pytest.approx(2 * r.totals.host_bytes / 14e9, rel=0.01)
        assert t.seconds == pytest.approx(chip[r.policy]["seconds_per_step"], rel=0.05), r.policy
