"""Run a command on an emulated GPU, to trace real Transformer Engine models on a machine without one.

TE's abstract evaluation asks the device questions while tracing (compute capability, SM count,
the occupancy of an NVRTC-compiled kernel). `te_cpu/setup.sh` builds TE against the CUDA wheels
and compiles an emulated driver (`te_cpu/fakecuda.c`) that answers them as one device and says
"no device" to everything else. This module runs a command with that driver preloaded, into that
process only:

    python -m te_ckpt_audit_cli.emulate --gpu 9.0:132 -- pytest -m te
    te-ckpt-audit --emulate-gpu 9.0:132 model.py:loss     # the CLI re-runs itself this way

Which figures depend on the emulated device: what TE selects by compute capability (FP8 and
MXFP8 recipes, fused-attention backends) and the size of its workspaces (by SM count). Residual
bytes are the shapes and dtypes JAX keeps; they change only through those selections.
"""

from __future__ import annotations

import dataclasses
import os
import re
import site
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from te_ckpt_audit import UsageError

EMULATING = "TE_CKPT_AUDIT_EMULATED"  # set in the process this runs: it must not run itself again
FAKECUDA = "TE_CKPT_AUDIT_FAKECUDA"  # the emulated driver, if not beside the environment


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    major: int = 9
    minor: int = 0
    sms: int = 132
    memory_gib: float = 80.0

    def __str__(self) -> str:
        return f"sm_{self.major}{self.minor}, {self.sms} SMs, {self.memory_gib:g} GiB"


def parse_gpu(text: str) -> Gpu:
    """`9.0:132` (compute capability, SM count), `9.0`, or `10.0:148:192` (with GiB)."""
    match = re.fullmatch(r"\s*(\d+)\.(\d)\s*(?::\s*(\d+))?\s*(?::\s*(\d+(?:\.\d+)?))?\s*", text)
    if not match:
        raise UsageError(
            f"not a GPU description: {text!r}", "give CC[:SMS[:GiB]], e.g. 9.0:132 (H100) or 8.0:108 (A100)"
        )
    major, minor, sms, mem = match.groups()
    return Gpu(int(major), int(minor), int(sms or 132), float(mem or 80))


def emulating() -> bool:
    """Whether this process was started on the emulated device (by `exec_emulated`)."""
    return bool(os.environ.get(EMULATING))


def find_fakecuda() -> Path:
    candidates = [os.environ.get(FAKECUDA, ""), str(Path(sys.prefix) / "fakecuda" / "libcuda.so.1")]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    raise UsageError(
        "no emulated CUDA driver for this Python environment",
        "set it up with `bash te_cpu/setup.sh` and run the python it prints, "
        f"or point {FAKECUDA} at a built libcuda.so.1",
    )


def has_fakecuda() -> bool:
    """Whether this environment has the emulated driver (`bash te_cpu/setup.sh` built it)."""
    try:
        find_fakecuda()
    except UsageError:
        return False
    return True


def _nvidia_lib_dirs() -> list[str]:
    dirs = []
    for root in [*site.getsitepackages(), site.getusersitepackages()]:
        nvidia = Path(root) / "nvidia"
        if nvidia.is_dir():
            dirs += sorted(str(p) for p in nvidia.glob("*/lib") if p.is_dir())
    return dirs


def environment(gpu: Gpu, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's) plus what a process needs to trace TE on `gpu`."""
    env = dict(os.environ if base is None else base)
    driver = find_fakecuda()
    libs = [str(driver.parent), *_nvidia_lib_dirs()]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env.update(
        {
            "LD_PRELOAD": " ".join(filter(None, [str(driver), env.get("LD_PRELOAD", "")])),
            "LD_LIBRARY_PATH": os.pathsep.join(libs),
            "JAX_PLATFORMS": "cpu",  # JAX itself never uses the emulated device
            "TE_CKPT_AUDIT_GPU_CC": f"{gpu.major}.{gpu.minor}",
            "TE_CKPT_AUDIT_GPU_SMS": str(gpu.sms),
            "TE_CKPT_AUDIT_GPU_MEM": f"{gpu.memory_gib:g}",
            EMULATING: str(gpu),
        }
    )
    nvrtc = next((d for d in _nvidia_lib_dirs() if d.endswith("cuda_nvrtc/lib")), None)
    if nvrtc and "NVRTC_HOME" not in env:
        env["NVRTC_HOME"] = str(Path(nvrtc).parent)
    return env


def exec_emulated(gpu: Gpu, argv: Sequence[str]) -> None:
    """Replace this process by `argv` running on the emulated `gpu` (never returns)."""
    env = environment(gpu)
    os.execvpe(argv[0], list(argv), env)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    gpu = Gpu()
    if args[:1] == ["--gpu"] and len(args) > 1:
        gpu = parse_gpu(args[1])
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m te_ckpt_audit_cli.emulate [--gpu CC:SMS] -- COMMAND...", file=sys.stderr)
        return 2
    try:
        exec_emulated(gpu, args)
    except UsageError as err:
        print(f"te-ckpt-audit: error: {err}", file=sys.stderr)
        return 2
    return 0  # pragma: no cover - exec does not return


if __name__ == "__main__":
    raise SystemExit(main())
