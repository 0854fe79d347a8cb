"""`te-ckpt-audit gpus`: the GPU models --gpu compiles a training step for, one a line."""

from __future__ import annotations

from te_ckpt_audit.gpus import ALIASES, CATALOG, GIB

from .exit_codes import ExitCode


def gpus() -> int:
    """List the GPU models --gpu compiles for: name, compute capability, SMs, memory."""
    aka: dict[str, list[str]] = {}
    for alias, name in ALIASES.items():
        aka.setdefault(name, []).append(alias)
    width = max(len(n) for n in CATALOG)
    for name, m in CATALOG.items():
        major, minor = m.compute_capability
        also = f"  (also {', '.join(aka[name])})" if name in aka else ""
        print(f"{name:<{width}}  {f'sm_{major}{minor}':<6}  {m.sms:>3} SMs  {m.memory_bytes / GIB:6.1f} GiB  "
              f"{m.bandwidth / 1e12:.2f} TB/s  {m.description}{also}")
    return ExitCode.OK
