"""TE's quantizations (issue 23), on the CPU stand-in of the TE sample with `fp8=True`: its
projections quantize their inputs with a primitive named as TE's (current scaling) and keep the
FP8 casts under the quantizer checkpoint name `quantization`, as TE's dense does.

Quantized data and its scales are a producer of their own; residuals equal JAX's exactly; the
backward pass's re-quantizations are counted, and the spec that saves the quantizers' names with
the TE GEMM outputs brings them to 0. Real TE's recipes are in tests/test_real_te.py."""

from __future__ import annotations

from collections import Counter
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from _reference import module, nbytes, reference

from sample_models.te_standin import dense
from te_ckpt_audit import Category, Outcome, ResidualKind, WarningCode, audit, audit_target, recommend_target
from te_ckpt_audit.records import AuditReport, Candidate, CandidateKind
from te_ckpt_audit.render import warning_message
from te_ckpt_audit.render.recommend import maxtext_config
from te_ckpt_audit.specs import resolve_policy

TARGET = "sample_models/te_transformer.py:loss"
SAVING = "save_only_these_names:quantization+checkpoint_dots_and_te_gemms"
POLICIES = ["none", "nothing_saveable", "te_gemms_saveable", "checkpoint_dots_and_te_gemms",
            "dots_and_te_gemms_with_no_batch_dims", SAVING, "everything_saveable"]
LAYERS, PROJECTIONS = 2, 4  # qkv, out, ffn1, ffn2 in each layer: two quantizations (input, kernel) each


@pytest.fixture(scope="module")
def report() -> AuditReport:
    return audit_target(TARGET, POLICIES, defines={"fp8": "True"})


@pytest.mark.parametrize("policy", POLICIES)
def test_fp8_residuals_equal_jax(report: AuditReport, policy: str) -> None:
    truth = reference("te_transformer", policy, module("te_transformer").loss_inputs(fp8=True))
    result = report.result(policy)
    assert Counter((r.shape, r.dtype) for r in result.residuals) == truth
    assert result.totals.total_bytes == nbytes(truth)


def test_quantized_data_and_scales_are_a_producer(report: AuditReport) -> None:
    result = report.result(SAVING)
    quantizations = {e.id for e in report.equations if e.is_te_quantize}
    assert len(quantizations) == LAYERS * PROJECTIONS * 2  # the forward pass's: each input and kernel
    kept = [r for r in result.residuals if r.kind is ResidualKind.ACTIVATION and r.category is Category.QUANTIZED]
    data = [r for r in kept if r.quantized]
    scales = [r for r in kept if r.scale_of is not None]
    assert {r.dtype for r in data} == {"float8_e4m3fn"} and all(r.scale_of is None for r in data)
    assert {(r.dtype, r.shape) for r in scales} == {("float32", (1,))} and {r.scale_of for r in scales} <= quantizations
    assert len(data) == len(scales) == LAYERS * PROJECTIONS * 2  # x's transposed cast and the kernel's; their scales
    assert result.totals.quantized_bytes == sum(r.bytes for r in kept) > 0
    assert all(r.name == "quantization" for r in kept)


def test_requantizations_are_counted_and_the_saving_spec_ends_them(report: AuditReport) -> None:
    forward = LAYERS * PROJECTIONS * 2
    assert report.result("none").requantized == report.result("everything_saveable").requantized == 0
    for policy in ("nothing_saveable", "te_gemms_saveable", "checkpoint_dots_and_te_gemms"):
        result = report.result(policy)
        assert result.requantized == forward and result.requantize_flops > 0
        (found,) = [w for w in result.warnings if w.code is WarningCode.TE_REQUANTIZED]
        assert len(found.equations) == forward and found.quantizer_names == ("quantization",)
        assert all(result.mark(e).outcome is Outcome.RECOMPUTED for e in found.equations)
    warned = report.result("checkpoint_dots_and_te_gemms").warnings
    dots_te = [w for w in warned if w.code is WarningCode.TE_REQUANTIZED]
    assert dots_te[0].saving_spec == SAVING and SAVING in warning_message(dots_te[0])
    saved = report.result(SAVING)
    assert saved.requantized == 0 and not [w for w in saved.warnings if w.code is WarningCode.TE_REQUANTIZED]


def test_without_fp8_there_is_no_quantization() -> None:
    plain = audit_target(TARGET, ["nothing_saveable"])
    assert not any(e.is_te_quantize for e in plain.equations) and plain.results[0].requantized == 0


def test_recommend_searches_the_quantizers_name_and_maxtext_gets_its_policy() -> None:
    rec = recommend_target(TARGET, 10**9, defines={"fp8": "True"})
    assert "quantization" in rec.names and rec.recommended is not None

    def names(*saved: str) -> Candidate:
        return Candidate(f"save_only_these_names:{','.join(saved)}", CandidateKind.NAMES, None, saved, (), 0, 0, 0, 0,
                         True)

    assert maxtext_config(names("qkv_proj", "out_proj", "quantization"), ("qkv_proj", "out_proj")).startswith(
        "remat_policy: 'minimal_with_quantization'")
    assert maxtext_config(names("qkv_proj", "context", "quantization"), ()).startswith(
        "remat_policy: 'minimal_with_context_and_quantization'")
    assert maxtext_config(names("ffn1", "quantization"), ("ffn1",)).startswith("remat_policy: 'custom'")


def scanned(ws: jax.Array, x: jax.Array) -> jax.Array:
    """Three FP8 projections stacked by a scan, each layer checkpointed: one body, run 3 times."""

    @jax.checkpoint
    def layer(h: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
        return jnp.tanh(dense(h, w, fp8=True, quantization_name="quantization")), None

    return jnp.sum(jax.lax.scan(layer, x, ws)[0])


def test_a_scanned_layers_requantizations_are_one_count_said_one_way() -> None:
    """The warning counts what the `requantized` column counts: each run of a quantization, once
    per layer of the scan that stacks it (2 in the body, 3 layers: 6), not the body's 2."""
    args = (jax.ShapeDtypeStruct((3, 32, 32), jnp.float32), jax.ShapeDtypeStruct((8, 32), jnp.float32))
    result = audit(scanned, *args, policies=["nothing_saveable"]).results[0]
    (found,) = [w for w in result.warnings if w.code is WarningCode.TE_REQUANTIZED]
    assert (len(found.equations), found.runs, result.requantized) == (2, 6, 6)
    said = "nothing_saveable quantizes again in the backward pass: 6 TE quantizations"
    assert warning_message(found).startswith(said)


MAXTEXT_LIKE = """\
import jax, jax.numpy as jnp
from sample_models.te_standin import dense

def block(params, x):
    for name in ("wi_0", "wo"):
        with jax.named_scope("TEWrapper_dot_general"):  # the scope MaxText's TE wrapper module opens
            x = jnp.tanh(dense(x, params["mlp"][name]["kernel"], fp8=True, quantization_name="quantization"))
    return x

def loss(params, x):
    return jnp.sum(block(params["decoder"]["layers"], x))
"""


def test_a_maxtext_models_te_gemms_have_its_modules_and_the_fix_is_its_policy(tmp_path, monkeypatch) -> None:
    """MaxText's TE layers (its code, installed: site-packages/maxtext) name the quantizers
    `quantization` inside a TEWrapper module: each TE GEMM's module path is the MaxText module
    whose kernel it multiplies, and the re-quantization's fix is the remat_policy to set."""
    package = tmp_path / "site-packages" / "maxtext"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mlp_block.py").write_text(MAXTEXT_LIKE)
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    import importlib

    model = importlib.import_module("maxtext.mlp_block")
    kernel = jax.ShapeDtypeStruct((32, 32), jnp.float32)
    params = {"decoder": {"layers": {"mlp": {"wi_0": {"kernel": kernel}, "wo": {"kernel": kernel}}}}}
    report = audit(model.loss, params, jax.ShapeDtypeStruct((8, 32), jnp.float32), policies=["nothing_saveable"],
                   params=0)
    gemms = sorted({e.module for e in report.equations if e.is_te_gemm})
    assert gemms == ["decoder/layers/mlp/wi_0/TEWrapper_dot_general", "decoder/layers/mlp/wo/TEWrapper_dot_general"]
    (found,) = [w for w in report.results[0].warnings if w.code is WarningCode.TE_REQUANTIZED]
    assert found.maxtext_policy == "minimal_with_quantization"
    assert "remat_policy: 'minimal_with_quantization' in MaxText's config" in warning_message(found)
    # the same model as the user's own code: the fix is the spec, no MaxText policy
    (tmp_path / "own.py").write_text(MAXTEXT_LIKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    own = importlib.import_module("own")
    report = audit(own.loss, params, jax.ShapeDtypeStruct((8, 32), jnp.float32), policies=["nothing_saveable"],
                   params=0)
    (found,) = [w for w in report.results[0].warnings if w.code is WarningCode.TE_REQUANTIZED]
    assert found.maxtext_policy is None and found.saving_spec == "save_only_these_names:quantization+te_gemms_saveable"


def _two_quantized_layers(name: str, policy: str) -> AuditReport:
    """Two FP8 projections whose quantizers are named `name`, audited under `policy`."""

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.sum(dense(jnp.tanh(dense(x, w, fp8=True, quantization_name=name)), w, fp8=True,
                             quantization_name=name))

    f32 = jnp.float32
    return audit(loss, jax.ShapeDtypeStruct((16, 16), f32), jax.ShapeDtypeStruct((8, 16), f32), policies=[policy])


def _requantized_under_te_gemms(name: str) -> Any:
    report = _two_quantized_layers(name, "te_gemms_saveable")
    (found,) = [w for w in report.result("te_gemms_saveable").warnings if w.code is WarningCode.TE_REQUANTIZED]
    return found


@pytest.mark.parametrize("name", ["q,k", "a+b", "x;y", "p|q", " padded "])
def test_a_quantizer_name_no_spec_can_carry_is_never_put_in_one(name: str) -> None:
    """The te-requantized warning's fix is written in Python for a name that a --policy spec would
    read back as other names (or refuse), and no spec holds it."""

    found = _requantized_under_te_gemms(name)
    assert found.quantizer_names == (name,) and found.unspellable == (name,) and found.saving_spec is None
    said = warning_message(found)
    assert f"save_only_these_names({name!r})" in said and "--policy save_only" not in said


@pytest.mark.parametrize("name", ["two words", "k=v", "quantization"])
def test_a_spec_suggested_for_a_quantizer_name_reads_back_as_that_name(name: str) -> None:
    found = _requantized_under_te_gemms(name)
    assert found.unspellable == () and found.saving_spec is not None
    spec = resolve_policy(found.saving_spec)
    assert spec.parts[0].names == (name,)  # type: ignore[attr-defined]
    assert _two_quantized_layers(name, found.saving_spec).results[0].requantized == 0
