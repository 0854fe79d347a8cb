"""One policy's training step compiled for a GPU that is not here, and what its plan needs.

Each policy's step (`_step`) is lowered for a CUDA topology of the GPU (`_placement`) and
compiled with the run's XLA_FLAGS, XLA planning against the memory the run gives it (as jaxlib
hands XLA the allocator's limit on a real GPU), twice at once: with Triton's GEMM fusions (what
XLA picks untuned) and with cuBLAS; without a device XLA cannot autotune, so the peak is a range
over the two (one backend when XLA_FLAGS choose it). Where the step does not fit, or XLA
rematerialized to make it fit, one more compile says what it needs: the peak XLA plans with its
own rematerialization off and unbounded memory (`needed_bytes`). The least memory fraction is
the compiled peak (or the needs, where smaller) over the GPU's memory, when the most a run can
set holds it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh
from jax.stages import Lowered

from .. import _jax_compat as jc
from .._progress import Progress, quiet
from ..analysis._apply import policy_function
from ..errors import UsageError, first_line
from ..gpus import GpuRequest, least_fraction, xla_flags
from ..optimizers import optax_update
from ..records import CompileProgress, GpuInfo, MeshSpec, PeakMemory, Scope, StepTime, to_plain
from ..specs import AsIs, PolicySpec
from ..trace._trace import Traced
from . import _steptime as steptime
from ._cache import CompileCache, Measured
from ._kernels import step_kernels
from ._machine import INSTALL_HINT, check_available, versions
from ._placement import gpu_mesh, on, rehomed, replicated, step_mesh
from ._step import TrainingStep, own_step, state_on, training_step
from ._train import Compiled, LogCapture, argument_of, check_loss

UNBOUNDED = 2**50  # device memory for the compile that says what a step needs
TRITON_GEMM = "xla_gpu_enable_triton_gemm"
DISABLED_PASSES = "xla_disable_hlo_passes"
PARALLELISM = "xla_gpu_force_compilation_parallelism"  # LLVM's threads per compile (it changes no plan)
COST_STATS = "xla_gpu_collect_cost_model_stats"  # XLA's cost models' estimates, written into each kernel
FDO_PROFILE = "fdo_profile"  # --calibrate: a ProfiledInstructionsProto, as JAX's profile-guided estimator uses
GEMM_TILING = "xla_gpu_experimental_cost_model_gemm_tiling_default"  # Triton GEMMs tiled as tuned, not 16x8
TIME_SCHEMA = "te-ckpt-audit/gpu-estimate/1"  # the cache's step-time entries
_REMAT_NAME = re.compile(r"%?([\w.\-]+\.remat\d*)\b")


@dataclasses.dataclass(frozen=True, slots=True)
class Backend:
    name: str  # triton, cublas, or the run's (XLA_FLAGS chose it)
    options: tuple[tuple[str, Any], ...]


def _typed(value: str) -> Any:
    """An XLA flag's value as JAX's compile options take it: bools and numbers typed."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def unbounded_failure(peak: PeakMemory | None) -> bool:
    return peak is None or peak.bytes_per_device is None


def gpu_info(request: GpuRequest, mesh: MeshSpec | None = None, from_model: bool = False) -> GpuInfo:
    """`request`'s GPU and environment, for a step laid on `mesh` (one GPU without one; `from_model`:
    the mesh the model made over the machine's devices, no `--mesh` given)."""
    env = request.environment
    devices = 1 if mesh is None else mesh.devices
    return GpuInfo(
        name=request.model.name,
        memory_bytes=request.model.memory_bytes,
        usable_bytes=request.usable_at(request.mem_fraction, devices),
        gpus_per_host=request.gpus_per_host,
        mem_fraction=request.mem_fraction,
        fraction_source=env.fraction_source.value,
        fraction_variable=env.fraction_variable,
        max_fraction=request.max_fraction(devices),
        reserved_bytes=request.reserved_bytes(devices),
        allocator=env.allocator.value,
        preallocate=env.preallocate,
        xla_flags=env.xla_flags,
        mesh=None if mesh is None else str(mesh),
        mesh_source=None if mesh is None else "model" if from_model else "given",
    )


_NO_TABLE = re.compile(r"Cannot find key: (sm_\d+)")


def _time_failure(exc: Exception, gpu: str) -> str:
    """Why the estimate failed, in words: XLA's "NOT_FOUND: Cannot find key: sm_80" is its cost
    tables lacking the GPU's architecture, not the user's mistake."""
    missing = _NO_TABLE.search(str(exc))
    if missing:
        return (f"XLA's GPU cost tables have no entry for {missing.group(1)}, the {gpu}'s architecture: no step "
                "time estimate for it yet (its memory answer is unaffected)")
    return f"{type(exc).__name__}: {first_line(exc)}"


class Compiler:
    """Compiles one trace's training step for one GPU request, policy by policy. `capture` (the
    caller's: it owns the process's streams) wraps each compile, to keep XLA's log lines off
    the user's stderr."""

    def __init__(self, traced: Traced, request: GpuRequest, mesh: MeshSpec | None,
                 capture: LogCapture | None = None) -> None:
        check_available()
        if request.step:
            arguments = {argument_of(n) for n in traced.arg_names}
            missing = [d for d in request.donate if d not in arguments]
            if missing:
                raise UsageError(f"$donate$ {missing[0]}: {traced.target} has no array argument {missing[0]}",
                                 f"its array arguments: {', '.join(map(str, sorted(arguments)))}")
        else:
            check_loss(traced)
        self.traced, self.request = traced, request
        self.mesh = step_mesh(traced, mesh)  # --mesh, else the one the model made over the machine's devices
        self.cache = CompileCache(request.cache)
        self.capture = capture or contextlib.nullcontext
        self.devices = 1 if mesh is None else mesh.devices
        self.optimizer = None if request.optimizer is None else optax_update(request.optimizer)
        self._meshes: dict[tuple[int, bool], tuple[Mesh, Traced]] = {}
        self._programs: dict[tuple[str, Scope], str] = {}  # the hash of each policy's lowered step
        self._texts: dict[int, tuple[Lowered, str]] = {}  # id of a lowering -> (it, the hash of its text)
        self.options = self._checked_options()
        chosen = dict(self.options)
        self.backends: tuple[Backend, ...]
        if TRITON_GEMM in chosen:  # the run's flags choose the GEMM backend: one compile
            self.backends = (Backend("cublas" if chosen[TRITON_GEMM] is False else "triton", self.options),)
        else:
            self.backends = (Backend("triton", self.options), Backend("cublas", (*self.options, (TRITON_GEMM, False))))

    # --- placing and lowering ------------------------------------------------------------------

    def _config(self, memory: int, estimate: bool = False) -> str:
        model = self.request.model
        return model.estimate_config_text(memory) if estimate else model.config_text(memory)

    def _placed(self, memory: int, estimate: bool = False) -> tuple[Mesh, Traced]:
        """The GPU mesh of a device described with `memory` bytes (`estimate`: with the units and
        links the step-time estimate reads), and the trace moved onto it."""
        if (memory, estimate) not in self._meshes:
            config = self._config(memory, estimate)
            try:
                topology = jc.cuda_topology(config, self.request.topology(self.devices))
            except jc.CudaPluginMissing as exc:
                raise UsageError(f"JAX's CUDA plugin cannot be used here ({first_line(exc)})", INSTALL_HINT) from None
            mesh = gpu_mesh(topology, self.mesh)
            placed = (mesh, rehomed(self.traced, topology) if self.mesh is not None else self.traced)
            self._meshes[(memory, estimate)] = placed
        return self._meshes[(memory, estimate)]

    def _checked_options(self) -> tuple[tuple[str, Any], ...]:
        """The run's XLA_FLAGS as compile options, each checked on a trivial program first: a
        flag XLA does not know as a compile option, or whose value it takes only in XLA_FLAGS (an
        enum's "on"), is left to XLA's own reading of XLA_FLAGS; a value of the wrong type is
        tried as text first."""
        flags = [(name, _typed(value)) for name, value in xla_flags(self.request.environment.xla_flags)]
        if not flags:
            return ()
        mesh, _ = self._placed(self.request.planning_memory(self.request.mem_fraction))
        probe = jax.jit(lambda x: x + 1).lower(on(mesh, jax.ShapeDtypeStruct((8,), jax.numpy.float32)))
        options = dict(flags)
        for _ in range(2 * len(flags) + 1):
            try:
                with self.capture(), jc.no_persistent_cache_entry():
                    probe.compile(compiler_options=options)
                return tuple(options.items())
            except Exception as exc:  # noqa: BLE001 - XLA says which option, in its message
                text = str(exc)
                unknown = re.search(r"No such compile option: '([^']+)'", text)
                wrong = re.search(r"While setting option (\w+)", text)
                if unknown and unknown.group(1) in options:
                    options.pop(unknown.group(1))
                elif wrong and wrong.group(1) in options and not isinstance(options[wrong.group(1)], str):
                    options[wrong.group(1)] = str(dict(xla_flags(self.request.environment.xla_flags))[wrong.group(1)])
                elif wrong and wrong.group(1) in options:  # not as a compile option ("on" for an enum):
                    options.pop(wrong.group(1))  # left to XLA's own reading, which took it when JAX started
                else:
                    raise UsageError(f"XLA_FLAGS: XLA refuses them for a GPU compile: {first_line(exc)}",
                                     "fix the flag XLA names") from None
        return tuple(options.items())

    def step(self, spec: PolicySpec, scope: Scope, memory: int, estimate: bool = False) -> TrainingStep:
        mesh, traced = self._placed(memory, estimate)
        fun = policy_function(traced, spec, scope, calls=False)  # the program as the user's code makes it
        avals = [on(mesh, a) for a in traced.avals]
        if self.request.step:
            return own_step(traced, fun, avals, self.request.donate)
        return training_step(traced, fun, avals, self.optimizer, lambda _, s: state_on(_, s, replicated(mesh)))

    def lowered(self, spec: PolicySpec, scope: Scope, memory: int | None = None, estimate: bool = False) -> Lowered:
        """The step under `spec`, lowered for the GPU XLA plans against `memory` bytes of (by
        default, the run's fraction of it); `estimate`: for the step-time compile's GPU."""
        memory = self.request.planning_memory(self.request.mem_fraction) if memory is None else memory
        step = self.step(spec, scope, memory, estimate)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes Python scalars with its counts
            return jax.jit(step.fn, donate_argnums=step.donate).lower(*step.args)

    def program_hash(self, spec: PolicySpec, scope: Scope) -> str:
        """A hash of the step lowered at the run's fraction: what a worker process compiles must
        be this program."""
        if (spec.text, scope) not in self._programs:
            self._programs[(spec.text, scope)] = self._program(self.lowered(spec, scope))
        return self._programs[(spec.text, scope)]

    # --- compiling ------------------------------------------------------------------------------

    def result(self, spec: PolicySpec, scope: Scope, progress: Progress = quiet) -> Compiled:
        """The step's peak per device under `spec` and, where the request asks, its time: the
        estimate's compile runs beside the memory compiles. A step that does not compile is
        reported, not raised."""
        if not self.request.time:
            return Compiled(self.peak(spec, scope, progress), None)
        with self.capture(), concurrent.futures.ThreadPoolExecutor(1) as pool:
            timing = pool.submit(self.time, spec, scope, progress)
            return Compiled(self.peak(spec, scope, progress), timing.result())

    def peak(self, spec: PolicySpec, scope: Scope, progress: Progress = quiet) -> PeakMemory:
        """The step's peak per device under `spec`, over the GEMM backends; a step that does not
        compile is reported, not raised."""
        if self.request.step and not isinstance(spec, AsIs):
            return PeakMemory.not_compiled("a training step of the target's own is compiled as it is: only as-is")
        try:
            return self._peak(spec, scope, progress)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per policy; the audit itself stands
            return PeakMemory.not_compiled(f"{type(exc).__name__}: {first_line(exc)}")

    def time(self, spec: PolicySpec, scope: Scope, progress: Progress = quiet) -> StepTime:
        """The step's time on the GPUs under `spec` (`_steptime`), from a compile of its own: the
        GPU described with its arithmetic units and links, GEMMs on cuBLAS (whose costs XLA's
        table measured on real GPUs) unless the run's XLA_FLAGS choose, and XLA's cost models
        written into the program. Its failure is the estimate's error, not the audit's."""
        model = self.request.model
        if self.request.step and not isinstance(spec, AsIs):
            return steptime.failed("a training step of the target's own is compiled as it is: only as-is",
                                   model, self.devices)
        if self.devices > 1 and self.request.timed_model.rates is None:  # its collectives would cost nothing
            return steptime.failed(f"the GPU {model.name} (a config file) names no link bandwidth, so the "
                                   "collectives of a step on several GPUs cannot be timed: give network_gbps "
                                   "(--network-gbps), the Gb/s each GPU's links move", model, self.devices)
        try:
            return self._time(spec, scope, progress)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per policy
            return steptime.failed(_time_failure(exc, model.name), model, self.devices)

    def _time(self, spec: PolicySpec, scope: Scope, progress: Progress) -> StepTime:
        memory = self.request.planning_memory(self.request.mem_fraction)
        lowered = self.lowered(spec, scope, memory, estimate=True)
        options = self._estimate_options()
        backend = Backend("estimate", tuple(sorted((k, v) for k, v in options.items() if k != FDO_PROFILE)))
        rates = self.request.timed_model.rates  # the links the collectives are timed over
        profile = self.request.profile
        config = (self._config(memory, estimate=True) + steptime.revision() + repr(rates)  # by this code
                  + ("" if profile is None else profile.digest + profile.source))
        # the estimate shows each kernel's op name and source line: its key covers them (the text
        # without debug info keyed two programs differing only in names alike)
        named = hashlib.sha256(lowered.as_text(debug_info=True).encode()).hexdigest()
        key = self._key(named, backend, memory, config)
        hit = self.cache.read_plain(key, TIME_SCHEMA)
        found = None if hit is None else steptime.from_plain(hit)
        if found is not None:
            return found
        name = self.request.model.name
        progress(CompileProgress(spec.text, backend.name, name, None))
        start = time.perf_counter()
        no_table = None
        try:
            text = self._estimate_text(lowered, memory, options)
        except Exception as exc:  # XLA's cost tables lack this GPU (sm_80): its models give nothing, the roofline does
            missing = _NO_TABLE.search(str(exc))
            if missing is None:
                raise
            no_table = missing.group(1)
            text = self._estimate_text(lowered, memory, {k: v for k, v in options.items() if k != COST_STATS})
        seconds = time.perf_counter() - start
        progress(CompileProgress(spec.text, backend.name, name, round(seconds, 1)))
        kernels = step_kernels(text, self.devices, self.request.gpus_per_host)
        found = steptime.estimate(kernels, self.request.timed_model, self.devices, seconds, profile, no_table)
        self.cache.write_plain(key, TIME_SCHEMA, to_plain(found))
        return found

    def _estimate_options(self) -> dict[str, Any]:
        chosen = dict(self.options)
        options = {**chosen, COST_STATS: True, PARALLELISM: 1}
        if self.request.profile is not None:  # XLA's scheduler orders and overlaps by the measured costs
            options[FDO_PROFILE] = self.request.profile.serialized()
        if chosen.get(TRITON_GEMM, False) is not False:  # the run's flags chose Triton: its GEMMs tiled as tuned
            options[GEMM_TILING] = True
        else:
            options[TRITON_GEMM] = False
        return options

    def _estimate_text(self, lowered: Lowered, memory: int, options: dict[str, Any]) -> str:
        mesh = jax.set_mesh(self._placed(memory, True)[0]) if self.mesh is not None else contextlib.nullcontext()
        with self.capture(), mesh, jc.no_persistent_cache_entry():
            compiled = lowered.compile(compiler_options=options)
        return compiled.as_text() or ""

    def estimate_text(self, spec: PolicySpec, scope: Scope) -> str:
        """The optimized HLO of the step-time compile under `spec`, XLA's estimates in it (what
        `time` reads; uncached)."""
        memory = self.request.planning_memory(self.request.mem_fraction)
        return self._estimate_text(self.lowered(spec, scope, memory, estimate=True), memory, self._estimate_options())

    def _peak(self, spec: PolicySpec, scope: Scope, progress: Progress) -> PeakMemory:
        request = self.request
        run = request.planning_memory(request.mem_fraction)
        lowered = self.lowered(spec, scope, run)
        self._programs[(spec.text, scope)] = self._program(lowered)
        measured = self._compile_all(lowered, spec, self.backends, run, progress)
        top_index = max(range(len(measured)), key=lambda i: measured[i].peak)
        top, backend = measured[top_index], self.backends[top_index]
        seconds = sum(m.seconds for m in measured)
        usable = request.usable_at(request.mem_fraction, self.devices)
        fits = top.peak <= usable
        rematerialized = any(m.remat for m in measured)
        needed = None
        if rematerialized or not fits:
            unbounded = self.lowered(spec, scope, UNBOUNDED)
            options = Backend("needed", (*backend.options, (DISABLED_PASSES, self._disabled("rematerialization"))))
            (plan,) = self._compile_all(unbounded, spec, (options,), UNBOUNDED, progress)
            needed, seconds = plan.peak, seconds + plan.seconds
        self._texts.clear()  # the lowerings: their hashes are kept
        return PeakMemory(
            bytes_per_device=top.peak,
            bytes_per_device_min=min(m.peak for m in measured),
            argument_bytes=top.argument,
            output_bytes=top.output,
            alias_bytes=top.alias,
            temp_bytes=top.temp,
            fits=fits,
            xla_rematerialized=rematerialized,
            needed_bytes=needed,
            compile_seconds=round(seconds, 2),
            least_fraction=self._least(top.peak, needed),
            backends=tuple(b.name for b in self.backends),
        )

    def _least(self, peak: int, needed: int | None) -> float | None:
        """The least fraction whose usable memory holds the step: the plan compiled at the run's
        fraction (`peak`), or the step's needs where they are smaller. XLA plans no higher under a
        looser limit than the plan it made under this one, so no compile is needed to say it; None
        where neither fits the most a run can set, or the allocator takes no fraction."""
        request, memory = self.request, self.request.model.memory_bytes
        if not request.environment.allocator.pooled:
            return None
        least = least_fraction(min(peak, needed) if needed is not None else peak, memory)
        return least if least <= request.max_fraction(self.devices) else None

    def _disabled(self, name: str) -> str:
        """XLA's disabled passes: the run's (XLA_FLAGS) and `name`."""
        given = dict(self.options).get(DISABLED_PASSES)
        passes = [p for p in str(given).split(",") if p] if given else []
        return ",".join(dict.fromkeys([*passes, name]))

    def _compile_all(self, lowered: Lowered, spec: PolicySpec, backends: Sequence[Backend], memory: int,
                     progress: Progress) -> list[Measured]:
        """Each backend's compile of `lowered`, at once where there are several and cores for them
        (XLA compiles without Python's lock)."""
        cores = os.cpu_count() or 1
        if len(backends) == 1 or cores < 2:
            return [self._compile(lowered, spec, b, memory, progress) for b in backends]
        # the first (Triton's, the long one) keeps XLA's LLVM threads; the others compile on one
        # beside it. Triton alone took 5.9 s (scanned GPT-24) and 14.0 s (Llama-2 7B on 8 GPUs) on 2
        # cores; both at once, 7.6 s and 15.7 s with XLA's threads each, 9.1 s and 14.2 s with one
        # core each, 7.1 s and 14.8 s so
        one = (PARALLELISM, 1)
        backends = [b if i == 0 or PARALLELISM in dict(b.options) else dataclasses.replace(b, options=(*b.options, one))
                    for i, b in enumerate(backends)]
        with self.capture(), concurrent.futures.ThreadPoolExecutor(len(backends)) as pool:
            futures = [pool.submit(self._compile, lowered, spec, b, memory, progress, False) for b in backends]
            return [f.result() for f in futures]

    def _compile(self, lowered: Lowered, spec: PolicySpec, backend: Backend, memory: int, progress: Progress,
                 capture: bool = True) -> Measured:
        key = self._key(self._program(lowered), backend, memory)
        hit = self.cache.read(key)
        if hit is not None:
            return hit
        name = self.request.model.name
        progress(CompileProgress(spec.text, backend.name, name, None))
        start = time.perf_counter()
        # the step's GPU mesh as JAX's context mesh, in this thread: custom partitioners (TE's) read
        # it while XLA partitions, and a compile thread has none of the caller's
        mesh = jax.set_mesh(self._placed(memory)[0]) if self.mesh is not None else contextlib.nullcontext()
        with self.capture() if capture else contextlib.nullcontext(), mesh, jc.no_persistent_cache_entry():
            compiled = lowered.compile(compiler_options=dict(backend.options))
        seconds = time.perf_counter() - start
        progress(CompileProgress(spec.text, backend.name, name, round(seconds, 1)))
        stats = compiled.memory_analysis()
        if stats is None:
            raise RuntimeError("XLA:GPU reported no memory analysis for the step")
        measured = Measured(
            argument=int(stats.argument_size_in_bytes),
            output=int(stats.output_size_in_bytes),
            alias=int(stats.alias_size_in_bytes),
            temp=int(stats.temp_size_in_bytes),
            peak=int(stats.peak_memory_in_bytes),
            remat=len(set(_REMAT_NAME.findall(compiled.as_text() or ""))),
            seconds=round(seconds, 2),
        )
        self.cache.write(key, measured)
        return measured

    def _program(self, lowered: Lowered) -> str:
        """The hash of a lowered step's text (made once per lowering: the text of a large step is
        not free)."""
        found = self._texts.get(id(lowered))
        if found is None or found[0] is not lowered:
            found = (lowered, hashlib.sha256(lowered.as_text().encode()).hexdigest())
            self._texts[id(lowered)] = found
        return found[1]

    def _key(self, program: str, backend: Backend, memory: int, config: str | None = None) -> str:
        h = hashlib.sha256()
        for part in (
            program, config or self.request.model.config_text(memory), json.dumps(backend.options, sort_keys=True),
            versions(), self.request.topology(self.devices), os.environ.get("XLA_FLAGS", ""),
            self.request.environment.xla_flags,
        ):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()
