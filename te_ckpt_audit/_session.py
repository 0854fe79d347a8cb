"""The session: one target's trace, its scope and its placement, and every policy's analysis made
once and kept. `audit`, `recommend`, `check` and the pytest helper are thin clients of it.

    load (target, inputs) -> trace -> Session
        Session.analysis(spec)   apply the policy, one JAX linearization      (_apply, _analysis)
        Session.result(spec)     + bytes per device on the mesh, if placed    (_mesh)
        Session.report(specs)    + warnings, + compiled step if asked         (_warnings, _compile)
                                 + the step's peak on a GPU model, if asked   (_gpu)
                                 -> AuditReport (records), which renderers draw

Each step reuses the one analysis of its policy: a policy is linearized once per session, whether
it is audited, placed on a mesh, warned about or searched over by `recommend`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from . import _jax_compat as jc
from ._analysis import Analysis, analyse_policy, failed
from ._apply import resolve_scope
from ._compile import compiled_memory
from ._emulated import emulated_device
from ._gpu import Compiler, Recipe, gpu_info, peaks_in_workers, step_info
from ._heap import without_gc
from ._loading import anchored, load_inputs, load_target, user_code
from ._mesh import build_abstract_mesh, build_mesh, mesh_context, per_device, place_args, source_of, spec_of
from ._trace import Traced, trace
from ._warnings import NOTHING_SAVEABLE, warnings_for
from .config import Defines
from .errors import TargetError
from .gpus import GpuRequest
from .records import AuditReport, MeshSpec, PolicyResult, Scope, ShardingSource, TeKind
from .specs import Custom, PolicyLike, PolicySpec, Preset, policy_specs

Progress = Callable[[str], None]
Placement = jax.sharding.Mesh | jax.sharding.AbstractMesh | None


def quiet(_: str) -> None:
    """A progress callback that says nothing."""


def _jax_is_jax(target: str) -> None:
    """The model's checkpoints are JAX's own: code that replaced JAX's checkpointing functions
    would make the figures of another program than the one the user runs."""
    replaced = jc.replaced_jax_functions()
    if replaced:
        raise TargetError(
            f"{target}: the model's code replaced {', '.join(replaced)}; its checkpoints are not JAX's",
            "audit the model with JAX's own functions (remove the replacement)",
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Outcome:
    """A policy's analysis, or why JAX could not differentiate under it."""

    analysis: Analysis | None
    placed: PolicyResult | None  # the result with per-device bytes (the result itself off a mesh)
    error: TargetError | None


class Session:
    """One target: its trace, the scope policies apply at, the mesh its inputs are placed on (or
    none), and the cache of each policy's analysis.

    >>> import jax, jax.numpy as jnp
    >>> s = Session.of_function(lambda x: jnp.sum(jnp.sin(jnp.sin(x))), jax.ShapeDtypeStruct((8,), jnp.float32))
    >>> s.result(Preset("nothing_saveable")).totals.activation_bytes
    0
    """

    def __init__(self, traced: Traced, scope: Scope = Scope.AUTO, mesh: Placement = None) -> None:
        self.traced = traced
        self.scope = Scope(scope)
        self.mesh = mesh
        self.emulated_device = emulated_device()
        self._outcomes: dict[tuple[str, int], _Outcome] = {}
        self._compilers: dict[GpuRequest, Compiler] = {}
        self.keywords: Mapping[str, object] = {}  # what the inputs callable was called with (of_target)
        self.recipe: Recipe | None = None  # how of_target built it: a worker process builds it again

    # --- building one ---------------------------------------------------------------------------

    @classmethod
    def of_function(cls, fn: Callable[..., Any], *args: Any, scope: Scope = Scope.AUTO, mesh: Placement = None
                    ) -> Session:
        """Trace `fn(*args)`; with `mesh`, its inputs placed on it (their NamedShardings, or
        replicated)."""
        name = getattr(fn, "__name__", "fn")
        with user_code(name), mesh_context(mesh):
            traced = trace(fn, args if mesh is None else place_args(args, mesh), name)
        _jax_is_jax(name)
        return cls(traced, scope, mesh)

    @classmethod
    def of_target(
        cls,
        target: str,
        *,
        inputs: str | None = None,
        defines: Defines | None = None,
        scope: Scope = Scope.AUTO,
        mesh: MeshSpec | None = None,
        shardings: ShardingSource = ShardingSource.COMPILED,
        progress: Progress = quiet,
    ) -> Session:
        """Load `file.py:fn` (or `package.module:fn`), call its inputs callable (given the mesh as
        keyword `mesh` when it declares one) and trace it, as the user's code: `sys.exit` there is
        the target's failure. With `mesh`, the inputs are placed on virtual CPU devices (compiled
        shardings) or on an abstract mesh of explicit axes."""
        folder = os.getcwd()
        build = build_mesh if ShardingSource(shardings) is ShardingSource.COMPILED else build_abstract_mesh
        placement = None if mesh is None else build(mesh)
        with user_code(target):
            inputs = anchored(inputs)
            progress(f"loading {target}")
            loaded = load_target(target)
            with mesh_context(placement):
                made = load_inputs(loaded, inputs, defines or {}, mesh=placement)
                progress(f"tracing {target}")
                args = made.args
                traced = trace(loaded.fn, args if placement is None else place_args(args, placement), target)
        _jax_is_jax(target)
        session = cls(traced, scope, placement)
        session.keywords = made.keywords
        given = tuple(sorted((defines or {}).items()))
        session.recipe = Recipe(target, inputs, given, Scope(scope), mesh, ShardingSource(shardings), folder)
        return session

    # --- the steps --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """The user's code runs under JAX while a policy is analysed (policies, differentiation
        rules), with the mesh as JAX's context mesh."""
        with user_code(self.traced.target or "the function"), mesh_context(self.mesh):
            yield

    def _outcome(self, spec: PolicySpec, progress: Progress = quiet) -> _Outcome:
        key = (spec.text, id(spec.policy) if isinstance(spec, Custom) else 0)
        if key not in self._outcomes:
            progress(f"analysing {spec.text}")
            try:
                with self._running():
                    analysis = analyse_policy(self.traced, spec, self.scope)
            except TargetError as exc:  # JAX cannot differentiate under this policy
                self._outcomes[key] = _Outcome(None, None, exc)
                return self._outcomes[key]
            placed = analysis.result
            if self.mesh is not None:
                progress(f"partitioning {spec.text} on the mesh")
                with self._running():
                    placed = per_device(self.traced, analysis, self.mesh)
            self._outcomes[key] = _Outcome(analysis, placed, None)
        return self._outcomes[key]

    def analysis(self, spec: PolicySpec) -> Analysis:
        """The policy's one linearization and what was read from it; a TargetError when JAX cannot
        differentiate the function under it."""
        outcome = self._outcome(spec)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.analysis is not None
        return outcome.analysis

    def result(self, spec: PolicySpec, progress: Progress = quiet) -> PolicyResult:
        """The policy's residuals, marks and recompute cost, per device on the mesh; a TargetError
        when JAX cannot differentiate the function under it."""
        outcome = self._outcome(spec, progress)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.placed is not None
        return outcome.placed

    def row(self, spec: PolicySpec, progress: Progress = quiet) -> PolicyResult:
        """The policy's row in a report: its result, or an empty row saying why there is none."""
        outcome = self._outcome(spec, progress)
        if outcome.error is not None:
            return failed(self.traced, spec, self.scope, outcome.error)
        assert outcome.placed is not None
        return outcome.placed

    def _nothing_saveable(self) -> PolicyResult | None:
        outcome = self._outcome(Preset(NOTHING_SAVEABLE))
        return outcome.placed

    def warned(self, spec: PolicySpec, result: PolicyResult, audited_nothing: bool = False) -> PolicyResult:
        """`result` with its warnings (`_warnings`)."""
        if result.error is not None:  # an empty row: nothing to compare or warn about
            return result
        with self._running():
            warnings = warnings_for(self.traced, spec, result, self._nothing_saveable, audited_nothing)
        return dataclasses.replace(result, warnings=warnings)

    def compiled(self, spec: PolicySpec, result: PolicyResult) -> PolicyResult:
        """`result` with XLA's memory analysis of the compiled training step under the policy."""
        if result.error is not None:
            return result
        with self._running():
            return dataclasses.replace(result, compiled=compiled_memory(self.traced, spec, result.scope))

    def compiler(self, request: GpuRequest) -> Compiler:
        """The compiler of this trace's training step for `request`'s GPU (one per request)."""
        if request not in self._compilers:
            mesh = None if self.mesh is None else spec_of(self.mesh)
            self._compilers[request] = Compiler(self.traced, request, mesh, request.cache)
        return self._compilers[request]

    def peaked(self, spec: PolicySpec, result: PolicyResult, request: GpuRequest, progress: Progress = quiet
               ) -> PolicyResult:
        """`result` with XLA:GPU's peak per device of the training step under the policy."""
        if result.error is not None:
            return result
        compiler = self.compiler(request)
        with user_code(self.traced.target or "the function"):
            return dataclasses.replace(result, peak=compiler.peak(spec, result.scope, progress))

    @without_gc
    def report(
        self,
        policies: Sequence[PolicyLike],
        *,
        warnings: bool = True,
        compile: bool = False,
        gpu: GpuRequest | None = None,
        progress: Progress = quiet,
    ) -> AuditReport:
        """Every policy's row, with warnings, (with `compile`) the compiled step and (with `gpu`)
        its peak on that GPU, as one report. Under no policy at all is the function's own failure:
        its error is raised."""
        specs = policy_specs(policies)
        rows = [self.row(spec, progress) for spec in specs]
        errors = [r for r in rows if r.error is not None]
        if errors and len(errors) == len(rows):
            failure = self._outcome(specs[0]).error
            assert failure is not None
            raise failure
        if warnings:
            audited = any(s.text == NOTHING_SAVEABLE for s in specs)
            rows = [self.warned(s, r, audited) for s, r in zip(specs, rows, strict=True)]
        if compile:
            compiled = []
            for spec, row in zip(specs, rows, strict=True):
                if row.error is None:
                    progress(f"compiling {spec.text}")
                compiled.append(self.compiled(spec, row))
            rows = compiled
        if gpu is not None:
            self.compiler(gpu)  # what the machine lacks, or a target with no loss: said before any compile
            wanted = [s for s, r in zip(specs, rows, strict=True) if r.error is None]
            if gpu.jobs > 1 and self.recipe is not None and len(wanted) > 1:
                found = peaks_in_workers(self.recipe, wanted, gpu, progress)
                rows = [r if r.error is not None else dataclasses.replace(r, peak=found[s.text])
                        for s, r in zip(specs, rows, strict=True)]
            else:
                rows = [self.peaked(spec, row, gpu, progress) for spec, row in zip(specs, rows, strict=True)]
        return self.report_of(rows, gpu)

    def report_of(self, results: Sequence[PolicyResult], gpu: GpuRequest | None = None) -> AuditReport:
        """The report of this trace holding `results` (their peaks compiled for `gpu`)."""
        equations = self.traced.rows.equations()
        return AuditReport(
            target=self.traced.target,
            arguments=self.traced.arguments,
            jax_version=jax.__version__,
            te=TeKind.of(equations),
            equations=equations,
            results=tuple(results),
            emulated_device=self.emulated_device,
            mesh=None if self.mesh is None else spec_of(self.mesh),
            sharding_source=None if self.mesh is None else source_of(self.mesh),
            gpu=None if gpu is None else gpu_info(gpu),
            step=None if gpu is None else step_info(self.traced, gpu),
        )

    def resolved_scope(self, spec: PolicySpec) -> Scope:
        return resolve_scope(self.traced, spec, self.scope)
