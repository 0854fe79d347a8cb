"""The compile stage: one training step per policy compiled for a target, and what the compiled
program says: its memory plan per device, whether it fits, and (--time) how long it runs.

Enters: the session's `Traced` (`..trace`), a policy spec and a request naming the target (a
`GpuRequest`, a `TpuRequest`, or `--compile`'s this machine). Leaves: records (`..records`): a
`PeakMemory` or `TpuPlan` per policy, a `StepTime`, a `StepInfo`. The targets are peers: each is
one module over the shared layer below it, and a new target is one module more, never an edit of
another's.

    _step        the training step every target compiles: value_and_grad over the user's pytrees,
                 an optax update (`..optimizers`) with its state donated
    _train       what every target's step shares: the loss check, what it trains and the update it
                 adds (`StepInfo`), the hook that keeps a compiler's log lines off stderr
    _placement   a mesh over the target's devices (a CUDA topology, a TPU slice); the trace's
                 shardings moved onto it
    _kernels     the kernels of a compiled step, read from its HLO (either target's), loops times
                 their trip counts, with the compiler's own cost estimates (XLA's, libtpu's cycles)
    _steptime    the step's time from its kernels: per target, the compiler's estimates made
                 seconds; one scheduled-order walk and one record for both
    _cache       compiled results on disk, trusted only when they prove they are this key's
    _workers     several policies at once in a caller's executor, each answer checked
  the targets, peers:
    _cpu         `--compile`: the step compiled for this machine's backend, XLA's memory analysis
    _gpu         a GPU's step lowered and compiled (both GEMM backends at once), what it needs;
                 with --time, one more compile for the estimate beside them; `_machine`: can this
                 machine compile for a GPU (the [gpu] extra)
    _tpu         a TPU slice's step compiled by libtpu: its plan, libtpu's verdict (the chip's own
                 HBM check) and, with --time, the estimate from the same compile

May import: `..trace`, `..analysis` (a policy applied to the trace), `gpus`, `tpus`, `optimizers`,
`records`, `specs`, `errors` and the compatibility seams; never the session, the search or a
renderer. A target module imports the shared layer, never another target's module.
"""

from ._gpu import Compiler, gpu_info
from ._machine import INSTALL_HINT, check_available
from ._placement import step_mesh
from ._tpu import TpuCompiler, tpu_info
from ._train import Compiled, LogCapture, check_loss, step_info
from ._workers import peaks_in_workers

__all__ = ["INSTALL_HINT", "Compiled", "Compiler", "LogCapture", "TpuCompiler", "check_available", "check_loss",
           "gpu_info", "peaks_in_workers", "step_info", "step_mesh", "tpu_info"]
