"""Targets and their inputs: file and module forms, the `<fn>_inputs` convention, -D overrides."""

from __future__ import annotations

import textwrap

import jax
import pytest

from te_ckpt_audit.config import parse_defines
from te_ckpt_audit.errors import TargetError, UsageError
from te_ckpt_audit.trace._loading import load_inputs, load_target


def _write(tmp_path, name: str, body: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


MODEL = """
import jax, jax.numpy as jnp

def loss(x, scale):
    return jnp.sum(jnp.sin(x)) * scale

def loss_inputs(n: int = 4, scale: float = 1.0, dtype: str = "float32", flag: bool = False):
    return (jax.ShapeDtypeStruct((n,), jnp.dtype(dtype)), scale)

class Model:
    @staticmethod
    def apply(x):
        return jnp.sum(x)

def example_inputs():
    return (jax.ShapeDtypeStruct((2,), jnp.float32),)
"""


def test_file_target_and_default_inputs(tmp_path) -> None:
    path = _write(tmp_path, "model.py", MODEL)
    target = load_target(f"{path}:loss")
    inputs = load_inputs(target)
    assert inputs.source.endswith("model.py:loss_inputs")
    x, scale = inputs.args
    assert x.shape == (4,) and scale == 1.0


def test_dotted_attribute_falls_back_to_example_inputs(tmp_path) -> None:
    path = _write(tmp_path, "model2.py", MODEL)
    target = load_target(f"{path}:Model.apply")
    inputs = load_inputs(target)
    assert inputs.source.endswith(":example_inputs")
    assert inputs.args[0].shape == (2,)


def test_module_target() -> None:
    target = load_target("sample_models.mlp:loss")
    assert callable(target.fn)
    assert load_inputs(target).source == "sample_models.mlp:loss_inputs"


def test_package_file_is_imported_under_its_dotted_name() -> None:
    target = load_target("sample_models/te_transformer.py:loss")
    assert target.module.__name__ == "sample_models.te_transformer"


def test_overrides_are_typed_by_defaults(tmp_path) -> None:
    path = _write(tmp_path, "model3.py", MODEL)
    target = load_target(f"{path}:loss")
    inputs = load_inputs(target, defines=parse_defines(["n=16", "scale=2", "dtype=bfloat16", "flag=True"]))
    x, scale = inputs.args
    assert x.shape == (16,) and x.dtype == jax.numpy.bfloat16
    assert scale == 2.0 and isinstance(scale, float)
    assert dict(inputs.overrides) == {"n": 16, "scale": 2.0, "dtype": "bfloat16", "flag": True}


@pytest.mark.parametrize(
    ("pairs", "fragment"),
    [
        (["m=3"], "no parameter 'm'"),
        (["n=four"], "not an int"),
        (["n=1.5"], "not an int"),
        (["flag=1"], "not a bool"),
        (["n"], "not key=value"),
    ],
)
def test_bad_overrides(tmp_path, pairs, fragment) -> None:
    path = _write(tmp_path, "model4.py", MODEL)
    target = load_target(f"{path}:loss")
    with pytest.raises(UsageError, match=fragment):
        load_inputs(target, defines=parse_defines(pairs))


def test_explicit_inputs_callable(tmp_path) -> None:
    path = _write(tmp_path, "model5.py", MODEL)
    other = _write(
        tmp_path,
        "shapes.py",
        "import jax, jax.numpy as jnp\ndef big():\n    return (jax.ShapeDtypeStruct((64,), jnp.float32), 3.0)\n",
    )
    target = load_target(f"{path}:loss")
    assert load_inputs(target, f"{other}:big").args[0].shape == (64,)


@pytest.mark.parametrize(
    ("spec", "error", "fragment"),
    [
        ("missing.py:loss", UsageError, "no such file"),
        ("", UsageError, "empty target"),
        ("model.py", UsageError, "not of the form"),
        ("no_such_pkg_xyz.mod:loss", UsageError, "no module named"),
    ],
)
def test_bad_targets(spec, error, fragment) -> None:
    with pytest.raises(error, match=fragment):
        load_target(spec)


def test_user_code_errors_are_target_errors(tmp_path) -> None:
    bad = _write(tmp_path, "broken.py", "def loss(x:\n    return x\n")
    with pytest.raises(TargetError, match="syntax error") as err:
        load_target(f"{bad}:loss")
    assert isinstance(err.value, TargetError)  # exit 3
    raising = _write(tmp_path, "raising.py", "raise RuntimeError('boom at import')\n")
    with pytest.raises(TargetError, match="boom at import"):
        load_target(f"{raising}:loss")


def test_missing_attribute_suggests(tmp_path) -> None:
    path = _write(tmp_path, "model6.py", MODEL)
    with pytest.raises(UsageError) as err:
        load_target(f"{path}:los")
    assert "did you mean 'loss'" in err.value.hint


def test_no_inputs_says_how_to_provide_them(tmp_path) -> None:
    path = _write(tmp_path, "bare.py", "def loss(x):\n    return x\n")
    with pytest.raises(UsageError) as err:
        load_inputs(load_target(f"{path}:loss"))
    assert "loss_inputs" in err.value.hint and "pass inputs FILE.py:CALLABLE" in err.value.hint
    assert "--inputs FILE.py:CALLABLE" in err.value.worded({"inputs": "--inputs"})[1]  # as the command line says it
