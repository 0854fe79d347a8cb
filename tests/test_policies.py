"""Each TE-aware policy's verdict on each primitive kind, and drop-in use with jax and flax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.extend.core import Primitive

from sample_models import te_standin
from te_ckpt_audit import policies
from te_ckpt_audit._jax_compat import saved_residuals

f32 = jnp.float32


def _eqn(fn, *shapes):
    avals = [jax.ShapeDtypeStruct(s, f32) for s in shapes]
    eqn = jax.make_jaxpr(fn)(*avals).jaxpr.eqns[0]
    while eqn.primitive.name == "jit":  # jax.nn.scaled_matmul is jitted
        eqn = eqn.params["jaxpr"].jaxpr.eqns[0]
    return eqn


def _verdict(policy, eqn) -> bool:
    return bool(policy(eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params))


def _named(name: str) -> Primitive:
    return Primitive(name)


DOT = _eqn(jnp.matmul, (4, 8), (8, 2))
BATCHED_DOT = _eqn(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), (3, 4, 8), (3, 8, 2))
SIN = _eqn(jnp.sin, (4,))
TE_GEMM = _eqn(lambda a, b: te_standin.gemm(a, b, ((1,), (0,))), (4, 8), (8, 2))
SCALED = _eqn(  # jax.nn.scaled_matmul: scaled_matmul_wrapper
    lambda a, b, sa, sb: jax.nn.scaled_matmul(a, b, sa, sb), (1, 4, 32), (1, 8, 32), (1, 4, 1), (1, 8, 1)
)

# (equation or primitive name, te_gemms_saveable, dots_and_te_gemms_with_no_batch_dims,
#  checkpoint_dots_and_te_gemms)
CASES = [
    (DOT, False, True, True),
    (BATCHED_DOT, False, False, True),
    (SIN, False, False, False),
    (TE_GEMM, True, True, True),
    (SCALED, True, True, True),
    ("te_gemm_ffi_wrapper", True, True, True),  # TE's name before March 2026
    ("te_gemm_v2_ffi_wrapper", True, True, True),
    ("te_grouped_gemm_ffi_wrapper", True, True, True),
    ("te_grouped_gemm_d2h_group_sizes_ffi_wrapper", False, False, False),  # moves no activations
    ("te_gemm_v2_ffi", False, False, False),  # the inner primitive is not what autodiff sees
]


@pytest.mark.parametrize(("what", "te_only", "no_batch", "dots"), CASES, ids=lambda c: getattr(c, "primitive", c))
def test_verdicts(what, te_only: bool, no_batch: bool, dots: bool) -> None:
    if isinstance(what, str):  # a bare primitive of that name, with one operand of a matmul's shape
        prim, avals, params = _named(what), (jax.ShapeDtypeStruct((4, 8), f32),), {}
    else:
        prim, avals, params = what.primitive, [v.aval for v in what.invars], what.params
    got = [
        bool(p(prim, *avals, **params))
        for p in (
            policies.te_gemms_saveable,
            policies.dots_and_te_gemms_with_no_batch_dims,
            policies.checkpoint_dots_and_te_gemms,
        )
    ]
    assert got == [te_only, no_batch, dots]


def test_policies_are_named_hashable_and_equal_by_value() -> None:
    a, b = policies.checkpoint_dots_and_te_gemms, policies.dots_and_te_gemms_with_no_batch_dims
    assert (a.__name__, b.__name__) == ("checkpoint_dots_and_te_gemms", "dots_and_te_gemms_with_no_batch_dims")
    again = policies.SaveFromBoth(a.name, a.first, a.second)
    assert again == a and hash(again) == hash(a) and again != b


def test_jax_checkpoint_dots_misses_te_gemms() -> None:
    """The problem this project exists for."""
    assert _verdict(jax.checkpoint_policies.checkpoint_dots, TE_GEMM) is False
    assert _verdict(jax.checkpoint_policies.checkpoint_dots, DOT) is True


def test_grouped_gemm_standin_is_a_te_gemm() -> None:
    eqn = jax.make_jaxpr(lambda a, b, g: te_standin.grouped_gemm(a, b, g, ((1,), (1,))))(
        jax.ShapeDtypeStruct((8, 4), f32), jax.ShapeDtypeStruct((2, 4, 3), f32), jax.ShapeDtypeStruct((2,), jnp.int32)
    ).jaxpr.eqns[0]
    assert eqn.primitive.name == "te_grouped_gemm_ffi_wrapper"
    assert policies.is_te_gemm(eqn.primitive)
    assert _verdict(policies.checkpoint_dots_and_te_gemms, eqn) is True


@pytest.mark.parametrize(
    "policy",
    [policies.te_gemms_saveable, policies.checkpoint_dots_and_te_gemms, policies.dots_and_te_gemms_with_no_batch_dims],
)
def test_drop_in_for_jax_checkpoint(policy) -> None:
    def f(x, k):
        return jnp.sum(jnp.tanh(te_standin.dense(jnp.tanh(x), k)))

    x, k = jnp.ones((4, 8), f32), jnp.ones((8, 2), f32) * 0.1
    plain = jax.grad(f, argnums=(0, 1))(x, k)
    remat = jax.grad(jax.checkpoint(f, policy=policy), argnums=(0, 1))(x, k)
    for a, b in zip(plain, remat, strict=True):
        assert jnp.allclose(a, b)
    kinds = [src for _, src in saved_residuals(jax.checkpoint(f, policy=policy), x, k)]
    # JAX's new remat alone recomputes a custom_vjp (TE's dense) whole, whatever the policy: the
    # audit's remat3-changes-policy finding (tests/test_remat3.py); with jax_custom_vjp3 too, kept
    from te_ckpt_audit._jax_compat import custom_vjp3_on, remat3_on

    kept = not remat3_on() or (custom_vjp3_on() and policies.KEPT_UNDER_REMAT3)
    assert any("te_gemm_v2_ffi_wrapper" in s for s in kinds) == kept


def test_drop_in_for_flax_remat() -> None:
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            k = self.param("k", nn.initializers.lecun_normal(), (x.shape[-1], 8))
            return jnp.tanh(te_standin.dense(x, k))

    Remat = nn.remat(Block, policy=policies.checkpoint_dots_and_te_gemms)
    x = jnp.ones((2, 4), f32)
    params = Remat().init(jax.random.key(0), x)
    grads = jax.grad(lambda p: jnp.sum(Remat().apply(p, x)))(params)
    assert grads["params"]["k"].shape == (4, 8)


def test_audit_labels_each_te_aware_policy_by_its_name() -> None:
    from te_ckpt_audit import audit

    report = audit(
        lambda x, k: jnp.sum(jnp.tanh(te_standin.dense(x, k))),
        jax.ShapeDtypeStruct((4, 8), f32),
        jax.ShapeDtypeStruct((8, 2), f32),
        policies=[policies.checkpoint_dots_and_te_gemms, policies.dots_and_te_gemms_with_no_batch_dims],
    )
    labels = [r.policy for r in report.results]
    assert labels == ["checkpoint_dots_and_te_gemms", "dots_and_te_gemms_with_no_batch_dims"]
