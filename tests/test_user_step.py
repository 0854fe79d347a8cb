"""The GPU answer is about the step the user runs (issue 26): the trained arguments alone get
gradients, donation and optimizer state; the step is written over the user's own pytrees; the
user's own step compiles; the run's environment (XLA_FLAGS, the memory fraction) is read and its
least fraction reported; the compile cache and the worker processes cannot lie.

Each test names the finding of the issue it answers. The ones that compile need the [gpu] extra
(they skip elsewhere, and fail in the gpu-target lane where it is missing)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _gpu_lane import STACK_ARGS as STACK
from _gpu_lane import cli, compiles
from _gpu_lane import stack as _stack

from te_ckpt_audit import UsageError, audit, audit_target
from te_ckpt_audit._jax_compat import saved_residuals
from te_ckpt_audit.baselines import audit_key
from te_ckpt_audit.gating import check
from te_ckpt_audit.gpus import (
    Allocator,
    FractionSource,
    GpuEnvironment,
    GpuRequest,
    Optimizer,
    gpu_environment,
    gpu_model,
    least_fraction,
    model_of_config,
    xla_flags,
)
from te_ckpt_audit.records import Baseline, Candidate, CandidateKind, Figure, PeakMemory, Recommendation
from te_ckpt_audit.targets import Compiled
from te_ckpt_audit.targets._cache import CompileCache, Measured

CNN = """\
import jax, jax.numpy as jnp


def loss(params, images, labels):
    x = images
    for i in range(2):
        x = jax.lax.conv_general_dilated(x, params[f"conv{i}"], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        x = jax.nn.relu(x * jnp.sin(images[..., :1]))
    logits = x.mean(axis=(1, 2)) @ params["head"]
    return jnp.mean((logits - labels) ** 2)


def loss_inputs(batch: int = 8):
    f32 = jnp.float32
    params = {"conv0": jax.ShapeDtypeStruct((3, 3, 4, 16), f32), "conv1": jax.ShapeDtypeStruct((3, 3, 16, 4), f32),
              "head": jax.ShapeDtypeStruct((4, 10), f32)}
    return params, jax.ShapeDtypeStruct((batch, 16, 16, 4), f32), jax.ShapeDtypeStruct((batch, 10), f32)
"""


def _nbytes(avals: Any) -> int:
    return sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(avals))


def _truth(fn: Any, args: tuple[Any, ...], trained: set[int]) -> Counter[tuple[tuple[int, ...], str]]:
    """JAX's own residuals of `fn` trained in `trained` only: the others enter under stop_gradient,
    so JAX's linearization treats them as known, as `jax.grad(loss)(params, batch)` does."""

    def partial(*xs: Any) -> Any:
        return fn(*(x if i in trained else jax.tree.map(jax.lax.stop_gradient, x) for i, x in enumerate(xs)))

    return Counter((tuple(a.shape), str(a.dtype)) for a, src in saved_residuals(partial, *args)
                   if src != "from a literal")


# --- trained arguments (finding 2), everywhere --------------------------------------------------------


@pytest.fixture()
def cnn(tmp_path: Path) -> Path:
    (tmp_path / "cnn.py").write_text(CNN)
    return tmp_path / "cnn.py"


def test_a_target_trains_its_first_argument_and_residuals_stay_jaxs(cnn: Path) -> None:
    """Finding 2: the data batch (float images) is not differentiated; what JAX keeps for
    `jax.grad(loss)(params, images, labels)` is what the audit reports, to the residual."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cnn_model", cnn)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = module.loss_inputs()
    for params, trained in ((None, {0}), ("all", {0, 1, 2}), ([1], {1}), (["params", "labels"], {0, 2})):
        report = audit_target(f"{cnn}:loss", ["none", "nothing_saveable", "everything_saveable"], params=params)
        assert report.trained is not None
        assert report.trained.convention is (params is None)
        for r in report.results:
            ours = Counter((tuple(x.shape), str(x.dtype)) for x in r.residuals)
            policy = {"none": None, "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
                      "everything_saveable": jax.checkpoint_policies.everything_saveable}[r.policy]
            fn = module.loss if policy is None else jax.checkpoint(module.loss, policy=policy)
            assert ours == _truth(fn, args, trained), (params, r.policy)
    default = audit_target(f"{cnn}:loss", ["none"])
    assert default.trained is not None and default.trained.arguments == (0,)
    assert default.trained.inputs == ("args[0]['conv0']", "args[0]['conv1']", "args[0]['head']")
    everything = audit_target(f"{cnn}:loss", ["none"], params="all")
    assert everything.result("none").totals.argument_bytes > default.result("none").totals.argument_bytes


def test_a_function_is_differentiated_as_saved_residuals_does_unless_told() -> None:
    f = lambda p, x: jnp.sum(jnp.tanh(jnp.sin(x) @ p))  # noqa: E731
    args = (jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((3, 4), jnp.float32))
    everything = audit(f, *args, policies=["none"])
    assert everything.trained is not None and everything.trained.arguments is None
    assert Counter((tuple(r.shape), r.dtype) for r in everything.result("none").residuals) == _truth(f, args, {0, 1})
    first = audit(f, *args, policies=["none"], params=0)
    assert Counter((tuple(r.shape), r.dtype) for r in first.result("none").residuals) == _truth(f, args, {0})


@pytest.mark.parametrize("given, says", [
    (["--params", "3"], "--params 3: "),
    (["--params", "batch"], "has no positional parameter 'batch'"),
    (["--params", "all", "--params", "0"], "takes no other argument"),
    (["--params", "-1"], "a position is 0 or more"),
])
def test_bad_params_are_one_line_and_exit_2(cnn: Path, given: list[str], says: str) -> None:
    run = cli(f"{cnn}:loss", "-p", "none", *given)
    assert run.returncode == 2 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_an_argument_with_no_float_array_cannot_be_trained(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def loss(w, tokens):\n    return jnp.sum(w[tokens])\n"
        "def loss_inputs():\n"
        "    return jax.ShapeDtypeStruct((8, 4), jnp.float32), jax.ShapeDtypeStruct((3,), jnp.int32)\n"
    )
    run = cli("m.py:loss", "-p", "none", "--params", "tokens", cwd=tmp_path)
    assert run.returncode == 2 and "holds no float array to train" in run.stderr, run.stderr


def test_pyproject_takes_params(tmp_path: Path) -> None:
    from te_ckpt_audit.config import load_config

    (tmp_path / "pyproject.toml").write_text(
        '[tool.te-ckpt-audit]\n[[tool.te-ckpt-audit.targets]]\ntarget = "m.py:loss"\nparams = [0, "state"]\n'
        '[[tool.te-ckpt-audit.targets]]\ntarget = "m.py:other"\nparams = "all"\n')
    first, second = load_config(tmp_path / "pyproject.toml").targets
    assert first.params == (0, "state") and second.params == "all"
    (tmp_path / "pyproject.toml").write_text('[tool.te-ckpt-audit]\n[[tool.te-ckpt-audit.targets]]\n'
                                             'target = "m.py:loss"\nparams = 0\n')
    with pytest.raises(UsageError, match="params must be a list"):
        load_config(tmp_path / "pyproject.toml")
    assert audit_key("m.py:loss", params=(0, "state")).params == "0,state"
    assert audit_key("m.py:loss").params is None


# --- the run's environment (findings 1 and 5), everywhere -------------------------------------------


def test_the_fraction_and_allocator_are_read_as_jax_reads_them() -> None:
    """Finding 1: MaxText's 7B recipe exports XLA_PYTHON_CLIENT_MEM_FRACTION=0.85; the tool used
    0.75 whatever the run set."""
    env = gpu_environment({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".85", "XLA_FLAGS": " --xla_foo=1 "})
    assert (env.mem_fraction, env.fraction_source, env.fraction_variable) == (
        0.85, FractionSource.ENVIRONMENT, "XLA_PYTHON_CLIENT_MEM_FRACTION")
    assert env.xla_flags == "--xla_foo=1"
    assert gpu_environment({"XLA_CLIENT_MEM_FRACTION": "0.9"}).fraction_variable == "XLA_CLIENT_MEM_FRACTION"
    assert gpu_environment({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".85"}, 0.6).fraction_source is FractionSource.GIVEN
    assert gpu_environment({}).fraction_source is FractionSource.DEFAULT and gpu_environment({}).mem_fraction == 0.75
    odd = gpu_environment({"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"})
    assert odd.preallocate is False and odd.allocator is Allocator.PLATFORM
    for bad, says in (({"XLA_PYTHON_CLIENT_MEM_FRACTION": "lots"}, "is not a number"),
                      ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"}, "is not in"),
                      ({"XLA_CLIENT_MEM_FRACTION": ".8", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".8"}, "both"),
                      ({"XLA_PYTHON_CLIENT_ALLOCATOR": "magic"}, "not an allocator")):
        with pytest.raises(UsageError, match=says):
            gpu_environment(bad)
    assert xla_flags("--a=1 --b") == (("a", "1"), ("b", "true"))


def test_the_least_fraction_and_what_a_run_can_set() -> None:
    h100 = GpuRequest(gpu_model("h100"))
    memory = h100.model.memory_bytes
    assert least_fraction(int(0.803 * memory), memory) == 0.81
    assert least_fraction(int(0.80 * memory), memory) == 0.80
    assert h100.max_fraction(1) == math.floor(100 * (memory - 2**30) / memory) / 100 == 0.98
    assert h100.max_fraction(8) == 0.97
    # XLA plans against the allocator's limit on a real GPU; a topology compile takes 80% of the
    # memory it is told: it is told 0.85 / 0.8 of it
    assert math.floor(h100.planning_memory(0.85) * 80 / 100) in (int(0.85 * memory), int(0.85 * memory) + 1)
    platform = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(allocator=Allocator.PLATFORM))
    assert platform.planning_memory(0.85) == memory and platform.usable_bytes == memory - 2**30


def test_fraction_advice_in_words() -> None:
    from te_ckpt_audit.records import AuditReport, GpuInfo, PolicyResult, Scope, Totals
    from te_ckpt_audit.render._common import fraction_advice

    gpu = GpuInfo("h100-sxm", 80 * 2**30, 60 * 2**30, 8, 0.75, "default", None, 0.97, 2 * 2**30)

    def row(peak: int, least: float | None, fits: bool) -> PolicyResult:
        p = PeakMemory(peak, peak, 0, 0, 0, 0, fits, False, None, 1.0, least_fraction=least)
        return PolicyResult("minimal", Scope.INNER, (), Totals(0, 0, 0, 0, 0, 0, 0, 0), (), 0, 0, (), peak=p)

    report = AuditReport("t", (), "0", "none", (), (), gpu=gpu)  # type: ignore[arg-type]
    assert fraction_advice(report, row(66 * 2**30, 0.83, False)) == (
        "minimal: does not fit at 0.75 (JAX's default); needs 0.83 of 80 GiB: set XLA_PYTHON_CLIENT_MEM_FRACTION=0.85")
    assert "does not fit at any fraction: it needs 86 GiB" in (fraction_advice(report, row(86 * 2**30, None, False))
                                                              or "")
    assert fraction_advice(report, row(10 * 2**30, 0.13, True)) == (
        "minimal: fits at 0.75 (JAX's default); needs 0.13 of 80 GiB")


# --- a cache that cannot lie (finding 5), everywhere ----------------------------------------------------

GOOD = Measured(argument=1000, output=900, alias=800, temp=5000, peak=6000, remat=0, seconds=1.5)


@pytest.mark.parametrize("field, value", [
    ("peak", 0.5), ("peak", -5), ("peak", True), ("peak", "x"), ("peak", None), ("peak", [1]), ("peak", {}),
    ("seconds", float("nan")), ("peak", 2**70), ("alias", 10**6), ("key", "another"), ("schema", "old"),
    ("extra", 1),
])
def test_a_planted_entry_is_a_miss(tmp_path: Path, field: str, value: Any) -> None:
    cache = CompileCache(tmp_path / "c")
    cache.write("k", GOOD)
    assert cache.read("k") == GOOD
    entry = tmp_path / "c" / "k.json"
    doc = json.loads(entry.read_text())
    doc[field] = value
    entry.write_text(json.dumps(doc))
    assert cache.read("k") is None


@pytest.mark.parametrize("text", ['{"peak": NaN}', '{"peak": 1e400}', "[" * 100000, "{" + '"a": 1,' * 10000 + "}",
                                  "not json", ""])
def test_a_malformed_entry_is_a_miss(tmp_path: Path, text: str) -> None:
    (tmp_path / "c").mkdir(mode=0o700)
    (tmp_path / "c" / "k.json").write_text(text)
    assert CompileCache(tmp_path / "c").read("k") is None


def test_only_a_private_regular_file_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    cache = CompileCache(folder)
    cache.write("k", GOOD)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    entry = folder / "k.json"
    text = entry.read_text()
    entry.unlink()
    os.mkfifo(entry)  # reading a FIFO would wait for a writer forever
    assert cache.read("k") is None
    entry.unlink()
    entry.symlink_to("/dev/zero")  # a link is never followed
    assert cache.read("k") is None
    entry.unlink()
    entry.write_text(text + " " * 20000)  # over the bound
    assert cache.read("k") is None
    entry.write_text(text)
    assert cache.read("k") == GOOD
    folder.chmod(0o777)  # a folder anyone may write into: nothing in it is trusted, nothing written
    assert cache.read("k") is None
    folder.chmod(0o700)
    if os.getuid() == 0:  # another user's entry
        os.chown(entry, 12345, 12345)
        assert cache.read("k") is None
        os.chown(entry, 0, 0)
    cache.write("k", GOOD)
    assert cache.read("k") == GOOD


# --- --gpu-config as protobuf text format (finding 9), everywhere -----------------------------------------


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpu.txtpb"
    path.write_text(text)
    return path


def test_any_layout_of_a_config_is_read(tmp_path: Path) -> None:
    h100 = gpu_model("h100")
    one_line = " ".join(h100.config_text().split())
    assert model_of_config(_config(tmp_path, one_line)).sms == 132
    swapped = h100.config_text().replace("major: 9\n    minor: 0", "minor: 0 major: 9")
    assert model_of_config(_config(tmp_path, swapped)).compute_capability == (9, 0)
    angled = h100.config_text().replace("gpu_device_info {", "# XLA's H100\ngpu_device_info: <", 1)
    angled = angled.replace("memory_bandwidth: 3352320000000\n}\n", "memory_bandwidth: 3352320000000;\n>\n", 1)
    assert model_of_config(_config(tmp_path, angled)).bandwidth == 3352320000000


@pytest.mark.parametrize("change, says", [
    (lambda t: t.replace("core_count: 132", "core_count: 132 core_count: 0"), "core_count is given twice"),
    (lambda t: t.replace("core_count: 132", "core_count: 132\n  sm_magic: 3"),
     "unknown field 'gpu_device_info.sm_magic'"),
    (lambda t: t.replace("device_memory_size: 84942979072", "device_memory_size: 8.5e10"), "is an integer"),
    (lambda t: t.replace("major: 9", "major: 1"), "older than XLA:GPU compiles for"),
    (lambda t: t.replace("clock_rate_ghz: 1.98", "clock_rate_ghz: 1e999"), "a finite number is needed"),
    (lambda t: t.replace("l2_cache_size: 52428800", "l2_cache_size: 99999999999999999999999"), "out of range"),
    (lambda t: t.replace("threads_per_block_limit: 1024", "threads_per_block_limit: -4"), "never negative"),
    (lambda t: t.replace("core_count: 132", "core_count: 0"), "core_count must be positive"),
])
def test_a_config_that_is_not_a_gpu_is_refused(tmp_path: Path, change: Any, says: str) -> None:
    with pytest.raises(UsageError, match=says.replace("(", r"\(").replace(")", r"\)")):
        model_of_config(_config(tmp_path, change(gpu_model("h100").config_text())))


def test_a_missing_config_is_exit_2(tmp_path: Path) -> None:
    run = cli("sample_models/mlp.py:loss", "--gpu-config", str(tmp_path / "nope.txtpb"))
    assert run.returncode == 2 and "no GPU config file" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    (tmp_path / "pyproject.toml").write_text('[tool.te-ckpt-audit]\n[[tool.te-ckpt-audit.targets]]\n'
                                             'target = "m.py:loss"\ngpu_config = "nope.txtpb"\n')
    run = cli("check", "--config", str(tmp_path / "pyproject.toml"))
    assert run.returncode == 2 and "no GPU config file" in run.stderr, run.stderr


# --- recommend without the false assumption (finding 7), baselines (finding 10), everywhere -------------


class _FakeSession:
    """A session whose compiled peaks are given: saving less does not always peak lower."""

    def __init__(self, peaks: dict[str, int], usable: int) -> None:
        self.peaks_by_policy, self.usable, self.asked = peaks, usable, []
        self.devices = 1

    def prepare(self, *_: Any) -> None:
        return None

    def target_info(self, request: GpuRequest) -> dict[str, Any]:
        from te_ckpt_audit.targets import gpu_info

        return {"gpu": gpu_info(request)}

    def timed(self, *_: Any) -> None:
        return None

    def compiled(self, specs: Any, *_: Any) -> dict[str, Compiled]:
        out = {}
        for s in specs:
            self.asked.append(s.text)
            b = self.peaks_by_policy[s.text]
            out[s.text] = Compiled(PeakMemory(b, b, 0, 0, 0, 0, b <= self.usable, False, None, 0.0), None)
        return out


def test_recommend_compiles_in_order_of_recompute_until_one_fits() -> None:
    """Finding 7: nothing_saveable keeps the fewest activation bytes and peaks highest (a
    checkpoint around a whole scanned loss): bisection over the frontier skipped the one that fits."""
    from te_ckpt_audit.search._fit import fit_on_gpu

    frontier = [
        ("everything_saveable", 900, 0, 5000), ("checkpoint_dots", 500, 10, 4000),
        ("save_only_these_names:a", 300, 20, 1000), ("nothing_saveable", 0, 90, 6000),
    ]
    points = tuple(Candidate(p, CandidateKind.PRESET, p, (), (), act, 0, flops, 100, True)
                   for p, act, flops, _ in frontier)
    rec = Recommendation("t", 10**6, None, (), (), False, 64, points[0], None, points, points, None)  # type: ignore[arg-type]
    session = _FakeSession({p: peak for p, _, _, peak in frontier}, usable=1500)
    found = fit_on_gpu(session, rec, GpuRequest(gpu_model("h100")), max_compiles=8)  # type: ignore[arg-type]
    assert found.recommended is not None and found.recommended.policy == "save_only_these_names:a"
    assert session.asked == ["everything_saveable", "checkpoint_dots", "save_only_these_names:a"]
    wide = _FakeSession(session.peaks_by_policy, usable=1500)
    fit_on_gpu(wide, rec, GpuRequest(gpu_model("h100")), max_compiles=2, jobs=2)  # type: ignore[arg-type]
    assert wide.asked == ["everything_saveable", "checkpoint_dots"]  # bounded, a batch of two at once


def test_a_baseline_saved_without_a_gpu_gates_a_gpu_audit(tmp_path: Path) -> None:
    """Finding 10: the same audit with --gpu found no entry ("not in baseline", exit 0)."""
    report = audit_target("sample_models/mlp.py:loss", ["nothing_saveable", "checkpoint_dots"])
    saved = Baseline({audit_key("sample_models/mlp.py:loss"): {"nothing_saveable": 0, "checkpoint_dots": 100}})
    on_gpu = audit_key("sample_models/mlp.py:loss", gpu=GpuRequest(gpu_model("h100"), Optimizer.ADAMW))
    older = Baseline({dataclasses.replace(on_gpu, gpu="h100-sxm+adamw"): {"nothing_saveable": 0,
                                                                         "checkpoint_dots": 100}})
    for baseline in (saved, older):
        result = check(report, (), None, baseline.figures(on_gpu), 0.0, True)
        assert [v.figure for v in result.violations] == [Figure.GROWTH] and not result.not_in_baseline


def test_jobs_without_a_gpu_is_refused() -> None:
    run = cli("sample_models/mlp.py:loss", "--jobs", "2")
    assert run.returncode == 2 and "--jobs is about the step compiled for a GPU" in run.stderr


# --- compiled: the user's step (findings 2, 3, 4) ----------------------------------------------------------


def _topology_compile(fn: Any, args: tuple[Any, ...], donate: tuple[int, ...], request: GpuRequest,
                      options: dict[str, Any]) -> Any:
    """An independent compile: the user's step, written the usual way, lowered for the same GPU
    the tool describes to XLA (at the run's fraction) and compiled."""
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    from te_ckpt_audit._jax_compat import cuda_topology

    topology = cuda_topology(request.model.config_text(request.planning_memory(request.mem_fraction)), "1x1x1")
    mesh = topologies.make_mesh(topology, (1,), ("gpu",))
    replicated = NamedSharding(mesh, PartitionSpec())
    placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), args)
    with jax.numpy_dtype_promotion("standard"):
        lowered = jax.jit(fn, donate_argnums=donate).lower(*placed)
    return lowered.compile(compiler_options=options).memory_analysis()


def _wide(params: dict[str, Any], x: jax.Array) -> jax.Array:
    for i in range(12):
        x = jnp.tanh(x @ params[f"layer{i}"]["w"] + params[f"layer{i}"]["b"])
    return jnp.mean(x**2)


WIDE = ({f"layer{i}": {"w": jax.ShapeDtypeStruct((256 + 32 * (i % 3), 256 + 32 * ((i + 1) % 3)), jnp.float32),
                       "b": jax.ShapeDtypeStruct((256 + 32 * ((i + 1) % 3),), jnp.float32)} for i in range(12)},
        jax.ShapeDtypeStruct((512, 256), jnp.float32))


@compiles
def test_the_step_is_written_over_the_users_pytrees() -> None:
    """Finding 3: the step over a flattened {"0", "1", "10", ...} dict peaked 13-14% below the step
    written the usual way; now the tool's peak is an independent compile of the usual step."""
    import optax

    request = GpuRequest(gpu_model("h100"), Optimizer.ADAMW)
    report = audit(_wide, *WIDE, policies=["none"], gpu=request, params=0)
    peak = report.results[0].peak
    assert peak is not None and peak.error is None, peak
    tx = optax.adamw(1e-3)

    def step(params: Any, x: Any, state: Any) -> Any:
        value, grads = jax.value_and_grad(_wide)(params, x)
        updates, state = tx.update(grads, state, params)
        return value, optax.apply_updates(params, updates), state

    state = jax.eval_shape(tx.init, WIDE[0])
    plans = [_topology_compile(step, (*WIDE, state), (0, 2), request, options)
             for options in ({}, {"xla_gpu_enable_triton_gemm": False})]
    assert {peak.bytes_per_device, peak.bytes_per_device_min} == {p.peak_memory_in_bytes for p in plans}
    params = _nbytes(WIDE[0])
    assert peak.argument_bytes == 3 * params + 4 + _nbytes(WIDE[1]) and peak.alias_bytes == 3 * params + 4


@compiles
def test_a_data_batch_gets_no_gradient_or_optimizer_state(cnn: Path) -> None:
    """Finding 2: the CNN's images got gradients and two adamw moments."""
    run = cli(f"{cnn}:loss", "--gpu", "h100", "--optimizer", "adamw", "-p", "nothing_saveable", "-f", "json",
              env={"TE_CKPT_AUDIT_CACHE": str(cnn.parent / "cache")})
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    peak = doc["results"][0]["peak"]
    params = (3 * 3 * 4 * 16 + 3 * 3 * 16 * 4 + 4 * 10) * 4
    batch = (8 * 16 * 16 * 4 + 8 * 10) * 4
    assert (peak["argument_bytes"], peak["alias_bytes"]) == (3 * params + 4 + batch, 3 * params + 4)
    assert doc["step"]["donated"] == ["args[0]['conv0']", "args[0]['conv1']", "args[0]['head']"]
    assert doc["trained"]["arguments"] == [0]


OWN_STEPS = """\
import jax, jax.numpy as jnp, optax

tx = optax.adamw(1e-3)


def _loss(params, x):
    return jnp.mean(jnp.tanh(x @ params["w"]) ** 2)


def step(params, opt_state, x):
    grads = jax.grad(_loss)(params, x)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def step_inputs():
    params = {"w": jax.ShapeDtypeStruct((256, 256), jnp.float32)}
    return params, jax.eval_shape(tx.init, params), jax.ShapeDtypeStruct((64, 256), jnp.float32)


def flax_step(state, x):
    grads = jax.grad(lambda p: _loss(p, x))(state.params)
    return state.apply_gradients(grads=grads)


def flax_step_inputs():
    from flax.training import train_state
    params = {"w": jnp.zeros((256, 256), jnp.float32)}
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") else a, state)
    return shapes, jax.ShapeDtypeStruct((64, 256), jnp.float32)


def eqx_step(model, opt_state, x):
    import equinox as eqx
    grads = eqx.filter_grad(lambda m: jnp.mean(jax.vmap(m)(x) ** 2))(model)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state


def eqx_step_inputs():
    import equinox as eqx
    model = eqx.nn.MLP(256, 256, 256, 1, key=jax.random.key(0))
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if eqx.is_array(a) else a, model)
    state = jax.eval_shape(tx.init, eqx.filter(model, eqx.is_array))
    return shapes, state, jax.ShapeDtypeStruct((64, 256), jnp.float32)
"""


@compiles
@pytest.mark.parametrize("name, donate", [("step", ["0", "1"]), ("flax_step", ["0"]), ("eqx_step", ["0", "1"])])
def test_the_users_own_training_step_compiles(tmp_path: Path, name: str, donate: list[str]) -> None:
    """Finding 4: every real optax step was refused ("returns int32, not differentiable")."""
    if name == "eqx_step":
        pytest.importorskip("equinox")
    (tmp_path / "steps.py").write_text(OWN_STEPS)
    run = cli(f"steps.py:{name}", "--gpu", "h100", "--step", *[a for d in donate for a in ("--donate", d)],
              "-f", "json", cwd=tmp_path, env={"TE_CKPT_AUDIT_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    (result,) = doc["results"]
    peak = result["peak"]
    assert result["audited"] is False and peak["error"] is None and doc["step"]["own"] is True
    w = 256 * 256 * 4
    floats = {"step": 3 * w, "flax_step": 3 * w, "eqx_step": 3 * (w + 256 * 4) * 2}[name]
    assert peak["alias_bytes"] >= floats  # the parameters and both moments are written in place
    assert peak["argument_bytes"] >= floats + 64 * 256 * 4


# --- compiled: the run's environment (findings 1, 5, 8) ------------------------------------------------------


def _small_gpu(tmp_path: Path, mib: int) -> Path:
    path = tmp_path / f"gpu{mib}.txtpb"
    path.write_text(gpu_model("h100").config_text(mib * 2**20))
    return path


@compiles
def test_a_run_that_fits_at_its_own_fraction_is_said_to(tmp_path: Path) -> None:
    """Finding 1: a step that needs more than 0.75 of the GPU but less than the run's 0.85 was
    "does not fit". Now the fraction comes from the run's environment, each policy says the least
    it needs, and the step compiled at that fraction does fit."""
    model = model_of_config(_small_gpu(tmp_path, 680))  # the step plans ~576 MiB: 0.85 of it
    peaks = {}
    for fraction in (0.75, 0.95):
        env = GpuEnvironment(fraction, FractionSource.ENVIRONMENT, "XLA_PYTHON_CLIENT_MEM_FRACTION")
        report = audit(_stack, *STACK, policies=["everything_saveable"], gpu=GpuRequest(model, environment=env))
        peaks[fraction] = report.results[0].peak
    tight, roomy = peaks[0.75], peaks[0.95]
    assert tight is not None and roomy is not None and roomy.least_fraction is not None
    assert roomy.fits is True and (tight.fits is False or tight.xla_rematerialized), (tight, roomy)
    assert 0.75 < roomy.least_fraction <= 0.95 and tight.least_fraction is not None
    at_least = GpuEnvironment(roomy.least_fraction, FractionSource.GIVEN)
    again = audit(_stack, *STACK, policies=["everything_saveable"], gpu=GpuRequest(model, environment=at_least))
    assert again.results[0].peak is not None and again.results[0].peak.fits is True


@compiles
def test_needed_bytes_is_the_plan_without_xla_remat_and_unbounded(tmp_path: Path) -> None:
    """Finding 8: needed_bytes was below the rematerialized peak on one step and above the
    remat-off plan on another; now it is one compile by its definition."""
    from te_ckpt_audit.targets._gpu import UNBOUNDED

    model = model_of_config(_small_gpu(tmp_path, 300))
    request = GpuRequest(model, environment=GpuEnvironment(1.0, FractionSource.GIVEN))
    report = audit(_stack, *STACK, policies=["everything_saveable"], gpu=request)
    peak = report.results[0].peak
    assert peak is not None and peak.fits is False and peak.needed_bytes is not None, peak
    unbounded = dataclasses.replace(request, model=dataclasses.replace(
        model, config=model.config_text(UNBOUNDED)), environment=GpuEnvironment(0.8, FractionSource.GIVEN))
    saving = jax.checkpoint(_stack, policy=jax.checkpoint_policies.everything_saveable)
    step = jax.value_and_grad(saving, argnums=(0, 1))
    options = {"xla_disable_hlo_passes": "rematerialization"}
    plans = [_topology_compile(step, STACK, (0, 1), unbounded, {**options, **extra}).peak_memory_in_bytes
             for extra in ({}, {"xla_gpu_enable_triton_gemm": False})]
    assert peak.needed_bytes in plans, (peak.needed_bytes, plans)


@compiles
def test_xla_flags_apply_to_the_compile_and_key_the_cache(tmp_path: Path) -> None:
    """Finding 5: a run with --xla_gpu_enable_triton_gemm=false was served an entry compiled without it."""
    args = ["sample_models/mlp.py:loss", "--gpu", "h100", "-p", "nothing_saveable", "-f", "json"]
    cache = {"TE_CKPT_AUDIT_CACHE": str(tmp_path / "cache")}
    plain = json.loads(cli(*args, env=cache).stdout)["results"][0]["peak"]
    flagged_run = cli(*args, env={**cache, "XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false"})
    assert flagged_run.returncode == 0, flagged_run.stderr
    doc = json.loads(flagged_run.stdout)
    flagged = doc["results"][0]["peak"]
    assert plain["backends"] == ["triton", "cublas"] and flagged["backends"] == ["cublas"]
    assert flagged["bytes_per_device"] == flagged["bytes_per_device_min"] == max(
        plain["bytes_per_device"], plain["bytes_per_device_min"])
    assert doc["gpu"]["xla_flags"] == "--xla_gpu_enable_triton_gemm=false"
    assert len(list((tmp_path / "cache" / "gpu-compiles").glob("*.json"))) == 3  # two plain, one flagged


@compiles
def test_a_planted_cache_entry_never_passes_a_gate(tmp_path: Path) -> None:
    """Finding 5: an entry's "peak" set to 0 passed --peak-budget 1KiB for a step of 4 MiB."""
    args = ["sample_models/mlp.py:loss", "--gpu", "h100", "-p", "nothing_saveable", "-f", "json"]
    cache = {"TE_CKPT_AUDIT_CACHE": str(tmp_path / "cache")}
    first = cli(*args, env=cache)
    for entry in (tmp_path / "cache" / "gpu-compiles").glob("*.json"):
        doc = json.loads(entry.read_text())
        doc.update(peak=0, temp=0)
        entry.write_text(json.dumps(doc))
    gated = cli(*args, "--peak-budget", "1KiB", env=cache)
    assert gated.returncode == 1 and "exceeds the peak budget" in gated.stderr, gated.stderr
    strip = lambda t: [{k: v for k, v in r["peak"].items() if k != "compile_seconds"}  # noqa: E731
                       for r in json.loads(t)["results"]]
    assert strip(gated.stdout) == strip(first.stdout)


# --- compiled: workers and feedback (findings 6, 11) ---------------------------------------------------------

TWO_FACED = """\
import multiprocessing, os
import jax, jax.numpy as jnp

IN_A_WORKER = multiprocessing.parent_process() is not None
if IN_A_WORKER and os.environ.get("DIE_IN_WORKER"):
    os._exit(7)
WIDTH = 16 if IN_A_WORKER and os.environ.get("OTHER_IN_WORKER") else 384


def loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def loss_inputs():
    return jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32), jax.ShapeDtypeStruct((64, WIDTH), jnp.float32)
"""


WORKERS = ["m.py:loss", "--gpu", "h100", "-p", "nothing_saveable", "-p", "everything_saveable", "--jobs", "2",
           "-f", "json"]


@compiles
def test_a_worker_that_compiles_another_program_is_refused(tmp_path: Path) -> None:
    """Finding 6: a worker's figures of another program (6,144 argument bytes, not 589,824) were reported."""
    (tmp_path / "m.py").write_text(TWO_FACED)
    args = WORKERS
    run = cli(*args, cwd=tmp_path, env={"OTHER_IN_WORKER": "1", "TE_CKPT_AUDIT_CACHE": str(tmp_path / "c")})
    assert run.returncode == 0, run.stderr
    for r in json.loads(run.stdout)["results"]:
        assert r["peak"]["bytes_per_device"] is None
        assert f"a worker process compiled another program for {r['policy']}" in r["peak"]["error"]
    fit = cli(*args, "--fit", cwd=tmp_path, env={"OTHER_IN_WORKER": "1", "TE_CKPT_AUDIT_CACHE": str(tmp_path / "c")})
    assert fit.returncode == 1


@compiles
def test_a_worker_that_dies_is_compiled_here(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(TWO_FACED)
    run = cli(*WORKERS, cwd=tmp_path, env={"DIE_IN_WORKER": "1", "TE_CKPT_AUDIT_CACHE": str(tmp_path / "c")})
    assert run.returncode == 0, run.stderr
    peaks = [r["peak"] for r in json.loads(run.stdout)["results"]]
    assert all(p["error"] is None and p["argument_bytes"] == (384 * 384 + 64 * 384) * 4 for p in peaks), peaks


@compiles
def test_each_compile_is_a_line_in_a_ci_log(tmp_path: Path) -> None:
    """Finding 11: with stderr not a terminal a 6 min 40 s run wrote nothing at all to stderr."""
    run = cli("sample_models/mlp.py:loss", "--gpu", "h100", "-p", "nothing_saveable", "-f", "json",
              env={"TE_CKPT_AUDIT_CACHE": str(tmp_path / "c")})
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 0
    for backend in ("triton", "cublas"):
        assert f"te-ckpt-audit: compiling nothing_saveable for h100-sxm ({backend})" in lines
        assert any(line.startswith(f"te-ckpt-audit: compiled nothing_saveable for h100-sxm ({backend}) in ")
                   and line.endswith(" s") for line in lines), lines


# --- compiled: runs that happened (bench/truth_set.py) ------------------------------------------------------


def _published_runs() -> list[Any]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("truth_set", Path(__file__).resolve().parent.parent / "bench" /
                                                  "truth_set.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(module, r) for r in module.RUNS]


@compiles
@pytest.mark.parametrize("run", _published_runs(), ids=lambda r: r[1][0])
def test_a_published_gpu_run_fits_at_its_own_fraction(run: Any, tmp_path: Path) -> None:
    """Finding 1: MaxText's H100 recipes ran; reported "does not fit" at 0.75, a known-good run
    called a failure. Each published run of the truth set fits at the fraction it ran with, and
    needs no more than it."""
    module, (name, _, gpus, mesh, defines, fraction, xla) = run
    doc = module.run(defines, mesh, fraction, xla, str(tmp_path / "cache"))
    peak = doc["results"][0]["peak"]
    assert doc["gpu"]["mem_fraction"] == float(fraction) and doc["gpu"]["fraction_source"] == "environment"
    assert doc["mesh"]["devices"] == gpus and peak["error"] is None, peak
    assert peak["fits"] is True and peak["least_fraction"] <= float(fraction), (name, peak)


@compiles
def test_gpu_truth_measures_on_one_machine_and_predicts_on_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """bench/gpu_truth.py split for a lent GPU whose jax cannot compile for --gpu: `--measure` runs
    the steps where the GPU is (here on the CPU, a small GPT), `--predict` reads what it wrote and
    gives each row the prediction of `--gpu` for the GPU named in it."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("gpu_truth", Path(__file__).resolve().parent.parent / "bench" /
                                                  "gpu_truth.py")
    assert spec is not None and spec.loader is not None
    truth = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(truth)
    monkeypatch.setattr(truth, "CASES", [("gpt", "sample_models/gpt.py:loss", ["layers=2", "batch=4"],
                                          ["as-is", "nothing_saveable"])])
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("TE_CKPT_AUDIT_CACHE", str(tmp_path / "cache"))
    rows = truth.measure(False, tmp_path, tmp_path / "measured.jsonl")
    assert [json.loads(line) for line in (tmp_path / "measured.jsonl").read_text().splitlines()] == rows
    assert [(r["policy"], r["device"], r["jax"]) for r in rows] == [("as-is", "cpu", jax.__version__),
                                                                   ("nothing_saveable", "cpu", jax.__version__)]
    assert all(r["step_s"] > 0 and (tmp_path / r["profile"]).is_file() for r in rows)
    predicted = truth.predict([{**r, "device": "NVIDIA H100 80GB HBM3"} for r in rows], tmp_path)
    for row in predicted:
        low, high = row["peak_range"]
        assert row["gpu"] == "h100-sxm" and 0 < low <= high and row["fits"] is True and row["estimate_s"] > 0
        assert row["calibrated_s"] is None  # a CPU's profile holds no GPU kernel's cost
