"""`te-ckpt-audit maxtext CONFIG key=value --gpu h100`: MaxText's own train step compiled for GPUs
that are not here (issue 28).

Truth: the step the tool traces on CPU devices and lays on the GPU topology compiles to the same
memory plan, byte for byte, as MaxText's train step lowered the way its own ahead-of-time compile
lowers it (`train_compile.get_shaped_inputs`, `get_functional_train_with_signature`, jit with its
shardings) directly on a mesh of those GPUs. The compiles run where MaxText and the [gpu] extra are
(the gpu-target lane installs both); the refusals everywhere.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

import jax
import pytest
from _gpu_lane import LANE, MISSING_GPU_TARGET, cli
from _maxtext_truth import maxtexts_own_plan

from te_ckpt_audit import UsageError
from te_ckpt_audit.gpus import GpuEnvironment, GpuRequest, gpu_model, model_of_config
from te_ckpt_audit.maxtext import (
    BY_SPEED,
    REMAT_POLICIES,
    MaxTextRun,
    audit_maxtext,
    check_remat_policies,
    recommend_maxtext,
)

HAS_MAXTEXT = importlib.util.find_spec("maxtext") is not None
MISSING = MISSING_GPU_TARGET or (None if HAS_MAXTEXT else "maxtext is not installed")
compiles = pytest.mark.skipif(MISSING is not None and not LANE, reason=f"cannot compile MaxText here: {MISSING}")
TINY = ("base_emb_dim=64", "base_num_query_heads=4", "base_num_kv_heads=4", "head_dim=16", "base_mlp_dim=128",
        "base_num_decoder_layers=2", "vocab_size=128", "max_target_length=16", "per_device_batch_size=2",
        "attention=dot_product", "scan_layers=True", "hardware=gpu", "ici_fsdp_parallelism=8")
# MaxText's and its dependencies' own warnings (deprecations in their code) are theirs, not failures
pytestmark = [pytest.mark.filterwarnings(f"ignore::{kind}") for kind in ("DeprecationWarning", "UserWarning",
                                                                          "FutureWarning")]
CUBLAS = "--xla_gpu_enable_triton_gemm=false"  # one GEMM backend: the independent compile below uses the same


@pytest.fixture(scope="module", autouse=True)
def _the_lane_has_everything() -> None:
    if LANE and MISSING is not None:
        pytest.fail(f"the gpu-target lane cannot compile MaxText: {MISSING}")


def _base_yml() -> str:
    import maxtext.configs

    return os.path.join(os.path.dirname(maxtext.configs.__file__), "base.yml")


def _maxtexts_own_compile(run: MaxTextRun, request: GpuRequest) -> object:
    """MaxText's train step lowered as its AOT compile lowers it, on a mesh of the GPU topology's
    devices (its `get_topology_mesh` does this over mocked GPU processes), compiled with the run's
    flag; its memory analysis."""
    from jax.sharding import AxisType, Mesh
    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils

    from te_ckpt_audit import _jax_compat as jc

    config = pyconfig.initialize([None, run.config, *run.settings, "compile_topology=a3",
                                  "compile_topology_num_slices=1", "skip_jax_distributed_system=True",
                                  "enable_checkpointing=False", "dataset_type=synthetic", "jax_cache_dir="])
    memory = request.planning_memory(request.mem_fraction)
    topology = jc.cuda_topology(request.model.config_text(memory), request.topology(run.devices))
    mesh = Mesh(maxtext_utils.create_device_mesh(config, list(topology.devices)), config.mesh_axes,
                axis_types=(AxisType.Auto,) * len(config.mesh_axes))
    return maxtexts_own_plan(config, mesh, {"xla_gpu_enable_triton_gemm": False})


@compiles
def test_the_step_is_maxtexts_own_byte_for_byte() -> None:
    run = MaxTextRun(_base_yml(), TINY)
    request = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags=CUBLAS))
    report = audit_maxtext(run, ["as-is", "full"], request)
    assert [r.policy for r in report.results] == ["as-is", "full"]
    assert report.gpu is not None and report.gpu.mesh_source == "model" and "fsdp=8" in (report.gpu.mesh or "")
    assert report.step is not None and report.step.own
    peak = report.results[0].peak
    assert peak is not None and peak.error is None and peak.backends == ("cublas",), peak
    truth = _maxtexts_own_compile(run, request)
    assert (peak.argument_bytes, peak.output_bytes, peak.alias_bytes, peak.temp_bytes) == (
        truth.argument_size_in_bytes, truth.output_size_in_bytes, truth.alias_size_in_bytes,
        truth.temp_size_in_bytes)
    assert peak.fits is True and peak.least_fraction is not None
    full = report.results[1].peak
    assert full is not None and full.error is None and full.argument_bytes == peak.argument_bytes  # the same state


@compiles
def test_time_counts_maxtexts_tokens_and_the_losss_model_flops() -> None:
    """Issue 39: `--time` on MaxText's own step: tokens are the per-device batch x GPUs x sequence,
    the model FLOPs 3 x the forward pass of the loss MaxText differentiates (per GPU), and what
    `full` recomputes is in its compiled kernels. (TINY's kernels are too small for their time to
    follow their FLOPs: tests/test_step_time.py checks that on GEMM-bound layers.)"""
    run = MaxTextRun(_base_yml(), TINY)
    request = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags=CUBLAS), time=True)
    report = audit_maxtext(run, ["minimal", "full"], request)
    times = {r.policy: r.time for r in report.results}
    minimal, full = times["minimal"], times["full"]
    assert minimal is not None and full is not None and minimal.error is None and full.error is None, times
    assert minimal.tokens == full.tokens == 2 * 8 * 16 and minimal.devices == 8  # TINY's batch, GPUs, sequence
    row = report.results[0]
    assert minimal.model_flops == 3 * row.forward_flops // 8 and full.recompute_flops > minimal.recompute_flops
    assert full.hlo_flops > minimal.hlo_flops and full.seconds is not None and full.seconds > 0


@compiles
def test_every_remat_policy_of_maxtexts_compiles_to_a_peak() -> None:
    """Two small scanned llama2 layers under each remat_policy MaxText has: a peak for every one, the
    same train state in each, and as-is (base.yml's own `full`) the same program as `full`."""
    run = MaxTextRun(_base_yml(), TINY)
    request = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags=CUBLAS))
    report = audit_maxtext(run, ["as-is", *REMAT_POLICIES], request)
    assert [r.policy for r in report.results] == ["as-is", *REMAT_POLICIES]
    peaks = {r.policy: r.peak for r in report.results}
    for policy, peak in peaks.items():
        assert peak is not None and peak.error is None and peak.bytes_per_device, (policy, peak)
    assert len({p.argument_bytes for p in peaks.values() if p is not None}) == 1
    as_is, full = peaks["as-is"], peaks["full"]
    assert as_is is not None and full is not None
    assert (as_is.bytes_per_device, as_is.temp_bytes) == (full.bytes_per_device, full.temp_bytes)
    # the residual audit of the same step: the loss MaxText differentiates, its parameters trained
    rows = {r.policy: r for r in report.results}
    assert all(r.audited and r.error is None and r.residuals for r in rows.values())
    assert rows["as-is"].totals == rows["full"].totals
    assert rows["full"].totals.activation_bytes < rows["minimal"].totals.activation_bytes
    assert rows["full"].recompute_flops > rows["minimal"].recompute_flops
    assert report.trained is not None and report.trained.arguments == (0,)


@compiles
@pytest.mark.parametrize("policy", ["minimal", "save_qkv_proj", "full"])
def test_the_residuals_are_jaxs_own_for_the_loss_maxtext_differentiates(policy: str) -> None:
    """The loss is the function MaxText's own step hands `jax.value_and_grad`; what the audit says
    it keeps under the decoder's checkpoints is what JAX's `saved_residuals` says, shape for shape."""
    _residuals_are_jaxs_own(policy, TINY)


@compiles
@pytest.mark.parametrize("quantization", ["fp8", "nanoo_fp8"])
def test_an_fp8_step_traces_and_its_residuals_are_jaxs_own(quantization: str) -> None:
    """Issue 49: MaxText's XLA-native FP8 (Flax's FP8 dot general) failed to build for every
    policy ("safe_zip() argument 1 has length 0 but argument 0 has length 3"): the audit ran a
    custom_vjp's forward rule (Flax's `out_dq`) that has no input of its own, which JAX never runs.
    Now it traces, and what it keeps is JAX's own."""
    _residuals_are_jaxs_own("full", (*TINY, f"quantization={quantization}"))


def _residuals_are_jaxs_own(policy: str, settings: tuple[str, ...]) -> None:
    from collections import Counter

    import numpy as np

    from te_ckpt_audit._jax_compat import jaxpr_as_fun, saved_residuals
    from te_ckpt_audit.maxtext import _maxtext_sessions
    from te_ckpt_audit.records import ResidualKind
    from te_ckpt_audit.specs import AsIs

    _, session, loss = _maxtext_sessions(MaxTextRun(_base_yml(), settings), policy, residuals=True)
    assert session is not None and loss is not None
    assert loss.fn.__name__ == "diff_wrapper" and loss.argnums == (0, 1)  # MaxText's own, as its step takes it
    result = session.result(AsIs())
    traced = session._traced
    trained = len(jax.tree.leaves(loss.shapes[0]))
    run = jaxpr_as_fun(traced.jaxpr)

    def of_params(params: list[jax.Array]) -> jax.Array:
        return run(*params, *traced.avals[trained:])[0]

    truth = Counter((tuple(a.shape), str(np.dtype(a.dtype))) for a, src in
                    saved_residuals(of_params, list(traced.avals[:trained])) if src != "from a literal")
    ours = Counter((r.shape, r.dtype) for r in result.residuals if r.kind is not ResidualKind.LITERAL)
    assert ours == truth


@compiles
def test_recommend_takes_the_largest_batch_that_fits_and_the_fastest_policy_at_it(tmp_path: Path) -> None:
    """Batches largest first, MaxText's policies fastest first, each point compiled until one fits:
    on an H100 the first point; on a GPU of 16 MiB none, in that order, within the compiles allowed."""
    run = MaxTextRun(_base_yml(), TINY)
    h100 = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags=CUBLAS))
    rec = recommend_maxtext(run, h100, ["2", "4"])
    assert rec.chosen is not None and rec.tried == (rec.chosen,) and rec.chosen.fits
    plain = [p for p in BY_SPEED if "quantization" not in p]  # the config has no TE quantization
    assert (rec.chosen.per_device_batch_size, rec.chosen.remat_policy) == ("4", plain[0])
    assert rec.config_lines() == f"remat_policy: '{plain[0]}'\nper_device_batch_size: 4"
    doc = rec.to_dict()
    assert doc["schema"] == "te-ckpt-audit-maxtext-recommend/4" and doc["config_lines"] == rec.config_lines()
    small = tmp_path / "small.txtpb"
    small.write_text(gpu_model("h100").config_text(16 * 2**20))
    tight = GpuRequest(model_of_config(small),  # XLA's rematerialization off: it would search long, and fail
                       environment=GpuEnvironment(xla_flags=f"{CUBLAS} --xla_disable_hlo_passes=rematerialization"))
    none = recommend_maxtext(run, tight, ["2", "4"], max_compiles=2)
    assert none.chosen is None and none.config_lines() == ""
    assert [(t.per_device_batch_size, t.remat_policy, t.fits) for t in none.tried] == [
        ("4", plain[0], False), ("4", plain[1], False)]


@compiles
def test_recommend_by_throughput_compiles_and_times_every_point_it_reports() -> None:
    """Issue 40: remat_policy and per_device_batch_size searched together, each point MaxText's own
    step compiled and timed; tokens per second per GPU by hand; a bounded search stays broad."""
    run = MaxTextRun(_base_yml(), TINY)
    h100 = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags=CUBLAS))
    rec = recommend_maxtext(run, h100, max_compiles=4, maximize="throughput", remat_policies=["full", "minimal"])
    found = rec.throughput
    assert found is not None and found.bounded and len(found.points) == 4 == len(rec.tried)
    assert [(p.policy, p.value) for p in found.points] == [("full", 2), ("minimal", 2), ("full", 4), ("minimal", 4)]
    for point, tried in zip(found.points, rec.tried, strict=True):
        assert (tried.remat_policy, tried.per_device_batch_size) == (point.policy, str(point.value))
        assert point.peak_bytes == tried.peak.bytes_per_device and point.seconds is not None and point.fits
        # 8 GPUs x the per-device batch x 16 tokens, per second, per GPU
        assert point.throughput == pytest.approx(8 * point.value * 16 / point.seconds / 8, rel=1e-12)
    assert found.best is not None and rec.chosen is not None
    assert (rec.chosen.remat_policy, rec.chosen.per_device_batch_size) == (found.best.policy, str(found.best.value))
    assert rec.settings() == f"remat_policy={found.best.policy} per_device_batch_size={found.best.value}"
    assert rec.to_dict()["throughput"]["best"] == rec.to_dict()["throughput"]["frontier"][-1]


@compiles
def test_synthesize_with_offload_allowed_may_set_a_key_offload_and_says_how_it_timed_it() -> None:
    """Issue 58: `--allow-offload` on GPUs: each custom key kept on the device, offloaded or
    recomputed; the solver says the host link it priced the copies at, and every point compiled
    sets each key to what its spec says (an offloaded name `offload`)."""
    from te_ckpt_audit.maxtext import custom_settings

    run = MaxTextRun(_base_yml(), TINY)
    h100 = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags=CUBLAS))
    rec = recommend_maxtext(run, h100, max_compiles=4, maximize="throughput", synthesize=True, allow_offload=True,
                            remat_policies=["save_qkv_proj"])
    found = rec.throughput
    assert found is not None and found.synthesis is not None
    assert "offloaded to host memory" in found.synthesis.solver and "63 GB/s" in found.synthesis.solver
    names = [n.name for n in found.synthesis.names]
    for point, tried in zip(found.points, rec.tried, strict=True):
        if point.policy != "save_qkv_proj":
            assert ("custom", tried.custom) == custom_settings(point.policy, names)


@compiles
def test_synthesize_decides_maxtexts_custom_keys_compiles_every_point_and_prints_the_keys() -> None:
    """Issue 58: `maxtext --recommend --maximize throughput --synthesize` makes remat_policy=custom:
    its candidates are the custom tensor keys the model names (the scan carry never), every point is
    MaxText's own step compiled and timed, MaxText's policies are compiled beside the pick, and the
    pick's config lines set each key. A custom setting that keeps what save_qkv_proj keeps compiles
    to save_qkv_proj's own plan: the keys say what the tool audited."""
    from te_ckpt_audit.maxtext import custom_settings, maxtext_session
    from te_ckpt_audit.specs import AsIs

    run = MaxTextRun(_base_yml(), TINY)
    h100 = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags=CUBLAS))
    rec = recommend_maxtext(run, h100, max_compiles=6, maximize="throughput", synthesize=True,
                            remat_policies=["save_qkv_proj"])
    found = rec.throughput
    assert found is not None and found.synthesis is not None and found.unit == "tokens"
    names = [n.name for n in found.synthesis.names]
    assert {"query_proj", "key_proj", "value_proj", "out_proj", "mlpwo"} <= set(names)
    assert "decoder_layer_input" not in names and len(found.points) == len(rec.tried) <= 6
    for point, tried in zip(found.points, rec.tried, strict=True):
        assert point.peak_bytes == tried.peak.bytes_per_device and point.seconds is not None
        if point.policy == "save_qkv_proj":
            assert (tried.remat_policy, tried.custom) == ("save_qkv_proj", ())
        else:  # the solver's own: every candidate key set, the saved ones on the device
            saved = () if point.policy == "nothing_saveable" else point.policy.partition(":")[2].split(",")
            assert tried.remat_policy == "custom"
            assert tried.custom == tuple(f"{n}={'device' if n in saved else 'remat'}" for n in names)
    policies = [p.policy for p in found.points]
    assert policies[:2] == ["nothing_saveable", "save_only_these_names:" + ",".join(names)]
    assert "save_qkv_proj" in policies
    assert found.best is not None and rec.chosen is not None
    assert rec.settings() is not None and f"per_device_batch_size={found.best.value}" in rec.settings()
    assert all(f"{key}={value}" in rec.settings() for key, _, value in (c.partition("=") for c in rec.chosen.custom))
    doc = rec.to_dict()
    assert doc["schema"] == "te-ckpt-audit-maxtext-recommend/4" and doc["chosen"]["custom"] == list(rec.chosen.custom)
    remat_policy, custom = custom_settings("save_only_these_names:key_proj,qkv_proj,query_proj,value_proj", names)
    at = MaxTextRun(_base_yml(), (*TINY, *custom))
    step = dataclasses.replace(h100, step=True, donate=(0,), optimizer=None)  # MaxText's step, as it is
    own = maxtext_session(run, "save_qkv_proj").compiled([AsIs()], step)[AsIs().text].peak
    keys = maxtext_session(at, remat_policy).compiled([AsIs()], step)[AsIs().text].peak
    assert keys.bytes_per_device == own.bytes_per_device and keys.temp_bytes == own.temp_bytes


@compiles
def test_recommend_tries_the_layouts_it_is_given_in_order() -> None:
    """Over the same 8 GPUs: FSDP 4 x tensor 2 first, then FSDP 8; the first that fits is the answer,
    its parallelism among the config lines; the step it compiled is laid on that mesh."""
    run = MaxTextRun(_base_yml(), TINY)
    h100 = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags=CUBLAS))
    mixed = "ici_fsdp_parallelism=4,ici_tensor_parallelism=2"
    rec = recommend_maxtext(run, h100, ["2"], [mixed, "ici_fsdp_parallelism=8"])
    assert rec.chosen is not None and rec.tried == (rec.chosen,)
    assert rec.chosen.layout == ("ici_fsdp_parallelism=4", "ici_tensor_parallelism=2")
    assert rec.config_lines().splitlines()[2:] == ["ici_fsdp_parallelism: 4", "ici_tensor_parallelism: 2"]
    assert rec.gpu is not None and rec.gpu.mesh is not None and "fsdp=4" in rec.gpu.mesh and "tensor=2" in rec.gpu.mesh


def test_settings_and_policies_are_checked_before_anything_runs() -> None:
    with pytest.raises(UsageError, match="is not KEY=VALUE"):
        MaxTextRun("base.yml", ("per_device_batch_size",))
    with pytest.raises(UsageError, match="'minimal_please' is not a remat_policy of MaxText's"):
        check_remat_policies(["as-is", "minimal_please"])
    assert MaxTextRun("c.yml", ("compile_topology_num_slices=16",)).devices == 128
    with pytest.raises(UsageError, match="compile_topology_num_slices=0"):
        _ = MaxTextRun("c.yml", ("compile_topology_num_slices=0",)).devices


@pytest.mark.parametrize(("args", "said"), [
    (["nosuch.yml", "--gpu", "h100"], "no such MaxText config: nosuch.yml"),
    (["c.yml", "per_device_batch_size", "--gpu", "h100"], "MaxText setting 'per_device_batch_size' is not KEY=VALUE"),
    (["c.yml", "-p", "minimal_please", "--gpu", "h100"], "'minimal_please' is not a remat_policy of MaxText's"),
    (["c.yml", "--recommend"], "maxtext --recommend compiles MaxText's train step for a GPU"),
    (["c.yml", "--gpu", "h100", "--batch", "4"], "--batch, --layout, --max-compiles and --maximize are about"),
    (["c.yml", "--gpu", "h100", "--maximize", "throughput"], "--maximize are about --recommend's search"),
    (["c.yml", "--gpu", "h100", "--recommend", "--maximize", "batch"], "MaxText's search maximizes throughput"),
    (["c.yml", "--gpu", "h100", "--recommend", "--time"], "or search by time: --maximize throughput"),
    (["c.yml", "--gpu", "h100", "--recommend", "--layout", "fsdp=8"], "'fsdp=8' is not an ici_*/dcn_*_parallelism"),
    (["c.yml", "--gpu", "h100", "--recommend", "-p", "full"], "--recommend searches MaxText's remat policies itself"),
    (["c.yml", "--gpu", "h100", "--recommend", "--format", "markdown"], "--recommend writes table or json"),
    (["c.yml", "--gpu", "h100", "--recommend", "--synthesize"], "--synthesize makes the remat policy of the fastest"),
    (["c.yml", "--gpu", "h100", "--recommend", "--maximize", "throughput", "--allow-offload"],
     "--allow-offload lets --synthesize offload MaxText's tensor keys"),
], ids=["no-config", "not-key-value", "unknown-policy", "no-gpu", "batch-alone", "maximize-alone",
        "maximize-batch", "recommend-time", "not-a-layout", "recommend-policy", "recommend-md", "synthesize-alone",
        "offload-alone"])
def test_bad_input_is_exit_2_in_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    (tmp_path / "c.yml").write_text("base_config: base.yml\n")
    run = cli("maxtext", *args, cwd=tmp_path)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and said in lines[0], run.stderr


# --- issue 38: settings read as MaxText resolves them, bad values refused before any work -----------------

needs_maxtext = pytest.mark.skipif(not HAS_MAXTEXT and not LANE, reason="maxtext is not installed")


def test_a_count_of_hosts_is_ascii_digits() -> None:
    with pytest.raises(UsageError, match="compile_topology_num_slices=² must be a positive count"):
        _ = MaxTextRun("c.yml", ("compile_topology_num_slices=²",)).devices  # was exit 4 (int('²'))


@pytest.mark.parametrize("size", ["nan", "inf", "-inf", "0", "-1", "four"])
def test_recommend_refuses_a_batch_that_is_not_positive_and_finite_before_any_work(size: str) -> None:
    with pytest.raises(UsageError, match=f"{size} is not a positive per-device batch size"):
        recommend_maxtext(MaxTextRun("c.yml"), GpuRequest(gpu_model("h100")), ["2", size])


@needs_maxtext
def test_the_count_of_hosts_and_the_batch_are_maxtexts_own(tmp_path: Path) -> None:
    """A config's own compile_topology_num_slices and per_device_batch_size (they were read only from
    key=value settings: 2 hosts in the YAML were audited as 1), the command line's over them."""
    from te_ckpt_audit.maxtext import resolved

    two = tmp_path / "two.yml"
    two.write_text(f"base_config: '{_base_yml()}'\ncompile_topology_num_slices: 2\nper_device_batch_size: 3\n")
    untiny = tuple(s for s in TINY if not s.startswith("per_device_batch_size="))
    run = resolved(MaxTextRun(str(two), untiny))
    assert (run.devices, run.value("per_device_batch_size")) == (16, "3")
    assert run.target == MaxTextRun(str(two), untiny).target  # the run as the user wrote it
    run = resolved(MaxTextRun(str(two), (*untiny, "compile_topology_num_slices=4", "per_device_batch_size=0.5")))
    assert (run.devices, run.value("per_device_batch_size")) == (32, "0.5")
    assert resolved(MaxTextRun(_base_yml(), TINY)).devices == 8  # base.yml leaves it unset (-1): one host


@needs_maxtext
@pytest.mark.parametrize(("setting", "said"), [
    ("per_device_batch_size=0", "per_device_batch_size=0 is not a per-device batch a step can take"),
    ("per_device_batch_size=-1", "per_device_batch_size=-1 is not a per-device batch a step can take"),
    ("per_device_batch_size=1e30", "per_device_batch_size=1e+30 is not a per-device batch a step can take"),
    ("remat_policy=bogus", "remat_policy=bogus is not a remat_policy of MaxText's"),
    ("compile_topology_num_slices=-3", "compile_topology_num_slices=-3 must be a positive count of hosts"),
    ("compile_topology_num_slices=²", "MaxText refuses compile_topology_num_slices='²': Input should be a valid"),
    ("remat_polcy=full", "MaxText has no setting 'remat_polcy'"),
], ids=["batch-0", "batch-negative", "batch-1e30", "remat-bogus", "slices-negative", "slices-superscript",
        "unknown-key"])
def test_a_setting_maxtext_or_the_tool_cannot_take_is_named(setting: str, said: str) -> None:
    from te_ckpt_audit.maxtext import resolved

    with pytest.raises(UsageError) as caught:
        resolved(MaxTextRun(_base_yml(), (*TINY, setting)))
    assert said in caught.value.message and len(caught.value.message) < 400, caught.value.message


@needs_maxtext
def test_the_command_line_resolves_the_config_before_it_sets_its_devices(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(f"base_config: '{_base_yml()}'\n")
    run = cli("maxtext", "c.yaml", cwd=tmp_path)
    assert run.returncode == 2 and "MaxText reads its config only from a file named *.yml" in run.stderr
    (tmp_path / "c.yml").write_text(f"base_config: '{_base_yml()}'\n")
    run = cli("maxtext", "c.yml", *TINY, "per_device_batch_size=-1", cwd=tmp_path)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and "per_device_batch_size=-1 is not" in lines[0], run.stderr


@needs_maxtext
def test_every_layout_is_checked_against_the_gpus_before_the_first_compile() -> None:
    """Item 8: a layout is laid over the config's own parallelism (TINY's ici_fsdp_parallelism=8
    stays): tensor=2 over it makes 16 per host of 8, refused naming it before anything compiles
    (a bad second layout ended the search, losing the points compiled before it)."""
    h100 = GpuRequest(gpu_model("h100"))
    with pytest.raises(UsageError) as caught:
        recommend_maxtext(MaxTextRun(_base_yml(), TINY), h100, ["2"],
                          ["ici_fsdp_parallelism=4,ici_tensor_parallelism=2", "ici_tensor_parallelism=2"])
    assert caught.value.template.startswith("$layouts$ ici_tensor_parallelism=2: Number of devices per slice 8 "
                                            "does not match the product of the ICI parallelism 16")


def test_maxtext_writes_nothing_outside_the_tools_cache() -> None:
    """Item 12: MaxText's jax_cache_dir (~/jax_cache by default) turns JAX's persistent cache on:
    the tool hands MaxText an empty one, last, whatever the config or the settings say."""
    from te_ckpt_audit.maxtext import _argv

    assert _argv(MaxTextRun("c.yml", ("jax_cache_dir=/tmp/x",)), "full")[-1] == "jax_cache_dir="


def test_progress_names_the_remat_policy_being_compiled() -> None:
    """Issue 41, item 14: MaxText's step compiles as it is, but the line names its remat_policy."""
    from te_ckpt_audit.maxtext import _named
    from te_ckpt_audit.records import CompileProgress

    seen: list[object] = []
    told = _named(seen.append, "minimal")
    told(CompileProgress("as-is", "cublas", "h100-sxm", None))
    told("building")
    assert seen == [CompileProgress("remat_policy=minimal", "cublas", "h100-sxm", None), "building"]
    _named(seen.append, "as-is")(CompileProgress("as-is", "cublas", "h100-sxm", 1.0))
    assert seen[-1] == CompileProgress("as-is", "cublas", "h100-sxm", 1.0)  # the config's own, as it is


# --- MaxText's MoE GPU configs (issue 41, items 12 and 13) -----------------------------------------
SMALL_MOE = ("override_model_config=True", "base_num_decoder_layers=2", "base_emb_dim=256", "base_num_query_heads=4",
             "base_num_kv_heads=4", "base_mlp_dim=256", "base_moe_mlp_dim=256", "head_dim=64", "vocab_size=512",
             "max_target_length=128", "per_device_batch_size=1", "ici_fsdp_parallelism=8")


def _gpu_config(name: str) -> str:
    import maxtext.configs

    return os.path.join(os.path.dirname(maxtext.configs.__file__), "gpu", "models", name)


@compiles
@pytest.mark.parametrize(("config", "attention"), [("mixtral_8x1b.yml", "cudnn_flash_jax"),
                                                   ("gpt-oss-20b.yml", "dot_product")])
def test_maxtexts_moe_gpu_configs_compile_with_their_own_attention(config: str, attention: str) -> None:
    """Item 12: MaxText's Mixtral GPU config exited 3 ('cuDNN not found': the [gpu] extra had no
    cuDNN for the cudnn_flash_jax stand-in). Its MoE configs, shrunk, compile for 8 H100s with
    their own attention stood in for, and say which: gpt-oss's attention sinks only TE's kernel
    has, so it compiles unfused, declared as a peak above the real one."""
    run = MaxTextRun(_gpu_config(config), SMALL_MOE)
    request = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags=CUBLAS))
    report = audit_maxtext(run, ["minimal"], request)
    assert f"[attention={attention}, standing in for cudnn_flash_te" in report.target
    assert ("a peak above the real one" in report.target) == (attention == "dot_product")
    row = report.results[0]
    assert row.error is None and row.peak is not None and row.peak.error is None and row.peak.bytes_per_device > 0
    modules = {r.module for r in row.residuals if r.module}
    assert any("MoeBlock" in m or "GptOssMlp" in m for m in modules), sorted(modules)  # the experts' layers


@needs_maxtext
def test_cudnn_flash_te_without_cudnn_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 12: where cuDNN is missing, one line that names it and the install, before any trace
    (was exit 3, 'tracing ... raised RuntimeError ...: cuDNN not found', as if the model were wrong)."""
    import te_ckpt_audit._jax_compat as jc
    from te_ckpt_audit.maxtext import labelled, maxtext_session

    run = MaxTextRun(_gpu_config("mixtral_8x1b.yml"), SMALL_MOE)
    monkeypatch.setattr(jc, "cudnn_version", lambda: None)
    with pytest.raises(UsageError) as caught:
        maxtext_session(run)
    assert "needs cuDNN" in caught.value.message and "nvidia-cudnn-cu12" in caught.value.hint
    # with cuDNN, what every report of the run (recommend's too) calls it: the stand-in said
    monkeypatch.setattr(jc, "cudnn_version", lambda: 92800)
    assert labelled(run) == f"{run.target} [attention=cudnn_flash_jax, standing in for cudnn_flash_te]"
    assert labelled(MaxTextRun(_base_yml(), TINY)) == MaxTextRun(_base_yml(), TINY).target  # dot_product: as is


@needs_maxtext
def test_maxtexts_own_validation_reason_is_the_one_line() -> None:
    """Item 13: a config MaxText's validators refuse says their reason (was 'ValidationError: 1
    validation error for MaxTextConfig', the reason only in MaxText's log above it)."""
    from te_ckpt_audit.maxtext import resolved

    with pytest.raises(UsageError) as caught:
        resolved(MaxTextRun(_base_yml(), (*TINY, "num_experts=4", "base_moe_mlp_dim=64")))
    assert "For a fully MoE model, base_mlp_dim must equal base_moe_mlp_dim" in caught.value.message


def test_a_bare_config_name_resolves_against_the_installed_maxtexts_configs(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46, item 7: `maxtext llama2_7b.yml ...` as the README and MaxText's users name it."""
    from te_ckpt_audit.maxtext import check_config_file, find_config

    package = tmp_path / "site" / "maxtext"
    for sub, name in (("configs", "base.yml"), ("configs/models", "llama2-7b.yml"),
                      ("configs/gpu/models", "llama2_7b.yml"), ("configs/models", "llama2_7b.yml")):
        (package / sub).mkdir(parents=True, exist_ok=True)
        (package / sub / name).write_text("base_config: base.yml\n")
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "maxtext", raising=False)
    monkeypatch.chdir(tmp_path)
    gpu_models = package / "configs" / "gpu" / "models" / "llama2_7b.yml"
    assert MaxTextRun("llama2_7b.yml").config == str(gpu_models)  # configs/gpu/models first
    assert find_config("llama2-7b.yml") == str(package / "configs" / "models" / "llama2-7b.yml")
    assert find_config("base.yml") == str(package / "configs" / "base.yml")
    (tmp_path / "base.yml").write_text("")
    assert find_config("base.yml") == "base.yml"  # a file here wins, as given
    with pytest.raises(UsageError) as err:
        check_config_file(MaxTextRun("llama9_7b.yml"))
    assert "no such MaxText config: llama9_7b.yml" in str(err.value)
    assert str(package / "configs" / "gpu" / "models" / "llama9_7b.yml") in err.value.hint


def test_without_maxtext_a_config_name_is_told_how_to_install_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 56, item 5: "(no MaxText installed to look in)" said nothing of how to install it."""
    import importlib.util

    from te_ckpt_audit.maxtext import check_config_file

    if importlib.util.find_spec("maxtext") is not None:
        pytest.skip("MaxText is installed here")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as err:
        check_config_file(MaxTextRun("base.yml"))
    assert err.value.message == "no such MaxText config: base.yml, and MaxText is not installed to look in"
    assert "pip install --no-deps maxtext==0.2.5" in err.value.hint and "Python 3.12" in err.value.hint


@needs_maxtext
def test_maxtexts_own_chatter_is_kept_off_stderr(tmp_path: Path) -> None:
    """Issue 56, item 5: each MaxText run printed ~10-17 lines on stderr that were MaxText's and its
    dependencies' (absl's "base_output_directory is not provided", transformers' notes, "[NO-OP] ...
    using stub."): none of it the user's, none of it the tool's."""
    run = cli("maxtext", _base_yml(), *TINY, "-p", "full", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    noise = [line for line in run.stderr.splitlines()
             if line.startswith(("WARNING:absl:", "[transformers]", "[NO-OP]", "[DECOUPLED NO-OP]"))]
    assert noise == [], noise


def test_a_custom_point_names_the_keys_it_keeps_and_its_config_lines_set_every_key() -> None:
    """Issue 58: a synthesized MaxText point is remat_policy=custom with every candidate key set;
    the table names the keys kept on the device (their count where the list is long), the config
    lines and the command-line settings set each key, and the JSON carries them."""
    from te_ckpt_audit.records import MaxTextPoint, MaxTextRecommendation, PeakMemory
    from te_ckpt_audit.render import render_maxtext_recommend_text

    peak = PeakMemory(2 << 30, 2 << 30, 1 << 30, 0, 0, 1 << 30, True, False, None, 1.0)
    short = MaxTextPoint("custom", "8", peak, custom=("context=device", "mlpwo=remat"))
    long = MaxTextPoint("custom", "8", peak, custom=tuple(f"{k}=device" for k in (
        "attention_out", "key_proj", "mlpwi_0", "mlpwi_1", "mlpwo", "out_proj", "query_proj", "value_proj")))
    rec = MaxTextRecommendation("maxtext base.yml", short, (short, long, MaxTextPoint("full", "8", peak)), None)
    rows = render_maxtext_recommend_text(rec).splitlines()
    assert any(r.startswith("custom: context ") for r in rows)
    assert any(r.startswith("custom: 8 of 8 keys on device ") for r in rows)
    assert rec.config_lines().splitlines() == ["remat_policy: 'custom'", "per_device_batch_size: 8",
                                               "context: 'device'", "mlpwo: 'remat'"]
    assert rec.settings() == "remat_policy=custom per_device_batch_size=8 context=device mlpwo=remat"
    assert rec.to_dict()["chosen"]["custom"] == ["context=device", "mlpwo=remat"]
