"""GPU models a training step can be compiled for (`--gpu`), and what that compile is asked.

Each model's figures are its public specifications as XLA's own GPU target configs give them
(openxla/xla, `xla/backends/gpu/target_config/specs/*.txtpb`; the L40S from NVIDIA's datasheet
and its Ada sm_89 limits, as XLA has no spec for it). XLA:GPU's compiler reads all of them: its
fusion and scheduling decisions, so the memory it plans, depend on the SM count, caches, clock
and bandwidth, not only on the memory size. The same catalog drives `--emulate-gpu` (compute
capability and SM count) for tracing real Transformer Engine.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from . import _textproto as textproto
from ._profile import Profile
from ._profile import read_profile as read_profile  # the command line reads --calibrate with it
from ._textfile import read_text
from .errors import UsageError, shown
from .optimizers import Optimizer as Optimizer  # public here since 0.1 (te_ckpt_audit.optimizers is its home)
from .optimizers import parse_optimizer

GIB = 2**30
DEFAULT_MEM_FRACTION = 0.75  # JAX preallocates this much of a GPU (XLA_PYTHON_CLIENT_MEM_FRACTION)
DEFAULT_GPUS_PER_HOST = 8
MIN_COMPUTE_CAPABILITY = (7, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Arch:
    """What one GPU architecture's SMs hold (the same on every model of it)."""

    fpus_per_sm: int
    shared_memory_per_sm: int
    shared_memory_optin: int  # per block, opted in
    threads_per_sm: int
    accelerated: bool = False  # sm_90a / sm_100a features (wgmma, ...), as XLA's specs have them


HOPPER = Arch(128, 233472, 232448, 2048, accelerated=True)  # and Blackwell's B200, as XLA's specs give it
AMPERE = Arch(64, 167936, 166912, 2048)
ADA = Arch(128, 102400, 101376, 1536)


# XLA's element types (xla_data.proto's PrimitiveType numbers), as its unit descriptions key them
S8, S32, U8, U32, F16, F32, F64, BF16, FP4 = 2, 4, 6, 8, 10, 11, 12, 16, 32
FP8 = (19, 20, 23, 24, 25, 28, 29, 33, 35, 36)  # its 8-bit float kinds (e4m3, e5m2 and the rest)
_KIND_NAMES = {S8: "int8", F16: "fp16", F32: "tf32", F64: "fp64", BF16: "bf16", FP4: "fp4", FP8[0]: "fp8"}


@dataclasses.dataclass(frozen=True, slots=True)
class Rates:
    """What a GPU computes and moves per second: its arithmetic units as XLA describes them
    (`matrix_unit_description`, `scalar_unit_description`: per element type the units per SM and
    the multiply-adds each does per clock, at the tensor or the SM clock) and its links. The step
    time estimate compiles with these (XLA's own performance models read them) and floors each
    kernel at the peaks they give."""

    tensor_clock_ghz: float
    matrix: tuple[tuple[int, int], ...]  # (element type, multiply-adds per clock per tensor core); 4 per SM
    scalar: tuple[tuple[int, int, int], ...]  # (element type, units per SM, ops per clock)
    nvlink_bytes: float  # NVLink bytes per second per GPU and direction (0: none)
    network_bytes: float  # bytes per second per GPU and direction across hosts
    nvlink_links: int = 0  # NVLink links per GPU (XLA's device_interconnect_info.active_links; not handed to it)
    fp64_at_sm_clock: bool = True  # XLA's descriptions run FP64 tensor math at the SM clock

    def dense_flops(self, kind: int, sms: int, sm_clock_ghz: float) -> float:
        """Dense tensor-core FLOP/s (2 per multiply-add) for element type `kind`; 0 where it has none."""
        ops = dict(self.matrix).get(kind, 0)
        clock = sm_clock_ghz if kind == F64 and self.fp64_at_sm_clock else self.tensor_clock_ghz
        return 2.0 * sms * 4 * ops * clock * 1e9

    def description(self, sm_clock_ghz: float) -> str:
        """The unit and interconnect fields of a gpu_device_info, in XLA's text format."""
        def rates(name: str, rows: list[tuple[int, float, int, int]]) -> str:
            body = "".join(f"    rate_infos {{ key: {k} value {{ clock_rate_ghz: {c} units_per_core: {u} "
                           f"ops_per_clock: {o} }} }}\n" for k, c, u, o in rows)
            return f"  {name} {{\n{body}  }}\n"

        tensor = [(k, sm_clock_ghz if k == F64 and self.fp64_at_sm_clock else self.tensor_clock_ghz, 4, o)
                  for k, o in self.matrix]
        text = rates("scalar_unit_description", [(k, sm_clock_ghz, u, o) for k, u, o in self.scalar])
        # no device_interconnect_info: with it, XLA 0.12 emits Triton kernels for small all-reduces on
        # many hosts and aborts compiling one (LLVM "size mismatch when packing elements", MaxText's
        # Llama-2 7B on 8 A3 VMs); the estimate times collectives over the links itself
        return text + rates("matrix_unit_description", tensor)


def _fp8(ops: int) -> tuple[tuple[int, int], ...]:
    return tuple((k, ops) for k in FP8)


GB = 1e9
# Hopper and Blackwell: XLA's own descriptions (openxla/xla xla/backends/gpu/target_config/specs/
# h100_sxm.txtpb, h100_pcie.txtpb, b200.txtpb: 4 tensor cores per SM; their clocks and rates).
# Ampere, which XLA describes without units: NVIDIA's A100 datasheet (dense BF16 312, TF32 156, FP64
# 19.5, INT8 624 TFLOP/s at 1.41 GHz over 108 SMs). Links: NVLink per GPU and direction, half the
# datasheets' bidirectional figures (H100/H200 SXM 900 GB/s, H100 PCIe's bridge 600, A100 SXM 600,
# B200 1.8 TB/s); across hosts one 400 Gb/s ConnectX-7 per GPU as in DGX H100/H200/B200 (50 GB/s),
# one 200 Gb/s ConnectX-6 as in DGX A100 (25 GB/s).
_HOPPER_MATRIX = ((S8, 1024), (U8, 1024), (F16, 512), (F32, 256), (F64, 32), (BF16, 512), *_fp8(1024))
_HOPPER_SCALAR = ((S32, 64, 1), (U32, 64, 1), (F16, 128, 2), (F32, 128, 1), (F64, 64, 1), (BF16, 128, 2))
_BLACKWELL_MATRIX = ((S8, 2048), (U8, 2048), (F16, 1024), (F32, 512), (F64, 16), (BF16, 1024), *_fp8(2048),
                     (FP4, 4096))
_BLACKWELL_SCALAR = ((S32, 64, 1), (U32, 64, 1), (F16, 128, 1), (F32, 128, 1), (F64, 64, 1), (BF16, 128, 1))
_AMPERE_MATRIX = ((S8, 512), (U8, 512), (F16, 256), (F32, 128), (F64, 16), (BF16, 256))
_AMPERE_SCALAR = ((S32, 64, 1), (U32, 64, 1), (F16, 64, 4), (F32, 64, 1), (F64, 32, 1), (BF16, 64, 2))
H100_SXM_RATES = Rates(1.8295201, _HOPPER_MATRIX, _HOPPER_SCALAR, 450 * GB, 50 * GB, 18)
H100_PCIE_RATES = Rates(1.62162, _HOPPER_MATRIX, _HOPPER_SCALAR, 300 * GB, 50 * GB)
B200_RATES = Rates(1.8353101, _BLACKWELL_MATRIX, _BLACKWELL_SCALAR, 900 * GB, 50 * GB, 18)
A100_RATES = Rates(1.41, _AMPERE_MATRIX, _AMPERE_SCALAR, 300 * GB, 25 * GB, 12, fp64_at_sm_clock=False)


@dataclasses.dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU model: what XLA:GPU's compiler needs to know of it."""

    name: str  # the catalog's name: h100-sxm
    description: str  # the device's own name: NVIDIA H100 80GB HBM3
    compute_capability: tuple[int, int]
    sms: int
    memory_bytes: int  # as the driver reports it
    l2_bytes: int
    clock_ghz: float
    bandwidth: int  # memory bandwidth, bytes per second
    arch: Arch
    config: str | None = dataclasses.field(default=None, repr=False)  # a config file's own text (--gpu-config)
    path: Path | None = dataclasses.field(default=None, repr=False, compare=False)  # that file, absolute
    rates: Rates | None = dataclasses.field(default=None, repr=False)  # what the step-time estimate needs
    host_link: float = 0.0  # bytes per second to and from host memory, each direction (HOST_LINKS); 0: unknown

    def dense_flops(self, kind: int = BF16) -> float:
        """Dense tensor-core FLOP/s of one GPU for element type `kind` (BF16 by default); 0 unknown.

        >>> round(gpu_model("h100").dense_flops() / 1e12, 1)
        989.2
        """
        return 0.0 if self.rates is None else self.rates.dense_flops(kind, self.sms, self.clock_ghz)

    def estimate_config_text(self, memory_bytes: int | None = None) -> str:
        """The GpuTargetConfigProto the step-time compile uses: the memory compile's, with the
        arithmetic units and links XLA's performance models read (a config file's own, as given)."""
        text = self.config_text(memory_bytes)
        if self.config is not None or self.rates is None:
            return text
        head = "gpu_device_info {\n"
        return text.replace(head, head + self.rates.description(self.clock_ghz), 1)

    @property
    def emulated(self) -> str:
        """This GPU as `--emulate-gpu` takes it: CC:SMS:GiB."""
        major, minor = self.compute_capability
        return f"{major}.{minor}:{self.sms}:{self.memory_bytes / GIB:.4g}"

    def config_text(self, memory_bytes: int | None = None) -> str:
        """The GpuTargetConfigProto XLA compiles for (text format); `memory_bytes` replaces the
        device's memory (what a step would need without XLA's own rematerialization)."""
        if self.config is not None:
            if memory_bytes is None:
                return self.config
            doc = textproto.parse(self.config, GPU_TARGET_CONFIG, self.name)
            doc["gpu_device_info"]["device_memory_size"] = memory_bytes
            return textproto.write(doc, GPU_TARGET_CONFIG)
        major, minor = self.compute_capability
        feature = "\n    feature_extension: ACCELERATED_FEATURES" if self.arch.accelerated else ""
        return f"""gpu_device_info {{
  cuda_compute_capability {{
    major: {major}
    minor: {minor}{feature}
  }}
  core_count: {self.sms}
  device_memory_size: {memory_bytes if memory_bytes is not None else self.memory_bytes}
  threads_per_block_limit: 1024
  threads_per_warp: 32
  threads_per_core_limit: {self.arch.threads_per_sm}
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: {self.arch.shared_memory_optin}
  shared_memory_per_core: {self.arch.shared_memory_per_sm}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  thread_dim_limit_x: 1024
  thread_dim_limit_y: 1024
  thread_dim_limit_z: 64
  fpus_per_core: {self.arch.fpus_per_sm}
  l2_cache_size: {self.l2_bytes}
  clock_rate_ghz: {self.clock_ghz}
  memory_bandwidth: {self.bandwidth}
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 8
}}
device_description_str: "{self.description}"
"""


# The host link, each direction: PCIe's x16 rates (PCI-SIG: 16 GT/s a lane for 4.0, 32 GT/s for 5.0,
# 128b/130b encoding), 31.5 and 63 GB/s; Hopper and Blackwell GPUs (HGX H100/H200/B200, the H100 PCIe
# card) attach by PCIe 5.0, A100 and L40S by 4.0. Offloaded residuals cross it (`--time`).
PCIE4_X16, PCIE5_X16 = 31.5 * GB, 63.0 * GB
HOST_LINKS = {"h100-sxm": PCIE5_X16, "h100-pcie": PCIE5_X16, "h200": PCIE5_X16, "b200": PCIE5_X16,
              "a100-40gb": PCIE4_X16, "a100-80gb": PCIE4_X16, "l40s": PCIE4_X16}
CATALOG: dict[str, GpuModel] = {
    m.name: dataclasses.replace(m, host_link=HOST_LINKS.get(m.name, 0.0))
    for m in (
        GpuModel("h100-sxm", "NVIDIA H100 80GB HBM3", (9, 0), 132, 84942979072, 52428800, 1.98, 3352320000000, HOPPER,
                 rates=H100_SXM_RATES),
        GpuModel("h100-pcie", "NVIDIA H100 PCIe", (9, 0), 114, 84942979072, 52428800, 1.755, 2039040000000, HOPPER,
                 rates=H100_PCIE_RATES),
        GpuModel("h200", "NVIDIA H200", (9, 0), 132, 151397597184, 52428800, 1.98, 4800000000000, HOPPER,
                 rates=H100_SXM_RATES),
        GpuModel("a100-40gb", "NVIDIA A100-SXM4-40GB", (8, 0), 108, 42331013120, 41943040, 1.41, 1555200000000, AMPERE,
                 rates=A100_RATES),
        GpuModel("a100-80gb", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 85100068864, 41943040, 1.41, 2039040000000, AMPERE,
                 rates=A100_RATES),
        # NVIDIA's L40S datasheet: 48 GB GDDR6 with ECC (46068 MiB as the driver reports it), 864 GB/s,
        # 2.52 GHz boost; AD102's 96 MB L2
        GpuModel("l40s", "NVIDIA L40S", (8, 9), 142, 46068 * 2**20, 100663296, 2.52, 864000000000, ADA),
        GpuModel("b200", "NVIDIA B200", (10, 0), 148, 191514411008, 132644864, 1.965, 7672320000000, HOPPER,
                 rates=B200_RATES),
    )
}
ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "a100-40": "a100-40gb", "a100-80": "a100-80gb"}


def gpu_model(name: str) -> GpuModel:
    """The catalog's GPU named `name` (case and `_`/`-` do not matter; `h100` is the SXM)."""
    key = name.strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key in CATALOG:
        return CATALOG[key]
    raise UsageError(
        f"no GPU named {name!r} in the catalog",
        f"one of {', '.join(CATALOG)} (`te-ckpt-audit gpus` lists them), or $gpu_config$ FILE",
    )


# GpuTargetConfigProto, as XLA defines it (xla/stream_executor/device_description.proto).
_VERSION = {"major": "int32", "minor": "int32", "patch": "int32"}
_RATE = {"key": "int32", "value": {"clock_rate_ghz": "float", "units_per_core": "int32", "ops_per_clock": "int32"}}
_FEATURES = ("UNSPECIFIED", "NONE", "ACCELERATED_FEATURES", "FAMILY_COMPATIBLE_FEATURES", "FORWARD_COMPATIBLE_FEATURES")
_DEVICE_INFO = {
    **{f: "int32" for f in ("threads_per_block_limit", "threads_per_warp", "shared_memory_per_block",
                            "shared_memory_per_core", "threads_per_core_limit", "core_count",
                            "shared_memory_per_block_optin", "numa_node")},
    **{f: "int64" for f in ("fpus_per_core", "block_dim_limit_x", "block_dim_limit_y", "block_dim_limit_z",
                            "memory_bandwidth", "l2_cache_size", "device_memory_size", "registers_per_core_limit",
                            "registers_per_block_limit", "thread_dim_limit_x", "thread_dim_limit_y",
                            "thread_dim_limit_z", "device_address_bits", "pcie_bandwidth",
                            "collective_memory_granularity")},
    "clock_rate_ghz": "float",
    "ecc_enabled": "bool",
    **{f: "string" for f in ("driver_version", "kernel_mode_driver_version", "runtime_version",
                             "compile_time_toolkit_version", "dnn_version", "cub_version", "device_vendor",
                             "platform_version", "pci_bus_id", "name", "model_str")},
    "cuda_compute_capability": {"major": "int32", "minor": "int32", "feature_extension": _FEATURES},
    "rocm_compute_capability": {"gcn_arch_name": "string"},
    "oneapi_compute_capability": textproto.OPAQUE,
    "scalar_unit_description": {"rate_infos*": _RATE},
    "matrix_unit_description": {"rate_infos*": _RATE},
    "device_interconnect_info": {"active_links": "int32", "cluster_uuid": "string", "clique_id": "string"},
}
GPU_TARGET_CONFIG = {
    "gpu_device_info": _DEVICE_INFO,
    "platform_name": "string",
    "dnn_version_info": _VERSION,
    "autotune_results": textproto.OPAQUE,
    "device_description_str": "string",
    "runtime_version": _VERSION,
}
# Fields whose absence kills XLA's compiler (a division by zero) or that decide what it plans:
# a config must give each of them a positive value.
_REQUIRED = (
    "threads_per_warp", "block_dim_limit_x", "shared_memory_per_block_optin", "shared_memory_per_block",
    "core_count", "fpus_per_core", "clock_rate_ghz", "device_memory_size", "l2_cache_size", "memory_bandwidth",
)
_MAY_BE_NEGATIVE = {"numa_node"}  # -1: unknown


def _config(text: str, shown: str) -> textproto.Message:
    """A GpuTargetConfigProto's text, parsed and checked: what XLA needs is there and positive,
    no count is negative, the compute capability is one XLA:GPU compiles for."""
    doc = textproto.parse(text, GPU_TARGET_CONFIG, f"GPU config {shown}")
    info = doc.get("gpu_device_info")
    if info is None:
        raise UsageError(f"GPU config {shown} has no gpu_device_info", "copy one of XLA's GPU specs")
    for field in _REQUIRED:
        if field not in info:
            raise UsageError(f"GPU config {shown} has no {field}", "copy the field from one of XLA's GPU specs")
        if info[field] <= 0:
            raise UsageError(f"GPU config {shown}: {field} must be positive (it is {info[field]})", "")
    for field, value in info.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and value < 0 and field not in _MAY_BE_NEGATIVE:
            raise UsageError(f"GPU config {shown}: {field} is {value}: a count is never negative", "")
    cc = info.get("cuda_compute_capability")
    if cc is None:
        raise UsageError(f"GPU config {shown} has no cuda_compute_capability", "give major and minor")
    if cc.get("major", 0) < MIN_COMPUTE_CAPABILITY[0] or cc.get("minor", 0) < 0:
        raise UsageError(f"GPU config {shown}: compute capability {cc.get('major', 0)}.{cc.get('minor', 0)} is "
                         "older than XLA:GPU compiles for", "7.0 or later (Volta)")
    return doc


def model_of_config(path: str | Path) -> GpuModel:
    """A GPU described by a GpuTargetConfigProto text file (XLA's own spec files are such), in
    any layout the text format allows, checked field by field."""
    shown = str(path)
    try:
        text = read_text(path, "GPU config", "give a GpuTargetConfigProto text file, as XLA's specs are")
    except FileNotFoundError:
        raise UsageError(f"no GPU config file {shown}", "check the path") from None
    doc = _config(text, shown)
    info = doc["gpu_device_info"]
    cc = info["cuda_compute_capability"]
    return GpuModel(
        name=Path(shown).stem,
        description=doc.get("device_description_str") or Path(shown).stem,
        compute_capability=(cc.get("major", 0), cc.get("minor", 0)),
        sms=info["core_count"],
        memory_bytes=info["device_memory_size"],
        l2_bytes=info["l2_cache_size"],
        clock_ghz=info["clock_rate_ghz"],
        bandwidth=info["memory_bandwidth"],
        arch=Arch(
            info["fpus_per_core"],
            info.get("shared_memory_per_core", 0),
            info["shared_memory_per_block_optin"],
            info.get("threads_per_core_limit", 2048),
            accelerated=cc.get("feature_extension") == "ACCELERATED_FEATURES",
        ),
        config=textproto.write(doc, GPU_TARGET_CONFIG),
        path=Path(os.path.realpath(path)),
    )


# --- the run's environment: how much of the GPU a process may use ---------------------------------

# What a process needs outside JAX's allocator: the CUDA context (with CUDA's lazy loading, the
# default since 12.2), cuBLAS/cuDNN handles, and NCCL's communicators (NCCL_BUFFSIZE, 4 MiB per
# channel and peer, ~9 MiB with its LL and LL128 buffers, over up to 32 channels and 7 peers of an
# NVLink host). NVIDIA publishes no single figure; XLA leaves 20% free for these allocations when
# it knows no limit (gpu_hlo_schedule.cc), and MaxText's H100 recipes run at 0.85-0.90 of 80 GB.
# The figures below bound the fraction from above; they never make a compiled peak fit.
RESERVED_ONE_GPU = 1 * GIB
RESERVED_SEVERAL_GPUS = 2 * GIB
XLA_FALLBACK_PERCENT = 80  # XLA plans against 80% of the device without an allocator limit
FRACTION_VARIABLES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")  # jax's new, old spelling


class Allocator(enum.StrEnum):
    """JAX's GPU allocator (XLA_PYTHON_CLIENT_ALLOCATOR)."""

    DEFAULT = "default"  # the BFC allocator over a pool of `fraction` of the memory
    BFC = "bfc"
    CUDA_ASYNC = "cuda_async"
    VMM = "vmm"
    ADDRESS = "address"
    PLATFORM = "platform"  # cudaMalloc on demand: no pool, no fraction

    @property
    def pooled(self) -> bool:
        """Whether the fraction caps what the process allocates (and XLA plans against it)."""
        return self is not Allocator.PLATFORM


class FractionSource(enum.StrEnum):
    DEFAULT = "default"  # JAX's 0.75
    ENVIRONMENT = "environment"  # XLA_CLIENT_MEM_FRACTION / XLA_PYTHON_CLIENT_MEM_FRACTION
    GIVEN = "given"  # the caller's mem_fraction (the command line's --mem-fraction, pyproject's key)


@dataclasses.dataclass(frozen=True, slots=True)
class GpuEnvironment:
    """What the run's environment says of GPU memory and XLA: the fraction of the memory JAX may
    use and where it came from, preallocation, the allocator, and XLA_FLAGS as the run sets them."""

    mem_fraction: float = DEFAULT_MEM_FRACTION
    fraction_source: FractionSource = FractionSource.DEFAULT
    fraction_variable: str | None = None  # the variable it was read from
    preallocate: bool = True
    allocator: Allocator = Allocator.DEFAULT
    xla_flags: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.mem_fraction, bool) or not isinstance(self.mem_fraction, int | float):
            raise UsageError(f"$mem_fraction$ takes a number in (0, 1], not {type(self.mem_fraction).__name__} "
                             f"{self.mem_fraction!r}"[:120], "e.g. $mem_fraction$=0.9")
        if not 0 < self.mem_fraction <= 1:
            raise UsageError(f"$mem_fraction$ {self.mem_fraction} is not in (0, 1]", "JAX's default is 0.75")


def _fraction(text: str, variable: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{variable}={text[:40]!r} is not a number", f"e.g. {variable}=.85") from None
    if not 0 < value <= 1:
        raise UsageError(f"{variable}={text[:40]} is not in (0, 1]", f"e.g. {variable}=.85")
    return value


def gpu_environment(env: Mapping[str, str], mem_fraction: float | None = None) -> GpuEnvironment:
    """The GPU environment `env` describes (the run's `os.environ`), read as JAX reads it;
    `mem_fraction`, when given, overrides the variables.

    >>> gpu_environment({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".85"}).mem_fraction
    0.85
    """
    given = [v for v in FRACTION_VARIABLES if env.get(v)]
    if len(given) > 1:
        raise UsageError(f"both {FRACTION_VARIABLES[0]} and {FRACTION_VARIABLES[1]} are set",
                         f"JAX refuses both; remove {FRACTION_VARIABLES[1]}, it is deprecated")
    if mem_fraction is not None:
        fraction, source, variable = float(mem_fraction), FractionSource.GIVEN, None
    elif given:
        fraction, source, variable = _fraction(env[given[0]], given[0]), FractionSource.ENVIRONMENT, given[0]
    else:
        fraction, source, variable = DEFAULT_MEM_FRACTION, FractionSource.DEFAULT, None
    preallocate = env.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true") not in ("false", "False", "0")
    name = env.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower()
    try:
        allocator = Allocator(name)
    except ValueError:
        allowed = ", ".join(a.value for a in Allocator)
        raise UsageError(f"XLA_PYTHON_CLIENT_ALLOCATOR={name[:40]!r} is not an allocator JAX knows",
                         f"one of {allowed}") from None
    flags = env.get("XLA_FLAGS", "").strip()
    xla_flags(flags)  # flags XLA can split, before any work
    return GpuEnvironment(fraction, source, variable, preallocate, allocator, flags)


def xla_flags(text: str) -> tuple[tuple[str, str], ...]:
    """XLA_FLAGS as (name, value) pairs, in order, as XLA splits them (a bare flag is true).

    >>> xla_flags("--xla_gpu_enable_triton_gemm=false --xla_dump_hlo_as_text")
    (('xla_gpu_enable_triton_gemm', 'false'), ('xla_dump_hlo_as_text', 'true'))
    """
    out = []
    try:
        words = shlex.split(text)
    except ValueError as exc:  # an unbalanced quote
        raise UsageError(f"XLA_FLAGS cannot be split into flags: {exc}", "balance its quotes") from None
    for word in words:
        if not word.startswith("--"):
            raise UsageError(f"XLA_FLAGS holds {word[:60]!r}, which is not a --flag", "e.g. XLA_FLAGS=--xla_foo=true")
        name, eq, value = word[2:].partition("=")
        out.append((name, value if eq else "true"))
    return tuple(out)


MIN_NETWORK_GBPS, MAX_NETWORK_GBPS = 0.1, 1e5  # Gb/s per GPU: below a tenth no network trains; 100 Tb/s none has


@dataclasses.dataclass(frozen=True, slots=True)
class GpuRequest:
    """What compiling for a GPU asks: the step compiled for `model`, `gpus_per_host` of them per
    host, in the run's `environment` (its memory fraction, allocator and XLA_FLAGS)."""

    model: GpuModel
    optimizer: Optimizer | None = None
    gpus_per_host: int = DEFAULT_GPUS_PER_HOST
    environment: GpuEnvironment = GpuEnvironment()
    cache: Path | None = None  # where compiled results are kept (the command line's cache folder)
    step: bool = False  # the target already is a training step: compiled as it is (as-is only)
    donate: tuple[int, ...] = ()  # with `step`: the positional arguments it donates
    time: bool = False  # also estimate each step's time on the GPUs (a compile of its own)
    network_gbps: float | None = None  # with `time`: network bandwidth per GPU across hosts, Gb/s (the catalog's)
    profile: Profile | None = None  # with `time`: the step measured on real GPUs (--calibrate), `_profile`

    def __post_init__(self) -> None:
        if self.optimizer is not None:  # a name is parsed or refused, never taken for another update
            object.__setattr__(self, "optimizer", parse_optimizer(self.optimizer))
        self._check_types()
        if self.donate and not self.step:
            raise UsageError("$donate$ names the arguments a training step of the target's own donates",
                             "add $step$")
        if self.step and self.optimizer is not None:
            raise UsageError("$optimizer$ adds an update to the step te-ckpt-audit builds; $step$ brings its own",
                             "drop one of them")
        if self.gpus_per_host < 1:
            raise UsageError(f"$gpus_per_host$ {self.gpus_per_host} must be at least 1", "8 on an HGX host")
        if self.network_gbps is not None and not MIN_NETWORK_GBPS <= self.network_gbps <= MAX_NETWORK_GBPS:
            raise UsageError(f"$network_gbps$ {shown(self.network_gbps)} must be from {MIN_NETWORK_GBPS:g} to "
                             f"{MAX_NETWORK_GBPS:g} Gb/s per GPU",
                             "e.g. 400 (one 400 Gb/s NIC per GPU, as in a DGX H100)")
        if self.network_gbps is not None and not self.time:
            raise UsageError("$network_gbps$ is about the step time estimate", "add $time$")
        if self.profile is not None and not self.time:
            raise UsageError("$calibrate$ calibrates the step time estimate", "add $time$")

    def _check_types(self) -> None:
        """Each field of the type it is read as (the Python API takes them as given): a wrong one is
        a UsageError naming it, never a TypeError deep in a compile, nor a value taken as true."""
        from ._profile import Profile

        def need(ok: bool, name: str, what: str, example: str) -> None:
            if not ok:
                given = getattr(self, name)
                raise UsageError(f"${name}$ takes {what}, not {type(given).__name__} {shown(given)}",
                                 f"e.g. ${name}$={example}")

        need(isinstance(self.model, GpuModel), "model", "a GpuModel", "gpu_model('h100')")
        need(self.optimizer is None or isinstance(self.optimizer, Optimizer), "optimizer", "an Optimizer",
             "Optimizer.ADAMW")
        need(type(self.gpus_per_host) is int and 1 <= self.gpus_per_host <= 1024, "gpus_per_host",
             "an int from 1 to 1024", "8")
        need(isinstance(self.environment, GpuEnvironment), "environment", "a GpuEnvironment", "GpuEnvironment()")
        need(self.cache is None or isinstance(self.cache, Path), "cache", "a folder's Path", "Path('.cache')")
        for flag in ("step", "time"):
            need(type(getattr(self, flag)) is bool, flag, "True or False", "True")
        need(isinstance(self.donate, tuple) and all(type(d) is int and d >= 0 for d in self.donate), "donate",
             "a tuple of argument positions", "(0,)")
        need(self.network_gbps is None or (isinstance(self.network_gbps, int | float)
                                           and not isinstance(self.network_gbps, bool)),
             "network_gbps", "a number of Gb/s per GPU", "400.0")  # its range: __post_init__
        need(self.profile is None or isinstance(self.profile, Profile), "profile",
             "a Profile (te_ckpt_audit.gpus.read_profile)", "read_profile('profile.pbtxt')")

    @property
    def timed_model(self) -> GpuModel:
        """The GPU the step-time estimate reads: the model, with the run's network where given. A
        GPU from a config file knows no links: `network_gbps` is then every collective's rate."""
        if self.network_gbps is None:
            return self.model
        network = self.network_gbps * 1e9 / 8
        if self.model.rates is None:  # no tensor rates either: its kernels keep XLA's models' times
            rates = Rates(self.model.clock_ghz, (), (), nvlink_bytes=0.0, network_bytes=network)
        else:
            rates = dataclasses.replace(self.model.rates, network_bytes=network)
        return dataclasses.replace(self.model, rates=rates)

    @property
    def mem_fraction(self) -> float:
        return self.environment.mem_fraction

    def reserved_bytes(self, devices: int) -> int:
        """What the process needs outside JAX's allocator (CUDA context, NCCL): see RESERVED_*; a
        twentieth of a GPU smaller than 20 GiB (a config file's small test device)."""
        reserve = RESERVED_ONE_GPU if devices == 1 else RESERVED_SEVERAL_GPUS
        return min(reserve, self.model.memory_bytes // 20)

    def usable_at(self, fraction: float, devices: int = 1) -> int:
        """What the step may use at `fraction`: the allocator's pool, else the memory less the reserve."""
        if self.environment.allocator.pooled:
            return int(self.model.memory_bytes * fraction)
        return self.model.memory_bytes - self.reserved_bytes(devices)

    @property
    def usable_bytes(self) -> int:
        return self.usable_at(self.mem_fraction)

    def max_fraction(self, devices: int = 1) -> float:
        """The largest fraction a run can set and still have room for the reserve, floored to 0.01."""
        memory = self.model.memory_bytes
        return math.floor(100 * (memory - self.reserved_bytes(devices)) / memory) / 100

    def planning_memory(self, fraction: float) -> int:
        """The device memory to describe to XLA so that it plans against `fraction` of the GPU, as
        on a real run: jaxlib hands XLA the allocator's limit, and XLA takes 80% of the device's
        memory where it has none (a compile for a topology, the platform allocator)."""
        if not self.environment.allocator.pooled:
            return self.model.memory_bytes
        return math.ceil(self.model.memory_bytes * fraction * 100 / XLA_FALLBACK_PERCENT)

    def topology(self, devices: int) -> str:
        """The topology string of `devices` GPUs, `gpus_per_host` to a host."""
        per_host = min(devices, self.gpus_per_host)
        if devices % per_host:
            raise UsageError(
                f"{devices} GPUs do not fill hosts of {per_host}",
                f"a mesh of a multiple of {per_host} devices, or $gpus_per_host$ {devices}",
            )
        return f"1x{devices // per_host}x{per_host}"


def least_fraction(peak: int, memory: int) -> float:
    """The least fraction of `memory` (to 0.01, rounded up: never below 0.01, the least JAX's
    memory fraction is set to here) that holds `peak` bytes.

    >>> least_fraction(63 * GIB, 80 * GIB), least_fraction(1, 10**18)
    (0.79, 0.01)
    """
    return max(1, math.ceil(100 * peak / memory - 1e-9)) / 100


def suggested_fraction(least: float, most: float) -> float:
    """A fraction to set for a step that needs `least`: the next 0.05 up, at most `most`."""
    return min(most, math.ceil(20 * least - 1e-9) / 20) if least <= most else least
