"""Per-device audits on a mesh at GPT-3 175B scale: time and peak RSS against a same-run baseline.

    python bench/mesh.py            # all rows but the slowest (a few minutes on 2 cores)
    python bench/mesh.py --full     # also the unrolled stack compiled for 512 devices (~4 more minutes)
    python bench/mesh.py --quick    # scanned stack only, 8 and 512 devices

The model is `sample_models/megatron_tp.py` with GPT-3 175B's shapes: 96 layers, hidden 12288, 96
heads, sequence 2048, global batch 64, bf16, ShapeDtypeStructs only (nothing is allocated), the
layers in one `lax.scan` (`scanned`) or unrolled (`loss`). Every row is a fresh process auditing
the policies `none` and `checkpoint_dots`; its baseline is the same audit without a mesh (global
bytes only), measured in the same run.

- compiled: `data=D,model=8` for D in 1, 8, 64 (8, 64 and 512 virtual CPU devices), shardings from
  XLA's SPMD partitioner (one compile per policy);
- abstract: the same model in explicit-sharding mode traced on an abstract mesh of 512 devices,
  shardings read from the avals: no devices, no compile. For the unrolled stack compiling for 512
  devices takes minutes; the abstract mesh gives the same bytes in seconds.

Printed per row: seconds and peak RSS, their ratios to the baseline, and the per-device activation
bytes of `none` against Korthikanti et al. 2022, Table 2 (96 layers x the per-layer formula).
Timings on a shared 2-core machine are noisy; the same-run baseline is the point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ["none", "checkpoint_dots"]
LAYERS, SEQ, BATCH, HIDDEN, HEADS = 96, 2048, 64, 12288, 96  # megatron_tp.scanned_inputs' defaults
SHAPES = [f"layers={LAYERS}", f"seq={SEQ}", f"batch={BATCH}", f"hidden={HIDDEN}", f"heads={HEADS}"]
MODELS = {"scanned": "sample_models/megatron_tp.py:scanned", "unrolled": "sample_models/megatron_tp.py:loss"}

_RUN = """
import json, resource, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
from te_ckpt_audit import audit_target
from te_ckpt_audit.render import render_json
report = audit_target({target!r}, {policies!r}, mesh={mesh!r}, shardings={shardings!r}, defines={defines!r})
render_json(report)
none = report.result("none").totals
print(json.dumps({{"seconds": time.perf_counter() - t0,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "activation": none.activation_bytes, "per_device": none.activation_bytes_per_device,
                  "source": report.sharding_source}}))
"""


def paper_bytes(t: int, b: int, sp: bool) -> int:
    """96 layers x Table 2's per-device bytes per layer (tensor parallel t, local batch b)."""
    s, h, a = SEQ, HIDDEN, HEADS
    per_layer = s * b * h * ((Fraction(34, t) if sp else 10 + Fraction(24, t)) + Fraction(5 * a * s, h * t))
    assert per_layer.denominator == 1
    return LAYERS * int(per_layer)


def run(model: str, mesh: str | None, sp: bool = False, shardings: str = "compiled") -> dict[str, Any]:
    code = _RUN.format(root=str(ROOT), target=MODELS[model], policies=POLICIES, mesh=mesh, shardings=shardings,
                       defines=[*SHAPES, f"sp={sp}"])
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the audit provides the devices
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{model} {mesh}: exit {out.returncode}\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="scanned stack, 8 and 512 devices only")
    parser.add_argument("--full", action="store_true", help="also the unrolled stack compiled for 512 devices")
    args = parser.parse_args()
    rows = [  # model, data-parallel size (tensor parallel 8), sequence parallel, shardings
        ("scanned", 1, False, "compiled"),
        ("scanned", 64, False, "compiled"),
    ]
    if not args.quick:
        rows[1:1] = [("scanned", 8, False, "compiled")]
        rows += [("scanned", 64, True, "compiled"), ("scanned", 64, False, "abstract")]
        rows += [("unrolled", 64, False, "abstract")]
    if args.full:
        rows += [("unrolled", 64, False, "compiled")]
    header = f"{'model':<9}{'mesh':<20}{'devices':>8} {'shardings':<10}{'seconds':>8}{'x base':>7}"
    header += f"{'RSS MiB':>8}{'x base':>7}"
    print(header + "  none: bytes per device")
    print("-" * (len(header) + 40))
    bases: dict[str, dict[str, Any]] = {}
    for model, data, sp, source in rows:
        if model not in bases:
            base = bases[model] = run(model, None)
            print(f"{model:<9}{'(none)':<20}{1:>8} {'-':<10}{base['seconds']:>8.1f}{1:>7.2f}{base['rss_mib']:>8.0f}"
                  f"{1:>7.2f}  {base['activation']:,} B global")
        base = bases[model]
        mesh = f"data={data},model=8"
        r = run(model, mesh, sp, source)
        paper = paper_bytes(8, BATCH // data, sp)
        verdict = "= paper" if r["per_device"] == paper else f"!= paper {paper:,}"
        print(f"{model:<9}{mesh + (' +sp' if sp else ''):<20}{data * 8:>8} {r['source']:<10}{r['seconds']:>8.1f}"
              f"{r['seconds'] / base['seconds']:>7.2f}{r['rss_mib']:>8.0f}{r['rss_mib'] / base['rss_mib']:>7.2f}"
              f"  {r['per_device']:,} B {verdict}")


if __name__ == "__main__":
    main()
