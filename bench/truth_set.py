"""The truth set: published GPU training runs that happened, rebuilt in JAX (sample_models/llama.py:
MaxText's Llama as its 2024 releases build it) and checked with `--gpu` at the memory fraction
each ran with. A known-good run reported "does not fit" is a bug.

    python bench/truth_set.py            # every run (about 5 minutes on 2 cores)
    python bench/truth_set.py --markdown # the table of docs/guide/gpu.md

Each run is the recipe's own command as te-ckpt-audit takes it: the model, per-device batch,
sequence, remat policy and scan from its command line, its mesh (`ici_fsdp` x `dcn_fsdp` as the
`fsdp` axis, `dcn_data` as `data`), its XLA_FLAGS and XLA_PYTHON_CLIENT_MEM_FRACTION exported
(the flags this XLA no longer has left out: async collectives are on by default now, and
`xla_gpu_graph_level`, `xla_gpu_simplify_all_fp_conversions` and
`xla_gpu_enable_triton_softmax_fusion` are gone), adamw as MaxText's optimizer. Run it with a
Python that has the [gpu] extra.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMON = ("--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false "
          "--xla_gpu_enable_highest_priority_async_stream=true --xla_gpu_enable_pipelined_all_gather=true "
          "--xla_gpu_enable_pipelined_reduce_scatter=true --xla_gpu_enable_pipelined_all_reduce=true "
          "--xla_gpu_enable_while_loop_double_buffering=true --xla_gpu_enable_all_gather_combine_by_dim=false "
          "--xla_gpu_enable_reduce_scatter_combine_by_dim=false --xla_disable_hlo_passes=rematerialization")


def flags(all_reduce: int, all_gather: int, reduce_scatter: int) -> str:
    return (f"{COMMON} --xla_gpu_all_reduce_combine_threshold_bytes={all_reduce} "
            f"--xla_gpu_all_gather_combine_threshold_bytes={all_gather} "
            f"--xla_gpu_reduce_scatter_combine_threshold_bytes={reduce_scatter}")


# (name, source, GPUs, mesh, defines, fraction, XLA_FLAGS)
RUNS = [
    ("MaxText Llama-2 7B, 1 A3 VM", "AI-Hypercomputer/maxtext MaxText/configs/a3/llama_2_7b/1vm.sh @efb6d9e "
     "(README: 492 TFLOP/s per chip)", 8, "data=1,fsdp=8",
     ["model=llama2-7b", "per_device_batch=4", "seq=4096", "remat=minimal_flash", "scan=False"], "0.85",
     flags(134217728, 134217728, 67108864)),
    ("MaxText Llama-2 7B, 16 A3 VMs", "the same recipe's 16vm.sh @fb391a0 (README: 375 TFLOP/s per chip)", 128,
     "data=16,fsdp=8", ["model=llama2-7b", "per_device_batch=4", "seq=4096", "remat=minimal_flash", "scan=False"],
     "0.85", flags(1073741824, 134217728, 134217728)),
    ("JAX-Toolbox MaxText Llama-2 7B", "NVIDIA/JAX-Toolbox docs/frameworks/maxtext/README.md (0.721 s/step)", 8,
     "data=1,fsdp=8", ["model=llama2-7b", "per_device_batch=2", "seq=4096", "remat=minimal_flash", "scan=False"],
     "0.90", flags(1073741824, 1073741824, 134217728)),
    ("NVIDIA DGXC MaxText Llama-3 70B", "NVIDIA/dgxc-benchmarking v25.04.01 maxtext/README_70b.md (15.563 s/step, "
     "128 GPUs)", 128, "data=1,fsdp=128",
     ["model=llama3-70b", "per_device_batch=2", "seq=8192", "remat=save_qkv_proj", "scan=True"], "0.94",
     flags(2147483648, 2147483648, 33554432)),
]


def run(defines: list[str], mesh: str, fraction: str, xla: str, cache: str) -> dict[str, object]:
    argv = [sys.executable, "-m", "te_ckpt_audit_cli", "sample_models/llama.py:loss", "--gpu", "h100", "--mesh", mesh,
            "--optimizer", "adamw", "-p", "as-is", "--jobs", "1", "-f", "json", *[f"-D{d}" for d in defines]]
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(XLA_PYTHON_CLIENT_MEM_FRACTION=fraction, XLA_FLAGS=xla, TE_CKPT_AUDIT_CACHE=cache)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode not in (0, 1):
        sys.exit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="print the table of docs/guide/gpu.md")
    parser.add_argument("--cache", default=None, help="a compile cache folder to keep (default: a new one)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as fresh:
        for name, source, gpus, mesh, defines, fraction, xla in RUNS:
            doc = run(defines, mesh, fraction, xla, args.cache or fresh)
            (result,) = doc["results"]  # type: ignore[index]
            peak = result["peak"]
            policy = next(d.split("=")[1] for d in defines if d.startswith("remat="))
            rows.append((name, source, gpus, mesh, policy, peak["bytes_per_device"], peak["least_fraction"], fraction,
                         peak["fits"]))
            if not args.markdown:
                print(f"{name}: {gpus} GPUs, {mesh}, {policy}: peak {peak['bytes_per_device'] / 2**30:.1f} GiB; "
                      f"least fraction {peak['least_fraction']}; fits at {fraction}: {peak['fits']}", flush=True)
    if args.markdown:
        print("| run (source) | GPUs | mesh | remat_policy | peak per device | least fraction "
              "| fits at the run's own |")
        print("|---|---|---|---|---|---|---|")
        for name, source, gpus, mesh, policy, peak, least, fraction, fits in rows:
            print(f"| {name} ({source}) | {gpus} H100 | `{mesh}` | `{policy}` | {peak / 2**30:.1f} GiB | {least} | "
                  f"{fraction}: {'yes' if fits else 'NO'} |")
    failed = [r[0] for r in rows if not r[-1]]
    if failed:
        print(f"known-good runs reported as not fitting: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
