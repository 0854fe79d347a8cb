"""Against real Transformer Engine: run in the te lane (`bash te_cpu/test.sh`), which builds TE for
CPU and traces on an emulated GPU. Skipped wherever TE does not import."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

try:
    import warnings

    with warnings.catch_warnings():  # TE's import touches deprecated JAX APIs
        warnings.simplefilter("ignore")
        import transformer_engine.jax as te
        from transformer_engine.common.recipe import DelayedScaling, MXFP8BlockScaling
        from transformer_engine.jax import checkpoint_policies as te_cp
        from transformer_engine.jax import flax as te_flax
        from transformer_engine.jax.dense import grouped_dense
except Exception as exc:  # TE absent, or present without a (real or emulated) CUDA driver
    pytest.skip(f"Transformer Engine does not import here: {exc}", allow_module_level=True)

from _reference import with_jax_flags

from te_ckpt_audit import Category, Outcome, ResidualKind, WarningCode, audit, audit_target, policies
from te_ckpt_audit._jax_compat import saved_residuals
from te_ckpt_audit.records import AuditReport
from te_ckpt_audit.render import warning_message

pytestmark = [
    pytest.mark.te,
    # TE's own deprecation and user warnings are not this suite's to fix
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

bf16, f32 = jnp.bfloat16, jnp.float32
B, S, D, F, H = 2, 16, 64, 128, 4
OURS_AND_TES = [
    (policies.te_gemms_saveable, te_cp.te_gemms_saveable),
    (policies.checkpoint_dots_and_te_gemms, te_cp.checkpoint_dots_and_te_gemms),
    (policies.dots_and_te_gemms_with_no_batch_dims, te_cp.dots_and_te_gemms_with_no_batch_dims),
]
POLICIES = [
    "checkpoint_dots",
    "checkpoint_dots_and_te_gemms",
    "dots_and_te_gemms_with_no_batch_dims",
    "te_gemms_saveable",
]


@contextlib.contextmanager
def no_recipe() -> Iterator[None]:
    yield


def _module_case(
    module: Any, recipe: Callable[[], Any] = no_recipe, shape: tuple[int, ...] = (B, S, D)
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """loss(params, x) for a TE Flax module, with ShapeDtypeStruct params from eval_shape."""
    x = jax.ShapeDtypeStruct(shape, bf16)
    with recipe():
        kwargs = {"deterministic": True} if _takes_deterministic(module) else {}
        params = jax.eval_shape(lambda k, x: module.init(k, x, **kwargs), jax.random.key(0), x)

    def loss(params: Any, x: jax.Array) -> jax.Array:
        with recipe():
            kwargs = {"deterministic": True} if _takes_deterministic(module) else {}
            out = module.apply(params, x, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        return jnp.sum(jnp.tanh(out.astype(f32)))

    return loss, (params, x)


def _takes_deterministic(module: Any) -> bool:
    return isinstance(module, te_flax.LayerNormMLP | te_flax.TransformerLayer)


def _grouped_case() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    g = 4

    def loss(x: jax.Array, kernel: jax.Array) -> jax.Array:
        sizes = jnp.full((g,), x.shape[0] // g, jnp.int32)
        return jnp.sum(jnp.tanh(grouped_dense(x, kernel, sizes).astype(f32)))

    return loss, (jax.ShapeDtypeStruct((B * S, D), bf16), jax.ShapeDtypeStruct((g, D, F), bf16))


def _fp8() -> Any:
    return te.autocast(enabled=True, recipe=DelayedScaling())


CASES = {
    "DenseGeneral": lambda: _module_case(te_flax.DenseGeneral(features=F, dtype=bf16)),
    "LayerNormMLP": lambda: _module_case(te_flax.LayerNormMLP(intermediate_dim=F, dtype=bf16)),
    "TransformerLayer": lambda: _module_case(
        te_flax.TransformerLayer(
            hidden_size=D, mlp_hidden_size=F, num_attention_heads=H, hidden_dropout=0.0,
            attention_dropout=0.0, dtype=bf16, self_attn_mask_type="no_mask",
        )
    ),
    "grouped_dense": _grouped_case,
    "DenseGeneral-FP8-DelayedScaling": lambda: _module_case(te_flax.DenseGeneral(features=F, dtype=bf16), _fp8),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, Callable[..., Any], tuple[Any, ...], AuditReport]:
    fn, args = CASES[request.param]()
    return request.param, fn, args, audit(fn, *args, policies=POLICIES)


def te_rows(report: AuditReport) -> list[Any]:
    rows = [e for e in report.equations if e.is_te_gemm]
    assert rows, "the case binds TE GEMMs"
    return rows


def test_te_primitives_are_recognised_by_identity(case) -> None:
    _, _, _, report = case
    real = policies._real_te_primitives()
    assert real is not None
    assert report.te == "real"
    assert all(not e.standin for e in te_rows(report))
    assert {e.primitive for e in te_rows(report)} <= {p.name for p in real}


def test_checkpoint_dots_recomputes_what_te_aware_policy_saves(case) -> None:
    _, _, _, report = case
    dots, te_aware = report.result("checkpoint_dots"), report.result("checkpoint_dots_and_te_gemms")
    saved = [e for e in te_rows(report) if te_aware.mark(e.id).outcome is Outcome.SAVED]
    assert saved, "some TE GEMM output is needed by the backward pass"
    for e in saved:
        assert dots.mark(e.id).outcome is Outcome.RECOMPUTED
    assert dots.totals.te_gemm_bytes == 0 < te_aware.totals.te_gemm_bytes


@pytest.mark.parametrize("policy", POLICIES)
def test_residuals_equal_jax(case, policy: str) -> None:
    _, fn, args, report = case
    from te_ckpt_audit.specs import resolve_policy

    leaves, tree = jax.tree_util.tree_flatten(args)

    def flat(*xs: Any) -> Any:
        return fn(*jax.tree_util.tree_unflatten(tree, xs))

    truth = Counter(
        (tuple(a.shape), str(np.dtype(a.dtype)))
        for a, src in saved_residuals(jax.checkpoint(flat, policy=resolve_policy(policy).policy), *leaves)
        if src != "from a literal"
    )
    ours = Counter((r.shape, r.dtype) for r in report.result(policy).residuals)
    assert ours == truth


def test_our_policies_agree_with_tes_on_every_equation(case) -> None:
    from te_ckpt_audit import Session  # noqa: F401  (rows come from the same trace)
    from te_ckpt_audit.trace._trace import trace

    _, fn, args, _ = case
    traced = trace(fn, args)
    Session(traced).report(["checkpoint_dots"])  # custom_vjp forward rules join the rows here
    for row in traced.rows.by_id.values():
        eqn = row.eqn
        avals = [v.aval for v in eqn.invars]
        for ours, theirs in OURS_AND_TES:
            assert bool(ours(eqn.primitive, *avals, **eqn.params)) == bool(
                theirs(eqn.primitive, *avals, **eqn.params)
            ), (eqn.primitive.name, ours)


def _emulated_cc() -> float:
    import os

    return float(os.environ.get("TE_CKPT_AUDIT_GPU_CC", "0"))


@pytest.mark.skipif(_emulated_cc() < 9.9, reason="MXFP8 needs compute capability 9.9 or more")
def test_mxfp8_on_an_emulated_blackwell() -> None:
    def mxfp8() -> Any:
        return te.autocast(enabled=True, recipe=MXFP8BlockScaling())

    # MXFP8 scales blocks of 32 along the token axes too
    fn, args = _module_case(te_flax.DenseGeneral(features=F, dtype=bf16), mxfp8, shape=(B, 32, D))
    report = audit(fn, *args, policies=["checkpoint_dots", "checkpoint_dots_and_te_gemms"])
    rows = te_rows(report)
    assert all(report.result("checkpoint_dots").mark(e.id).outcome is Outcome.RECOMPUTED for e in rows)
    assert report.result("checkpoint_dots_and_te_gemms").totals.te_gemm_bytes > 0


def test_te_sample_model_runs_on_real_te() -> None:
    report = audit_target("sample_models/te_transformer.py:loss", ["checkpoint_dots", "checkpoint_dots_and_te_gemms"])
    assert report.te == "real"
    rows = te_rows(report)
    assert len(rows) == 12  # 2 layers x (4 dense + 2 grouped MoE GEMMs)
    dots, te_aware = report.result("checkpoint_dots"), report.result("checkpoint_dots_and_te_gemms")
    assert all(dots.mark(e.id).outcome is Outcome.RECOMPUTED for e in rows)
    assert all(te_aware.mark(e.id).outcome is Outcome.SAVED for e in rows)
    assert report.emulated_device is not None and "sm_90" in report.emulated_device


# --- quantization: FP8 / MXFP8 / NVFP4 recipes (issue 23) ------------------------------------------

QB, QS, QD, QF = 2, 64, 128, 256  # MXFP8 scales blocks of 32, NVFP4 of 16 (and its Hadamard transform 16)
QNAME = "quantization"
SAVING = f"save_only_these_names:{QNAME}+te_gemms_saveable"
QUANT_POLICIES = ["none", "nothing_saveable", *POLICIES[1:], SAVING]


def _recipe(name: str) -> Callable[[], Any]:
    from transformer_engine.common import recipe as r

    made = {"delayed": r.DelayedScaling, "current": r.Float8CurrentScaling, "mxfp8": r.MXFP8BlockScaling,
            "nvfp4": getattr(r, "NVFP4BlockScaling", None)}[name]

    @contextlib.contextmanager
    def scope() -> Iterator[None]:
        # TE's NVFP4 code mixes Python floats with integer arrays: not this suite's strict promotion
        with te.autocast(enabled=True, recipe=made()), jax.numpy_dtype_promotion("standard"):
            yield

    return scope


NEEDS = {"delayed": 9.0, "current": 9.0, "mxfp8": 9.9, "nvfp4": 10.0}  # compute capability


def _quant_case(kind: str, recipe: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """loss(params, x) for a TE module under `recipe`, its quantizers named where TE lets a user
    name them (TransformerLayer does not); NVFP4's stochastic rounding takes an `sr_rng` stream."""
    named = {"quantization_checkpoint_name": QNAME}
    module = {
        "DenseGeneral": lambda: te_flax.DenseGeneral(features=QF, dtype=bf16, **named),
        "LayerNormMLP": lambda: te_flax.LayerNormMLP(intermediate_dim=QF, dtype=bf16, **named),
        "TransformerLayer": lambda: te_flax.TransformerLayer(
            hidden_size=QD, mlp_hidden_size=QF, num_attention_heads=H, hidden_dropout=0.0, attention_dropout=0.0,
            dtype=bf16, self_attn_mask_type="no_mask"),
    }[kind]()
    scope = _recipe(recipe)
    x = jax.ShapeDtypeStruct((QB, QS, QD), bf16)
    det = {"deterministic": True} if _takes_deterministic(module) else {}
    with scope():
        params = jax.eval_shape(lambda x: module.init({"params": jax.random.key(0), "sr_rng": jax.random.key(1)}, x,
                                                      **det), x)

    def loss(params: Any, x: jax.Array) -> jax.Array:
        with scope():
            out = module.apply(params, x, rngs={"sr_rng": jax.random.key(2)}, **det)
        out = out[0] if isinstance(out, tuple) else out
        return jnp.sum(jnp.tanh(out.astype(f32)))

    return loss, (params, x)


# LayerNormMLP and TransformerLayer under MXFP8 use cuDNN's normalization, which the emulated driver
# cannot plan (create_execution_plans fails): they run on a real Blackwell only.
QUANT_CASES = [(k, r) for r in NEEDS for k in ("DenseGeneral", "LayerNormMLP", "TransformerLayer")
               if not (r == "mxfp8" and k != "DenseGeneral")]


@pytest.fixture(scope="module", params=QUANT_CASES, ids=[f"{k}-{r}" for k, r in QUANT_CASES])
def quant_case(request: pytest.FixtureRequest) -> tuple[str, str, Callable[..., Any], tuple[Any, ...], AuditReport]:
    kind, recipe = request.param
    if _emulated_cc() < NEEDS[recipe]:
        pytest.skip(f"{recipe} needs compute capability {NEEDS[recipe]} (the blackwell run has it)")
    fn, args = _quant_case(kind, recipe)
    named = kind != "TransformerLayer"
    with jax.numpy_dtype_promotion("standard"):  # TE's forward rules are traced here, outside its scope
        report = audit(fn, *args, policies=QUANT_POLICIES if named else QUANT_POLICIES[:-1])
    return kind, recipe, fn, args, report


def _jax_residuals(fn: Callable[..., Any], args: tuple[Any, ...], policy: str) -> Counter[Any]:
    from te_ckpt_audit.specs import resolve_policy

    leaves, tree = jax.tree_util.tree_flatten(args)

    def flat(*xs: Any) -> Any:
        return fn(*jax.tree_util.tree_unflatten(tree, xs))

    spec = resolve_policy(policy)
    f = flat if spec.policy is None else jax.checkpoint(flat, policy=spec.policy)
    with jax.numpy_dtype_promotion("standard"):
        found = saved_residuals(f, *leaves)
    return Counter((tuple(a.shape), str(np.dtype(a.dtype))) for a, src in found if src != "from a literal")


def test_blackwell_quantized_residuals_equal_jax(quant_case) -> None:
    """Every recipe and policy, the quantization-saving spec included: the residuals are JAX's."""
    _, _, fn, args, report = quant_case
    for result in report.results:
        assert Counter((r.shape, r.dtype) for r in result.residuals) == _jax_residuals(fn, args, result.policy), (
            result.policy)


def test_blackwell_quantizations_are_tes_own_and_labelled(quant_case) -> None:
    kind, recipe, _, _, report = quant_case
    assert policies._real_te_quantizers() is not None
    quantize = [e for e in report.equations if e.is_te_quantize]
    assert quantize and all(not e.standin for e in quantize)
    everything = report.result("none")
    kept = [r for r in everything.residuals if r.category is Category.QUANTIZED]
    assert kept and everything.totals.quantized_bytes == sum(r.bytes for r in kept if r.kind is ResidualKind.ACTIVATION)
    data = {r.dtype for r in kept if r.quantized}
    assert data <= {"float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"} and data, data
    assert any(r.scale_of in {e.id for e in quantize} for r in kept)


def test_blackwell_requantization_is_counted_and_the_saving_spec_ends_it(quant_case) -> None:
    kind, recipe, _, _, report = quant_case
    assert report.result("none").requantized == 0
    for policy in ("nothing_saveable", "te_gemms_saveable", "checkpoint_dots_and_te_gemms"):
        result = report.result(policy)
        assert result.requantized > 0, policy
        (warned,) = [w for w in result.warnings if w.code is WarningCode.TE_REQUANTIZED]
        assert warned.delayed == (recipe == "delayed") and warned.runs == result.requantized
        assert (warned.saving_spec is None) == (recipe == "delayed" or not warned.quantizer_names)
    if kind == "TransformerLayer":
        return  # its quantizers take no checkpoint name in TE 2.20.2: nothing to save them by
    saved = report.result(SAVING)
    if recipe == "delayed":  # the forward quantize updates the amax history: it runs again anyway
        assert saved.requantized > 0
        # said though the quantize equations' outputs are saved: what saving them keeps, no spec to save more
        (warned,) = [w for w in saved.warnings if w.code is WarningCode.TE_REQUANTIZED]
        assert (warned.delayed, warned.saving_spec, warned.runs) == (True, None, saved.requantized)
        assert warned.kept_bytes == saved.totals.quantized_bytes > 0
        assert "runs again whatever is saved" in warning_message(warned)
    elif kind == "DenseGeneral" or recipe in ("current", "nvfp4"):
        assert saved.requantized == 0, (kind, recipe, saved.requantized)


_FLAGS = [("jax_remat3",), ("jax_remat3", "jax_custom_vjp3")]


@pytest.mark.skipif(tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12),
                    reason="jax 0.10's remat3 asks a rule of no policy but its own")
@pytest.mark.parametrize("flags", _FLAGS, ids=["+".join(f) for f in _FLAGS])
@pytest.mark.parametrize("name", ["DenseGeneral", "LayerNormMLP"])
def test_jaxs_new_remat_with_real_te(name: str, flags: tuple[str, ...]) -> None:
    """Issue 48 with real TE: under jax_remat3 alone JAX recomputes TE's dense (a custom_vjp) whole,
    so checkpoint_dots_and_te_gemms keeps no TE GEMM; with jax_custom_vjp3 too, the rule
    te_ckpt_audit.policies gives TE's GEMMs keeps exactly what the current remat keeps. Under either,
    the audit's residuals are JAX's own."""
    from te_ckpt_audit.specs import resolve_policy

    fn, args = CASES[name]()
    leaves, tree = jax.tree_util.tree_flatten(args)

    def flat(*xs: Any) -> Any:
        return fn(*jax.tree_util.tree_unflatten(tree, xs))

    policy = resolve_policy("checkpoint_dots_and_te_gemms").policy

    def kept() -> Counter:
        return Counter((tuple(a.shape), str(np.dtype(a.dtype))) for a, src in
                       saved_residuals(jax.checkpoint(flat, policy=policy), *leaves)
                       if src != "from a literal")

    def te_kept() -> int:
        return sum("te_gemm" in src or "gemm" in src.lower() for _, src in
                   saved_residuals(jax.checkpoint(flat, policy=policy), *leaves))

    now, now_te = kept(), te_kept()
    new, new_te = with_jax_flags(flags, kept), with_jax_flags(flags, te_kept)
    report = with_jax_flags(flags, lambda: audit(fn, *args, policies=["checkpoint_dots_and_te_gemms"]))
    result = report.result("checkpoint_dots_and_te_gemms")
    assert Counter((r.shape, r.dtype) for r in result.residuals) == new
    assert now_te > 0
    if "jax_custom_vjp3" in flags:
        assert (new, new_te) == (now, now_te) and result.totals.te_gemm_bytes > 0
    else:
        assert new_te == 0 and result.totals.te_gemm_bytes == 0
