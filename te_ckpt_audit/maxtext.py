"""MaxText's own training step, compiled for GPUs that are not here (issue 28).

MaxText's model, abstract train state and train step are built the way its ahead-of-time compile
(`maxtext.trainers.pre_train.train_compile`) builds them, from MaxText's own functions: the config
read by its `pyconfig` (with the `compile_topology` settings its AOT compile takes), the shaped
state and batch of `get_shaped_inputs`, and `train.train_step` jitted with the shardings
`get_functional_train_with_signature` gives it, the state donated. MaxText's AOT compile for GPUs
mocks processes over `jax.devices()`, so it needs a GPU host; here the step is traced over this
machine's virtual CPU devices with the config's mesh, and the GPU stage lays that mesh's axes and
sizes over a CUDA topology of as many H100s (`_gpu._placement`): no GPU and no driver.

Each `remat_policy` builds its own program (MaxText's decoder picks its checkpoint policy from the
config), so each is a session of its own; `as-is` is the config's own value. The step is compiled
as it is; its residuals are audited on the function it differentiates: while the step is traced,
MaxText's train module is handed a `jax` whose `value_and_grad` notes the function and the
arguments' shapes (MaxText's own `diff_wrapper`, its loss with the model merged in), and that
loss is traced again as a target of its own, its parameters trained, under the decoder's own
checkpoints (`as-is`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import importlib.util
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeAlias, TypeVar

import jax

from . import _jax_compat as jc
from ._progress import Progress, quiet
from ._session import Session
from .errors import TargetError, UsageError, first_line
from .gpus import GpuRequest
from .records import (
    AuditReport,
    CompileProgress,
    GpuInfo,
    MaxTextPoint,
    MaxTextRecommendation,
    PeakMemory,
    Point,
    PolicyResult,
    Throughput,
    TpuInfo,
)
from .registry import NOTHING_SAVEABLE
from .search._synthesis import check_max_compiles, host_link_of, name_costs, synthesize
from .search._throughput import THROUGHPUT, per_device_of, point_of, search
from .specs import AsIs, resolve_policy
from .targets import LogCapture
from .tpus import ALIASES, CATALOG, TpuRequest, tpu_model
from .trace._devices import cpu_devices
from .trace._loading import user_code
from .trace._trace import trace

# MaxText's cuDNN flash attention through TE finds no fused backend without a GPU driver (TE falls
# back to unfused attention, which keeps every S x S score); JAX's own cuDNN flash attention
# compiles for the GPU target from here, with the same kernel's memory (its softmax statistics)
TE_FLASH, JAX_FLASH = "cudnn_flash_te", "cudnn_flash_jax"
CUDNN = "nvidia-cudnn-cu12>=9.10.2.21,<10"  # what jax-cuda12-plugin[with-cuda] 0.12.0.1 asks for
Request = TypeVar("Request", GpuRequest, TpuRequest)
GPUS_PER_SLICE = 8  # MaxText's accelerator map: "a3" (H100) is one host of 8 GPUs per slice
INSTALL = "pip install --no-deps maxtext==0.2.5, then what its decoder imports (zoo/maxtext-requirements.txt)"

# MaxText 0.2.5's remat_policy values (configs/base.yml, layers/nnx_decoders.py `get_remat_policy`)
REMAT_POLICIES = (
    "minimal_with_context", "minimal", "minimal_with_quantization", "minimal_with_context_and_quantization",
    "save_dot_with_context_except_mlp", "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj",
    "qkv_proj_offloaded", "minimal_offloaded", "save_out_proj", "full",
)

MaxTextObject: TypeAlias = Any  # MaxText's own: its HyperParameters, its train module (only where installed)


# Fastest first: MaxText's own order ("a trade-off between speed (fastest to slowest) and HBM usage
# (highest to lowest)", configs/base.yml), the variants that save TE's quantizers beside theirs
BY_SPEED = (
    "minimal_with_context_and_quantization", "minimal_with_context", "minimal_with_quantization", "minimal",
    "save_dot_with_context_except_mlp", "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj",
    "qkv_proj_offloaded", "minimal_offloaded", "save_out_proj", "full",
)


@dataclasses.dataclass(frozen=True, slots=True)
class MaxTextRun:
    """A MaxText run: its config file and its `key=value` settings, as MaxText's command line
    takes them. `compile_topology_num_slices` (MaxText's AOT setting) is the number of hosts of 8
    GPUs; 1 by default."""

    config: str
    settings: tuple[str, ...] = ()
    resolved: tuple[str, ...] = ()  # `resolved`: MaxText's own values of the settings the tool sizes by, read first
    tpu: str | None = None  # the TPU chip the step is compiled for (`--tpu v5e`): its slice is `compile_topology`

    def __post_init__(self) -> None:
        found = find_config(self.config)
        if found is not None:  # a bare name (llama2_7b.yml), as MaxText's users name its configs
            object.__setattr__(self, "config", found)
        for s in self.settings:
            key, sep, _ = s.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"MaxText setting {s!r} is not KEY=VALUE", "e.g. per_device_batch_size=4")

    def value(self, key: str) -> str | None:
        """The last value given for `key`, as MaxText reads its command line."""
        found = [s.partition("=")[2] for s in (*self.resolved, *self.settings) if s.partition("=")[0].strip() == key]
        return found[-1] if found else None

    @property
    def slices(self) -> int:
        """The hosts of 8 GPUs: `compile_topology_num_slices` as given (`resolved` writes in the
        config's own value), else 1."""
        text = (self.value("compile_topology_num_slices") or "1").strip()
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise UsageError(f"compile_topology_num_slices={text} must be a positive count of hosts",
                             "compile_topology_num_slices=16 for 16 hosts of 8 GPUs")
        return int(text)

    @property
    def devices(self) -> int:
        """The step's devices: 8 GPUs a host, or on a TPU the chips of `compile_topology`'s slice."""
        if self.tpu is None:
            return GPUS_PER_SLICE * self.slices
        if self.slices != 1:
            raise UsageError(f"compile_topology_num_slices={self.slices}: --tpu compiles for one slice",
                             "compile_topology_num_slices=1")
        return tpu_chips(self.tpu, self.value("compile_topology"))

    @property
    def target(self) -> str:
        return " ".join(["maxtext", self.config, *self.settings])


@contextlib.contextmanager
def _te_told_maxtexts_axes() -> Iterator[None]:
    """Transformer Engine told MaxText's mesh axes, as MaxText's `train.run` tells it
    (`max_utils.transformer_engine_context`: data, tensor, tensor_sequence, fsdp, context,
    expert): TE's partitioners read them while XLA compiles. Nothing where TE is not installed."""
    try:
        from transformer_engine.jax.sharding import MeshResource, global_shard_guard
    except Exception:  # noqa: BLE001 - TE missing, or unusable without its GPU libraries
        yield
        return
    with global_shard_guard(MeshResource(dp_resource="data", tp_resource="tensor", tpsp_resource="tensor_sequence",
                                         fsdp_resource="fsdp", pp_resource=None, cp_resource="context",
                                         ep_resource="expert")):
        yield


def check_remat_policies(policies: Sequence[str]) -> None:
    """Each one `as-is` or a remat_policy of MaxText's, else a UsageError naming it."""
    unknown = [p for p in policies if p != "as-is" and p not in REMAT_POLICIES]
    if unknown:
        raise UsageError(f"{unknown[0]!r} is not a remat_policy of MaxText's",
                         f"one of: as-is, {', '.join(REMAT_POLICIES)}")


# Where a bare config name is looked for in the installed MaxText, in order (MaxText 0.2.5 keeps its
# GPU recipes' models in configs/gpu/models/, its model sizes in configs/models/)
CONFIG_FOLDERS = ("configs/gpu/models", "configs/models", "configs")


def _maxtext_folders() -> list[Path]:
    """The installed MaxText package's folders, found without importing any of it."""
    try:
        spec = importlib.util.find_spec("maxtext")
    except (ImportError, ValueError):
        return []
    return [Path(f) for f in (spec.submodule_search_locations or [])] if spec is not None else []


def config_places(name: str) -> list[Path]:
    """Where `find_config` looks for `name`: the path as given, then each of CONFIG_FOLDERS of
    the installed MaxText."""
    return [Path(name), *(folder / sub / name for folder in _maxtext_folders() for sub in CONFIG_FOLDERS)]


def find_config(name: str) -> str | None:
    """`name` as a file, else the first of CONFIG_FOLDERS in the installed MaxText that holds it
    (`llama2_7b.yml` -> `.../maxtext/configs/gpu/models/llama2_7b.yml`); None where none does.
    An absolute path is taken as given."""
    if os.path.isfile(name) or os.path.isabs(name):
        return name if os.path.isfile(name) else None
    return next((str(p) for p in config_places(name) if p.is_file()), None)


def check_config_file(run: MaxTextRun) -> None:
    if not os.path.isfile(run.config):
        places = config_places(run.config)
        if len(places) <= 1:  # MaxText is not installed: nowhere to look for its configs
            raise UsageError(f"no such MaxText config: {run.config}, and MaxText is not installed to look in",
                             "install it on Python 3.12+: pip install -r zoo/maxtext-requirements.txt && pip "
                             "install --no-deps maxtext==0.2.5 (docs/guide/maxtext.md), or give the YAML file's path")
        raise UsageError(f"no such MaxText config: {run.config}",
                         f"a YAML file such as MaxText's configs/base.yml; looked in: {', '.join(map(str, places))}")
    if not run.config.endswith(".yml"):  # MaxText reads any other name as a setting
        raise UsageError(f"MaxText reads its config only from a file named *.yml, not {run.config}",
                         f"rename it (or copy it) to {Path(run.config).stem}.yml")


_BASE_CONFIG = re.compile(r"""^base_config\s*:\s*["']?([^"'#\s]+)""", re.MULTILINE)


def config_files(run: MaxTextRun) -> tuple[Path, ...]:
    """The run's config file and its `base_config` chain, found as MaxText's `pyconfig` finds them
    (beside the file that names it, else in MaxText's own configs folder), without MaxText."""
    found: list[Path] = []
    path: Path | None = Path(run.config)
    while path is not None and path.is_file() and path.resolve() not in found:
        found.append(path.resolve())
        try:
            named = _BASE_CONFIG.search(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            break
        path = None if named is None else _beside(path, named.group(1))
    return tuple(found)


def _beside(config: Path, base: str) -> Path | None:
    if os.path.isabs(base):
        return Path(base)
    here = config.parent / base
    if here.is_file():
        return here
    return next((f / "configs" / base for f in _maxtext_folders() if (f / "configs" / base).is_file()), None)


def tpu_chips(chip: str, topology: str | None) -> int:
    """The chips of MaxText's `compile_topology` for a TPU (`v5e-256`: 256; v4 and v5p count
    TensorCores, two a chip: `v5p-256` is 128 chips); a UsageError where it names no slice of `chip`.

    >>> tpu_chips("v5e", "v5e-256"), tpu_chips("v5p", "v5p-256")
    (256, 128)
    """
    model = tpu_model(chip)
    found = re.fullmatch(r"(v\d\w*)-(\d{1,5})", (topology or "").strip())
    named = tpu_model(found.group(1)) if found is not None and found.group(1) in (*CATALOG, *ALIASES) else None
    if found is None or named != model:
        counted = "TensorCores, two a chip" if model.name in ("v4", "v5p") else "chips"
        raise UsageError(f"--tpu {model.name} compiles for MaxText's compile_topology, which "
                         + (f"is {topology!r}, not a {model.name} slice" if topology else "the run leaves unset"),
                         f"add compile_topology={model.name}-8, or the slice you train on (MaxText names a "
                         f"{model.name} slice by its {counted}: {model.name}-8 ... {model.name}-256)")
    cores = int(found.group(2))
    return cores // 2 if model.dimensions == 3 else cores


def resolved(run: MaxTextRun) -> MaxTextRun:
    """`run` with the settings the tool sizes the run by written in as MaxText resolves them (its
    config file, the `base_config` chain, its `M_` environment variables and the command line):
    `compile_topology_num_slices` (1 where the config leaves it unset), `per_device_batch_size` and
    `max_target_length` (the step's tokens). Each is checked here, and `remat_policy`, so a bad
    value is a UsageError naming it before any work. MaxText's `pyconfig` starts JAX's backend:
    the command line calls this in a process of its own, before it sets this one's devices."""
    config = _config(run, None)
    check_settings(config)
    slices = int(config.compile_topology_num_slices)
    extra = (f"compile_topology_num_slices={max(1, slices)}",
             f"per_device_batch_size={number(config.per_device_batch_size)}",
             f"max_target_length={int(config.max_target_length)}")
    return dataclasses.replace(run, resolved=extra)


MAX_TOKENS_PER_DEVICE = 2**31  # a batch x sequence past this indexes no int32 array


def _sized(run: MaxTextRun) -> MaxTextRun:
    """`run` resolved, unless the command line resolved it already."""
    known = run.value("compile_topology_num_slices") and run.value("per_device_batch_size")
    return run if known else resolved(run)


def check_settings(config: MaxTextObject) -> None:
    """MaxText's resolved `config` as the tool can size it: a positive, finite per-device batch
    whose tokens an int32 can count, a positive count of hosts (or unset), a known remat_policy."""
    batch, seq = float(config.per_device_batch_size), int(config.max_target_length)
    if not math.isfinite(batch) or batch <= 0 or batch * seq > MAX_TOKENS_PER_DEVICE:
        raise UsageError(f"per_device_batch_size={number(config.per_device_batch_size)} is not a per-device "
                         f"batch a step can take (positive, at most {MAX_TOKENS_PER_DEVICE // max(seq, 1):,} "
                         f"at max_target_length={seq})", "e.g. per_device_batch_size=4")
    slices = int(config.compile_topology_num_slices)
    if slices == 0 or slices < -1:
        raise UsageError(f"compile_topology_num_slices={slices} must be a positive count of hosts",
                         "compile_topology_num_slices=16 for 16 hosts of 8 GPUs")
    policy = config.remat_policy
    if policy not in (*REMAT_POLICIES, "custom"):
        close = difflib.get_close_matches(str(policy), REMAT_POLICIES, n=3)
        raise UsageError(f"remat_policy={policy} is not a remat_policy of MaxText's",
                         f"did you mean {' or '.join(close)}?" if close else f"one of: {', '.join(REMAT_POLICIES)}")


def number(value: float | int | str) -> str:
    """A setting's number as MaxText's config lines take it: 4, not 4.0.

    >>> number(4.0), number(0.5), number("2")
    ('4', '0.5', '2')
    """
    x = float(value)
    return str(int(x)) if x.is_integer() and abs(x) < 2**53 else repr(x)


def _argv(run: MaxTextRun, remat_policy: str | None) -> list[str | None]:
    given = {s.partition("=")[0].strip() for s in (*run.resolved, *run.settings)}
    # compile_topology_num_slices is the config's own (`resolved` writes it in)
    ours = {"compile_topology": "a3", "skip_jax_distributed_system": "True", "enable_checkpointing": "False",
            "dataset_type": "synthetic"}
    if run.tpu is not None:  # MaxText's own TPU slice name, as given
        ours.pop("compile_topology")
    argv: list[str | None] = [None, run.config, *run.resolved, *run.settings]
    argv += [f"{k}={v}" for k, v in ours.items() if k not in given]
    if remat_policy is not None:
        argv.append(f"remat_policy={remat_policy}")
    # MaxText turns JAX's persistent cache on at its jax_cache_dir (~/jax_cache): the tool writes
    # nothing outside its own cache, whatever the config says
    argv.append("jax_cache_dir=")
    return argv


def _config(run: MaxTextRun, remat_policy: str | None) -> MaxTextObject:
    try:
        from maxtext.configs import pyconfig
    except ImportError as exc:
        raise UsageError(f"MaxText cannot be imported ({first_line(exc)})", INSTALL) from None
    check_config_file(run)
    try:
        return pyconfig.initialize(_argv(run, remat_policy))
    except Exception as exc:  # noqa: BLE001 - MaxText's own validation says what is wrong
        raise _refusal(exc) from None


_UNKNOWN_KEY = re.compile(r"^'(\w+)' not in ")
MAX_REASON = 300  # characters of MaxText's own message kept in the one line


def _refusal(exc: Exception) -> UsageError:
    """MaxText's refusal as one line that names the setting: pydantic's first error with its reason
    and value, an unknown key with the closest few MaxText has, else its own first line (cut)."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        found = errors()
        first = found[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        reason = _cut(f"{first.get('msg')}{more}")
        if not where:  # a check of the whole config: its input is every setting
            return UsageError(f"MaxText refuses the config: {reason}", "fix the setting it names")
        return UsageError(f"MaxText refuses {where}={_cut(repr(first.get('input')), 80)}: {reason}", f"fix {where}")
    text = str(exc)
    unknown = _UNKNOWN_KEY.match(text)
    if isinstance(exc, ValueError) and unknown:
        key = unknown.group(1)
        close = difflib.get_close_matches(key, re.findall(r"'(\w+)'", text)[1:], n=3)
        return UsageError(f"MaxText has no setting {key!r}",
                          f"did you mean {' or '.join(close)}?" if close else "see MaxText's configs/base.yml")
    return UsageError(f"MaxText refuses the config: {type(exc).__name__}: {_cut(first_line(exc))}",
                      "fix the setting MaxText names")


def _cut(text: str, most: int = MAX_REASON) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def _sharding_or_none(x: object) -> bool:
    return x is None or isinstance(x, jax.sharding.Sharding)


def _placed(sharding: jax.sharding.Sharding | None, values: object) -> object:
    """`values`' shapes, each with the sharding MaxText's jit takes it with (a prefix of them)."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), values)


def _device_mesh(config: MaxTextObject, devices: list[jax.Device]) -> jc.Tree:  # an ndarray of devices
    """The CPU devices as MaxText's mesh: its own `create_device_mesh` on one slice; over several
    (hosts), whose hybrid mesh needs each device's slice, the same shape: each axis's ICI
    parallelism times its DCN parallelism, as MaxText fills them in. The GPU stage lays the shape
    on the topology's hosts."""
    import numpy as np
    from maxtext.utils import max_utils, maxtext_utils

    if config.num_slices == 1:
        return maxtext_utils.create_device_mesh(config, devices)
    per_slice = len(devices) // config.num_slices
    ici = max_utils.fill_unspecified_mesh_axes(list(config.ici_parallelism), per_slice, "ICI")
    dcn = max_utils.fill_unspecified_mesh_axes(list(config.dcn_parallelism), config.num_slices, "DCN")
    return np.array(devices).reshape([i * d for i, d in zip(ici, dcn, strict=True)])


class _GradNoted:
    """What MaxText's train module sees as `jax` while its step is traced: jax itself, but for a
    `value_and_grad` that notes what it differentiates (the function, the arguments' positions and
    shapes) before differentiating it as jax does."""

    def __init__(self, real: ModuleType) -> None:
        self._real = real
        self.noted: list[tuple[jc.ArrayFn, int | tuple[int, ...], bool, tuple[jc.Tree, ...]]] = []

    def __getattr__(self, name: str) -> Any:  # whatever jax has
        return getattr(self._real, name)

    def value_and_grad(self, fun: jc.ArrayFn, argnums: int | tuple[int, ...] = 0, has_aux: bool = False,
                       **kw: bool) -> jc.ArrayFn:
        grad = self._real.value_and_grad(fun, argnums=argnums, has_aux=has_aux, **kw)

        def noted(*args: jc.Tree) -> jc.Tree:
            shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
                                  if isinstance(x, jax.Array | jax.core.Tracer) else x, args)
            self.noted.append((fun, argnums, has_aux, shapes))
            return grad(*args)

        return noted


@contextlib.contextmanager
def _noting_grads(module: MaxTextObject) -> Iterator[_GradNoted]:
    real = module.jax
    module.jax = noting = _GradNoted(real)
    try:
        yield noting
    finally:
        module.jax = real


@dataclasses.dataclass(frozen=True)
class _Loss:
    """The function MaxText's step differentiates, to trace as a loss of its own."""

    fn: jc.ArrayFn
    argnums: tuple[int, ...]
    has_aux: bool
    shapes: tuple[jc.Tree, ...]

    def __call__(self, *args: jc.Tree) -> jc.Tree:
        out = self.fn(*args)
        return out[0] if self.has_aux else out


def _has_floats(tree: object) -> bool:
    return any(isinstance(x, jax.ShapeDtypeStruct) and jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)
               for x in jax.tree.leaves(tree))


def maxtext_session(run: MaxTextRun, remat_policy: str | None = None) -> Session:
    """MaxText's train step for `run` (its remat policy set to `remat_policy`; the config's own
    with None), traced over the config's mesh of virtual CPU devices, as a session of a training
    step of its own."""
    return _maxtext_sessions(run, remat_policy, residuals=False)[0]


def _stand_in(config: MaxTextObject) -> tuple[str | None, str]:
    """The attention that compiles here for MaxText's `cudnn_flash_te` (None for any other), and
    what the run's target adds to say so. JAX's own cuDNN flash attention (the same kernel's
    memory), which needs cuDNN; where the model uses attention sinks (gpt-oss), which only TE's
    kernel has, unfused attention: its peak then holds every S x S score, above the real one."""
    if str(config.attention) != TE_FLASH:
        return None, ""
    if getattr(config, "attention_sink", False):
        why = ": JAX's cuDNN flash has no attention sinks, so unfused, a peak above the real one"
        return "dot_product", f" [attention=dot_product, standing in for {TE_FLASH}{why}]"
    if jc.cudnn_version() is None:
        raise UsageError(f"MaxText's attention={TE_FLASH} compiles here as JAX's cuDNN flash attention, "
                         "which needs cuDNN, and none is installed",
                         f"pip install '{CUDNN}' (the [gpu] extra has it), or set attention=dot_product")
    return JAX_FLASH, f" [attention={JAX_FLASH}, standing in for {TE_FLASH}]"


def labelled(run: MaxTextRun) -> str:
    """The run's target as its reports name it: the stand-in for TE's attention said."""
    return run.target + _stand_in(_config(_sized(run), None))[1]


def maxtext_sessions(run: MaxTextRun, remat_policy: str | None = None) -> tuple[Session, Session]:
    """MaxText's train step for `run` (as `maxtext_session`) and, for its residual audit, the
    loss it differentiates, traced as a target with its parameters trained."""
    step, loss, _ = _maxtext_sessions(run, remat_policy, residuals=True)
    assert loss is not None
    return step, loss


def _maxtext_sessions(run: MaxTextRun, remat_policy: str | None,
                      residuals: bool) -> tuple[Session, Session | None, _Loss | None]:
    run = _sized(run)  # MaxText's own count of hosts, never its unset -1
    config = _config(run, remat_policy)
    stand_in, said = _stand_in(config)  # TE's fused attention needs a GPU driver: a stand-in compiles
    target = run.target + said
    if stand_in is not None:
        run = dataclasses.replace(run, settings=(*run.settings, f"attention={stand_in}"))
        config = _config(run, remat_policy)
    with user_code(target):
        from flax.core.spmd import logical_axis_rules
        from jax.sharding import AxisType, Mesh
        from maxtext.trainers.pre_train import train, train_compile
        from maxtext.utils import maxtext_utils, sharding

        devices = cpu_devices(run.devices)
        axis_type = AxisType.Explicit if str(config.shard_mode).lower().endswith("explicit") else AxisType.Auto
        try:
            mesh = Mesh(_device_mesh(config, devices), config.mesh_axes,
                        axis_types=(axis_type,) * len(config.mesh_axes))
            # MaxText's code mixes dtypes under JAX's default (standard) promotion, as its train.py runs it
            with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules), \
                    jax.numpy_dtype_promotion("standard"):
                (args, kwargs, state_shardings, _, model) = train_compile.get_shaped_inputs(mesh, config)
                params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
                    config, state_shardings)
                state_in = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings, params_shardings)
                data = sharding.get_input_data_sharding(config, mesh)
                fn, in_shard, out_shard, static, donate = maxtext_utils.get_functional_train_with_signature(
                    train.train_step, data, state_in, model, config, params_shardings)
                step = jax.jit(fn, in_shardings=in_shard, out_shardings=out_shard, static_argnums=static,
                               donate_argnums=donate)
                placed = jax.tree.map(_placed, in_shard, args, is_leaf=_sharding_or_none)

                def train_step(state: jc.Tree, batch: jc.Tree) -> jc.Tree:
                    with logical_axis_rules(config.logical_axis_rules), jax.numpy_dtype_promotion("standard"):
                        return step(state, batch, **kwargs)

                with _te_told_maxtexts_axes(), _noting_grads(train) as noting:
                    traced = trace(train_step, placed, target, differentiable=False)
                lost, loss = None, None
                if residuals:
                    if not noting.noted:
                        raise TargetError("MaxText's train step differentiated nothing through jax.value_and_grad",
                                          "this MaxText differentiates otherwise: its residuals cannot be audited")
                    fn, argnums, has_aux, shapes = noting.noted[0]
                    loss = _Loss(fn, tuple(argnums) if isinstance(argnums, tuple | list) else (argnums,), has_aux,
                                 shapes)
                    trained = [i for i in loss.argnums if _has_floats(shapes[i])]  # an empty State trains nothing
                    with _te_told_maxtexts_axes():
                        lost = Session(trace(loss, shapes, f"{target} [the loss it differentiates]", trained))
        except (UsageError, TargetError):
            raise
        except Exception as exc:
            raise TargetError(f"building MaxText's train step raised {type(exc).__name__}: {first_line(exc)}",
                              "check the config's settings ($debug$)") from exc
    rebuild = functools.partial(maxtext_session, run, remat_policy)
    return Session(traced, rebuild=rebuild, own_step=True), lost, loss


def _its_own_step(on: Request) -> Request:
    """`on` (a GPU or TPU request) for MaxText's train step: a step of its own, compiled as it is,
    the state (argument 0) donated as MaxText donates it."""
    return dataclasses.replace(on, step=True, donate=(0,), optimizer=None)


def audit_maxtext(
    run: MaxTextRun,
    remat_policies: Sequence[str] = ("as-is",),
    gpu: GpuRequest | None = None,
    *,
    progress: Progress = quiet,
    capture: LogCapture | None = None,
    tpu: TpuRequest | None = None,
) -> AuditReport:
    """One row per MaxText `remat_policy` (`as-is`: the config's own): the residuals of the loss
    MaxText's step differentiates, under the decoder's checkpoints of that policy, and (with
    `gpu`) the peak of MaxText's own train step compiled for it (its state donated), or (with
    `tpu`, the run's `compile_topology` slice) libtpu's plan and verdict, as one report."""
    check_remat_policies(remat_policies)
    if gpu is not None and tpu is not None:
        raise UsageError("$gpu$ and $tpu$ both name the step's target", "give one of them")
    run = _sized(run)
    on: GpuRequest | TpuRequest | None = (_its_own_step(gpu) if gpu is not None else
                                          None if tpu is None else _its_own_step(tpu))
    rows: list[PolicyResult] = []
    first: tuple[Session, AuditReport] | None = None
    for policy in dict.fromkeys(remat_policies):
        progress(f"building MaxText's train step ({'the config' if policy == 'as-is' else policy}'s remat)")
        step, loss = maxtext_sessions(run, None if policy == "as-is" else policy)
        told = _named(progress, policy)
        with _te_told_maxtexts_axes():
            audited = loss.report([AsIs()], progress=told)
            compiled = None
            if on is not None:
                target = {"gpu": on} if isinstance(on, GpuRequest) else {"tpu": on}
                compiled = step.report([AsIs()], progress=told, capture=capture, **target).results[0]
        if first is not None and audited.equations != first[1].equations:
            raise TargetError(f"remat_policy={policy} traces another forward pass than {remat_policies[0]}",
                              "audit the policies one at a time")
        first = first or (step, audited)
        row = audited.results[0]
        # the step's time counted as training runs count it: the loss's model FLOPs, the policy's recompute
        time = None if compiled is None else loss.timed(row.forward_flops, row.recompute_flops, compiled.time,
                                                          _tokens(run))
        rows.append(dataclasses.replace(row, policy=policy, peak=None if compiled is None else compiled.peak,
                                        tpu_plan=None if compiled is None else compiled.tpu_plan, time=time))
    assert first is not None
    shell = first[0].report_of(rows, on if isinstance(on, GpuRequest) else None)  # the target's: the step's
    if isinstance(on, TpuRequest):
        shell = dataclasses.replace(shell, **first[0].target_info(on))  # type: ignore[arg-type]
    audited = first[1]
    # the target as the step was traced: the run, and the attention standing in for TE's, if any
    return dataclasses.replace(shell, equations=audited.equations, arguments=audited.arguments, te=audited.te,
                               trained=audited.trained)


def _named(progress: Progress, remat_policy: str) -> Progress:
    """`progress` with MaxText's step, compiled as it is, named by its remat_policy."""
    if remat_policy == "as-is":
        return progress

    def told(event: str | CompileProgress) -> None:
        if isinstance(event, CompileProgress) and event.policy == AsIs().text:
            event = dataclasses.replace(event, policy=f"remat_policy={remat_policy}")
        progress(event)

    return told


def _tokens(run: MaxTextRun) -> int | None:
    """The tokens of one step, all GPUs: the per-device batch over the devices, times the sequence."""
    batch, seq = run.value("per_device_batch_size"), run.value("max_target_length")
    try:
        return None if batch is None or seq is None else round(float(batch) * run.devices * int(seq))
    except ValueError:
        return None


def _layout(text: str) -> tuple[str, ...]:
    """`ici_fsdp_parallelism=4,ici_tensor_parallelism=2` as settings; each an `ici_`/`dcn_` one."""
    settings = tuple(part.strip() for part in text.split(",") if part.strip())
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key.startswith(("ici_", "dcn_")) or not key.endswith("_parallelism"):
            raise UsageError(f"$layouts$ {text!r}: {setting!r} is not an ici_*/dcn_*_parallelism=N setting",
                             "e.g. $layouts$ ici_fsdp_parallelism=4,ici_tensor_parallelism=2")
        if not value.lstrip("-").isdigit():
            raise UsageError(f"$layouts$ {text!r}: {value!r} is not a whole number", "e.g. ici_fsdp_parallelism=8")
    return settings


def _fitting_layout(run: MaxTextRun, text: str) -> tuple[str, ...]:
    """`text`'s settings, once MaxText takes them laid over the run's own (those it does not name
    stay the config's) and their products are the run's GPUs per host (ici) and hosts (dcn), as
    its mesh asks (`max_utils.fill_unspecified_mesh_axes`): checked before the first compile."""
    settings = _layout(text)
    try:
        config = _config(dataclasses.replace(run, settings=(*run.settings, *settings)), None)
        from maxtext.utils.max_utils import fill_unspecified_mesh_axes

        fill_unspecified_mesh_axes(list(config.ici_parallelism), GPUS_PER_SLICE, "ICI")
        fill_unspecified_mesh_axes(list(config.dcn_parallelism), run.slices, "DCN")
    except UsageError as err:
        raise UsageError(f"$layouts$ {text}: {err.template}", err.hint_template) from None
    except AssertionError as exc:
        raise UsageError(f"$layouts$ {text}: {' '.join(str(exc).split())}",
                         f"the ici_* products make {GPUS_PER_SLICE} GPUs per host and the dcn_* ones "
                         f"{run.slices} host(s); the config's own settings stay where the layout names none"
                         ) from None
    return settings


def check_layouts(layouts: Sequence[str]) -> None:
    """Each of `layouts` MaxText's ici/dcn parallelism settings, else a UsageError naming it."""
    for text in layouts:
        _layout(text)


def recommend_maxtext(
    run: MaxTextRun,
    request: GpuRequest | TpuRequest,
    batch_sizes: Sequence[str] = (),
    layouts: Sequence[str] = (),
    *,
    max_compiles: int = 24,
    progress: Progress = quiet,
    capture: LogCapture | None = None,
    maximize: str | None = None,
    remat_policies: Sequence[str] = (),
    synthesize: bool = False,
    allow_offload: bool = False,
) -> MaxTextRecommendation:
    """The largest of `batch_sizes` (the config's own without them) at which one of MaxText's
    remat policies fits on `request`'s GPUs (a `GpuRequest`) or TPU slice (a `TpuRequest`: the
    run's `compile_topology`, libtpu's verdict), and at it the fastest that fits, in MaxText's own
    order (the `_with_quantization` variants only for a config with TE's quantization), on the
    first of `layouts` (ici/dcn parallelism over the run's devices, as `a=N,b=M`; the config's own
    without them) where it does: batches largest first, policies fastest first, layouts in the
    order given, each point compiled, until one fits (at most `max_compiles` compiles). With
    `maximize="throughput"`: the remat policy (of `remat_policies`, else all of MaxText's that
    apply) and per-device batch (the ladder from the config's own, or `batch_sizes`) whose step
    fits with the most estimated tokens per second per device (`_throughput`), on the config's
    layout. With `synthesize` too, the policy is made, not chosen: `remat_policy=custom` with each of
    its tensor keys that the model names set to `device` or `remat` (`search._synthesis`, the
    per-name costs from the loss MaxText differentiates), MaxText's policies (`remat_policies`, else
    `SYNTHESIS_PRESETS`) compiled beside the pick; with `allow_offload` on GPUs and the v5e, `offload` as well
    (over the host link; where a TPU's was not measured, the solver says it did not)."""
    if allow_offload and not synthesize:
        raise UsageError("$allow_offload$ lets $synthesize$ offload MaxText's tensor keys", "add $synthesize$")
    if max_compiles < 1:
        raise UsageError(f"$max_compiles$ {max_compiles} must be at least 1", "e.g. $max_compiles$ 24")
    if maximize is not None and maximize != THROUGHPUT:
        raise UsageError(f"$maximize$ {maximize}: MaxText's search maximizes throughput", "$maximize$ throughput")
    if synthesize and maximize is None:
        raise UsageError("$synthesize$ makes the remat policy of the fastest step that fits",
                         "add $maximize$ throughput")
    if synthesize:
        check_max_compiles(max_compiles)
    if remat_policies and maximize is None:
        raise UsageError("$remat_policies$ name what --maximize throughput searches", "add $maximize$ throughput")
    if maximize is not None and layouts:
        raise UsageError("$maximize$ throughput searches policy and batch on one layout",
                         "give the layout as the run's settings (ici_fsdp_parallelism=8 ...)")
    check_remat_policies([p for p in remat_policies if p != "as-is"])
    # one call per kind: the helper keeps the kind it is given (a constrained TypeVar takes no union)
    request = _its_own_step(request) if isinstance(request, GpuRequest) else _its_own_step(request)
    for size in batch_sizes:
        try:
            if not (math.isfinite(float(size)) and float(size) > 0):
                raise ValueError(size)
        except ValueError:
            raise UsageError(f"$batch$ {size} is not a positive per-device batch size", "e.g. $batch$ 4") from None
    run = _sized(run)
    given = run.value("per_device_batch_size")
    assert given is not None
    sizes = sorted(dict.fromkeys(batch_sizes), key=float, reverse=True) if batch_sizes else [given]
    meshes: list[tuple[str, ...]] = [_fitting_layout(run, text) for text in dict.fromkeys(layouts)] or [()]
    # without TE's quantization the `_with_quantization` variants are their bases again: not tried
    quantized = bool(str(_config(run, None).quantization or ""))
    policies = [p for p in BY_SPEED if quantized or "quantization" not in p]
    if synthesize:
        chosen = [p for p in dict.fromkeys(remat_policies) if p != "as-is"] or list(SYNTHESIS_PRESETS)
        return _synthesized(run, request, chosen, batch_sizes, max_compiles, progress, capture, allow_offload)
    if maximize is not None:
        return _fastest(run, request, list(dict.fromkeys(remat_policies)) or policies, batch_sizes, max_compiles,
                        progress, capture)
    tried: list[MaxTextPoint] = []
    first: Session | None = None
    for size in sizes:
        batch: tuple[str, ...] = (f"per_device_batch_size={size}",)
        for policy in policies:
            for mesh in meshes:
                if len(tried) >= max_compiles:
                    break
                at = dataclasses.replace(run, settings=(*run.settings, *batch, *mesh))
                where = "".join(f", {x}" for x in mesh)
                progress(f"MaxText's train step: remat_policy={policy}, batch {size}{where}")
                session = maxtext_session(at, policy)
                first = first or session
                with _te_told_maxtexts_axes():
                    peak = session.compiled([AsIs()], request, _named(progress, policy),
                                            capture=capture)[AsIs().text].peak
                tried.append(MaxTextPoint(policy, number(size), peak, mesh))
                if tried[-1].fits:
                    return _recommendation(run, tried[-1], tried, first, request)
    return _recommendation(run, None, tried, first, request)


def _recommendation(run: MaxTextRun, chosen: MaxTextPoint | None, tried: Sequence[MaxTextPoint],
                    session: Session | None, request: GpuRequest | TpuRequest,
                    throughput: Throughput | None = None) -> MaxTextRecommendation:
    """The search's record, naming the GPU or TPU slice its points were compiled for (none where
    nothing was compiled)."""
    info = {} if session is None else session.target_info(request)
    gpu, tpu = info.get("gpu"), info.get("tpu")
    return MaxTextRecommendation(labelled(run), chosen, tuple(tried), gpu if isinstance(gpu, GpuInfo) else None,
                                 throughput, tpu if isinstance(tpu, TpuInfo) else None)


class _Steps:
    """The throughput searches' `evaluate`: each (policy, per-device batch) point MaxText's own
    train step, compiled and timed, the policy one of MaxText's (or as-is) or a spec over the
    custom keys `names` (`custom_settings`); every point kept for the record."""

    def __init__(self, run: MaxTextRun, timed: GpuRequest | TpuRequest, names: Sequence[str], progress: Progress,
                 capture: LogCapture | None) -> None:
        self.run, self.timed, self.names, self.progress, self.capture = run, timed, names, progress, capture
        self.tried: dict[tuple[str, int], MaxTextPoint] = {}
        self.first: Session | None = None

    def evaluate(self, batch: Sequence[tuple[str, int]]) -> list[Point]:
        found = []
        for policy, value in batch:
            remat_policy, custom = custom_settings(policy, self.names)
            at = dataclasses.replace(self.run, settings=(*self.run.settings, f"per_device_batch_size={value}",
                                                         *custom))
            said = remat_policy or "as-is"
            kept = ", ".join(c for c in custom if c.endswith("=device")) or "every key remat"
            self.progress(f"MaxText's train step: remat_policy={said}, batch {value}"
                          + (f" ({kept})" if custom else ""))
            try:
                session = maxtext_session(at, remat_policy)
                with _te_told_maxtexts_axes():
                    step = session.compiled([AsIs()], self.timed, _named(self.progress, said),
                                            capture=self.capture)[AsIs().text]
            except TargetError as exc:  # MaxText cannot build the step at this batch
                self.tried[(policy, value)] = MaxTextPoint(said, str(value), PeakMemory.not_compiled(first_line(exc)),
                                                           custom=custom)
                found.append(Point(policy, value, None, False, None, None, first_line(exc)))
                continue
            self.first = self.first or session
            self.tried[(policy, value)] = MaxTextPoint(said, str(value), step.peak, custom=custom)
            found.append(point_of(policy, value, step.peak, step.time, _tokens(at)))
        return found

    def recommendation(self, searched: Throughput) -> MaxTextRecommendation:
        best = searched.best
        chosen = None if best is None else self.tried[(best.policy, best.value)]
        return _recommendation(self.run, chosen, list(self.tried.values()), self.first, self.timed, searched)


def _fastest(run: MaxTextRun, request: GpuRequest | TpuRequest, policies: list[str], batch_sizes: Sequence[str],
             max_compiles: int, progress: Progress, capture: LogCapture | None) -> MaxTextRecommendation:
    """`recommend_maxtext`'s search by throughput: each (remat_policy, per_device_batch_size)
    point MaxText's own train step, compiled and timed; tokens per second per device."""
    timed = dataclasses.replace(request, time=True)
    given = run.value("per_device_batch_size")
    assert given is not None
    values = [_whole_batch(v) for v in batch_sizes]
    start = values[0] if values else _whole_batch(given)
    steps = _Steps(run, timed, (), progress, capture)

    # a per-device batch: every count splits evenly over the mesh, so the edge is bisected in steps of 1
    searched = per_device_of(search(steps.evaluate, policies, start, "per_device_batch_size", "tokens",
                                    max_compiles=max_compiles, values=values, grain=1), request)
    return steps.recommendation(searched)


# What MaxText's custom policy takes for each tensor key (configs/base.yml), and the key it keeps on
# the device whatever it is set to: the scan carry, where each layer's recomputation starts.
CUSTOM_VALUES = ("remat", "device", "offload")
SCAN_CARRY = "decoder_layer_input"
# The presets `--synthesize` compiles beside its pick unless --policy names others: MaxText's
# fastest of each family, and full (nothing saved).
SYNTHESIS_PRESETS = ("minimal_with_context", "minimal", "save_dot_except_mlp", "save_qkv_proj", "full")


def custom_settings(policy: str, names: Sequence[str]) -> tuple[str | None, tuple[str, ...]]:
    """The remat_policy and tensor keys (`key=device|offload|remat`) that make the spec `policy` of
    MaxText's train step over its custom keys `names`: one of MaxText's policies as it is,
    `nothing_saveable` every key remat, `save_only_these_names:...` its names on the device and the
    others remat, `save_and_offload_only_these_names:...` its offloaded names `offload` too.

    >>> custom_settings("save_only_these_names:context,mlpwo", ["context", "mlpwi", "mlpwo"])
    ('custom', ('context=device', 'mlpwi=remat', 'mlpwo=device'))
    >>> custom_settings("save_and_offload_only_these_names:save=context;offload=mlpwi", ["context", "mlpwi"])
    ('custom', ('context=device', 'mlpwi=offload'))
    >>> custom_settings("minimal", ["context"])
    ('minimal', ())
    """
    if policy in REMAT_POLICIES or policy == "as-is":
        return (None if policy == "as-is" else policy), ()
    spec = None if policy == NOTHING_SAVEABLE else resolve_policy(policy)
    saved, moved = (spec.names, spec.offload_names) if spec is not None else ((), ())
    return "custom", tuple(f"{n}={'device' if n in saved else 'offload' if n in moved else 'remat'}" for n in names)


def _custom_keys(run: MaxTextRun) -> frozenset[str]:
    """The tensor keys MaxText's custom policy takes in this config (its values are 'remat',
    'device' or 'offload'), the scan carry left out: it is always kept."""
    keys = _config(run, None).get_keys()
    return frozenset(k for k, v in keys.items() if isinstance(v, str) and v in CUSTOM_VALUES) - {SCAN_CARRY}


def _synthesized(run: MaxTextRun, request: GpuRequest | TpuRequest, presets: list[str], batch_sizes: Sequence[str],
                 max_compiles: int, progress: Progress, capture: LogCapture | None,
                 allow_offload: bool = False) -> MaxTextRecommendation:
    """`recommend_maxtext(..., synthesize=True)`: which of MaxText's custom tensor keys to keep on
    the device, with the per-device batch, by `search._synthesis`'s solver over MaxText's own steps;
    each name's bytes and recompute from the loss MaxText differentiates (traced under `full`, whole:
    its figures are divided by the run's devices, as the batch is split over them)."""
    timed = dataclasses.replace(request, time=True)
    given = run.value("per_device_batch_size")
    assert given is not None
    start = _whole_batch(batch_sizes[0]) if batch_sizes else _whole_batch(given)
    at_start = dataclasses.replace(run, settings=(*run.settings, f"per_device_batch_size={start}"))
    progress("MaxText's loss under remat_policy=full: each custom key's bytes and recompute")
    _, loss = maxtext_sessions(at_start, "full")
    nothing = loss.result(resolve_policy(NOTHING_SAVEABLE), progress)  # the names are known once analysed
    names = sorted(_custom_keys(at_start) & loss.checkpoint_names)
    if not names:
        raise UsageError("$synthesize$ decides on MaxText's custom tensor keys, and this model names none of them",
                         "search MaxText's policies: drop $synthesize$")
    devices = max(_sized(run).devices, 1)  # the loss is traced whole: its figures over the devices, per device
    costs = [dataclasses.replace(c, bytes=c.bytes // devices, recompute_flops=c.recompute_flops // devices)
             for c in name_costs(loss, names, progress)]
    steps = _Steps(run, timed, names, progress, capture)
    usable = timed.usable_bytes if isinstance(timed, GpuRequest) else timed.target.model.usable_bytes
    flops = (3 * nothing.forward_flops + nothing.recompute_flops) // devices  # the loss's step, saving nothing
    link, why = host_link_of(timed, allow_offload)
    made = synthesize(steps.evaluate, costs, start, "per_device_batch_size", usable, step_flops=flops,
                      max_compiles=max_compiles, presets=presets, unit="tokens", on_presets=False, host_link=link,
                      not_offloaded=why)
    return steps.recommendation(per_device_of(made, timed))


def _whole_batch(value: str) -> int:
    """A per-device batch the throughput search can double and halve: a whole number, at least 1."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number >= 1 and number == int(number)):
        raise UsageError(f"$maximize$ throughput searches whole per-device batches; {value} is not one",
                         "give per_device_batch_size=N (or $batch$ N) with N a whole number from 1")
    return int(number)
