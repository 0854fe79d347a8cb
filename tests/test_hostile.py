"""Hostile use, class by class (issue 20's second held-out pass): no file lost, no gate silently
off, no internal error, no injected line, and a process that ends. Each test names its class; the
first table holds the inputs that are one line on stderr and an exit code, nothing else written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from te_ckpt_audit_cli.exit_codes import ExitCode
from test_bad_input import Case, _set_up, case, check_case
from test_cli import MODEL, PREFIX, cli

ROOT = Path(__file__).resolve().parent.parent
USAGE, TARGET = ExitCode.USAGE, ExitCode.TARGET

BASELINE = {"schema": "te-ckpt-audit-baseline/2", "entries": []}


def _baseline(entries: int = 1, **extra: object) -> str:
    rows = [
        {"target": f"t{i}.py:loss", "inputs": None, "defines": {}, "scope": "auto", "mesh": None,
         "activation_bytes": {"none": i}}
        for i in range(entries)
    ]
    return json.dumps({**BASELINE, "entries": rows, **extra})


DEEP_JSON = "[" * 200_000 + "]" * 200_000
HUGE_INT = _baseline().replace('"none": 0', '"none": ' + "9" * 5000)
DUPLICATE_KEY = _baseline().replace('"scope": "auto"', '"scope": "auto", "scope": "outer"')
NEWER = json.dumps({"schema": "te-ckpt-audit-baseline/3", "entries": []})
BAD_ENTRY = _baseline(3).replace('"none": 2', '"none": -2')

# --- one line on stderr, an exit code, no file written or replaced --------------------------------

CASES = [
    # data loss: --save-baseline refuses, and leaves as they are, files it cannot read as a baseline
    case("save-over-the-model", "model.py:loss --save-baseline model.py", USAGE, "is not a baseline this version"),
    case("save-over-pyproject", "model.py:loss --save-baseline pyproject.toml", USAGE, "left as it is",
         pyproject__toml="[project]\nname = 'x'\n"),
    case("save-over-newer-schema", "model.py:loss --save-baseline b.json", USAGE, "te-ckpt-audit-baseline/3",
         b__json=NEWER),
    case("save-over-a-bad-entry", "model.py:loss --save-baseline b.json", USAGE, "left as it is", b__json=BAD_ENTRY),
    case("save-over-the-report", "model.py:loss -o same.json --save-baseline same.json", USAGE,
         "--output and --save-baseline both name"),
    # exit 4 on hostile input: bounded reading and parsing
    case("config-tool-is-a-string", "check", USAGE, "has no [tool.te-ckpt-audit] section",
         pyproject__toml='tool = "x"\n'),
    case("baseline-nested-deep", "model.py:loss --baseline b.json", USAGE, "nested too deeply", b__json=DEEP_JSON),
    case("baseline-5000-digits", "model.py:loss --baseline b.json", USAGE, "is malformed", b__json=HUGE_INT),
    case("baseline-duplicate-key", "model.py:loss --baseline b.json", USAGE, "appears twice", b__json=DUPLICATE_KEY),
    case("baseline-dev-zero", "model.py:loss --baseline /dev/zero", USAGE, "not a regular file"),
    case("config-dev-zero", "check --config /dev/zero", USAGE, "not a regular file"),
    case("define-minus-signs", ["model.py:loss", "-D", "batch=" + "-" * 100_000], USAGE, "characters long"),
    case("define-deep-expression", ["model.py:loss", "-D", "batch=" + "-" * 4000 + "1"], USAGE, "not an int"),
    case("inputs-nested-deep", "model.py:deep", USAGE, "nested too deeply",
         model="def deep(w, x):\n    return loss(w, x)\n"
               "def deep_inputs():\n    d = loss_inputs()[0]\n    for _ in range(10_000):\n        d = {'a': d}\n"
               "    return d, loss_inputs()[1]\n"),
    # a gate never silently off
    check_case("config-baseline-empty", "baseline must be a path", 'baseline = ""'),
    # exit codes as docs/reference/exit-codes.md says
    case("offload-reversed", "model.py:loss -p offload_dot_with_no_batch_dims:src=pinned_host,dst=device", USAGE,
         "offloads from src=device to dst=pinned_host only"),
    case("offload-nowhere", "model.py:loss -p offload_dot_with_no_batch_dims:dst=nowhere", USAGE,
         "not from src=device to dst=nowhere"),
    case("define-mesh-with-a-mesh", "model.py:meshy --mesh data=2 -D mesh=x", USAGE, "is the mesh itself",
         model="meshy = loss\ndef meshy_inputs(mesh=None):\n    return loss_inputs()\n"),
    case("mesh-over-the-limit", "model.py:loss --mesh data=2049", USAGE, "more than the 2048 virtual CPU devices"),
    # model code that replaces JAX's checkpointing is refused, named
    case("jax-checkpoint-replaced", "model.py:loss", TARGET, "replaced jax.checkpoint",
         model="jax.checkpoint = lambda f, *a, **k: f\n"),
]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path


@pytest.fixture(autouse=True)
def _jax_checkpoint_restored() -> object:
    """A case replaces jax.checkpoint in this process: put JAX's own back afterwards."""
    import jax

    saved = jax.checkpoint
    yield
    jax.checkpoint = saved


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_hostile_input_is_one_line_and_an_exit_code(folder: Path, c: Case) -> None:
    _set_up(folder, c)
    outputs = {"-o", "--output", "--save-baseline"} & set(c.argv)
    args = [*c.argv, *([] if outputs else ["-o", "out.json"])]
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir()}
    result = cli(*args)
    assert result.exit_code == c.code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), result.stderr
    assert c.fragment in lines[0]
    assert result.stdout == ""
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir()} == before


# --- baselines: entries kept, writers take turns ------------------------------------------------------


def test_a_baseline_with_a_byte_order_mark_or_newer_entries_keeps_them(folder: Path) -> None:
    newer = {"target": "x.py:loss", "inputs": None, "defines": {}, "scope": "auto", "mesh": None,
             "gpu": "h100", "activation_bytes": {"none": 7}}
    doc = json.loads(_baseline(2))
    doc["entries"].append(newer)
    (folder / "b.json").write_text("\ufeff" + json.dumps(doc), encoding="utf-8")
    result = cli("model.py:loss", "-p", "none", "--save-baseline", "b.json", "-o", "out.json")
    assert result.exit_code == 0, result.stderr
    saved = json.loads((folder / "b.json").read_text())["entries"]
    assert len(saved) == 4 and newer in saved  # two kept, one added, the newer one as it was


def test_parallel_writers_lose_no_entry(folder: Path) -> None:
    for i in range(8):
        (folder / f"m{i}.py").write_text(MODEL)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "te_ckpt_audit_cli", f"m{i}.py:loss", "-p", "none",
                          "--save-baseline", "b.json", "-o", "/dev/null"], cwd=folder, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(8)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0] * 8
    entries = json.loads((folder / "b.json").read_text())["entries"]
    assert sorted(e["target"] for e in entries) == sorted(f"m{i}.py:loss" for i in range(8))


# --- paths are the user's, whatever folder the model's code moves to ---------------------------------


def test_outputs_land_where_the_user_asked(folder: Path) -> None:
    (folder / "elsewhere").mkdir()
    (folder / "model.py").write_text("import os\nos.chdir('elsewhere')\n" + MODEL)
    result = cli("model.py:loss", "-p", "none", "-o", "report.json", "--save-baseline", "b.json")
    assert result.exit_code == 0, result.stderr
    assert (folder / "report.json").is_file() and (folder / "b.json").is_file()
    assert not any((folder / "elsewhere").iterdir())


# --- output streams -----------------------------------------------------------------------------------


def _run(args: list[str], folder: Path, closing: str = "", **kw: object) -> subprocess.CompletedProcess[bytes]:
    """The command in a process of its own; `closing` (`>&-`, `2>&-`) closes a stream before it starts."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    argv = [sys.executable, "-m", "te_ckpt_audit_cli", *args]
    if closing:
        argv = ["bash", "-c", f'exec "$@" {closing}', "bash", *argv]
    return subprocess.run(argv, cwd=folder, env=env, timeout=300, **kw)  # type: ignore[call-overload,no-any-return]


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_closed_pipe_ends_quietly(folder: Path, fmt: str) -> None:
    with subprocess.Popen([sys.executable, "-m", "te_ckpt_audit_cli", "model.py:loss", "-f", fmt],
                          cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # `| true`: nobody reads
        err = proc.stderr.read()
        code = proc.wait(timeout=300)
    assert code == ExitCode.PIPE_CLOSED and err == b""


def test_closed_stdout_is_a_usage_error(folder: Path) -> None:
    run = _run(["model.py:loss"], folder, closing=">&-", stderr=subprocess.PIPE)
    assert run.returncode == USAGE
    assert run.stderr.decode().startswith(PREFIX + "standard output is closed")


def test_a_full_device_is_a_usage_error_naming_it(folder: Path) -> None:
    with open("/dev/full", "wb") as full:
        run = _run(["model.py:loss"], folder, stdout=full, stderr=subprocess.PIPE)
    assert run.returncode == USAGE and b"No space left on device" in run.stderr
    assert len(run.stderr.splitlines()) == 1


def test_closed_stderr_sends_nothing_to_stdout(folder: Path) -> None:
    run = _run(["model.py:loss", "-f", "json", "--budget", "1B"], folder, closing="2>&-", stdout=subprocess.PIPE)
    assert run.returncode == ExitCode.CHECK_FAILED
    json.loads(run.stdout)  # the report alone, though the gate failed


def test_a_lingering_thread_does_not_hold_the_command(folder: Path) -> None:
    (folder / "model.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,)).start()\n" + MODEL
    )
    run = _run(["model.py:loss", "-p", "none"], folder, capture_output=True)  # a hang: TimeoutExpired
    assert run.returncode == 0 and b"none" in run.stdout


LAZY_MODULES = """\
import sys, types


class Lazy(types.ModuleType):
    \"\"\"transformers 5's kind of module: any attribute not yet loaded imports something that fails.\"\"\"

    def __getattr__(self, name):
        raise RuntimeError(f"importing {name} needs torch")


class NotAModule:
    def __getattribute__(self, name):
        raise RuntimeError("touched")


sys.modules["lazy_library"] = Lazy("lazy_library")
sys.modules["not_a_module"] = NotAModule()
"""


def test_lazy_and_odd_modules_in_sys_modules_are_never_touched(folder: Path) -> None:
    """A library's lazy module (PEP 562 `__getattr__` that imports, as transformers 5's does) and
    an object in sys.modules that is not a module: the audit reads neither's attributes."""
    (folder / "model.py").write_text(LAZY_MODULES + MODEL)
    run = _run(["model.py:loss", "-p", "none", "--format", "json"], folder, capture_output=True)
    assert run.returncode == 0, run.stderr
    assert [r["policy"] for r in json.loads(run.stdout)["results"]] == ["none"]


def test_no_report_is_written_when_the_model_ends_the_process(folder: Path) -> None:
    """`os._exit` in the model ends everything: a gate must check that its report was written."""
    (folder / "model.py").write_text(
        MODEL + "def quits(w, x):\n    import os\n    os._exit(0)\nquits_inputs = loss_inputs\n"
    )
    run = _run(["model.py:quits", "-o", "report.json"], folder, capture_output=True)
    assert run.returncode == 0 and not (folder / "report.json").exists()


# --- injection into line-based outputs ------------------------------------------------------------------

FORGED = "x\n::error file=x.py,line=1::forged"
HOSTILE_MODEL = f"""\
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name


def loss(w, x):
    with jax.named_scope({FORGED!r} + "\\x1b]8;;http://x\\x07\\x1b[31m"):
        h = checkpoint_name(jnp.sin(x @ w), {FORGED!r} + "\\u202e\\udcff")
    return jnp.sum(jax.checkpoint(lambda y: jnp.cos(y) @ w)(h))


def loss_inputs():
    return jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((4, 8), jnp.float32)
"""
FORGED_SPEC = "save_only_these_names:" + FORGED.replace(",", " ")


def _lines_are_clean(text: str) -> None:
    for line in text.splitlines():
        assert not line.startswith("::error file=x.py"), line
        assert "\x1b" not in line and "\x07" not in line and "\u202e" not in line and "\udcff" not in line
        assert not line.startswith("## PASSED")


@pytest.mark.parametrize("fmt", ["table", "markdown", "github", "html"])
def test_names_cannot_forge_lines(folder: Path, fmt: str) -> None:
    (folder / "model.py").write_text(HOSTILE_MODEL)
    result = cli("model.py:loss", "-f", fmt, "-p", "as-is", "-p", FORGED_SPEC, "--budget", "1B",
                 "-o", "out.txt")
    assert result.exit_code == ExitCode.CHECK_FAILED, result.stderr
    text = (folder / "out.txt").read_text(encoding="utf-8")
    _lines_are_clean(text)
    _lines_are_clean(result.stderr)
    if fmt != "html":
        assert "::error file=x.py,line=1::forged" in text.replace("\\n", "\n")  # shown, escaped, not lost


def test_recommend_text_escapes_names(folder: Path) -> None:
    (folder / "model.py").write_text(HOSTILE_MODEL)
    result = cli("recommend", "model.py:loss", "--budget", "1KiB", "-o", "rec.txt")
    assert result.exit_code in (0, 1), result.stderr
    _lines_are_clean((folder / "rec.txt").read_text(encoding="utf-8"))


def test_a_policy_with_a_newline_cannot_write_a_markdown_heading(folder: Path) -> None:
    result = cli("model.py:loss", "-p", "save_only_these_names:hidden\n## PASSED <img src=x>", "-f", "markdown",
                 "-o", "out.md")
    assert result.exit_code == 0, result.stderr
    text = (folder / "out.md").read_text()
    assert "## PASSED" not in [line[:9] for line in text.splitlines()]
    assert "<img" not in text and "&lt;img src=x>" in text


def test_a_backtick_in_the_target_keeps_the_markdown_code_span(folder: Path) -> None:
    (folder / "we`ird.py").write_text(MODEL)
    result = cli("we`ird.py:loss", "-p", "none", "-f", "markdown", "-o", "out.md")
    assert result.exit_code == 0, result.stderr
    heading = (folder / "out.md").read_text().splitlines()[0]
    assert heading == "## te-ckpt-audit: ``we`ird.py:loss``"


# --- recommend: names no spec can carry, and what the search costs ---------------------------------------

ODD_NAMES = """\
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name


def loss(w, x):
    a = checkpoint_name(jnp.sin(x @ w), "")
    b = checkpoint_name(jnp.sin(a @ w), "a|b")
    c = checkpoint_name(jnp.sin(b @ w), "plain")
    return jnp.sum(c)


def loss_inputs():
    return jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((4, 8), jnp.float32)
"""


def test_recommend_skips_names_no_spec_can_carry(folder: Path) -> None:
    (folder / "model.py").write_text(ODD_NAMES)
    result = cli("recommend", "model.py:loss", "--budget", "200B", "--allow-offload", "-f", "json", "-o", "r.json")
    assert result.exit_code in (0, 1), result.stderr
    doc = json.loads((folder / "r.json").read_text())
    assert doc["names"] == ["plain"] and sorted(doc["skipped_names"]) == ["", "a|b"]


def test_the_search_estimator_is_the_exact_frontier_of_its_estimates() -> None:
    """The knapsack over additive estimates, on bit masks (160 names cost it 1.8 s a base, not
    101 s: `bench/recommend.py`), keeps every subset no other beats on both estimates, and of equal
    ones the subset whose names come first."""
    import itertools
    import random

    from te_ckpt_audit.search._recommend import _estimated_frontier, _Marginal

    rng = random.Random(1)
    names = [f"n{i}" for i in range(9)]
    marginal = {n: _Marginal(rng.choice([8, 16, 24, 32]), rng.choice([100, 200, 300])) for n in names}
    every = []
    for k in range(len(names) + 1):
        for subset in itertools.combinations(range(len(names)), k):
            b = 1000 + sum(marginal[names[i]].bytes for i in subset)
            f = 5000 - sum(marginal[names[i]].flops for i in subset)
            every.append((b, f, list(subset)))
    every.sort()
    expected = []
    for b, f, subset in every:
        if not expected or f < expected[-1][1]:
            expected.append((b, f, frozenset(names[i] for i in subset)))
    assert _estimated_frontier(1000, 5000, names, marginal) == expected


def test_the_emulated_device_comes_from_the_driver_not_the_environment(folder: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "TE_CKPT_AUDIT_EMULATED": "made up"}
    run = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "model.py:loss", "-p", "none", "-f", "json"],
                         cwd=folder, env=env, capture_output=True, timeout=300)
    assert run.returncode == 0 and json.loads(run.stdout)["emulated_device"] is None


def test_a_mesh_given_twice_takes_the_last(folder: Path) -> None:
    """One parser: the devices the process gets and the mesh the audit uses come from the same
    option (the last, as for every option)."""
    run = _run(["model.py:loss", "-p", "none", "--mesh", "data=1", "--mesh", "data=4", "-f", "json"], folder,
               capture_output=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["mesh"]["devices"] == 4
