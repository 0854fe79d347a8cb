"""The launcher's stage: what the command line does to its own process before the library runs.
The library never touches the process; this module owns it:

- virtual CPU devices for a mesh: XLA's host device count, set before JAX starts its backend, and
  where the backend already started with fewer, this command run again with the flag (once);
- the emulated GPU for tracing real Transformer Engine: this command run again with the emulated
  CUDA driver preloaded (`emulate.py`), into that process only; `--gpu NAME` emulates that GPU
  wherever the emulated driver is set up (the te_cpu environment);
- JAX kept on its CPU backend where a step is compiled for a GPU (`--gpu`): the CUDA plugin then
  registers without looking for a local CUDA, and the trace stays on CPU devices; for a TPU
  (`--tpu`), libtpu's environment for a machine that is no TPU VM, and leave to load it beside
  other processes (a deviceless compile opens no chip);
- the worker processes that compile several policies at once (`--jobs`), and XLA's log lines
  kept off stderr while it compiles;
- Python's cyclic collector, paused while the command traces and analyses.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import gc
import logging
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

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


def prepare(gpu: str | None, devices: int | None, target: GpuModel | None = None, tpu: bool = False) -> None:
    """The process a command needs before its first trace: on the emulated GPU `gpu` where one is
    asked for (else the `target` GPU's, where the emulated driver is set up), with `devices` CPU
    devices for a compiled mesh (each may run the command again), and with JAX on CPU when a step
    is compiled for a `target` GPU or a TPU; XLA_FLAGS that XLA refuses are a UsageError first."""
    if not os.environ.get(REEXEC_MARKER) and not emulate.emulating():  # every command starts XLA, which
        check_xla_flags(os.environ.get("XLA_FLAGS", ""))  # ends on a flag it refuses: once, before any work
    if gpu is None and target is not None and not emulate.emulating() and emulate.has_fakecuda():
        gpu = target.emulated
    if gpu is not None:
        emulate_gpu(gpu)
    if (target is not None or tpu or _cuda_plugin_without_cuda()) and not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")  # before JAX starts a backend
    if tpu:  # libtpu looks for the TPU VM it runs on: no such machine here, and nothing to say of it
        for name, value in LIBTPU_QUIET.items():
            os.environ.setdefault(name, value)
        if _platforms() == {"cpu"}:  # a deviceless compile never opens a chip: others may load libtpu too
            os.environ.setdefault(MULTIPLE_LIBTPU, "1")
    if devices:
        provide_cpu_devices(devices)


def _platforms() -> set[str]:
    """The backends JAX may start in this process (JAX_PLATFORMS, or its config where this set it)."""
    named = os.environ.get("JAX_PLATFORMS") or getattr(jax.config, "jax_platforms", None) or ""
    return {p.strip().lower() for p in named.split(",") if p.strip()}


# libtpu lets one process per machine load it unless this is set (its lock, /tmp/libtpu_lockfile):
# set only where JAX runs on the CPU, so the lock still guards a chip a process of the user's may use
MULTIPLE_LIBTPU = "ALLOW_MULTIPLE_LIBTPU_LOAD"

# libtpu's environment on a machine that is no TPU VM: without them it prints warnings (no
# accelerator type, no worker hostnames) as it describes a slice for a deviceless compile
LIBTPU_QUIET = {"TPU_ACCELERATOR_TYPE": "v5litepod-1", "TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "1"}

_UNKNOWN_FLAG = re.compile(r"Unknown flags? in XLA_FLAGS: (.+)$", re.MULTILINE)
_BAD_VALUE = re.compile(r"Couldn't interpret value (.*) for flag (\S+?)\.?$", re.MULTILINE)


@functools.cache
def check_xla_flags(flags: str) -> None:
    """XLA_FLAGS as XLA reads them, in a process of its own (XLA ends a process whose flags it
    refuses, and its reason goes to its log): a flag it does not know or a value it cannot take is
    a UsageError naming it, before any work."""
    if not flags.strip():
        return
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    try:
        done = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], env=env,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return  # no answer is no refusal: the compile reads them again
    if done.returncode == 0:
        return
    hint = "fix or remove it in XLA_FLAGS"
    if unknown := _UNKNOWN_FLAG.search(done.stderr):
        raise UsageError(f"XLA_FLAGS: XLA does not know {unknown.group(1).strip()}", hint)
    if bad := _BAD_VALUE.search(done.stderr):
        raise UsageError(f"XLA_FLAGS: XLA cannot take the value {bad.group(1)!r} for --{bad.group(2)}", hint)
    last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or [f"exit {done.returncode}"]
    raise UsageError(f"XLA_FLAGS: XLA refuses them: {last[0][:300]}", hint)


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


def _quiet_worker_setup() -> None:
    """A compile worker's setup, and its XLA log kept off the user's stderr as this process keeps
    its own (`xla_log_kept_off_stderr`): its file descriptor 2 goes through a filter of its own
    that drops XLA's info and warning lines (a profile's missing kernels were one line each) and
    passes the rest, errors and fatal lines included, as they come."""
    _worker_setup()
    with contextlib.suppress(OSError):
        saved = os.dup(2)
        relay = subprocess.Popen([sys.executable, "-I", "-S", "-c", _FILTER], stdin=subprocess.PIPE, stdout=saved)
        assert relay.stdin is not None
        os.dup2(relay.stdin.fileno(), 2)  # the filter ends with this process, at the end of its input
        os.close(saved)


@contextlib.contextmanager
def workers(jobs: int) -> Iterator[concurrent.futures.Executor | None]:
    """`jobs` worker processes for compiling policies at once (spawned: JAX's threads do not
    survive a fork; started when the first policy is sent), or None for one: compiles then run in
    this process."""
    if jobs <= 1:
        yield None
        return
    context = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_quiet_worker_setup)
    try:
        yield pool
    except BaseException:  # Ctrl-C, SIGTERM, an error: queued compiles cancelled, running ones ended now
        pool.shutdown(wait=False, cancel_futures=True)
        end_children()
        raise
    pool.shutdown(wait=True)


def end_children(grace: float = 5.0) -> None:
    """End this process's worker processes: asked (SIGTERM), then, after `grace` seconds, made."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    deadline = time.monotonic() + grace
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join(1.0)


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
# A worker's stderr, line by line as it comes: XLA's info and warning lines dropped, the rest passed
_FILTER = f"""
import re, sys
quiet = re.compile({_ABSL_LINE.pattern.replace("[IWEF]", "[IW]")!r})
for line in sys.stdin.buffer:
    if not quiet.match(line.decode(errors="replace")):
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
"""
_DONE = "te-ckpt-audit: the capture ended"
LAST_WORDS = 20  # lines of XLA's log shown where it ended the process
# The relay holds what XLA writes to stderr while it compiles. Where the capture ends, it passes on
# what is not XLA's log; where the process died first (XLA aborts on a fatal error), its last lines
# and, where a stack trace follows them, the fatal and error lines before: a process of its own, so
# that they outlive this one.
_RELAY = f"""
import re, sys
absl = re.compile({_ABSL_LINE.pattern!r})
lines = sys.stdin.buffer.read().decode(errors="replace").splitlines()
if lines and lines[-1] == {_DONE!r}:
    kept = [line for line in lines[:-1 if lines[-2:-1] != [""] else -2] if not absl.match(line)]
else:  # its reason (a fatal or error line) first, where a stack trace pushed it out of the last lines
    tail = lines[-{LAST_WORDS}:]
    reasons = [line for line in lines[:-{LAST_WORDS}] if re.match(r"[EF]\\d{{4}} ", line)][-3:]
    kept = (["te-ckpt-audit: error: XLA ended the process while it compiled; its reason and last lines:"]
            + reasons + (["..."] if reasons else []) + tail)
sys.stdout.write("".join(line + "\\n" for line in kept))
"""


@contextlib.contextmanager
def xla_log_kept_off_stderr() -> Iterator[None]:
    """While XLA compiles: its own log lines (its C++ logging writes to file descriptor 2) are
    dropped; anything else written there passes on to stderr afterwards; where XLA ends the process
    (a fatal error), its last lines reach stderr all the same. One capture at a time: a nested or
    concurrent one is the outer one's."""
    if not _capturing.acquire(blocking=False):
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        relay = subprocess.Popen([sys.executable, "-I", "-S", "-c", _RELAY], stdin=subprocess.PIPE, stdout=saved)
        assert relay.stdin is not None
        os.dup2(relay.stdin.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            relay.stdin.write(f"\n{_DONE}\n".encode())
            relay.stdin.close()
            relay.wait()
            os.close(saved)
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
    a worker's). Its workers must see the same files at the same paths. Every wait is bounded:
    no scheduler answering, or none with a worker, within CLUSTER_TIMEOUT_S is a UsageError; a
    cluster lost mid-sweep fails its outstanding compiles (the library compiles them here). Dask's
    own log is kept off stderr."""
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--cluster needs Dask's distributed, which is not installed",
                         'from a checkout: pip install -e ".[cluster]"') from None
    hint = "start one (dask scheduler; dask worker ADDRESS --nthreads 1) or give its address"
    with _dask_log_off():
        connected = _within(CLUSTER_TIMEOUT_S + 5, lambda: Client(address, timeout=CLUSTER_TIMEOUT_S))
        if not isinstance(connected, Client):
            why = first_line(connected) if isinstance(connected, BaseException) else "no answer"
            raise UsageError(f"--cluster {address}: no Dask scheduler answers there ({why})", hint)
        client = connected
        try:
            waited = _within(CLUSTER_TIMEOUT_S + 5, lambda: client.wait_for_workers(1, timeout=CLUSTER_TIMEOUT_S))
            if waited is not None:
                raise UsageError(f"--cluster {address}: the scheduler has no worker (none came in "
                                 f"{CLUSTER_TIMEOUT_S} s)", "start workers: dask worker ADDRESS --nthreads 1")
            executor = ClusterExecutor(client, address)
            try:
                yield executor
            finally:
                executor.shutdown()
        finally:
            _within(CLUSTER_TIMEOUT_S, lambda: client.close(timeout=CLUSTER_TIMEOUT_S))


_NOTHING = object()


def _within(seconds: float, call: Callable[[], object]) -> object:
    """`call()` in a thread of its own, given `seconds`: its value, the exception it raised, or
    `_NOTHING` where it did not return in time (the thread is left to end on its own)."""
    box: list[object] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return box[0] if box else _NOTHING


@contextlib.contextmanager
def _dask_log_off() -> Iterator[None]:
    """Dask's loggers (and those of the event loop under it) off: each has a level of its own."""
    names = [n for n in logging.root.manager.loggerDict if n.partition(".")[0] in ("distributed", "tornado")]
    loggers = [logging.getLogger(n) for n in [*names, "distributed", "tornado", "asyncio"]]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was


class ClusterLost(Exception):  # noqa: N818 (an event, as BrokenProcessPool)
    """The cluster stopped answering (its scheduler gone, or no worker left) with this compile
    outstanding."""


class ClusterExecutor(concurrent.futures.Executor):
    """A Dask client's executor whose futures are this process's own: each takes its Dask future's
    outcome, or fails with ClusterLost once the cluster has had no worker, or its client has given
    up on the scheduler, for CLUSTER_TIMEOUT_S (a watcher thread asks every POLL_S; a slow answer
    is not a lost cluster)."""

    POLL_S = 1.0

    def __init__(self, client: Any, address: str) -> None:
        self._client, self._address = client, address
        self._inner = client.get_executor()
        self._outstanding: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()
        self._lost: str | None = None
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        ours: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._lost is not None:
                ours.set_exception(ClusterLost(self._lost))
                return ours
            self._outstanding.add(ours)
        try:
            theirs = self._inner.submit(fn, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the cluster refused it: the caller compiles it elsewhere
            self._settle(ours, exc)
            return ours
        theirs.add_done_callback(lambda f: self._settle(ours, f.exception() if not f.cancelled() else
                                                        ClusterLost("cancelled by the cluster"), f))
        return ours

    def _settle(self, ours: concurrent.futures.Future[Any], error: BaseException | None,
                theirs: concurrent.futures.Future[Any] | None = None) -> None:
        with self._lock:
            self._outstanding.discard(ours)
        try:
            if error is not None:
                ours.set_exception(error)
            elif theirs is not None:
                ours.set_result(theirs.result())
        except concurrent.futures.InvalidStateError:
            pass  # lost already

    def _watch(self) -> None:
        since: float | None = None
        while not self._stop.wait(self.POLL_S):
            answer = _within(CLUSTER_TIMEOUT_S, lambda: len(self._client.scheduler_info()["workers"]))
            gone = answer == 0 or self._client.status not in ("running", "connecting", "newly-created")
            if not gone:  # workers there, or a scheduler slow to answer (busy compiling): not lost
                since = None
                continue
            since = since if since is not None else time.monotonic()
            if time.monotonic() - since >= CLUSTER_TIMEOUT_S:
                self._lose(f"the cluster at {self._address} has not answered with a worker for {CLUSTER_TIMEOUT_S} s")
                return

    def _lose(self, why: str) -> None:
        with self._lock:
            self._lost = why
            pending, self._outstanding = list(self._outstanding), set()
        for f in pending:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                f.set_exception(ClusterLost(why))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stop.set()
