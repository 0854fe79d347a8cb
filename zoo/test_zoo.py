"""The zoo's invariant: for real models from JAX libraries, in training mode, te-ckpt-audit reports
exactly the residuals JAX keeps (same (shape, dtype) multiset, same byte total) under each policy,
where JAX's answer comes from the model with its own remat set to that policy through the model's
own hook (``make_loss``), never through te-ckpt-audit's jaxpr rewriting."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import te_ckpt_audit
from te_ckpt_audit._jax_compat import saved_residuals
from te_ckpt_audit.specs import AsIs, resolve_policy
from zoo import _outcomes, models

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _reference import bind_static  # noqa: E402  (the project's: closes over non-array leaves)

POLICIES = (
    "as-is",
    "none",
    "nothing_saveable",
    "checkpoint_dots",
    "checkpoint_dots_and_te_gemms",
    "everything_saveable",
)
MODELS = sorted(m.name for m in pkgutil.iter_modules(models.__path__) if not m.name.startswith("_"))

Residuals = Counter[tuple[tuple[int, ...], str]]


def _model(name: str) -> Any:
    """The zoo module, or a skip when its library is not installed in this environment."""
    try:
        return importlib.import_module(f"zoo.models.{name}")
    except ModuleNotFoundError as err:
        required = _required(name)
        if err.name and (required == err.name or required.startswith(err.name + ".")):
            pytest.skip(f"{required} is not installed here (see zoo/setup.sh)")
        raise


def _required(name: str) -> str:
    source = (models.__path__[0] + f"/{name}.py")
    for line in open(source):
        if line.startswith("REQUIRES = "):
            return str(eval(line.split("=", 1)[1]))  # a string literal
    raise AssertionError(f"zoo/models/{name}.py has no REQUIRES line")


def reference(module: Any, spec_text: str, args: tuple[Any, ...]) -> tuple[Residuals, int]:
    """JAX's saved residuals, as a (shape, dtype) multiset and a byte total, with the model's own
    remat set to the policy. Literals are left out: compile-time scalars, they cost nothing."""
    spec = resolve_policy(spec_text)
    if isinstance(spec, AsIs):
        fn = module.loss
    else:
        fn = module.make_loss(spec.policy)  # None for "none": remat removed
    f, dyn = bind_static(fn, args)
    avals = [aval for aval, src in saved_residuals(f, *dyn) if src != "from a literal"]
    # str(dtype) is how JAX prints it (float32, bfloat16, key<fry>); an extended dtype's itemsize
    # is its key data's size.
    multiset = Counter((tuple(a.shape), str(a.dtype)) for a in avals)
    return multiset, sum(int(np.prod(a.shape, dtype=np.int64)) * int(a.dtype.itemsize) for a in avals)


_audits: dict[str, tuple[Any, float]] = {}


def _audit(name: str, module: Any) -> tuple[Any, float]:
    """One te-ckpt-audit run of every policy per model (trace once), or the exception it raised."""
    if name not in _audits:
        start = time.perf_counter()
        try:
            report: Any = te_ckpt_audit.audit(module.loss, *module.loss_inputs(), policies=list(POLICIES))
        except Exception as err:  # noqa: BLE001 - recorded per row, re-raised by each test
            report = err
        _audits[name] = (report, time.perf_counter() - start)
    return _audits[name]


def _first_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text.splitlines()[0] if text else type(err).__name__


CASES = [(m, p) for m in MODELS for p in POLICIES]


@pytest.mark.parametrize(("model", "policy"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_residuals_equal_jax(model: str, policy: str) -> None:
    module = _model(model)
    report, audit_s = _audit(model, module)
    start = time.perf_counter()
    status, detail, reference_s = "error", "", 0.0
    try:
        truth, truth_bytes = reference(module, policy, module.loss_inputs())
        reference_s = time.perf_counter() - start
        if isinstance(report, BaseException):
            detail = _first_line(report)
            raise report
        result = report.result(policy)
        literal = getattr(te_ckpt_audit.ResidualKind, "LITERAL", None)
        listed = [r for r in result.residuals if r.kind is not literal]
        ours = Counter((tuple(r.shape), str(r.dtype)) for r in listed)
        status = "mismatch"
        detail = _difference(ours, truth)
        assert ours == truth, detail
        detail = f"totals differ: {result.totals.total_bytes} B reported, {truth_bytes} B in JAX"
        assert result.totals.total_bytes == truth_bytes, detail
        assert sum(r.bytes for r in listed) == truth_bytes
        status, detail = "match", f"{len(listed)} residuals, {truth_bytes} B"
    except Exception as err:
        if status == "error" and not detail:
            detail = _first_line(err)
        raise
    finally:
        _outcomes.record(_outcomes.Outcome(model, policy, status, detail, audit_s, reference_s))


def _difference(ours: Residuals, truth: Residuals) -> str:
    extra, missing = ours - truth, truth - ours
    return f"reported but not in JAX: {dict(extra)}; in JAX but not reported: {dict(missing)}"


@pytest.mark.parametrize("model", MODELS)
def test_the_tools_names_change_nothing_a_preset_saves(model: str) -> None:
    """`--name-lines` (issue 58): each matmul line of the model's own code gets a checkpoint name of
    the tool's; on real libraries' models every preset must keep exactly what it kept without them."""
    module = _model(model)
    report, _ = _audit(model, module)
    if isinstance(report, BaseException):
        pytest.skip(f"the audit itself failed: {_first_line(report)}")
    # under jax_remat3 a checkpoint_name can change what a preset keeps (jax 0.10.2's everything_saveable
    # does), the user's own as the tool's: the claim is the current remat's, checked there
    def run(named: bool) -> Any:
        return te_ckpt_audit.audit(module.loss, *module.loss_inputs(), policies=list(POLICIES), name_lines=named,
                                   remat3="off")

    for plain, with_names in zip(run(False).results, run(True).results, strict=True):
        assert (plain.policy, plain.totals, plain.recompute_flops) == (
            with_names.policy, with_names.totals, with_names.recompute_flops)
