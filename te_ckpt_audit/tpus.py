"""The TPU chips `--tpu` targets (issue 47): each figure with its source, and the rule by which a
chip takes or refuses a compiled step, established on the lent v5e (bench/tpu_truth.py, rows in
bench/data/).

    >>> tpu_model("v5e").hbm_bytes / 2**30, tpu_model("v5e").usable_bytes / 2**30
    (16.0, 15.75)
"""

from __future__ import annotations

import dataclasses
import difflib
import re

from .errors import UsageError
from .optimizers import Optimizer, parse_optimizer

GIB = 2**30
CLOUD = "Google Cloud TPU documentation, system architecture pages (cloud.google.com/tpu/docs/{})"


@dataclasses.dataclass(frozen=True, slots=True)
class TpuModel:
    """One TPU chip: what it holds and moves, per chip. `usable_bytes`: the HBM the chip's own
    compile compares a step with (its refusal names it: "exceeds available HBM (15.75G)")."""

    name: str
    description: str
    hbm_bytes: int
    usable_bytes: int
    usable_source: str  # "measured on the chip" or how it was derived
    bf16_flops: float  # peak dense FLOP/s per chip
    int8_ops: float
    hbm_bandwidth: float  # bytes/s
    ici_bandwidth: float  # bytes/s per chip, all links together
    chips_per_host: int
    dimensions: int  # of its topology: 2 (v5e, v6e: 4x4) or 3 (v4, v5p: 2x2x2)
    source: str
    clock_hz: float = 1.5e9  # the TensorCore's: libtpu's estimated cycles are its (CLOCKS says whence)
    hbm_attained: float = 0.0  # bytes/s a kernel bound by HBM reaches (V5E_HBM_ATTAINED says whence; 0: hbm_bandwidth)
    host_link: float = 0.0  # bytes/s to or from host memory, each direction, as a step's copies run (0: not known)


def _usable_like_v5e(hbm: int) -> int:
    """Where no chip of the kind was lent: its HBM less the share the v5e keeps for itself."""
    return hbm * 63 // 64  # the v5e: 15.75 of 16 GiB


CATALOG: dict[str, TpuModel] = {
    m.name: m
    for m in (
        TpuModel("v5e", "TPU v5 lite (v5e)", 16 * GIB, 15_750 * GIB // 1000, "measured on the chip (its refusal names "
                 "15.75G)", 197e12, 394e12, 819e9, 1600e9 / 8, 8, 2, CLOUD.format("v5e")),
        TpuModel("v5p", "TPU v5p", 95 * GIB, _usable_like_v5e(95 * GIB), "assumed: the v5e's share", 459e12, 918e12,
                 2765e9, 4800e9 / 8, 4, 3, CLOUD.format("v5p")),
        TpuModel("v6e", "TPU v6e (Trillium)", 32 * GIB, _usable_like_v5e(32 * GIB), "assumed: the v5e's share",
                 918e12, 1836e12, 1640e9, 3584e9 / 8, 8, 2, CLOUD.format("v6e")),
        TpuModel("v4", "TPU v4", 32 * GIB, _usable_like_v5e(32 * GIB), "assumed: the v5e's share", 275e12, 275e12,
                 1228e9, 2400e9 / 8, 4, 3, CLOUD.format("v4")),
    )
}
# The clock each chip's bf16 peak implies of its matrix units (peak / (MXUs x 128 x 128 x 2 FLOPs),
# v6e's 256 x 256): v5e 4 MXUs, v5p 2 TensorCores x 4, v6e 4 of 256 x 256; v4's 1050 MHz is its
# paper's (Jouppi et al., ISCA 2023). On the v5e, a 8192^3 bf16 GEMM's estimated cycles at this clock
# came within 4% of its measured time (bench/data/tpu-v5e-kernels.jsonl).
CLOCKS = {"v5e": 197e12 / (4 * 128 * 128 * 2), "v5p": 459e12 / (8 * 128 * 128 * 2),
          "v6e": 918e12 / (4 * 256 * 256 * 2), "v4": 1.05e9}
CATALOG = {name: dataclasses.replace(m, clock_hz=CLOCKS[name]) for name, m in CATALOG.items()}
CLOCK_SOURCE = "the bf16 peak over the matrix units' multiply-adds per cycle (v4: its paper)"
# What a kernel bound by HBM moves per second: on the v5e, x + 1 over 2^28 and 2^29 elements (the
# slope between them, so a call's fixed cost drops out) moved 648 GB/s in both float32 and bfloat16,
# 79% of the 819 GB/s published (bench/data/tpu-v5e-kernels.jsonl); the step's own memory-bound
# kernels ran at 0.96-1.1 of that (its profile). Other chips: the v5e's share of theirs.
V5E_HBM_ATTAINED = 648e9
CATALOG = {name: dataclasses.replace(m, hbm_attained=m.hbm_bandwidth * V5E_HBM_ATTAINED / CATALOG["v5e"].hbm_bandwidth)
           for name, m in CATALOG.items()}
ATTAINED_SOURCE = {n: "measured on the chip (x + 1)" if n == "v5e" else "assumed: the v5e's share" for n in CATALOG}
# The host link as an offloading step's copies cross it, each direction: on the lent v5e a jitted copy
# of 256 MiB to 1 GiB from host memory to the chip ran at 13.4-14.0 GB/s, and at 14 GB/s `--time`
# (each copy on a stream of its own, in libtpu's schedule) gives a 6-layer GPT step (batch 8) that the
# chip ran 94.7 ms slower with ffn1 offloaded (768 MiB out and back) and 233.8 ms slower with its five
# names offloaded (1.69 GiB) than with them saved within 3% of both (+2.6%, +2.3%; libtpu's own
# estimate had them 46% and 68% fast: as if offloading were free). bench/tpu_host.py, bench/data/
# tpu-v5e-host.jsonl. Other chips' links were not measured: there offload keeps libtpu's estimate,
# and the report says so.
V5E_HOST_LINK = 14e9
CATALOG = {name: dataclasses.replace(m, host_link=V5E_HOST_LINK if name == "v5e" else 0.0)
           for name, m in CATALOG.items()}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "trillium": "v6e"}


def tpu_model(name: str) -> TpuModel:
    """A catalog chip by name (`v5e`, `v6e`, ...), or a UsageError with the closest names."""
    if not isinstance(name, str):
        raise UsageError(f"$tpu$ wants a chip's name such as 'v5e', not {type(name).__name__}", "tpu_model('v5e')")
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key in CATALOG:
        return CATALOG[key]
    close = difflib.get_close_matches(key, [*CATALOG, *ALIASES], n=2)
    hint = f"did you mean {' or '.join(close)}?" if close else f"one of {', '.join(CATALOG)}"
    raise UsageError(f"$tpu$ {name[:40]!r} is not a TPU this tool knows", hint)


@dataclasses.dataclass(frozen=True, slots=True)
class TpuTarget:
    """A chip and the topology of the slice a step is compiled for: `v5e:2x4` (8 chips)."""

    model: TpuModel
    shape: tuple[int, ...]

    @property
    def chips(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def topology(self) -> str:
        """libtpu's name for it, as `get_topology_desc` takes it."""
        return f"{self.model.name}:{'x'.join(map(str, self.shape))}"


@dataclasses.dataclass(frozen=True, slots=True)
class TpuRequest:
    """What compiling for a TPU asks (`audit(..., tpu=TpuRequest(parse_tpu("v5e")))`): the slice,
    the optax update the step adds (None: the loss's gradients alone, as --gpu without
    --optimizer), and whether to estimate the step's time."""

    target: TpuTarget
    optimizer: Optimizer | None = None
    time: bool = False  # also estimate each step's time from libtpu's own per-kernel cycles (the same compile)
    step: bool = False  # the target already is a training step (MaxText's): compiled as it is (as-is only)
    donate: tuple[int, ...] = ()  # with `step`: the positional arguments it donates

    def __post_init__(self) -> None:
        if self.optimizer is not None:  # a name is parsed or refused, never taken for another update
            object.__setattr__(self, "optimizer", parse_optimizer(self.optimizer))
        if not isinstance(self.target, TpuTarget):
            raise UsageError(f"$tpu$ wants a TpuTarget (parse_tpu(\"v5e\")), not {type(self.target).__name__}",
                             'tpu=TpuRequest(parse_tpu("v5e"))')
        if type(self.time) is not bool or type(self.step) is not bool:
            raise UsageError(f"$time$ and $step$ are True or False, not {self.time!r}, {self.step!r}", "time=True")
        if not (isinstance(self.donate, tuple) and all(type(d) is int and d >= 0 for d in self.donate)):
            raise UsageError(f"$donate$ wants a tuple of argument positions, not {self.donate!r}"[:120], "donate=(0,)")
        if self.donate and not self.step:  # as on a GPU: only a step of the user's own donates what it says
            raise UsageError("$donate$ names the arguments a training step of the target's own donates",
                             "add $step$")
        if self.step and self.optimizer is not None:
            raise UsageError("$optimizer$ adds an update to the step te-ckpt-audit builds; $step$ brings its own",
                             "drop one of them")


def parse_tpu(text: str, chips: int | None = None) -> TpuTarget:
    """`v5e` (the topology derived from `chips`, the mesh's devices) or `v5e:2x4` (given: it must
    hold `chips` where both are known); a UsageError with a hint otherwise.

    >>> parse_tpu("v5e", 8).topology, parse_tpu("v5e:4x4").chips, parse_tpu("v4", 8).topology
    ('v5e:2x4', 16, 'v4:2x2x2')
    """
    if not isinstance(text, str):
        raise UsageError(f"$tpu$ wants a chip's name such as 'v5e' or 'v5e:2x4', not {type(text).__name__}",
                         'parse_tpu("v5e")')
    if chips is not None and (type(chips) is not int or chips < 1):
        raise UsageError(f"chips {chips!r} must be a count of devices, 1 or more"[:120], 'parse_tpu("v5e", 8)')
    name, colon, shape_text = text.partition(":")
    named = re.fullmatch(r"\s*(v\w+?)-(\d{1,5})\s*", name) if not colon else None
    if named and named.group(1).lower() in CATALOG:  # Cloud TPU's name for a slice (v5e-8, v5p-256)
        model = tpu_model(named.group(1))
        count = int(named.group(2))
        chips_named = count // 2 if model.dimensions == 3 else count  # v4 and v5p names count TensorCores
        shown = ":".join((model.name, "x".join(map(str, derived_shape(model, max(chips_named, 1))))))
        raise UsageError(f"$tpu$ {text[:40]!r} is Cloud TPU's name for a slice of {chips_named} chips; $tpu$ takes "
                         "CHIP or CHIP:TOPOLOGY", f"give {shown} (`te-ckpt-audit tpus` lists the chips)")
    model = tpu_model(name)
    if not colon:
        return _within_a_pod(TpuTarget(model, derived_shape(model, chips or 1)), text)
    if not re.fullmatch(r"[1-9]\d{0,3}(x[1-9]\d{0,3}){1,2}", shape_text.strip()):
        raise UsageError(f"$tpu$ {text[:40]!r}: {shape_text[:20]!r} is not a topology",
                         f"e.g. {model.name}:{'x'.join(['2'] * model.dimensions)}")
    shape = tuple(int(d) for d in shape_text.strip().split("x"))
    if len(shape) != model.dimensions:
        raise UsageError(f"$tpu$ {text[:40]!r}: a {model.name} slice has {model.dimensions} dimensions",
                         f"e.g. {model.name}:{'x'.join(['2'] * model.dimensions)}")
    target = TpuTarget(model, shape)
    if any(d & (d - 1) for d in shape):  # every side of a Cloud TPU slice is a power of two
        near = derived_shape(model, 1 << max(target.chips - 1, 0).bit_length())
        shown = ":".join((model.name, "x".join(map(str, near))))
        raise UsageError(f"$tpu$ {text[:40]!r} is not a slice a {model.name} comes in: each side is a power of two",
                         f"e.g. {shown}")
    _within_a_pod(target, text)
    if chips is not None and target.chips != chips:
        fits = ":".join((model.name, "x".join(map(str, derived_shape(model, chips))))) if chips & (chips - 1) == 0 \
            else None
        raise UsageError(f"$tpu$ {text[:40]!r} has {target.chips} chips and the mesh {chips} devices",
                         f"add $mesh$ data={target.chips} (a device per chip)"
                         + (f", or give {fits} for {chips}" if fits else ""))
    return target


POD_SIDE_2D = 16  # a v5e or v6e pod is 16x16 chips (256): libtpu aborts the process on a longer side


def _within_a_pod(target: TpuTarget, text: str) -> TpuTarget:
    """`target`, or a UsageError where a 2D chip's slice is larger than its pod (libtpu would end
    the process: `chip_bounds().y <= 16`)."""
    if target.model.dimensions == 2 and max(target.shape) > POD_SIDE_2D:
        raise UsageError(f"$tpu$ {text[:40]!r}: {target.topology} is larger than a {target.model.name} pod "
                         f"({POD_SIDE_2D}x{POD_SIDE_2D}, {POD_SIDE_2D ** 2} chips)",
                         f"give at most {POD_SIDE_2D ** 2} devices ($mesh$), or {target.model.name}:16x16")
    return target


def derived_shape(model: TpuModel, chips: int) -> tuple[int, ...]:
    """The most nearly square (or cubic) slice of `chips` chips, each side a power of two as
    Cloud TPU slices are: 8 v5e chips are 2x4, 8 v4 chips 2x2x2."""
    if chips < 1 or chips & (chips - 1):
        raise UsageError(f"a TPU slice of {chips} chips: slices are powers of two",
                         f"give the mesh a power-of-two number of devices, or the topology ({model.name}:"
                         f"{'x'.join(['2'] * model.dimensions)})")
    shape = [1] * model.dimensions
    i = 0
    while chips > 1:
        shape[i % model.dimensions] *= 2
        chips //= 2
        i += 1
    return tuple(sorted(shape))
