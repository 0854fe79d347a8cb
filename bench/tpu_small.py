"""Small, many-kernel and long-sequence steps on a real TPU chip against the estimate (issue 56,
item 2): what each kernel pays whatever its work, and the kernels libtpu cannot estimate.

    # on the lent TPU v5e (the device tool), every case in one process:
    PYTHONPATH=. python bench/tpu_small.py --on-chip --out $OUT/tpu-v5e-small.jsonl
    # here: each row's estimate again (the same program compiled for a v5e, deviceless)
    JAX_PLATFORMS=cpu PYTHONPATH=. python bench/tpu_small.py --refresh bench/data/tpu-v5e-small.jsonl
    # on the chip: the steps never fitted on (round 1; round 2: --held-out 2; round 3: --held-out 3)
    PYTHONPATH=. python bench/tpu_small.py --on-chip --held-out --out $OUT/tpu-v5e-small-held.jsonl
    # on the chip: every step traced by the profiler, each kernel's own time (bench/tpu_truth.py's
    # trace), summarized as bench/data/tpu-v5e-small-profile.jsonl (appended)
    PYTHONPATH=. python bench/tpu_small.py --profile $OUT/prof
    python bench/tpu_small.py --profile-rows PROF_DIR bench/data/tpu-v5e-small-profile.jsonl
    # here: each profiled kernel with the chip's time (by name: -small-kernels.jsonl.gz), then every
    # profiled step as the estimate reads it (compiled here, deviceless: the chip's program)
    python bench/tpu_small.py --kernel-rows PROF_DIR bench/data/tpu-v5e-small-kernels.jsonl.gz
    JAX_PLATFORMS=cpu PYTHONPATH=. python bench/tpu_small.py --steps bench/data/tpu-v5e-small-steps.jsonl.gz
    # the per-kernel costs of `_steptime` fitted on the fitted steps, every step's error; the miss by
    # kind; docs/guide/tpu.md's table
    python bench/tpu_small.py --fit-kernels bench/data/tpu-v5e-small-steps.jsonl.gz
    python bench/tpu_small.py --kinds bench/data/tpu-v5e-small-steps.jsonl.gz
    python bench/tpu_small.py --table bench/data/tpu-v5e-small-steps.jsonl.gz
    # what holds the small steps from 10%: their error with the chip's own GEMM times, and then with
    # each DMA sharing HBM with the kernel beside it
    python bench/tpu_small.py --what-if bench/data/tpu-v5e-small-steps.jsonl.gz

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
import dataclasses
import itertools
import json
import math
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
# a third round, chosen before the chip ran them and after the per-kernel costs were fitted
# (2026-12-07; `--held-out 3`): more sizes, and what no fitted step had: a bf16 MLP and GPT, wider
# and longer sequences
HELD_OUT_3: list[tuple[str, str, str, dict[str, Any]]] = [
    ("mlp-small checkpoint_dots b512", "sample_models/mlp.py:loss", "checkpoint_dots", {**MLP_SMALL, "batch": 512}),
    ("mlp-1024 everything_saveable b4096", "sample_models/mlp.py:loss", "everything_saveable",
     {"d_in": 1024, "d_hidden": 1024, "d_out": 1024, "batch": 4096}),
    ("mlp-3072 nothing_saveable b1024", "sample_models/mlp.py:loss", "nothing_saveable",
     {"d_in": 3072, "d_hidden": 3072, "d_out": 3072, "batch": 1024}),
    ("mlp-bf16 checkpoint_dots b2048", "sample_models/mlp.py:loss", "checkpoint_dots",
     {**MLP_SMALL, "dtype": "bfloat16", "batch": 2048}),
    ("gpt-small nothing_saveable b12", "sample_models/gpt.py:loss", "nothing_saveable", {**GPT_SMALL, "batch": 12}),
    ("gpt-small checkpoint_dots b6", "sample_models/gpt.py:loss", "checkpoint_dots", {**GPT_SMALL, "batch": 6}),
    ("gpt-seq512 nothing_saveable b4", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_SMALL, "seq": 512, "batch": 4}),
    ("gpt-bf16 checkpoint_dots b8", "sample_models/gpt.py:loss", "checkpoint_dots",
     {**GPT_SMALL, "dtype": "bfloat16", "batch": 8}),
    ("gpt-unrolled6 checkpoint_dots b2", "sample_models/gpt.py:loss", "checkpoint_dots",
     {**GPT_SMALL, "layers": 6, "scan": False, "batch": 2}),
    ("gpt-unrolled4 everything_saveable b8", "sample_models/gpt.py:loss", "everything_saveable",
     {**GPT_SMALL, "layers": 4, "scan": False, "batch": 8}),
    ("llama-tiny full b12", "sample_models/llama.py:loss", "as-is",
     {**LLAMA_SMALL, "remat": "full", "per_device_batch": 12}),
    ("llama-tiny minimal b24", "sample_models/llama.py:loss", "as-is",
     {**LLAMA_SMALL, "remat": "minimal", "per_device_batch": 24}),
    ("llama-tiny seq1024 full b8", "sample_models/llama.py:loss", "as-is",
     {**LLAMA_SMALL, "seq": 1024, "remat": "full", "per_device_batch": 8}),
    ("convnet nothing_saveable b16", "bench/models/convnet.py:loss", "nothing_saveable", {"batch": 16}),
    ("convnet checkpoint_dots b48", "bench/models/convnet.py:loss", "checkpoint_dots", {"batch": 48}),
    ("gpt-long2k nothing_saveable b1", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_LONG, "seq": 2048, "batch": 1}),
]
# a fourth round, chosen before the chip ran them and after the estimate's range was set to the
# band the chip's steps strayed in (2026-12-07; `--held-out 4`): whether each step lands in its
# range; other widths and heads, a narrower ResNet, steps from 0.3 ms to tens of ms
HELD_OUT_4: list[tuple[str, str, str, dict[str, Any]]] = [
    ("mlp-small nothing_saveable b512", "sample_models/mlp.py:loss", "nothing_saveable", {**MLP_SMALL, "batch": 512}),
    ("mlp-bf16 everything_saveable b4096", "sample_models/mlp.py:loss", "everything_saveable",
     {**MLP_SMALL, "dtype": "bfloat16", "batch": 4096}),
    ("mlp-3072 checkpoint_dots b4096", "sample_models/mlp.py:loss", "checkpoint_dots",
     {"d_in": 3072, "d_hidden": 3072, "d_out": 3072, "batch": 4096}),
    ("mlp-small checkpoint_dots b16384", "sample_models/mlp.py:loss", "checkpoint_dots", {**MLP_SMALL, "batch": 16384}),
    ("gpt-small everything_saveable b16", "sample_models/gpt.py:loss", "everything_saveable",
     {**GPT_SMALL, "batch": 16}),
    ("gpt-wide8 nothing_saveable b4", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_SMALL, "d_model": 512, "heads": 8, "d_ff": 2048, "batch": 4}),
    ("gpt-bf16 nothing_saveable b16", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_SMALL, "dtype": "bfloat16", "batch": 16}),
    ("gpt-seq1024 checkpoint_dots b2", "sample_models/gpt.py:loss", "checkpoint_dots",
     {**GPT_SMALL, "seq": 1024, "batch": 2}),
    ("gpt-unrolled3 nothing_saveable b6", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_SMALL, "layers": 3, "scan": False, "batch": 6}),
    ("gpt-mid checkpoint_dots b4", "sample_models/gpt.py:loss", "checkpoint_dots", {**GPT_MID, "batch": 4}),
    ("gpt-mid everything_saveable b16", "sample_models/gpt.py:loss", "everything_saveable", {**GPT_MID, "batch": 16}),
    ("llama-tiny full b6", "sample_models/llama.py:loss", "as-is",
     {**LLAMA_SMALL, "remat": "full", "per_device_batch": 6}),
    ("llama-tiny seq256 minimal b16", "sample_models/llama.py:loss", "as-is",
     {**LLAMA_SMALL, "seq": 256, "remat": "minimal", "per_device_batch": 16}),
    ("llama-tiny seq2048 full b2", "sample_models/llama.py:loss", "as-is",
     {**LLAMA_SMALL, "seq": 2048, "remat": "full", "per_device_batch": 2}),
    ("convnet checkpoint_dots b96", "bench/models/convnet.py:loss", "checkpoint_dots", {"batch": 96}),
    ("convnet-narrow nothing_saveable b64", "bench/models/convnet.py:loss", "nothing_saveable",
     {"batch": 64, "widths": "32,64,128,256"}),
    ("gpt-long4k nothing_saveable b1", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_LONG, "seq": 4096, "batch": 1}),
]
# a fifth round, the long-sequence decoder of issue 56 (chosen 2026-12-07, before the chip ran them;
# `--held-out 5`): at sequence 8192, where a step's float32 scores reach 6 GiB, libtpu lowers the
# softmax's max as a reduce-window the row's width wide (n^2 work) and gives it no estimate; the
# same model with fewer heads or a smaller batch keeps a plain reduce. Whether the window's taps at
# `TPU_WINDOW_TAPS_PER_S` (fitted on a vocabulary's log-softmax) time an attention's softmax too
HELD_OUT_5: list[tuple[str, str, str, dict[str, Any]]] = [
    *((f"gpt-long8h nothing_saveable b{b}", "sample_models/gpt.py:loss", "nothing_saveable",
       {**GPT_LONG, "heads": 8, "batch": b}) for b in (1, 2, 3)),
    *((f"gpt-long nothing_saveable b{b}", "sample_models/gpt.py:loss", "nothing_saveable", {**GPT_LONG, "batch": b})
      for b in (4, 6)),
    ("gpt-long8h-512 nothing_saveable b3", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_LONG, "d_model": 512, "heads": 8, "batch": 3}),
    *((f"gpt-long12h nothing_saveable b{b}", "sample_models/gpt.py:loss", "nothing_saveable",
       {**GPT_LONG, "d_model": 384, "heads": 12, "batch": b}) for b in (1, 2)),
]
# a sixth round, for the sublanes' window rate (fitted on round 5's one shape): other sequences and
# heads where libtpu lowers the softmax's max as a window (deviceless, 2026-12-07: 0.47-0.64 s of
# window taps), beside a neighbour that keeps a plain reduce; chosen before any chip ran them
HELD_OUT_6: list[tuple[str, str, str, dict[str, Any]]] = [
    *((f"gpt-long6k nothing_saveable b{b}", "sample_models/gpt.py:loss", "nothing_saveable",
       {**GPT_LONG, "seq": 6144, "heads": 8, "batch": b}) for b in (5, 6)),
    ("gpt-long7k nothing_saveable b4", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_LONG, "seq": 7168, "heads": 8, "batch": 4}),
    ("gpt-long6h nothing_saveable b4", "sample_models/gpt.py:loss", "nothing_saveable",
     {**GPT_LONG, "d_model": 384, "heads": 6, "batch": 4}),
]
ROUNDS = {1: HELD_OUT, 2: HELD_OUT_2, 3: HELD_OUT_3, 4: HELD_OUT_4, 5: HELD_OUT_5, 6: HELD_OUT_6}


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
            "dispatch_seconds": timed.dispatch_seconds, "estimated_range": [timed.seconds_low, timed.seconds_high]}


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


def refresh(path: Path) -> None:
    """Each model step's estimate again, from the same program compiled here for a v5e (deviceless:
    libtpu compiles the chip's program, byte for byte its plan), in place: the rows keep what the chip
    measured and take the estimate te-ckpt-audit makes now."""
    import jax
    from jax.experimental import topologies
    from tpu_truth import _placed, step_of

    topo = topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1)
    cases = {c[0]: c for c in CASES + HELD_OUT + HELD_OUT_2 + HELD_OUT_3}
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


def summarized(raw: dict[str, Any]) -> dict[str, Any]:
    """A `--profile` row as bench/data/tpu-v5e-small-profile.jsonl keeps it: the module's time per
    step, each op of 1 us or more per step (runs, ns), the others counted and summed."""
    ops = raw["lines"]["XLA Ops"]
    small = {name: v for name, v in ops.items() if v[1] < 1000}
    return {**{k: v for k, v in raw.items() if k not in ("hlo", "lines", "traced_wall_seconds_per_step")},
            "module_ns": round(sum(ns for _, ns in raw["lines"]["XLA Modules"].values())),
            "ops": {name: [c, round(ns)] for name, (c, ns) in sorted(ops.items()) if name not in small},
            "small_ops": len(small), "small_ops_ns": round(sum(ns for _, ns in small.values()))}


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


def _plain(kernel: Any) -> dict[str, Any]:
    """A kernel as JSON: its fields that differ from their defaults."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(kernel):
        value = getattr(kernel, f.name)
        if f.default is dataclasses.MISSING or value != f.default:
            out[f.name] = value.name if f.name == "kind" else value
    return out


def _kernel(raw: dict[str, Any]) -> Any:
    from te_ckpt_audit.targets._kernels import Kernel, KernelKind

    return Kernel(**{**raw, "kind": KernelKind[raw["kind"]], "loop": tuple(raw.get("loop", ())),
                     "xla_us": tuple(tuple(x) for x in raw.get("xla_us", ()))})


def steps_file(out: Path, hlo: Path | None) -> None:
    """Each profiled step's program compiled here for a v5e (deviceless: libtpu compiles the chip's
    program) and read as te-ckpt-audit reads it, in its scheduled order, each kernel with the chip's
    measured ns per run (the profile's, by name: bench/data/tpu-v5e-small-kernels.jsonl.gz), beside
    the step's device time (the profile's module) and its seconds per step as a loop ran it: what
    `--fit-kernels` fits the per-kernel costs on. Gzipped JSON lines; `hlo`: a folder of the
    programs' text (read where there, written where not)."""
    import gzip

    import jax
    from jax.experimental import topologies
    from tpu_truth import _placed, step_of

    from te_ckpt_audit.targets._kernels import VMEM, entry_arrays, step_kernels

    data = ROOT / "bench" / "data"
    measured = {r["case"]: {k[0]: k[7] for k in r["kernels"]} for r in map(json.loads, gzip.decompress(
        (data / "tpu-v5e-small-kernels.jsonl.gz").read_bytes()).decode().splitlines())}
    modules = {r["case"]: r["module_ns"] for r in map(json.loads, (data / "tpu-v5e-small-profile.jsonl")
                                                       .read_text().splitlines())}
    steps = {r["case"]: r["seconds_per_step"] for name in ("tpu-v5e-small.jsonl", "tpu-v5e-small-held.jsonl")
             for r in map(json.loads, (data / name).read_text().splitlines()) if r.get("verdict") == "ran"}
    topo = topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1)
    lines = []
    for name, target, policy, defines in CASES + [c for n in sorted(ROUNDS) for c in ROUNDS[n]]:
        if name not in modules:
            continue
        kept = hlo / (name.replace(" ", "_") + ".txt.gz") if hlo else None
        if kept and kept.exists():
            text = gzip.decompress(kept.read_bytes()).decode()
        else:
            fn, args, donate = step_of(target, policy, defines)
            text = jax.jit(fn, donate_argnums=donate).lower(*_placed(args, topo.devices[0])).compile().as_text() or ""
            if kept:
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_bytes(gzip.compress(text.encode(), mtime=0))
        kernels = [{**_plain(k), "measured_ns": measured[name].get(k.name)}
                   for k in step_kernels(text, 1, 1, VMEM)]
        held = next((n for n, cases in ROUNDS.items() if name in {c[0] for c in cases}), 0)
        lines.append(json.dumps({"case": name, "held_out": held, "module_ns": modules[name],
                                 "seconds_per_step": steps[name], "arrays": entry_arrays(text), "kernels": kernels},
                                separators=(",", ":")) + "\n")
        print(name, len(kernels), flush=True)
    out.write_bytes(gzip.compress("".join(lines).encode(), mtime=0))


def read_steps(path: Path) -> list[dict[str, Any]]:
    """`steps_file`'s rows, each step's kernels as te-ckpt-audit's `Kernel`s (`kernels`) and their
    measured seconds per run (`measured`, by name; None: no event of that name)."""
    import gzip

    rows = []
    for r in map(json.loads, gzip.decompress(path.read_bytes()).decode().splitlines()):
        raw = r.pop("kernels")
        r["measured"] = {k["name"]: k["measured_ns"] * 1e-9 if k["measured_ns"] is not None else None for k in raw}
        r["kernels"] = [_kernel({f: v for f, v in k.items() if f != "measured_ns"}) for k in raw]
        rows.append(r)
    return rows


def _classes(step: dict[str, Any], costs: Any) -> tuple[float, float, float, float, list[float]]:
    """A step's kernels that ran (measured), by class: the GEMMs' estimated and measured seconds,
    the others' (libtpu's or the roofline's part only) and measured, and the others' VMEM bytes,
    index vectors and runs."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import KernelKind
    from te_ckpt_audit.tpus import tpu_model

    chip = tpu_model("v5e")
    gemm = gemm_took = other = other_took = 0.0
    counts = [0.0, 0.0, 0.0]
    for k in step["kernels"]:
        took = step["measured"].get(k.name)
        if k.waits_for or k.vmem_copy or took is None or k.kind is KernelKind.COLLECTIVE:
            continue
        if k.kind in (KernelKind.GEMM, KernelKind.ATTENTION):
            gemm += steptime.tpu_timed(k, chip, costs).seconds * k.runs
            gemm_took += took * k.runs
        else:
            bare = dataclasses.replace(k, vmem_bytes=0, indices=0)
            other += steptime.tpu_timed(bare, chip, dataclasses.replace(costs, kernel_s=0.0)).seconds * k.runs
            other_took += took * k.runs
            counts[0] += k.vmem_bytes * k.runs
            counts[1] += k.indices * k.runs
            counts[2] += k.runs
    return gemm, gemm_took, other, other_took, counts


def device_seconds(step: dict[str, Any], costs: Any) -> float:
    """A step's device time under `costs`: its kernels in their scheduled order, no cost per step
    (`_steptime.tpu_estimate` without the host)."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.tpus import tpu_model

    found = steptime.tpu_estimate(step["kernels"], tpu_model("v5e"), 1, 0.0, 0, dataclasses.replace(costs, step_s=0.0))
    assert found.seconds is not None
    return found.seconds


def fit_kernels(path: Path, quiet: bool = False, rounds: tuple[int, ...] = (0,)) -> Any:
    """The per-kernel costs fitted on the fitted steps of `steps_file`'s rows (round 0; the held-out
    rounds stay out), each on what it prices: the other kernels' VMEM bandwidth, time per index
    vector and cost per run on their measured time (least squares, each step's error relative to its
    device time); a GEMM's fill (a share of its estimate, at most a time) on the GEMMs'; the DMAs'
    pace and the step's own cost on the steps' device time (the profile's module); the host's line
    on the steps the host bounds. Returns the `TpuCosts`. `rounds`: the rounds fitted on (0: the
    fitted steps; 1-3 the held-out rounds, to try what fitting on them would change)."""
    import numpy as np

    from te_ckpt_audit.targets import _steptime as steptime

    steps = [s for s in read_steps(path) if not any(k.cycles >= steptime.UNESTIMATED_CYCLES for k in s["kernels"])]
    fitted = [s for s in steps if s["held_out"] in rounds]
    base = steptime.TpuCosts(efficiency=steptime.TPU_EFFICIENCY)
    module = np.array([s["module_ns"] * 1e-9 for s in fitted])
    parts = [_classes(s, base) for s in fitted]
    x = np.array([p[4] for p in parts]) / module[:, None]
    y = np.array([p[3] - p[2] for p in parts]) / module
    per_byte, per_index, per_run = np.linalg.lstsq(x, y, rcond=None)[0]
    costs = dataclasses.replace(base, vmem_bandwidth=float(f"{1 / per_byte:.3g}"), index_s=round(float(per_index), 11),
                                kernel_s=round(float(per_run), 9))
    best: tuple[float, float, float] | None = None
    for fill, cap in itertools.product(np.arange(0, 21) * 0.05, np.arange(0, 21) * 1e-6):
        trial = dataclasses.replace(costs, gemm_fill=round(float(fill), 2), gemm_fill_s=round(float(cap), 7))
        miss = float(np.mean((np.array([c[0] - c[1] for c in (_classes(s, trial) for s in fitted)]) / module) ** 2))
        if best is None or miss < best[0]:
            best = (miss, trial.gemm_fill, trial.gemm_fill_s)
    assert best is not None
    costs = dataclasses.replace(costs, gemm_fill=best[1], gemm_fill_s=best[2])
    found: tuple[float, float, float] | None = None
    for slowdown in np.arange(10, 41) * 0.05:
        trial = dataclasses.replace(costs, dma_slowdown=round(float(slowdown), 2))
        device = np.array([device_seconds(s, trial) for s in fitted])
        constant = max(0.0, float(np.sum((module - device) / module ** 2) / np.sum(1 / module ** 2)))
        error = float(np.mean(((device + constant) / module - 1) ** 2))
        if found is None or error < found[0]:
            found = (error, trial.dma_slowdown, constant)
    assert found is not None
    costs = dataclasses.replace(costs, dma_slowdown=found[1])
    measured = np.array([s["seconds_per_step"] for s in fitted])
    bound = module < 0.8 * measured  # the host's pace: the step well above its device time
    lag = float(np.median((measured - module)[~bound]))  # a step the device bounds: its module, and this
    a = np.array([[1.0, s["arrays"]] for s, b in zip(fitted, bound, strict=True) if b]) / measured[bound][:, None]
    host_step, host_array = np.linalg.lstsq(a, np.ones(int(bound.sum())), rcond=None)[0]
    costs = dataclasses.replace(costs, step_s=round(found[2] + lag, 7),
                                host_step_s=round(float(host_step), 7), host_array_s=round(float(host_array), 8))
    if not quiet:
        print(f"fitted on {len(fitted)} steps: {costs}")
    return costs


def window_rates(path: Path) -> dict[str, float]:
    """The window taps per second the chip ran the reduce-windows libtpu gave no estimate at, to
    three figures, by where libtpu runs the window: along the tile's lanes over the fitted steps of
    `steps_file` (`_steptime.TPU_WINDOW_TAPS_PER_S`), down its sublanes over the steps that had one
    (round 5's: `_steptime.TPU_WINDOW_SUBLANE_TAPS_PER_S`)."""
    from te_ckpt_audit.targets import _steptime as steptime

    sums = {"lanes": [0.0, 0.0], "sublanes": [0.0, 0.0]}
    for s in read_steps(path):
        for k in s["kernels"]:
            if k.window_taps and k.cycles >= steptime.UNESTIMATED_CYCLES and (k.window_sublane or not s["held_out"]):
                found = sums["sublanes" if k.window_sublane else "lanes"]
                found[0] += k.window_taps * k.runs
                found[1] += s["measured"][k.name] * k.runs
    return {kind: float(f"{taps / took:.3g}") for kind, (taps, took) in sums.items() if took}


def kernel_errors(path: Path, costs: Any) -> list[tuple[str, int, float, float]]:
    """Each step of `steps_file`'s rows whose kernels libtpu all estimated: (case, held-out round,
    measured and estimated seconds per step under `costs`)."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.tpus import tpu_model

    out = []
    for s in read_steps(path):
        found = steptime.tpu_estimate(s["kernels"], tpu_model("v5e"), 1, 0.0, s["arrays"], costs)
        assert found.seconds is not None
        if not found.unestimated:
            out.append((s["case"], s["held_out"], s["seconds_per_step"], found.seconds))
    return out


BIG_ROWS = ("tpu-v5e-time.jsonl", "tpu-v5e-wide-time.jsonl", "tpu-v5e-search-time.jsonl", "tpu-v5e-remat3-time.jsonl",
            "tpu-v5e-probe-time.jsonl")  # the big steps the chip ran, each with its estimate (bench/tpu_truth.py)


def band_ratios(path: Path, data: Path = ROOT / "bench" / "data") -> dict[str, list[tuple[float, str]]]:
    """Measured over estimated of every step the chip ran, by what bounds the estimate ("host",
    "small", "large": `_steptime.tpu_band`'s bands): the profiled steps of `steps_file` (estimated
    here, under today's costs; a kernel libtpu could not estimate keeps its step out) and the big
    steps' rows (`BIG_ROWS`, their estimate as committed)."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.tpus import tpu_model

    found: dict[str, list[tuple[float, str]]] = {"host": [], "small": [], "large": []}

    def put(measured: float, estimated: float, host: float, case: str) -> None:
        band = steptime.tpu_band(estimated, host)
        kind = "host" if band == steptime.TPU_HOST_BAND else "small" if band == steptime.TPU_SMALL_BAND else "large"
        found[kind].append((measured / estimated, case))

    for s in read_steps(path):
        t = steptime.tpu_estimate(s["kernels"], tpu_model("v5e"), 1, 0.0, s["arrays"])
        if t.seconds is not None and not t.unestimated:
            put(s["seconds_per_step"], t.seconds, t.dispatch_seconds, s["case"])
    for name in BIG_ROWS:
        for r in map(json.loads, (data / name).read_text().splitlines()):
            put(r["measured_seconds"], r["estimated_seconds"], 0.0, r["case"])
    return found


def bands(path: Path) -> dict[str, tuple[float, float]]:
    """`band_ratios`' least and most by band, widened to two decimals: `_steptime`'s TPU bands."""
    return {kind: (math.floor(min(r for r, _ in rows) * 100) / 100, math.ceil(max(r for r, _ in rows) * 100) / 100)
            for kind, rows in band_ratios(path).items()}


def shared_hbm(rows: list[Any], hbm: float, depth: int = 0, runs: int = 1) -> float:
    """`_steptime.elapsed` for a TPU step with no collectives, but a DMA between HBM and VMEM
    advances beside a kernel only with the HBM bandwidth the kernel leaves it: at 1 - u of its pace,
    u the kernel's bytes at `hbm` over its time (a loop: its body's); the DMAs one after another.
    A what-if (`what_if`), not the estimate."""
    from te_ckpt_audit.targets import _steptime as steptime

    now = moved = 0.0
    queue: list[list[Any]] = []  # the DMAs started and not done: [name, seconds left at the full pace]
    done: dict[str, float] = {}

    def beside(seconds: float, used: float) -> None:
        at, left, pace = now, seconds, max(0.0, 1.0 - used)
        while queue and left > 0 and pace > 0:
            need = queue[0][1] / pace
            if need > left:
                queue[0][1] -= left * pace
                return
            at, left = at + need, left - need
            done[queue.pop(0)[0]] = at

    i = 0
    while i < len(rows):
        t, k = rows[i], rows[i].kernel
        if len(k.loop) > depth:
            j = i
            while j < len(rows) and rows[j].kernel.loop[:depth + 1] == k.loop[:depth + 1]:
                j += 1
            trips = steptime._trips(rows[i:j], runs)
            took = shared_hbm(rows[i:j], hbm, depth + 1, runs * trips) * trips
            read = sum(r.kernel.bytes * r.kernel.runs for r in rows[i:j] if not r.kernel.vmem_copy) / hbm
            beside(took, min(1.0, read / took) if took else 0.0)
            now, i = now + took, j
            continue
        if k.waits_for:
            while any(q[0] == k.waits_for for q in queue):  # nothing beside it now: the DMAs at their pace
                name, left = queue.pop(0)
                now += left
                done[name] = now
            now = max(now, done.get(k.waits_for, now))
        elif k.vmem_copy and k.asynchronous:
            queue.append([k.name, t.seconds])
            moved += t.seconds
        else:
            beside(t.seconds, min(1.0, k.bytes / hbm / t.seconds) if t.seconds > 0 else 0.0)
            now += t.seconds
        i += 1
    return max(now, moved) if depth else now


def what_if(path: Path) -> dict[str, dict[int, list[float]]]:
    """Each profiled step of 0.3 ms to 1 s (`steps_file`), its error |estimated / measured - 1| by
    round under: today's estimate ("today"); with each DMA sharing HBM with the kernel beside it
    (`shared_hbm`: "shared HBM"); its GEMMs at the chip's measured time ("chip's GEMMs"); and both
    ("and shared HBM"). Where the 10% goal is held: the GEMMs, and the DMAs' share of HBM pays only
    once the GEMMs are right."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import KernelKind
    from te_ckpt_audit.tpus import tpu_model

    chip, costs = tpu_model("v5e"), steptime.TPU_COSTS
    found: dict[str, dict[int, list[float]]] = {"today": {}, "shared HBM": {}, "chip's GEMMs": {},
                                                "and shared HBM": {}}
    for s in read_steps(path):
        if not 0.3e-3 <= s["seconds_per_step"] <= 1.0:
            continue
        rows = [steptime.tpu_timed(k, chip) for k in s["kernels"]]
        gemms = [steptime.Timed(t.kernel, *(s["measured"][t.kernel.name],) * 3, t.basis)
                 if t.kernel.kind is KernelKind.GEMM and not t.kernel.waits_for
                 and s["measured"].get(t.kernel.name) is not None else t for t in rows]
        host = costs.host_step_s + costs.host_array_s * s["arrays"]
        hbm = chip.hbm_attained or chip.hbm_bandwidth
        for name, device in (("today", steptime.elapsed(rows)), ("shared HBM", shared_hbm(rows, hbm)),
                             ("chip's GEMMs", steptime.elapsed(gemms)), ("and shared HBM", shared_hbm(gemms, hbm))):
            seconds = max(device + costs.step_s, host)
            found[name].setdefault(s["held_out"], []).append(abs(seconds / s["seconds_per_step"] - 1))
    return found


def kind_sums(path: Path, costs: Any = None) -> dict[tuple[str, str], tuple[float, float, int]]:
    """Where the estimate misses, by kernel kind: over the profiled steps (`steps_file`), each
    (kind, size of the estimate per run): the estimated and measured seconds and the runs, DMAs and
    kernels libtpu gave no estimate apart; `costs` the estimate's (`_steptime.TPU_COSTS`) unless given."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.targets._kernels import KernelKind
    from te_ckpt_audit.tpus import tpu_model

    chip = tpu_model("v5e")
    sums: dict[tuple[str, str], tuple[float, float, int]] = {}
    for step in read_steps(path):
        for k in step["kernels"]:
            measured = step["measured"].get(k.name)
            if measured is None or k.vmem_copy or k.waits_for or k.kind is KernelKind.COLLECTIVE:
                continue
            seconds = steptime.tpu_timed(k, chip, costs or steptime.TPU_COSTS).seconds
            size = ("libtpu gave no estimate" if k.cycles >= steptime.UNESTIMATED_CYCLES else "under 1 us"
                    if seconds < 1e-6 else "1-10 us" if seconds < 1e-5 else "10 us or more")
            kind = k.kind.name.lower() + (" (gather, scatter)" if k.indices else " (in VMEM)" if not k.bytes else "")
            estimated, took, counted = sums.get((kind, size), (0.0, 0.0, 0))
            sums[(kind, size)] = (estimated + seconds * k.runs, took + measured * k.runs, counted + k.runs)
    return sums


def kinds(path: Path) -> None:
    """`kind_sums` as the Markdown table of docs/guide/tpu.md."""
    print("| kind | estimate per run | runs | estimated, ms | measured, ms | measured / estimated |")
    print("|---|---|---:|---:|---:|---:|")
    for (kind, size), (estimated, measured, runs) in sorted(kind_sums(path).items()):
        ratio = f"{measured / estimated:.2f}" if estimated else "-"
        print(f"| {kind} | {size} | {runs:,.0f} | {estimated * 1e3:.3f} | {measured * 1e3:.3f} | {ratio} |")


def table(path: Path) -> None:
    """The Markdown table of docs/guide/tpu.md: each profiled step (`steps_file`) as the chip ran it
    against the estimate of the same program under today's costs, and the median and worst error of
    the steps of 0.3 ms to 1 s, fitted and each held-out round."""
    from te_ckpt_audit.targets import _steptime as steptime
    from te_ckpt_audit.tpus import tpu_model

    chip = tpu_model("v5e")
    print("| step | | kernel runs | arrays | chip, ms | device, ms | estimate, ms | error | host, ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    errors: dict[int, list[float]] = {}
    for s in read_steps(path):
        found = steptime.tpu_estimate(s["kernels"], chip, 1, 0.0, s["arrays"])
        assert found.seconds is not None
        error = found.seconds / s["seconds_per_step"] - 1
        flag = " (a kernel libtpu gave no estimate)" if found.unestimated else ""
        if not found.unestimated and 0.3e-3 <= s["seconds_per_step"] <= 1.0:
            errors.setdefault(s["held_out"], []).append(abs(error))
        print(f"| {s['case']}{flag} | {'held out, round ' + str(s['held_out']) if s['held_out'] else 'fitted'} | "
              f"{found.kernels:,} | {s['arrays']} | {s['seconds_per_step'] * 1e3:.3f} | {s['module_ns'] / 1e6:.3f} | "
              f"{found.seconds * 1e3:.3f} | {100 * error:+.1f}% | {found.dispatch_seconds * 1e3:.3f} |")
    print()
    for held, e in sorted(errors.items()):
        e.sort()
        print(f"{'Fitted' if not held else f'Held out, round {held}'}: {len(e)} steps of 0.3 ms to 1 s, every kernel "
              f"estimated: median {100 * statistics.median(e):.1f}%, worst {100 * e[-1]:.1f}%, "
              f"{sum(x < 0.10 for x in e)} within 10%.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--on-chip", action="store_true", help="compile and run every case on this machine's TPU")
    where.add_argument("--refresh", type=Path, metavar="ROWS", help="each row's estimate again, compiled here")
    where.add_argument("--table", type=Path, metavar="STEPS", help="--steps' file: the Markdown table of the steps")
    where.add_argument("--kernel-rows", nargs=2, type=Path, metavar=("DIR", "OUT"),
                       help="the profiled steps' kernels (--profile's DIR) with their measured times, gzipped")
    where.add_argument("--profile-rows", nargs=2, type=Path, metavar=("DIR", "OUT"),
                       help="--profile's DIR summarized as bench/data/tpu-v5e-small-profile.jsonl keeps it, appended")
    where.add_argument("--kinds", type=Path, metavar="STEPS", help="--steps' file: the estimate's miss by kind")
    where.add_argument("--steps", type=Path, metavar="OUT",
                       help="every profiled step read as the estimate reads it, with the chip's times")
    where.add_argument("--fit-kernels", type=Path, metavar="STEPS",
                       help="--steps' file: the per-kernel costs fitted on the fitted steps, every step's error")
    where.add_argument("--what-if", type=Path, metavar="STEPS",
                       help="--steps' file: the small steps' error with the chip's GEMMs, and DMAs sharing HBM")
    where.add_argument("--bands", type=Path, metavar="STEPS",
                       help="--steps' file: how far the chip's steps strayed from the estimate, by band")
    where.add_argument("--profile", type=Path, metavar="DIR",
                       help="on the chip: every step (fitted and held out) traced, each kernel's time and the HLO")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--held-out", type=int, nargs="?", const=1, choices=sorted(ROUNDS),
                        help="with --on-chip: the steps never fitted on (round 1 to 6)")
    parser.add_argument("--out", type=Path, help="JSON lines, appended")
    parser.add_argument("--hlo", type=Path, help="with --steps: a folder keeping the compiled programs' text")
    args = parser.parse_args()
    if args.fit_kernels:
        costs = fit_kernels(args.fit_kernels)
        errors = kernel_errors(args.fit_kernels, costs)
        for case, held, measured, estimated in errors:
            print(f"{'fitted' if not held else f'round {held}':8s} {case:40s} measured {measured * 1e3:8.3f} ms  "
                  f"estimated {estimated * 1e3:8.3f} ms ({100 * (estimated / measured - 1):+6.1f}%)")
        for held in (0, 1, 2):
            e = sorted(abs(est / m - 1) for _, h, m, est in errors if h == held and 0.3e-3 <= m <= 1.0)
            print(f"{'fitted' if not held else f'round {held}'}: {len(e)} steps of 0.3 ms to 1 s, median "
                  f"{100 * statistics.median(e):.1f}%, worst {100 * e[-1]:.1f}%, {sum(x < 0.10 for x in e)} within 10%")
        return
    if args.kinds:
        kinds(args.kinds)
        return
    if args.what_if:
        for name, rounds in what_if(args.what_if).items():
            held = [e for n, es in rounds.items() if n for e in es]
            print(f"{name:15s} " + " | ".join(f"{'fitted' if not n else f'round {n}'} median "
                                              f"{100 * statistics.median(es):.1f}% worst {100 * max(es):.1f}%"
                                              for n, es in sorted(rounds.items()))
                  + f" | held out: {sum(e < 0.10 for e in held)} of {len(held)} within 10%")
        return
    if args.bands:
        for kind, rows in band_ratios(args.bands).items():
            rows.sort()
            print(f"{kind}: {len(rows)} steps, measured / estimated {rows[0][0]:.3f} ({rows[0][1]}) to "
                  f"{rows[-1][0]:.3f} ({rows[-1][1]})")
        print(bands(args.bands))
        return
    if args.kernel_rows:
        kernel_rows(*args.kernel_rows)
        return
    if args.profile_rows:
        with args.profile_rows[1].open("a") as f:
            for raw in map(json.loads, (args.profile_rows[0] / "profile.jsonl").read_text().splitlines()):
                f.write(json.dumps(summarized(raw), sort_keys=True) + "\n")
        return
    sys.path.insert(0, str(ROOT / "bench"))
    if args.refresh:
        refresh(args.refresh)
        return
    if args.steps:
        steps_file(args.steps, args.hlo)
        return
    if args.profile:  # bench/tpu_truth.py's trace: the device's own time per kernel, beside the module
        from tpu_truth import profile_row

        args.profile.mkdir(parents=True, exist_ok=True)
        chosen = ROUNDS[args.held_out] if args.held_out else CASES + HELD_OUT + HELD_OUT_2
        for case in (c for c in chosen if args.only in c[0]):
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
