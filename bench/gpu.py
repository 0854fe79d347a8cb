"""Benchmark of `--gpu`: the training step compiled for H100s on this machine (no GPU), each case a
whole `te-ckpt-audit` process against a baseline measured in the same run: one plain JAX compile
of the same model's step (`jax.jit(jax.value_and_grad(loss))`, lowered for the same GPU topology
with the model's own shardings, no policy), in a fresh process too.

    python bench/gpu.py            # scanned GPT-24; GPT-3 175B shapes scanned on 8, 64, 512 GPUs
    python bench/gpu.py --quick    # without the 512-GPU case

Run it with a Python that has the [gpu] extra (jax 0.12, Linux x86_64). Each case compiles its
policies one after another (--jobs 1) with an empty compile cache. Printed: wall time and peak RSS
of both, the seconds each policy's compiles took (Triton and cuBLAS, plus one more where XLA
rematerialized), and the ratio of one policy's compiles to the plain compile.
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

# (name, target, defines, mesh, policies)
GPT3 = ["heads=96", "hidden=12288", "seq=2048", "layers=96"]
CASES = [
    ("scanned GPT-24, 1 GPU", "sample_models/gpt.py:loss", ["layers=24"], None,
     ["nothing_saveable", "checkpoint_dots", "everything_saveable"]),
    ("GPT-3 175B scanned, 8 GPUs", "sample_models/megatron_tp.py:scanned", [*GPT3, "batch=1"], "data=1,model=8",
     ["nothing_saveable", "checkpoint_dots"]),
    ("GPT-3 175B scanned, 64 GPUs", "sample_models/megatron_tp.py:scanned", [*GPT3, "batch=8"], "data=8,model=8",
     ["nothing_saveable", "checkpoint_dots"]),
    ("GPT-3 175B scanned, 512 GPUs", "sample_models/megatron_tp.py:scanned", [*GPT3, "batch=64"], "data=64,model=8",
     ["nothing_saveable", "checkpoint_dots"]),
]

# The baseline: the model's own step, compiled once for the same topology by hand.
PLAIN = r"""
import json, resource, sys, time
start = time.perf_counter()
import jax
jax.config.update("jax_platforms", "cpu")
from jax.experimental import topologies
from te_ckpt_audit import _jax_compat as jc
from te_ckpt_audit._loading import find_inputs_callable, load_target, parse_overrides
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
leaves, tree = jax.tree.flatten(args)
arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.ShapeDtypeStruct)]
floats = [i for i in arrays if jax.numpy.issubdtype(leaves[i].dtype, jax.numpy.floating)]
def step(*xs):
    def of(fl):
        full = list(leaves)
        for i, x in zip(arrays, xs):
            full[i] = x
        for i, x in zip(floats, fl):
            full[i] = x
        return loaded.fn(*jax.tree.unflatten(tree, full))
    return jax.value_and_grad(of)([xs[arrays.index(i)] for i in floats])
specs = [leaves[i] for i in arrays]
if mesh_text == "-":
    from jax.sharding import NamedSharding, PartitionSpec
    specs = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, PartitionSpec())) for s in specs]
with jax.sharding.set_mesh(mesh) if mesh_text != "-" else __import__("contextlib").nullcontext():
    lowered = jax.jit(step).lower(*specs)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="leave out the 512-GPU case")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    print(f"python {sys.version.split()[0]}; H100 SXM target; {os.cpu_count()} cores; --jobs 1, empty compile cache")
    for name, target, defines, mesh, policies in CASES[:-1] if args.quick else CASES:
        plain_s, plain_rss, out = _run([sys.executable, "-c", PLAIN, target, *defines, mesh or "-"], env)
        plain = json.loads(out.strip().splitlines()[-1])
        with tempfile.TemporaryDirectory() as cache:
            argv = [sys.executable, "-m", "te_ckpt_audit_cli", target, "--gpu", "h100", "--jobs", "1", "-f", "json"]
            argv += [f"-D{d}" for d in defines] + (["--mesh", mesh] if mesh else [])
            argv += [a for p in policies for a in ("-p", p)]
            ours_s, ours_rss, out = _run(argv, {**env, "TE_CKPT_AUDIT_CACHE": cache})
        doc = json.loads(out)
        compiles = [r["peak"]["compile_seconds"] for r in doc["results"]]
        per_policy = sum(compiles) / len(compiles)
        print(f"\n{name}: {len(policies)} policies")
        print(f"  plain JAX compile (baseline): {plain_s:6.1f} s wall, compile {plain['compile_s']:.1f} s, "
              f"{plain_rss:.0f} MiB RSS, peak {plain['peak'] / 2**30:.2f} GiB")
        print(f"  te-ckpt-audit --gpu:          {ours_s:6.1f} s wall, {ours_rss:.0f} MiB RSS; "
              f"compile s per policy {', '.join(f'{c:.1f}' for c in compiles)}")
        for r in doc["results"]:
            p = r["peak"]
            print(f"    {r['policy']:<20} peak {p['bytes_per_device'] / 2**30:8.2f} GiB per device "
                  f"(min {p['bytes_per_device_min'] / 2**30:.2f}); fits {p['fits']}; "
                  f"XLA remat {p['xla_rematerialized']}")
        print(f"  ratio: one policy's compiles / the plain compile = {per_policy / plain['compile_s']:.2f}x; "
              f"wall {ours_s / plain_s:.2f}x for {len(policies)} policies; RSS {ours_rss / plain_rss:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
