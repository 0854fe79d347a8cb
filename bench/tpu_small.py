"""Small, many-kernel and long-sequence steps on a real TPU chip against the estimate (issue 56,
item 2): what each kernel pays whatever its work, and the kernels libtpu cannot estimate.

    # on the lent TPU v5e (the device tool), every case in one process:
    PYTHONPATH=. python bench/tpu_small.py --on-chip --out $OUT/tpu-v5e-small.jsonl
    # here: each row's estimate again (the same program compiled for a v5e, deviceless), then the
    # step's own costs fitted on these rows and bench/tpu_host.py's (each model held out in turn)
    JAX_PLATFORMS=cpu PYTHONPATH=. python bench/tpu_small.py --refresh bench/data/tpu-v5e-small.jsonl
    JAX_PLATFORMS=cpu PYTHONPATH=. python bench/tpu_small.py --refresh bench/data/tpu-v5e-host.jsonl
    python bench/tpu_small.py --fit bench/data/tpu-v5e-small.jsonl bench/data/tpu-v5e-host.jsonl
    # on the chip: the steps never fitted on (round 1; round 2: --held-out 2)
    PYTHONPATH=. python bench/tpu_small.py --on-chip --held-out --out $OUT/tpu-v5e-small-held.jsonl
    # on the chip: every step traced by the profiler, each kernel's own time (bench/tpu_truth.py's
    # trace), summarized as bench/data/tpu-v5e-small-profile.jsonl
    PYTHONPATH=. python bench/tpu_small.py --profile $OUT/prof
    # here: each profiled kernel as te-ckpt-audit reads it, with the chip's time; the miss by kind
    python bench/tpu_small.py --kernel-rows PROF_DIR bench/data/tpu-v5e-small-kernels.jsonl.gz
    python bench/tpu_small.py --kinds bench/data/tpu-v5e-small-kernels.jsonl.gz
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
# steps the step's own costs were never fitted on (`--held-out`): other sizes of the same models,
# measured after the fit (bench/data/tpu-v5e-small-held.jsonl)
HELD_OUT: list[tuple[str, str, str, dict[str, Any]]] = [
    ("mlp-1024 nothing_saveable b512", "sample_models/mlp.py:loss", "nothing_saveable",
     {"d_in": 1024, "d_hidden": 1024, "d_out": 1024, "batch": 512}),
    ("mlp-small checkpoint_dots b4096", "sample_models/mlp.py:loss", "checkpoint_dots", {**MLP_SMALL, "batch": 4096}),
    ("mlp-small everything_saveable b256", "sample_models/mlp.py:loss", "everything_saveable",
     {**MLP_SMALL, "batch": 256}),
    ("gpt-small nothing_saveable b4", "sample_models/gpt.py:loss", "nothing_saveable", {**GPT_SMALL, "batch": 4}),
    ("gpt-unrolled nothing_saveable b1", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_SMALL, "layers": 8, "scan": False, "batch": 1}),
    ("gpt-unrolled4 checkpoint_dots b8", "sample_models/gpt.py:loss", "checkpoint_dots",
     {**GPT_SMALL, "layers": 4, "scan": False, "batch": 8}),
    ("llama-tiny full b16", "sample_models/llama.py:loss", "as-is",
     {**LLAMA_SMALL, "remat": "full", "per_device_batch": 16}),
    ("convnet checkpoint_dots b64", "bench/models/convnet.py:loss", "checkpoint_dots", {"batch": 64}),
]
# a second round, chosen before the chip ran them (2026-12-07; `--held-out 2`): more sizes of the
# same models, nothing fitted on them (bench/data/tpu-v5e-small-held.jsonl, `"round": 2`)
HELD_OUT_2: list[tuple[str, str, str, dict[str, Any]]] = [
    ("mlp-small nothing_saveable b2048", "sample_models/mlp.py:loss", "nothing_saveable", {**MLP_SMALL, "batch": 2048}),
    ("mlp-1024 checkpoint_dots b2048", "sample_models/mlp.py:loss", "checkpoint_dots",
     {"d_in": 1024, "d_hidden": 1024, "d_out": 1024, "batch": 2048}),
    ("gpt-small everything_saveable b4", "sample_models/gpt.py:loss", "everything_saveable", {**GPT_SMALL, "batch": 4}),
    ("gpt-small checkpoint_dots b16", "sample_models/gpt.py:loss", "checkpoint_dots", {**GPT_SMALL, "batch": 16}),
    ("gpt-unrolled4 nothing_saveable b4", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_SMALL, "layers": 4, "scan": False, "batch": 4}),
    ("gpt-unrolled2 checkpoint_dots b16", "sample_models/gpt.py:loss", "checkpoint_dots",
     {**GPT_SMALL, "layers": 2, "scan": False, "batch": 16}),
    ("llama-tiny minimal b4", "sample_models/llama.py:loss", "as-is",
     {**LLAMA_SMALL, "remat": "minimal", "per_device_batch": 4}),
    ("llama-tiny full b32", "sample_models/llama.py:loss", "as-is",
     {**LLAMA_SMALL, "remat": "full", "per_device_batch": 32}),
    ("convnet nothing_saveable b64", "bench/models/convnet.py:loss", "nothing_saveable", {"batch": 64}),
    ("convnet checkpoint_dots b16", "bench/models/convnet.py:loss", "checkpoint_dots", {"batch": 16}),
]
ROUNDS = {1: HELD_OUT, 2: HELD_OUT_2}


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
    """te-ckpt-audit's estimate of a compiled step: its seconds, the kernels' work in it (libtpu's
    cycles, the VMEM copies), kernel runs, arrays passed, and what the host takes to launch it."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import VMEM, entry_arrays, step_kernels
    from te_ckpt_audit.tpus import tpu_model

    chip = tpu_model("v5e")
    kernels = step_kernels(text, 1, chip.chips_per_host, VMEM)
    arrays = entry_arrays(text)
    timed = steptime.tpu_estimate(kernels, chip, 1, 0.0, arrays)
    unestimated = [k.name for k in kernels if k.cycles >= steptime.UNESTIMATED_CYCLES]
    assert timed.seconds is not None
    return {"estimated_seconds": timed.seconds, "kernel_runs": timed.kernels, "unestimated": unestimated,
            "efficiency": steptime.TPU_EFFICIENCY, "overhead_seconds": timed.overhead_seconds,
            "work_seconds": timed.seconds - timed.overhead_seconds, "arrays": arrays,
            "dispatch_seconds": timed.dispatch_seconds}


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


def dispatch_slope(rows: list[dict[str, Any]]) -> float:
    """The host's seconds per array passed: the least-squares slope of bench/tpu_host.py's `dispatch`
    rows of 4 arrays or more (a jitted x + 1 over each of N donated arrays, the AOT call)."""
    found = [(float(r["arrays"]), r["aot_seconds_per_step"]) for r in rows if r["study"] == "dispatch"
             and r["arrays"] >= 4]
    mx, my = statistics.fmean(x for x, _ in found), statistics.fmean(y for _, y in found)
    return sum((x - mx) * (y - my) for x, y in found) / sum((x - mx) ** 2 for x, _ in found)


def fitted_rows(small: Path, host: Path) -> list[dict[str, Any]]:
    """The model steps the step's own costs are fitted on: every row of `small` (bench/tpu_small.py's,
    refreshed) and every `step` row of `host` (bench/tpu_host.py's, its AOT call: the same steps on
    another day's machine) that ran, whose kernels libtpu all estimated, under 3 ms."""
    rows = [r for r in map(json.loads, small.read_text().splitlines())
            if r.get("verdict") == "ran" and not r["case"].startswith("chain")]
    rows += [{**r, "seconds_per_step": r["aot_seconds_per_step"]}
             for r in map(json.loads, host.read_text().splitlines())
             if r["study"] == "step" and r["case"] in {c[0] for c in CASES}]  # held-out steps' rows stay out
    return [r for r in rows if not r.get("unestimated") and r["seconds_per_step"] < 3e-3]


def predicted(r: dict[str, Any], step: float, kernel: float, host_step: float, host_array: float) -> float:
    """A row's seconds under these costs: the kernels' work and the device's own cost, at least the
    host's launch (as `_steptime.tpu_estimate` takes them)."""
    return max(r["work_seconds"] + step + kernel * r["kernel_runs"], host_step + host_array * r["arrays"])


def overhead_fit(rows: list[dict[str, Any]], host_array: float) -> tuple[float, float, float]:
    """The device's cost per step and per kernel run and the host's per step (its per array given):
    the least squared relative error over `rows`, on a grid of 5 us, 0.02 us and 5 us."""
    import numpy as np

    work = np.array([r["work_seconds"] for r in rows])[:, None, None]
    runs = np.array([r["kernel_runs"] for r in rows], float)[:, None, None]
    measured = np.array([r["seconds_per_step"] for r in rows])[:, None, None]
    steps, kernels = np.arange(0, 81) * 5e-6, np.arange(0, 61) * 0.02e-6
    best: tuple[float, float, float, float] | None = None
    for host_step in np.arange(10, 81) * 5e-6:
        host = (host_step + host_array * np.array([r["arrays"] for r in rows], float))[:, None, None]
        error = ((np.maximum(work + steps[None, :, None] + kernels[None, None, :] * runs, host) / measured - 1) ** 2
                 ).mean(axis=0)
        i, j = np.unravel_index(int(np.argmin(error)), error.shape)
        if best is None or error[i, j] < best[0]:
            best = (float(error[i, j]), float(steps[i]), float(kernels[j]), float(host_step))
    assert best is not None
    return best[1], best[2], best[3]


def fit_rows(small: Path, host: Path) -> None:
    """The costs fitted on the rows (`overhead_fit`), each row's error under them, and each model's
    rows under the costs fitted on the other models' (leave one model out)."""
    host_rows = [json.loads(line) for line in host.read_text().splitlines()]
    slope = dispatch_slope(host_rows)
    rows = fitted_rows(small, host)
    costs = (*overhead_fit(rows, slope), slope)
    print(f"fitted on {len(rows)} rows: device {costs[0] * 1e3:.3f} ms per step, {costs[1] * 1e6:.2f} us per kernel "
          f"run; host {costs[2] * 1e3:.3f} ms per step, {costs[3] * 1e6:.2f} us per array")
    for r in rows:
        now = predicted(r, *costs)
        print(f"{r['case']:40s} measured {r['seconds_per_step'] * 1e3:8.3f} ms  estimated {now * 1e3:8.3f} ms "
              f"({100 * (now / r['seconds_per_step'] - 1):+6.1f}%)")
    held = []
    for model in sorted({r["case"].split()[0] for r in rows}):
        others = overhead_fit([r for r in rows if r["case"].split()[0] != model], slope)
        held += [abs(predicted(r, *others, slope) / r["seconds_per_step"] - 1) for r in rows
                 if r["case"].split()[0] == model and r["seconds_per_step"] >= 0.3e-3]
    print(f"each model held out: median {100 * statistics.median(held):.1f}%, worst {100 * max(held):.1f}%, "
          f"{sum(e < 0.10 for e in held)} of {len(held)} within 10%")


def refresh(path: Path) -> None:
    """Each model step's estimate again, from the same program compiled here for a v5e (deviceless:
    libtpu compiles the chip's program, byte for byte its plan), in place: the rows keep what the chip
    measured and take the estimate te-ckpt-audit makes now."""
    import jax
    from jax.experimental import topologies
    from tpu_truth import _placed, step_of

    topo = topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1)
    cases = {c[0]: c for c in CASES}
    out = []
    for r in map(json.loads, path.read_text().splitlines()):
        if r.get("case") in cases and (r.get("verdict") == "ran" or r.get("study") == "step"):
            _, target, policy, defines = cases[r["case"]]
            fn, args, donate = step_of(target, policy, defines)
            text = jax.jit(fn, donate_argnums=donate).lower(*_placed(args, topo.devices[0])).compile().as_text()
            r = {**r, **_estimate(text or "")}
            print(r["case"], f"{r['estimated_seconds'] * 1e3:.3f} ms", flush=True)
        out.append(r)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in out))


def kernel_rows(profiled: Path, out: Path) -> None:
    """Each profiled step's kernels as te-ckpt-audit reads them from the chip's own program (the HLO
    `--profile` kept beside its rows), each with the chip's measured time: JSON lines, gzipped, one
    step a line: `kernels` as [name, kind, runs, libtpu's cycles (-1: none), HBM bytes, FLOPs, a
    VMEM copy (0/1), measured ns per run (null: no event of that name)]."""
    import gzip

    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import VMEM, step_kernels
    from te_ckpt_audit.tpus import tpu_model

    chip = tpu_model("v5e")
    lines = []
    for r in map(json.loads, (profiled / "profile.jsonl").read_text().splitlines()):
        text = gzip.decompress((profiled / r["hlo"]).read_bytes()).decode()
        ops = r["lines"]["XLA Ops"]
        kernels = [[k.name, k.kind.name.lower(), k.runs, k.cycles if k.cycles < steptime.UNESTIMATED_CYCLES else -1,
                    k.bytes, k.flops, int(k.vmem_copy),
                    round(ops[k.name][1] / ops[k.name][0]) if k.name in ops else None]
                   for k in step_kernels(text, 1, chip.chips_per_host, VMEM) if not k.waits_for]
        lines.append(json.dumps({"case": r["case"], "kernels": kernels}, separators=(",", ":")) + "\n")
    out.write_bytes(gzip.compress("".join(lines).encode(), mtime=0))


def kind_sums(path: Path) -> dict[tuple[str, str], tuple[float, float, int]]:
    """Where the estimate misses, by kernel kind: over the profiled steps (`kernel_rows`), each
    (kind, size of the estimate per run): the estimated and measured seconds and the runs, VMEM
    copies apart. "estimated nothing": libtpu's lesser of its cycles and a roofline of no HBM bytes."""
    import gzip

    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import Kernel, KernelKind
    from te_ckpt_audit.tpus import tpu_model

    chip = tpu_model("v5e")
    sums: dict[tuple[str, str], tuple[float, float, int]] = {}
    for step in map(json.loads, gzip.decompress(path.read_bytes()).decode().splitlines()):
        for name, kind, runs, cycles, hbm, flops, vmem, measured in step["kernels"]:
            if measured is None or vmem:
                continue
            kernel = Kernel(name, KernelKind[kind.upper()], flops, hbm, runs=runs,
                            cycles=steptime.UNESTIMATED_CYCLES if cycles < 0 else cycles)
            seconds = steptime.tpu_timed(kernel, chip).seconds
            size = ("libtpu gave no estimate" if cycles < 0 else "estimated nothing" if seconds < 5e-8 else
                    "under 1 us" if seconds < 1e-6 else "1-10 us" if seconds < 1e-5 else "10 us or more")
            estimated, took, counted = sums.get((kind, size), (0.0, 0.0, 0))
            sums[(kind, size)] = (estimated + seconds * runs, took + measured * 1e-9 * runs, counted + runs)
    return sums


def kinds(path: Path) -> None:
    """`kind_sums` as the Markdown table of docs/guide/tpu.md."""
    print("| kind | estimate per run | runs | estimated, ms | measured, ms | measured / estimated |")
    print("|---|---|---:|---:|---:|---:|")
    for (kind, size), (estimated, measured, runs) in sorted(kind_sums(path).items()):
        ratio = f"{measured / estimated:.2f}" if estimated else "-"
        print(f"| {kind} | {size} | {runs:,.0f} | {estimated * 1e3:.3f} | {measured * 1e3:.3f} | {ratio} |")


def table(path: Path) -> None:
    """The Markdown table of the chip's model steps against the estimate (the constants of
    `_steptime`), with the median and worst error of the steps of 0.3 ms to 1 s."""
    from te_ckpt_audit.targets._steptime import (
        TPU_EFFICIENCY,
        TPU_HOST_ARRAY_S,
        TPU_HOST_STEP_S,
        TPU_KERNEL_S,
        TPU_STEP_S,
    )

    rows = [r for r in map(json.loads, path.read_text().splitlines())
            if r.get("verdict") == "ran" and not r["case"].startswith("chain")]
    print("| step | kernel runs | arrays | chip, ms | estimate, ms | error | device, ms | host, ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    errors = []
    for r in rows:
        row = {**r, "work_seconds": r["work_seconds"] / r["efficiency"] * TPU_EFFICIENCY}
        now = predicted(row, TPU_STEP_S, TPU_KERNEL_S, TPU_HOST_STEP_S, TPU_HOST_ARRAY_S)
        error = now / r["seconds_per_step"] - 1
        flag = " (a kernel libtpu gave no estimate)" if r.get("unestimated") else ""
        if not r.get("unestimated") and 0.3e-3 <= r["seconds_per_step"] <= 1.0:
            errors.append(abs(error))
        device = row["work_seconds"] + TPU_STEP_S + TPU_KERNEL_S * r["kernel_runs"]
        print(f"| {r['case']}{flag} | {r['kernel_runs']:,} | {r['arrays']} | {r['seconds_per_step'] * 1e3:.3f} | "
              f"{now * 1e3:.3f} | {100 * error:+.1f}% | {device * 1e3:.3f} | "
              f"{(TPU_HOST_STEP_S + TPU_HOST_ARRAY_S * r['arrays']) * 1e3:.3f} |")
    errors.sort()
    print(f"\nSteps of 0.3 ms to 1 s, every kernel estimated ({len(errors)}): median "
          f"{100 * statistics.median(errors):.1f}%, worst {100 * errors[-1]:.1f}%, "
          f"{sum(e < 0.10 for e in errors)} within 10%.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--on-chip", action="store_true", help="compile and run every case on this machine's TPU")
    where.add_argument("--fit", nargs=2, type=Path, metavar=("SMALL", "HOST"),
                       help="the step's own costs fitted on the chip's rows (this script's and bench/tpu_host.py's)")
    where.add_argument("--refresh", type=Path, metavar="ROWS", help="each row's estimate again, compiled here")
    where.add_argument("--table", type=Path, metavar="ROWS", help="the Markdown table of the chip's rows")
    where.add_argument("--kernel-rows", nargs=2, type=Path, metavar=("DIR", "OUT"),
                       help="the profiled steps' kernels (--profile's DIR) with their measured times, gzipped")
    where.add_argument("--kinds", type=Path, metavar="ROWS", help="--kernel-rows' file: the estimate's miss by kind")
    where.add_argument("--profile", type=Path, metavar="DIR",
                       help="on the chip: every step (fitted and held out) traced, each kernel's time and the HLO")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--held-out", type=int, nargs="?", const=1, choices=sorted(ROUNDS),
                        help="with --on-chip: the steps never fitted on (round 1, or 2)")
    parser.add_argument("--out", type=Path, help="JSON lines, appended")
    args = parser.parse_args()
    if args.fit:
        fit_rows(*args.fit)
        return
    if args.kinds:
        kinds(args.kinds)
        return
    if args.kernel_rows:
        kernel_rows(*args.kernel_rows)
        return
    sys.path.insert(0, str(ROOT / "bench"))
    if args.refresh:
        refresh(args.refresh)
        return
    if args.profile:  # bench/tpu_truth.py's trace: the device's own time per kernel, beside the module
        from tpu_truth import profile_row

        args.profile.mkdir(parents=True, exist_ok=True)
        for case in (c for c in CASES + HELD_OUT + HELD_OUT_2 if args.only in c[0]):
            row = profile_row(*case, out=args.profile)
            with (args.profile / "profile.jsonl").open("a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
            print(case[0], row["lines"].get("XLA Modules"), flush=True)
        return
    if args.table:
        table(args.table)
        return
    sys.path.insert(0, str(ROOT / "bench"))
    todo: list[Any] = [("step", c) for c in (ROUNDS[args.held_out] if args.held_out else CASES) if args.only in c[0]]
    todo += [("chain", c) for c in CHAINS if args.only in "chain" and not args.held_out]
    for kind, case in todo:
        begin = time.perf_counter()
        try:
            row = step_row(*case) if kind == "step" else chain_row(*case)
        except Exception as exc:  # noqa: BLE001 - one case's failure is recorded, the others run
            row = {"case": case[0] if kind == "step" else f"chain {case}", "verdict": "error",
                   "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        row["wall_seconds"] = round(time.perf_counter() - begin, 1)
        if args.held_out:
            row["round"] = args.held_out
        print(json.dumps({k: v for k, v in row.items() if k not in ("plan", "defines")}), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
