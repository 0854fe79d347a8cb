"""`te-ckpt-audit maxtext CONFIG compile_topology=v5e-8 --tpu v5e`: MaxText's own train step
compiled by libtpu for the run's TPU slice, no TPU here (issue 47), and `--recommend` searching on it.

Truth: MaxText's own ahead-of-time compile for the same slice (`train_compile.get_topology_mesh`,
`get_shaped_inputs`, its train step jitted with its shardings) makes the same memory plan, byte
for byte. These need jax 0.12 (MaxText's), its libtpu and MaxText together: the tpu-target lane's
MaxText part installs them (TE_CKPT_AUDIT_MAXTEXT_TPU_LANE=1, where a missing piece fails)."""

from __future__ import annotations

import importlib.util
import os

import jax
import pytest
from _maxtext_truth import maxtexts_own_plan

from te_ckpt_audit._jax_compat import GPU_TARGET_SINCE, JAX_VERSION
from te_ckpt_audit.maxtext import BY_SPEED, MaxTextRun, audit_maxtext, recommend_maxtext
from te_ckpt_audit.targets._steptime import TPU_ESTIMATOR
from te_ckpt_audit.tpus import TpuRequest, parse_tpu

LANE = os.environ.get("TE_CKPT_AUDIT_MAXTEXT_TPU_LANE") == "1"


def _missing() -> str | None:
    if JAX_VERSION < GPU_TARGET_SINCE:
        return f"jax {jax.__version__} < 0.12 (MaxText 0.2.5's)"
    for module in ("maxtext", "libtpu", "optax"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


MISSING = _missing()
pytestmark = [
    pytest.mark.skipif(MISSING is not None and not LANE, reason=f"cannot compile MaxText for a TPU here: {MISSING}"),
    *(pytest.mark.filterwarnings(f"ignore::{kind}") for kind in ("DeprecationWarning", "UserWarning", "FutureWarning")),
]
# two small scanned llama2 layers, 16 tokens, on the 8 chips of a v5e-8 (fsdp over all of them)
TINY = ("base_emb_dim=64", "base_num_query_heads=4", "base_num_kv_heads=4", "head_dim=16", "base_mlp_dim=128",
        "base_num_decoder_layers=2", "vocab_size=128", "max_target_length=16", "per_device_batch_size=2",
        "attention=dot_product", "scan_layers=True", "ici_fsdp_parallelism=8", "compile_topology=v5e-8")


@pytest.fixture(scope="module", autouse=True)
def _the_lane_has_everything() -> None:
    if LANE and MISSING is not None:
        pytest.fail(f"the tpu-target lane cannot compile MaxText for a TPU: {MISSING}")


def _run() -> MaxTextRun:
    import maxtext.configs

    return MaxTextRun(os.path.join(os.path.dirname(maxtext.configs.__file__), "base.yml"), TINY, tpu="v5e")


def _on(run: MaxTextRun, time: bool = False) -> TpuRequest:
    return TpuRequest(parse_tpu("v5e", run.devices), None, time)


def _maxtexts_own_compile(run: MaxTextRun) -> object:
    """MaxText's train step as its ahead-of-time compile builds it for the slice: its topology's
    mesh, its shaped inputs and shardings, jitted and compiled by libtpu; its memory analysis."""
    from maxtext.configs import pyconfig
    from maxtext.trainers.pre_train import train_compile

    config = pyconfig.initialize([None, run.config, *run.settings, "compile_topology_num_slices=1",
                                  "skip_jax_distributed_system=True", "enable_checkpointing=False",
                                  "dataset_type=synthetic", "jax_cache_dir="])
    return maxtexts_own_plan(config, train_compile.get_topology_mesh(config))


def test_the_step_on_a_tpu_slice_is_maxtexts_own_byte_for_byte() -> None:
    run = _run()
    report = audit_maxtext(run, ["as-is"], tpu=_on(run, time=True))
    assert report.tpu is not None and report.tpu.topology == "v5e:2x4" and report.tpu.chips == 8
    row = report.results[0]
    plan = row.tpu_plan
    assert plan is not None and plan.error is None and plan.fits is True, plan
    truth = _maxtexts_own_compile(run)
    assert (plan.argument_bytes, plan.output_bytes, plan.alias_bytes, plan.temp_bytes) == (
        truth.argument_size_in_bytes, truth.output_size_in_bytes, truth.alias_size_in_bytes,
        truth.temp_size_in_bytes)
    time = row.time
    assert time is not None and time.error is None and time.seconds is not None and time.seconds > 0
    assert time.device == "chip" and time.tokens == 2 * 8 * 16  # TINY's batch x chips x sequence


def test_recommend_searches_the_slice_by_libtpus_verdict_and_by_throughput() -> None:
    """The memory search takes the first policy in MaxText's order at the largest batch libtpu
    accepts; the throughput search times each point it compiles, tokens per second per chip."""
    run = _run()
    rec = recommend_maxtext(run, _on(run), ["2", "4"])
    plain = [p for p in BY_SPEED if "quantization" not in p]
    assert rec.chosen is not None and rec.tried == (rec.chosen,)
    assert (rec.chosen.per_device_batch_size, rec.chosen.remat_policy) == ("4", plain[0])
    assert rec.gpu is None and rec.tpu is not None and rec.tpu.topology == "v5e:2x4"
    assert rec.to_dict()["tpu"]["chips"] == 8
    fast = recommend_maxtext(run, _on(run), max_compiles=2, maximize="throughput", remat_policies=["full", "minimal"])
    found = fast.throughput
    assert found is not None and found.device == "chip" and found.estimator == TPU_ESTIMATOR
    assert [(p.policy, p.value) for p in found.points] == [("full", 2), ("minimal", 2)]
    for point in found.points:
        assert point.fits and point.seconds is not None
        # 8 chips x the per-device batch x 16 tokens, per second, per chip
        assert point.throughput == pytest.approx(8 * point.value * 16 / point.seconds / 8, rel=1e-12)
    assert fast.tpu is not None and fast.chosen is not None and found.best is not None
    made = recommend_maxtext(run, _on(run), max_compiles=4, maximize="throughput", synthesize=True,
                             remat_policies=["full"]).throughput
    assert made is not None and made.synthesis is not None and made.device == "chip"
    names = ",".join(n.name for n in made.synthesis.names)
    assert [p.policy for p in made.points][:2] == ["nothing_saveable", f"save_only_these_names:{names}"]
    assert all(p.fits and p.seconds is not None for p in made.points) and len(made.points) <= 4
