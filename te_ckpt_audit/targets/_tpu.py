"""`--tpu`: each policy's training step compiled by libtpu for a TPU slice that is not here
(`jax.experimental.topologies`, the `[tpu]` extra), its memory plan per chip and libtpu's verdict,
and (`--time`) its time from the same compile's kernels (`_steptime.tpu_estimate`).

The verdict is libtpu's own HBM check, the chip's: on the lent v5e it refused exactly the steps
the deviceless compile refused, with the same required bytes (bench/tpu_truth.py). The step is
te-ckpt-audit's (`_step.training_step`), laid on the slice as the GPU stage lays it (`_placement`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import struct
import time
from pathlib import Path

import jax

from .. import _jax_compat as jc
from ..analysis._apply import policy_function
from ..errors import UsageError, first_line
from ..optimizers import optax_update
from ..records import MeshSpec, Scope, StepTime, TpuInfo, TpuPlan
from ..specs import AsIs, PolicySpec
from ..tpus import TpuRequest, TpuTarget
from ..trace._devices import mesh_context
from ..trace._trace import Traced
from . import _steptime as steptime
from ._kernels import VMEM, entry_arrays, step_kernels
from ._placement import gpu_mesh, on, rehomed, replicated
from ._step import own_step, state_on, training_step

OWN_STEP_AS_IS = "a training step of the target's own is compiled as it is: only as-is"
INSTALL_HINT = 'install the [tpu] extra: pip install -e ".[tpu]" (jax[tpu]: libtpu, Linux x86-64)'
_REQUIRED = re.compile(r"HLO temporaries \(([\d.]+)([KMGT]?)\)")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def libtpu_version() -> str | None:
    """The installed libtpu's version (a plan belongs to one), or None where none is installed."""
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


LOCKED_HINT = ("another process on this machine holds libtpu's lock (/tmp/libtpu_lockfile); a deviceless compile "
               "needs no chip: set ALLOW_MULTIPLE_LIBTPU_LOAD=1 before JAX starts, where this process uses no TPU "
               "chip (te-ckpt-audit's command line sets it itself when JAX runs on the CPU)")
LIBRARY_HINT = "TPU_LIBRARY_PATH must name a whole libtpu.so for this machine; unset it to use the [tpu] extra's"
_ELF_X86_64 = 62


def libtpu_file() -> Path | None:
    """The libtpu.so jax will load, by jax's own rule: TPU_LIBRARY_PATH where it names a file,
    else the libtpu package's (None: neither)."""
    given = os.environ.get("TPU_LIBRARY_PATH")
    if given and os.path.isfile(given):
        return Path(given)
    spec = importlib.util.find_spec("libtpu")
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent / "libtpu.so"
    return found if found.is_file() else None


def unloadable(path: Path) -> str | None:
    """Why `path` is no shared library this machine can load (a truncated copy ends the process
    with SIGBUS when loaded, before any error can be said), or None: a 64-bit x86-64 ELF file
    whose section table lies inside it."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(64)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return "it is not a shared library (no ELF header)"
    if head[4] != 2 or head[5] != 1:
        return "it is not a 64-bit little-endian library"
    machine = struct.unpack_from("<H", head, 18)[0]
    if machine != _ELF_X86_64:
        return f"it is built for another machine (ELF machine {machine}, not x86-64)"
    shoff = struct.unpack_from("<Q", head, 40)[0]
    shentsize, shnum = struct.unpack_from("<HH", head, 58)
    if shoff + shentsize * shnum > size:
        return f"it is cut short ({size:,} bytes; its own header says it holds {shoff + shentsize * shnum:,})"
    return None


def tpu_topology(target: TpuTarget) -> jc.Topology:
    """libtpu's description of the slice, no TPU needed; a UsageError where libtpu is missing,
    cannot load, or another process holds it."""
    if libtpu_version() is None:
        raise UsageError("--tpu compiles with libtpu, which is not installed here", INSTALL_HINT)
    library = libtpu_file()
    why = None if library is None else unloadable(library)
    if library is not None and why is not None:
        raise UsageError(f"libtpu at {library} cannot be loaded: {why}", LIBRARY_HINT)
    from jax.experimental import topologies

    per_host = target.model.chips_per_host
    host = (2, per_host // 2, 1) if target.chips > per_host else (*target.shape, *(1,) * (3 - len(target.shape)))
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=target.topology,
                                            chip_config_name="default", chips_per_host_bounds=host, num_slices=1)
    except Exception as exc:  # noqa: BLE001 - libtpu says what it refuses
        said = first_line(exc)
        if "lockfile" in said:
            raise UsageError("libtpu is in use by another process: it refuses a second one on this machine",
                             LOCKED_HINT) from None
        if "topolog" in said.lower() or "bounds" in said.lower() or "chip" in said.lower():
            raise UsageError(f"libtpu cannot describe the slice {target.topology}: {said}",
                             "give a slice shape the chip comes in, e.g. v5e:2x4") from None
        raise UsageError(f"libtpu {libtpu_version()} at {library} failed to start: {said}", LIBRARY_HINT) from None


def tpu_info(request: TpuRequest, mesh: MeshSpec | None) -> TpuInfo:
    t = request.target
    return TpuInfo(t.model.name, t.topology, t.chips, t.model.hbm_bytes, t.model.usable_bytes, libtpu_version(),
                   None if mesh is None else str(mesh))


def required_bytes(message: str) -> int | None:
    """The bytes a refusal says the step requires ("... HLO temporaries (16.29G) exceeds ...")."""
    found = _REQUIRED.search(message)
    return None if found is None else int(float(found.group(1)) * _UNITS[found.group(2)])


class TpuCompiler:
    """One trace's training step compiled for one TPU slice, policy by policy."""

    def __init__(self, traced: Traced, request: TpuRequest, mesh: MeshSpec | None) -> None:
        devices = 1 if mesh is None else mesh.devices
        if devices != request.target.chips:
            raise UsageError(f"$tpu$ {request.target.topology} has {request.target.chips} chips and the step's mesh "
                             f"{devices} devices", f"give $mesh$ of {request.target.chips} devices, or $tpu$ "
                             f"{request.target.model.name} alone (its slice from the mesh)")
        self.traced, self.request = traced, request
        topology = tpu_topology(request.target)
        self.mesh = gpu_mesh(topology, mesh)  # the helpers lay a trace on any topology's devices
        self.placed = rehomed(traced, topology) if mesh is not None else traced

    def plan(self, spec: PolicySpec, scope: Scope) -> tuple[TpuPlan, StepTime | None]:
        """libtpu's plan and verdict for the policy's step; with the request's `time`, its time
        from the same compile's kernels (none where the step does not fit)."""
        plan, text = self._compiled(spec, scope)
        if not self.request.time:
            return plan, None
        model, chips = self.request.target.model, self.request.target.chips
        if plan.fits is not True or text is None:
            why = ("the step does not fit the chip's HBM" if plan.fits is False
                   else plan.error or "libtpu gave no program")
            return plan, steptime.tpu_failed(why, model, chips)
        kernels = step_kernels(text, chips, model.chips_per_host, VMEM)
        return plan, steptime.tpu_estimate(kernels, model, chips, plan.compile_seconds, entry_arrays(text))

    def _compiled(self, spec: PolicySpec, scope: Scope) -> tuple[TpuPlan, str | None]:
        start = time.perf_counter()
        if self.request.step and not isinstance(spec, AsIs):
            return TpuPlan(None, None, None, None, None, None, 0.0, OWN_STEP_AS_IS), None
        fun = policy_function(self.placed, spec, scope, calls=False)  # the program as the user's code makes it
        avals = [on(self.mesh, a) for a in self.placed.avals]
        optimizer = None if self.request.optimizer is None else optax_update(self.request.optimizer)
        step = (own_step(self.placed, fun, avals, self.request.donate) if self.request.step else
                training_step(self.placed, fun, avals, optimizer, lambda p, s: state_on(p, s, replicated(self.mesh))))
        try:
            with jax.numpy_dtype_promotion("standard"), mesh_context(self.mesh):
                compiled = jax.jit(step.fn, donate_argnums=step.donate).lower(*step.args).compile()
        except Exception as exc:  # noqa: BLE001 - libtpu's verdict, or why it could not compile
            seconds = time.perf_counter() - start
            text = str(exc)
            if "RESOURCE_EXHAUSTED" in text:
                return TpuPlan(False, required_bytes(text), None, None, None, None, round(seconds, 2)), None
            return TpuPlan(None, None, None, None, None, None, round(seconds, 2), f"{type(exc).__name__}: "
                           f"{first_line(exc)}"), None
        stats = compiled.memory_analysis()
        if stats is None:
            return TpuPlan(None, None, None, None, None, None, round(time.perf_counter() - start, 2),
                           "libtpu gave no memory analysis"), None
        return TpuPlan(True, None, int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes),
                       int(stats.alias_size_in_bytes), int(stats.temp_size_in_bytes),
                       round(time.perf_counter() - start, 2)), compiled.as_text() if self.request.time else None

