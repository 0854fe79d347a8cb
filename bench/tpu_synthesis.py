"""Issue 58's proof on the chip: the pick of `--maximize throughput --synthesize` against the pick of
`--maximize throughput` alone (the frontier's policies searched with the batch), both run on a real
TPU v5e as a training loop runs them.

    # here (or on the chip's host, deviceless), both searches of each model, the picks to run:
    JAX_PLATFORMS=cpu PYTHONPATH=. python bench/tpu_synthesis.py --plan bench/data/tpu-v5e-synthesis-plan.json
    # on the lent TPU v5e (the device tool), the two picks of every model, in one process:
    PYTHONPATH=. python bench/tpu_synthesis.py --on-chip bench/data/tpu-v5e-synthesis-plan.json \\
        --out $OUT/tpu-v5e-synthesis-chip.jsonl
    # the table for the README and docs/guide/choosing.md:
    python bench/tpu_synthesis.py --table bench/data/tpu-v5e-synthesis-chip.jsonl

The plan is te-ckpt-audit's own: `recommend --tpu v5e --optimizer adamw --maximize throughput`
with and without `--synthesize`, each at most `--max-compiles` points. On the chip each pick is the
training step te-ckpt-audit compiles (`_step.training_step`, AdamW), its steps dispatched back to
back (bench/tpu_small.py's `_pipelined`: 3 of warm-up, then runs of about half a second, the
median of 5). Goals (issue 58): every synthesized pick runs; its measured throughput is at least
the best preset's on every model and 5% above it on at least two; the predicted order of the two
is the chip's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# (case, target, defines, batch keyword): a MaxText-named Llama, a GPT with full float32 attention
# (with its names, and without any: the tool names its matmul lines), a ResNet-34-style convnet with
# no checkpoint and no names, a top-1 MoE transformer with TE-style GEMMs and names, a wide MLP; each
# at a depth the chip's host compiles in seconds
CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("llama-1b 6 layers", "sample_models/llama.py:loss", {"model": "llama-1b", "layers": 6, "seq": 1024,
                                                           "per_device_batch": 4}, "per_device_batch"),
    ("gpt 6 layers f32 attention", "sample_models/gpt.py:loss", {"layers": 6, "seq": 1024, "d_model": 1024,
                                                                 "heads": 16, "d_ff": 4096, "vocab": 32768,
                                                                 "batch": 4}, "batch"),
    ("gpt 6 layers f32 attention, no names", "sample_models/gpt.py:loss",
     {"layers": 6, "seq": 1024, "d_model": 1024, "heads": 16, "d_ff": 4096, "vocab": 32768, "batch": 4,
      "named": False}, "batch"),
    *((f"gpt 4 layers seq 2048 f32 attention{', no names' if not named else ''}", "sample_models/gpt.py:loss",
       {"layers": 4, "seq": 2048, "d_model": 1024, "heads": 16, "d_ff": 4096, "vocab": 32768, "batch": 2,
        **({} if named else {"named": False})}, "batch") for named in (True, False)),
    ("convnet resnet-34 layout, no names", "bench/models/convnet.py:loss", {"batch": 64, "image": 64}, "batch"),
    ("moe 4 layers bf16, te stand-in", "sample_models/te_transformer.py:loss",
     {"layers": 4, "seq": 1024, "d_model": 1024, "heads": 16, "d_ff": 4096, "experts": 8, "vocab": 32768,
      "dtype": "bfloat16", "batch": 4}, "batch"),
    ("mlp wide", "sample_models/mlp.py:loss", {"d_in": 4096, "d_hidden": 16384, "d_out": 4096, "batch": 4096},
     "batch"),
]


def best_preset(target: str, defines: dict[str, Any], keyword: str, request: Any, max_compiles: int) -> dict[str, Any]:
    """Issue 58's baseline: the presets `recommend` knows (no name set of the byte frontier), searched
    with the batch as `--maximize throughput` searches, at most `max_compiles` points."""
    from te_ckpt_audit import registry
    from te_ckpt_audit._session import Session
    from te_ckpt_audit.search._throughput import target_search

    begin = time.perf_counter()
    given = {k: str(v) for k, v in defines.items()}
    presets = registry.presets()  # what recommend searches on its own (offloading aside): its `presets`

    def build(value: int) -> Session:
        return Session.of_target(target, defines={**given, keyword: str(value)})

    found = target_search(build, build(int(defines[keyword])), presets, keyword, int(defines[keyword]), request,
                          max_compiles=max_compiles)
    best = found.best
    return {"policy": None if best is None else best.policy, "value": None if best is None else best.value,
            "estimated_seconds": None if best is None else best.seconds, "compiles": len(found.points),
            "presets": list(presets), "wall_seconds": round(time.perf_counter() - begin, 1)}


def plan(out: Path, max_compiles: int, only: str = "", presets_only: bool = False) -> None:
    """Both searches of every case, deviceless: the two picks and what the estimate says of them;
    and the best preset's pick (`best_preset`). `presets_only`: that pick alone, added to a plan."""
    from te_ckpt_audit import recommend_target
    from te_ckpt_audit.optimizers import Optimizer
    from te_ckpt_audit.tpus import TpuRequest, parse_tpu

    request = TpuRequest(parse_tpu("v5e"), Optimizer.ADAMW)
    rows = json.loads(out.read_text()) if out.exists() else []  # a plan of other models kept: --only adds one
    for name, target, defines, keyword in (c for c in CASES if only in c[0]):
        if presets_only:
            row = next(r for r in rows if r["case"] == name)
            row["best_preset"] = best_preset(target, defines, keyword, request, max_compiles)
            print(name, "best preset", row["best_preset"], flush=True)
            out.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")  # each model's kept as it ends
            continue
        rows = [r for r in rows if r["case"] != name]
        picks: dict[str, Any] = {"best_preset": best_preset(target, defines, keyword, request, max_compiles)}
        for synthesize in (True, False):
            begin = time.perf_counter()
            rec = recommend_target(target, defines={k: str(v) for k, v in defines.items()}, tpu=request,
                                   maximize=f"throughput:{keyword}", synthesize=synthesize, max_compiles=max_compiles)
            t = rec.throughput
            assert t is not None
            best = t.best
            if synthesize:  # the tool named the model's matmul lines: both picks compile with those names
                picks["name_lines"] = t.synthesis is not None and any(n.line for n in t.synthesis.names)
            picks["synthesized" if synthesize else "preset"] = {
                "policy": None if best is None else best.policy, "value": None if best is None else best.value,
                "estimated_seconds": None if best is None else best.seconds, "compiles": len(t.points),
                "wall_seconds": round(time.perf_counter() - begin, 1)}
            print(name, "synthesized" if synthesize else "preset", picks, flush=True)
        rows.append({"case": name, "target": target, "defines": defines, "keyword": keyword, **picks})
    out.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")


def on_chip(plan_path: Path, out: Path, only: str = "", which_only: str = "") -> None:
    import jax
    from tpu_small import timed_on_chip

    for case in (c for c in json.loads(plan_path.read_text()) if only in c["case"]):
        for which in ("synthesized", "preset", "best_preset"):
            pick = case.get(which) if which_only in ("", which) else None
            if pick is None:  # a plan of one pick (the other already measured)
                continue
            row: dict[str, Any] = {"case": case["case"], "which": which, **pick, "device": jax.devices()[0].device_kind,
                                   "predicted_seconds": pick["estimated_seconds"]}  # the search's, deviceless
            if pick["policy"] is None:
                row["verdict"] = "no pick"
            else:
                row.update(timed_on_chip(case["target"], pick["policy"],
                                         {**case["defines"], case["keyword"]: pick["value"]},
                                         which != "best_preset" and case.get("name_lines", False)))
                if row["verdict"] == "ran":
                    row["throughput"] = pick["value"] / row["seconds_per_step"]
            print(json.dumps({k: v for k, v in row.items() if k != "plan"}), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")


def table(rows_path: Path) -> None:
    """The Markdown table: each model's synthesized pick against the best preset's (issue 58's
    goal) and against the search without --synthesize, each as the chip ran it; the order as
    predicted is the estimate's order of the synthesized pick and the best preset."""
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]

    def pick(case: str, which: str) -> dict[str, Any] | None:  # the newest row of that pick
        return next((r for r in reversed(rows) if r["case"] == case and r["which"] == which), None)

    def rate(r: dict[str, Any] | None) -> float:
        return (r or {}).get("throughput") or 0.0

    def per_second(x: float) -> str:
        return f"{x:,.0f}/s" if x >= 1000 else f"{x:.2f}/s"

    print("| model | --synthesize's pick (policy, batch) | chip | best preset (policy, batch) | chip | gain "
          "| without --synthesize | chip | gain | order as predicted |")
    print("|---|---|---:|---|---:|---:|---|---:|---:|---|")
    for case in dict.fromkeys(r["case"] for r in rows):
        made, preset, plain = pick(case, "synthesized"), pick(case, "best_preset"), pick(case, "preset")
        assert made is not None
        cells = [case, f"{made['policy']}, {made['value']}", per_second(rate(made))]
        for other in (preset, plain):
            cells += (["(not run)", "", ""] if other is None else
                      [f"{other['policy']}, {other['value']}", per_second(rate(other)),
                       f"{100 * (rate(made) / (rate(other) or float('inf')) - 1):+.1f}%"])
        base = preset or plain
        assert base is not None
        predicted = made["value"] / made["predicted_seconds"] >= base["value"] / base["predicted_seconds"]
        cells.append("yes" if predicted == (rate(made) >= rate(base)) else "no")
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--plan", type=Path, metavar="OUT", help="both searches of every model, deviceless")
    where.add_argument("--on-chip", type=Path, metavar="PLAN", help="run the plan's picks on this machine's TPU")
    where.add_argument("--table", type=Path, metavar="ROWS", help="the Markdown table of the chip's rows")
    parser.add_argument("--out", type=Path, help="with --on-chip: JSON lines, appended")
    parser.add_argument("--max-compiles", type=int, default=16)
    parser.add_argument("--only", default="", help="only the models whose name contains this")
    parser.add_argument("--presets-only", action="store_true",
                        help="with --plan: add the best preset's pick to a plan's models, nothing else")
    parser.add_argument("--which", default="", choices=["", "synthesized", "preset", "best_preset"],
                        help="with --on-chip: only that pick of each model")
    args = parser.parse_args()
    if args.plan:
        plan(args.plan, args.max_compiles, args.only, args.presets_only)
    elif args.on_chip:
        if args.out is None:
            parser.error("--on-chip needs --out")
        on_chip(args.on_chip, args.out, args.only, args.which)
    else:
        table(args.table)


if __name__ == "__main__":
    main()
