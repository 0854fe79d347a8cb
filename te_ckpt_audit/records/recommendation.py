"""What `recommend` found: every candidate policy it analysed, the Pareto frontier and the winner;
`Recommendation.to_dict()` is the JSON document (schema ``schemas.RECOMMEND``)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from ._display import Shown
from .audit import AuditReport, GpuInfo, MeshSpec, PeakMemory, StepTime, TpuInfo, _plain
from .findings import warning_document
from .schemas import MAXTEXT_RECOMMEND, RECOMMEND


class CandidateKind(enum.StrEnum):
    PRESET = "preset"  # a named policy
    NAMES = "names"  # save_only_these_names over a subset
    COMBINED = "combined"  # a subset and a preset: SPEC+PRESET (save_from_both_policies)
    OFFLOAD = "offload"  # save_and_offload_only_these_names


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One evaluated policy, with JAX's figures for it. `base` is the preset a name subset is
    combined with (for a preset, itself); `saved`/`offloaded` are the checkpoint names it keeps on
    device / on host."""

    policy: str  # the spec, as --policy takes it
    kind: CandidateKind
    base: str | None
    saved: tuple[str, ...]
    offloaded: tuple[str, ...]
    activation_bytes: int  # what the budget holds: bytes on one device with a mesh, else in all
    host_bytes: int
    recompute_flops: int
    forward_flops: int
    fits: bool
    error: str | None = None  # why JAX could not differentiate under it
    global_activation_bytes: int | None = None  # with a mesh: the activation bytes of whole arrays
    peak: PeakMemory | None = None  # --gpu: the compiled step's peak (only candidates compiled)
    te_policy: str | None = None  # the TE-aware policy it uses (te_ckpt_audit.policies), if any
    maxtext_policy: str | None = None  # MaxText's remat_policy value that is exactly this candidate, if any
    time: StepTime | None = None  # --gpu --time: the compiled step's estimated time (only candidates compiled)

    @property
    def recompute_percent(self) -> float:
        return 100.0 * self.recompute_flops / self.forward_flops if self.forward_flops else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "kind": self.kind.value,
            "base": self.base,
            "saved": list(self.saved),
            "offloaded": list(self.offloaded),
            "activation_bytes": self.activation_bytes,
            "host_bytes": self.host_bytes,
            "recompute_flops": self.recompute_flops,
            "forward_flops": self.forward_flops,
            "recompute_percent": round(self.recompute_percent, 4),
            "fits": self.fits,
            "error": self.error,
            "global_activation_bytes": self.global_activation_bytes,
            "peak": _plain(self.peak),
            "te_policy": self.te_policy,
            "maxtext_policy": self.maxtext_policy,
            "time": _plain(self.time),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class NameToAdd:
    """For a model without checkpoint names: a place whose activations are large, and the name a
    `checkpoint_name` there would give `recommend` to choose by (save it, recompute it, offload it)."""

    where: str  # the module path, else the source line
    line: str | None  # "file.py:LINE" of the user's code that makes it
    bytes: int  # activation bytes made there (the policy that keeps the most)
    producers: tuple[str, ...]  # the primitives that make them
    name: str  # a name to give it

    def code(self) -> str:
        """The line to add where the value is made (`x` being that value)."""
        return f'x = checkpoint_name(x, "{self.name}")'


@dataclasses.dataclass(frozen=True, slots=True)
class Trial:
    """One value of `--maximize`'s keyword, compiled under the recommended policy."""

    value: int
    peak_bytes: int | None  # None: it did not compile (its error in `error`)
    fits: bool
    error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Maximized:
    """`--maximize DEFINE`: the largest value of an inputs keyword whose step fits the GPU under the
    recommended policy (None when even the first tried does not), and every value tried."""

    define: str
    policy: str
    value: int | None
    trials: tuple[Trial, ...]
    bounded: bool = False  # the search stopped at the compile limit before it found the edge


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    """One point of `--maximize throughput`: a policy at one value of the batch keyword, its
    training step compiled for the GPU and its time estimated."""

    policy: str  # a --policy spec (MaxText: a remat_policy value)
    value: int  # the batch keyword's value
    peak_bytes: int | None  # per device; None: it did not compile (`error`)
    fits: bool
    seconds: float | None  # the step-time estimate; None: not estimated (`error`)
    throughput: float | None  # per second per GPU, in `Throughput.unit`
    error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SynthesisName:
    """A checkpoint name `--synthesize` decides on: its residual bytes per device at the start
    value (JAX's own) and the recompute FLOPs saving it takes out of the backward pass; `line`:
    where the tool gave it (`--name-lines`: the matmul line it names), None for the model's own."""

    name: str
    bytes: int
    recompute_flops: int
    line: str | None = None

    def code(self) -> str:
        """The call that gives the model this name at its line (a name of the tool's own)."""
        return f'checkpoint_name(<the matmul\'s result>, "{self.name}")'


@dataclasses.dataclass(frozen=True, slots=True)
class Proposal:
    """What the solver proposed at one batch value, with what the model predicted and what the
    target's compile said."""

    value: int
    policy: str  # a --policy spec
    predicted_extra_bytes: int  # over saving nothing, per device, by the additive model
    predicted_seconds: float  # the step, by the additive model
    fits: bool  # the target's verdict on the compiled step


@dataclasses.dataclass(frozen=True, slots=True)
class Synthesized:
    """`--synthesize`: the names decided on, each proposal the solver made, how it solves, and the
    presets compiled beside the pick (marked on the frontier)."""

    names: tuple[SynthesisName, ...]
    proposals: tuple[Proposal, ...]
    solver: str
    presets: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Throughput:
    """`--maximize throughput`: the policy and batch whose compiled step fits the GPU with the
    highest estimated throughput, and every point compiled on the way (none interpolated)."""

    keyword: str  # the batch keyword searched (`batch`, MaxText's `per_device_batch_size`)
    unit: str  # what `throughput` counts: "tokens", or the keyword's own unit
    best: Point | None  # None: no point compiled fits
    points: tuple[Point, ...]  # in the order compiled
    policies: tuple[str, ...]  # the policies searched
    max_compiles: int
    bounded: bool = False  # the compile limit stopped the search before it found every edge
    saturated: tuple[str, ...] = ()  # policies whose climb stopped short of the memory edge: 2x batch, < 2% gain
    device: str = "GPU"  # what the throughput is per: "GPU", or "chip" (a TPU's)
    estimator: str = "XLA's cost models"  # what timed the steps
    synthesis: Synthesized | None = None  # --synthesize: the policy was made from the model's names

    @property
    def frontier(self) -> tuple[Point, ...]:
        """The fitting points that no other fitting point beats on both peak and throughput, least
        peak first."""
        fitting = sorted((p for p in self.points if p.fits and p.throughput is not None and p.peak_bytes is not None),
                         key=lambda p: (p.peak_bytes, -(p.throughput or 0.0), p.policy, p.value))
        out: list[Point] = []
        for p in fitting:
            if not out or (p.throughput or 0.0) > (out[-1].throughput or 0.0):
                out.append(p)
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return {**_plain(self), "frontier": [_plain(p) for p in self.frontier]}


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class Recommendation(Shown):
    """What `recommend` found. `recommended` is None when nothing fits; `closest` is then the
    candidate with the fewest activation bytes. `frontier` is the Pareto frontier of (activation
    bytes, recompute FLOPs) over `evaluated`, fewest bytes first. `report` holds the full analysis
    of every frontier point and of the winner (for the HTML report)."""

    target: str
    budget_bytes: int
    mesh: MeshSpec | None  # the budget is per device on it
    names: tuple[str, ...]  # the checkpoint names searched over
    skipped_names: tuple[str, ...]  # names no spec can carry (see specs.spellable)
    allow_offload: bool
    max_evals: int
    recommended: Candidate | None
    closest: Candidate | None
    frontier: tuple[Candidate, ...]
    evaluated: tuple[Candidate, ...]
    report: AuditReport
    gpu: GpuInfo | None = None  # --gpu: `fits` is the compiled peak within its usable memory
    compiles: int = 0  # steps compiled for the GPU or TPU (under --maximize throughput: its points)
    maximized: Maximized | None = None
    presets: tuple[str, ...] = ()  # the named policies searched, in the order a frontier lists them
    to_name: tuple[NameToAdd, ...] = ()  # a model without checkpoint names: what to name for finer choices
    throughput: Throughput | None = None  # --maximize throughput
    tpu: TpuInfo | None = None  # --tpu: `fits` is libtpu's verdict on the slice (its plan per chip in `peak`)

    @property
    def usable_bytes(self) -> int | None:
        """The usable memory of one device compiled for (None: nothing compiled)."""
        return self.gpu.usable_bytes if self.gpu is not None else (None if self.tpu is None else self.tpu.usable_bytes)

    @property
    def device_name(self) -> str | None:
        """What the points were compiled for (a GPU's name, a TPU slice's topology), None if nothing."""
        return self.gpu.name if self.gpu is not None else (None if self.tpu is None else self.tpu.topology)

    @property
    def fits(self) -> bool:
        return self.recommended is not None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (schema ``schemas.RECOMMEND``): plain, ordered, deterministic."""
        return {
            "schema": RECOMMEND,
            "target": self.target,
            "budget_bytes": self.budget_bytes,
            "mesh": None if self.mesh is None else {a.name: a.size for a in self.mesh.axes},
            "names": list(self.names),
            "skipped_names": list(self.skipped_names),
            "allow_offload": self.allow_offload,
            "max_evals": self.max_evals,
            "evaluations": len(self.evaluated),
            "forward_flops": self.report.forward_flops,
            "fits": self.fits,
            "recommended": None if self.recommended is None else self.recommended.to_dict(),
            "closest": None if self.closest is None else self.closest.to_dict(),
            "frontier": [c.to_dict() for c in self.frontier],
            "evaluated": [c.to_dict() for c in self.evaluated],
            "gpu": _plain(self.gpu),
            "compiles": self.compiles,
            "maximized": _plain(self.maximized),
            "presets": list(self.presets),
            "to_name": [{**_plain(n), "code": n.code()} for n in self.to_name],
            "throughput": None if self.throughput is None else self.throughput.to_dict(),
            "tpu": _plain(self.tpu),
            "findings": [warning_document(w) for w in self.report.findings],  # of the trace (its inputs on the mesh)
        }


@dataclasses.dataclass(frozen=True, slots=True)
class MaxTextPoint:
    """One MaxText setting compiled: its remat_policy and per-device batch, and the step's peak."""

    remat_policy: str
    per_device_batch_size: str  # as the config takes it ("4", "0.5")
    peak: PeakMemory
    layout: tuple[str, ...] = ()  # the ici/dcn parallelism settings tried ("ici_fsdp_parallelism=4"); () the config's
    custom: tuple[str, ...] = ()  # remat_policy custom: each tensor's key set ("context=device", "mlpwo=remat")

    @property
    def fits(self) -> bool:
        return self.peak.fits is True


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class MaxTextRecommendation(Shown):
    """`maxtext --recommend`: the largest per-device batch at which one of MaxText's remat
    policies fits, with the fastest such policy in MaxText's own order; every point tried,
    compiled."""

    target: str
    chosen: MaxTextPoint | None
    tried: tuple[MaxTextPoint, ...]
    gpu: GpuInfo | None
    throughput: Throughput | None = None  # --maximize throughput: `chosen` is its fastest point that fits
    tpu: TpuInfo | None = None  # --tpu: `fits` is libtpu's verdict on the run's compile_topology slice

    @property
    def device_name(self) -> str | None:
        """What the points were compiled for (a GPU's name, a TPU slice's topology), None if nothing."""
        return self.gpu.name if self.gpu is not None else (None if self.tpu is None else self.tpu.topology)

    def config_lines(self) -> str:
        """The chosen setting as the config's YAML lines ("" when none fits)."""
        if self.chosen is None:
            return ""
        lines = [f"remat_policy: '{self.chosen.remat_policy}'",
                 f"per_device_batch_size: {self.chosen.per_device_batch_size}"]
        lines += [f"{key}: '{value}'" for key, _, value in (s.partition("=") for s in self.chosen.custom)]
        lines += [f"{key}: {value}" for key, _, value in (s.partition("=") for s in self.chosen.layout)]
        return "\n".join(lines)

    def settings(self) -> str | None:
        """The chosen setting as MaxText's command line takes it (None when none fits)."""
        if self.chosen is None:
            return None
        return " ".join(line.replace(": ", "=", 1).replace("'", "") for line in self.config_lines().splitlines())

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (schema ``te-ckpt-audit-maxtext-recommend/3``)."""
        return {"schema": MAXTEXT_RECOMMEND, **_plain(self),
                "throughput": None if self.throughput is None else self.throughput.to_dict(),
                "config_lines": self.config_lines()}
