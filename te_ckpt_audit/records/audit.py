"""The audit's records: what one target's trace holds and what each policy keeps, recomputes and
offloads; `AuditReport.to_dict()` is the versioned JSON document (schema ``te-ckpt-audit/10``)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Any

from ._display import Shown
from .findings import WARNINGS, AuditWarning, warning_document
from .schemas import AUDIT

SCHEMA = AUDIT  # the audit's JSON schema id


class Outcome(enum.StrEnum):
    """What the backward pass gets from a forward equation under a policy."""

    SAVED = "saved"  # its output is kept in device memory
    OFFLOADED = "offloaded"  # its output is kept in host memory
    RECOMPUTED = "recomputed"  # it runs again in the backward pass
    NOT_NEEDED = "not_needed"  # the backward pass needs neither its output nor a rerun


class Verdict(enum.StrEnum):
    """What the policy answered for the equation (`NONE`: no checkpoint region covers it)."""

    SAVE = "save"
    RECOMPUTE = "recompute"
    OFFLOAD = "offload"
    NONE = "none"


class ResidualKind(enum.StrEnum):
    ACTIVATION = "activation"  # computed in the forward pass, kept on the device
    ARGUMENT = "argument"  # an input of the function, kept alive (live anyway)
    HOST = "host"  # offloaded to host memory
    CONSTANT = "constant"  # a closed-over constant
    LITERAL = "literal"  # a compile-time literal JAX lists "from a literal": no memory, 0 bytes


class TeKind(enum.StrEnum):
    """Which Transformer Engine GEMMs the traced function holds."""

    REAL = "real"  # Transformer Engine's own primitives (TE imported)
    STANDIN = "stand-in"  # the labelled CPU stand-in of the sample models
    NONE = "none"  # no TE GEMMs

    @classmethod
    def of(cls, equations: Iterable[Equation]) -> TeKind:
        gemms = [e for e in equations if e.is_te_gemm]
        if not gemms:
            return cls.NONE
        return cls.STANDIN if any(e.standin for e in gemms) else cls.REAL


class Category(enum.StrEnum):
    """Producer split of activation bytes; the first that applies wins, in this order."""

    TE_GEMM = "te_gemm"
    DOT = "dot"
    QUANTIZED = "quantized"  # TE's quantized data (FP8, MXFP8, NVFP4) and its scales
    NAMED = "named"
    OTHER = "other"


class Scope(enum.StrEnum):
    AUTO = "auto"
    OUTER = "outer"  # wrap the whole function in one jax.checkpoint
    INNER = "inner"  # replace the policy of every checkpoint the function already has


@dataclasses.dataclass(frozen=True, slots=True)
class SourceLocation:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclasses.dataclass(frozen=True, slots=True)
class Equation:
    """One forward equation of the traced function (a row of the per-equation table).

    `id` is its path in the traced jaxpr ("4.1.2": equation 2 of the body of equation 1 of the
    body of equation 4); `multiplicity` is how often it runs (the product of enclosing scan lengths).
    """

    id: str
    primitive: str
    shape: tuple[int, ...]
    dtype: str
    name: str | None
    source: SourceLocation | None  # innermost frame of the user's own code
    frame: SourceLocation | None  # innermost frame overall: a library's line, for library models
    module: str | None  # module path from JAX's name stack ("Transformer/Dense_0"), if any
    is_te_gemm: bool
    standin: bool
    flops: int
    multiplicity: int
    is_te_quantize: bool = False  # TE's quantize, or its fused norm/activation kernels when they quantize


@dataclasses.dataclass(frozen=True, slots=True)
class Residual:
    """One value JAX keeps from the forward pass for the backward pass."""

    shape: tuple[int, ...]
    dtype: str
    bytes: int
    kind: ResidualKind
    category: Category
    primitive: str | None  # the producer, looked through names, scans, jit and offload copies
    name: str | None  # checkpoint_name, if the value carries one
    equation: str | None  # id of the producing Equation
    source: SourceLocation | None  # innermost frame of the user's own code
    frame: SourceLocation | None  # innermost frame overall
    module: str | None  # module path from JAX's name stack, if any
    multiplicity: int  # layers stacked by enclosing scans (1 if not stacked)
    argument: str | None  # the argument's path, for kind == ARGUMENT
    standin: bool  # produced by the labelled CPU stand-in of a TE GEMM
    # On a mesh (`--mesh`): the PartitionSpec XLA's partitioner gives it ("P('data', None, 'model')"),
    # and its bytes on one device. None without a mesh.
    sharding: str | None = None
    bytes_per_device: int | None = None
    quantized: bool = False  # quantized data (float8, float4): what a TE quantize made, or a copy of it
    scale_of: str | None = None  # a scale (or amax) of the data the quantize equation of this id made


@dataclasses.dataclass(frozen=True, slots=True)
class EquationMark:
    equation: str
    verdict: Verdict
    outcome: Outcome


@dataclasses.dataclass(frozen=True, slots=True)
class Totals:
    activation_bytes: int
    argument_bytes: int
    host_bytes: int
    constant_bytes: int
    te_gemm_bytes: int  # the split of activation_bytes by Category
    dot_bytes: int
    named_bytes: int
    other_bytes: int
    activation_bytes_per_device: int | None = None  # on a mesh: the activation bytes on one device
    quantized_bytes: int = 0  # the Category.QUANTIZED share: quantized data and its scales

    @property
    def total_bytes(self) -> int:
        """Every residual JAX keeps, of every kind: what `saved_residuals` adds up to."""
        return self.activation_bytes + self.argument_bytes + self.host_bytes + self.constant_bytes

    @property
    def gated_bytes(self) -> int:
        """The activation bytes budgets and baselines hold: per device on a mesh, else global."""
        return self.activation_bytes if self.activation_bytes_per_device is None else self.activation_bytes_per_device


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledMemory:
    """XLA's `memory_analysis()` of the compiled training step under a policy (`--compile`)."""

    backend: str
    temp_bytes: int | None
    argument_bytes: int | None
    output_bytes: int | None
    host_bytes: int | None  # host temp + argument + output
    error: str | None  # why it could not be compiled, if so


@dataclasses.dataclass(frozen=True, slots=True)
class PeakMemory:
    """XLA:GPU's memory plan for one device of one training step under a policy (compiled for a
    GPU model without one): no autotuning, so the peak is a range over both GEMM backends
    (Triton's fusions, cuBLAS), and gates use its top. XLA plans against the memory the run's
    fraction gives it, as on a real GPU."""

    bytes_per_device: int | None  # the larger peak of the compiles
    bytes_per_device_min: int | None  # the smaller one
    argument_bytes: int | None  # of the compile with the larger peak
    output_bytes: int | None
    alias_bytes: int | None  # outputs written into donated arguments
    temp_bytes: int | None
    fits: bool | None  # the larger peak within the usable memory at the run's fraction
    xla_rematerialized: bool  # XLA recomputed values on its own to fit the device
    # What the step needs: the peak XLA plans with its own rematerialization off and unbounded
    # memory; computed where the step does not fit or XLA rematerialized, else None.
    needed_bytes: int | None
    compile_seconds: float  # every compile, as they ran (kept with a cached result)
    error: str | None = None  # why it could not be compiled, if so
    # The least memory fraction (to 0.01) whose usable memory holds the step's plan; None where no
    # fraction the run can set does (or the allocator takes no fraction).
    least_fraction: float | None = None
    backends: tuple[str, ...] = ()  # the GEMM backends compiled: triton, cublas (or the run's own)

    @classmethod
    def not_compiled(cls, why: str, compile_seconds: float = 0.0) -> PeakMemory:
        """A step that could not be compiled, and why."""
        return cls(bytes_per_device=None, bytes_per_device_min=None, argument_bytes=None, output_bytes=None,
                   alias_bytes=None, temp_bytes=None, fits=None, xla_rematerialized=False, needed_bytes=None,
                   compile_seconds=compile_seconds, error=why)


@dataclasses.dataclass(frozen=True, slots=True)
class TpuPlan:
    """libtpu's own compile of one training step for a TPU chip it does not need (`--tpu`): its
    memory plan per chip and its verdict. The verdict is libtpu's HBM check, the one the chip
    itself applies (on a real v5e: the same verdict and the same "required" bytes on 30 of 30
    steps, docs/guide/tpu.md); no sum of the plan's fields draws that line."""

    fits: bool | None  # libtpu took the step (None: it could not be compiled for another reason: error)
    required_bytes: int | None  # where refused: the HBM libtpu found the step requires
    argument_bytes: int | None  # where it fits: memory_analysis() of the compile
    output_bytes: int | None
    alias_bytes: int | None  # outputs written into donated arguments
    temp_bytes: int | None
    compile_seconds: float
    error: str | None = None

    @property
    def plan_bytes(self) -> int | None:
        """Arguments, outputs not aliased to them, and temporaries: the plan per chip."""
        a, o, al, t = self.argument_bytes, self.output_bytes, self.alias_bytes, self.temp_bytes
        if a is None or o is None or al is None or t is None:
            return None
        return a + o - al + t

    def peak(self) -> PeakMemory:
        """The plan as the searches compare steps (`--maximize throughput`, `recommend`): the plan
        per chip where it fits, the bytes libtpu found required where refused; `fits` its verdict."""
        if self.fits is None:
            return PeakMemory.not_compiled(self.error or "libtpu could not compile the step", self.compile_seconds)
        shown = self.plan_bytes if self.fits else self.required_bytes
        return PeakMemory(shown, shown, self.argument_bytes, self.output_bytes, self.alias_bytes, self.temp_bytes,
                          self.fits, False, self.required_bytes, self.compile_seconds)


@dataclasses.dataclass(frozen=True, slots=True)
class Remat3Row:
    """One policy under both of JAX's remat implementations (`--remat3 both`): what each saves."""

    policy: str
    remat_bytes: int  # activation bytes saved under the current remat (the report's results)
    remat3_bytes: int  # under jax_remat3
    remat_te_gemm_bytes: int
    remat3_te_gemm_bytes: int
    remat_recompute_flops: int
    remat3_recompute_flops: int
    error: str | None = None  # why JAX could not differentiate under remat3
    # the two keep other values (the remat3-changes-policy finding fires), equal byte totals or not
    changed: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class TpuInfo:
    """The TPU a report's steps were compiled for, and the libtpu that planned them."""

    name: str
    topology: str  # libtpu's name of the slice: v5e:2x4
    chips: int
    hbm_bytes: int
    usable_bytes: int  # the HBM the chip's check compares with (v5e: 15.75 GiB, measured)
    libtpu: str | None  # the plan belongs to a libtpu version
    mesh: str | None = None


class KernelKind(enum.StrEnum):
    """What a kernel of the compiled step does, as the step-time estimate costs it."""

    GEMM = "gemm"  # a matrix multiply (cuBLAS, a Triton GEMM fusion, TE's)
    ATTENTION = "attention"  # fused attention (cuDNN's, TE's)
    MEMORY = "memory"  # any other fusion or op: bound by what it reads and writes
    COLLECTIVE = "collective"  # all-reduce, all-gather, reduce-scatter, all-to-all, permute
    HOST = "host"  # a copy between host and device memory


# a KernelTime's basis where libtpu gave a reduce-window no estimate and its window taps timed it, at
# the rate a v5e ran such windows (each output reads its whole window: n^2 work where that is a row)
WINDOW_TAPS = "window taps"


@dataclasses.dataclass(frozen=True, slots=True)
class KernelTime:
    """One kernel of the compiled step, as the estimate timed it: per device, per run."""

    name: str  # the HLO instruction
    kind: KernelKind
    seconds: float  # one run
    runs: int  # times one step runs it (the trip counts of the loops around it)
    flops: int  # one run's
    bytes: int  # what one run reads and writes (a collective: what it moves)
    basis: str  # what set its time: an XLA cost model's name ("sol"), or "roofline" (its floor)
    source: str  # what it computes: the op_name of its HLO metadata and source line ("" unnamed)

    @property
    def total_seconds(self) -> float:
        return self.seconds * self.runs


@dataclasses.dataclass(frozen=True, slots=True)
class Calibration:
    """What a profile measured on real GPUs (`--calibrate`) did to a step-time estimate: kernels it
    names take their measured time; the others are scaled by the measured-to-estimated ratio of
    their kind's kernels it names (unscaled where it names none of their kind)."""

    profile: str  # the file
    instructions: int  # costs in the profile
    measured: int  # kernels of the step the profile names
    missing: int  # kernels of the step it does not name
    ratios: tuple[tuple[KernelKind, float], ...]  # per kind: measured over estimated, where it names some
    estimated_seconds: float  # the step's estimate without the profile


@dataclasses.dataclass(frozen=True, slots=True)
class StepTime:
    """An estimate of one training step's time on the target GPUs, from the compiled program:
    each kernel timed by XLA's own cost models (corrected where they are known wrong) and never
    below its roofline floor, loops times their trip counts; what `model` names. Per device."""

    seconds: float | None  # the estimate; None: the estimate compile failed (error)
    seconds_low: float | None  # the range: where XLA's models disagree (GPU); the chip ran steps so estimated (TPU)
    seconds_high: float | None
    compute_seconds: float  # every kernel but collectives
    communication_seconds: float  # every collective, as if none overlapped
    exposed_communication_seconds: float  # what the schedule leaves unhidden
    kernels: int  # kernel runs per step
    hlo_flops: int  # the compiled kernels' FLOPs per device per step (recompute and XLA's own included)
    model_flops: int  # the model's FLOPs per device per step: 3 x forward, recompute left out
    recompute_flops: int  # what the policy recomputes, per device per step
    peak_flops: float  # one GPU's dense BF16 tensor-core FLOP/s, the utilisations' denominator
    tokens: int | None  # tokens per step, all GPUs (None: not known for this target)
    devices: int
    costliest: tuple[KernelTime, ...]  # the ten costliest kernels, by time per step
    model: str  # the estimate's method, named
    compile_seconds: float
    error: str | None = None
    gemm_seconds: float = 0.0  # of compute_seconds: GEMMs'
    attention_seconds: float = 0.0  # fused attention's (the rest: memory-bound kernels and host copies)
    calibration: Calibration | None = None  # --calibrate: what the measured profile did
    examples: int | None = None  # examples per step, all GPUs, where tokens are not known (the inputs' batch)
    device: str = "GPU"  # what one device of the target is called: "GPU", "chip" (a TPU's)
    hardware: str = ""  # the catalog's name of that device: h100-sxm, v5e
    estimator: str = "XLA's cost models"  # what timed the kernels, in a few words (`model` says it in full)
    # of compute_seconds: kernels no cost model timed, taken at their roofline floor, which no real
    # kernel reaches (custom calls XLA does not cost: TE's GEMMs, cuDNN's attention; every kernel on
    # a GPU missing from XLA's tables): where the estimate can only be fast
    floor_seconds: float = 0.0
    floor_kernels: int = 0  # their runs per step
    # the kernels the compiler gave no estimate at all (libtpu's INT64_MAX cycles), by HLO name: among
    # the floor's, and where the chip may run far slower than the estimate says
    unestimated: tuple[str, ...] = ()
    # of seconds: what a step pays beyond its kernels' work (a TPU's: its cost per step, measured on
    # the chip, or up to the host's launch where that binds); 0 where the estimate has none
    overhead_seconds: float = 0.0
    # copies of offloaded residuals to host memory and back, over the host link (a GPU's PCIe), as if
    # none overlapped; and of it, what XLA's schedule leaves unhidden beside the kernels (in `seconds`)
    host_seconds: float = 0.0
    exposed_host_seconds: float = 0.0
    # bytes per second each direction those copies were timed at (the GPU's PCIe, a v5e's link as
    # measured on the chip); 0: at the compiler's own estimate (a TPU whose link was not measured)
    host_link: float = 0.0
    # a TPU's: what the host takes to launch one step (a cost per step and per array passed, measured
    # on a v5e); a step whose device time is less runs at this pace (`seconds` is at least it)
    dispatch_seconds: float = 0.0

    @property
    def host_bound(self) -> bool:
        """Whether the step runs at the host's pace: its launch takes longer than its device time."""
        return bool(self.dispatch_seconds) and self.seconds is not None and self.seconds <= self.dispatch_seconds

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: the model's FLOPs (recompute left out) over the GPUs' peak."""
        return _ratio(self.model_flops, self.seconds, self.peak_flops)

    @property
    def hfu(self) -> float | None:
        """Hardware FLOPs utilisation: recompute included."""
        return _ratio(self.model_flops + self.recompute_flops, self.seconds, self.peak_flops)

    @property
    def tokens_per_second_per_gpu(self) -> float | None:
        if self.tokens is None or not self.seconds:
            return None
        return self.tokens / self.seconds / self.devices

    @property
    def examples_per_second_per_gpu(self) -> float | None:
        """Where no tokens are known: the batch's examples per second per GPU."""
        if self.examples is None or not self.seconds:
            return None
        return self.examples / self.seconds / self.devices

    @property
    def tflops_per_gpu(self) -> float | None:
        """The model's TFLOP/s per GPU (recompute left out), as training recipes publish it."""
        return None if not self.seconds else self.model_flops / self.seconds / 1e12


def _ratio(flops: int, seconds: float | None, peak: float) -> float | None:
    return None if not seconds or not peak else flops / seconds / peak


@dataclasses.dataclass(frozen=True, slots=True)
class GpuInfo:
    """The GPU a report's peaks were compiled for, and the run's environment."""

    name: str
    memory_bytes: int
    usable_bytes: int  # at the run's fraction (memory less the reserve where no fraction applies)
    gpus_per_host: int
    mem_fraction: float = 0.75
    fraction_source: str = "default"  # default, environment (fraction_variable), given
    fraction_variable: str | None = None
    max_fraction: float = 0.98  # the most a run can set, leaving `reserved_bytes` outside JAX's pool
    reserved_bytes: int = 0  # CUDA context, NCCL: what the process needs outside JAX's allocator
    allocator: str = "default"  # XLA_PYTHON_CLIENT_ALLOCATOR
    preallocate: bool = True  # XLA_PYTHON_CLIENT_PREALLOCATE
    xla_flags: str = ""  # XLA_FLAGS the compiles ran with
    mesh: str | None = None  # the mesh the step was laid on ("data=8,model=1"); None: one GPU
    mesh_source: str | None = None  # "given" (--mesh) or "model" (the one it made over the machine's devices)


@dataclasses.dataclass(frozen=True, slots=True)
class StepInfo:
    """What was compiled for the GPU or TPU: `value_and_grad` over the trained inputs (`donated`), with
    an optax update when `optimizer` is set; or (`own`) the target's own step, as it is."""

    optimizer: str | None
    donated: tuple[str, ...]  # the donated inputs' paths (the trained ones, for te-ckpt-audit's step)
    own: bool = False
    state_bytes: int | None = None  # the optimizer state's bytes, all devices together (None: no update)


@dataclasses.dataclass(frozen=True, slots=True)
class CompileProgress:
    """A compile starting (`seconds` None) or done, as progress callbacks are told."""

    policy: str
    backend: str  # triton, cublas, needed (rematerialization off, unbounded memory), or the run's
    gpu: str
    seconds: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class Trained:
    """The inputs the audit differentiates and a GPU step trains."""

    arguments: tuple[int, ...] | None  # positional arguments; None: every float input
    inputs: tuple[str, ...]  # the differentiated inputs' paths
    convention: bool  # the default (jax.grad's argnums=0), not the caller's choice


class ShardingSource(enum.StrEnum):
    """Where a mesh audit's residual shardings come from."""

    COMPILED = "compiled"  # XLA's SPMD partitioner, compiling for virtual CPU devices
    ABSTRACT = "abstract"  # the avals' own shardings, traced on an abstract mesh (explicit axes)


@dataclasses.dataclass(frozen=True, slots=True)
class MeshAxis:
    name: str
    size: int


@dataclasses.dataclass(frozen=True, slots=True)
class MeshSpec:
    """A device mesh by axis names and sizes, as `--mesh data=8,model=4` gives it.

    >>> str(MeshSpec((MeshAxis("data", 8), MeshAxis("model", 4)))), MeshSpec((MeshAxis("data", 8),)).devices
    ('data=8,model=4', 8)
    """

    axes: tuple[MeshAxis, ...]

    @property
    def devices(self) -> int:
        n = 1
        for a in self.axes:
            n *= a.size
        return n

    def __str__(self) -> str:
        return ",".join(f"{a.name}={a.size}" for a in self.axes)


class HotspotKey(enum.StrEnum):
    """What hotspots group residuals by (`--by`)."""

    MODULE = "module"  # the module path from JAX's name stack (the layer), else the source line
    LINE = "line"  # the innermost source line of the user's own code


@dataclasses.dataclass(frozen=True, slots=True)
class Hotspot:
    """Activation and host bytes made at one module path or source line, per policy (in the
    report's order)."""

    where: str  # a module path, "file:line", or "(no module)" / "(no source)"
    producers: tuple[str, ...]  # checkpoint names, else primitives, of the residuals made there
    bytes_by_policy: tuple[int, ...]

    @property
    def most(self) -> int:
        return max(self.bytes_by_policy)

    @property
    def kept_by(self) -> tuple[int, ...]:
        """1-based numbers of the policies that keep anything made here."""
        return tuple(i + 1 for i, b in enumerate(self.bytes_by_policy) if b)


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: str  # the spec, as given
    scope: Scope  # OUTER or INNER, after resolving AUTO; INNER for as-is
    residuals: tuple[Residual, ...]
    totals: Totals
    marks: tuple[EquationMark, ...]
    recompute_flops: int
    forward_flops: int
    warnings: tuple[AuditWarning, ...]
    compiled: CompiledMemory | None = None  # only with --compile
    peak: PeakMemory | None = None  # only with --gpu
    requantized: int = 0  # TE quantizations that run again in the backward pass (every layer counted)
    requantize_flops: int = 0  # their recompute FLOPs
    # Their equations: recomputed, whether or not a quantized output is also saved (under delayed
    # scaling the quantize also makes the new amax history, which the backward pass makes again)
    requantized_equations: tuple[str, ...] = ()
    # Why JAX could not differentiate the function under this policy; the row is then empty.
    error: str | None = None
    audited: bool = True  # False for a training step of the target's own: its residuals are inside it
    time: StepTime | None = None  # only with --gpu --time
    tpu_plan: TpuPlan | None = None  # only with --tpu

    @property
    def recompute_percent(self) -> float:
        return 100.0 * self.recompute_flops / self.forward_flops if self.forward_flops else 0.0

    def mark(self, equation_id: str) -> EquationMark:
        for m in self.marks:
            if m.equation == equation_id:
                return m
        raise KeyError(equation_id)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class AuditReport(Shown):
    """The audit: every policy's residuals, recompute and warnings. `print(report)` shows the
    comparison table; a notebook shows the HTML report's table."""

    target: str
    arguments: tuple[str, ...]  # "path: dtype[shape]" of each traced input
    jax_version: str
    te: TeKind
    equations: tuple[Equation, ...]
    results: tuple[PolicyResult, ...]
    # The emulated GPU TE traced against (te_ckpt_audit.emulation), or None. What TE selects by
    # compute capability and its workspace sizes depend on it; residual bytes only through those.
    emulated_device: str | None = None
    # `--mesh`: bytes per device, totals, budgets and baselines are then per device.
    mesh: MeshSpec | None = None
    sharding_source: ShardingSource | None = None
    gpu: GpuInfo | None = None  # --gpu: the peaks' GPU and the step compiled
    step: StepInfo | None = None
    trained: Trained | None = None  # the inputs differentiated (None: not recorded)
    findings: tuple[AuditWarning, ...] = ()  # the audit's own, not one policy's (inputs-replicated)
    tpu: TpuInfo | None = None  # --tpu: the chip and slice the steps were compiled for
    # JAX's remat implementation the results are: "remat" (the current jax.checkpoint) or "remat3"
    # (jax_remat3); `--remat3 both`: each policy under remat3 too, beside the results
    remat: str = "remat"
    remat3: tuple[Remat3Row, ...] = ()

    @property
    def forward_flops(self) -> int:
        return sum(e.flops * e.multiplicity for e in self.equations)

    def result(self, policy: str) -> PolicyResult:
        for r in self.results:
            if r.policy == policy:
                return r
        raise KeyError(policy)

    @property
    def warnings(self) -> tuple[AuditWarning, ...]:
        return self.findings + tuple(w for r in self.results for w in r.warnings)

    def _summary(self) -> str:
        policies = ", ".join(r.policy for r in self.results)
        return f"of {self.target!r}: {len(self.results)} policies ({policies}), {len(self.equations)} equations"

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (schema ``te-ckpt-audit/10``): plain, ordered, deterministic."""
        return {"schema": SCHEMA, **_plain(self)}


def to_plain(value: Any) -> Any:
    """A record as the JSON documents hold it: plain values, enums as their codes."""
    return _plain(value)


def _plain(value: Any) -> Any:
    if isinstance(value, WARNINGS):
        return warning_document(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Totals):
            out["total_bytes"] = value.total_bytes
        if isinstance(value, PolicyResult):
            out["recompute_percent"] = round(value.recompute_percent, 4)
        if isinstance(value, AuditReport):
            out["forward_flops"] = value.forward_flops
        if isinstance(value, MeshSpec):
            out["devices"] = value.devices
        if isinstance(value, StepTime):
            out.update(mfu=value.mfu, hfu=value.hfu, tokens_per_second_per_gpu=value.tokens_per_second_per_gpu,
                       tflops_per_gpu=value.tflops_per_gpu,
                       examples_per_second_per_gpu=value.examples_per_second_per_gpu)
        if isinstance(value, TpuPlan):
            out["plan_bytes"] = value.plan_bytes
        if isinstance(value, KernelTime):
            out["total_seconds"] = value.total_seconds
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value
