"""`--compile`: what XLA's compiled training step needs, per policy, beside the estimate.

The step is the training step `--gpu` compiles (`_step`: `value_and_grad` of the
policy-applied function over the trained inputs, written over the user's pytrees), lowered from
shapes alone and compiled for the default backend; nothing is allocated or run. XLA fuses,
schedules and may rematerialize on its own, so its temp bytes are a different figure from the
residual bytes: both are reported, side by side. On a mesh (`--mesh`)
the inputs carry their NamedShardings, so the step compiles partitioned and `memory_analysis()`
is one device's, beside the per-device residual bytes.
"""

from __future__ import annotations

import jax

from ..analysis._apply import policy_function
from ..errors import first_line
from ..records import CompiledMemory, Scope
from ..specs import PolicySpec
from ..trace._trace import Traced
from ._step import training_step


def compiled_memory(traced: Traced, spec: PolicySpec, scope: Scope) -> CompiledMemory:
    """Compile the training step under `spec` and read `memory_analysis()`; a failure to lower or
    compile (a primitive without a lowering for this backend, say) is reported, not raised."""
    step = training_step(traced, policy_function(traced, spec, scope, calls=False), traced.avals)
    backend = jax.default_backend()
    try:
        stats = jax.jit(step.fn).lower(*step.args).compile().memory_analysis()
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
