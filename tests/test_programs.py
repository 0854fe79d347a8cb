"""Programs of the kinds real models are made of, each checked against JAX's own residuals:
PRNG keys, linear solves, weak types, pass-through outputs, checkpoints only inside a custom_vjp
forward rule, literals, and a policy JAX cannot differentiate under."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg as spl
import pytest

from te_ckpt_audit import ResidualKind, Scope, audit
from te_ckpt_audit._jax_compat import saved_residuals
from te_ckpt_audit.specs import resolve_policy

SDS = jax.ShapeDtypeStruct
POLICIES = ("none", "nothing_saveable", "everything_saveable", "checkpoint_dots", "checkpoint_dots_and_te_gemms")


def _concrete(x: Any) -> Any:
    return jnp.zeros(x.shape, x.dtype) if isinstance(x, SDS) else x


def truth(
    fn: Callable[..., Any], args: tuple[Any, ...], policy: str, inner: Callable[..., Any] | None = None
) -> Counter:
    """(shape, dtype) multiset of JAX's saved residuals, literals left out: they cost nothing,
    and whether JAX lists one depends on how a Python number entered the trace.

    `inner(policy)` builds the function with the policy on its own checkpoints (scope inner);
    otherwise the whole function is wrapped in one jax.checkpoint (scope outer)."""
    p = resolve_policy(policy).policy
    if inner is not None:
        f = inner(p)
    else:
        f = fn if p is None else jax.checkpoint(fn, policy=p)
    out: Counter = Counter()
    for aval, src in saved_residuals(f, *map(_concrete, args)):
        if src != "from a literal":
            out[(tuple(aval.shape), str(aval.dtype))] += 1
    return out


def ours(result: Any) -> Counter:
    out: Counter = Counter()
    for r in result.residuals:
        if r.kind is not ResidualKind.LITERAL:
            out[(r.shape, r.dtype)] += 1
    return out


def assert_exact(fn: Callable[..., Any], *args: Any, policies=POLICIES, inner=None, scope=Scope.AUTO) -> Any:
    report = audit(fn, *args, policies=list(policies), scope=scope)
    for result in report.results:
        assert result.error is None, result.error
        assert ours(result) == truth(fn, args, result.policy, inner), result.policy
        assert result.recompute_percent <= 100.0
    return report


# --- PRNG keys ------------------------------------------------------------------------------------


def _remat(policy: Any) -> Callable[..., Any]:
    """`jax.checkpoint` with `policy`; None: no checkpoint at all (the reference for `none`)."""
    return (lambda f: f) if policy is None else (lambda f: jax.checkpoint(f, policy=policy))


def _dropout_block(policy: Any) -> Callable[..., Any]:
    def f(w: Any, x: Any, key: Any) -> Any:
        def body(x: Any, key: Any) -> Any:
            h = jnp.tanh(x @ w)
            k1, k2 = jax.random.split(key)
            keep = jax.random.bernoulli(k1, 0.9, h.shape)
            return jnp.where(keep, h / 0.9, 0.0), k2

        y, _ = _remat(policy)(body)(x, key)
        return jnp.sum(y * y)

    return f


NOTHING = jax.checkpoint_policies.nothing_saveable


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
def test_typed_keys_as_inputs_intermediates_and_residuals(impl: str) -> None:
    w, x = SDS((8, 8), jnp.float32), SDS((4, 8), jnp.float32)
    key = jax.random.key(0, impl=impl)
    report = assert_exact(_dropout_block(NOTHING), w, x, key, inner=_dropout_block)
    keys = [r for r in report.result("nothing_saveable").residuals if r.dtype.startswith("key<")]
    assert [(r.shape, r.dtype, r.bytes) for r in keys] == [((), str(key.dtype), key.dtype.itemsize)]
    assert report.arguments[2] == f"args[2]: {key.dtype}[]"


def _scanned_with_keys(policy: Any) -> Callable[..., Any]:
    def layers(w: Any, x: Any, raw: Any) -> Any:
        def step(carry: Any, wi: Any) -> Any:
            h, key = carry
            key, sub = jax.random.split(key)
            h = _remat(policy)(lambda h: jnp.tanh(h @ wi))(h)
            return (h * jax.random.uniform(sub, h.shape), key), None

        (h, _), _ = jax.lax.scan(step, (x, jax.random.wrap_key_data(raw)), w)
        return jnp.sum(h)

    return layers


def test_raw_uint32_keys_and_keys_in_scan_carries() -> None:
    args = (SDS((3, 8, 8), jnp.float32), SDS((2, 8), jnp.float32), jax.random.PRNGKey(1))
    assert_exact(_scanned_with_keys(NOTHING), *args, inner=_scanned_with_keys)


# --- jaxprs inside other containers ---------------------------------------------------------------

A, B = SDS((4, 4), jnp.float32), SDS((4,), jnp.float32)
EYE4 = 4.0 * jnp.eye(4, dtype=jnp.float32)

LINEAR = {
    "solve": (lambda a, b: jnp.sum(jnp.linalg.solve(a + EYE4, b) ** 2), (A, B)),
    "inv": (lambda a: jnp.sum(jnp.linalg.inv(a + EYE4)), (A,)),
    "slogdet": (lambda a: jnp.linalg.slogdet(a + EYE4)[1], (A,)),
    "cg": (lambda a, b: jnp.sum(spl.cg(lambda v: (a @ a.T + EYE4) @ v, b)[0]), (A, B)),
}


@pytest.mark.parametrize("name", LINEAR)
def test_linear_solves(name: str) -> None:
    fn, args = LINEAR[name]
    assert_exact(fn, *args)


# --- inputs keep weak types -----------------------------------------------------------------------


def test_weak_typed_input_keeps_bf16_residuals_bf16() -> None:
    def f(x: Any, scale: Any) -> Any:
        return jnp.sum(jnp.sin(jnp.sin(x * scale)).astype(jnp.float32))

    x = SDS((128, 128), jnp.bfloat16)
    report = assert_exact(f, x, jnp.array(0.5), policies=("everything_saveable",))
    residuals = report.result("everything_saveable").residuals
    assert {r.dtype for r in residuals if r.shape == (128, 128)} == {"bfloat16"}


# --- `none` with pass-through outputs -------------------------------------------------------------


def test_none_with_pass_through_and_repeated_outputs() -> None:
    def block(x: Any, w: Any) -> Any:
        h = jnp.tanh(x @ w)
        return h, h, x, 2.0

    def f(x: Any, w: Any) -> Any:
        a, b, c, k = jax.checkpoint(block)(x, w)
        return jnp.sum(a * b * c * k)

    def plain(x: Any, w: Any) -> Any:
        a, b, c, k = block(x, w)
        return jnp.sum(a * b * c * k)

    args = (SDS((4, 8), jnp.float32), SDS((8, 8), jnp.float32))
    report = audit(f, *args, policies=["none"])
    assert ours(report.result("none")) == truth(plain, args, "nothing_saveable", inner=lambda _: plain)
    assert all(r.primitive != "copy" for r in report.result("none").residuals)


# --- a checkpoint only inside a custom_vjp forward rule -------------------------------------------


def _make_custom(policy: Any) -> Callable[..., Any]:
    def layer(x: Any, w: Any) -> Any:
        return jnp.sin(jnp.tanh(x @ w) @ w)

    @jax.custom_vjp
    def op(x: Any, w: Any) -> Any:
        return layer(x, w)

    def fwd(x: Any, w: Any) -> Any:
        y = jax.checkpoint(layer, policy=policy)(x, w)
        return y, (x, w)

    def bwd(res: Any, g: Any) -> Any:
        return jax.vjp(layer, *res)[1](g)

    op.defvjp(fwd, bwd)
    return lambda x, w: jnp.sum(op(x, w) ** 2)


def test_scope_auto_finds_a_checkpoint_inside_a_custom_vjp_forward_rule() -> None:
    fn = _make_custom(None)
    args = (SDS((4, 8), jnp.float32), SDS((8, 8), jnp.float32))
    report = audit(fn, *args, policies=["nothing_saveable", "everything_saveable"])
    assert {r.scope for r in report.results} == {Scope.INNER}
    for result in report.results:
        assert ours(result) == truth(fn, args, result.policy, inner=_make_custom), result.policy


# --- literals, recompute, a policy JAX cannot differentiate under ---------------------------------


def test_a_literal_jax_keeps_costs_nothing() -> None:
    """JAX keeps the Python float of `x * 2.0` as a residual "from a literal"; it holds no memory,
    so the totals are JAX's other residuals exactly, and any literal row counts 0 bytes."""

    def f(x: Any) -> Any:
        return jnp.sum(jnp.sin(x * 2.0))

    x = SDS((16,), jnp.float32)
    listed = [src for _, src in saved_residuals(f, _concrete(x))]
    assert listed.count("from a literal") == 1  # the case under test: JAX lists one
    result = audit(f, x, policies=["none"]).result("none")
    assert ours(result) == truth(f, (x,), "none") == Counter({((16,), "float32"): 1})  # cos(2x)
    assert result.totals.total_bytes == 16 * 4
    assert all(r.bytes == 0 for r in result.residuals if r.kind is ResidualKind.LITERAL)


@pytest.mark.parametrize("model", ["mlp", "te_transformer", "fp8_block"])
def test_recompute_never_exceeds_the_forward_pass(model: str) -> None:
    from te_ckpt_audit import audit_target

    result = audit_target(f"sample_models/{model}.py:loss", ["nothing_saveable"]).result("nothing_saveable")
    assert 0 < result.recompute_flops <= result.forward_flops


def test_a_policy_jax_cannot_differentiate_under_fails_its_own_row() -> None:
    def f(x: Any) -> Any:
        z = jnp.exp(1j * x.astype(jnp.complex64))
        return jnp.real(jnp.sum(z * z))

    report = audit(f, SDS((4,), jnp.float32), policies=["everything_saveable", "nothing_saveable"])
    bad, good = report.result("everything_saveable"), report.result("nothing_saveable")
    if jax.config.values.get("jax_remat3"):  # JAX's new remat differentiates it plainly: no error to report
        assert bad.error is None and ours(bad) == truth(f, (SDS((4,), jnp.float32),), "everything_saveable")
        return
    assert bad.error is not None and "reduce_precision" in bad.error
    assert (bad.residuals, bad.totals.activation_bytes, bad.marks) == ((), 0, ())
    assert good.error is None and ours(good) == truth(f, (SDS((4,), jnp.float32),), "nothing_saveable")


# --- where residuals come from --------------------------------------------------------------------


def test_module_path_from_named_scopes_with_dropout() -> None:
    def f(w: Any, x: Any, key: Any) -> Any:
        with jax.named_scope("encoder"):
            with jax.named_scope("layer_0"):
                h = jnp.tanh(x @ w)
                h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h, 0.0)
        return jnp.sum(h * h)

    report = audit(f, SDS((8, 8), jnp.float32), SDS((4, 8), jnp.float32), jax.random.key(0), policies=["none"])
    dots = [e for e in report.equations if e.primitive == "dot_general"]
    assert [e.module for e in dots] == ["encoder/layer_0"]
    assert dots[0].source is not None and dots[0].source.file.endswith("test_programs.py")
    activations = [r for r in report.result("none").residuals if r.kind is ResidualKind.ACTIVATION]
    assert activations and {r.module for r in activations} == {"encoder/layer_0"}


def test_a_forward_rule_that_calls_its_own_custom_vjp_function() -> None:
    """The common `def fwd(x): return f(x), x`: the forward rule binds f again, undifferentiated."""

    @jax.custom_vjp
    def f(x: Any) -> Any:
        return jnp.sin(x)

    def fwd(x: Any) -> Any:
        return f(x), x

    def bwd(x: Any, g: Any) -> Any:
        return (g * jnp.cos(x),)

    f.defvjp(fwd, bwd)

    def loss(x: Any) -> Any:
        return jnp.sum(jax.checkpoint(lambda x: f(jnp.tanh(x)))(x) ** 2)

    assert_exact(loss, SDS((8,), jnp.float32), policies=("nothing_saveable", "everything_saveable"),
                 inner=lambda p: lambda x: jnp.sum(jax.checkpoint(lambda x: f(jnp.tanh(x)), policy=p)(x) ** 2))
