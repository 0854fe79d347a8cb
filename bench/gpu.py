"""Benchmark of `--gpu`: one policy's training step compiled for H100s on this machine (no GPU),
as a whole `te-ckpt-audit` process, against a baseline measured in the same run: one plain JAX
compile of the same step (`jax.jit(jax.value_and_grad(loss))` over the trained argument, the
model's own checkpoints as they are, lowered for the same GPU topology with the model's own
shardings), in a fresh process too. The audit runs `-p as-is`, the same program.

    python bench/gpu.py            # scanned GPT-24; GPT-3 175B shapes scanned on 8, 64, 512 GPUs
    python bench/gpu.py --quick    # without the 512-GPU case
    python bench/gpu.py --runs 3   # the median of three runs of each (default: 3)
    python bench/gpu.py --time     # also the same run with --time (issue 39: at most 1.6x the --gpu run)

Run it with a Python that has the [gpu] extra (jax 0.12, Linux x86_64). Each run starts with an
empty compile cache. Printed per case: the median wall time and peak RSS of both, the seconds
each backend's compile took, and the ratio of one policy's --gpu run to the plain compile (the
goal of issue 26: at most 1.3x on a 2-core machine; it was 2.06x when the two GEMM backends
compiled one after the other).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, target, defines, mesh)
GPT3 = ["heads=96", "hidden=12288", "seq=2048", "layers=96"]
CASES = [
    ("scanned GPT-24, 1 GPU", "sample_models/gpt.py:loss", ["layers=24"], None),
    ("Llama-2 7B scanned (remat full), FSDP over 8 GPUs", "sample_models/llama.py:loss",
     ["model=llama2-7b", "per_device_batch=4", "seq=4096", "remat=full", "scan=True"], "data=1,fsdp=8"),
    ("GPT-3 175B scanned, 8 GPUs", "sample_models/megatron_tp.py:scanned", [*GPT3, "batch=1"], "data=1,model=8"),
    ("GPT-3 175B scanned, 64 GPUs", "sample_models/megatron_tp.py:scanned", [*GPT3, "batch=8"], "data=8,model=8"),
    ("GPT-3 175B scanned, 512 GPUs", "sample_models/megatron_tp.py:scanned", [*GPT3, "batch=64"], "data=64,model=8"),
]

# The baseline: the model's own step, compiled once for the same topology by hand.
PLAIN = r"""
import json, resource, sys, time
start = time.perf_counter()
import jax
jax.config.update("jax_platforms", "cpu")
from jax.experimental import topologies
from te_ckpt_audit import _jax_compat as jc
from te_ckpt_audit.trace._loading import find_inputs_callable, load_target, parse_overrides
from te_ckpt_audit.gpus import GpuRequest, gpu_model
from te_ckpt_audit.config import parse_defines

target, defines, mesh_text = sys.argv[1], sys.argv[2:-1], sys.argv[-1]
request = GpuRequest(gpu_model("h100"))
axes = [tuple(a.split("=")) for a in mesh_text.split(",")] if mesh_text != "-" else [("gpu", "1")]
devices = 1
for _, size in axes:
    devices *= int(size)
topology = jc.cuda_topology(request.model.config_text(), request.topology(devices))
mesh = topologies.make_mesh(topology, tuple(int(s) for _, s in axes), tuple(n for n, _ in axes))
loaded = load_target(target)
fn, _ = find_inputs_callable(loaded, None)
kwargs = parse_overrides(fn, parse_defines(defines))
if mesh_text != "-":
    kwargs["mesh"] = mesh
args = fn(**kwargs)
args = args if isinstance(args, tuple) else (args,)
# the user's step: argument 0 trained (jax.grad's convention), the others the batch; non-array
# leaves (a config) closed over
from jax.sharding import NamedSharding, PartitionSpec
def on_gpu(leaf):
    spec = leaf.sharding.spec if isinstance(getattr(leaf, "sharding", None), NamedSharding) else PartitionSpec()
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))
leaves, tree = jax.tree.flatten(args)
first = len(jax.tree.leaves(args[0]))  # argument 0's leaves come first
dynamic = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.ShapeDtypeStruct)]
trained, batch = [i for i in dynamic if i < first], [i for i in dynamic if i >= first]
def step(params, data):
    full = list(leaves)
    for i, x in [*zip(trained, params), *zip(batch, data)]:
        full[i] = x
    return loaded.fn(*jax.tree.unflatten(tree, full))
with jax.sharding.set_mesh(mesh) if mesh_text != "-" else __import__("contextlib").nullcontext():
    lowered = jax.jit(jax.value_and_grad(step), donate_argnums=0).lower(
        [on_gpu(leaves[i]) for i in trained], [on_gpu(leaves[i]) for i in batch])
t = time.perf_counter()
compiled = lowered.compile()
compile_s = time.perf_counter() - t
peak = compiled.memory_analysis().peak_memory_in_bytes
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": time.perf_counter() - start, "compile_s": compile_s, "rss_mib": rss, "peak": peak}))
"""


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB, this process and its children) and stdout of one process."""
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "RSS %M", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1) or not done.stdout.strip():
        sys.exit(f"failed: {' '.join(argv)}\n{done.stderr[-2000:]}")
    rss = max((int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("RSS ")), default=0)
    return seconds, rss / 1024, done.stdout


def _median_run(argv: list[str], env: dict[str, str], runs: int, fresh_cache: bool) -> tuple[float, float, str]:
    results = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            results.append(_run(argv, {**env, "TE_CKPT_AUDIT_CACHE": cache} if fresh_cache else env))
    results.sort(key=lambda r: r[0])
    return results[len(results) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="leave out the 512-GPU case")
    parser.add_argument("--runs", type=int, default=3, help="runs of each command; the median is printed")
    parser.add_argument("--only", type=int, default=None, help="run only case N (0-based)")
    parser.add_argument("--time", action="store_true", help="also run each case with --time, against --gpu alone")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    print(f"python {sys.version.split()[0]}; H100 SXM target; {os.cpu_count()} cores; one policy (as-is), "
          f"--jobs 1, an empty compile cache; median of {args.runs} runs")
    cases = CASES[:-1] if args.quick else CASES
    if args.only is not None:
        cases = [CASES[args.only]]
    for name, target, defines, mesh in cases:
        plain_s, plain_rss, out = _median_run([sys.executable, "-c", PLAIN, target, *defines, mesh or "-"], env,
                                              args.runs, False)
        plain = json.loads(out.strip().splitlines()[-1])
        argv = [sys.executable, "-m", "te_ckpt_audit_cli", target, "--gpu", "h100", "--jobs", "1", "-f", "json",
                "-p", "as-is"]
        argv += [f"-D{d}" for d in defines] + (["--mesh", mesh] if mesh else [])
        ours_s, ours_rss, out = _median_run(argv, env, args.runs, True)
        (result,) = json.loads(out)["results"]
        p = result["peak"]
        print(f"\n{name}")
        print(f"  plain JAX compile (baseline): {plain_s:6.1f} s wall, compile {plain['compile_s']:.1f} s, "
              f"{plain_rss:.0f} MiB RSS, peak {plain['peak'] / 2**30:.2f} GiB")
        print(f"  te-ckpt-audit --gpu -p as-is: {ours_s:6.1f} s wall, {ours_rss:.0f} MiB RSS; compiles "
              f"{p['compile_seconds']:.1f} s ({', '.join(p['backends'])} at once)")
        low, high = p["bytes_per_device_min"] / 2**30, p["bytes_per_device"] / 2**30
        print(f"    peak {high:.2f} GiB per device (min {low:.2f}); "
              f"fits {p['fits']}; least fraction {p['least_fraction']}; XLA remat {p['xla_rematerialized']}")
        print(f"  ratio: one policy's --gpu run / the plain compile = {ours_s / plain_s:.2f}x wall "
              f"(goal <= 1.3x); RSS {ours_rss / plain_rss:.2f}x")
        if args.time:
            timed_s, timed_rss, out = _median_run([*argv, "--time"], env, args.runs, True)
            t = json.loads(out)["results"][0]["time"]
            print(f"  te-ckpt-audit --gpu --time: {timed_s:6.1f} s wall, {timed_rss:.0f} MiB RSS; estimate "
                  f"{t['seconds']:.3g} s per step (its compile {t['compile_seconds']:.1f} s)")
            print(f"  ratio: --gpu --time / --gpu = {timed_s / ours_s:.2f}x wall (goal <= 1.6x); "
                  f"RSS {timed_rss / ours_rss:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
