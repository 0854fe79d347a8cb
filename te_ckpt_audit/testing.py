"""A pytest helper: assert a checkpoint policy keeps a function's activations within a budget.

    from te_ckpt_audit.testing import assert_activation_budget

    def test_layer_fits():
        assert_activation_budget(loss, *loss_inputs(), policy="checkpoint_dots_and_te_gemms",
                                 budget="64MiB")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._session import Session
from .records import PolicyResult, ResidualKind, Scope
from .render import format_bytes
from .sizes import parse_size
from .specs import policy_spec

__all__ = ["assert_activation_budget"]


def assert_activation_budget(
    fn: Callable[..., Any],
    *args: Any,
    policy: str | Callable[..., Any] = "checkpoint_dots_and_te_gemms",
    budget: str | int,
    scope: Scope | str = Scope.AUTO,
    top: int = 5,
) -> PolicyResult:
    """Fail with the largest residuals listed when `policy` keeps more activation bytes than
    `budget` ("6GiB", "512MB" or a byte count). Returns the PolicyResult when within budget."""
    limit = parse_size(budget)
    spec = policy_spec(policy)
    result = Session.of_function(fn, *args, scope=Scope(scope)).report([spec]).results[0]
    used = result.totals.activation_bytes
    if used <= limit:
        return result
    largest = sorted(
        (r for r in result.residuals if r.kind is ResidualKind.ACTIVATION), key=lambda r: -r.bytes
    )[:top]
    lines = [
        f"policy {result.policy} keeps {format_bytes(used)} ({used} B) of activations, "
        f"over the budget of {format_bytes(limit)} ({limit} B) by {format_bytes(used - limit)}.",
        f"largest of its {len(result.residuals)} residuals:",
    ]
    for r in largest:
        what = r.name or r.primitive or "value"
        where = f" at {r.source}" if r.source else ""
        layers = f" x{r.multiplicity} layers" if r.multiplicity > 1 else ""
        lines.append(f"  {format_bytes(r.bytes):>12}  {r.dtype}{list(r.shape)} {what}{where}{layers}")
    raise AssertionError("\n".join(lines))
