"""recommend: the least recompute that fits a budget, its frontier, its spec, snippet and JSON.

The model is sample_models/eight_names.py at four layers (batch 4, input width 32): layer i's GEMM
output is named `layer{i}`, widths 48, 160, 24, 96 (float32), so saving layer i keeps 4*4*width
bytes and spares the backward pass layer i's GEMM: 2*4*K*N FLOPs.
"""

from __future__ import annotations

import functools
import json
import math

import jax
import pytest

from sample_models import eight_names
from te_ckpt_audit import Session, registry
from te_ckpt_audit.analysis._analysis import analyse
from te_ckpt_audit.errors import PolicySpecError, UsageError
from te_ckpt_audit.policies import SaveFromBoth
from te_ckpt_audit.records import Candidate, CandidateKind, Recommendation, Scope
from te_ckpt_audit.render import format_bytes, maxtext_config, python_snippet, render_recommend_json
from te_ckpt_audit.search._recommend import pareto_frontier, recommend, spec_text
from te_ckpt_audit.specs import Custom, NamePolicy, resolve_policy
from te_ckpt_audit.trace._trace import Traced, trace

BYTES = {"layer0": 4 * 48 * 4, "layer1": 4 * 160 * 4, "layer2": 4 * 24 * 4, "layer3": 4 * 96 * 4}
GEMM = {"layer0": 2 * 4 * 32 * 48, "layer1": 2 * 4 * 48 * 160, "layer2": 2 * 4 * 160 * 24, "layer3": 2 * 4 * 24 * 96}
# nothing_saveable reruns every forward equation but the loss's tail (square, sum, divide)
NOTHING = 124192


@functools.cache
def four() -> Traced:
    return trace(eight_names.loss, eight_names.loss_inputs(layers=4), "eight_names:loss")


@functools.cache
def exhaustive() -> Recommendation:
    return recommend(Session(four()), 10**12, exhaustive=True)


def test_winner_is_exact_on_structured_fields() -> None:
    # budget 3328 B: layer1+layer2 (2944 B) spares 61440+30720 FLOPs, more than any other subset that fits
    rec = recommend(Session(four()), 3328)
    win = rec.recommended
    assert win is not None
    assert win.policy == "save_only_these_names:layer1,layer2"
    assert win.kind is CandidateKind.NAMES
    assert (win.saved, win.offloaded, win.base) == (("layer1", "layer2"), (), None)
    assert win.activation_bytes == BYTES["layer1"] + BYTES["layer2"] == 2944
    assert win.recompute_flops == NOTHING - GEMM["layer1"] - GEMM["layer2"] == 32032
    assert win.host_bytes == 0 and win.fits
    assert len(rec.evaluated) <= rec.max_evals
    assert rec.names == ("layer0", "layer1", "layer2", "layer3")


@pytest.mark.parametrize("budget", [1, 400, 1200, 2000, 3328, 4500, 5000, 6000, 13000])
def test_same_optimum_as_exhaustive(budget: int) -> None:
    every = [c for c in exhaustive().evaluated if c.error is None]
    assert len(every) == len(set(c.policy for c in every)) >= 4 * 16
    best = min(c.recompute_flops for c in every if c.activation_bytes <= budget)
    rec = recommend(Session(four()), budget)
    assert rec.recommended is not None
    assert rec.recommended.recompute_flops == best
    assert rec.recommended.activation_bytes <= budget


def test_every_frontier_point_is_an_analysis() -> None:
    rec = recommend(Session(four()), 3328)
    assert rec.frontier == pareto_frontier(rec.evaluated)
    sizes = [c.activation_bytes for c in rec.frontier]
    flops = [c.recompute_flops for c in rec.frontier]
    assert sizes == sorted(set(sizes)) and flops == sorted(set(flops), reverse=True)
    assert rec.frontier[0].policy == "nothing_saveable" and rec.frontier[-1].policy == "everything_saveable"
    for c in rec.frontier:  # the spec typed back into --policy gives the same figures
        again = analyse(four(), resolve_policy(c.policy), Scope.AUTO)
        assert (again.totals.activation_bytes, again.recompute_flops) == (c.activation_bytes, c.recompute_flops)
    shown = {r.policy for r in rec.report.results}
    assert {c.policy for c in rec.frontier} <= shown


def test_combined_spec_is_a_named_hashable_policy() -> None:
    text = "save_only_these_names:layer0,layer2+checkpoint_dots_and_te_gemms"
    spec = resolve_policy(text)
    assert isinstance(spec.parts[0], NamePolicy) and spec.names == ("layer0", "layer2")
    assert isinstance(spec.policy, SaveFromBoth) and spec.policy.__name__ == text
    hash(spec.policy)
    assert spec_text("checkpoint_dots_and_te_gemms", ["layer0", "layer2"]) == text
    result = analyse(four(), spec, Scope.AUTO)
    dots = analyse(four(), resolve_policy("checkpoint_dots_and_te_gemms"), Scope.AUTO)
    assert result.totals.activation_bytes >= dots.totals.activation_bytes
    with pytest.raises(PolicySpecError, match="cannot be combined"):
        resolve_policy("save_and_offload_only_these_names:save=a;offload=b+checkpoint_dots")
    with pytest.raises(PolicySpecError, match="empty"):
        resolve_policy("checkpoint_dots++checkpoint_dots")


def _run_snippet(snippet: str) -> object:
    namespace: dict[str, object] = {"layer": lambda x: x}
    exec(snippet, namespace)  # noqa: S102 (our own generated code)
    return namespace["policy"]


@pytest.mark.parametrize("kind", list(CandidateKind))
def test_snippet_builds_the_same_policy(kind: CandidateKind) -> None:
    rec = recommend(Session(four()), 1000, allow_offload=True)
    some = [c for c in rec.evaluated if c.kind is kind][:3]
    assert some
    for c in some:
        policy = _run_snippet(python_snippet(c))
        again = analyse(four(), Custom("snippet", policy), Scope.AUTO)  # type: ignore[arg-type]
        assert (again.totals.activation_bytes, again.totals.host_bytes, again.recompute_flops) == (
            c.activation_bytes, c.host_bytes, c.recompute_flops)


def test_offload_moves_names_to_host() -> None:
    rec = recommend(Session(four()), 1000, allow_offload=True)
    win = rec.recommended
    assert win is not None and win.kind is CandidateKind.OFFLOAD
    # every name kept, on device or host: the recompute of saving all four names, nothing over 1000 B on device
    assert win.recompute_flops == NOTHING - sum(GEMM.values())
    assert win.activation_bytes <= 1000
    assert win.activation_bytes + win.host_bytes == sum(BYTES.values())
    policy = _run_snippet(python_snippet(win))
    again = analyse(four(), Custom("snippet", policy), Scope.AUTO)  # type: ignore[arg-type]
    assert (again.totals.activation_bytes, again.totals.host_bytes) == (win.activation_bytes, win.host_bytes)
    config = maxtext_config(win, rec.names)
    assert config.splitlines()[0] == "remat_policy: 'custom'"
    assert all(f"#   {n}: 'offload'" in config for n in win.offloaded)


def test_maxtext_keys() -> None:
    c = Candidate("save_only_these_names:qkv_proj,mlpwo", CandidateKind.NAMES, None, ("qkv_proj", "mlpwo"), (),
                  0, 0, 0, 0, True)
    assert maxtext_config(c, ("mlpwi", "mlpwo", "qkv_proj")).splitlines() == [
        "remat_policy: 'custom'",
        "decoder_layer_input: 'device'",
        "mlpwi: 'remat'",
        "mlpwo: 'device'",
        "qkv_proj: 'device'",
    ]


def test_nothing_fits_gives_the_closest() -> None:
    # under the model's own checkpoints (scope inner), every policy keeps each layer's input
    from sample_models import gpt

    traced = trace(gpt.loss, gpt.loss_inputs(layers=2, seq=8, d_model=32, d_ff=64, vocab=32), "gpt:loss")
    rec = recommend(Session(traced), 1, max_evals=6)
    assert rec.recommended is None and not rec.fits
    assert rec.closest is not None
    assert rec.closest.activation_bytes == min(c.activation_bytes for c in rec.evaluated)
    assert rec.closest.activation_bytes > 1
    assert len(rec.evaluated) == 6


@pytest.mark.parametrize("budget", [0, -5, math.nan, math.inf, -math.inf])
def test_bad_budget(budget: float) -> None:
    with pytest.raises(UsageError, match="budget"):
        recommend(Session(four()), budget)


def test_bad_max_evals_and_empty_space() -> None:
    with pytest.raises(UsageError, match="at least 1"):
        recommend(Session(four()), 1000, max_evals=0)
    plain = trace(lambda x: jax.numpy.sum(jax.numpy.sin(x)), (jax.ShapeDtypeStruct((4,), "float32"),), "plain")
    with pytest.raises(UsageError, match="no checkpoint names and no presets"):
        recommend(Session(plain), 1000, presets=())


def test_json_shape_strict_and_deterministic() -> None:
    rec = recommend(Session(four()), 3328)
    text = render_recommend_json(rec)
    assert text == render_recommend_json(recommend(Session(four()), 3328))
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert doc["schema"] == "te-ckpt-audit-recommend/16"
    assert doc["fits"] is True and doc["closest"] is None
    win = doc["recommended"]
    assert (win["policy"], win["activation_bytes"], win["recompute_flops"]) == (
        "save_only_these_names:layer1,layer2", 2944, 32032)
    assert win["python"].startswith("import jax\n") and win["maxtext"] is None  # not a MaxText model
    assert [(f["policy"], f["activation_bytes"], f["recompute_flops"]) for f in doc["frontier"]] == [
        (c.policy, c.activation_bytes, c.recompute_flops) for c in rec.frontier
    ]
    assert doc["evaluations"] == len(doc["evaluated"]) == len(rec.evaluated)


# --- the command ---------------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

from te_ckpt_audit_cli.app import app  # noqa: E402
from te_ckpt_audit_cli.recommend_cmd import RecommendFormat, renderer  # noqa: E402
from typer.testing import CliRunner, Result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EIGHT = str(ROOT / "sample_models" / "eight_names.py") + ":loss"
PREFIX = "te-ckpt-audit: error: "
OK, NOTHING_FITS, USAGE = 0, 1, 2  # the exit codes issue 15 sets for recommend


def cli(*args: str) -> Result:
    return CliRunner().invoke(app, ["recommend", *args])


def test_cli_prints_spec_snippet_maxtext_frontier_and_plot() -> None:
    result = cli(EIGHT, "-D", "layers=4", "--budget", "3328B")
    assert result.exit_code == OK, result.stderr
    out = result.stdout
    assert "recommended: --policy save_only_these_names:layer1,layer2\n" in out
    assert '    policy = jax.checkpoint_policies.save_only_these_names("layer1", "layer2")\n' in out
    assert "MaxText" not in out  # eight_names is no MaxText model: no MaxText block (issue 41, item 5)
    plot = out.rstrip("\n").rsplit("\n\n", 1)[1]  # the plot is the last paragraph
    assert plot.splitlines()[0].endswith("│A") or "│" in plot.splitlines()[0]
    assert max(len(line) for line in plot.splitlines()) <= 80
    assert "A nothing_saveable" in plot and "★" in plot and "┊ budget 3.25 KiB" in plot


def test_cli_nothing_fits_exits_1_with_the_closest() -> None:
    gpt = str(ROOT / "sample_models" / "gpt.py") + ":loss"
    small = ["-D", "layers=2", "-D", "seq=8", "-D", "d_model=32", "-D", "d_ff=64", "-D", "vocab=32"]
    result = cli(gpt, *small, "--budget", "1B", "--max-evals", "3", "-f", "json")
    assert result.exit_code == NOTHING_FITS
    doc = json.loads(result.stdout)
    assert doc["recommended"] is None and doc["fits"] is False
    closest = doc["closest"]
    assert closest["activation_bytes"] == min(c["activation_bytes"] for c in doc["evaluated"])
    assert result.stderr.splitlines() == [
        f"te-ckpt-audit: nothing fits 1 B; closest: {closest['policy']} at "
        f"{format_bytes(closest['activation_bytes'])}"
    ]


NO_NAMES = """\
import jax
import jax.numpy as jnp


def loss(x):
    return jnp.sum(jnp.sin(jnp.sin(x)))


def loss_inputs():
    return (jax.ShapeDtypeStruct((8,), jnp.float32),)
"""


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "0B"], "--budget must be a finite size above zero"),
        (["--budget", "0GiB"], "--budget must be a finite size above zero"),
        (["--budget", "-1"], "not a size"),
        (["--budget", "nan"], "not a size"),
        (["--budget", "inf"], "not a size"),
        (["--budget", "1KiB", "--max-evals", "0"], "--max-evals must be at least 1"),
        (["--budget", "1KiB", "--no-presets"], "plain.py:loss has no checkpoint names and no presets"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.py").write_text(NO_NAMES)
    result = cli("plain.py:loss", *args)
    assert result.exit_code == USAGE
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX + message), result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("fmt", list(RecommendFormat))
def test_every_format_is_handled(fmt: RecommendFormat, tmp_path: Path) -> None:
    assert renderer(fmt) is not None
    out = tmp_path / f"report.{fmt.value}"
    result = cli(EIGHT, "-D", "layers=4", "--budget", "3328B", "-f", fmt.value, "-o", str(out), "--max-evals", "12")
    assert result.exit_code == OK, result.stderr
    assert "save_only_these_names:layer1" in out.read_text()


SHARDED = """\
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding, PartitionSpec as P


def loss(w, x):
    h = checkpoint_name(x @ w, "hidden")
    return jnp.sum(jnp.sin(h) @ w)


def loss_inputs(mesh=None):
    x = NamedSharding(mesh, P("data")) if mesh is not None else None
    return (jax.ShapeDtypeStruct((16, 16), jnp.float32),
            jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=x))
"""


def test_budget_is_per_device_on_a_mesh(tmp_path: Path) -> None:
    from te_ckpt_audit import recommend_target

    path = tmp_path / "sharded.py"
    path.write_text(SHARDED)
    # `hidden` is 8x16 float32 = 512 B in all, split over data=2: 256 B a device
    rec = recommend_target(f"{path}:loss", 256, mesh="data=2", max_evals=4)
    win = rec.recommended
    assert rec.mesh is not None and [(a.name, a.size) for a in rec.mesh.axes] == [("data", 2)]
    assert win is not None and win.policy in ("checkpoint_dots", "save_only_these_names:hidden")
    assert (win.activation_bytes, win.global_activation_bytes) == (256, 512)
    whole = recommend_target(f"{path}:loss", 256, max_evals=4).recommended  # 512 B do not fit in all
    assert whole is not None and whole.activation_bytes == 0 and whole.recompute_flops > win.recompute_flops


def test_sys_exit_in_the_target_is_the_targets_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """recommend runs the user's code under the same rule as audit: sys.exit there is exit 3."""
    from te_ckpt_audit import TargetError, recommend_target

    monkeypatch.chdir(tmp_path)
    (tmp_path / "quits.py").write_text(
        "import sys, jax, jax.numpy as jnp\n"
        "def loss(x):\n    sys.exit(0)\n"
        "def loss_inputs():\n    return (jax.ShapeDtypeStruct((4,), jnp.float32),)\n"
    )
    with pytest.raises(TargetError, match=r"sys\.exit\(0\)"):
        recommend_target("quits.py:loss", 1024)


def _unnamed_loss(params: tuple[jax.Array, jax.Array], x: jax.Array) -> jax.Array:
    import jax.numpy as jnp

    w1, w2 = params

    def block(x: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ w1)  # the line of h: a dot (8 KiB) and a tanh (8 KiB) per layer
        return jnp.sin(h @ w2)  # the line of the output: the same again

    for _ in range(2):
        x = jax.checkpoint(block)(x)
    return jnp.sum(x)


def test_a_model_without_names_is_told_which_tensors_to_name() -> None:
    """recommend can only pick presets without checkpoint names: it says where the largest
    activations are made, their bytes exactly, and the name to give each."""
    f32 = jax.numpy.float32
    s = jax.ShapeDtypeStruct
    rec = recommend(Session(trace(_unnamed_loss, ((s((64, 64), f32), s((64, 64), f32)), s((32, 64), f32)), "t")),
                    20 * 1024)
    assert rec.names == () and rec.recommended is not None and rec.recommended.kind is CandidateKind.PRESET
    import inspect

    first = inspect.getsourcelines(_unnamed_loss)[1]
    lines = [n.line for n in rec.to_name]
    assert sorted(int(line.rsplit(":", 1)[1]) for line in lines if line) == [first + 6, first + 7]
    widest = max((r for r in rec.report.results), key=lambda r: r.totals.activation_bytes)
    for n in rec.to_name:
        assert n.bytes == sum(r.bytes for r in widest.residuals if r.kind.value == "activation" and r.source
                              and f"{r.source.file}:{r.source.line}" == n.line)
        assert n.name.isidentifier() and n.code() == f'x = checkpoint_name(x, "{n.name}")'
    assert sum(n.bytes for n in rec.to_name) == widest.totals.activation_bytes
    assert len({n.name for n in rec.to_name}) == len(rec.to_name)
    assert rec.to_dict()["to_name"][0]["code"] == rec.to_name[0].code()


def _looped_loss(w: jax.Array, x: jax.Array) -> jax.Array:
    import jax.numpy as jnp

    for i in range(3):  # a block per layer, as Flax's `Block_0`, `Block_1`, ... each its own module path
        with jax.named_scope(f"block_{i}"):
            x = jax.checkpoint(lambda x: jnp.sin(jnp.tanh(x @ w)))(x)
    return jnp.sum(x)


def test_a_line_a_loop_runs_is_one_place_to_name() -> None:
    """A new user's Flax loop of blocks was told to add four names, one per block's module path, all
    at the one line that makes them (one `checkpoint_name` there names them all): the places are the
    user's lines, each named as --name-lines names it, with every block's bytes."""
    import inspect

    from te_ckpt_audit.trace._naming import line_name

    f32 = jax.numpy.float32
    s = jax.ShapeDtypeStruct
    rec = recommend(Session(trace(_looped_loss, (s((64, 64), f32), s((32, 64), f32)), "t")), 20 * 1024)
    line = inspect.getsourcelines(_looped_loss)[1] + 5
    file = rec.to_name[0].line.rsplit(":", 1)[0] if rec.to_name and rec.to_name[0].line else ""
    assert [(n.line, n.name) for n in rec.to_name] == [(f"{file}:{line}", line_name(file, line))]
    widest = max((r for r in rec.report.results), key=lambda r: r.totals.activation_bytes)
    made = [r for r in widest.residuals if r.kind.value == "activation" and r.bytes]
    assert rec.to_name[0].bytes == sum(r.bytes for r in made) == widest.totals.activation_bytes > 0
    assert {r.module for r in made} == {"block_0", "block_1", "block_2"}  # every block's, not one's


def test_the_presets_a_recommendation_lists_are_those_it_searched() -> None:
    """Under --no-presets the record said every preset was searched, and --synthesize compiled them
    all beside its pick (and answered one): `presets` is what was searched."""
    assert recommend(Session(four()), 3328, presets=()).presets == ()
    assert recommend(Session(four()), 3328, presets=["checkpoint_dots"]).presets == ("checkpoint_dots",)
    assert recommend(Session(four()), 3328).presets == tuple(registry.presets())


def test_values_an_installed_library_makes_are_placed_by_module_path_with_the_layers_merged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hugging Face's BERT is called from one line of the user's: every activation was placed at that
    line (a name there names the logits). A value made inside an installed library's code is placed
    by its module path with the layer indices merged (one name in that code names every layer), at
    the library's line."""
    from te_ckpt_audit import recommend_target

    (tmp_path / "tlib.py").write_text(
        "__te_ckpt_audit_library__ = True  # as an installed library's file reads to the tool\n"
        "import jax, jax.numpy as jnp\n"
        "def model(w, x):\n"
        "    for i in range(3):\n"
        "        with jax.named_scope(f'layer_{i}'), jax.named_scope('attention'):\n"
        "            x = jax.checkpoint(lambda x: jnp.tanh(x @ w))(x)\n"
        "    return x\n")
    (tmp_path / "user.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "from tlib import model\n"
        "def loss(w, x):\n"
        "    return jnp.sum(model(w, x))\n"
        "def loss_inputs():\n"
        "    f = jax.ShapeDtypeStruct\n"
        "    return f((64, 64), jnp.float32), f((32, 64), jnp.float32)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rec = recommend_target("user.py:loss", budget="1KiB")
    assert [(n.where, n.line, n.name) for n in rec.to_name] == [("layer_*/attention", "tlib.py:6", "attention")]
    widest = max((r for r in rec.report.results), key=lambda r: r.totals.activation_bytes)
    made = [r for r in widest.residuals if r.kind.value == "activation" and r.bytes]
    assert rec.to_name[0].bytes == sum(r.bytes for r in made) == widest.totals.activation_bytes > 0
    assert {r.module for r in made} == {f"layer_{i}/attention" for i in range(3)}  # every layer's


def test_a_model_with_names_is_not_told_to_name_more() -> None:
    assert recommend(Session(four()), 3328).to_name == ()


@pytest.mark.parametrize(("keyword", "said"), [
    ("batchh", "the inputs callable takes no keyword 'batchh'"),  # was "... is None", after every compile
    ("dtype", "the inputs callable's dtype is 'float32', not a positive int"),
])
def test_maximize_checks_its_keyword_before_any_compile(keyword: str, said: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38, item 18: --maximize's keyword and start value are checked before the search."""
    from te_ckpt_audit import UsageError, recommend_target
    from te_ckpt_audit.gpus import GpuRequest, gpu_model
    from te_ckpt_audit.search._fit import fit_on_gpu

    def no_compile(*args: object, **kwargs: object) -> None:
        raise AssertionError("compiled before the keyword was checked")

    monkeypatch.setattr("te_ckpt_audit.search._recommend.fit_on_gpu", no_compile)
    assert fit_on_gpu is not no_compile
    with pytest.raises(UsageError) as caught:
        recommend_target("sample_models/mlp.py:loss", gpu=GpuRequest(gpu_model("h100")), maximize=keyword)
    assert said in caught.value.message


def test_the_maxtext_block_expresses_the_pick_and_only_for_maxtexts_names() -> None:
    """Issue 41, item 5: a plain model gets no MaxText block; a MaxText model's pick is its own
    setting; a preset MaxText has no setting for is said so, never a custom policy of 'remat's."""
    from te_ckpt_audit.records import Candidate, CandidateKind
    from te_ckpt_audit.render.recommend import maxtext_block

    def cand(policy: str, kind: CandidateKind, saved: tuple[str, ...] = (), maxtext: str | None = None) -> Candidate:
        return Candidate(policy, kind, None, saved, (), 0, 0, 0, 1, True, maxtext_policy=maxtext)

    everything = cand("everything_saveable", CandidateKind.PRESET)
    assert maxtext_block(everything, ("ffn1", "moe_ffn1")) is None  # gpt.py's names are not MaxText's keys
    said = maxtext_block(everything, ("mlpwi", "out_proj"))
    assert said is not None and "MaxText has no remat_policy for everything_saveable" in said
    assert "'remat'" not in said and not said.startswith("remat_policy: 'custom'")
    full = cand("nothing_saveable", CandidateKind.PRESET, maxtext="full")
    assert maxtext_block(full, ("ffn1",)) == "remat_policy: 'full'"
    names = cand("save_only_these_names:mlpwi", CandidateKind.NAMES, ("mlpwi",))
    block = maxtext_block(names, ("mlpwi", "out_proj"))
    assert block is not None and "mlpwi: 'device'" in block and "out_proj: 'remat'" in block


BATCHLESS = """\
import jax
import jax.numpy as jnp


def loss(w, x):
    return jnp.sum(jnp.sin(x @ w) @ w)


def loss_inputs(batch: int = 4, seed: int = 1):
    return jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((batch, 8), jnp.float32)
"""


def test_a_throughput_keyword_that_changes_no_input_is_refused_before_any_compile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46, item 12 (e): `throughput:seed` "won" at its largest value, its step time flat."""
    from te_ckpt_audit import UsageError, recommend_target
    from te_ckpt_audit.gpus import GpuRequest, gpu_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text(BATCHLESS)
    with pytest.raises(UsageError) as caught:
        recommend_target("m.py:loss", gpu=GpuRequest(gpu_model("h100")), maximize="throughput:seed")
    assert "seed=2 traces the same inputs as seed=1, so it is not a batch" in caught.value.message


def test_maximize_throughput_answers_once_within_its_one_compile_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46, item 5 and 12 (d): the memory pick was compiled (8 points of its own) and printed
    beside the fastest pair, each with a Python block; --max-compiles 1 compiled 3 points."""
    from te_ckpt_audit import recommend_target
    from te_ckpt_audit.gpus import GpuRequest, gpu_model
    from te_ckpt_audit.records import Point, Throughput
    from te_ckpt_audit.render import render_recommend_html, render_recommend_text

    asked: dict[str, object] = {}

    def no_fit(*args: object, **kwargs: object) -> None:
        raise AssertionError("the memory pick was compiled beside the throughput search")

    def fake_search(build, first, policies, keyword, start, request, **kw):  # type: ignore[no-untyped-def]
        asked.update(kw, policies=policies, keyword=keyword, start=start)
        best = Point(policies[-1], 2 * start, 10**6, True, 0.001, 2 * start / 0.001)
        return Throughput(keyword, keyword, best, (best,), tuple(policies), kw["max_compiles"], False, ())

    monkeypatch.setattr("te_ckpt_audit.search._recommend.fit_on_gpu", no_fit)
    monkeypatch.setattr("te_ckpt_audit.search._recommend.target_search", fake_search)
    rec = recommend_target("sample_models/mlp.py:loss", gpu=GpuRequest(gpu_model("h100")), maximize="throughput",
                           max_compiles=1)
    assert asked["max_compiles"] == 1 and asked["keyword"] == "batch" and asked["start"] == 8
    assert rec.throughput is not None and rec.gpu is not None
    assert rec.compiles == len(rec.throughput.points)  # the search's points, no memory pick compiled beside them
    text = render_recommend_text(rec)
    assert text.count("python:") == 1 and "recommended: --policy" not in text and "(not compiled)" not in text
    best = rec.throughput.best
    assert best is not None and f"--policy {best.policy} -D batch=16" in text
    starred = [line for line in text.splitlines() if line.startswith(" * ")]
    assert len(starred) == 1 and best.policy in starred[0]
    page = render_recommend_html(rec)
    assert "Recommended:" not in page and page.count("<h2>Python</h2>") <= 1


def test_a_synthesis_limit_too_small_to_pick_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--synthesize --max-compiles 1` compiled nothing, then said "no point compiled fits the the chip:
    ... more GPUs or a larger memory fraction" and exited 1 (nothing fits) for a step that fits: its
    first batch needs two compiles. Refused before the target runs; a search that compiles nothing
    says the limit ended it; a TPU's miss names chips."""
    from test_cli import cli

    from te_ckpt_audit import recommend_target
    from te_ckpt_audit.gpus import GpuRequest, gpu_model
    from te_ckpt_audit.records import Point, Throughput
    from te_ckpt_audit.render.recommend import no_best_words

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    with pytest.raises(UsageError) as err:
        recommend_target("sample_models/no_such_file.py:loss", gpu=GpuRequest(gpu_model("h100")),
                         maximize="throughput", synthesize=True, max_compiles=1)
    assert err.value.message.startswith("synthesize compiles 2 steps (nothing saved, every name saved) before")
    result = cli("recommend", "sample_models/mlp.py:loss", "--gpu", "h100", "--maximize", "throughput",
                 "--synthesize", "--max-compiles", "1")
    assert result.exit_code == 2 and "--max-compiles 1 is too few" in result.stderr
    nothing = Throughput("batch", "batch", None, (), ("full",), 1, True, (), device="chip")
    assert no_best_words(nothing) == "no point was compiled: the limit of 1 compile(s) ended the search first " \
                                     "(raise it)"
    refused = Throughput("batch", "batch", None, (Point("full", 8, 10**12, False, 1.0, 8.0),), ("full",), 8,
                         device="chip")
    assert no_best_words(refused) == "no point compiled fits the chip: a smaller batch or more chips"


def test_no_pick_blames_what_failed_time_or_memory() -> None:
    """Issue 46, item 12 (f): an A100 whose estimate failed ended "no point compiled fits"."""
    from te_ckpt_audit.records import Point, Throughput
    from te_ckpt_audit.render.recommend import no_best_words

    untimed = Point("full", 8, 10**9, True, None, None, "NOT_FOUND: Cannot find key: sm_80")
    too_big = Point("full", 8, 10**12, False, 1.0, 8.0)
    broken = Point("full", 8, None, False, None, None, "it did not compile")

    def t(*points: Point) -> Throughput:
        return Throughput("batch", "batch", None, points, ("full",), 8, False, ())

    assert no_best_words(t(untimed), "a100-80gb") == ("the steps fit the a100-80gb but their time could not be "
                                                        "estimated: NOT_FOUND: Cannot find key: sm_80")
    assert no_best_words(t(too_big), "h100").startswith("no point compiled fits the h100")
    assert no_best_words(t(broken)) == "no point compiled: it did not compile"


def test_a_plain_jax_model_with_a_few_of_maxtexts_names_gets_no_maxtext_block() -> None:
    """Issue 56, item 5: `recommend` printed MaxText's remat settings for the plain JAX GPT (its
    `context`, `qkv_proj` and `out_proj` are MaxText's names, `ffn1` and `ffn2` are not); a model
    named as MaxText names (the Llama sample, every name a MaxText key) keeps its block."""
    import json as _json

    from test_cli import cli

    gpt = cli("recommend", "sample_models/gpt.py:loss", "--budget", "1MiB", "-f", "json")
    llama = cli("recommend", "sample_models/llama.py:loss", "--budget", "1MiB", "-f", "json")
    assert gpt.exit_code == llama.exit_code == 0, gpt.stderr + llama.stderr
    assert _json.loads(gpt.stdout)["recommended"]["maxtext"] is None
    assert "remat_policy" in _json.loads(llama.stdout)["recommended"]["maxtext"]
    assert "MaxText" not in cli("recommend", "sample_models/gpt.py:loss", "--budget", "1MiB").stdout


def test_recommend_on_a_mesh_says_the_inputs_are_not_sharded_as_the_audit_does(tmp_path: Path) -> None:
    """Issue 56, item 6: `recommend --mesh data=2` with unsharded inputs said nothing (audit warns):
    its per-device budget then reads the whole model's bytes."""
    import json as _json

    from test_cli import cli

    (tmp_path / "plain.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def loss(w, x):\n"
        "    return jnp.sum(jnp.tanh(x @ w))\n"
        "def loss_inputs(batch: int = 8):\n"
        "    f = jax.ShapeDtypeStruct\n"
        "    return f((64, 64), jnp.float32), f((batch, 64), jnp.float32)\n")
    args = ("recommend", f"{tmp_path / 'plain.py'}:loss", "--budget", "1MiB", "--mesh", "data=2")
    text, doc = cli(*args), cli(*args, "-f", "json")
    assert text.exit_code == doc.exit_code == 0, text.stderr
    assert any(line.startswith("! [inputs-replicated] no input is sharded over the mesh data=2")
               for line in text.stdout.splitlines())
    assert [f["code"] for f in _json.loads(doc.stdout)["findings"]] == ["inputs-replicated"]


def test_maximize_on_a_keyword_that_changes_no_input_is_refused_before_any_compile(tmp_path: Path) -> None:
    """Issue 56, item 6: `--maximize KEY` on a keyword that never stops fitting doubled to its
    2**62 cap and bisected into values above it, each a failed trial."""
    from te_ckpt_audit import Session, UsageError
    from te_ckpt_audit.gpus import GpuRequest, gpu_model
    from te_ckpt_audit.search._fit import largest_fitting

    (tmp_path / "km.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def loss(w, x):\n"
        "    return jnp.sum(jnp.tanh(x @ w))\n"
        "def loss_inputs(batch: int = 8, unused: int = 1):\n"
        "    f = jax.ShapeDtypeStruct\n"
        "    return f((64, 64), jnp.float32), f((batch, 64), jnp.float32)\n")

    def build(value: int) -> Session:
        return Session.of_target(f"{tmp_path / 'km.py'}:loss", defines={"unused": value})

    with pytest.raises(UsageError, match="unused=2 traces the same inputs as unused=1"):
        largest_fitting(build, "unused", 1, "nothing_saveable", GpuRequest(gpu_model("h100")))
