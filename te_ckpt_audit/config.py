"""What to audit, parsed once where it comes in: a target and its inputs, `-D` defines, a mesh, and
`[tool.te-ckpt-audit]` in pyproject.toml (the targets `te-ckpt-audit check` audits).

    [tool.te-ckpt-audit]
    baseline = "ckpt-baseline.json"   # optional: fail on growth beyond `tolerance` percent
    tolerance = 2.0                   # percent

    [[tool.te-ckpt-audit.targets]]
    target = "sample_models/gpt.py:loss"
    inputs = "sample_models/gpt.py:loss_inputs"   # optional
    defines = { layers = 4, seq = 128 }           # like -D
    policies = ["checkpoint_dots", "checkpoint_dots_and_te_gemms"]
    scope = "auto"                                # or "outer", "inner" (like --scope)
    budget = "8MiB"                               # every policy without a budget of its own
    budgets = { checkpoint_dots = "4MiB" }        # replaces `budget` for that policy
    max_recompute = 60.0                          # percent of the forward FLOPs
    mesh = { data = 8, model = 4 }                # per-device figures on this mesh (like --mesh)
    shardings = "compiled"                        # or "abstract" (like --shardings)
    params = [0]                                  # the trained arguments, like --params ("all": every float input)
    gpu = "h100"                                  # compile each policy's step for it (like --gpu)
    gpu_config = "my_gpu.txtpb"                   # or a GPU spec file instead of gpu (like --gpu-config)
    optimizer = "adamw"                           # sgd, momentum, adam, adamw, adafactor (like --optimizer)
    gpus_per_host = 8                             # like --gpus-per-host
    mem_fraction = 0.9                            # like --mem-fraction
    fit = true                                    # fail a step that does not fit (like --fit)
    peak_budget = "60GiB"                         # like --peak-budget (peak_budgets: a table per policy)
    peak_budgets = { checkpoint_dots = "70GiB" }  # replaces peak_budget for that policy
    step = false                                  # the target is a training step (like --step)
    donate = [0]                                  # its donated arguments (like --donate)
    time = true                                   # estimate each step's time (like --time)
    network_gbps = 400                            # Gb/s per GPU between hosts (like --network-gbps)
    tpu = "v5e"                                   # or a TPU slice instead of a GPU (like --tpu; "v5e:2x4"):
                                                  # with optimizer and fit (libtpu's verdict), no other GPU key
    remat3 = "both"                               # JAX's new remat too (like --remat3): a budgeted policy
                                                  # that jax_remat3 would change fails
    name_lines = true                             # the tool's names on each matmul line (like --name-lines)

`gpu`, `gpu_config`, `optimizer`, `gpus_per_host`, `mem_fraction`, `fit`, `time` and
`network_gbps` may also sit in [tool.te-ckpt-audit] itself, for every target that does not set
its own.

Sizes take units ("64MiB", "6GiB"); a number without one below 1 MiB is refused as a unit left out.
Unknown keys are errors that name the key, and a misspelled table name ([tool.te_ckpt_audit]) is an
error too: a typo must not turn a gate off.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from . import gpus, optimizers
from ._textfile import read_text
from .errors import UsageError
from .gating import PeakGate
from .gpus import GpuRequest
from .records import Budget, MeshAxis, MeshSpec, Scope, ShardingSource
from .sizes import budget_size, percent_limit
from .specs import PolicyLike
from .tpus import TpuRequest, parse_tpu
from .trace._loading import Defines as Defines  # the -D mapping, as the command line types it
from .trace._loading import source_files
from .trace._trained import parse_params

MAX_DEFINE = 4096  # characters in one -D value: no size or flag is longer

_GPU_KEYS = {"gpu", "gpu_config", "optimizer", "gpus_per_host", "mem_fraction", "fit", "time", "network_gbps"}
_TOP_KEYS = {"targets", "baseline", "tolerance", *_GPU_KEYS}
_TARGET_KEYS = {"target", "inputs", "defines", "policies", "scope", "budget", "budgets", "max_recompute", "mesh",
                "shardings", "peak_budget", "peak_budgets", "step", "donate", "params", "tpu", "remat3", "name_lines",
                *_GPU_KEYS}
_SECTION = "te-ckpt-audit"  # [tool.te-ckpt-audit]
# What `check --help` and the docs list: each table's keys, in the order the docstring shows them
SECTION_KEYS = ("baseline", "tolerance", "targets", *sorted(_GPU_KEYS))
TARGET_KEYS = ("target", "inputs", "defines", "policies", "scope", "budget", "budgets", "max_recompute", "mesh",
               "shardings", "params", "gpu", "gpu_config", "optimizer", "gpus_per_host", "mem_fraction", "fit",
               "peak_budget", "peak_budgets", "step", "donate", "time", "network_gbps", "tpu", "remat3",
               "name_lines")
assert set(SECTION_KEYS) == _TOP_KEYS and set(TARGET_KEYS) == _TARGET_KEYS
_AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclasses.dataclass(frozen=True, slots=True)
class TargetConfig:
    """What to audit and how to gate it: one `[[tool.te-ckpt-audit.targets]]` table, or the audit
    command's options. `check_target` takes it; the CLI's audit and check commands both build one."""

    target: str
    inputs: str | None = None
    defines: Defines = dataclasses.field(default_factory=dict)
    policies: tuple[PolicyLike, ...] = ()  # spec strings (or specs parsed already); empty: the default set
    scope: Scope = Scope.AUTO
    budgets: tuple[Budget, ...] = ()
    max_recompute: float | None = None
    mesh: MeshSpec | None = None  # per-device figures on this mesh (like --mesh)
    shardings: ShardingSource = ShardingSource.COMPILED  # like --shardings
    compile: bool = False  # XLA's memory analysis per policy (like --compile)
    gpu: GpuRequest | None = None  # each policy's step compiled for this GPU (like --gpu)
    peak: PeakGate = PeakGate()  # like --fit and --peak-budget
    params: tuple[int | str, ...] | Literal["all"] | None = None  # the trained arguments (None: the first)
    tpu: TpuRequest | None = None  # each policy's step compiled by libtpu for this slice (like --tpu)
    remat3: str | None = None  # JAX's remat implementation: on, off, both (like --remat3); None: as JAX_REMAT3
    name_lines: bool = False  # each matmul line of the user's code gets the tool's checkpoint name (--name-lines)


    def reads(self) -> tuple[tuple[str, Path], ...]:
        """The files auditing this target reads (`files_read`)."""
        return files_read(self.target, self.inputs, self.policies, self.gpu)


def files_read(target: str, inputs: str | None = None, policies: Sequence[PolicyLike] = (),
               gpu: GpuRequest | None = None) -> tuple[tuple[str, Path], ...]:
    """What a target's run reads, each file with what it is to the run, found before any of the
    user's code runs: the target's module and the modules it imports from its folder, the inputs
    module, a custom policy's module, the GPU config file. A writer checks its output against these.

    >>> [(what, p.name) for what, p in files_read("sample_models/te_transformer.py:loss")]  # doctest: +SKIP
    [("the target's module", 'te_transformer.py'), ('a module the target imports', 'te_standin.py'), ...]
    """
    found: list[tuple[str, Path]] = []

    def spec(text: str, what: str, imported: str) -> None:
        files = source_files(text)
        found.extend([(what, files[0])] if files else [])
        found.extend((imported, f) for f in files[1:])

    spec(target, "the target's module", "a module the target imports")
    if inputs:
        spec(inputs, "the inputs module", "a module the inputs module imports")
    for p in policies:
        if isinstance(p, str) and ":" in p:
            spec(p, f"the module of policy {p!r}", f"a module policy {p!r} imports")
    if gpu is not None and gpu.model.path is not None:
        found.append(("the GPU config", gpu.model.path))
    if gpu is not None and gpu.profile is not None:
        found.append(("the profile --calibrate reads", Path(gpu.profile.source)))
    return tuple(found)


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    path: Path
    targets: tuple[TargetConfig, ...]
    baseline: Path | None
    tolerance: float


# --- targets, defines and meshes as typed on the command line ------------------------------------


def parse_defines(pairs: Sequence[str]) -> dict[str, str]:
    """`-D key=value` strings as {key: raw value}; a malformed pair, an overlong value or a key
    given twice is a UsageError (the last value silently winning would audit another model than
    the one asked for).

    >>> parse_defines(["seq=8", "batch = 2"])
    {'seq': '8', 'batch': '2'}
    """
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UsageError(f"$defines$ {pair[:80]!r} is not key=value", "e.g. $defines$ seq=8192")
        if len(raw) > MAX_DEFINE:
            raise UsageError(f"$defines$ {key}: the value is {len(raw)} characters long", f"at most {MAX_DEFINE}")
        if key in out:
            raise UsageError(f"$defines$ {key} is given twice ({out[key]} and {raw.strip()})", "give each key once")
        out[key] = raw.strip()
    return out


DefinesLike = Mapping[str, object] | Sequence[str] | None  # what the library's entry points take as -D


def as_defines(defines: DefinesLike) -> Defines:
    """`{key: value}` as given, or `["key=value", ...]`, as -D defines (the library's entry points
    take either).

    >>> as_defines({"seq": 8192}), as_defines(["seq=8192"])
    ({'seq': '8192'}, {'seq': '8192'})
    """
    if defines is None:
        return {}
    if isinstance(defines, Mapping):
        return parse_defines([f"{k}={v}" for k, v in defines.items()])
    if isinstance(defines, str) or not isinstance(defines, Sequence) or not all(isinstance(d, str) for d in defines):
        raise UsageError(f"$defines$ takes {{key: value}} or [\"key=value\", ...], not {type(defines).__name__}"
                         f" {str(defines)[:40]!r}", "e.g. $defines$={'seq': 8192}")
    return parse_defines(list(defines))


def parse_mesh(text: str) -> MeshSpec:
    """`AXIS=SIZE[,AXIS=SIZE...]`: axis names are identifiers, each once; sizes are ints >= 1.

    >>> str(parse_mesh("data=8, model=4"))
    'data=8,model=4'
    """
    axes = []
    for part in text.split(","):
        name, eq, size = (s.strip() for s in part.partition("="))
        if not eq or not name or not re.fullmatch(r"\+?\d{1,9}", size):
            shown = part.strip()[:40]
            raise UsageError(f"$mesh$ {text[:80]!r}: {shown!r} is not AXIS=SIZE", "e.g. $mesh$ data=8,model=4")
        axes.append((name, int(size)))
    return mesh_spec(axes, "$mesh$")


def mesh_spec(axes: Sequence[tuple[str, object]] | Mapping[str, object], what: str = "mesh") -> MeshSpec:
    """A validated MeshSpec from (name, size) pairs or a table (`mesh = {data = 8, model = 4}`)."""
    pairs = list(axes.items()) if isinstance(axes, Mapping) else list(axes)
    if not pairs:
        raise UsageError(f"{what} names no axes", "e.g. data=8,model=4")
    seen: set[str] = set()
    out = []
    for name, size in pairs:
        if not isinstance(name, str) or not _AXIS_NAME.fullmatch(name):
            raise UsageError(f"{what}: axis name {name!r} is not an identifier", "e.g. data, model, fsdp")
        if name in seen:
            raise UsageError(f"{what}: axis {name!r} is given twice", "give each axis once")
        seen.add(name)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise UsageError(f"{what}: axis {name!r} has size {size!r}; a size is an int >= 1", f"e.g. {name}=8")
        out.append(MeshAxis(name, size))
    return MeshSpec(tuple(out))


# --- [tool.te-ckpt-audit] --------------------------------------------------------------------------


def _unknown(keys: set[str], allowed: set[str], where: str, path: Path) -> None:
    for key in sorted(keys - allowed):
        close = difflib.get_close_matches(key, sorted(allowed), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(sorted(allowed))}"
        raise UsageError(f"{path}: unknown key {key!r} in {where}", hint)


def _number(value: object, key: str, where: str, path: Path) -> float:
    """A finite number >= 0: TOML's nan and inf would switch a gate off."""
    try:
        return percent_limit(value, key)
    except UsageError:
        raise UsageError(
            f"{path}: {where}.{key} must be a finite number >= 0, not {value!r}", f"e.g. {key} = 5.0"
        ) from None


def _near_miss_tables(tool: Mapping[str, object], path: Path) -> None:
    """A `[tool.*]` table whose name is ours misspelled (`te_ckpt_audit`, `te-ckpt-audit-`,
    `te-ckpt_audit`) is an error: its keys would be ignored, and a baseline or budget in it with
    them, while `check` passes the rest."""
    for name in tool:
        if name == _SECTION:
            continue
        folded = re.sub(r"[^a-z0-9]", "", name.lower())
        if folded == "teckptaudit" or difflib.get_close_matches(name.lower(), [_SECTION], n=1, cutoff=0.85):
            raise UsageError(f"{path}: [tool.{name}] is not [tool.{_SECTION}]; te-ckpt-audit would ignore it",
                             f"rename it [tool.{_SECTION}] (hyphens), and its targets [[tool.{_SECTION}.targets]]")


def load_config(path: str | Path = "pyproject.toml") -> Config:
    """Read and validate `[tool.te-ckpt-audit]`; every problem is a UsageError naming the key."""
    if not isinstance(path, str | Path):
        raise UsageError(f"load_config takes a pyproject.toml's path, not {type(path).__name__}",
                         'load_config("pyproject.toml")')
    p = Path(path)
    try:
        text = read_text(p, "config", "pass --config PATH to a pyproject.toml")
    except FileNotFoundError:
        raise UsageError(f"no config file {p}", "run in the project folder or pass --config PATH") from None
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise UsageError(f"{p} is not valid TOML: {str(exc)[:200]}", "fix the file") from None
    tool = doc.get("tool")
    _near_miss_tables(tool if isinstance(tool, dict) else {}, p)
    section = tool.get("te-ckpt-audit") if isinstance(tool, dict) else None
    if not isinstance(section, dict):
        raise UsageError(f"{p} has no [tool.te-ckpt-audit] section",
                         "docs/reference/config.md and docs/guide/ci-gating.md show one")
    _unknown(set(section), _TOP_KEYS, "[tool.te-ckpt-audit]", p)
    raw_targets = section.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise UsageError(f"{p}: [tool.te-ckpt-audit] declares no targets", "add [[tool.te-ckpt-audit.targets]] tables")
    defaults = {k: section[k] for k in _GPU_KEYS if k in section}
    targets = tuple(_target(_with_defaults(t, defaults) if isinstance(t, dict) else t, i, p)
                    for i, t in enumerate(raw_targets))
    baseline = section.get("baseline")
    if baseline is not None and (not isinstance(baseline, str) or not baseline.strip()):
        raise UsageError(
            f"{p}: baseline must be a path, not {baseline!r}",
            'e.g. baseline = "ckpt-baseline.json"; remove the key for no baseline',
        )
    tolerance = _number(section.get("tolerance", 0.0), "tolerance", "[tool.te-ckpt-audit]", p)
    return Config(p, targets, (p.parent / baseline) if baseline else None, tolerance)


def _with_defaults(target: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """A target's table with [tool.te-ckpt-audit]'s GPU keys where it sets none of its own; `gpu`
    and `gpu_config` are one choice, so a target's either one replaces the section's both, and a
    target's `tpu` all but `optimizer` and `fit`."""
    if "gpu" in target or "gpu_config" in target:
        defaults = {k: v for k, v in defaults.items() if k not in ("gpu", "gpu_config")}
    if "tpu" in target:  # a TPU target takes of the section's GPU keys only those a TPU has
        defaults = {k: v for k, v in defaults.items() if k in ("optimizer", "fit")}
    return {**defaults, **target}


def _target(raw: Any, i: int, p: Path) -> TargetConfig:
    where = f"targets[{i}]"
    if not isinstance(raw, dict):
        raise UsageError(f"{p}: {where} must be a table", "use [[tool.te-ckpt-audit.targets]]")
    _unknown(set(raw), _TARGET_KEYS, where, p)
    target = raw.get("target")
    if not isinstance(target, str) or not target:
        raise UsageError(f"{p}: {where} has no target", 'e.g. target = "model.py:loss"')
    inputs = raw.get("inputs")
    if inputs is not None and (not isinstance(inputs, str) or not inputs):
        raise UsageError(f"{p}: {where}.inputs must be a FILE.py:CALLABLE string, not {inputs!r}",
                         'e.g. inputs = "model.py:loss_inputs"')
    defines = raw.get("defines", {})
    policies = raw.get("policies", [])
    if not isinstance(defines, dict):
        raise UsageError(f"{p}: {where}.defines must be a table", "e.g. defines = { seq = 2048 }")
    if not isinstance(policies, list) or not all(isinstance(s, str) for s in policies):
        raise UsageError(f"{p}: {where}.policies must be a list of specs", 'e.g. policies = ["checkpoint_dots"]')
    try:
        scope = Scope(raw.get("scope", "auto"))
    except ValueError:
        raise UsageError(f"{p}: {where}.scope must be auto, outer or inner", "e.g. scope = \"auto\"") from None
    budgets = []
    if "budget" in raw:
        budgets.append(Budget(_size(raw["budget"], "budget", where, p)))
    per_policy = raw.get("budgets", {})
    if not isinstance(per_policy, dict):
        raise UsageError(f"{p}: {where}.budgets must be a table", 'e.g. budgets = { checkpoint_dots = "4MiB" }')
    budgets += [Budget(_size(v, f"budgets.{k}", where, p), k) for k, v in per_policy.items()]
    max_recompute = raw.get("max_recompute")
    mesh = raw.get("mesh")
    if mesh is not None and not isinstance(mesh, dict):
        raise UsageError(f"{p}: {where}.mesh must be a table, not {mesh!r}", "e.g. mesh = { data = 8, model = 4 }")
    try:
        shardings = ShardingSource(raw.get("shardings", "compiled"))
    except ValueError:
        hint = 'e.g. shardings = "abstract"'
        raise UsageError(f"{p}: {where}.shardings must be compiled or abstract", hint) from None
    placed = None if mesh is None else mesh_spec(mesh, f"{p}: {where}.mesh")  # parsed once: the audit's and the slice's
    return TargetConfig(
        target=target,
        inputs=inputs,
        defines=parse_defines([f"{k}={v}" for k, v in defines.items()]),
        policies=tuple(policies),
        scope=scope,
        budgets=tuple(budgets),
        max_recompute=None if max_recompute is None else _number(max_recompute, "max_recompute", where, p),
        mesh=placed,
        shardings=shardings,
        gpu=_gpu({k: v for k, v in raw.items() if k not in _TPU_KEYS} if "tpu" in raw else raw, where, p),
        peak=_peak_gate(raw, where, p),
        params=_params(raw, where, p),
        tpu=_tpu(raw, where, p, None if placed is None else placed.devices),
        remat3=_remat3(raw, where, p),
        name_lines=_name_lines(raw, where, p),
    )


def _name_lines(raw: dict[str, Any], where: str, p: Path) -> bool:
    value = raw.get("name_lines", False)
    if not isinstance(value, bool):
        raise UsageError(f"{p}: {where}.name_lines must be true or false, not {value!r}",
                         "e.g. name_lines = true (the policies may name the tool's names, gpt_45)")
    return value


def _remat3(raw: dict[str, Any], where: str, p: Path) -> str | None:
    value = raw.get("remat3")
    if value is not None and value not in ("on", "off", "both"):
        raise UsageError(f"{p}: {where}.remat3 must be on, off or both, not {value!r}",
                         'e.g. remat3 = "both" (fails a budgeted policy that jax_remat3 would change)')
    return value


_TPU_KEYS = {"tpu", "optimizer", "fit", "time"}  # a TPU target's: its slice, the update, the gate on libtpu's
# verdict, the step's time (libtpu's estimate)


def _tpu(raw: Mapping[str, Any], where: str, p: Path, devices: int | None) -> TpuRequest | None:
    """A target's TPU slice: `tpu = "v5e"` (from the mesh's devices) or `"v5e:2x4"` (like --tpu)."""
    if "tpu" not in raw:
        return None
    if "gpu" in raw or "gpu_config" in raw:
        raise UsageError(f"{p}: {where} has both tpu and a GPU", "give one of them")
    extra = sorted(set(raw) & (_GPU_KEYS | {"peak_budget", "peak_budgets", "step", "donate"}) - _TPU_KEYS)
    if extra:
        raise UsageError(f"{p}: {where}.{extra[0]} is about the step compiled for a GPU", "drop it for a TPU target")
    name, optimizer, timed = raw["tpu"], raw.get("optimizer"), raw.get("time", False)
    if not isinstance(name, str):
        raise UsageError(f"{p}: {where}.tpu must be a string", 'e.g. tpu = "v5e" (`te-ckpt-audit tpus`)')
    if not isinstance(timed, bool):
        raise UsageError(f"{p}: {where}.time must be true or false, not {timed!r}", "e.g. time = true")
    try:
        chosen = None if optimizer is None else optimizers.Optimizer(optimizer)
        return TpuRequest(parse_tpu(name, devices or 1), chosen, timed)
    except ValueError:
        raise UsageError(f"{p}: {where}.optimizer {optimizer!r} is not one of {optimizers.CHOICES}",
                         'e.g. optimizer = "adamw"') from None
    except UsageError as err:
        raise UsageError(f"{p}: {where}.{err.message}", err.hint) from None


def _size(value: object, key: str, where: str, p: Path) -> int:
    """A budget in the config: "6GiB" (or bytes >= 1 MiB); the error names the file and the key."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise UsageError(f"{p}: {where}.{key} is not a size such as \"6GiB\": {value!r}", f'e.g. {key} = "6GiB"')
    try:
        return budget_size(value, key)
    except UsageError as err:  # "$budget$ 12 has no unit" names the key itself; "not a size: ..." does not
        said = err.message if err.template.startswith(f"${key}$") else f"{key} {err.message}"
        raise UsageError(f"{p}: {where}.{said}", err.hint) from None


def _params(raw: Mapping[str, Any], where: str, p: Path) -> tuple[int | str, ...] | Literal["all"] | None:
    if "params" not in raw:
        return None
    given = raw["params"]
    if not (given == "all" or (isinstance(given, list) and given and all(
            (type(x) is int and x >= 0) or (isinstance(x, str) and x.isidentifier()) for x in given))):
        raise UsageError(f"{p}: {where}.params must be a list of argument positions or names, or \"all\"",
                         'e.g. params = [0] or params = ["params"]')
    return parse_params(given)


def _gpu(raw: Mapping[str, Any], where: str, p: Path) -> GpuRequest | None:
    """A target's GPU request: `gpu` (a catalog name) or `gpu_config` (a file beside the config)."""
    if "gpu" in raw and "gpu_config" in raw:
        raise UsageError(f"{p}: {where} has both gpu and gpu_config", "give one of them")
    if "gpu" not in raw and "gpu_config" not in raw:
        given = sorted(set(raw) & (_GPU_KEYS | {"peak_budget", "peak_budgets", "step", "donate"}))
        if given:
            raise UsageError(f"{p}: {where}.{given[0]} is about the step compiled for a GPU", 'add gpu = "h100"')
        return None
    name, config = raw.get("gpu"), raw.get("gpu_config")
    if not isinstance(name if name is not None else config, str):
        raise UsageError(f"{p}: {where}.gpu must be a string", 'e.g. gpu = "h100" (`te-ckpt-audit gpus`)')
    model = gpus.gpu_model(name) if isinstance(name, str) else gpus.model_of_config(p.parent / str(config))
    optimizer = raw.get("optimizer")
    try:
        chosen = None if optimizer is None else optimizers.Optimizer(optimizer)
    except ValueError:
        raise UsageError(f"{p}: {where}.optimizer {optimizer!r} is not one of {optimizers.CHOICES}",
                         'e.g. optimizer = "adamw"') from None
    per_host, fraction = raw.get("gpus_per_host", gpus.DEFAULT_GPUS_PER_HOST), raw.get("mem_fraction")
    if isinstance(per_host, bool) or not isinstance(per_host, int):
        raise UsageError(f"{p}: {where}.gpus_per_host must be an int", "e.g. gpus_per_host = 8")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, int | float)
                                 or not 0 < fraction <= 1):
        raise UsageError(f"{p}: {where}.mem_fraction must be a number in (0, 1]", "e.g. mem_fraction = 0.9")
    # the run's environment (XLA_FLAGS, the fraction's variables) is the caller's to add
    chosen_here = gpus.FractionSource.GIVEN
    environment = gpus.GpuEnvironment() if fraction is None else gpus.GpuEnvironment(float(fraction), chosen_here)
    step, donate = raw.get("step", False), raw.get("donate", [])
    if not isinstance(step, bool):
        raise UsageError(f"{p}: {where}.step must be true or false", "e.g. step = true")
    positions = isinstance(donate, list) and all(type(d) is int and d >= 0 for d in donate)
    if not positions:
        raise UsageError(f"{p}: {where}.donate must be a list of argument positions", "e.g. donate = [0, 1]")
    timed = raw.get("time", False)
    if not isinstance(timed, bool):
        raise UsageError(f"{p}: {where}.time must be true or false", "e.g. time = true")
    network = raw.get("network_gbps")
    if network is not None and (isinstance(network, bool) or not isinstance(network, int | float)):
        raise UsageError(f"{p}: {where}.network_gbps must be a number of Gb/s per GPU", "e.g. network_gbps = 400")
    try:  # the request's own checks, worded as this file's keys (not as the command line's flags)
        return GpuRequest(model, chosen, per_host, environment, step=step, donate=tuple(donate), time=timed,
                          network_gbps=None if network is None else float(network))
    except UsageError as err:
        raise UsageError(f"{p}: {where}.{err.message}", err.hint.replace("add time", "add time = true")) from None


def _peak_gate(raw: Mapping[str, Any], where: str, p: Path) -> PeakGate:
    fit = raw.get("fit", False)
    if not isinstance(fit, bool):
        raise UsageError(f"{p}: {where}.fit must be true or false", "e.g. fit = true")
    budgets = [Budget(_size(raw["peak_budget"], "peak_budget", where, p))] if "peak_budget" in raw else []
    per_policy = raw.get("peak_budgets", {})
    if not isinstance(per_policy, dict):
        hint = 'e.g. peak_budgets = { checkpoint_dots = "60GiB" }'
        raise UsageError(f"{p}: {where}.peak_budgets must be a table", hint)
    budgets += [Budget(_size(v, f"peak_budgets.{k}", where, p), k) for k, v in per_policy.items()]
    return PeakGate(fit, tuple(budgets))
