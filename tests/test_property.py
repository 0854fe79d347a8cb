"""Property: for small random functions and random policies, the residuals te-ckpt-audit reports
are exactly JAX's own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.ad_checkpoint import checkpoint_name

from te_ckpt_audit import audit
from te_ckpt_audit._jax_compat import saved_residuals
from te_ckpt_audit.specs import SpecKind, resolve_policy

B, D, L, K = 2, 4, 3, 2  # K weight matrices per layer
NAMES = ("a", "b", "c")
OPS = ("dot", "dot_t", "sin", "tanh", "square", "skip", "exp_neg", *(f"name:{n}" for n in NAMES))


def _apply(ops: tuple[str, ...], h: jax.Array, ws: jax.Array, x0: jax.Array) -> jax.Array:
    k = 0
    for op in ops:
        if op == "dot":
            h = h @ ws[k % ws.shape[0]]
            k += 1
        elif op == "dot_t":
            h = jnp.einsum("bd,ed->be", h, ws[k % ws.shape[0]])
            k += 1
        elif op == "sin":
            h = jnp.sin(h)
        elif op == "tanh":
            h = jnp.tanh(h)
        elif op == "square":
            h = h * h
        elif op == "skip":
            h = h + x0
        elif op == "exp_neg":
            h = jnp.exp(-h)
        else:
            h = checkpoint_name(h, op.split(":")[1])
    return h


def build(ops: tuple[str, ...], scanned: bool, remat: Any) -> Callable[..., jax.Array]:
    """remat: None (no checkpoint) or a policy for a jax.checkpoint around the layer body."""

    def body(h: jax.Array, ws: jax.Array, x0: jax.Array) -> jax.Array:
        return _apply(ops, h, ws, x0)

    layer = body if remat is None else jax.checkpoint(body, policy=remat)

    def f(x: jax.Array, ws: jax.Array) -> jax.Array:
        if scanned:
            h, _ = jax.lax.scan(lambda h, w: (layer(h, w, x), None), x, ws)
        else:
            h = layer(x, ws[0], x)
        return jnp.sum(jnp.sin(h))

    return f


SPECS = [
    "none",
    "as-is",
    "nothing_saveable",
    "everything_saveable",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "checkpoint_dots_and_te_gemms",
    "te_gemms_saveable",
    *(f"save_only_these_names:{n}" for n in NAMES),
    "save_any_names_but_these:a",
    "save_and_offload_only_these_names:save=a;offload=b",
    "offload_dot_with_no_batch_dims",
]


def _shapes(pairs: Any) -> Counter[tuple[tuple[int, ...], str]]:
    return Counter((tuple(a.shape), str(np.dtype(a.dtype))) for a in pairs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=7).map(tuple),
    scanned=st.booleans(),
    inner=st.booleans(),
    spec_text=st.sampled_from(SPECS),
)
def test_random_functions_match_jax(ops: tuple[str, ...], scanned: bool, inner: bool, spec_text: str) -> None:
    spec = resolve_policy(spec_text)
    own = jax.checkpoint_policies.nothing_saveable if inner else None  # the function's own policy
    x = jax.ShapeDtypeStruct((B, D), jnp.float32)
    ws = jax.ShapeDtypeStruct((L, K, D, D), jnp.float32)

    if spec.kind is SpecKind.AS_IS:
        reference = build(ops, scanned, own)
    elif spec.kind is SpecKind.NONE:
        reference = build(ops, scanned, None)
    elif inner:  # auto scope: the function's own checkpoint gets the policy
        reference = build(ops, scanned, spec.policy)
    else:  # auto scope: the whole function is wrapped
        reference = jax.checkpoint(build(ops, scanned, None), policy=spec.policy)

    truth = _shapes(a for a, src in saved_residuals(reference, x, ws) if src != "from a literal")
    result = audit(build(ops, scanned, own), x, ws, policies=[spec_text]).results[0]
    assert Counter((r.shape, r.dtype) for r in result.residuals) == truth
    assert result.totals.total_bytes == sum(int(np.prod(s)) * np.dtype(d).itemsize * n for (s, d), n in truth.items())
    # every mark refers to a forward equation of the report, and saved rows have a residual
    saved_ids = {r.equation for r in result.residuals if r.equation}
    for m in result.marks:
        if m.outcome.value in ("SAVED", "OFFLOADED"):
            assert m.equation in saved_ids
