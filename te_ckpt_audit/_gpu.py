"""Will the step fit on the GPU? XLA:GPU's own memory plan of one training step, per device, under
each policy, compiled for a GPU model on a machine without one (`--gpu`).

The step is `value_and_grad` of the policy-applied function with respect to its float inputs
(the ones the audit differentiates): those are donated and the gradients returned; with an
optimizer, an optax update follows and the updated inputs and its state are returned, the state
donated too. It is lowered for a CUDA topology of that GPU (`jax_compat.cuda_topology`: JAX's
CUDA plugin, no driver), the mesh's axes laid over it, the inputs sharded as the audit shards
them, and compiled twice: with Triton's GEMM fusions (what XLA picks untuned) and with cuBLAS.
Without a device XLA cannot autotune, so the peak is a range over the two. Where the step needs
more than the device has, XLA rematerializes on its own; its instructions then carry `.remat`
names, and one more compile with all the memory the step wants says what it needed.

Compiled results are kept in a cache folder, keyed by the lowered program, the GPU's config,
the compiler options and the versions: JAX's own persistent cache cannot serve these compiles
(reading an entry back needs a client, which a device-less topology has not).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import platform
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from . import _jax_compat as jc
from ._apply import policy_function
from ._jaxpr import map_sub_jaxprs
from ._trace import Traced
from .errors import TargetError, UsageError, first_line
from .gpus import GpuRequest, Optimizer
from .records import GpuInfo, MeshSpec, PeakMemory, Scope, ShardingSource, StepInfo
from .specs import AsIs, PolicySpec, resolve_policy

INSTALL_HINT = "pip install 'te-ckpt-audit[gpu]' (Linux x86_64, Python >= 3.12, jax 0.12)"
BACKENDS: tuple[dict[str, bool], ...] = ({}, {"xla_gpu_enable_triton_gemm": False})  # Triton GEMMs, cuBLAS
UNBOUNDED = 2**50  # device memory for the compile that says what a rematerialized step needed
_REMAT_NAME = re.compile(r"%?([\w.\-]+\.remat\d*)\b")


def check_available() -> None:
    """Whether this machine can compile for a GPU target; what is missing is a UsageError naming
    the install (exit 2)."""
    if jc.JAX_VERSION < jc.GPU_TARGET_SINCE:
        raise UsageError(f"--gpu compiles through jax >= 0.12 (found jax {jax.__version__})", INSTALL_HINT)
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise UsageError(f"--gpu needs Linux on x86_64 (this is {sys.platform} on {platform.machine()})",
                         "JAX's CUDA plugin and NVIDIA's ptxas ship for it alone")
    needed = (("jax_plugins.xla_cuda12", "jax-cuda12-plugin"), ("nvidia.cuda_nvcc", "nvidia-cuda-nvcc-cu12"))
    for module, package in needed:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            raise UsageError(f"--gpu needs {package}, which is not installed", INSTALL_HINT)


def gpu_info(request: GpuRequest) -> GpuInfo:
    return GpuInfo(request.model.name, request.model.memory_bytes, request.usable_bytes, request.gpus_per_host)


def float_inputs(traced: Traced) -> list[int]:
    """Positions of the inputs the step differentiates, donates and updates: the float ones."""
    return [i for i, a in enumerate(traced.avals) if jnp.issubdtype(a.dtype, jnp.inexact)]


def donated_inputs(traced: Traced, request: GpuRequest) -> list[int]:
    """Positions of the inputs the compiled step donates: the float ones (te-ckpt-audit's step), or
    every input inside the arguments `--donate` names (the target's own step)."""
    if not request.step:
        return float_inputs(traced)
    return [i for i, name in enumerate(traced.arg_names) if _argument(name) in request.donate]


def _argument(name: str) -> int:
    """The positional argument an input's path starts in: `args[1]['w']` is in argument 1."""
    found = re.match(r"args\[(\d+)\]", name)
    return int(found.group(1)) if found else -1


def step_info(traced: Traced, request: GpuRequest) -> StepInfo:
    return StepInfo(
        None if request.optimizer is None else request.optimizer.value,
        tuple(traced.arg_names[i] for i in donated_inputs(traced, request)),
    )


def check_loss(traced: Traced) -> None:
    """The step differentiates the target's first output: it must be a float scalar (the loss)."""
    outs = traced.jaxpr.out_avals
    first: Any = outs[0] if outs else None  # an aval with a shape and a dtype
    if first is None or getattr(first, "shape", None) != () or not jnp.issubdtype(first.dtype, jnp.floating):
        got = "nothing" if first is None else str(first.str_short())
        raise UsageError(
            f"{traced.target} returns {got} first, not a scalar loss: --gpu compiles value_and_grad of it",
            "return the loss first (a float scalar); other outputs may follow it",
        )


# --- the step -----------------------------------------------------------------------------------


def _optimizer(kind: Optimizer) -> Any:  # an optax GradientTransformation
    try:
        import optax
    except ImportError:
        raise UsageError("--optimizer needs optax, which is not installed", INSTALL_HINT) from None
    if kind is Optimizer.SGD:
        return optax.sgd(1e-3, momentum=0.9)
    if kind is Optimizer.ADAM:
        return optax.adam(1e-3)
    if kind is Optimizer.ADAMW:
        return optax.adamw(1e-3)
    return optax.adafactor(1e-3)


def _step(fun: jc.ArrayFn, n: int, floats: list[int], optimizer: Any | None) -> Callable[..., Any]:
    """The training step of `fun` (flat inputs; its first output the loss) over its float inputs
    (a dict by position, so the optimizer's state names them), the other inputs as they are."""
    others = [i for i in range(n) if i not in set(floats)]

    def loss(params: dict[str, jax.Array], rest: list[jax.Array]) -> jax.Array:
        args: list[Any] = [None] * n
        for i in floats:
            args[i] = params[str(i)]
        for i, x in zip(others, rest, strict=True):
            args[i] = x
        return fun(*args)[0]

    if optimizer is None:

        def step(params: dict[str, jax.Array], rest: list[jax.Array]) -> Any:
            return jax.value_and_grad(loss)(params, rest)

        return step

    import optax

    def update(params: dict[str, jax.Array], rest: list[jax.Array], state: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, rest)
        updates, state = optimizer.update(grads, state, params)
        return value, optax.apply_updates(params, updates), state

    return update


def _state_sharding(path: Sequence[Any], leaf: Any, params: dict[str, jax.ShapeDtypeStruct], mesh: Mesh) -> Any:
    """An optimizer-state leaf sharded as the parameter it keeps a moment of (its path names the
    parameter; same shape), else replicated (a step count, Adafactor's factored moments)."""
    owner = next((str(k.key) for k in reversed(path) if isinstance(k, jax.tree_util.DictKey)), None)
    param = params.get(owner) if owner is not None else None
    same = param is not None and tuple(param.shape) == tuple(leaf.shape)
    sharding = param.sharding if same and param is not None else NamedSharding(mesh, PartitionSpec())
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


# --- placing the trace on the GPUs -------------------------------------------------------------


def _gpu_mesh(topology: Any, mesh: MeshSpec | None) -> Mesh:
    from jax.experimental import topologies

    if mesh is None:
        return topologies.make_mesh(topology, (1,), ("gpu",))
    return topologies.make_mesh(topology, tuple(a.size for a in mesh.axes), tuple(a.name for a in mesh.axes))


def _on(mesh: Mesh, aval: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    sharding = getattr(aval, "sharding", None)
    spec = sharding.spec if isinstance(sharding, NamedSharding) else PartitionSpec()
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=NamedSharding(mesh, spec))


def _rehomed(traced: Traced, mesh: Mesh) -> Traced:
    """The trace with every sharding and mesh it names (a `with_sharding_constraint`, a
    `shard_map`, made on the audit's CPU mesh) moved to the GPU mesh of the same axes."""

    def value(v: object) -> object:
        if isinstance(v, NamedSharding) and isinstance(v.mesh, Mesh) and v.mesh.axis_names == mesh.axis_names:
            return NamedSharding(mesh, v.spec, memory_kind=v.memory_kind)
        if isinstance(v, Mesh) and v.axis_names == mesh.axis_names:
            return mesh
        if isinstance(v, tuple) and any(isinstance(x, NamedSharding | Mesh) for x in v):
            return tuple(value(x) for x in v)
        return v

    memo: dict[int, tuple[Any, Any]] = {}

    def walk(jaxpr: jc.Jaxpr) -> jc.Jaxpr:
        eqns = []
        for eqn in jaxpr.eqns:
            params = {k: value(v) for k, v in eqn.params.items()}
            params = map_sub_jaxprs(params, lambda _, sub: walk(sub), memo)
            eqns.append(eqn.replace(params=params))
        return jaxpr.replace(eqns=eqns)

    closed = traced.jaxpr
    return dataclasses.replace(traced, jaxpr=closed.replace(jaxpr=walk(closed.jaxpr)), segments={}, wrapped={})


@dataclasses.dataclass(frozen=True, slots=True)
class _Measured:
    argument: int
    output: int
    alias: int
    temp: int
    peak: int
    remat: int  # instructions XLA rematerialized
    seconds: float


class Compiler:
    """Compiles one trace's training step for one GPU request, policy by policy."""

    def __init__(self, traced: Traced, request: GpuRequest, mesh: MeshSpec | None, cache: Path | None) -> None:
        check_available()
        if request.step:
            arguments = {_argument(n) for n in traced.arg_names}
            missing = [d for d in request.donate if d not in arguments]
            if missing:
                raise UsageError(f"--donate {missing[0]}: {traced.target} has no array argument {missing[0]}",
                                 f"its array arguments: {', '.join(map(str, sorted(arguments)))}")
        else:
            check_loss(traced)
        self.traced, self.request, self.mesh, self.cache = traced, request, mesh, cache
        self.devices = 1 if mesh is None else mesh.devices
        self.floats = float_inputs(traced)
        self.optimizer = None if request.optimizer is None else _optimizer(request.optimizer)
        self._meshes: dict[int | None, tuple[Mesh, Traced]] = {}

    def _placed(self, memory: int | None) -> tuple[Mesh, Traced]:
        """The GPU mesh (the device's own memory, or `memory`) and the trace moved onto it."""
        if memory not in self._meshes:
            config = self.request.model.config_text(memory)
            try:
                topology = jc.cuda_topology(config, self.request.topology(self.devices))
            except jc.CudaPluginMissing as exc:
                why = f"--gpu: JAX's CUDA plugin cannot be used here ({first_line(exc)})"
                raise UsageError(why, INSTALL_HINT) from None
            mesh = _gpu_mesh(topology, self.mesh)
            self._meshes[memory] = (mesh, _rehomed(self.traced, mesh) if self.mesh is not None else self.traced)
        return self._meshes[memory]

    def lowered(self, spec: PolicySpec, scope: Scope, memory: int | None = None) -> Any:  # jax.stages.Lowered
        mesh, traced = self._placed(memory)
        fun = policy_function(traced, spec, scope)
        avals = [_on(mesh, a) for a in traced.avals]
        if self.request.step:  # the target's own step, its donated arguments as it says
            return jax.jit(fun, donate_argnums=tuple(donated_inputs(traced, self.request))).lower(*avals)
        params = {str(i): avals[i] for i in self.floats}
        rest = [a for i, a in enumerate(avals) if i not in set(self.floats)]
        step = _step(fun, len(avals), self.floats, self.optimizer)
        # optax mixes Python scalars with its counts: the optimizer is ours, whatever the caller's promotion
        with jax.numpy_dtype_promotion("standard"):
            if self.optimizer is None:
                return jax.jit(step, donate_argnums=(0,)).lower(params, rest)
            shapes = jax.eval_shape(self.optimizer.init, params)
            state = jax.tree_util.tree_map_with_path(lambda p, leaf: _state_sharding(p, leaf, params, mesh), shapes)
            return jax.jit(step, donate_argnums=(0, 2)).lower(params, rest, state)

    def peak(self, spec: PolicySpec, scope: Scope, progress: Callable[[str], None] = lambda _: None) -> PeakMemory:
        """The step's peak per device under `spec`, over both GEMM backends; a step that does not
        compile is reported, not raised."""
        if self.request.step and not isinstance(spec, AsIs):
            why = "--step compiles the target's own training step as it is: only as-is"
            return PeakMemory(None, None, None, None, None, None, None, False, None, 0.0, why)
        try:
            lowered = self.lowered(spec, scope)
            measured = []
            for i, options in enumerate(BACKENDS):
                progress(f"compiling {spec.text} for {self.request.model.name} ({i + 1}/{len(BACKENDS)})")
                measured.append(self._compile(lowered, options, None))
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per policy; the audit itself stands
            why = f"{type(exc).__name__}: {first_line(exc)}"
            return PeakMemory(None, None, None, None, None, None, None, False, None, 0.0, why)
        top = max(measured, key=lambda m: m.peak)
        seconds = sum(m.seconds for m in measured)
        needed = None
        if any(m.remat for m in measured):  # what it wanted before XLA made it fit
            progress(f"compiling {spec.text} with unbounded memory (XLA rematerialized)")
            unbounded = self._compile(self.lowered(spec, scope, UNBOUNDED), BACKENDS[measured.index(top)], UNBOUNDED)
            needed, seconds = unbounded.peak, seconds + unbounded.seconds
        return PeakMemory(
            bytes_per_device=top.peak,
            bytes_per_device_min=min(m.peak for m in measured),
            argument_bytes=top.argument,
            output_bytes=top.output,
            alias_bytes=top.alias,
            temp_bytes=top.temp,
            fits=top.peak <= self.request.usable_bytes,
            xla_rematerialized=any(m.remat for m in measured),
            needed_bytes=needed,
            compile_seconds=round(seconds, 2),
        )

    def _compile(self, lowered: Any, options: dict[str, bool], memory: int | None) -> _Measured:
        key = self._key(lowered, options, memory)
        hit = self._read(key)
        if hit is not None:
            return hit
        start = time.perf_counter()
        with _xla_log() as log:
            compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
        seconds = time.perf_counter() - start
        stats = compiled.memory_analysis()
        if stats is None:
            raise TargetError("XLA:GPU reported no memory analysis for the step", "")
        measured = _Measured(
            argument=int(stats.argument_size_in_bytes),
            output=int(stats.output_size_in_bytes),
            alias=int(stats.alias_size_in_bytes),
            temp=int(stats.temp_size_in_bytes),
            peak=int(stats.peak_memory_in_bytes),
            remat=len(set(_REMAT_NAME.findall(compiled.as_text() or ""))) + sum(_GAVE_UP in line for line in log),
            seconds=round(seconds, 2),
        )
        self._write(key, measured)
        return measured

    def _key(self, lowered: Any, options: dict[str, bool], memory: int | None) -> str:
        h = hashlib.sha256()
        for part in (
            lowered.as_text(), self.request.model.config_text(memory), json.dumps(options, sort_keys=True),
            jax.__version__, _plugin_version(), self.request.topology(self.devices),
        ):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def _read(self, key: str) -> _Measured | None:
        if self.cache is None:
            return None
        try:
            raw = json.loads((self.cache / f"{key}.json").read_text())
            return _Measured(**{f.name: raw[f.name] for f in dataclasses.fields(_Measured)})
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write(self, key: str, measured: _Measured) -> None:
        if self.cache is None:
            return
        try:
            self.cache.mkdir(parents=True, exist_ok=True)
            part = self.cache / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
            part.write_text(json.dumps(dataclasses.asdict(measured)))
            part.replace(self.cache / f"{key}.json")
        except OSError:  # a cache that cannot be written costs a compile next time, nothing more
            pass


_GAVE_UP = "Can't reduce memory use below"  # XLA's rematerialization could not fit the device
_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] ")


@contextlib.contextmanager
def _xla_log() -> Iterator[list[str]]:
    """XLA's own log lines while it compiles (its C++ logging writes to file descriptor 2): kept
    for the compile's findings and off the user's stderr; anything else written there passes on."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if _ABSL_LINE.match(line):
                    lines.append(line)
                else:
                    print(line, file=sys.stderr)


def _plugin_version() -> str:
    try:
        from importlib.metadata import version

        return version("jax-cuda12-plugin")
    except Exception:  # noqa: BLE001 - not installed: the compile itself will say so
        return ""


# --- several policies at once, in worker processes (--jobs) ----------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Recipe:
    """How a session was built from a target, so that a worker process can build it again (a
    compile runs in the process that traced)."""

    target: str
    inputs: str | None
    defines: tuple[tuple[str, str], ...]
    scope: Scope
    mesh: MeshSpec | None
    shardings: ShardingSource
    folder: str  # the working folder the target's paths are relative to


_WORKER: dict[Recipe, Any] = {}  # in a worker: the session of each recipe, built once


def _peak_in_worker(recipe: Recipe, spec_text: str, request: GpuRequest) -> PeakMemory:
    """One policy's peak in a worker process; what fails there is that policy's error."""
    from ._session import Session  # the session imports this module

    try:
        jax.config.update("jax_platforms", "cpu")  # the worker's own process: no local CUDA is looked for
        if recipe not in _WORKER:
            os.chdir(recipe.folder)
            _WORKER[recipe] = Session.of_target(recipe.target, inputs=recipe.inputs, defines=dict(recipe.defines),
                                                scope=recipe.scope, mesh=recipe.mesh, shardings=recipe.shardings)
        session = _WORKER[recipe]
        spec = resolve_policy(spec_text)
        return session.compiler(request).peak(spec, session.resolved_scope(spec))
    except Exception as exc:  # noqa: BLE001 - reported per policy, as in this process
        return PeakMemory(None, None, None, None, None, None, None, False, None, 0.0,
                          f"{type(exc).__name__}: {first_line(exc)}")


def peaks_in_workers(
    recipe: Recipe, specs: Sequence[PolicySpec], request: GpuRequest, progress: Callable[[str], None]
) -> dict[str, PeakMemory]:
    """Each policy's peak, `request.jobs` policies at once, each in a worker process that traces
    the target again (spawned: JAX's threads do not survive a fork)."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    out: dict[str, PeakMemory] = {}
    with concurrent.futures.ProcessPoolExecutor(min(request.jobs, len(specs)), mp_context=context) as pool:
        futures = {pool.submit(_peak_in_worker, recipe, s.text, request): s.text for s in specs}
        for done in concurrent.futures.as_completed(futures):
            out[futures[done]] = done.result()
            progress(f"compiled {futures[done]} for {request.model.name} ({len(out)}/{len(specs)})")
    return out
