"""The session: one target's trace, its scope and its placement, and every policy's analysis made
once and kept. `audit`, `recommend`, `check` and the pytest helper are thin clients of it.

    load (target, inputs) -> trace -> Session
        Session.result(spec)     apply the policy, one JAX linearization      (_apply, _analysis)
                                 + bytes per device on the mesh, if placed    (_mesh)
        Session.report(specs)    + warnings, + compiled step if asked         (_warnings, _compile)
                                 + the step's peak on a GPU model, if asked   (_gpu)
                                 -> AuditReport (records), which renderers draw

Each step reuses the one analysis of its policy: a policy is linearized once per session, whether
it is audited, placed on a mesh, warned about or searched over by `recommend`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from ._emulated import emulated_device
from ._progress import Progress, quiet
from .analysis._analysis import Analysis, analyse_policy, failed
from .analysis._apply import resolve_scope
from .analysis._mesh import per_device
from .analysis._warnings import NOTHING, remat3_row, warnings_for
from .config import DefinesLike, as_defines
from .errors import TargetError, UsageError
from .gpus import GpuRequest
from .records import (
    AuditReport,
    CompileProgress,
    GpuInfo,
    InputsReplicated,
    MeshSpec,
    PolicyResult,
    Remat3ChangesPolicy,
    Remat3Row,
    Scope,
    ShardingSource,
    StepTime,
    TeKind,
    TpuInfo,
    TpuPlan,
    Trained,
)
from .registry import AS_IS, DEFAULT_POLICIES
from .specs import AsIs, Custom, NoCheckpoint, PolicyLike, PolicySpec, policy_specs
from .targets import (
    Compiled,
    Compiler,
    LogCapture,
    TpuCompiler,
    check_loss,
    gpu_info,
    peaks_in_workers,
    step_info,
    step_mesh,
    tpu_info,
)
from .targets._cpu import compiled_memory
from .targets._step import trained_paths
from .tpus import TpuRequest
from .trace._devices import build_abstract_mesh, build_mesh, mesh_context, source_of, spec_of
from .trace._loading import Placement, user_code
from .trace._trace import Loaded, Traced, trace_function, trace_target
from .trace._trained import ALL, ParamsLike

REMAT3_MODES = ("on", "off", "both")


def _with_remat3(build: Callable[[], Session], mode: str) -> Session:
    """`build()`'s session under `mode` of JAX's remat (`Session.use_remat3`): picklable."""
    session = build()
    session.use_remat3(mode)
    return session


@dataclasses.dataclass(frozen=True, slots=True)
class _Analysed:
    """A policy's analysis, or why JAX could not differentiate under it."""

    analysis: Analysis | None
    placed: PolicyResult | None  # the result with per-device bytes (the result itself off a mesh)
    error: TargetError | None


class Session:
    """One target: its trace, the scope policies apply at, the mesh its inputs are placed on (or
    none), and the cache of each policy's analysis.

    >>> import jax, jax.numpy as jnp
    >>> from te_ckpt_audit.specs import resolve_policy
    >>> s = Session.of_function(lambda x: jnp.sum(jnp.sin(jnp.sin(x))), jax.ShapeDtypeStruct((8,), jnp.float32))
    >>> s.result(resolve_policy("nothing_saveable")).totals.activation_bytes
    0
    """

    def __init__(
        self,
        traced: Traced,
        scope: Scope = Scope.AUTO,
        mesh: Placement = None,
        *,
        keywords: Mapping[str, object] | None = None,
        rebuild: Callable[[], Session] | None = None,
        own_step: bool = False,
        replicated: tuple[str, ...] = (),
    ) -> None:
        """`keywords`: what the inputs callable was called with; `rebuild`: a picklable callable
        that builds this session again (a worker process compiles from its own); `own_step`: the
        traced function is a training step of the user's own (compiled as it is, not audited)."""
        self._traced = traced  # the trace: private (its types are the library's own)
        self._label = traced.target or "the function"  # what the user's errors are said to come from
        self.scope = Scope(scope)
        self.mesh = mesh
        self.keywords: Mapping[str, object] = dict(keywords or {})
        self.rebuild = rebuild
        self.own_step = own_step
        self.replicated = replicated  # the mesh's axes no input is sharded over, when none is
        self.emulated_device = emulated_device()
        self._analysed: dict[PolicySpec, _Analysed] = {}  # keyed by the frozen spec
        self._compilers: dict[GpuRequest, Compiler] = {}
        self._tpu_compilers: dict[TpuRequest, TpuCompiler] = {}
        self.compare_remat3 = False  # `--remat3 both`: each policy under JAX's new remat too

    # --- building one ---------------------------------------------------------------------------

    @classmethod
    def of_loaded(cls, loaded: Loaded, scope: Scope = Scope.AUTO, *, rebuild: Callable[[], Session] | None = None,
                  own_step: bool = False, remat3: str | None = None) -> Session:
        """The session of what the first stage (`trace`) loaded and traced, under `remat3`."""
        session = cls(loaded.traced, scope, loaded.placement, keywords=loaded.keywords, rebuild=rebuild,
                      own_step=own_step, replicated=loaded.replicated)
        session.use_remat3(remat3)
        return session

    @classmethod
    def of_function(cls, fn: Callable[..., Any], *args: Any, scope: Scope = Scope.AUTO, mesh: Placement = None,
                    params: ParamsLike = ALL, own_step: bool = False, name_lines: bool = False,
                    remat3: str | None = None) -> Session:
        """Trace `fn(*args)`; with `mesh`, its inputs placed on it (their NamedShardings, or
        replicated). `params` names the trained arguments (positions or names; by default every
        float input, as `jax.ad_checkpoint.print_saved_residuals(fn, *args)` differentiates them);
        `name_lines`: the matmul lines of its code get the tool's checkpoint names; `remat3`: see
        `use_remat3`."""
        loaded = trace_function(fn, args, mesh, params, own_step, name_lines)
        return cls.of_loaded(loaded, scope, own_step=own_step, remat3=remat3)

    @classmethod
    def of_target(
        cls,
        target: str,
        *,
        inputs: str | None = None,
        defines: DefinesLike = None,
        scope: Scope = Scope.AUTO,
        mesh: MeshSpec | None = None,
        shardings: ShardingSource = ShardingSource.COMPILED,
        params: ParamsLike = None,
        own_step: bool = False,
        name_lines: bool = False,
        progress: Progress = quiet,
        remat3: str | None = None,
    ) -> Session:
        """Load `file.py:fn` (or `package.module:fn`), call its inputs callable (given the mesh as
        keyword `mesh` when it declares one) and trace it, as the user's code: `sys.exit` there is
        the target's failure. With `mesh`, the inputs are placed on virtual CPU devices (compiled
        shardings) or on an abstract mesh of explicit axes. `params` names the trained arguments
        (by default the first, as `jax.grad(loss)(params, batch)` trains it); `own_step`: the
        target is a training step of the user's own. `defines`: the inputs callable's keywords,
        `{"seq": 64}` or `["seq=64"]`, typed by its defaults as `-D seq=64` is. `name_lines`: the
        matmul lines of the user's code get the tool's checkpoint names (`trace._naming`);
        `remat3`: see `use_remat3`."""
        defines = as_defines(defines)
        build = build_mesh if ShardingSource(shardings) is ShardingSource.COMPILED else build_abstract_mesh
        placement = None if mesh is None else build(mesh)
        loaded = trace_target(target, inputs, defines, placement, params, own_step, name_lines, progress)
        rebuild = functools.partial(Session.of_target, loaded.where, inputs=loaded.inputs, defines=dict(defines),
                                    scope=Scope(scope), mesh=mesh, shardings=ShardingSource(shardings),
                                    params=params, own_step=own_step, name_lines=name_lines)
        return cls.of_loaded(loaded, scope, rebuild=rebuild, own_step=own_step, remat3=remat3)

    def use_remat3(self, mode: str | None) -> None:
        """Which of JAX's remat implementations the results are: "on" (`jax_remat3`), "off" (the
        current `jax.checkpoint`), "both" (the current one, and each policy under remat3 beside it);
        None: as JAX read its flag when the function was traced (JAX_REMAT3)."""
        if mode is None:
            return
        if mode not in REMAT3_MODES:
            raise UsageError(f"$remat3$ is {mode!r}: one of {', '.join(REMAT3_MODES)}",
                             "on: JAX's new remat (jax_remat3); off: the current one; both: side by side")
        flag = mode == "on"
        if flag != self._traced.remat3:
            self._traced = dataclasses.replace(self._traced, remat3=flag)
            self._analysed.clear()
            self._compilers.clear()
            self._tpu_compilers.clear()
        self.compare_remat3 = mode == "both"
        if self.rebuild is not None:  # a worker process builds the same session: the same remat
            self.rebuild = functools.partial(_with_remat3, self.rebuild, mode)

    def _remat3_rows(self, specs: Sequence[PolicySpec], rows: Sequence[PolicyResult], progress: Progress
                     ) -> tuple[tuple[Remat3Row, ...], tuple[Remat3ChangesPolicy, ...]]:
        """Each policy that JAX differentiated, under JAX's new remat too: its row and, where the
        two implementations save different things, the finding."""
        compared, changes = [], []
        for spec, row in zip(specs, rows, strict=True):
            if row.error is not None or isinstance(spec, NoCheckpoint):
                continue
            progress(f"analysing {spec.text} under jax_remat3")
            now = self._analysis(spec).result
            try:
                with self._running():
                    new, error = analyse_policy(self._traced, spec, self.scope, remat3=True).result, None
            except TargetError as exc:
                new, error = None, exc.message
            found, change = remat3_row(self._traced, spec, now, new, error)
            compared.append(found)
            if change is not None:
                changes.append(change)
        return tuple(compared), tuple(changes)

    # --- the steps --------------------------------------------------------------------------------

    def _user_code(self) -> contextlib.AbstractContextManager[None]:
        """The user's code runs under the tool's rules (its errors are the target's, named)."""
        return user_code(self._label)

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """The user's code runs under JAX while a policy is analysed (policies, differentiation
        rules), with the mesh as JAX's context mesh."""
        with self._user_code(), mesh_context(self.mesh):
            yield

    def _analysed_as(self, spec: PolicySpec, progress: Progress = quiet) -> _Analysed:
        key = spec
        if key not in self._analysed and isinstance(spec, AsIs) and not self._traced.has_remat:
            # without checkpoints of its own, the model as it is is plain autodiff: the same function,
            # the same linearization (every verdict "none" under both)
            plain = self._analysed_as(NoCheckpoint(), progress)
            if plain.error is None and plain.analysis is not None and plain.placed is not None:
                scope = resolve_scope(self._traced, spec, self.scope)
                analysis = dataclasses.replace(plain.analysis, result=dataclasses.replace(
                    plain.analysis.result, policy=spec.text, scope=scope))
                placed = dataclasses.replace(plain.placed, policy=spec.text, scope=scope)
                self._analysed[key] = _Analysed(analysis, placed, None)
        if key not in self._analysed:
            progress(f"analysing {spec.text}")
            try:
                with self._running():
                    analysis = analyse_policy(self._traced, spec, self.scope)
            except TargetError as exc:  # JAX cannot differentiate under this policy
                self._analysed[key] = _Analysed(None, None, exc)
                return self._analysed[key]
            placed = analysis.result
            if self.mesh is not None:
                progress(f"partitioning {spec.text} on the mesh")
                with self._running():
                    placed = per_device(self._traced, analysis, self.mesh)
            self._analysed[key] = _Analysed(analysis, placed, None)
        return self._analysed[key]

    def _analysis(self, spec: PolicySpec) -> Analysis:
        """The policy's one linearization and what was read from it; a TargetError when JAX cannot
        differentiate the function under it."""
        outcome = self._analysed_as(spec)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.analysis is not None
        return outcome.analysis

    def result(self, spec: PolicySpec, progress: Progress = quiet) -> PolicyResult:
        """The policy's residuals, marks and recompute cost, per device on the mesh; a TargetError
        when JAX cannot differentiate the function under it."""
        outcome = self._analysed_as(spec, progress)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.placed is not None
        return outcome.placed

    def row_of(self, spec: PolicySpec, progress: Progress = quiet) -> PolicyResult:
        """The policy's row in a report: its result, or an empty row saying why there is none (a
        training step of the user's own is not audited: the residuals are inside it)."""
        if self.own_step:
            if not isinstance(spec, AsIs):
                raise UsageError(f"{self._traced.target} is a training step of its own: it is compiled as it is",
                                 "audit it as-is alone")
            return dataclasses.replace(failed(self._traced, spec, self.scope, TargetError("")), error=None,
                                       audited=False)
        outcome = self._analysed_as(spec, progress)
        if outcome.error is not None:
            return failed(self._traced, spec, self.scope, outcome.error)
        assert outcome.placed is not None
        return outcome.placed

    def _nothing_saveable(self) -> PolicyResult | None:
        outcome = self._analysed_as(NOTHING)
        return outcome.placed

    def with_warnings(self, spec: PolicySpec, result: PolicyResult, audited_nothing: bool = False) -> PolicyResult:
        """`result` with its warnings (`_warnings`)."""
        if result.error is not None:  # an empty row: nothing to compare or warn about
            return result
        with self._running():
            warnings = warnings_for(self._traced, spec, result, self._nothing_saveable, audited_nothing)
        return dataclasses.replace(result, warnings=warnings)

    def with_compiled_memory(self, spec: PolicySpec, result: PolicyResult) -> PolicyResult:
        """`result` with XLA's memory analysis of the compiled training step under the policy."""
        if result.error is not None:
            return result
        with self._running():
            return dataclasses.replace(result, compiled=compiled_memory(self._traced, spec, result.scope))

    def compiler(self, request: GpuRequest, capture: LogCapture | None = None) -> Compiler:
        """The compiler of this trace's training step for `request`'s GPU (one per request);
        `capture` keeps XLA's log lines off the caller's stderr while it compiles."""
        self._same_step(request)
        if request not in self._compilers:
            self._compilers[request] = Compiler(self._traced, request, self.gpu_mesh, capture)
        return self._compilers[request]

    def _same_step(self, request: GpuRequest | TpuRequest) -> None:
        """`request` compiles a step of the target's own exactly where this session traced one."""
        if request.step != self.own_step:
            if request.step:
                raise UsageError(f"{self._traced.target} was not traced as a training step of its own",
                                 "build the session with own_step=True")
            raise UsageError(f"{self._traced.target} is a training step of its own", "compile it with step=True")

    def prepare(self, request: GpuRequest | TpuRequest, capture: LogCapture | None = None) -> None:
        """Whatever the target's compiler needs and lacks (libtpu, a loss to train), said before any compile."""
        if isinstance(request, TpuRequest):
            self.tpu_compiler(request, capture)
        else:
            self.compiler(request, capture)

    def compiled(
        self,
        specs: Sequence[PolicySpec],
        request: GpuRequest | TpuRequest,
        progress: Progress = quiet,
        executor: concurrent.futures.Executor | None = None,
        capture: LogCapture | None = None,
    ) -> dict[str, Compiled]:
        """Each policy's training step on `request`'s GPU or TPU slice, by spec text: its peak per
        device (a TPU's: libtpu's plan, its verdict) and, where the request asks, its time; with
        `executor` (processes: a compile needs a process of its own to run in parallel), several
        GPU steps at once, each worker's program checked against this process's."""
        if isinstance(request, TpuRequest):
            on_tpu = self.tpu_compiler(request, capture)
            out_tpu = {}
            for spec in specs:
                plan, time = self._tpu_plan(on_tpu, spec, progress, capture)
                out_tpu[spec.text] = Compiled(plan.peak(), time)
            return out_tpu
        compiler = self.compiler(request, capture)

        def here(spec: PolicySpec) -> Compiled:
            with self._user_code():
                return compiler.result(spec, self.resolved_scope(spec), progress)

        portable = [s for s in specs if not isinstance(s, Custom)]  # a callable given directly stays here
        out: dict[str, Compiled] = {}
        if executor is not None and self.rebuild is not None and len(portable) > 1:
            with self._user_code():
                wanted = [(s, compiler.program_hash(s, self.resolved_scope(s))) for s in portable]
            out = peaks_in_workers(executor, repr(self.rebuild), self.rebuild, wanted, request, here, progress)
        for spec in specs:
            if spec.text not in out:
                out[spec.text] = here(spec)
        return out

    def timed(self, forward_flops: int, recompute_flops: int, time: StepTime | None,
              tokens: int | None = None) -> StepTime | None:
        """`time` with the model's FLOPs per device (3 x `forward_flops`; a step of the target's own:
        as traced) and the policy's recompute; `tokens` per step, where known."""
        if time is None:
            return None
        devices = max(time.devices, 1)
        model = forward_flops if self.own_step else 3 * forward_flops
        batch = self.keywords.get("batch")  # the inputs' batch: examples per step where tokens are not known
        examples = batch if tokens is None and type(batch) is int and batch > 0 else None
        return dataclasses.replace(time, model_flops=model // devices, recompute_flops=recompute_flops // devices,
                                   tokens=tokens, examples=examples)

    def default_policies(self) -> tuple[str, ...]:
        """The default comparison: for a model with checkpoints of its own, what its own policy
        keeps comes first (`as-is`), then the set every model gets; a training step of the
        target's own is compiled as it is."""
        if self.own_step:
            return (AS_IS,)
        return (AS_IS, *DEFAULT_POLICIES) if self.has_remat else DEFAULT_POLICIES

    def report(
        self,
        policies: Sequence[PolicyLike] | None = None,
        *,
        warnings: bool = True,
        compile: bool = False,
        gpu: GpuRequest | None = None,
        progress: Progress = quiet,
        executor: concurrent.futures.Executor | None = None,
        capture: LogCapture | None = None,
        tpu: TpuRequest | None = None,
    ) -> AuditReport:
        """Every policy's row, with warnings, (with `compile`) the compiled step and (with `gpu`)
        its peak on that GPU, (with `tpu`) libtpu's plan and verdict for that slice, as one
        report (`default_policies` without `policies`). Under no policy at all is the function's
        own failure: its error is raised. `executor` and `capture`: see `compiled`."""
        specs = policy_specs(self.default_policies() if policies is None else policies)
        if gpu is not None and tpu is not None:
            raise UsageError("$gpu$ and $tpu$ both name the step's target", "give one of them")
        if gpu is not None:
            self.compiler(gpu, capture)  # what the machine lacks, or a target with no loss: said before any work
        on_tpu = None if tpu is None else self.tpu_compiler(tpu, capture)  # likewise
        rows = [self.row_of(spec, progress) for spec in specs]
        errors = [r for r in rows if r.error is not None]
        if errors and len(errors) == len(rows):
            failure = self._analysed_as(specs[0]).error
            assert failure is not None
            raise failure
        if warnings and not self.own_step:
            audited = NOTHING in specs
            rows = [self.with_warnings(s, r, audited) for s, r in zip(specs, rows, strict=True)]
        if compile:
            compiled = []
            for spec, row in zip(specs, rows, strict=True):
                if row.error is None:
                    progress(f"compiling {spec.text}")
                compiled.append(self.with_compiled_memory(spec, row))
            rows = compiled
        if gpu is not None:
            wanted = [s for s, r in zip(specs, rows, strict=True) if r.error is None]
            found = self.compiled(wanted, gpu, progress, executor, capture)
            rows = [r if r.error is not None else dataclasses.replace(
                r, peak=found[s.text].peak, time=self.timed(r.forward_flops, r.recompute_flops, found[s.text].time))
                for s, r in zip(specs, rows, strict=True)]
        if on_tpu is not None and tpu is not None:
            planned = []
            for s, r in zip(specs, rows, strict=True):
                if r.error is None:
                    plan, time = self._tpu_plan(on_tpu, s, progress, capture)
                    r = dataclasses.replace(r, tpu_plan=plan, time=self.timed(r.forward_flops, r.recompute_flops, time))
                planned.append(r)
            rows = planned
        report = self.report_of(rows, gpu, tpu)
        if self.compare_remat3 and not self.own_step:
            compared, changes = self._remat3_rows(specs, rows, progress)
            report = dataclasses.replace(report, remat3=compared, findings=report.findings + changes)
        return report if tpu is None else dataclasses.replace(report, tpu=tpu_info(tpu, self.gpu_mesh))

    def tpu_compiler(self, request: TpuRequest, capture: LogCapture | None = None) -> TpuCompiler:
        """The compiler of this trace's training step for `request`'s TPU slice: libtpu missing, a
        target with no loss or a slice of another size than the mesh are said before any work."""
        self._same_step(request)
        if not request.step:
            check_loss(self._traced)
        if request not in self._tpu_compilers:
            with capture() if capture is not None else contextlib.nullcontext():
                self._tpu_compilers[request] = TpuCompiler(self._traced, request, self.gpu_mesh)
        return self._tpu_compilers[request]

    def _tpu_plan(self, compiler: TpuCompiler, spec: PolicySpec, progress: Progress,
                  capture: LogCapture | None) -> tuple[TpuPlan, StepTime | None]:
        topology = compiler.request.target.topology
        progress(CompileProgress(spec.text, "libtpu", topology, None))  # a CI log's line, a spinner's entry
        start = time.perf_counter()
        try:
            with self._user_code(), \
                    capture() if capture is not None else contextlib.nullcontext():
                return compiler.plan(spec, self.resolved_scope(spec))
        finally:
            progress(CompileProgress(spec.text, "libtpu", topology, round(time.perf_counter() - start, 1)))

    def report_of(self, results: Sequence[PolicyResult], gpu: GpuRequest | None = None,
                  tpu: TpuRequest | None = None) -> AuditReport:
        """The report of this trace holding `results` (their peaks compiled for `gpu` or `tpu`)."""
        target = gpu if gpu is not None else tpu
        equations = self._traced.rows.equations()
        return AuditReport(
            target=self._traced.target,
            arguments=self._traced.arguments,
            jax_version=jax.__version__,
            te=TeKind.of(equations),
            equations=equations,
            results=tuple(results),
            emulated_device=self.emulated_device,
            mesh=None if self.mesh is None else spec_of(self.mesh),
            sharding_source=None if self.mesh is None else source_of(self.mesh),
            gpu=None if gpu is None else self.gpu_info(gpu),
            step=None if target is None else step_info(self._traced, target),
            trained=None if self.own_step else self.trained(),
            findings=self.findings(),
            remat="remat3" if self._traced.remat3 else "remat",
        )

    def findings(self) -> tuple[InputsReplicated, ...]:
        """The audit's own findings, not one policy's: a mesh no input is sharded over."""
        if self.mesh is None or not self.replicated:
            return ()
        return (InputsReplicated(str(spec_of(self.mesh)), self.replicated),)

    def trained(self) -> Trained:
        """The inputs this session differentiates, as a report records them."""
        t = self._traced.trained
        names = trained_paths(self._traced) if t.arguments is not None else tuple(
            n for n, a in zip(self._traced.arg_names, self._traced.avals, strict=True)
            if jax.numpy.issubdtype(a.dtype, jax.numpy.inexact))
        return Trained(t.arguments, names, t.convention)

    @property
    def target(self) -> str:
        """The target as given (`file.py:fn`), or the function's name."""
        return self._traced.target

    @property
    def arguments(self) -> tuple[str, ...]:
        """The traced inputs, "path: dtype[shape]" each (what a define changes, where it changes any)."""
        return self._traced.arguments

    @property
    def has_remat(self) -> bool:
        """Whether the function has checkpoints of its own (custom_vjp forward rules included)."""
        return self._traced.has_remat

    @property
    def forward_flops(self) -> int:
        """FLOPs of one forward pass."""
        return self._traced.forward_flops

    @property
    def checkpoint_names(self) -> frozenset[str]:
        """The checkpoint names the function's values carry (known once one policy is analysed:
        JAX traces custom_vjp forward rules when it first differentiates)."""
        return frozenset(self._traced.rows.names)

    @property
    def line_names(self) -> dict[str, str]:
        """The checkpoint names the tool gave the matmul lines (`name_lines`): name -> "file:line"."""
        return dict(self._traced.line_names)

    @property
    def has_te_gemms(self) -> bool:
        return any(e.is_te_gemm for e in self._traced.rows.equations())

    @functools.cached_property
    def gpu_mesh(self) -> MeshSpec | None:
        """The mesh a GPU step is laid on: the audit's (`mesh`), else the one the model made over
        the machine's devices (None: one GPU)."""
        return step_mesh(self._traced, None if self.mesh is None else spec_of(self.mesh))

    def target_info(self, request: GpuRequest | TpuRequest) -> dict[str, GpuInfo | TpuInfo]:
        """A record's field naming what `request` compiled for: {"gpu": ...} or {"tpu": ...}."""
        if isinstance(request, TpuRequest):
            return {"tpu": tpu_info(request, self.gpu_mesh)}
        return {"gpu": self.gpu_info(request)}

    def gpu_info(self, request: GpuRequest) -> GpuInfo:
        """`request`'s GPU and environment, for the mesh this trace's step is laid on."""
        return gpu_info(request, self.gpu_mesh, from_model=self.mesh is None)

    @property
    def devices(self) -> int:
        """The devices the inputs are placed on (1 off a mesh)."""
        return 1 if self.mesh is None else spec_of(self.mesh).devices

    def resolved_scope(self, spec: PolicySpec) -> Scope:
        return resolve_scope(self._traced, spec, self.scope)
