"""`te-ckpt-audit tpus`: the TPU chips --tpu will compile a training step for (issue 47), each
figure with its source, one chip a line."""

from __future__ import annotations

from te_ckpt_audit.tpus import ALIASES, ATTAINED_SOURCE, CATALOG, CLOCK_SOURCE, GIB

from .exit_codes import ExitCode


def tpus() -> int:
    """List the TPU chips: HBM (and what the chip's compile takes of it), peak bf16 FLOP/s, HBM and
    ICI bandwidth, chips per host, topology dimensions, the clock libtpu's cycle estimates count in,
    the HBM bandwidth a memory-bound kernel attains, and where each figure comes from."""
    aka: dict[str, list[str]] = {}
    for alias, name in ALIASES.items():
        aka.setdefault(name, []).append(alias)
    width = max(len(n) for n in CATALOG)
    for name, m in CATALOG.items():
        also = f"  (also {', '.join(aka[name])})" if name in aka else ""
        print(f"{name:<{width}}  {m.hbm_bytes / GIB:5.1f} GiB HBM, {m.usable_bytes / GIB:6.2f} GiB usable  "
              f"{m.bf16_flops / 1e12:4.0f} TFLOP/s bf16  {m.hbm_bandwidth / 1e9:5.0f} GB/s "
              f"({m.hbm_attained / 1e9:.0f} attained)  "
              f"ICI {m.ici_bandwidth * 8 / 1e9:5.0f} Gb/s  {m.chips_per_host} chips/host  {m.dimensions}D  "
              f"{m.clock_hz / 1e9:.2f} GHz  {m.description}{also}")
        print(f"{'':<{width}}  usable: {m.usable_source}; clock: {CLOCK_SOURCE}; attained HBM: "
              f"{ATTAINED_SOURCE[name]}; the rest: {m.source}")
    return ExitCode.OK
