"""The launcher's stage: what the command line does to its own process before the library runs.
The library never touches the process; this module owns it:

- virtual CPU devices for a mesh: XLA's host device count, set before JAX starts its backend, and
  where the backend already started with fewer, this command run again with the flag (once);
- the emulated GPU for tracing real Transformer Engine: this command run again with the emulated
  CUDA driver preloaded (`emulate.py`), into that process only; `--gpu NAME` emulates that GPU
  wherever the emulated driver is set up (the te_cpu environment);
- JAX kept on its CPU backend where a step is compiled for a GPU (`--gpu`): the CUDA plugin then
  registers without looking for a local CUDA, and the trace stays on CPU devices;
- the worker processes that compile several policies at once (`--jobs`), and XLA's log lines
  kept off stderr while it compiles;
- Python's cyclic collector, paused while the command traces and analyses.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import multiprocessing
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import jax

from te_ckpt_audit import MAX_DEVICES, UsageError
from te_ckpt_audit.errors import first_line
from te_ckpt_audit.gpus import GpuModel

from . import emulate

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
CLUSTER_TIMEOUT_S = 10  # how long --cluster waits for its scheduler to answer
REEXEC_MARKER = "TE_CKPT_AUDIT_MESH_DEVICES"  # set in a process run again for its devices
_FLAG = re.compile(rf"{DEVICE_COUNT_FLAG}=(\S*)")
T = TypeVar("T")


def rerun_argv() -> list[str]:
    """This command, run again by the same Python."""
    return [sys.executable, "-m", "te_ckpt_audit_cli", *sys.argv[1:]]


def with_device_count(flags: str, n: int) -> str:
    """XLA_FLAGS `flags` asking for at least `n` host devices (a larger count already there stays).

    >>> with_device_count("--xla_dump_to=/tmp", 8)
    '--xla_dump_to=/tmp --xla_force_host_platform_device_count=8'
    """
    found = _FLAG.search(flags)
    if found is None:
        return f"{flags} {DEVICE_COUNT_FLAG}={n}".strip()
    if found.group(1).isdigit() and int(found.group(1)) >= n:
        return flags
    return _FLAG.sub(f"{DEVICE_COUNT_FLAG}={n}", flags)


def provide_cpu_devices(n: int, argv: list[str] | None = None) -> None:
    """At least `n` of JAX's CPU devices for the library to build a mesh on: where JAX started
    with fewer, `argv` (this command) runs again with the flag. Over the library's limit nothing
    is asked for (the library then says why, in one line)."""
    if n > MAX_DEVICES:
        return
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), n)
    if len(jax.devices("cpu")) >= n or os.environ.get(REEXEC_MARKER):
        return  # enough; or this is the re-run, and the library says what is missing
    env = dict(os.environ, **{REEXEC_MARKER: str(n)})
    argv = argv or rerun_argv()
    os.execve(argv[0], argv, env)


def emulate_gpu(text: str) -> None:
    """Run this command again on the emulated GPU `text` (CC[:SMS[:GiB]]), unless it already is."""
    if emulate.emulating():
        return
    emulate.exec_emulated(emulate.parse_gpu(text), rerun_argv())


def prepare(gpu: str | None, devices: int | None, target: GpuModel | None = None) -> None:
    """The process a command needs before its first trace: on the emulated GPU `gpu` where one is
    asked for (else the `target` GPU's, where the emulated driver is set up), with `devices` CPU
    devices for a compiled mesh (each may run the command again), and with JAX on CPU when a step
    is compiled for a `target` GPU."""
    if gpu is None and target is not None and not emulate.emulating() and emulate.has_fakecuda():
        gpu = target.emulated
    if gpu is not None:
        emulate_gpu(gpu)
    if (target is not None or _cuda_plugin_without_cuda()) and not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")  # before JAX starts a backend
    if devices:
        provide_cpu_devices(devices)


def _cuda_plugin_without_cuda() -> bool:
    """JAX's CUDA plugin installed (the [gpu] extra) on a machine with no CUDA driver: JAX would
    print the plugin's failed check (a traceback) when it starts its backends, then use the CPU."""
    import ctypes.util
    import importlib.util

    try:
        plugin = importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ImportError:
        plugin = False
    return plugin and not emulate.emulating() and ctypes.util.find_library("cuda") is None


# --- compiling for a GPU: worker processes and XLA's log lines --------------------------------------


def _worker_setup() -> None:
    """Each worker process compiles on JAX's CPU backend, as this one does: the CUDA plugin
    registers without looking for a local CUDA."""
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")


@contextlib.contextmanager
def workers(jobs: int) -> Iterator[concurrent.futures.Executor | None]:
    """`jobs` worker processes for compiling policies at once (spawned: JAX's threads do not
    survive a fork; started when the first policy is sent), or None for one: compiles then run in
    this process."""
    if jobs <= 1:
        yield None
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_setup) as pool:
        yield pool


def in_a_child(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` in a process of its own (spawned, on JAX's CPU backend), for library calls that
    start JAX's backend before this process has set its devices (MaxText's config). Its output is
    kept apart and shown only where the child dies without an answer; its errors are raised here."""
    context = multiprocessing.get_context("spawn")
    with tempfile.NamedTemporaryFile(prefix="te-ckpt-audit-child.", suffix=".log") as log, \
            concurrent.futures.ProcessPoolExecutor(1, mp_context=context, initializer=_child_setup,
                                                   initargs=(log.name,)) as pool:
        try:
            return pool.submit(fn, *args).result()
        except concurrent.futures.process.BrokenProcessPool:
            said = Path(log.name).read_text(errors="replace").strip().splitlines()[-3:]
            raise UsageError(f"the process reading the configuration died: {' / '.join(said) or 'no output'}",
                             "run again with $debug$; report it if it persists") from None


def _child_setup(log: str) -> None:
    _worker_setup()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] ")
_capturing = threading.Lock()


@contextlib.contextmanager
def xla_log_kept_off_stderr() -> Iterator[None]:
    """While XLA compiles: its own log lines (its C++ logging writes to file descriptor 2) are
    dropped; anything else written there passes on to stderr afterwards. One capture at a time:
    a nested or concurrent one is the outer one's."""
    if not _capturing.acquire(blocking=False):
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                captured.seek(0)
                for line in captured.read().decode(errors="replace").splitlines():
                    if not _ABSL_LINE.match(line):
                        print(line, file=sys.stderr)
    finally:
        _capturing.release()


# --- the cyclic collector ---------------------------------------------------------------------------
# Paused while the command traces and analyses (the library leaves it alone; a Python caller may
# pause it around its own calls for the same speed). Tracing and linearizing allocate many small
# objects, and every so often Python's collector walks the whole heap looking for cycles; in a
# process that imported a large library (MaxText, KerasHub) one such walk costs more than a
# policy's analysis: on the zoo's MaxText NNX model, five further policies took 0.42 s with the
# collector on and 0.22 s with it paused. Reference counting still frees what an analysis drops.


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection for the duration; where it is off already (an enclosing use, or the
    caller's choice) it stays as it is."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def running(jobs: int = 1, cluster: str | None = None) -> Iterator[concurrent.futures.Executor | None]:
    """The process as the library's work needs it: the collector paused, and `jobs` worker
    processes for compiling policies at once (None for one), or the executor of the Dask cluster
    whose scheduler is at `cluster`."""
    with collector_paused(), (on_cluster(cluster) if cluster else workers(jobs)) as pool:
        yield pool


@contextlib.contextmanager
def on_cluster(address: str) -> Iterator[concurrent.futures.Executor]:
    """The executor of the running Dask cluster at `address` (`distributed`: its workers are
    processes of their own, each tracing the target again, each answer checked as --jobs checks
    a worker's). Its workers must see the same files at the same paths."""
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--cluster needs Dask's distributed, which is not installed",
                         'from a checkout: pip install -e ".[cluster]"') from None
    try:
        client = Client(address, timeout=CLUSTER_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise UsageError(f"--cluster {address}: no Dask scheduler answers there ({first_line(exc)})",
                         "start one (dask scheduler; dask worker ADDRESS --nthreads 1) or give its address") from None
    with client:
        yield client.get_executor()
