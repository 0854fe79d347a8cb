"""`te-ckpt-audit tpus`: the TPU chips --tpu will compile a training step for (issue 47), each
figure with its source, one chip a line."""

from __future__ import annotations

import shutil
import textwrap

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
    columns = max(shutil.get_terminal_size((100, 24)).columns, 60)  # COLUMNS, as the other tables take it
    indent = " " * (width + 2)
    for name, m in CATALOG.items():
        fields = [f"{m.hbm_bytes / GIB:.1f} GiB HBM, {m.usable_bytes / GIB:.2f} GiB usable",
                  f"{m.bf16_flops / 1e12:.0f} TFLOP/s bf16",
                  f"{m.hbm_bandwidth / 1e9:.0f} GB/s ({m.hbm_attained / 1e9:.0f} attained)",
                  f"ICI {m.ici_bandwidth * 8 / 1e9:.0f} Gb/s", f"{m.chips_per_host} chips/host", f"{m.dimensions}D",
                  f"{m.clock_hz / 1e9:.2f} GHz",
                  m.description + (f" (also {', '.join(aka[name])})" if name in aka else "")]
        print(_packed(f"{name:<{width}}  ", fields, indent, columns))
        print(textwrap.fill(f"usable: {m.usable_source}; clock: {CLOCK_SOURCE}; attained HBM: {ATTAINED_SOURCE[name]}; "
                            f"the rest: {m.source}", columns, initial_indent=indent, subsequent_indent=indent,
                            break_long_words=False, break_on_hyphens=False))
    return ExitCode.OK


def _packed(first: str, fields: list[str], indent: str, columns: int) -> str:
    """`fields` two spaces apart, a field never split, each line within `columns`."""
    lines, line = [], first
    for field in fields:
        if line.strip() and len(line) + 2 + len(field) > columns and line != first:
            lines.append(line)
            line = indent
        line += ("  " if line not in (first, indent) else "") + field
    return "\n".join([*lines, line])
