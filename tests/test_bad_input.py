"""Hostile and mistaken input, through `audit`, `check` and the library.

Every case ends in the right exit code (2 usage or bad input, 3 the user's code failed, 130 Ctrl-C)
with exactly one line on stderr, nothing on stdout and no file written. After the tables come the
cases that need more than a table row: files that must not be clobbered, file descriptor 1 written
behind Python's back, strict JSON, and warnings for options that would silently do nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import stat
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from te_ckpt_audit_cli import files
from te_ckpt_audit_cli.exit_codes import ExitCode, exit_code_of
from test_cli import MODEL, PREFIX, cli

# Modules, not their names: this file also runs against older trees, where a missing name fails
# the cases that use it rather than the whole file.
from te_ckpt_audit import (
    AuditError,
    TargetConfig,
    audit,
    audit_target,
    baselines,
    check_target,
    recommend_target,
    sizes,
)
from te_ckpt_audit.config import load_config, parse_defines
from te_ckpt_audit.specs import resolve_policy
from te_ckpt_audit.trace import _loading

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True, slots=True)
class Case:
    """One bad input. `model` is appended to MODEL (or replaces it, after "!"); `files` are written
    beside model.py; argv runs with `-o out.json` added unless it names an output itself."""

    id: str
    argv: tuple[str, ...]
    code: int
    fragment: str
    model: str = ""
    files: tuple[tuple[str, str], ...] = ()


def case(id: str, argv: str | list[str], code: int, fragment: str, model: str = "", **files: str) -> Case:
    args = tuple(argv.split()) if isinstance(argv, str) else tuple(argv)
    return Case(id, args, code, fragment, model, tuple((k.replace("__", "."), v) for k, v in files.items()))


USAGE, TARGET = ExitCode.USAGE, ExitCode.TARGET
INTERRUPTED = 130  # as shells report SIGINT


def line(n: int) -> str:
    """`model.py:LINE` of the n-th line appended to MODEL."""
    return f"model.py:{MODEL.count(chr(10)) + n}"


EXIT_AT_IMPORT = "import sys\nsys.exit({})\n"
TWENTY_NAMES = "".join(f"A{i} = {i}\n" for i in range(20))
BAD_STR = "class Unprintable(Exception):\n    def __str__(self):\n        raise RuntimeError('no str')\n"

AUDIT_CASES = [
    # --- the target and its module
    case("missing-file", "nope.py:loss", USAGE, "no such file: nope.py"),
    case("syntax-error", "model.py:loss", TARGET, "syntax error in", model="!def loss(x:\n"),
    case("missing-attribute", "model.py:los", USAGE, "did you mean 'loss'"),
    case("not-callable", "model.py:lossy", USAGE, "not a function", model="lossy = 3\n"),
    case("not-callable-article", "model.py:lossy", USAGE, "model.py:lossy is an int,", model="lossy = 3\n"),
    case("double-colon", "model.py::loss", USAGE, "has '::'; a target takes one ':' (hint: e.g. model.py:loss)"),
    # the model's own functions first, and how many names were left out
    case("attribute-hint-cut", "model.py:zzz", USAGE, "model.py defines: loss, loss_inputs, checkpoint_name, A0, ",
         model=TWENTY_NAMES),
    case("attribute-hint-count", "model.py:zzz", USAGE, " and 11 more)", model=TWENTY_NAMES),
    case("empty-target", [""], USAGE, "empty target"),
    case("no-colon", "model.py", USAGE, "not of the form"),
    case("no-such-module", "no_such_pkg_xyz.mod:loss", USAGE, "no module named"),
    case("not-python-bare", "data.txt:loss", USAGE, "data.txt is not a .py file", data__txt="loss = 1\n"),
    case("not-python-dotted", "./data.txt:loss", USAGE, "is not a .py file", data__txt="loss = 1\n"),
    case("import-raises", "model.py:loss", TARGET, "boom at import", model="raise RuntimeError('boom at import')\n"),
    case("import-missing-module", "model.py:loss", TARGET, "no_such_dep_xyz", model="import no_such_dep_xyz\n"),
    case("import-bad-str", "model.py:loss", TARGET, "raised Unprintable", model=BAD_STR + "raise Unprintable()\n"),
    # --- sys.exit and Ctrl-C in the user's code never end the tool with their own code
    case("exit-0-at-import", "model.py:loss", TARGET, "sys.exit(0)", model=EXIT_AT_IMPORT.format(0)),
    case("exit-1-at-import", "model.py:loss", TARGET, "sys.exit(1)", model=EXIT_AT_IMPORT.format(1)),
    case("exit-none-at-import", "model.py:loss", TARGET, "sys.exit(None)", model=EXIT_AT_IMPORT.format("")),
    case("exit-text-at-import", "model.py:loss", TARGET, "sys.exit('bye')", model=EXIT_AT_IMPORT.format("'bye'")),
    case(
        "exit-in-inputs",
        "model.py:quit",
        TARGET,
        "/" + line(4),  # sys.exit(0) at .../model.py:LINE
        model="def quit(w, x):\n    return loss(w, x)\ndef quit_inputs():\n    raise SystemExit(0)\n",
    ),
    case(
        "exit-in-trace",
        "model.py:quit",
        TARGET,
        "sys.exit(0)",
        model="import sys\ndef quit(w, x):\n    sys.exit(0)\nquit_inputs = loss_inputs\n",
    ),
    case(
        "exit-in-policy",
        "model.py:loss -p model.py:leave",
        TARGET,
        "sys.exit(0)",
        model="import sys\ndef leave(prim, *avals, **params):\n    sys.exit(0)\n",
    ),
    case("exit-in-policy-module", "model.py:loss -p pol.py:p", TARGET, "sys.exit(0)", pol__py=EXIT_AT_IMPORT.format(0)),
    case(
        "ctrl-c-in-trace",
        "model.py:stop",
        INTERRUPTED,
        "interrupted",
        model="def stop(w, x):\n    raise KeyboardInterrupt\nstop_inputs = loss_inputs\n",
    ),
    case("ctrl-c-at-import", "model.py:loss", INTERRUPTED, "interrupted", model="raise KeyboardInterrupt\n"),
    # --- inputs
    case("no-inputs", "model.py:lone", USAGE, "--inputs FILE.py:CALLABLE", model="def lone(x):\n    return x\n"),
    case(
        "inputs-raise",
        "model.py:boom",
        TARGET,
        "ValueError",
        model="def boom(x):\n    return x\ndef boom_inputs():\n    raise ValueError('no shapes')\n",
    ),
    case(
        "inputs-bad-str",
        "model.py:odd",
        TARGET,
        "inputs callable model.py:odd_inputs raised Unprintable",
        model=BAD_STR + "def odd(x):\n    return x\ndef odd_inputs():\n    raise Unprintable()\n",
    ),
    case(
        "inputs-too-few",  # the mistake is the inputs callable's tuple, not the model's code
        "model.py:two",
        TARGET,
        "inputs callable model.py:two_inputs returned 1 argument, which model.py:two cannot take",
        model="def two(w, x):\n    return loss(w, x)\ndef two_inputs():\n    return loss_inputs()[0]\n",
    ),
    case(
        "inputs-wrong-type",
        "model.py:text",
        TARGET,
        "no array inputs",
        model="def text(x):\n    return x\ndef text_inputs():\n    return 'hello'\n",
    ),
    case("inputs-missing-file", "model.py:loss --inputs nope.py:f", USAGE, "no such file: nope.py"),
    case("inputs-not-callable", "model.py:loss --inputs model.py:SIZE", USAGE, "not callable", model="SIZE = 3\n"),
    case("inputs-no-colon", "model.py:loss --inputs model.py", USAGE, "--inputs 'model.py' is not of the form"),
    case("inputs-not-python", "model.py:loss --inputs ./data.txt:f", USAGE, "not a .py file", data__txt="f = 1\n"),
    # --- tracing
    case(
        "trace-raises",
        "model.py:broken",
        TARGET,
        line(2),  # the user's own line: `return w.nonexistent`
        model="def broken(w, x):\n    return w.nonexistent\nbroken_inputs = loss_inputs\n",
    ),
    case(
        "trace-bad-str",
        "model.py:odd",
        TARGET,
        "Unprintable",
        model=BAD_STR + "def odd(w, x):\n    raise Unprintable()\nodd_inputs = loss_inputs\n",
    ),
    case(
        "integer-output",
        "model.py:count",
        TARGET,
        "not differentiable",
        model="def count(w, x):\n    return jnp.sum(x > 0)\ncount_inputs = loss_inputs\n",
    ),
    case(
        "returns-none",
        "model.py:nothing",
        TARGET,
        "returns None",
        model="def nothing(w, x):\n    return None\nnothing_inputs = loss_inputs\n",
    ),
    case("negative-shape", "model.py:loss -D batch=-5", USAGE, "non-negative"),
    # --- policy specs
    case("unknown-policy", "model.py:loss -p checkpoint_dot", USAGE, "did you mean 'checkpoint_dots'"),
    case("empty-policy", ["model.py:loss", "-p", " "], USAGE, "empty policy spec"),
    case("policy-no-names", "model.py:loss -p save_only_these_names:", USAGE, "names no checkpoint name"),
    case("malformed-spec", "model.py:loss -p save_and_offload_only_these_names:keep=a", USAGE, "malformed policy spec"),
    case(
        "offload-conflict",
        "model.py:loss -p save_and_offload_only_these_names:save=a;offload=a",
        USAGE,
        "both saves and offloads a",
    ),
    case("custom-unresolved", "model.py:loss -p model.py:no_policy", USAGE, "does not resolve"),
    case("custom-not-callable", "model.py:loss -p model.py:SIZE", USAGE, "not a callable", model="SIZE = 3\n"),
    case(
        "policy-raises",
        "model.py:loss -p model.py:bad_policy",
        TARGET,
        "bad_policy",
        model="def bad_policy(prim, *avals, **params):\n    raise ValueError('boom')\n",
    ),
    # --- -D defines
    case("define-unknown-key", "model.py:loss -D seq=8", USAGE, "no parameter 'seq'"),
    case("define-bad-value", "model.py:loss -D batch=four", USAGE, "not an int"),
    case("define-not-key-value", "model.py:loss -D batch", USAGE, "is not key=value"),
    case("define-duplicate", "model.py:loss -D batch=2 -D batch=3", USAGE, "-D batch is given twice"),
    case("define-duplicate-spaced", ["model.py:loss", "-D", "batch=2", "-D", " batch =3"], USAGE, "given twice"),
    # --- gates: a NaN, an infinity or a negative number would switch a gate off
    case("tolerance-nan", "model.py:loss --baseline base.json --tolerance nan", USAGE, "--tolerance"),
    case("tolerance-inf", "model.py:loss --baseline base.json --tolerance inf", USAGE, "--tolerance"),
    case("tolerance-negative", "model.py:loss --baseline base.json --tolerance -1", USAGE, "--tolerance"),
    case("max-recompute-nan", "model.py:loss --max-recompute nan", USAGE, "--max-recompute"),
    case("max-recompute-inf", "model.py:loss --max-recompute inf", USAGE, "--max-recompute"),
    case("max-recompute-negative", "model.py:loss --max-recompute -5", USAGE, "--max-recompute"),
    case("budget-nan", "model.py:loss --budget nan", USAGE, "not a size"),
    case("budget-inf", "model.py:loss --budget inf", USAGE, "not a size"),
    case("budget-negative", "model.py:loss --budget=-1GiB", USAGE, "not a size"),
    case("budget-overflow", ["model.py:loss", "--budget", "9" * 400 + "GiB"], USAGE, "too large"),
    case("budget-no-policy", "model.py:loss --budget =1MiB", USAGE, "names no policy"),
    case("budget-unaudited-policy", "model.py:loss -p none --budget checkpoint_dots=1MiB", USAGE, "not among"),
    case("baseline-missing", "model.py:loss --baseline nope.json", USAGE, "does not exist"),
    case("baseline-corrupt", "model.py:loss --baseline base.json", USAGE, "not valid JSON", base__json="{oops"),
    case("baseline-is-a-folder", "model.py:loss --baseline .", USAGE, "baseline ."),
    case(
        "baseline-malformed",
        "model.py:loss --baseline base.json",
        USAGE,
        "malformed",
        base__json='{"schema": "te-ckpt-audit-baseline/2", "entries": [{"target": 3}]}',
    ),
    # --- outputs
    case("output-folder-missing", "model.py:loss -o no/such/folder/out.json", USAGE, "cannot write"),
    case("output-is-a-folder", "model.py:loss -o .", USAGE, "cannot write"),
    case("save-baseline-is-a-folder", "model.py:loss --save-baseline .", USAGE, "cannot write"),
    case("save-baseline-folder-missing", "model.py:loss --save-baseline no/base.json", USAGE, "cannot write"),
    # --- the command line itself
    case("negative-top", "model.py:loss --top -1", USAGE, "--top"),
    case("no-target", [], USAGE, "Missing argument 'TARGET'"),
    case("unknown-option", "model.py:loss --bogus", USAGE, "No such option: --bogus"),
    case("bad-format", "model.py:loss --format yaml", USAGE, "--format"),
    case("bad-scope", "model.py:loss --scope middle", USAGE, "--scope"),
]

CONFIG = """\
[tool.te-ckpt-audit]
{top}

[[tool.te-ckpt-audit.targets]]
target = "model.py:loss"
policies = ["checkpoint_dots"]
{target}
"""


def config(top: str = "", target: str = "") -> str:
    return CONFIG.format(top=top, target=target)


def check_case(id: str, fragment: str, top: str = "", target: str = "", code: int = USAGE, **files: str) -> Case:
    """`te-ckpt-audit check` on a pyproject.toml of `config(top, target)`."""
    return case(id, "check", code, fragment, **{"pyproject__toml": config(top, target), **files})


CHECK_CASES = [
    case("config-missing", "check --config nope.toml", USAGE, "no config file nope.toml"),
    case("config-not-toml", "check", USAGE, "not valid TOML", pyproject__toml="[tool.te-ckpt-audit\n"),
    case("config-no-section", "check", USAGE, "no [tool.te-ckpt-audit] section", pyproject__toml="[tool.x]\n"),
    case("config-no-targets", "check", USAGE, "declares no targets", pyproject__toml="[tool.te-ckpt-audit]\n"),
    check_case("config-unknown-key", "did you mean 'budget'", target='budgit = "1MiB"'),
    check_case("config-tolerance-nan", "tolerance must be a finite number", "tolerance = nan"),
    check_case("config-tolerance-inf", "tolerance must be a finite number", "tolerance = inf"),
    check_case("config-tolerance-negative", "tolerance must be", "tolerance = -1"),
    check_case("config-tolerance-text", "tolerance must be", 'tolerance = "5%"'),
    check_case("config-max-recompute-nan", "max_recompute must be a finite", target="max_recompute = nan"),
    check_case("config-max-recompute-inf", "max_recompute must be a finite", target="max_recompute = -inf"),
    check_case("config-budget-inf", "not a size", target="budget = inf"),
    check_case("config-budget-nan", "not a size", target="budget = nan"),
    check_case("config-budget-negative", "negative size", target="budget = -1"),
    check_case("config-budgets-not-table", "budgets must be a table", target='budgets = "1MiB"'),
    check_case("config-inputs-int", "inputs must be a FILE.py:CALLABLE string", target="inputs = 7"),
    check_case("config-inputs-empty", "inputs must be", target='inputs = ""'),
    check_case("config-scope-bad", "scope must be", target='scope = "middle"'),
    check_case("config-defines-list", "defines must be a table", target="defines = [1]"),
    check_case("config-define-unknown", "no parameter 'seq'", target="defines = { seq = 8 }"),
    check_case("config-baseline-int", "baseline must be a path", "baseline = 5"),
    check_case("config-baseline-missing", "does not exist", 'baseline = "b.json"'),
    check_case("config-baseline-corrupt", "not valid JSON", 'baseline = "b.json"', b__json="["),
    case("config-save-without-baseline", "check --save-baseline", USAGE, "names no baseline", pyproject__toml=config()),
    case("check-tolerance-flag", "check --tolerance 5", USAGE, "No such option", pyproject__toml=config()),
    case(
        "config-policies-not-list",
        "check",
        USAGE,
        "policies must be a list",
        pyproject__toml=config().replace('["checkpoint_dots"]', '"checkpoint_dots"'),
    ),
    case(
        "config-offload-conflict",
        "check",
        USAGE,
        "both saves and offloads",
        pyproject__toml=config().replace("checkpoint_dots", "save_and_offload_only_these_names:save=a;offload=a"),
    ),
    case(
        "config-target-not-python",
        "check",
        USAGE,
        "not a .py file",
        pyproject__toml=config().replace("model.py:loss", "./data.txt:loss"),
        data__txt="loss = 1\n",
    ),
    check_case("config-exit-0", "sys.exit(0)", code=TARGET, model=EXIT_AT_IMPORT.format(0)),
    check_case("config-exit-1", "sys.exit(1)", code=TARGET, model=EXIT_AT_IMPORT.format(1)),
]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current folder, holding the small model as model.py."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path


def _set_up(folder: Path, c: Case) -> None:
    model = c.model[1:] if c.model.startswith("!") else MODEL + c.model
    (folder / "model.py").write_text(model)
    for name, text in c.files:
        (folder / name).write_text(text)


@pytest.mark.parametrize("c", AUDIT_CASES + CHECK_CASES, ids=lambda c: c.id)
def test_bad_input_is_one_line_and_an_exit_code(folder: Path, c: Case) -> None:
    _set_up(folder, c)
    outputs = {"-o", "--output", "--save-baseline"} & set(c.argv)
    args = [*c.argv, *([] if outputs else ["-o", "out.json"])]
    before = {p: p.stat().st_mtime_ns for p in folder.iterdir()}
    result = cli(*args)
    assert result.exit_code == c.code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), result.stderr
    assert c.fragment in lines[0]
    assert "Traceback" not in result.stderr and "te_ckpt_audit/" not in lines[0]
    assert result.stdout == ""
    assert {p: p.stat().st_mtime_ns for p in folder.iterdir()} == before  # nothing written or replaced


def test_the_tables_cover_sixty_cases() -> None:
    assert len(AUDIT_CASES) + len(CHECK_CASES) + len(LIBRARY_CASES) >= 60
    ids = [c.id for c in AUDIT_CASES + CHECK_CASES] + [c[0] for c in LIBRARY_CASES]
    assert len(ids) == len(set(ids))


# --- the library: typed errors, each carrying the CLI's exit code --------------------------------


def _fn_exits(*_: Any, **__: Any) -> Any:
    sys.exit(0)


def _fn_unprintable(*_: Any) -> Any:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    raise Unprintable()


X = jax.ShapeDtypeStruct((4, 4), jnp.float32)

QUIT = {"quit.py": EXIT_AT_IMPORT.format(0)}

def _request(**kw: Any) -> Any:
    from te_ckpt_audit.gpus import GpuRequest, gpu_model

    return GpuRequest(gpu_model("h100"), **kw)


def read_profile(path: Any) -> Any:
    from te_ckpt_audit.gpus import read_profile as read

    return read(path)


# id, files to write first, the call, exit code, in the message
LIBRARY_CASES: list[tuple[str, dict[str, str], Callable[[], Any], int, str]] = [
    ("lib-size-nan", {}, lambda: sizes.parse_size("nan"), USAGE, "not a size"),
    ("lib-size-overflow", {}, lambda: sizes.parse_size("9" * 400), USAGE, "too large"),
    ("lib-size-negative-int", {}, lambda: sizes.parse_size(-1), USAGE, "negative size"),
    ("lib-budget-no-policy", {}, lambda: sizes.parse_budget("=1MiB"), USAGE, "names no policy"),
    ("lib-percent-nan", {}, lambda: sizes.percent_limit(math.nan, "tolerance"), USAGE, "finite number >= 0"),
    ("lib-percent-inf", {}, lambda: sizes.percent_limit(math.inf, "tolerance"), USAGE, "finite number >= 0"),
    ("lib-percent-bool", {}, lambda: sizes.percent_limit(True, "tolerance"), USAGE, "finite number >= 0"),
    (
        "lib-offload-conflict",
        {},
        lambda: resolve_policy("save_and_offload_only_these_names:save=a,b;offload=b"),
        USAGE,
        "both saves and offloads b",
    ),
    ("lib-not-python", {"data.txt": ""}, lambda: _loading.load_target("data.txt:loss"), USAGE, "not a .py file"),
    ("lib-define-twice", {}, lambda: parse_defines(["a=1", "a=1"]), USAGE, "given twice"),
    ("lib-key-define-twice", {}, lambda: audit_target("model.py:loss", defines=["n=1", "n=2"]), USAGE, "given twice"),
    # issue 46, item 13: the Python API's parameters of the wrong type or out of range, each a typed error
    ("lib-network-text", {}, lambda: _request(network_gbps="fast", time=True), USAGE, "network_gbps takes a number"),
    ("lib-network-huge-int", {}, lambda: _request(network_gbps=10**400, time=True), USAGE, "from 0.1 to 100000"),
    ("lib-network-bool", {}, lambda: _request(network_gbps=True, time=True), USAGE, "not bool True"),
    ("lib-network-denormal", {}, lambda: _request(network_gbps=5e-324, time=True), USAGE, "from 0.1 to 100000"),
    ("lib-network-over", {}, lambda: _request(network_gbps=100001, time=True), USAGE, "from 0.1 to 100000"),
    ("lib-time-text", {}, lambda: _request(time="no"), USAGE, "time takes True or False"),
    ("lib-profile-path", {}, lambda: _request(profile="p.txt", time=True), USAGE, "profile takes a Profile"),
    ("lib-read-profile-int", {}, lambda: read_profile(123), USAGE, "calibrate takes a profile's path"),
    ("lib-profile-huge-cost", {"p.txt": 'costs { name: "f" cost_us: 1e308 }\n'}, lambda: read_profile("p.txt"),
     USAGE, "the cost of 'f' is 1e+308"),
    ("lib-maximize-int", {}, lambda: recommend_target("model.py:loss", gpu=_request(), maximize=123), USAGE,
     "maximize takes text"),
    ("lib-maximize-case", {}, lambda: recommend_target("model.py:loss", gpu=_request(), maximize="Throughput"),
     USAGE, "did you mean throughput?"),
    ("lib-jobs-text", {}, lambda: recommend_target("model.py:loss", budget="1MiB", jobs="2"), USAGE,
     "jobs must be an int"),
    ("lib-define-huge", {}, lambda: audit_target("model.py:loss", defines={"batch": 10**20}), USAGE, "larger than"),
    ("lib-defines-an-int", {}, lambda: audit_target("model.py:loss", defines=5), USAGE,  # was TypeError
     "defines takes {key: value}"),
    ("lib-defines-a-string", {}, lambda: audit_target("model.py:loss", defines="n=1"), USAGE, "not str 'n=1'"),
    ("lib-budget-bytes-text", {}, lambda: recommend_target("model.py:loss", budget_bytes="6GiB"), USAGE,
     "budget_bytes is a number of bytes, not the text '6GiB'"),
    ("lib-config-inputs-int", {"c.toml": config(target="inputs = 7")}, lambda: load_config("c.toml"), USAGE, "inputs"),
    ("lib-config-tolerance-nan", {"c.toml": config("tolerance = nan")}, lambda: load_config("c.toml"), USAGE, "finite"),
    ("lib-baseline-corrupt", {"b.json": "["}, lambda: baselines.load_baseline("b.json"), USAGE, "not valid JSON"),
    ("lib-write-a-folder", {}, lambda: files.write_output(".", "x"), USAGE, "it is a folder"),
    (  # exit 2 before the module runs, not the 3 of its sys.exit
        "lib-check-target-nan-first",
        QUIT,
        lambda: check_target(TargetConfig("quit.py:loss"), tolerance=math.nan),
        USAGE,
        "tolerance must be",  # the library names its parameter; the command line names the flag
    ),
    ("lib-audit-target-exit", QUIT, lambda: audit_target("quit.py:loss"), TARGET, "sys.exit(0)"),
    ("lib-audit-fn-exits", {}, lambda: audit(_fn_exits, X), TARGET, "sys.exit(0)"),
    ("lib-audit-fn-unprintable", {}, lambda: audit(_fn_unprintable, X), TARGET, "Unprintable"),
    ("lib-audit-policy-exits", {}, lambda: audit(jnp.sin, X, policies=[_fn_exits]), TARGET, "sys.exit(0)"),
]


@pytest.mark.parametrize(("id_", "files", "call", "code", "fragment"), LIBRARY_CASES, ids=[c[0] for c in LIBRARY_CASES])
def test_library_errors_are_typed(
    folder: Path, id_: str, files: dict[str, str], call: Callable[[], Any], code: int, fragment: str
) -> None:
    for name, text in files.items():
        (folder / name).write_text(text)
    with pytest.raises(AuditError) as err:
        call()
    assert exit_code_of(err.value) == code
    assert fragment in str(err.value)
    assert "te_ckpt_audit/" not in str(err.value)


# --- files that are not regular files are never replaced ----------------------------------------


def _is(path: Path, kind: Callable[[int], bool]) -> bool:
    return kind(os.lstat(path).st_mode)


def test_output_into_a_fifo_is_written_not_replaced(folder: Path) -> None:
    os.mkfifo("pipe")
    reader = os.open("pipe", os.O_RDONLY | os.O_NONBLOCK)  # the writer's open does not block
    try:
        result = cli("model.py:loss", "-p", "none", "-f", "markdown", "-o", "pipe")
        assert result.exit_code == 0, result.stderr
        assert _is(folder / "pipe", stat.S_ISFIFO)
        assert b"te-ckpt-audit" in os.read(reader, 1 << 16)
    finally:
        os.close(reader)


def test_output_into_a_fifo_nobody_reads_is_refused_not_waited_on_forever(folder: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46, item 11: `-o` into a FIFO with no reader blocked forever."""
    from te_ckpt_audit_cli import files

    monkeypatch.setattr(files, "FIFO_WAIT_S", 0.3)
    os.mkfifo("pipe")
    result = cli("model.py:loss", "-p", "none", "-f", "markdown", "-o", "pipe")
    assert result.exit_code == ExitCode.USAGE
    assert "no process opened the FIFO to read it in 0.3 s" in result.stderr
    assert _is(folder / "pipe", stat.S_ISFIFO)


def test_save_baseline_into_a_fifo_writes_without_reading_it(folder: Path) -> None:
    os.mkfifo("pipe")
    reader = os.open("pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        result = cli("model.py:loss", "-p", "none", "--save-baseline", "pipe", "-o", "out.md")
        assert result.exit_code == 0, result.stderr
        assert json.loads(os.read(reader, 1 << 16))["entries"][0]["target"] == "model.py:loss"
        assert _is(folder / "pipe", stat.S_ISFIFO)
    finally:
        os.close(reader)


def test_output_through_a_symlink_writes_its_target(folder: Path) -> None:
    (folder / "real").mkdir()
    (folder / "real" / "report.md").write_text("stale")
    os.symlink("real/report.md", "link.md")
    result = cli("model.py:loss", "-p", "none", "-f", "markdown", "-o", "link.md")
    assert result.exit_code == 0, result.stderr
    assert _is(folder / "link.md", stat.S_ISLNK)
    assert (folder / "real" / "report.md").read_text().startswith("## te-ckpt-audit")
    assert sorted(p.name for p in (folder / "real").iterdir()) == ["report.md"]  # no temporary left


def test_save_baseline_through_a_symlink_writes_its_target(folder: Path) -> None:
    (folder / "real").mkdir()
    os.symlink("real/base.json", "base.json")  # dangling: the target is created
    result = cli("model.py:loss", "-p", "none", "--save-baseline", "base.json", "-o", "out.md")
    assert result.exit_code == 0, result.stderr
    assert _is(folder / "base.json", stat.S_ISLNK)
    entries = json.loads((folder / "real" / "base.json").read_text())["entries"]
    assert [e["target"] for e in entries] == ["../model.py:loss"]  # relative to the file's own folder


def test_output_into_a_character_device_is_written_not_replaced(folder: Path) -> None:
    """As root, a null device made here (never the system's /dev/null, which a regression would
    replace); as anyone else, /dev/null itself, which they cannot replace."""
    if os.geteuid() == 0:
        try:
            os.mknod("null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except OSError as exc:
            pytest.skip(f"cannot make a device node here: {exc}")
        device = folder / "null"
    else:
        device = Path("/dev/null")
    before = os.stat(device)
    for option in ("-o", "--save-baseline"):
        result = cli("model.py:loss", "-p", "none", option, str(device), "-f", "json")
        assert result.exit_code == 0, result.stderr
        after = os.stat(device)
        assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    made = ["null"] if device.parent == folder else []
    assert sorted(p.name for p in folder.iterdir()) == sorted(["model.py", *made])


def test_a_socket_is_refused_and_kept(folder: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sock")
        result = cli("model.py:loss", "-o", "sock")
        assert result.exit_code == ExitCode.USAGE
        assert result.stderr.startswith(PREFIX) and "not a regular file" in result.stderr
        assert _is(folder / "sock", stat.S_ISSOCK)


# --- file descriptor 1 carries the report alone --------------------------------------------------

NOISY = """\
import os, subprocess, sys
os.write(1, b"noise-os-write\\n")
subprocess.run(["echo", "noise-subprocess"], check=True)
print("noise-dunder-stdout", file=sys.__stdout__)  # left in the buffer
"""


def test_user_writes_to_fd_1_go_to_stderr(folder: Path) -> None:
    (folder / "model.py").write_text(
        NOISY + MODEL + "def noisy_inputs():\n    os.write(1, b'noise-inputs\\n')\n    return loss_inputs()\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # PYTHONPATH: this checkout (conftest)
    run = subprocess.run(
        [sys.executable, "-m", "te_ckpt_audit_cli", "model.py:loss", "--inputs", "model.py:noisy_inputs",
         "-p", "nothing_saveable", "-f", "json"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["schema"] == "te-ckpt-audit/15"
    for noise in ("noise-os-write", "noise-subprocess", "noise-dunder-stdout", "noise-inputs"):
        assert noise in run.stderr and noise not in run.stdout


# --- strict JSON: unbounded growth is explicit, never Infinity -----------------------------------


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_growth_from_a_zero_byte_baseline_is_strict_json(folder: Path) -> None:
    # A schema-1 baseline, which both the old and the new format readers accept.
    Path("base.json").write_text(json.dumps(
        {"schema": "te-ckpt-audit-baseline/1", "targets": {"model.py:loss": {"everything_saveable": 0}}}
    ))
    Path("pyproject.toml").write_text(
        config('baseline = "base.json"').replace('["checkpoint_dots"]', '["everything_saveable"]')
    )
    result = cli("check", "-f", "json")
    assert result.exit_code == ExitCode.CHECK_FAILED, result.stderr
    doc = _strict(result.stdout)
    (violation,) = doc["targets"][0]["violations"]
    assert violation["value"] is None and violation["unbounded"] is True
    (change,) = doc["targets"][0]["changes"]
    assert change["percent"] is None and change["unbounded"] is True and change["baseline_bytes"] == 0
    assert "unbounded" in result.stderr


# --- options that would silently do nothing -----------------------------------------------------


def test_inner_scope_without_checkpoints_warns() -> None:
    report = audit(lambda x: jnp.sum(jnp.sin(jnp.sin(x))), X, policies=["checkpoint_dots"], scope="inner")
    assert "inner-scope-without-checkpoints" in [w.code for w in report.warnings]
    outer = audit(lambda x: jnp.sum(jnp.sin(jnp.sin(x))), X, policies=["checkpoint_dots"], scope="outer")
    assert "inner-scope-without-checkpoints" not in [w.code for w in outer.warnings]


def test_an_error_outside_the_users_code_names_no_file_of_ours(folder: Path) -> None:
    result = cli("jax.numpy:linalg.inv", "--inputs", "model.py:loss_inputs", "-p", "none")
    assert result.exit_code == ExitCode.TARGET
    assert "_trace.py" not in result.stderr and "te_ckpt_audit" not in result.stderr


def test_the_schema_validation_of_test_render_runs_in_ci() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(dep.startswith("jsonschema") for dep in extras)


def test_the_library_names_parameters_and_the_command_line_names_flags() -> None:
    """A Python caller of recommend_target(max_compiles=0) is told about max_compiles, not a flag."""
    from te_ckpt_audit import UsageError, recommend_target

    with pytest.raises(UsageError) as err:
        recommend_target("sample_models/mlp.py:loss", 1024, max_compiles=0)
    assert err.value.message == "max_compiles must be at least 1, not 0" and "--" not in str(err.value)
    assert err.value.worded({"max_compiles": "--max-compiles"})[0] == "--max-compiles must be at least 1, not 0"
    run = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", "recommend", "sample_models/mlp.py:loss",
                          "--budget", "1KiB", "--gpu", "h100", "--max-compiles", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "--max-compiles must be at least 1" in run.stderr, run.stderr
