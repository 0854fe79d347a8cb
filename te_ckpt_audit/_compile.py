"""`--compile`: what XLA's compiled training step needs, per policy, beside the estimate.

The step is the forward and backward pass of the policy-applied function (`jax.vjp` then the
pullback of ones), lowered from shapes alone and compiled for the default backend; nothing is
allocated or run. XLA fuses, schedules and may rematerialize on its own, so its temp bytes are a
different figure from the residual bytes: both are reported, side by side. On a mesh (`--mesh`)
the inputs carry their NamedShardings, so the step compiles partitioned and `memory_analysis()`
is one device's, beside the per-device residual bytes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._apply import policy_function
from ._trace import Traced
from .errors import first_line
from .records import CompiledMemory, Scope
from .specs import PolicySpec


def compiled_memory(traced: Traced, spec: PolicySpec, scope: Scope) -> CompiledMemory:
    """Compile the training step under `spec` and read `memory_analysis()`; a failure to lower or
    compile (a primitive without a lowering for this backend, say) is reported, not raised."""
    fun = policy_function(traced, spec, scope)

    def step(*args: Any) -> Any:
        out, pullback = jax.vjp(fun, *args)
        return pullback([jnp.ones_like(o) for o in out])

    backend = jax.default_backend()
    try:
        stats = jax.jit(step).lower(*traced.avals).compile().memory_analysis()
    except Exception as exc:  # reported per policy; the audit itself stands
        return CompiledMemory(backend, None, None, None, None, f"{type(exc).__name__}: {first_line(exc)}")
    if stats is None:
        return CompiledMemory(backend, None, None, None, None, "the backend reports no memory analysis")
    return CompiledMemory(
        backend=backend,
        temp_bytes=int(stats.temp_size_in_bytes),
        argument_bytes=int(stats.argument_size_in_bytes),
        output_bytes=int(stats.output_size_in_bytes),
        host_bytes=int(
            getattr(stats, "host_temp_size_in_bytes", 0)
            + getattr(stats, "host_argument_size_in_bytes", 0)
            + getattr(stats, "host_output_size_in_bytes", 0)
        ),
        error=None,
    )
