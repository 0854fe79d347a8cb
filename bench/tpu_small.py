"""Small, many-kernel and long-sequence steps on a real TPU chip against the estimate (issue 56,
item 2): what each kernel pays whatever its work, and the kernels libtpu cannot estimate.

    # on the lent TPU v5e (the device tool), every case in one process:
    PYTHONPATH=. python bench/tpu_small.py --on-chip --out $OUT/tpu-v5e-small.jsonl
    # here: the per-kernel cost fitted on the fitted rows, the held-out rows against it
    python bench/tpu_small.py --fit bench/data/tpu-v5e-small.jsonl
    python bench/tpu_small.py --table bench/data/tpu-v5e-small.jsonl   # docs/guide/tpu.md's table

Each case is one training step as te-ckpt-audit builds it (`_step.training_step`, AdamW, the
state and trained arguments donated), compiled by the chip's libtpu. On the chip: the plan, and
seconds per step as a training loop runs it (3 steps of warm-up, then N steps dispatched back to
back with one wait at the end, N chosen so they run about half a second, median of 5 such runs).
The estimate is te-ckpt-audit's own (`_steptime.tpu_estimate`) read from the chip's own compiled
program, so each row carries both the measurement and the prediction of the same program, and the
kernel runs per step; `chain` cases are N small dependent kernels, nothing else.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MLP_SMALL = {"d_in": 2048, "d_hidden": 2048, "d_out": 2048}
GPT_SMALL = {"layers": 2, "seq": 256, "d_model": 256, "heads": 4, "d_ff": 1024, "vocab": 4096}
GPT_MID = {"layers": 4, "seq": 512, "d_model": 512, "heads": 8, "d_ff": 2048, "vocab": 8192}
GPT_LONG = {"layers": 1, "seq": 8192, "d_model": 256, "heads": 4, "d_ff": 1024, "vocab": 4096}  # f32 scores
LLAMA_SMALL = {"model": "tiny", "seq": 512}

# (case, target, policy, defines): each step on the chip beside the estimate of the same program;
# and every other case are held out
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    *((f"mlp-small {p} b1024", "sample_models/mlp.py:loss", p, {**MLP_SMALL, "batch": 1024})
      for p in ("checkpoint_dots", "nothing_saveable", "everything_saveable")),
    ("mlp-small nothing_saveable b256", "sample_models/mlp.py:loss", "nothing_saveable", {**MLP_SMALL, "batch": 256}),
    *((f"mlp-4096 nothing_saveable b{b}", "sample_models/mlp.py:loss", "nothing_saveable",
       {"d_in": 4096, "d_hidden": 4096, "d_out": 4096, "batch": b}) for b in (4096, 16384)),
    *((f"gpt-small {p} b{b}", "sample_models/gpt.py:loss", p, {**GPT_SMALL, "batch": b})
      for p in ("nothing_saveable", "checkpoint_dots") for b in (2, 8)),
    *((f"gpt-mid {p} b8", "sample_models/gpt.py:loss", p, {**GPT_MID, "batch": 8})
      for p in ("nothing_saveable", "everything_saveable")),
    *((f"gpt-unrolled {p} b4", "sample_models/gpt.py:loss", p, {**GPT_SMALL, "layers": 8, "scan": False, "batch": 4})
      for p in ("nothing_saveable", "checkpoint_dots")),
    *((f"llama-tiny {r} b{b}", "sample_models/llama.py:loss", "as-is",
       {**LLAMA_SMALL, "remat": r, "per_device_batch": b}) for r in ("full", "minimal") for b in (2, 8)),
    *((f"convnet {p} b{b}", "bench/models/convnet.py:loss", p, {"batch": b})
      for p in ("nothing_saveable", "checkpoint_dots") for b in (32, 128)),
    *((f"gpt-long nothing_saveable b{b}", "sample_models/gpt.py:loss", "nothing_saveable", {**GPT_LONG, "batch": b})
      for b in (1, 2, 3)),
]
CHAINS = [(n, shape) for shape in ((8, 128), (512, 1024)) for n in (64, 256)]


def _libtpu() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def _pipelined(compiled: Any, values: list[Any], feed: Any, budget: float = 0.5, runs: int = 5) -> tuple[float, int]:
    """Seconds per step, steps dispatched back to back with one wait (a training loop's rhythm):
    the median over `runs` of about `budget` seconds each; and the steps per run."""
    import jax

    for _ in range(3):
        values = feed(values, compiled(*values))
    jax.block_until_ready(values)
    begin = time.perf_counter()
    values = feed(values, compiled(*values))
    jax.block_until_ready(values)
    once = max(time.perf_counter() - begin, 1e-6)
    steps = int(min(2000, max(5, budget / once)))
    found = []
    for _ in range(runs):
        begin = time.perf_counter()
        for _ in range(steps):
            values = feed(values, compiled(*values))
        jax.block_until_ready(values)
        found.append((time.perf_counter() - begin) / steps)
    return statistics.median(found), steps


def _estimate(text: str) -> dict[str, Any]:
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import VMEM, step_kernels
    from te_ckpt_audit.tpus import tpu_model

    chip = tpu_model("v5e")
    kernels = step_kernels(text, 1, chip.chips_per_host, VMEM)
    timed = steptime.tpu_estimate(kernels, chip, 1, 0.0)
    unestimated = [k.name for k in kernels if k.cycles >= steptime.UNESTIMATED_CYCLES]
    return {"estimated_seconds": timed.seconds, "kernel_runs": timed.kernels, "unestimated": unestimated,
            "efficiency": steptime.TPU_EFFICIENCY, "overhead_seconds": timed.overhead_seconds}


def timed_on_chip(target: str, policy: str, defines: dict[str, Any], name_lines: bool = False) -> dict[str, Any]:
    """te-ckpt-audit's training step of `target` under `policy`, compiled by the chip's libtpu and
    run as a training loop runs it: the verdict and, where it compiled, its plan and te-ckpt-audit's
    estimate of the same program, and where it ran, its seconds per step."""
    import jax
    import jax.numpy as jnp
    from tpu_truth import _placed, _plan, _refusal, step_of

    fn, args, donate = step_of(target, policy, defines, name_lines)
    try:
        compiled = jax.jit(fn, donate_argnums=donate).lower(*_placed(args, jax.devices()[0])).compile()
    except Exception as exc:  # noqa: BLE001 - the chip's verdict, recorded
        return {"verdict": "refused at compile", "refusal": _refusal(exc) or f"{type(exc).__name__}: {str(exc)[:300]}"}
    row: dict[str, Any] = {"plan": _plan(compiled), **_estimate(compiled.as_text() or "")}
    values = list(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), args))
    trained = [i for i in donate if i != len(args) - 1]

    def feed(values: list[Any], out: Any) -> list[Any]:
        _, params, state = out
        values = list(values)
        values[trained[0]], values[-1] = params, state
        return values

    try:
        seconds, steps = _pipelined(compiled, values, feed)
    except Exception as exc:  # noqa: BLE001 - the chip's verdict, recorded
        return {**row, "verdict": "refused at run",
                "refusal": _refusal(exc) or f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {**row, "verdict": "ran", "seconds_per_step": seconds, "pipelined_steps": steps}


def step_row(name: str, target: str, policy: str, defines: dict[str, Any]) -> dict[str, Any]:
    import jax

    return {"case": name, "target": target, "policy": policy, "defines": defines,
            "device": jax.devices()[0].device_kind, "jax": jax.__version__, "libtpu": _libtpu(),
            **timed_on_chip(target, policy, defines)}


def chain_row(n: int, shape: tuple[int, int]) -> dict[str, Any]:
    """`n` dependent elementwise kernels (an optimization barrier between each keeps XLA from fusing
    them), nothing else: the chip's cost per kernel at two sizes."""
    import jax
    import jax.numpy as jnp

    def chain(x: jax.Array) -> jax.Array:
        for _ in range(n):
            x = jax.lax.optimization_barrier(jnp.sin(x) + 1.0)
        return x

    x = jnp.ones(shape, jnp.float32)
    compiled = jax.jit(chain, donate_argnums=0).lower(x).compile()
    seconds, steps = _pipelined(compiled, [x], lambda values, out: [out])
    row = {"case": f"chain {n} x f32{list(shape)}", "chain": n, "shape": list(shape), "seconds_per_step": seconds,
           "pipelined_steps": steps, "device": jax.devices()[0].device_kind, "libtpu": _libtpu(), "verdict": "ran",
           **_estimate(compiled.as_text() or "")}
    return row


def overhead_fit(rows: list[dict[str, Any]]) -> tuple[float, float, int]:
    """What the chip runs beyond the kernels' estimate, as a cost per step plus one per kernel run:
    the least-squares fit of measured less estimated seconds (the estimate before any such cost) on
    the models' steps under 3 ms with no kernel libtpu could not estimate (the `chain` cases left
    out: nothing but barriers). Returns (seconds per step, seconds per kernel run, rows fitted)."""
    fitted = [r for r in rows if r.get("verdict") == "ran" and not r.get("unestimated")
              and r["seconds_per_step"] < 3e-3 and not r["case"].startswith("chain")]
    xs = [float(r["kernel_runs"]) for r in fitted]
    ys = [r["seconds_per_step"] - (r["estimated_seconds"] - r.get("overhead_seconds", 0.0)) for r in fitted]
    n, mx, my = len(xs), statistics.fmean(xs), statistics.fmean(ys)
    per_kernel = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - per_kernel * mx, per_kernel, n


def fit_rows(path: Path) -> None:
    """Each row's error, and the per-step and per-kernel costs fitted on them (`overhead_fit`)."""
    rows = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("verdict") == "ran"]
    step, kernel, n = overhead_fit(rows)
    for r in rows:
        measured, estimated = r["seconds_per_step"], r["estimated_seconds"] - r.get("overhead_seconds", 0.0)
        with_cost = estimated + step + kernel * r["kernel_runs"]
        flagged = "  UNESTIMATED " + ",".join(r["unestimated"]) if r.get("unestimated") else ""
        print(f"{r['case']:40s} measured {measured * 1e3:9.3f} ms  kernels' estimate {estimated * 1e3:9.3f} ms "
              f"({100 * (estimated / measured - 1):+6.1f}%)  with the step's cost {with_cost * 1e3:9.3f} ms "
              f"({100 * (with_cost / measured - 1):+6.1f}%)  {r['kernel_runs']:6d} kernels{flagged}")
    print(f"fitted on {n} rows: {step * 1e3:.3f} ms per step, {kernel * 1e6:.3f} us per kernel run")


def table(path: Path) -> None:
    """The Markdown table of the chip's model steps against the estimate with the step's own cost
    (the constants of `_steptime`), with the median and worst error of the steps of 0.3 ms to 1 s."""
    from te_ckpt_audit.targets._steptime import TPU_EFFICIENCY, TPU_KERNEL_S, TPU_STEP_S

    rows = [r for r in map(json.loads, path.read_text().splitlines())
            if r.get("verdict") == "ran" and not r["case"].startswith("chain")]
    print("| step | kernel runs | chip, ms | estimate, ms | error | estimate before, ms |")
    print("|---|---:|---:|---:|---:|---:|")
    errors = []
    for r in rows:
        before = r["estimated_seconds"] - r.get("overhead_seconds", 0.0)  # at the row's own constant
        now = before / r["efficiency"] * TPU_EFFICIENCY + TPU_STEP_S + TPU_KERNEL_S * r["kernel_runs"]
        error = now / r["seconds_per_step"] - 1
        flag = " (a kernel libtpu gave no estimate)" if r.get("unestimated") else ""
        if not r.get("unestimated") and 0.3e-3 <= r["seconds_per_step"] <= 1.0:
            errors.append(abs(error))
        print(f"| {r['case']}{flag} | {r['kernel_runs']:,} | {r['seconds_per_step'] * 1e3:.3f} | {now * 1e3:.3f} | "
              f"{100 * error:+.1f}% | {before * 1e3:.3f} |")
    errors.sort()
    print(f"\nSteps of 0.3 ms to 1 s, every kernel estimated ({len(errors)}): median "
          f"{100 * statistics.median(errors):.1f}%, worst {100 * errors[-1]:.1f}%, "
          f"{sum(e < 0.10 for e in errors)} within 10%.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--on-chip", action="store_true", help="compile and run every case on this machine's TPU")
    where.add_argument("--fit", type=Path, metavar="ROWS", help="the per-kernel cost from the chip's rows")
    where.add_argument("--table", type=Path, metavar="ROWS", help="the Markdown table of the chip's rows")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--out", type=Path, help="JSON lines, appended")
    args = parser.parse_args()
    if args.fit:
        fit_rows(args.fit)
        return
    if args.table:
        table(args.table)
        return
    sys.path.insert(0, str(ROOT / "bench"))
    todo: list[Any] = [("step", c) for c in CASES if args.only in c[0]]
    todo += [("chain", c) for c in CHAINS if args.only in "chain"]
    for kind, case in todo:
        begin = time.perf_counter()
        try:
            row = step_row(*case) if kind == "step" else chain_row(*case)
        except Exception as exc:  # noqa: BLE001 - one case's failure is recorded, the others run
            row = {"case": case[0] if kind == "step" else f"chain {case}", "verdict": "error",
                   "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        row["wall_seconds"] = round(time.perf_counter() - begin, 1)
        print(json.dumps({k: v for k, v in row.items() if k not in ("plan", "defines")}), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
