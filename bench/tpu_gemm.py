"""GEMMs alone on a real TPU chip, by shape and dtype, against the estimate (issue 56, item 2: the
small steps' GEMMs run 0.7-1.5x libtpu's estimate, model by model; which shapes does it misjudge?).

    # on the lent TPU v5e (the device tool), every case in one process:
    PYTHONPATH=. python bench/tpu_gemm.py --on-chip --out $OUT/tpu-v5e-gemms.jsonl
    # here: each GEMM's measured time against today's rule, by shape class
    python bench/tpu_gemm.py --table bench/data/tpu-v5e-gemms.jsonl

Each case is one program of `REPEAT` GEMMs of one shape, each with a weight of its own (no two
kernels the same, nothing else in the program): the shapes the small steps' GEMMs have (an MLP's
layers, attention's scores and its weighted sum over small heads), in float32 and bfloat16. The
chip's profiler times every kernel (bench/tpu_truth.py's trace); each row is one GEMM kernel as
te-ckpt-audit reads it from the chip's own program (libtpu's cycles, its HBM and VMEM bytes, its
FLOPs) with the median of its `REPEAT` kernels' measured time per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

REPEAT = 8
# (M, K, N): x[M, K] @ w[K, N], an MLP's layer and the small models' projections
MATMULS = [(512, 2048, 2048), (1024, 2048, 2048), (2048, 1024, 1024), (4096, 1024, 1024), (1024, 3072, 3072),
           (2048, 256, 1024), (2048, 1024, 256), (8192, 64, 128), (8192, 128, 64), (4096, 64, 64)]
# (batch x heads, sequence, head width): attention's scores q k^T and its weighted sum p v
ATTENTION = [(32, 256, 64), (16, 512, 64), (32, 1024, 16), (64, 256, 16), (8, 2048, 64)]
DTYPES = ("float32", "bfloat16")


def cases() -> list[tuple[str, str, tuple[tuple[int, ...], ...], str]]:
    """(name, einsum, (the input's shape, a weight's shape), dtype) for every case."""
    out = []
    for dtype in DTYPES:
        out += [(f"matmul {m}x{k}x{n} {dtype}", "mk,kn->mn", ((m, k), (k, n)), dtype) for m, k, n in MATMULS]
        out += [(f"scores {b}x{s}x{s}x{d} {dtype}", "bqd,bkd->bqk", ((b, s, d), (b, s, d)), dtype)
                for b, s, d in ATTENTION]
        out += [(f"weighted {b}x{s}x{s}x{d} {dtype}", "bqk,bkd->bqd", ((b, s, s), (b, s, d)), dtype)
                for b, s, d in ATTENTION]
    return out


def on_chip(name: str, spec: str, shapes: tuple[tuple[int, ...], ...], dtype: str) -> list[dict[str, Any]]:
    """One case on the chip: its program traced, each GEMM kernel's measured ns per run beside the
    kernel as te-ckpt-audit reads it; one row for the case (the median kernel)."""
    import tempfile

    import jax
    import jax.numpy as jnp
    from tpu_truth import traced

    from te_ckpt_audit.targets._kernels import VMEM, KernelKind, step_kernels

    x = jnp.ones(shapes[0], dtype)
    ws = [jnp.full(shapes[1], 1.0 + i / 64, dtype) for i in range(REPEAT)]
    compiled = jax.jit(lambda x, *ws: [jnp.einsum(spec, x, w) for w in ws]).lower(x, *ws).compile()
    gemms = [k for k in step_kernels(compiled.as_text() or "", 1, 1, VMEM) if k.kind is KernelKind.GEMM]
    for _ in range(3):
        jax.block_until_ready(compiled(x, *ws))
    runs = 5
    with tempfile.TemporaryDirectory() as trace:
        with jax.profiler.trace(trace):
            for _ in range(runs):
                jax.block_until_ready(compiled(x, *ws))
        took = {op: ns / runs for op, (_, ns) in traced(Path(trace)).get("XLA Ops", {}).items()}
    timed = [k for k in gemms if k.name in took]
    if not timed:
        return [{"case": name, "error": "no GEMM kernel in the trace"}]
    middle = sorted(timed, key=lambda k: took[k.name])[len(timed) // 2]
    return [{"case": name, "dtype": dtype, "shapes": shapes, "kernels": len(timed), "name": middle.name,
             "flops": middle.flops, "bytes": middle.bytes, "vmem_bytes": middle.vmem_bytes, "cycles": middle.cycles,
             "precision": middle.precision, "measured_ns": statistics.median(took[k.name] for k in timed),
             "spread_ns": [min(took[k.name] for k in timed), max(took[k.name] for k in timed)],
             "device": jax.devices()[0].device_kind}]


def table(path: Path) -> None:
    """The Markdown table: each case's GEMM against libtpu's cycles, its roofline and today's rule."""
    from te_ckpt_audit.records import KernelKind
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import Kernel
    from te_ckpt_audit.tpus import tpu_model

    chip = tpu_model("v5e")
    print("| GEMM | measured, us | libtpu / measured | roofline / measured | estimate / measured |")
    print("|---|---:|---:|---:|---:|")
    for r in map(json.loads, path.read_text().splitlines()):
        if "error" in r:
            print(f"| {r['case']} | {r['error']} | | | |")
            continue
        k = Kernel(r["name"], KernelKind.GEMM, r["flops"], r["bytes"], precision=r["precision"], cycles=r["cycles"],
                   vmem_bytes=r["vmem_bytes"])
        measured = r["measured_ns"] * 1e-9
        libtpu, roofline = r["cycles"] / chip.clock_hz, steptime.tpu_roofline(k, chip)
        print(f"| {r['case']} | {measured * 1e6:.1f} | {libtpu / measured:.2f} | {roofline / measured:.2f} | "
              f"{steptime.tpu_timed(k, chip).seconds / measured:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--on-chip", action="store_true", help="run every case on this machine's TPU")
    where.add_argument("--table", type=Path, metavar="ROWS", help="the Markdown table of --on-chip's rows")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--out", type=Path, help="JSON lines, appended")
    args = parser.parse_args()
    if args.table:
        table(args.table)
        return
    for case in cases():
        if args.only not in case[0]:
            continue
        try:
            rows = on_chip(*case)
        except Exception as exc:  # noqa: BLE001 - one case's failure is recorded, the others run
            rows = [{"case": case[0], "error": f"{type(exc).__name__}: {str(exc)[:300]}"}]
        for row in rows:
            print(json.dumps(row), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(row, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
