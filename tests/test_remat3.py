"""JAX's new remat (`jax_remat3`, `JAX_REMAT3=1`): the audit reads what it saves exactly. On every
sample model and policy, the residuals of a trace made with the flag on equal JAX's own
`saved_residuals` under the flag (same shapes and dtypes, same bytes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jax
import pytest
from _reference import MODELS, PROTOTYPE, module, nbytes, policies_for, reference, with_jax_flags
from _reference import truth as jax_truth

from te_ckpt_audit import audit_target
from te_ckpt_audit._jax_compat import JAX_VERSION, remat3

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not hasattr(jax.config, "jax_remat3"), reason="this jax has no jax_remat3")

_reports: dict[tuple[str, str], object] = {}


def _report(model: str, params: str):
    if (model, params) not in _reports:
        with remat3(True):
            _reports[model, params] = audit_target(f"sample_models/{model}.py:loss", policies_for(model),
                                                   params=None if params == "first" else params)
    return _reports[model, params]


CASES = [(m, p) for m in MODELS for p in policies_for(m)]
@pytest.mark.parametrize(("model", "policy"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_residuals_equal_jax_under_remat3(model: str, policy: str) -> None:
    result = _report(model, "first").result(policy)
    with remat3(True):
        truth = jax_truth(model, policy)
    ours = Counter((r.shape, r.dtype) for r in result.residuals)
    assert ours == truth
    assert result.totals.total_bytes == nbytes(truth)


@pytest.mark.parametrize(("model", "policy"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_residuals_equal_jax_under_remat3_every_input_trained(model: str, policy: str) -> None:
    result = _report(model, "all").result(policy)
    with remat3(True):
        truth = reference(model, policy, module(model).loss_inputs(), trained=None)
    assert Counter((r.shape, r.dtype) for r in result.residuals) == truth


def test_remat3_changes_what_te_aware_policies_save() -> None:
    """The issue's finding, as JAX's own figures show it: under remat3 TE's dense (a custom_vjp) is
    recomputed whole, so the TE-aware policies save what nothing_saveable saves, and the audit says
    so (the bytes differ from the current remat's)."""
    now = audit_target("sample_models/te_transformer.py:loss", policies_for("te_transformer"))
    new = _report("te_transformer", "first")
    assert new.result("te_gemms_saveable").totals.total_bytes == new.result("nothing_saveable").totals.total_bytes
    assert now.result("te_gemms_saveable").totals.total_bytes > now.result("nothing_saveable").totals.total_bytes
    assert new.result("te_gemms_saveable").totals.te_gemm_bytes == 0
    assert now.result("te_gemms_saveable").totals.te_gemm_bytes > 0


def test_cli_reads_the_flag_from_the_environment() -> None:
    """`JAX_REMAT3=1 te-ckpt-audit ...` as a user runs it: the figures are the new remat's."""
    env = {**os.environ, "JAX_REMAT3": "1", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "sample_models/te_transformer.py:loss",
                          "-p", "te_gemms_saveable", "--format", "json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    (result,) = doc["results"]
    nothing = _report("te_transformer", "first").result("nothing_saveable")  # type: ignore[attr-defined]
    assert result["totals"]["total_bytes"] == nothing.totals.total_bytes
    assert "remat3" in {w["code"] for w in result["warnings"]}


def test_both_shows_each_implementation_side_by_side() -> None:
    """`--remat3 both`: the results are the current remat's, each policy's remat3 bytes beside them
    (equal to JAX's own under the flag), and the finding names the TE GEMMs that become recomputed.
    On jax 0.12 everything_saveable keeps the same residuals under both (its six that come out of JAX's
    new checkpoint primitive are attributed to it there, not to their producers): no finding."""
    from te_ckpt_audit import WarningCode
    from te_ckpt_audit.records import JSON_SCHEMA

    policies = ["checkpoint_dots", "te_gemms_saveable", "checkpoint_dots_and_te_gemms", "everything_saveable"]
    report = audit_target("sample_models/te_transformer.py:loss", policies, remat3="both")
    assert report.remat == "remat" and [r.policy for r in report.remat3] == policies
    new = _report("te_transformer", "first")
    for row in report.remat3:
        assert row.remat_bytes == report.result(row.policy).totals.activation_bytes
        assert row.remat3_bytes == new.result(row.policy).totals.activation_bytes
    changes = {w.policy: w for w in report.findings if w.code is WarningCode.REMAT3_CHANGES_POLICY}
    old_prototype = {"everything_saveable"} if JAX_VERSION < (0, 12, 0) else set()  # saves dots only there
    assert set(changes) == {"te_gemms_saveable", "checkpoint_dots_and_te_gemms", *old_prototype}
    te = [e.id for e in report.equations if e.is_te_gemm]
    assert sorted(changes["te_gemms_saveable"].te_gemms) == sorted(te) and len(te) == 12
    import jsonschema

    from te_ckpt_audit.render import render_json

    doc = json.loads(render_json(report))
    jsonschema.validate(doc, JSON_SCHEMA)
    assert doc["schema"] == "te-ckpt-audit/15" and doc["remat"] == "remat" and len(doc["remat3"]) == 4


def test_a_budgeted_policy_that_remat3_changes_fails_the_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """pyproject `remat3 = "both"`: CI fails before JAX flips its default."""
    from test_cli import cli

    from te_ckpt_audit.render import format_bytes

    new = _report("te_transformer", "first").result("checkpoint_dots_and_te_gemms").totals.activation_bytes  # type: ignore[attr-defined]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.te-ckpt-audit]\n[[tool.te-ckpt-audit.targets]]\n'
        f'target = "{ROOT}/sample_models/te_transformer.py:loss"\nremat3 = "both"\n'
        'budgets = { checkpoint_dots_and_te_gemms = "1MiB", checkpoint_dots = "1MiB" }\n')
    result = cli("check")
    said = result.stdout + result.stderr
    assert result.exit_code == 1, said
    assert f"[checkpoint_dots_and_te_gemms]: under jax_remat3 the policy saves {format_bytes(new)} " in said
    assert "[checkpoint_dots]: under jax_remat3" not in said  # it saves the same under both


def test_bad_remat3_mode() -> None:
    from te_ckpt_audit import UsageError

    with pytest.raises(UsageError, match="one of on, off, both"):
        audit_target("sample_models/mlp.py:loss", ["nothing_saveable"], remat3="sometimes")


@pytest.mark.skipif(JAX_VERSION < (0, 12, 0), reason="jax 0.10's remat3 asks a rule of no policy but its own")
@pytest.mark.parametrize("policy", ["te_gemms_saveable", "checkpoint_dots_and_te_gemms",
                                    "dots_and_te_gemms_with_no_batch_dims"])
def test_te_aware_policies_keep_their_promise_with_custom_vjp3(policy: str) -> None:
    """With jax_custom_vjp3 on too (a custom_vjp's forward rule opened to the policy), the rule
    te_ckpt_audit.policies gives TE's GEMMs in JAX's remat table keeps them: JAX's own residuals
    under both flags are the current remat's, TE GEMM outputs included; under remat3 alone they
    are not (JAX recomputes the custom_vjp whole), which the finding says."""
    from te_ckpt_audit.policies import KEPT_UNDER_REMAT3

    assert KEPT_UNDER_REMAT3
    args = module("te_transformer").loss_inputs()
    now = reference("te_transformer", policy, args)
    before = jax.config.values.get("jax_custom_vjp3", False)
    try:
        jax.config.update("jax_custom_vjp3", True)
        with remat3(True):
            both = reference("te_transformer", policy, args)
    finally:
        jax.config.update("jax_custom_vjp3", before)
    with remat3(True):
        alone = reference("te_transformer", policy, args)
    assert both == now
    assert nbytes(alone) < nbytes(now)


def test_recompute_is_read_under_remat3() -> None:
    """The work JAX's new remat runs again (inside its linearized checkpoint's residual tree) is
    counted: on the MLP the same as the current remat's; on the TE transformer the TE-aware
    policies recompute what nothing_saveable and checkpoint_dots recompute."""
    mlp_now = audit_target("sample_models/mlp.py:loss", ["nothing_saveable", "checkpoint_dots"], remat3="off")
    mlp_new = _report("mlp", "first")
    for policy in ("nothing_saveable", "checkpoint_dots"):
        assert 0 < mlp_new.result(policy).recompute_flops == mlp_now.result(policy).recompute_flops  # type: ignore[attr-defined]
    te = _report("te_transformer", "first")
    flops = {p: te.result(p).recompute_flops for p in policies_for("te_transformer")}  # type: ignore[attr-defined]
    assert flops["te_gemms_saveable"] == flops["nothing_saveable"] > 0
    if JAX_VERSION < (0, 12, 0):  # the prototype saves dots only for its own policy class: none of ours
        assert flops["checkpoint_dots_and_te_gemms"] == flops["nothing_saveable"]
        return
    assert flops["checkpoint_dots_and_te_gemms"] == flops["checkpoint_dots"] > 0
    assert flops["everything_saveable"] == 0


_NEW_CUSTOM_VJP = [("jax_custom_vjp3",), ("jax_remat3", "jax_custom_vjp3")]
_cvjp3_reports: dict[tuple[str, tuple[str, ...]], object] = {}


@pytest.mark.parametrize("flags", _NEW_CUSTOM_VJP, ids=["+".join(f) for f in _NEW_CUSTOM_VJP])
@pytest.mark.parametrize(("model", "policy"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_residuals_equal_jax_under_custom_vjp3(model: str, policy: str, flags: tuple[str, ...]) -> None:
    """JAX's new custom_vjp, alone and with remat3: each custom_vjp call is made again as
    `jax.custom_vjp` makes it under the flag (its forward rule as the trace tagged it), and the
    residuals equal JAX's own under the same flags."""
    key = (model, flags)
    if key not in _cvjp3_reports:
        _cvjp3_reports[key] = with_jax_flags(flags, lambda: audit_target(f"sample_models/{model}.py:loss",
                                                                      policies_for(model)))
    result = _cvjp3_reports[key].result(policy)  # type: ignore[attr-defined]
    if "jax_remat3" in flags and (model, policy) in PROTOTYPE:
        pytest.skip("the remat3 prototype of jax < 0.12: stop_gradient and closure keep other residuals (above)")
    truth = with_jax_flags(flags, lambda: reference(model, policy, module(model).loss_inputs()))
    ours = Counter((r.shape, r.dtype) for r in result.residuals)
    if JAX_VERSION < (0, 12, 0):  # the prototype lists float0 tangents (no bytes) or not, by what JAX traced before
        ours, truth = (Counter({k: n for k, n in c.items() if "float0" not in k[1]}) for c in (ours, truth))
    assert ours == truth
    assert result.totals.total_bytes == nbytes(truth)


@pytest.mark.skipif(JAX_VERSION < (0, 12, 0), reason="jax 0.10's remat3 asks a rule of no policy but its own")
def test_te_gemms_kept_and_not_recomputed_under_both_flags() -> None:
    """With both flags, the TE-aware policies keep TE's GEMM outputs and recompute what they do now
    (what runs again only to give a tangent, the right of remat3's PrimalLeftTangentRight, is not
    counted: XLA drops it)."""
    flags = ("jax_remat3", "jax_custom_vjp3")
    policies = ["te_gemms_saveable", "checkpoint_dots_and_te_gemms", "nothing_saveable"]
    new = with_jax_flags(flags, lambda: audit_target("sample_models/te_transformer.py:loss", policies))
    now = audit_target("sample_models/te_transformer.py:loss", policies, remat3="off")
    for policy in policies:
        a, b = new.result(policy), now.result(policy)
        assert (a.totals.te_gemm_bytes, a.recompute_flops) == (b.totals.te_gemm_bytes, b.recompute_flops)
    assert new.result("te_gemms_saveable").totals.te_gemm_bytes > 0


def _two_names(x: jax.Array, w: jax.Array) -> jax.Array:
    from jax.ad_checkpoint import checkpoint_name

    a = checkpoint_name(jax.numpy.sin(x), "a")  # the same shape as b, a cheaper producer
    b = checkpoint_name(x @ w, "b")
    return jax.numpy.sum(jax.numpy.tanh(a) * jax.numpy.tanh(b))


def test_equal_bytes_but_another_saved_set_is_a_change() -> None:
    """Issue 56, item 4: the row said `changes: no` beside a remat3-changes-policy finding because
    only byte totals were compared. Two policies that keep equally many bytes of different values
    (one elementwise, one a GEMM) stand for the two implementations here."""
    from te_ckpt_audit import Session
    from te_ckpt_audit.analysis._warnings import remat3_row
    from te_ckpt_audit.specs import resolve_policy

    x, w = jax.ShapeDtypeStruct((64, 64), jax.numpy.float32), jax.ShapeDtypeStruct((64, 64), jax.numpy.float32)
    session = Session.of_function(_two_names, x, w)
    a, b = resolve_policy("save_only_these_names:a"), resolve_policy("save_only_these_names:b")
    now, new = session.result(a), session.result(b)
    assert now.totals.activation_bytes == new.totals.activation_bytes == 64 * 64 * 4
    assert now.recompute_flops != new.recompute_flops
    traced = session._traced  # noqa: SLF001 - the trace both results were read from
    row, finding = remat3_row(traced, a, now, new, None)
    assert finding is not None and row.changed and row.remat_bytes == row.remat3_bytes
    same, none = remat3_row(traced, a, now, now, None)
    assert none is None and not same.changed


@pytest.mark.parametrize(("row", "figure", "said"), [
    ({"changed": True}, "changes under remat3", "under jax_remat3 the policy saves other values: 16 KiB"),
    ({"error": "ValueError: no rule"}, "fails under remat3",
     "under jax_remat3 JAX cannot differentiate the function with this policy (ValueError: no rule)"),
    ({}, None, None),
])
def test_the_gate_fails_a_budgeted_policy_remat3_changes_or_breaks(row: dict[str, object], figure: str | None,
                                                                    said: str | None) -> None:
    """Issue 56, item 4: equal byte totals passed the gate whatever else changed, and a policy that
    raised under jax_remat3 exited 0 with "No warnings". A policy without a budget is not gated."""
    import dataclasses

    from te_ckpt_audit import Budget
    from te_ckpt_audit.gating import check
    from te_ckpt_audit.records import Remat3Row
    from te_ckpt_audit.render import violation_message

    report = __import__("te_ckpt_audit").audit(_two_names, jax.ShapeDtypeStruct((64, 64), jax.numpy.float32),
                                               jax.ShapeDtypeStruct((64, 64), jax.numpy.float32),
                                               policies=["save_only_these_names:a"])
    made = Remat3Row("save_only_these_names:a", 16384, 16384, 0, 0, 0, 256, **row)  # type: ignore[arg-type]
    report = dataclasses.replace(report, remat3=(made,))
    budgeted = check(report, [Budget(1 << 20)])
    assert [v.figure.value for v in budgeted.violations] == ([figure] if figure else [])
    if said is not None:
        assert said in violation_message(budgeted.violations[0])
    assert check(report, max_recompute=100.0).violations == ()  # no budget: --remat3 both only reports


@pytest.mark.parametrize(("variable", "value"), [("JAX_REMAT3", "maybe"), ("JAX_CUSTOM_VJP3", "2")])
def test_a_flag_jax_cannot_read_is_a_usage_error_naming_it(variable: str, value: str) -> None:
    """Issue 56, item 4: JAX's ValueError while it imported was a traceback and exit 1, which reads
    as a failed check in CI."""
    env = dict(os.environ, **{variable: value})
    done = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "sample_models/mlp.py:loss"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"te-ckpt-audit: error: {variable}={value} is not a value JAX takes (hint: set {variable} "
                           "to 1 or 0, true or false, or unset it)\n")


def test_remat3_both_on_a_step_of_the_users_own_is_refused_not_dropped() -> None:
    """Issue 56, item 6: `--step --tpu v5e --remat3 both` dropped the comparison without a word."""
    from te_ckpt_audit import TargetConfig, UsageError, check_target
    from te_ckpt_audit.gpus import GpuRequest, gpu_model

    config = TargetConfig("sample_models/mlp.py:loss", gpu=GpuRequest(gpu_model("h100"), step=True), remat3="both")
    with pytest.raises(UsageError, match="remat3 both compares the policies' saved sets"):
        check_target(config)


_CUSTOM = """
import jax
import jax.numpy as jnp


@jax.custom_vjp
def op(x, w):
    return jnp.sin(x @ w)


def fwd(x, w):
    return op(x, w), (x, w)


def bwd(res, g):
    return jax.vjp(lambda x, w: jnp.sin(x @ w), *res)[1](g)


op.defvjp(fwd, bwd)


def loss(w, x):
    return jnp.sum(jnp.tanh(op(x, w)) ** 2)


def loss_inputs():
    return jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((4, 8), jnp.float32)
"""


def test_a_custom_vjp_jax_fixed_under_custom_vjp3_when_defined_is_refused_not_left_out(tmp_path: Path) -> None:
    """jax < 0.12 makes a `jax.custom_vjp` defined under jax_custom_vjp3 (JAX_CUSTOM_VJP3=1 when the
    model is imported) a hijax call the audit cannot look inside: on jax 0.10.2 the FP8 block
    audited under the flag left out residuals JAX keeps, with exit 0. There it is a usage error naming
    the flag and the jax; on jax 0.12, which decides at each call, the audit is JAX's own."""
    (tmp_path / "custom.py").write_text(_CUSTOM)
    env = dict(os.environ, JAX_CUSTOM_VJP3="1", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "custom.py:loss", "-p", "nothing_saveable",
                           "-f", "json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    if JAX_VERSION < (0, 12, 0):
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.startswith("te-ckpt-audit: error: custom.py:loss: a custom_vjp of the model was made "
                                      f"under jax_custom_vjp3 (JAX_CUSTOM_VJP3) on jax {jax.__version__}")
        assert done.stderr.count("\n") == 1 and "jax >= 0.12" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    ours = Counter((tuple(r["shape"]), r["dtype"]) for r in json.loads(done.stdout)["results"][0]["residuals"])

    def step() -> Counter[tuple[tuple[int, ...], str]]:  # the step's own residuals, the module made under the flag
        import importlib.util

        import jax.numpy as jnp

        spec = importlib.util.spec_from_file_location("custom", tmp_path / "custom.py")
        assert spec is not None and spec.loader is not None
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        w, x = (jnp.ones(a.shape, a.dtype) for a in m.loss_inputs())
        f = jax.checkpoint(m.loss, policy=jax.checkpoint_policies.nothing_saveable)
        kept = jax.make_jaxpr(lambda w, x: jax.tree.leaves(jax.vjp(lambda w: f(w, x), w)[1]))(w, x)
        return Counter((tuple(a.shape), str(a.dtype)) for a in kept.out_avals)

    assert ours and ours == with_jax_flags(("jax_custom_vjp3",), step)
