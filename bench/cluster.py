"""Benchmark of `--cluster`: a sweep of policies compiled for H100s (`--gpu h100`, both GEMM
backends each), as a whole `te-ckpt-audit` process, on a 4-worker Dask `LocalCluster` this
script starts (worker processes of one thread), against the baseline measured in the same run:
the same sweep compiled in the one process (`--jobs 1`). Each run starts with an empty compile
cache; the cluster is started (and its workers have imported JAX) before the clock starts, as a
running cluster would be.

    python bench/cluster.py              # the scanned GPT-24 sample, six policies
    python bench/cluster.py --runs 3     # the median of three runs of each (default: 1)

Run it with a Python that has the [gpu] and [cluster] extras. On a machine of few cores the
workers share them: the ratio is what this machine gives, not a cluster of machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ["nothing_saveable", "everything_saveable", "checkpoint_dots", "checkpoint_dots_and_te_gemms",
            "dots_and_te_gemms_with_no_batch_dims", "te_gemms_saveable"]
SWEEP = ["sample_models/gpt.py:loss", "-D", "layers=24", "--gpu", "h100", "-f", "json",
         *[a for p in POLICIES for a in ("-p", p)]]


def _wall(extra: list[str]) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TE_CKPT_AUDIT_CACHE": cache}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", *SWEEP, *extra], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the sweep failed: {done.stderr.strip().splitlines()[-1:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the workers' JAX: no CUDA driver here (the plugin would complain)
    from distributed import Client, LocalCluster

    here = statistics.median(_wall(["--jobs", "1"]) for _ in range(args.runs))
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            client.run(lambda: __import__("jax").numpy.zeros(1).block_until_ready())  # the workers warm
        there = statistics.median(_wall(["--cluster", cluster.scheduler_address]) for _ in range(args.runs))
    print(f"sweep: {len(POLICIES)} policies of {SWEEP[0]} ({' '.join(SWEEP[1:3])}) for h100, both GEMM backends each")
    print(f"baseline, one process (--jobs 1): {here:.1f} s")
    print(f"{args.workers}-worker LocalCluster (--cluster): {there:.1f} s")
    print(f"cluster / one process: {there / here:.2f}x (on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
