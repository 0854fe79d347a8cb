"""The TE-style sample: what JAX's dot policies do to TE GEMMs, and what ours do instead."""

from __future__ import annotations

import pytest

from te_ckpt_audit import Category, Outcome, TeKind, Verdict, audit_target

POLICIES = [
    "checkpoint_dots",
    "checkpoint_dots_with_no_batch_dims",
    "checkpoint_dots_and_te_gemms",
    "dots_and_te_gemms_with_no_batch_dims",
    "te_gemms_saveable",
    "nothing_saveable",
    "everything_saveable",
]


@pytest.fixture(scope="module")
def report():
    return audit_target("sample_models/te_transformer.py:loss", POLICIES)


def te_rows(report):
    return [e for e in report.equations if e.is_te_gemm]


def test_te_gemms_are_found_and_labelled_as_stand_in(report) -> None:
    rows = te_rows(report)
    # 2 layers x (qkv, out, ffn1, ffn2 dense + 2 grouped MoE GEMMs)
    assert sorted(e.primitive for e in rows) == sorted(
        ["te_gemm_v2_ffi_wrapper"] * 8 + ["te_grouped_gemm_ffi_wrapper"] * 4
    )
    assert report.te is TeKind.STANDIN and all(e.standin for e in rows)
    # attributed to the model's own lines, not to the stand-in's file
    assert all(e.source is not None and e.source.file.endswith("te_transformer.py") for e in rows)
    assert {e.name for e in rows} == {"qkv_proj", "out_proj", "ffn1", "ffn2", "moe_ffn1", "moe_ffn2"}


def test_checkpoint_dots_recomputes_every_te_gemm(report) -> None:
    result = report.result("checkpoint_dots")
    for e in te_rows(report):
        assert result.mark(e.id).verdict is Verdict.RECOMPUTE
        assert result.mark(e.id).outcome is Outcome.RECOMPUTED
    assert result.totals.te_gemm_bytes == 0


def test_checkpoint_dots_and_te_gemms_saves_them(report) -> None:
    result = report.result("checkpoint_dots_and_te_gemms")
    rows = te_rows(report)
    for e in rows:
        assert result.mark(e.id).verdict is Verdict.SAVE
        assert result.mark(e.id).outcome is Outcome.SAVED
    saved = [r for r in result.residuals if r.category is Category.TE_GEMM]
    assert sorted(r.equation for r in saved) == sorted(e.id for e in rows)
    assert result.totals.te_gemm_bytes == sum(r.bytes for r in saved) > 0
    assert all(r.standin for r in saved)


def test_dots_policy_saves_fewer_bytes_and_recomputes_more(report) -> None:
    dots = report.result("checkpoint_dots")
    te_aware = report.result("checkpoint_dots_and_te_gemms")
    assert dots.totals.activation_bytes < te_aware.totals.activation_bytes
    assert te_aware.totals.activation_bytes - dots.totals.activation_bytes == te_aware.totals.te_gemm_bytes
    assert dots.recompute_flops > te_aware.recompute_flops
    te_flops = sum(e.flops * e.multiplicity for e in te_rows(report))
    assert dots.recompute_flops - te_aware.recompute_flops >= te_flops


def test_no_batch_dims_variant_differs_on_the_batched_gemm(report) -> None:
    plain = report.result("checkpoint_dots_and_te_gemms")
    no_batch = report.result("dots_and_te_gemms_with_no_batch_dims")
    batched = [e for e in report.equations if e.primitive == "dot_general" and len(e.shape) == 4]
    assert batched, "attention scores/context are batched dot_generals"
    for e in batched:
        assert plain.mark(e.id).outcome is Outcome.SAVED
        assert no_batch.mark(e.id).verdict is Verdict.RECOMPUTE
        assert no_batch.mark(e.id).outcome is not Outcome.SAVED
    for e in te_rows(report):  # TE GEMMs are saved by both
        assert no_batch.mark(e.id).outcome is Outcome.SAVED
    assert no_batch.totals.activation_bytes < plain.totals.activation_bytes


def test_dots_vs_te_warning_fires_for_dot_policies_only(report) -> None:
    fired = {w.policy for w in report.warnings if w.code == "te-gemms-recomputed"}
    assert fired == {"checkpoint_dots", "checkpoint_dots_with_no_batch_dims"}
