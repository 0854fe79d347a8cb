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
import re
from pathlib import Path

from ._textfile import read_text
from .errors import UsageError

GIB = 2**30
DEFAULT_MEM_FRACTION = 0.75  # JAX preallocates this much of a GPU (XLA_PYTHON_CLIENT_MEM_FRACTION)
DEFAULT_GPUS_PER_HOST = 8


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
            return re.sub(r"(device_memory_size\s*:\s*)\d+", rf"\g<1>{memory_bytes}", self.config)
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


CATALOG: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("h100-sxm", "NVIDIA H100 80GB HBM3", (9, 0), 132, 84942979072, 52428800, 1.98, 3352320000000, HOPPER),
        GpuModel("h100-pcie", "NVIDIA H100 PCIe", (9, 0), 114, 84942979072, 52428800, 1.755, 2039040000000, HOPPER),
        GpuModel("h200", "NVIDIA H200", (9, 0), 132, 151397597184, 52428800, 1.98, 4800000000000, HOPPER),
        GpuModel("a100-40gb", "NVIDIA A100-SXM4-40GB", (8, 0), 108, 42331013120, 41943040, 1.41, 1555200000000, AMPERE),
        GpuModel("a100-80gb", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 85100068864, 41943040, 1.41, 2039040000000, AMPERE),
        # NVIDIA's L40S datasheet: 48 GB GDDR6 with ECC (46068 MiB as the driver reports it), 864 GB/s,
        # 2.52 GHz boost; AD102's 96 MB L2
        GpuModel("l40s", "NVIDIA L40S", (8, 9), 142, 46068 * 2**20, 100663296, 2.52, 864000000000, ADA),
        GpuModel("b200", "NVIDIA B200", (10, 0), 148, 191514411008, 132644864, 1.965, 7672320000000, HOPPER),
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
        f"one of {', '.join(CATALOG)} (`te-ckpt-audit gpus` lists them), or --gpu-config FILE",
    )


# Fields whose absence kills XLA's compiler (a division by zero) or that decide what it plans:
# a config file must give each of them a positive value.
_REQUIRED = (
    "threads_per_warp", "block_dim_limit_x", "shared_memory_per_block_optin", "shared_memory_per_block",
    "core_count", "fpus_per_core", "clock_rate_ghz", "device_memory_size", "l2_cache_size", "memory_bandwidth",
)


def model_of_config(path: str | Path) -> GpuModel:
    """A GPU described by a GpuTargetConfigProto text file (XLA's own spec files are such), as a
    model whose `config_text` is that file's figures. Fields XLA cannot do without are checked
    here: without them its compiler fails, or ends the process."""
    shown = str(path)
    text = read_text(path, "GPU config", "give a GpuTargetConfigProto text file, as XLA's specs are")

    def number(field: str) -> float:
        found = re.findall(rf"^\s*{field}\s*:\s*([0-9.eE+]+)\s*$", text, re.MULTILINE)
        if not found:
            raise UsageError(f"GPU config {shown} has no {field}", "copy the field from one of XLA's GPU specs")
        try:
            value = float(found[0])
        except ValueError:
            raise UsageError(f"GPU config {shown}: {field} is not a number", "") from None
        if value <= 0:
            raise UsageError(f"GPU config {shown}: {field} must be positive", "")
        return value

    for field in _REQUIRED:
        number(field)
    cc = re.search(r"cuda_compute_capability\s*\{\s*major\s*:\s*(\d+)(?:\s*minor\s*:\s*(\d+))?", text)
    if cc is None:
        raise UsageError(f"GPU config {shown} has no cuda_compute_capability", "give major and minor")
    described = re.search(r'device_description_str\s*:\s*"([^"\n]*)"', text)
    return GpuModel(
        name=Path(shown).stem,
        description=described.group(1) if described else Path(shown).stem,
        compute_capability=(int(cc.group(1)), int(cc.group(2) or 0)),
        sms=int(number("core_count")),
        memory_bytes=int(number("device_memory_size")),
        l2_bytes=int(number("l2_cache_size")),
        clock_ghz=number("clock_rate_ghz"),
        bandwidth=int(number("memory_bandwidth")),
        arch=Arch(
            int(number("fpus_per_core")),
            int(number("shared_memory_per_core")) if "shared_memory_per_core" in text else 0,
            int(number("shared_memory_per_block_optin")),
            int(number("threads_per_core_limit")) if "threads_per_core_limit" in text else 2048,
            accelerated="ACCELERATED_FEATURES" in text,
        ),
        config=text,
    )


class Optimizer(enum.StrEnum):
    """The optax update a compiled step adds (`--optimizer`), its state donated in and out."""

    SGD = "sgd"
    ADAM = "adam"
    ADAMW = "adamw"
    ADAFACTOR = "adafactor"


@dataclasses.dataclass(frozen=True, slots=True)
class GpuRequest:
    """What `--gpu` asks: the step compiled for `model`, `gpus_per_host` of them per host, and
    how much of each a process may use (`mem_fraction`, JAX's preallocation)."""

    model: GpuModel
    optimizer: Optimizer | None = None
    gpus_per_host: int = DEFAULT_GPUS_PER_HOST
    mem_fraction: float = DEFAULT_MEM_FRACTION
    cache: Path | None = None  # where compiled results are kept (the command line's cache folder)
    step: bool = False  # the target already is a training step: compiled as it is (as-is only)
    donate: tuple[int, ...] = ()  # with `step`: the positional arguments it donates
    jobs: int = dataclasses.field(default=1, compare=False)  # policies compiled at once, in worker processes

    def __post_init__(self) -> None:
        if not 0 < self.mem_fraction <= 1:
            raise UsageError(f"--mem-fraction {self.mem_fraction} is not in (0, 1]", "JAX's default is 0.75")
        if self.donate and not self.step:
            raise UsageError("--donate names the arguments a training step donates", "add --step")
        if self.step and self.optimizer is not None:
            raise UsageError("--optimizer adds an update to the step te-ckpt-audit builds; --step brings its own",
                             "drop one of them")
        if self.jobs < 1:
            raise UsageError(f"--jobs {self.jobs} must be at least 1", "e.g. --jobs 4")
        if self.gpus_per_host < 1:
            raise UsageError(f"--gpus-per-host {self.gpus_per_host} must be at least 1", "8 on an HGX host")

    @property
    def usable_bytes(self) -> int:
        return int(self.model.memory_bytes * self.mem_fraction)

    def topology(self, devices: int) -> str:
        """The topology string of `devices` GPUs, `gpus_per_host` to a host."""
        per_host = min(devices, self.gpus_per_host)
        if devices % per_host:
            raise UsageError(
                f"{devices} GPUs do not fill hosts of {per_host}",
                f"a mesh of a multiple of {per_host} devices, or --gpus-per-host {devices}",
            )
        return f"1x{devices // per_host}x{per_host}"
