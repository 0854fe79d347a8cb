"""Every policy spec form resolves; bad ones fail with a hint."""

from __future__ import annotations

import jax
import pytest

from te_ckpt_audit import policies
from te_ckpt_audit.errors import PolicySpecError
from te_ckpt_audit.specs import AsIs, Custom, NoCheckpoint, Preset, available_policies, resolve_policy

cp = jax.checkpoint_policies


@pytest.mark.parametrize(
    "name",
    [n for n in dir(cp) if not n.startswith("_") and n not in {
        "save_from_both_policies", "save_only_these_names", "save_any_names_but_these",
        "save_anything_except_these_names", "offload_dot_with_no_batch_dims",
        "save_and_offload_only_these_names",
    } and not isinstance(getattr(cp, n), type)],  # jax 0.11 also lists the factories' classes
)
def test_every_plain_jax_policy_resolves_by_name(name: str) -> None:
    spec = resolve_policy(name)
    assert isinstance(spec, Preset) and spec.policy is getattr(cp, name)


def test_te_aware_policies_resolve_to_ours() -> None:
    assert resolve_policy("te_gemms_saveable").policy is policies.te_gemms_saveable
    assert resolve_policy("checkpoint_dots_and_te_gemms").policy is policies.checkpoint_dots_and_te_gemms
    assert (
        resolve_policy("dots_and_te_gemms_with_no_batch_dims").policy
        is policies.dots_and_te_gemms_with_no_batch_dims
    )


def test_special_specs() -> None:
    assert isinstance(resolve_policy("none"), NoCheckpoint)
    assert isinstance(resolve_policy("as-is"), AsIs)


def test_parametric_specs() -> None:
    assert resolve_policy("save_only_these_names:ffn1, context").names == ("ffn1", "context")
    assert resolve_policy("save_any_names_but_these:x").names == ("x",)
    s = resolve_policy("save_and_offload_only_these_names:save=a,b;offload=c")
    assert (s.names, s.offload_names) == (("a", "b"), ("c",))
    assert resolve_policy("offload_dot_with_no_batch_dims").policy is not None
    assert resolve_policy("offload_dot_with_no_batch_dims:src=device,dst=pinned_host").policy is not None
    assert resolve_policy("save_anything_except_these_names:a").saves_everything_regardless


def test_every_listed_form_is_documented_once() -> None:
    forms = [f for f, _ in available_policies()]
    assert len(forms) == len(set(forms))
    assert all(text for _, text in available_policies())


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("checkpoint_dot", "did you mean 'checkpoint_dots'"),
        ("nothing_savable", "did you mean 'nothing_saveable'"),
        ("save_only_these_names:", "names no checkpoint name"),
        ("save_and_offload_only_these_names:keep=a", "malformed"),
        ("save_and_offload_only_these_names:", "no names"),
        ("no_such_module_xyz:policy", "does not resolve"),
        ("save_only_these_namez:ffn1", "did you mean 'save_only_these_names'"),
        ("", "empty policy spec"),
    ],
)
def test_bad_specs_say_how_to_fix_them(spec: str, fragment: str) -> None:
    with pytest.raises(PolicySpecError) as err:
        resolve_policy(spec)
    assert fragment in str(err.value)
    assert isinstance(err.value, PolicySpecError)  # exit 2


def test_custom_policy_from_file(tmp_path) -> None:
    f = tmp_path / "my_policy.py"
    f.write_text("def save_all(prim, *avals, **params):\n    return True\nnot_callable = 3\n")
    spec = resolve_policy(f"{f}:save_all")
    assert isinstance(spec, Custom) and spec.policy(jax.lax.sin_p) is True
    with pytest.raises(PolicySpecError, match="not a callable"):
        resolve_policy(f"{f}:not_callable")
    with pytest.raises(PolicySpecError, match="no attribute"):
        resolve_policy(f"{f}:missing")


def test_custom_policy_from_module() -> None:
    spec = resolve_policy("te_ckpt_audit.policies:checkpoint_dots_and_te_gemms")
    assert spec.policy is policies.checkpoint_dots_and_te_gemms
