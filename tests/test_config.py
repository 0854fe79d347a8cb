"""[tool.te-ckpt-audit] in pyproject.toml."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from te_ckpt_audit.config import load_config
from te_ckpt_audit.errors import UsageError
from te_ckpt_audit.records import Budget

ROOT = Path(__file__).resolve().parent.parent


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(textwrap.dedent(text))
    return path


GOOD = """
[tool.te-ckpt-audit]
baseline = "base.json"
tolerance = 2.5

[[tool.te-ckpt-audit.targets]]
target = "m.py:loss"
defines = { layers = 4, dtype = "bfloat16" }
policies = ["checkpoint_dots"]
budget = "1MiB"
budgets = { checkpoint_dots = "512KiB" }
max_recompute = 50
"""


def test_good_config(tmp_path) -> None:
    cfg = load_config(_write(tmp_path, GOOD))
    (t,) = cfg.targets
    assert cfg.baseline == tmp_path / "base.json" and cfg.tolerance == 2.5
    assert t.defines == {"layers": "4", "dtype": "bfloat16"}
    assert t.budgets == (Budget(2**20), Budget(512 * 1024, "checkpoint_dots"))
    assert t.max_recompute == 50.0 and t.policies == ("checkpoint_dots",)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (GOOD.replace("budget =", "budjet ="), "unknown key 'budjet' in targets[0]"),
        (GOOD.replace("tolerance =", "tolerence ="), "unknown key 'tolerence'"),
        (GOOD.replace('budget = "1MiB"', 'budget = "1 MiBB"'), "not a size"),
        (GOOD.replace("max_recompute = 50", 'max_recompute = "lots"'), "must be a finite number"),
        (GOOD.replace('target = "m.py:loss"', ""), "has no target"),
        ("[tool.other]\n", "no [tool.te-ckpt-audit] section"),
        ("[tool.te-ckpt-audit]\n", "declares no targets"),
        ("not = [toml", "not valid TOML"),
    ],
)
def test_malformed_config(tmp_path, text: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        load_config(_write(tmp_path, text))


def test_unknown_key_suggests_the_right_one(tmp_path) -> None:
    with pytest.raises(UsageError) as err:
        load_config(_write(tmp_path, GOOD.replace("policies =", "policy =")))
    assert "did you mean 'policies'" in err.value.hint


def test_the_projects_own_config_is_valid() -> None:
    cfg = load_config(ROOT / "pyproject.toml")
    assert {t.target.split(":")[0].split("/")[-1] for t in cfg.targets} >= {"gpt.py", "te_transformer.py"}
    assert all(t.budgets for t in cfg.targets)


def test_a_targets_gpu_config_wins_over_the_sections_gpu(tmp_path) -> None:
    """`gpu` and `gpu_config` are one choice: a target's own replaces [tool.te-ckpt-audit]'s, as the
    config's documentation says, rather than being refused as "both"."""
    from te_ckpt_audit.gpus import gpu_model

    (tmp_path / "small.txtpb").write_text(gpu_model("h100").config_text(2**30))
    cfg = load_config(_write(tmp_path, """
        [tool.te-ckpt-audit]
        gpu = "a100"

        [[tool.te-ckpt-audit.targets]]
        target = "m.py:loss"
        gpu_config = "small.txtpb"

        [[tool.te-ckpt-audit.targets]]
        target = "m.py:other"
    """))
    own, inherited = cfg.targets
    assert own.gpu is not None and own.gpu.model.name == "small" and own.gpu.model.memory_bytes == 2**30
    assert inherited.gpu is not None and inherited.gpu.model.name == "a100-80gb"


@pytest.mark.parametrize("name", ["te_ckpt_audit", "te-ckpt_audit", "TE-CKPT-AUDIT", "te-ckpt-audt", "teckptaudit"])
def test_a_misspelled_table_is_an_error_not_a_gate_switched_off(tmp_path, name: str) -> None:
    # the baseline sits in the misspelled table: read as written, check would pass without it
    text = GOOD.replace("[tool.te-ckpt-audit]\n", f"[tool.{name}]\n", 1)
    with pytest.raises(UsageError) as err:
        load_config(_write(tmp_path, text))
    assert f"[tool.{name}] is not [tool.te-ckpt-audit]" in str(err.value)
    # alone, too: no table of ours at all is not "nothing to check, passed"
    with pytest.raises(UsageError, match="is not"):
        load_config(_write(tmp_path, f"[tool.{name}]\nbaseline = 'b.json'\n"))


def test_other_tools_tables_are_left_alone(tmp_path) -> None:
    cfg = load_config(_write(tmp_path, "[tool.ruff]\nline-length = 9\n[tool.pytest]\nx = 1\n" + GOOD))
    assert len(cfg.targets) == 1


def test_a_target_may_name_a_tpu_slice_with_its_optimizer_and_fit(tmp_path) -> None:
    from te_ckpt_audit.gpus import Optimizer

    text = GOOD.replace("max_recompute = 50", 'max_recompute = 50\ntpu = "v5e"\noptimizer = "adamw"\nfit = true\n'
                        'mesh = { data = 8 }')
    (t,) = load_config(_write(tmp_path, '[tool.te-ckpt-audit]\ngpu = "h100"\n' + text.split("\n", 3)[3])).targets
    assert t.tpu is not None and t.tpu.target.topology == "v5e:2x4" and t.tpu.optimizer is Optimizer.ADAMW
    assert t.gpu is None and t.peak.fit  # the section's gpu is not the TPU target's
    for extra, said in (('gpu = "h100"', "has both tpu and a GPU"), ("mem_fraction = 0.5", ".mem_fraction is about"),
                        ('tpu = "v5e:2x2"', "has 4 chips and the mesh 8 devices")):
        bad = text.replace('tpu = "v5e"\n', "") + "\n" + extra if extra.startswith("tpu") else text + "\n" + extra
        with pytest.raises(UsageError, match=said):
            load_config(_write(tmp_path, bad))


def test_a_target_may_ask_for_the_tools_names_on_its_matmul_lines(tmp_path) -> None:
    """`name_lines = true` (like --name-lines): a gate may budget a policy over the tool's names,
    gpt_52; anything but a bool is refused with the key named, not taken as on or off."""
    named = GOOD.replace("max_recompute = 50", "max_recompute = 50\nname_lines = true")
    (t,) = load_config(_write(tmp_path, named)).targets
    assert t.name_lines is True
    (plain,) = load_config(_write(tmp_path, GOOD)).targets
    assert plain.name_lines is False
    with pytest.raises(UsageError, match=r"targets\[0\]\.name_lines must be true or false, not 'yes'"):
        load_config(_write(tmp_path, GOOD.replace("max_recompute = 50", 'max_recompute = 50\nname_lines = "yes"')))
