"""`--name-lines` (issue 58, item 1): where a model names nothing, the tool names each matmul line of
its code, so that the search can decide on it and the pick can be audited before the code is edited.
The tool's names must change nothing else, and saving one must keep what the user's own
`checkpoint_name` at that line keeps."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from te_ckpt_audit import audit_target
from te_ckpt_audit._session import Session
from te_ckpt_audit.records import Point, Proposal, Synthesized, Throughput
from te_ckpt_audit.render.recommend import render_recommend_json, render_recommend_text
from te_ckpt_audit.search._recommend import recommend
from te_ckpt_audit.search._synthesis import name_costs
from te_ckpt_audit.trace._naming import line_name

GPT = "sample_models/gpt.py:loss"
GPT_FILE = Path("sample_models/gpt.py")
PRESETS = ["nothing_saveable", "checkpoint_dots", "checkpoint_dots_with_no_batch_dims", "everything_saveable"]


def _source(where: str) -> str:
    file, line = where.rsplit(":", 1)
    return Path(file).read_text().splitlines()[int(line) - 1]


def _line_of(text: str) -> int:
    (line,) = [i + 1 for i, s in enumerate(GPT_FILE.read_text().splitlines()) if text in s]
    return line


def test_each_matmul_line_inside_the_checkpoint_gets_its_name_and_nothing_else_does() -> None:
    session = Session.of_target(GPT, defines={"named": False}, name_lines=True)
    lines = session.line_names
    assert lines and set(lines) == set(session.checkpoint_names)  # the model itself names nothing
    for name, where in lines.items():
        assert name == line_name(*where.rsplit(":", 1)[:1], int(where.rsplit(":", 1)[1]))
        assert "@" in _source(where) or "einsum" in _source(where), where
    unembed = _line_of('@ params["unembed"]')  # a matmul outside the layer's checkpoint: not a candidate
    assert f"gpt_{unembed}" not in lines
    assert {f"gpt_{_line_of(t)}" for t in ('@ p["w_qkv"]', '@ p["w1"]', '@ p["w2"]', '@ p["w_o"]')} <= set(lines)


def test_the_tools_names_change_no_presets_bytes_or_recompute() -> None:
    """Under JAX's current remat. Under jax_remat3 (jax 0.10.2) a checkpoint_name changes what
    everything_saveable keeps, the user's own as the tool's: there the audit is JAX's, names and all."""
    plain = audit_target(GPT, PRESETS, defines={"named": False}, remat3="off")
    named = audit_target(GPT, PRESETS, defines={"named": False}, name_lines=True, remat3="off")
    for a, b in zip(plain.results, named.results, strict=True):
        assert (a.policy, a.totals, a.recompute_flops) == (b.policy, b.totals, b.recompute_flops)


@pytest.mark.parametrize(("own", "code"), [("ffn1", '@ p["w1"]'), ("qkv_proj", '@ p["w_qkv"]'),
                                           ("out_proj", '@ p["w_o"]')])
def test_saving_a_tools_name_keeps_what_the_users_own_name_there_keeps(own: str, code: str) -> None:
    users = audit_target(GPT, [f"save_only_these_names:{own}"])
    tools = audit_target(GPT, [f"save_only_these_names:gpt_{_line_of(code)}"], defines={"named": False},
                         name_lines=True)
    (u,), (t,) = users.results, tools.results
    assert t.totals.activation_bytes == u.totals.activation_bytes > 0
    assert t.recompute_flops == u.recompute_flops


def test_a_function_without_checkpoints_has_its_matmul_lines_named_everywhere(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def loss(w, x):\n"
        "    h = jnp.tanh(x @ w)\n"
        "    return jnp.sum(jnp.tanh(h @ w))\n"
        "def loss_inputs(batch: int = 8):\n"
        "    f = jax.ShapeDtypeStruct\n"
        "    return f((64, 64), jnp.float32), f((batch, 64), jnp.float32)\n")
    session = Session.of_target(f"{tmp_path / 'plain.py'}:loss", name_lines=True)
    assert set(session.line_names) == {"plain_3", "plain_4"}
    costs = {c.name: c for c in name_costs(session, sorted(session.line_names))}
    assert costs["plain_3"].line is not None and costs["plain_3"].line.endswith("plain.py:3")
    assert costs["plain_3"].bytes == 8 * 64 * 4  # x @ w, kept by the one checkpoint around the function


def test_the_pick_of_tool_names_says_the_calls_to_add_and_the_flag_that_audits_it_again() -> None:
    session = Session.of_target(GPT, defines={"named": False}, name_lines=True)
    w1, qkv = _line_of('@ p["w1"]'), _line_of('@ p["w_qkv"]')
    ffn1 = f"gpt_{w1}"
    rec = recommend(session, 1 << 30, presets=["nothing_saveable"])
    costs = name_costs(session, [ffn1, f"gpt_{qkv}"])
    pick = Point(f"save_only_these_names:{ffn1}", 8, 9 << 20, True, 0.01, 800.0)
    t = Throughput("batch", "batch", pick, (pick,), (pick.policy,), 10, False, (), "chip", "libtpu",
                   Synthesized(costs, (Proposal(8, pick.policy, 8 << 20, 0.01, True),), "exact", ()))
    rec = dataclasses.replace(rec, throughput=t)
    doc = json.loads(render_recommend_json(rec))
    at = f"sample_models/gpt.py:{w1}"
    code = f'checkpoint_name(<the matmul\'s result>, "{ffn1}")'
    assert doc["throughput"]["pick"]["cli"] == f"--policy save_only_these_names:{ffn1} -D batch=8 --name-lines"
    assert doc["throughput"]["pick"]["add"] == [{"at": at, "code": code}]
    assert {n["line"] for n in doc["throughput"]["synthesis"]["names"]} == {at, f"sample_models/gpt.py:{qkv}"}
    assert f"    at {at}: {code}" in render_recommend_text(rec).splitlines()
    # the spec pasted audits again with --name-lines, and keeps what the user's own ffn1 keeps
    again = audit_target(GPT, [doc["throughput"]["pick"]["cli"].split()[1]], defines={"named": False},
                         name_lines=True).results[0]
    own = audit_target(GPT, ["save_only_these_names:ffn1"]).results[0]
    assert again.totals.activation_bytes == own.totals.activation_bytes > 0


def test_without_a_matmul_line_the_search_still_says_where_to_name(tmp_path: Path) -> None:
    from te_ckpt_audit import UsageError, recommend_target
    from te_ckpt_audit.gpus import GpuRequest, gpu_model

    (tmp_path / "plain.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def loss(w, x):\n"
        "    h = jax.checkpoint(lambda x: jnp.tanh(jnp.sin(x * w)))(x)\n"
        "    return jnp.sum(jnp.tanh(h * w))\n"
        "def loss_inputs(batch: int = 8):\n"
        "    f = jax.ShapeDtypeStruct\n"
        "    return f((64,), jnp.float32), f((batch, 64), jnp.float32)\n")
    with pytest.raises(UsageError) as err:
        recommend_target(f"{tmp_path / 'plain.py'}:loss", gpu=GpuRequest(gpu_model("h100")), maximize="throughput",
                         synthesize=True)
    assert err.value.message == "synthesize chooses among the model's checkpoint names, and it has none"
    assert err.value.hint.startswith("name the largest activations first: at ")


def test_a_helper_that_several_lines_call_is_named_at_each_calling_line(tmp_path: Path) -> None:
    """A `_conv` every block calls: one name at its own line would be one decision for every call;
    the names go out to the lines that call it, where a user can paste each."""
    (tmp_path / "net.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def _mm(x, w):\n"
        "    return jnp.tanh(x @ w)\n"
        "def loss(w, x):\n"
        "    for _ in range(3):\n"
        "        x = _mm(x, w)\n"
        "    return jnp.sum(_mm(x, w))\n"
        "def loss_inputs():\n"
        "    f = jax.ShapeDtypeStruct\n"
        "    return f((64, 64), jnp.float32), f((8, 64), jnp.float32)\n")
    session = Session.of_target(f"{tmp_path / 'net.py'}:loss", name_lines=True)
    assert set(session.line_names) == {"net_6", "net_7"}  # the loop's line once, for its three calls
    nothing = audit_target(f"{tmp_path / 'net.py'}:loss", ["nothing_saveable", "save_only_these_names:net_6"],
                           name_lines=True).results
    assert nothing[1].totals.activation_bytes - nothing[0].totals.activation_bytes == 3 * 8 * 64 * 4


def test_the_python_api_names_a_functions_matmul_lines_too() -> None:
    import jax
    import jax.numpy as jnp

    from te_ckpt_audit import audit

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        h = jax.checkpoint(lambda x: jnp.tanh(x @ w))(x)
        return jnp.sum(h * h)

    args = (jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((8, 64), jnp.float32))
    name = f"test_naming_{loss.__code__.co_firstlineno + 1}"
    both = audit(loss, *args, policies=["nothing_saveable", f"save_only_these_names:{name}"], name_lines=True)
    nothing, saved = both.results
    assert saved.totals.activation_bytes - nothing.totals.activation_bytes == 8 * 64 * 4
