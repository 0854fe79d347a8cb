"""Will the step fit on the GPU? XLA:GPU's own memory plan of one training step, per device, under
each policy, compiled for a GPU model on a machine without one. A stage of the session, one job
per module:

    _machine     can this machine compile for a GPU (the [gpu] extra)
    _placement   a mesh over a CUDA topology of the GPU; the trace's shardings moved onto it
    _compiler    a policy's step lowered and compiled (both GEMM backends at once), what it needs;
                 with --time, one more compile for the estimate beside them
    _hlo_kernels the kernels of the compiled step, read from its HLO, with XLA's cost estimates
    _steptime    the step's time from its kernels: XLA's estimates, corrected, floored at the roofline
    _cache       compiled results on disk, trusted only when they prove they are this key's
    _workers     several policies at once in a caller's executor, each answer checked

The step itself (`value_and_grad` over the trained arguments, the optimizer) is `_step`, which
`--compile` shares.
"""

from ._compiler import Compiled, Compiler, check_loss, gpu_info, step_info
from ._machine import INSTALL_HINT, check_available
from ._placement import step_mesh
from ._workers import peaks_in_workers

__all__ = ["INSTALL_HINT", "Compiled", "Compiler", "check_available", "check_loss", "gpu_info", "peaks_in_workers",
           "step_info", "step_mesh"]
