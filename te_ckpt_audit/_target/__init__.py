"""The compile stage: one training step per policy compiled for a target that is not here, a GPU
(XLA:GPU) or a TPU slice (libtpu), and what the compiled program says: its memory plan per device,
whether it fits, and (--time) how long it runs. A stage of the session; the two targets share
everything but the compiler call, one job per module:

    _gpu         a GPU's step lowered and compiled (both GEMM backends at once), what it needs;
                 with --time, one more compile for the estimate beside them
    _tpu         a TPU slice's step compiled by libtpu: its plan, libtpu's verdict (the chip's own
                 HBM check) and, with --time, the estimate from the same compile
    _machine     can this machine compile for a GPU (the [gpu] extra)
    _placement   a mesh over the target's devices (a CUDA topology, a TPU slice); the trace's
                 shardings moved onto it
    _kernels     the kernels of a compiled step, read from its HLO (either target's), loops times
                 their trip counts, with the compiler's own cost estimates (XLA's, libtpu's cycles)
    _steptime    the step's time from its kernels: per target, the compiler's estimates made
                 seconds; one scheduled-order walk and one record for both
    _train       what both targets' steps share: the loss check, what a step trains and the
                 update it adds (`StepInfo`), the hook that keeps compiler logs off stderr
    _cache       compiled results on disk, trusted only when they prove they are this key's
    _workers     several policies at once in a caller's executor, each answer checked

The step itself (`value_and_grad` over the trained arguments, the optimizer) is `_step`, which
`--compile` shares.
"""

from ._gpu import Compiled, Compiler, gpu_info
from ._machine import INSTALL_HINT, check_available
from ._placement import step_mesh
from ._tpu import TpuCompiler, tpu_info
from ._train import LogCapture, check_loss, step_info
from ._workers import peaks_in_workers

__all__ = ["INSTALL_HINT", "Compiled", "Compiler", "LogCapture", "TpuCompiler", "check_available", "check_loss",
           "gpu_info", "peaks_in_workers", "step_info", "step_mesh", "tpu_info"]
