"""`--cluster ADDRESS`: a sweep's compiles on a running Dask cluster (issue 28), against a
`LocalCluster` this test starts. The same figures as compiling here, and a worker that traced
another program refused as `--jobs` refuses it. The gpu-target lane has `distributed` (the
[cluster] extra) and every test here must run there."""

from __future__ import annotations

import importlib.util
import json
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
