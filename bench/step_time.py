"""Step time against runs that happened: `te-ckpt-audit maxtext ... --gpu h100 --time` on MaxText's
own configs and train step, set as published H100 runs set them, beside their published step time.

    python bench/step_time.py                 # every row (19: about 25 minutes on 2 cores)
    python bench/step_time.py --rows 1vm,jt   # some of them
    python bench/step_time.py --markdown      # the table of docs/guide/step-time.md
    python bench/step_time.py --search        # the policy x batch search on two rows (issue 40)
    python bench/step_time.py --fit rows.json # TENSOR_EFFICIENCY refitted on the fitted rows of a --json run

Run it with a Python that has the [gpu] extra, MaxText 0.2.5 and cuDNN (the gpu-target lane's venv:
MaxText's `cudnn_flash_jax` attention needs cuDNN to build). Each row is the recipe's own command as
`te-ckpt-audit maxtext` takes it: its config file, its settings (`compile_topology_num_slices`: its
count of 8-GPU hosts), its XLA_FLAGS (less `--xla_dump_to`) and memory fraction.

Published step times. NVIDIA's figures are seconds per step. MaxText's A3 README gives TFLOP/s per
chip, which is seconds per step once the step's FLOPs are counted as MaxText counted them when it
was measured (2024, before MaxText halved causal attention in 2025):

    per device, with B the per-device batch, S the sequence, E the embedding, F the MLP width,
    H and K the query and key-value heads, D the head size, L the layers, V the vocabulary:
    weights   = 3 * (L * (2*B*S*F*E*2 + 2*B*S*F*E + 2*B*S*E*(H + 2K)*D + 2*B*S*E*H*D) + 2*B*S*E*V)
    attention = 3 * L * 4*B*S*S*H*D
    seconds   = (weights + attention) / (published TFLOP/s * 1e12)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from te_ckpt_audit.targets._steptime import TENSOR_EFFICIENCY  # noqa: E402  (the constant the estimate runs at)

ROOT = Path(__file__).resolve().parent.parent
A3 = "AI-Hypercomputer/maxtext configs/gpu/a3/llama_2_7b/README.md"
A3_FLAGS = ("--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_command_buffer='' "
            "--xla_gpu_enable_highest_priority_async_stream=true --xla_gpu_pipeline_all_gather=on "
            "--xla_gpu_pipeline_reduce_scatter=on --xla_gpu_pipeline_all_reduce=on "
            "--xla_gpu_enable_while_loop_double_buffering=true --xla_gpu_enable_all_gather_combine_by_dim=false "
            "--xla_gpu_enable_reduce_scatter_combine_by_dim=false --xla_disable_hlo_passes=rematerialization")


def a3_flags(all_reduce: int, all_gather: int, reduce_scatter: int, cublas: bool = True) -> str:
    gemm = " --xla_gpu_enable_triton_gemm=false" if cublas else ""
    return (f"{A3_FLAGS}{gemm} --xla_gpu_all_reduce_combine_threshold_bytes={all_reduce} "
            f"--xla_gpu_all_gather_combine_threshold_bytes={all_gather} "
            f"--xla_gpu_reduce_scatter_combine_threshold_bytes={reduce_scatter}")


@dataclasses.dataclass(frozen=True)
class Model:
    emb: int
    mlp: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int


LLAMA2_7B = Model(4096, 11008, 32, 32, 128, 32, 32000)
LLAMA3_70B = Model(8192, 28672, 64, 8, 128, 80, 128256)


def maxtext_2024_flops(m: Model, batch: float, seq: int) -> float:
    """One device's FLOPs of one training step as MaxText counted them in 2024 (module docstring)."""
    b, s, e = batch, seq, m.emb
    per_layer = (2 * b * s * m.mlp * e * 2 + 2 * b * s * m.mlp * e + 2 * b * s * e * (m.heads + 2 * m.kv_heads)
                 * m.head_dim + 2 * b * s * e * m.heads * m.head_dim)
    weights = 3 * (m.layers * per_layer + 2 * b * s * e * m.vocab)
    attention = 3 * m.layers * 4 * b * s * s * m.heads * m.head_dim
    return weights + attention


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    name: str
    source: str
    gpus: int
    config: str  # under MaxText's configs/gpu/models
    settings: tuple[str, ...]
    flags: str
    fraction: str
    published_s: float  # seconds per step
    how: str  # how the published figure becomes seconds per step
    extra: tuple[str, ...] = ()  # te-ckpt-audit's own options for the run (its network)
    fitted: bool = False  # one of the rows TENSOR_EFFICIENCY was fitted on: the first of each published table


# Google Cloud's A3 High (a3-highgpu-8g): four 200 Gb/s NICs for the 8 GPUs (GPUDirect-TCPX), 100 Gb/s per GPU
A3_NETWORK = ("--network-gbps", "100")


def _a3(vms: int, tflops: int, flags: str, fitted: bool = False) -> Row:
    seconds = maxtext_2024_flops(LLAMA2_7B, 4, 4096) / (tflops * 1e12)
    return Row(f"{vms}vm", f"MaxText Llama-2 7B, {vms} A3 VM{'s' if vms > 1 else ''}", f"{A3} ({tflops} TFLOP/s/chip)",
               8 * vms, "llama2_7b.yml", (f"dcn_data_parallelism={vms}", "ici_fsdp_parallelism=8",
                                          f"compile_topology_num_slices={vms}"),
               flags, "0.85", seconds, f"{tflops} TFLOP/s per chip over MaxText's 2024 count", A3_NETWORK, fitted)


ROWS = [
    _a3(1, 492, a3_flags(134217728, 134217728, 67108864), fitted=True),
    _a3(2, 422, a3_flags(67108864, 134217728, 67108864)),
    _a3(4, 407, a3_flags(536870912, 134217728, 67108864, cublas=False)),
    _a3(8, 409, a3_flags(1073741824, 134217728, 67108864)),
    _a3(16, 375, a3_flags(1073741824, 134217728, 134217728)),
    Row("jt", "JAX-Toolbox MaxText Llama-2 7B", "NVIDIA/JAX-Toolbox docs/frameworks/maxtext/README.md", 8,
        "llama2_7b.yml", ("per_device_batch_size=2", "ici_fsdp_parallelism=8", "remat_policy=minimal_with_context"),
        a3_flags(1073741824, 1073741824, 134217728), "0.90", 0.721, "published seconds per step", fitted=True),
    Row("dgxc70b", "NVIDIA DGXC MaxText Llama-3 70B", "NVIDIA/dgxc-benchmarking v25.04.01 maxtext/README_70b.md",
        128, "llama3_70b.yml", ("per_device_batch_size=2", "max_target_length=8192", "remat_policy=save_qkv_proj",
                                "scan_layers=True", "ici_fsdp_parallelism=8", "dcn_fsdp_parallelism=16",
                                "compile_topology_num_slices=16"),
        a3_flags(2147483648, 2147483648, 33554432), "0.94", 15.563, "published seconds per step", fitted=True),
]


# NVIDIA's DGXC recipe for MaxText Llama-2 70B (dgxc-benchmarking v25.01, maxtext/README_70b.md and
# configure.sh; MaxText 2024-12-09): FSDP over the 8 GPUs of a node and up to 16 nodes, data parallel
# beyond, batch 2 per GPU, sequence 4096, MaxText's custom remat policy saving the attention
# projections (and, in BF16, the MLP's output projection), FP8 as MaxText's XLA-native quantization
DGXC25 = "NVIDIA/dgxc-benchmarking v25.01 maxtext/README_70b.md"
_L2_70B_BF16 = {64: 6.999, 128: 7.072, 256: 7.153, 512: 7.091, 1024: 7.084, 2048: 7.066}
_L2_70B_FP8 = {64: 4.324, 128: 4.556, 256: 4.959, 512: 5.043, 1024: 5.062, 2048: 4.93}


def _dgxc25(gpus: int, fp8: bool) -> Row:
    nodes = gpus // 8
    fsdp, dp = (nodes, 1) if nodes < 64 else (16, nodes // 16)
    saved = ("query_proj=device", "value_proj=device", "key_proj=device", "qkv_proj=device", "out_proj=device")
    base = 8 * 1073741824  # the recipe's thresholds: 8 GiB over its multiples
    if fp8:
        flags = a3_flags(base // 8, base // 16, base // (2048 if nodes >= 64 else 1024))
    else:
        flags = a3_flags(base // 4, base // 4, base // (512 if nodes >= 64 else 256))
    published = (_L2_70B_FP8 if fp8 else _L2_70B_BF16)[gpus]
    dtype = "FP8" if fp8 else "BF16"
    return Row(f"l2-70b-{dtype.lower()}-{gpus}", f"NVIDIA DGXC MaxText Llama-2 70B {dtype}",
               DGXC25, gpus, "llama2_70b.yml",
               ("per_device_batch_size=2", "max_target_length=4096", "scan_layers=True", "remat_policy=custom",
                *saved, *(() if fp8 else ("mlpwo=device",)), *(("quantization=fp8",) if fp8 else ()),
                "ici_fsdp_parallelism=8", f"dcn_fsdp_parallelism={fsdp}", f"dcn_data_parallelism={dp}",
                f"compile_topology_num_slices={nodes}"),
               flags, "0.94", published, "published seconds per step", fitted=gpus == 64)


ROWS += [_dgxc25(g, fp8) for fp8 in (False, True) for g in (64, 128, 256, 512, 1024, 2048)]


def rescaled(o: dict[str, object], efficiency: float) -> float:
    """A row's estimate (from its --json figures) had its tensor-core kernels run at `efficiency`
    instead of the TENSOR_EFFICIENCY it was made with: their time scales by the ratio; the other
    kernels' and the exposed communication stay (the rows' exposed communication is under 0.3 s)."""
    t = o["time"]
    assert isinstance(t, dict)
    tensor = float(t["gemm_seconds"]) + float(t["attention_seconds"])
    return float(t["seconds"]) + tensor * (o["efficiency"] / efficiency - 1)  # type: ignore[operator]


def refit(out: list[dict[str, object]], rule: str = "log") -> float:
    """The efficiency (a grid of 0.001) that fits the fitted rows best: by least squares of the log of
    estimate over published ("log", the rule the constant is fitted by: their errors' geometric mean
    is 1), or that makes their largest error least ("minimax", the rule of the two-run table before)."""
    fitted = [o for o in out if o["row"]["fitted"]]  # type: ignore[index]
    if not fitted:
        raise SystemExit("step_time: no fitted row in the figures")

    def logs(e: float) -> list[float]:
        return [math.log(rescaled(o, e) / o["row"]["published_s"]) for o in fitted]  # type: ignore[index]

    def badness(e: float) -> float:
        return max(map(abs, logs(e))) if rule == "minimax" else sum(x * x for x in logs(e))

    return min((k / 1000 for k in range(300, 1001)), key=badness)


def configs_dir() -> Path:
    found = subprocess.run([sys.executable, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
                           capture_output=True, text=True, check=True)
    return Path(found.stdout.strip().splitlines()[-1], "configs", "gpu", "models")


def _maxtext(row: Row, cache: str, *args: str) -> tuple[dict[str, object], float]:
    """`te-ckpt-audit maxtext` on the row's config and settings, in its environment, with `args`:
    its JSON and the seconds it took."""
    argv = [sys.executable, "-m", "te_ckpt_audit_cli", "maxtext", str(configs_dir() / row.config), *row.settings,
            "--gpu", "h100", *args, *row.extra, "-f", "json"]
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env.update(XLA_PYTHON_CLIENT_MEM_FRACTION=row.fraction, XLA_FLAGS=row.flags, TE_CKPT_AUDIT_CACHE=cache)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=7200)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise RuntimeError(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), time.perf_counter() - start


def estimate(row: Row, cache: str) -> dict[str, object]:
    doc, wall = _maxtext(row, cache, "--time")
    result = doc["results"][0]  # type: ignore[index]
    return {"time": result["time"], "fits": result["peak"]["fits"], "wall": wall}


# `--search`: the remat policies `maxtext --recommend --maximize throughput` searches for a row:
# the recipe's own and two around it (one saving more, one recomputing everything)
SEARCHED = {"1vm": ("minimal_with_context", "save_dot_except_mlp", "full"),
            "jt": ("minimal_with_context", "save_dot_except_mlp", "full")}
SEARCH_COMPILES = 8


def search(row: Row, cache: str) -> dict[str, object]:
    """`maxtext --recommend --maximize throughput` at the row's own settings: the pair it picks."""
    policies = [arg for p in SEARCHED[row.key] for arg in ("-p", p)]
    doc, wall = _maxtext(row, cache, "--recommend", "--maximize", "throughput", *policies, "--max-compiles",
                         str(SEARCH_COMPILES))
    return {"throughput": doc["throughput"], "wall": wall}


def search_table(rows: list[Row], cache: str) -> str:
    """The pair each row's search picks, beside the published setting (its policy, its batch)."""
    lines = ["| run | published setting | its estimate, tokens/s/GPU | published tokens/s/GPU | search's pick | "
             "its estimate, tokens/s/GPU | points compiled |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        found = search(row, cache)["throughput"]
        assert isinstance(found, dict)
        for p in found["points"]:  # every point the search compiled, on stderr
            rate = "n/a" if p.get("throughput") is None else f"{p['throughput']:,.0f} tokens/s/GPU"
            print(f"{row.key}: {p['policy']}, batch {p['value']}: {'fits' if p['fits'] else 'does not fit'}, {rate}",
                  file=sys.stderr)
        settings = dict(s.split("=", 1) for s in row.settings)
        policy = settings.get("remat_policy", "minimal_with_context")  # llama2_7b.yml's own
        batch = int(float(settings.get("per_device_batch_size", "4")))
        seq = int(settings.get("max_target_length", "4096"))
        own = next((p for p in found["points"] if p["policy"] == policy and p["value"] == batch), None)
        best = found["best"]
        published = batch * seq / row.published_s
        pick = "none fits" if best is None else f"{best['policy']}, batch {best['value']}"
        lines.append(f"| {row.name} | {policy}, batch {batch} | "
                     f"{'n/a' if own is None else format(own['throughput'], ',.0f')} | {published:,.0f} | {pick} | "
                     f"{'n/a' if best is None else format(best['throughput'], ',.0f')} | {len(found['points'])}"
                     f"{' (bounded)' if found['bounded'] else ''} |")
    return "\n".join(lines)


def summary(out: list[dict[str, object]], seconds: list[float] | None = None) -> list[str]:
    """The errors' median and worst: every row, the rows not fitted, their FP8 ones, and the signs."""
    seconds = seconds or [float(o["time"]["seconds"]) for o in out]  # type: ignore[index]
    err = [s / float(o["row"]["published_s"]) - 1 for o, s in zip(out, seconds, strict=True)]  # type: ignore[index]
    held = [(e, o) for e, o in zip(err, out, strict=True) if not o["row"]["fitted"]]  # type: ignore[index]
    fp8 = [e for e, o in held if "FP8" in str(o["row"]["name"])]  # type: ignore[index]
    lines = [f"All {len(err)} runs: median absolute error {statistics.median(map(abs, err)):.1%}, worst "
             f"{max(map(abs, err)):.1%}."]
    for what, es in (("runs not fitted on", [e for e, _ in held]), ("FP8 runs among them", fp8)):
        if es:
            lines.append(f"The {len(es)} {what}: median {statistics.median(map(abs, es)):.1%}, worst "
                         f"{max(map(abs, es)):.1%} ({sum(e > 0 for e in es)} slower than published, "
                         f"{sum(e < 0 for e in es)} faster).")
    return lines


def show_fit(out: list[dict[str, object]]) -> int:
    for rule in ("log", "minimax"):
        efficiency = refit(out, rule)
        seconds = [rescaled(o, efficiency) for o in out]
        print(f"TENSOR_EFFICIENCY refitted by the {rule} rule: {efficiency:.3f}")
        for o, s in zip(out, seconds, strict=True):
            row = o["row"]
            assert isinstance(row, dict)
            print(f"  {row['key']:<18} {'fitted' if row['fitted'] else '':<6} {s:8.3f} s  published "
                  f"{row['published_s']:.3f} s  {s / row['published_s'] - 1:+.1%}")
        print("\n".join(summary(out, seconds)))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="", help="comma-separated row keys (default: all)")
    parser.add_argument("--cache", default=None, help="a compile cache folder to keep (default: a new one)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--markdown", action="store_true", help="print the docs' table")
    parser.add_argument("--fit", default=None, metavar="JSON", help="refit TENSOR_EFFICIENCY on the fitted rows "
                        "of a --json file (by both rules) and show every row's error at it")
    parser.add_argument("--search", action="store_true", help="rerun the policy x batch search on the rows "
                        f"{', '.join(SEARCHED)} (maxtext --recommend --maximize throughput) and print its table")
    args = parser.parse_args()
    if args.fit:
        return show_fit(json.loads(Path(args.fit).read_text()))
    chosen = [r for r in ROWS if not args.rows or r.key in args.rows.split(",")]
    cache = args.cache or tempfile.mkdtemp(prefix="te-ckpt-audit-step-time-")
    if args.search:
        print(search_table([r for r in chosen if r.key in SEARCHED], cache))
        return 0
    out = []
    failed = []
    for row in chosen:
        try:
            found = estimate(row, cache)
        except RuntimeError as exc:  # XLA ended the compile: said, and the other rows go on
            print(f"{row.name}: {exc}", file=sys.stderr)
            failed.append(row.name)
            continue
        t = found["time"]
        assert isinstance(t, dict)
        error = (t["seconds"] - row.published_s) / row.published_s
        out.append({"row": dataclasses.asdict(row), **found, "error": error, "efficiency": TENSOR_EFFICIENCY})
        print(f"{row.name}: estimate {t['seconds']:.3f} s, published {row.published_s:.3f} s, error {error:+.1%} "
              f"({found['wall']:.0f} s)", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    lines = ["| run | GPUs | published s/step | source | estimate s/step | exposed comm | TFLOP/s per GPU (estimate) "
             "| error |", "|---|---|---|---|---|---|---|---|"]
    for o in out:
        row, t = o["row"], o["time"]
        assert isinstance(row, dict) and isinstance(t, dict)
        mark = " (fitted)" if row["fitted"] else ""
        lines.append(f"| {row['name']}{mark} | {row['gpus']} H100 | {row['published_s']:.3f} ({row['how']}) | "
                     f"{row['source']} | {t['seconds']:.3f} | {t['exposed_communication_seconds']:.3f} | "
                     f"{t['tflops_per_gpu']:.0f} | {float(o['error']):+.1%} |")
    if out:
        lines += ["", *summary(out)]
    lines += [f"{name}: no estimate (the compile failed; see stderr)." for name in failed]
    print("\n".join(lines) if args.markdown else json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
