"""CI gating: sizes, budgets, recompute ceiling, baselines and their tolerance."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import pytest
from te_ckpt_audit_cli.files import save_baseline

from te_ckpt_audit import audit
from te_ckpt_audit.baselines import audit_key, load_baseline
from te_ckpt_audit.errors import UsageError
from te_ckpt_audit.gating import check
from te_ckpt_audit.records import AuditKey, Budget, Change, Scope, schemas
from te_ckpt_audit.render import violation_message
from te_ckpt_audit.sizes import parse_budget, parse_size

BASELINE_SCHEMA = schemas.BASELINE


def _fn(x, w):
    return jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w))


X = jax.ShapeDtypeStruct((16, 32), jnp.float32)
W = jax.ShapeDtypeStruct((32, 32), jnp.float32)


@pytest.fixture(scope="module")
def report():
    return audit(_fn, X, W, policies=["nothing_saveable", "checkpoint_dots", "everything_saveable"])


def act(report, policy: str) -> int:
    return report.result(policy).totals.activation_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", 0), ("512", 512), ("512B", 512), ("1KB", 1000), ("1KiB", 1024), ("1.5MiB", 1572864),
     ("2 GB", 2 * 10**9), ("6GiB", 6 * 2**30), ("1gib", 2**30)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "1 parsec", "1e9"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(UsageError, match="not a size"):
        parse_size(text)


def test_parse_budget() -> None:
    assert parse_budget("6GiB") == Budget(6 * 2**30, None)
    assert parse_budget("checkpoint_dots=1MiB") == Budget(2**20, "checkpoint_dots")
    with pytest.raises(UsageError):
        parse_budget("=1MiB")


def test_within_budget(report) -> None:
    limit = act(report, "everything_saveable")
    assert check(report, [Budget(limit)]).ok


def test_over_budget_names_target_policy_figure_and_limit(report) -> None:
    limit = act(report, "checkpoint_dots")  # everything_saveable keeps more
    result = check(report, [Budget(limit)])
    assert [v.policy for v in result.violations] == ["everything_saveable"]
    (v,) = result.violations
    assert (v.figure, v.value, v.limit) == ("activation bytes", act(report, "everything_saveable"), limit)
    message = violation_message(v)
    assert v.target in message and "everything_saveable" in message and str(limit) in message


def test_per_policy_budget(report) -> None:
    tight = Budget(act(report, "checkpoint_dots") - 1, "checkpoint_dots")
    result = check(report, [tight])
    assert [v.policy for v in result.violations] == ["checkpoint_dots"]
    with pytest.raises(UsageError, match="not among the audited"):
        check(report, [Budget(1, "dots_saveable")])


def test_max_recompute(report) -> None:
    nothing = report.result("nothing_saveable").recompute_percent
    result = check(report, max_recompute=nothing - 0.5)
    assert "nothing_saveable" in [v.policy for v in result.violations]
    assert "everything_saveable" not in [v.policy for v in result.violations]


def _baseline_with(report, policy: str, value: int) -> dict[str, int]:
    return {**{r.policy: r.totals.activation_bytes for r in report.results}, policy: value}


def test_baseline_growth_past_tolerance_fails(report) -> None:
    now = act(report, "checkpoint_dots")
    base = _baseline_with(report, "checkpoint_dots", int(now / 1.10))  # ~10% growth
    result = check(report, baseline=base, tolerance=5.0)
    assert [v.figure for v in result.violations] == ["growth over baseline"]
    assert result.violations[0].policy == "checkpoint_dots"


def test_growth_exactly_at_tolerance_passes(report) -> None:
    now = act(report, "checkpoint_dots")
    assert now % 4 == 0
    base = _baseline_with(report, "checkpoint_dots", now // 4 * 3)  # exactly +33.33..%
    change_pct = 100.0 * (now - now // 4 * 3) / (now // 4 * 3)
    assert check(report, baseline=base, tolerance=change_pct).ok
    assert not check(report, baseline=base, tolerance=change_pct - 1e-9).ok


def test_shrinkage_is_reported_and_passes(report) -> None:
    now = act(report, "checkpoint_dots")
    base = _baseline_with(report, "checkpoint_dots", now * 2)
    result = check(report, baseline=base, tolerance=0.0)
    assert result.ok
    change = next(c for c in result.changes if c.policy == "checkpoint_dots")
    assert change.percent == pytest.approx(-50.0)


def test_growth_from_zero_is_unbounded_and_fails_every_tolerance(report) -> None:
    assert act(report, "everything_saveable") > 0
    result = check(report, baseline=_baseline_with(report, "everything_saveable", 0), tolerance=1e6)
    (v,) = result.violations
    assert (v.policy, v.figure, v.value) == ("everything_saveable", "growth over baseline", math.inf)
    change = next(c for c in result.changes if c.policy == "everything_saveable")
    assert change.unbounded and change.percent is None
    assert Change("t", "p", 0, 0).percent == 0.0 and not Change("t", "p", 0, 0).unbounded


def test_a_policy_missing_from_the_baseline_is_noted_or_required(report) -> None:
    partial = {"checkpoint_dots": act(report, "checkpoint_dots")}
    noted = check(report, baseline=partial)
    assert noted.ok and set(noted.not_in_baseline) == {"nothing_saveable", "everything_saveable"}
    required = check(report, baseline=partial, require_baseline=True)
    assert {(v.policy, v.figure) for v in required.violations} == {
        ("nothing_saveable", "not in baseline"),
        ("everything_saveable", "not in baseline"),
    }


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_non_finite_or_negative_limits_are_usage_errors(report, value: float) -> None:
    with pytest.raises(UsageError, match="finite number >= 0"):
        check(report, tolerance=value, baseline={})
    with pytest.raises(UsageError, match="finite number >= 0"):
        check(report, max_recompute=value)


def test_audit_keys_are_canonical(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    key = audit_key("m.py:loss", defines={"b": "2", "a": "1"})
    assert key == audit_key("./sub/../m.py:loss", defines={"a": "1", "b": "2"})
    assert key == AuditKey(f"{tmp_path.as_posix()}/m.py:loss", None, (("a", "1"), ("b", "2")), Scope.AUTO)
    assert key != audit_key("m.py:loss", defines={"a": "1"}) and key != audit_key("m.py:loss", scope=Scope.OUTER)
    assert audit_key("pkg.mod:loss").target == "pkg.mod:loss"


def test_baseline_round_trip_and_corruption(report, tmp_path) -> None:
    path = tmp_path / "base.json"
    key = AuditKey(f"{tmp_path.as_posix()}/fn.py:fn")
    save_baseline(path, [(key, report)])
    doc = json.loads(path.read_text())
    assert [e["target"] for e in doc["entries"]] == ["fn.py:fn"]  # relative to the baseline's folder
    loaded = load_baseline(path)
    assert loaded.figures(key)["checkpoint_dots"] == act(report, "checkpoint_dots")
    assert loaded.figures(AuditKey("other:fn")) == {}
    assert check(report, baseline=loaded.figures(key)).ok
    assert [p.name for p in tmp_path.iterdir()] == ["base.json"]  # no temp file left behind

    path.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_baseline(path)
    path.write_text(json.dumps({"schema": "other/1", "targets": {}}))
    with pytest.raises(UsageError, match="expected 'te-ckpt-audit-baseline/2'"):
        load_baseline(path)
    path.write_text(json.dumps({"schema": BASELINE_SCHEMA, "entries": [{"target": "t.py:f"}]}))
    with pytest.raises(UsageError, match="malformed"):
        load_baseline(path)
    with pytest.raises(UsageError, match="does not exist"):
        load_baseline(tmp_path / "missing.json")


def test_pytest_helper(report) -> None:
    from te_ckpt_audit.testing import assert_activation_budget

    ok = assert_activation_budget(_fn, X, W, policy="checkpoint_dots", budget=act(report, "checkpoint_dots"))
    assert ok.totals.activation_bytes == act(report, "checkpoint_dots")
    with pytest.raises(AssertionError) as err:
        assert_activation_budget(_fn, X, W, policy="everything_saveable", budget="1KiB")
    text = str(err.value)
    assert "over the budget of 1 KiB (1024 B)" in text
    assert "test_gate.py" in text  # the largest residuals point at this file's lines
