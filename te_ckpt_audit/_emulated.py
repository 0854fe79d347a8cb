"""Which GPU this process emulates for Transformer Engine (`--emulate-gpu`), if any: reports name
it, since what TE selects by compute capability depends on it. The answer comes from the emulated
driver itself (`te_cpu/fakecuda.c`), loaded into this process or not; an environment variable
could name a device that nothing emulates."""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def emulated_device() -> str | None:
    """The device the emulated CUDA driver loaded in this process answers as, or None."""
    try:
        ask = ctypes.CDLL(None).te_ckpt_audit_emulated_gpu  # the process's own symbols, preloads included
    except (AttributeError, OSError):
        return None
    out = ctypes.create_string_buffer(128)
    if ask(out, len(out)) != 0:
        return None
    return out.value.decode("utf-8", "replace") or None
