"""`--cluster ADDRESS`: a sweep's compiles on a running Dask cluster (issue 28), against a
`LocalCluster` this test starts. The same figures as compiling here, and a worker that traced
another program refused as `--jobs` refuses it. The gpu-target lane has `distributed` (the
[cluster] extra) and every test here must run there."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _gpu_lane import LANE, MISSING_GPU_TARGET, cli, compiles

HAS_DASK = importlib.util.find_spec("distributed") is not None
SWEEP = ["--gpu", "h100", "-p", "nothing_saveable", "-p", "everything_saveable", "-p", "checkpoint_dots", "-f", "json"]


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    if not HAS_DASK:
        if LANE:
            pytest.fail("the gpu-target lane has no distributed (the [cluster] extra)")
        pytest.skip("distributed is not installed")
    from distributed import LocalCluster

    # worker processes of one thread each, as docs/guide/maxtext.md asks of a cluster's workers
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def _peaks(stdout: str) -> dict[str, dict[str, object]]:
    return {r["policy"]: {k: v for k, v in r["peak"].items() if k != "compile_seconds"}
            for r in json.loads(stdout)["results"]}


@compiles
def test_a_sweep_on_a_dask_cluster_is_the_sweep_compiled_here(scheduler: str, tmp_path: Path) -> None:
    assert MISSING_GPU_TARGET is None or not LANE
    here = cli("sample_models/mlp.py:loss", *SWEEP, "--jobs", "1", env={"TE_CKPT_AUDIT_CACHE": str(tmp_path / "a")})
    there = cli("sample_models/mlp.py:loss", *SWEEP, "--cluster", scheduler,
                env={"TE_CKPT_AUDIT_CACHE": str(tmp_path / "b")})
    assert here.returncode == there.returncode == 0, there.stderr
    peaks = _peaks(there.stdout)
    assert peaks == _peaks(here.stdout) and all(p["error"] is None for p in peaks.values())


TWO_FACED = """\
import multiprocessing
import jax, jax.numpy as jnp

WIDTH = 16 if multiprocessing.parent_process() is not None else 384  # another program in a worker process


def loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def loss_inputs():
    return jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32), jax.ShapeDtypeStruct((64, WIDTH), jnp.float32)
"""


@compiles
def test_a_cluster_worker_that_compiles_another_program_is_refused(scheduler: str, tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(TWO_FACED)
    run = cli("m.py:loss", *SWEEP, "--cluster", scheduler, cwd=tmp_path, env={"TE_CKPT_AUDIT_CACHE": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    for policy, peak in _peaks(run.stdout).items():
        assert peak["bytes_per_device"] is None
        assert f"a worker process compiled another program for {policy}" in str(peak["error"])


def test_cluster_options_are_checked_first() -> None:
    alone = cli("sample_models/mlp.py:loss", "--cluster", "tcp://127.0.0.1:1")
    assert alone.returncode == 2 and "--cluster is about the step compiled for a GPU" in alone.stderr
    both = cli("sample_models/mlp.py:loss", "--gpu", "h100", "--cluster", "tcp://127.0.0.1:1", "--jobs", "2")
    assert both.returncode == 2 and "--cluster and --jobs both say where policies compile" in both.stderr


@compiles
def test_no_scheduler_at_the_address_is_exit_2_in_one_line(tmp_path: Path) -> None:
    if not HAS_DASK:
        pytest.skip("distributed is not installed")
    nobody = "tcp://127.0.0.1:9"
    run = cli("sample_models/mlp.py:loss", *SWEEP, "--cluster", nobody, env={"TE_CKPT_AUDIT_CACHE": str(tmp_path)})
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and f"--cluster {nobody}: no Dask scheduler answers there" in lines[-1], run.stderr


EDITED = """\
import jax, jax.numpy as jnp


def loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def loss_inputs():
    return jax.ShapeDtypeStruct(({n}, {n}), jnp.float32), jax.ShapeDtypeStruct((64, {n}), jnp.float32)
"""


@compiles
def test_a_long_lived_worker_builds_an_edited_model_anew(scheduler: str, tmp_path: Path) -> None:
    """Issue 38, item 7: the cluster's workers keep the session they built; after the model file is
    edited, they build it again from the file rather than refuse every policy as another program."""
    (tmp_path / "m.py").write_text(EDITED.format(n=16))
    first = cli("m.py:loss", *SWEEP, "--cluster", scheduler, cwd=tmp_path, env={"TE_CKPT_AUDIT_CACHE": str(tmp_path)})
    (tmp_path / "m.py").write_text(EDITED.format(n=48))
    second = cli("m.py:loss", *SWEEP, "--cluster", scheduler, cwd=tmp_path,
                 env={"TE_CKPT_AUDIT_CACHE": str(tmp_path)})
    assert first.returncode == second.returncode == 0, second.stderr
    before, after = _peaks(first.stdout), _peaks(second.stdout)
    assert all(p["error"] is None for p in after.values()), after
    assert all(after[k]["argument_bytes"] > before[k]["argument_bytes"] for k in after)  # type: ignore[operator]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("server", "said"), [
    ([sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"], "no Dask scheduler answers there"),
    ([str(Path(sys.executable).parent / "dask"), "scheduler", "--port", "{port}", "--no-dashboard"],
     "the scheduler has no worker"),
], ids=["http-server", "no-worker"])
def test_a_cluster_that_does_not_answer_is_exit_2_in_bounded_time(server: list[str], said: str) -> None:
    """Issue 38, item 6: something that is not a Dask scheduler at the address (an HTTP server) and
    a scheduler with no worker are each exit 2 in one line; neither hangs (both did)."""
    if not HAS_DASK:
        if LANE:
            pytest.fail("the gpu-target lane has no distributed (the [cluster] extra)")
        pytest.skip("distributed is not installed")
    port = _free_port()
    listening = subprocess.Popen([a.format(port=port) for a in server], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    try:
        time.sleep(4)
        run = cli("sample_models/mlp.py:loss", "--gpu", "h100", "--cluster", f"tcp://127.0.0.1:{port}", timeout=120)
    finally:
        listening.kill()
        listening.wait()
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and said in lines[0], run.stderr


def test_an_empty_cluster_address_is_not_silently_local() -> None:
    empty = cli("sample_models/mlp.py:loss", "--gpu", "h100", "--cluster", "")
    assert empty.returncode == 2 and "--cluster is empty" in empty.stderr
