"""The same training step, compiled and run on a real TPU chip, and compiled here for that TPU
without one: the ground truth for `--tpu` (issue 47). One JSON line per (model, policy, batch) point.

    # on the lent TPU v5e (the device tool), each case compiled by the chip's libtpu and run:
    PYTHONPATH=. python bench/tpu_truth.py --on-chip --cases llama --out $OUT/chip-llama.jsonl
    # here, deviceless, for the same chip (the [tpu] extra: jax[tpu], libtpu), the prediction:
    JAX_PLATFORMS=cpu PYTHONPATH=. python bench/tpu_truth.py --deviceless v5e:1x1 --cases llama \\
        --out bench/data/tpu-v5e-deviceless-llama.jsonl

Each point is one training step as te-ckpt-audit builds it (`_step.training_step`: the loss's
value and gradients under the policy, and an AdamW update with its state, parameters and state
donated), over the inputs callable's ShapeDtypeStructs. On the chip: `compiled.memory_analysis()`
of the chip's own compile (the plan), whether the chip took it (compiled, then ran) or refused it
(RESOURCE_EXHAUSTED, at compile or at run, with the first line of its message), and, where it ran,
seconds per step: 3 steps of warm-up, then the median of 7, each with `block_until_ready`, the
params and state fed back as a training loop does. Deviceless: the plan only. bench/data/ keeps
the rows; docs/runs.md and docs/guide/tpu.md show them.

The time estimate's studies: `--estimate` (te-ckpt-audit's own `--tpu --time` of each point that
ran, against the chip), `--profile` (on the chip: every kernel's measured time), `--kinds` (those
kernels against libtpu's estimates, by kind), `--kernels` (single kernels on the chip), `--cost`
(what `--time` adds to a run), `--on-chip --from-search` (a throughput search's points on the chip);
`--table`, `--time-table` and `--truth-table` print the docs' and README's tables.
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

GIB = 2**30
LLAMA = {"model": "llama-1b", "layers": 12, "seq": 1024}  # 0.74B parameters: AdamW's state fits, batches cross
WIDE7B = {"model": "llama2-7b", "layers": 2, "seq": 2048}
GPT = {"layers": 12, "seq": 1024, "d_model": 1024, "heads": 16, "d_ff": 4096, "vocab": 32768}  # f32 attention
MLP = {"d_in": 4096, "d_hidden": 16384, "d_out": 4096}  # not a transformer: three wide layers
# (case, target, policy, defines): llama's policies are its own (MaxText's remat_policy), as-is
CASES: dict[str, list[tuple[str, str, str, dict[str, Any]]]] = {
    "llama": [
        *((f"llama full b{b}", "sample_models/llama.py:loss", "as-is",
           {**LLAMA, "remat": "full", "per_device_batch": b}) for b in (4, 8, 16, 20, 24, 28)),
        *((f"llama minimal b{b}", "sample_models/llama.py:loss", "as-is",
           {**LLAMA, "remat": "minimal", "per_device_batch": b}) for b in (4, 8, 12, 16)),
    ],
    "edge": [  # the chip's line between the two verdicts, batch by batch
        *((f"llama full b{b}", "sample_models/llama.py:loss", "as-is",
           {**LLAMA, "remat": "full", "per_device_batch": b}) for b in (25, 26, 27)),
        *((f"llama minimal b{b}", "sample_models/llama.py:loss", "as-is",
           {**LLAMA, "remat": "minimal", "per_device_batch": b}) for b in (5, 6, 7)),
    ],
    "gpt": [
        *((f"gpt nothing_saveable b{b}", "sample_models/gpt.py:loss", "nothing_saveable", {**GPT, "batch": b})
          for b in (4, 8, 16, 24)),
        *((f"gpt checkpoint_dots b{b}", "sample_models/gpt.py:loss", "checkpoint_dots", {**GPT, "batch": b})
          for b in (2, 4, 8, 12)),
    ],
    "neighbours": [  # around the GPT search's points (bench/data/tpu-v5e-search.json): the measured best of the space
        *((f"gpt everything_saveable b{b}", "sample_models/gpt.py:loss", "everything_saveable", {**GPT, "batch": b})
          for b in (2, 5, 6)),
        *((f"gpt nothing_saveable b{b}", "sample_models/gpt.py:loss", "nothing_saveable", {**GPT, "batch": b})
          for b in (6, 10, 12)),
    ],
    "wide": [  # Llama-2 7B's width, 2 layers, sequence 2048: wide GEMM-bound steps (the estimate leans slow there)
        *((f"llama7b-2l {remat} b{b}", "sample_models/llama.py:loss", "as-is",
           {**WIDE7B, "remat": remat, "per_device_batch": b})
          for remat, batches in (("full", (1, 2, 4, 6, 8)), ("minimal", (1, 2, 3, 4))) for b in batches),
    ],
    "mlp": [
        *((f"mlp nothing_saveable b{b}", "sample_models/mlp.py:loss", "nothing_saveable", {**MLP, "batch": b})
          for b in (8192, 65536, 98304)),
        *((f"mlp everything_saveable b{b}", "sample_models/mlp.py:loss", "everything_saveable", {**MLP, "batch": b})
          for b in (8192, 32768, 49152)),
    ],
    "probe": [  # which kernels libtpu misjudges: the MLP in bf16 (is it float32?) and the search's two leaders
        *((f"mlp-bf16 {policy} b8192", "sample_models/mlp.py:loss", policy, {**MLP, "batch": 8192, "dtype": "bfloat16"})
          for policy in ("nothing_saveable", "everything_saveable")),
        ("gpt everything_saveable b4", "sample_models/gpt.py:loss", "everything_saveable", {**GPT, "batch": 4}),
    ],
}
# `recommend --tpu v5e --maximize throughput` on the GPT (bench/data/tpu-v5e-search.json): the
# points it compiled are run on the chip (`--on-chip --from-search`), its pick against the fastest
SEARCH_TARGET = "sample_models/gpt.py:loss"
FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
          "generated_code_size_in_bytes")


def step_of(target: str, policy: str, defines: dict[str, Any],
            name_lines: bool = False) -> tuple[Any, tuple[Any, ...], tuple[int, ...]]:
    """The training step te-ckpt-audit compiles for this target and policy: (fn, args, donated);
    `name_lines`: with the tool's names on the model's matmul lines (`--name-lines`)."""
    import optax

    from te_ckpt_audit._session import Session
    from te_ckpt_audit.analysis._apply import policy_function
    from te_ckpt_audit.specs import resolve_policy
    from te_ckpt_audit.targets._step import training_step

    session = Session.of_target(target, defines=defines, name_lines=name_lines)
    spec = resolve_policy(policy)
    traced = session._traced
    fun = policy_function(traced, spec, session.resolved_scope(spec), calls=False)
    step = training_step(traced, fun, list(traced.avals), optax.adamw(1e-4))
    return step.fn, step.args, step.donate


def _placed(args: tuple[Any, ...], device: Any) -> tuple[Any, ...]:
    import jax
    from jax.sharding import SingleDeviceSharding

    one = SingleDeviceSharding(device)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), args)


def _plan(compiled: Any) -> dict[str, int]:
    stats = compiled.memory_analysis()
    return {f: int(getattr(stats, f)) for f in FIELDS}


def _refusal(exc: BaseException) -> str | None:
    text = str(exc)
    return text.splitlines()[0][:400] if "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text else None


def on_chip(name: str, target: str, policy: str, defines: dict[str, Any], steps: int = 7) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    fn, args, donate = step_of(target, policy, defines)
    device = jax.devices()[0]
    row: dict[str, Any] = {"case": name, "target": target, "policy": policy, "defines": defines,
                           "device": device.device_kind, "jax": jax.__version__, "libtpu": _libtpu(),
                           **_new_remat()}
    start = time.perf_counter()
    try:
        compiled = jax.jit(fn, donate_argnums=donate).lower(*_placed(args, device)).compile()
    except Exception as exc:  # noqa: BLE001 - the chip's verdict, recorded
        row.update(verdict="refused at compile", refusal=_refusal(exc) or f"{type(exc).__name__}: {str(exc)[:300]}")
        return row
    row.update(plan=_plan(compiled), compile_seconds=round(time.perf_counter() - start, 2))
    values = list(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), args))
    trained = [i for i in donate if i != len(args) - 1]
    try:
        times = []
        for i in range(3 + steps):
            begin = time.perf_counter()
            loss, params, state = compiled(*values)
            jax.block_until_ready((loss, params, state))
            if i >= 3:
                times.append(time.perf_counter() - begin)
            values[trained[0]], values[-1] = params, state  # the loop a training run is
    except Exception as exc:  # noqa: BLE001 - the chip's verdict, recorded
        row.update(verdict="refused at run", refusal=_refusal(exc) or f"{type(exc).__name__}: {str(exc)[:300]}")
        return row
    row.update(verdict="ran", seconds_per_step=statistics.median(times), spread=(max(times) - min(times)) / min(times))
    return row


def deviceless(name: str, target: str, policy: str, defines: dict[str, Any], topology: str) -> dict[str, Any]:
    import jax
    from jax.experimental import topologies

    fn, args, donate = step_of(target, policy, defines)
    kind, _, shape = topology.partition(":")
    bounds = tuple(int(x) for x in shape.split("x")) + (1,) * (3 - len(shape.split("x")))
    topo = topologies.get_topology_desc(platform="tpu", topology_name=topology, chip_config_name="default",
                                        chips_per_host_bounds=bounds, num_slices=1)
    row: dict[str, Any] = {"case": name, "target": target, "policy": policy, "defines": defines,
                           "topology": topology, "device": topo.devices[0].device_kind, "jax": jax.__version__,
                           "libtpu": _libtpu(), **_new_remat()}
    start = time.perf_counter()
    try:  # the deviceless compile applies the chip's own HBM check: its refusal is the chip's
        compiled = jax.jit(fn, donate_argnums=donate).lower(*_placed(args, topo.devices[0])).compile()
    except Exception as exc:  # noqa: BLE001 - the verdict, recorded
        row.update(verdict="refused at compile", refusal=_refusal(exc) or f"{type(exc).__name__}: {str(exc)[:300]}")
        return row
    row.update(verdict="compiled", plan=_plan(compiled), compile_seconds=round(time.perf_counter() - start, 2))
    return row


def estimated_cycles(hlo_text: str) -> int:
    """libtpu's own per-kernel estimates of a compiled module, summed over one step as
    te-ckpt-audit sums them (`_target._kernels`: a loop's body times its trips)."""
    from te_ckpt_audit.targets._kernels import step_kernels

    return sum(k.cycles * k.runs for k in step_kernels(hlo_text))


def time_rows(chip: Path, fitted_on: bool = True) -> list[dict[str, Any]]:
    """Each point that ran on the chip, estimated by te-ckpt-audit itself (`--tpu v5e --optimizer
    adamw --time`, through the library), against its measured seconds per step. The 1st, 3rd, ...
    rows are the ones `_steptime.TPU_EFFICIENCY` was fitted on (the median of measured over
    unscaled estimate); the others are held out. `fitted_on=False`: rows the constant never saw,
    every one held out."""
    from te_ckpt_audit import audit_target
    from te_ckpt_audit.gpus import Optimizer
    from te_ckpt_audit.targets._steptime import TPU_EFFICIENCY
    from te_ckpt_audit.tpus import TpuRequest, parse_tpu

    request = TpuRequest(parse_tpu("v5e"), Optimizer.ADAMW, time=True)
    ran = [r for r in map(json.loads, chip.read_text().splitlines()) if r.get("verdict") == "ran"]
    out = []
    for i, r in enumerate(ran):
        result = audit_target(r["target"], [r["policy"]], defines=r["defines"], tpu=request).results[0]
        time = result.time
        assert time is not None and time.seconds is not None, (r["case"], time)
        plan = result.tpu_plan
        assert plan is not None
        same_plan = [plan.argument_bytes, plan.output_bytes, plan.alias_bytes, plan.temp_bytes] == [
            r["plan"][f] for f in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                                   "temp_size_in_bytes")]
        row = {"case": r["case"], "estimated_seconds": time.seconds, "measured_seconds": r["seconds_per_step"],
               "fits": plan.fits, "same_plan_as_chip": same_plan, "kernels": time.kernels,
               "overhead_seconds": time.overhead_seconds,  # the step's own cost (per step and kernel run)
               "unscaled_seconds": (time.seconds - time.overhead_seconds) / TPU_EFFICIENCY,
               "fitted": fitted_on and i % 2 == 0, "error": time.seconds / r["seconds_per_step"] - 1}
        print(f"{r['case']:34s} {time.seconds:8.4f} s estimated {r['seconds_per_step']:8.4f} s measured "
              f"{100 * row['error']:+6.1f}% {'(fitted)' if row['fitted'] else ''}", flush=True)
        out.append(row)
    held = sorted(abs(r["error"]) for r in out if not r["fitted"])
    if fitted_on:
        fitted = statistics.median((r["measured_seconds"] - r["overhead_seconds"]) / r["unscaled_seconds"]
                                   for r in out if r["fitted"])
        print(f"constant from the fitted rows: {fitted:.3f} (the estimate's: {TPU_EFFICIENCY})")
    print(f"held out: median {100 * statistics.median(held):.1f}%, worst {100 * held[-1]:.1f}% over {len(held)} rows")
    return out


def kind_rows(profile: Path, topology: str = "v5e:1x1") -> list[dict[str, Any]]:
    """Each profiled point compiled here again (the chip's program: the same plan, the same
    instruction names), its kernels (te-ckpt-audit's reader) joined with the chip's measured time
    per kernel: measured over libtpu's estimate (cycles at the clock), by kind of kernel; beside
    them each kind's roofline (its bytes at the attained HBM bandwidth; a GEMM's FLOPs at the peak,
    if more), the sum, kernel by kernel, of the lesser of libtpu's estimate and that roofline, and
    the estimate's own rule before its constant (`_steptime.tpu_timed`; `--rules` compares them)."""
    import jax
    from jax.experimental import topologies

    from te_ckpt_audit.targets._kernels import VMEM, step_kernels
    from te_ckpt_audit.targets._steptime import TPU_EFFICIENCY, tpu_roofline, tpu_timed
    from te_ckpt_audit.tpus import tpu_model

    chip = tpu_model("v5e")
    topo = topologies.get_topology_desc(platform="tpu", topology_name=topology, chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1)
    out = []
    for r in map(json.loads, profile.read_text().splitlines()):
        fn, args, donate = step_of(r["target"], r["policy"], r["defines"])
        text = jax.jit(fn, donate_argnums=donate).lower(*_placed(args, topo.devices[0])).compile().as_text() or ""
        measured = {name: ns for name, (_, ns) in r["lines"]["XLA Ops"].items()}
        kinds: dict[str, list[float]] = {}
        for k in {k.name: k for k in step_kernels(text, on_chip=VMEM)}.values():
            sums = kinds.setdefault(k.kind.value, [0.0] * 5)
            libtpu, roofline = k.cycles * k.runs / chip.clock_hz, tpu_roofline(k, chip) * k.runs
            rule = tpu_timed(k, chip).seconds * k.runs / TPU_EFFICIENCY
            for i, value in enumerate((measured.get(k.name, 0.0) / 1e9, libtpu, roofline, min(libtpu, roofline), rule)):
                sums[i] += value
        module = sum(ns for _, ns in r["lines"]["XLA Modules"].values()) / 1e9
        row = {"case": r["case"], "module_seconds": module,
               "kinds": {kind: {"measured_seconds": m, "libtpu_seconds": e, "roofline_seconds": b,
                                "lesser_seconds": least, "rule_seconds": rule}
                         for kind, (m, e, b, least, rule) in kinds.items()}}
        said = "; ".join(f"{kind} {m:.4f} s measured / {e:.4f} s libtpu = {m / e if e else 0:.2f}, "
                         f"/ {rule:.4f} s rule = {m / rule if rule else 0:.2f}"
                         for kind, (m, e, _, _, rule) in kinds.items())
        print(f"{r['case']:34s} step {module:.4f} s; {said}", flush=True)
        out.append(row)
    return out


def rule_rows(kinds: Path, *times: Path) -> list[dict[str, Any]]:
    """Rules for timing a step's kernels, compared on the chip's own rows (`--kinds` joined with
    `--estimate`'s measured seconds): `libtpu`, every kernel at libtpu's estimate (the estimate's
    first rule); `lesser`, GEMMs at libtpu's estimate and every other kernel at the lesser of it
    and its HBM roofline; `estimate`, the estimate's rule now (`_steptime.tpu_timed`: GEMMs at the
    geometric mean of libtpu's estimate and their roofline, the others at the lesser). Each scaled
    by one constant, the median of measured over unscaled on the rows the estimate was fitted on;
    the others (and every row of a further file) held out."""
    joined = {r["case"]: r for r in map(json.loads, kinds.read_text().splitlines())}
    points = [r for path in times for r in map(json.loads, path.read_text().splitlines()) if r["case"] in joined]
    unscaled = {
        "libtpu": lambda ks: sum(k["libtpu_seconds"] for k in ks.values()),
        "lesser": lambda ks: sum(k["libtpu_seconds"] if kind == "gemm" else k["lesser_seconds"]
                                 for kind, k in ks.items()),
        "estimate": lambda ks: sum(k["rule_seconds"] for k in ks.values())}
    out = []
    for rule, seconds in unscaled.items():
        estimates = {r["case"]: seconds(joined[r["case"]]["kinds"]) for r in points}
        constant = statistics.median(r["measured_seconds"] / estimates[r["case"]] for r in points if r["fitted"])
        errors = {r["case"]: constant * estimates[r["case"]] / r["measured_seconds"] - 1 for r in points}
        held = sorted(abs(errors[r["case"]]) for r in points if not r["fitted"])
        out.append({"rule": rule, "constant": constant, "held_out": len(held), "median": statistics.median(held),
                    "worst": held[-1], "errors": errors})
        print(f"{rule:8s} constant {constant:.3f}: held out ({len(held)}) median {100 * statistics.median(held):.1f}%, "
              f"worst {100 * held[-1]:.1f}%; " + ", ".join(f"{c} {100 * e:+.0f}%" for c, e in errors.items()))
    return out


# MaxText's published v5e runs (maxtext 0.2.5, configs/tpu/v5e/README.md: TFLOP/s per chip on one
# v5e-256, its recipes 16b.sh and 32b.sh): (recipe, settings, published TFLOP/s per chip, MFU)
MAXTEXT_PUBLISHED = (
    ("maxtext configs/tpu/v5e/16b.sh (1x v5e-256)",
     "per_device_batch_size=6 remat_policy=full global_parameter_scale=16", 120, 0.611),
    ("maxtext configs/tpu/v5e/32b.sh (1x v5e-256)",
     "per_device_batch_size=4 remat_policy=full global_parameter_scale=32", 132, 0.6686),
)


def maxtext_rows() -> list[dict[str, Any]]:
    """Each published MaxText v5e recipe through `maxtext --tpu v5e --time` (the library's
    `audit_maxtext`; MaxText's jax 0.12 and its libtpu), against its published TFLOP/s per chip.
    MaxText's step is traced over one CPU device per chip: this script asks JAX for 256 of them,
    as the command-line tool does, before JAX starts."""
    import os

    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=256".strip()
    import jax

    from te_ckpt_audit.maxtext import MaxTextRun, audit_maxtext
    from te_ckpt_audit.tpus import TpuRequest, parse_tpu, tpu_model

    out = []
    for recipe, settings, tflops, mfu in MAXTEXT_PUBLISHED:
        given = (*settings.split(), "max_target_length=2048", "use_iota_embed=true", "reuse_example_batch=1",
                 "compile_topology=v5e-256")
        run = MaxTextRun("base.yml", given, tpu="v5e")
        row = audit_maxtext(run, ["as-is"], tpu=TpuRequest(parse_tpu("v5e", run.devices), None, True)).results[0]
        time, plan = row.time, row.tpu_plan
        assert time is not None and time.seconds is not None and time.mfu is not None and plan is not None, recipe
        estimated = time.mfu * tpu_model("v5e").bf16_flops / 1e12
        out.append({"recipe": recipe, "source": "maxtext 0.2.5 configs/tpu/v5e/README.md",
                    "command": f"te-ckpt-audit maxtext base.yml {' '.join(given)} --tpu v5e --time",
                    "fits": plan.fits, "plan_bytes": plan.plan_bytes, "compile_seconds": plan.compile_seconds,
                    "estimated_seconds": time.seconds, "estimated_mfu": time.mfu,
                    "estimated_tflops_per_chip": estimated, "published_tflops_per_chip": tflops, "published_mfu": mfu,
                    "error_tflops": estimated / tflops - 1,
                    "exposed_communication_seconds": time.exposed_communication_seconds,
                    "tokens_per_second_per_chip": time.tokens_per_second_per_gpu, "jax": jax.__version__,
                    "libtpu": _libtpu()})
        print(f"{recipe}: {time.seconds:.2f} s/step, {estimated:.1f} TFLOP/s per chip estimated, {tflops} published "
              f"({100 * (estimated / tflops - 1):+.1f}%)", flush=True)
    return out


def time_table(rows: Path) -> str:
    """The Markdown table of predicted against measured seconds per step (README, docs/guide/tpu.md)."""
    data = [json.loads(line) for line in rows.read_text().splitlines()]
    out = ["| point | estimated s/step | measured s/step | error | |", "|---|---:|---:|---:|---|"]
    for r in data:
        out.append(f"| {r['case']} | {r['estimated_seconds']:.4f} | {r['measured_seconds']:.4f} | "
                   f"{100 * r['error']:+.1f}% | {'fitted' if r['fitted'] else 'held out'} |")
    held = sorted(abs(r["error"]) for r in data if not r["fitted"])
    out.append(f"\nHeld out ({len(held)} rows): median {100 * statistics.median(held):.1f}%, worst "
               f"{100 * held[-1]:.1f}%.")
    return "\n".join(out)


COST_POINT = ("sample_models/gpt.py:loss", "nothing_saveable", {**GPT, "batch": 4})


def cost_rows(runs: int = 3) -> list[dict[str, Any]]:
    """What `--time` costs on a TPU: one policy's `--tpu v5e --optimizer adamw` run as a whole
    process, with and without `--time`, alternately, `runs` times each; the medians and their
    ratio (the time estimate reads the memory compile's own program: no compile of its own)."""
    import os
    import subprocess

    target, policy, defines = COST_POINT
    base = [sys.executable, "-m", "cli", target, "-p", policy, "--tpu", "v5e", "--optimizer", "adamw",
            "-f", "json", *(f"-D{k}={v}" for k, v in defines.items())]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seconds: dict[str, list[float]] = {"plain": [], "time": []}
    for _ in range(runs):
        for name, extra in (("plain", []), ("time", ["--time"])):
            begin = time.perf_counter()
            subprocess.run([*base, *extra], check=True, capture_output=True, env=env, cwd=ROOT)
            seconds[name].append(time.perf_counter() - begin)
    plain, timed = statistics.median(seconds["plain"]), statistics.median(seconds["time"])
    print(f"--tpu v5e: {plain:.1f} s; with --time: {timed:.1f} s; ratio {timed / plain:.2f} (medians of {runs})")
    return [{"point": target, "policy": policy, "defines": defines, "runs": seconds, "plain_median": plain,
             "time_median": timed, "ratio": timed / plain}]


def truth_table(chip: Path, here: Path, times: Path) -> str:
    """Every point: the chip's verdict and plan against the deviceless compile's, and where it ran
    its measured seconds per step against te-ckpt-audit's estimate (docs/runs.md)."""
    def rows(path: Path) -> dict[str, dict[str, Any]]:
        return {r["case"]: r for r in map(json.loads, path.read_text().splitlines())}

    measured, predicted, timed = rows(chip), rows(here), rows(times)
    out = ["| point | chip | te-ckpt-audit | plan bytes | s/step, chip | estimate | error |",
           "|---|---|---|---|---:|---:|---:|"]
    for case, m in measured.items():
        p, t = predicted.get(case, {}), timed.get(case)
        ran = m["verdict"] == "ran"
        said = "fits" if p.get("verdict") == "compiled" else "does not fit"
        same = ("equal" if p.get("plan") == m.get("plan") else "differ") if ran else (
            "same required" if _required(m) == _required(p) else "differ")
        time = ("-", "-", "-") if t is None else (f"{t['measured_seconds']:.4f}", f"{t['estimated_seconds']:.4f}",
                                                  f"{100 * t['error']:+.1f}%{'' if t['fitted'] else ' (held out)'}")
        out.append(f"| {case} | {'ran' if ran else 'refused'} | {said} | {same} | {' | '.join(time)} |")
    return "\n".join(out)


def _required(row: dict[str, Any]) -> str:
    return (row.get("refusal") or "").split("temporaries (")[-1].split(")")[0]


def kernel_rows(steps: int = 20) -> list[dict[str, Any]]:
    """On the chip: single-kernel programs (GEMMs of several shapes and dtypes, elementwise and
    reduction kernels over several sizes), each compiled and run, its libtpu estimated_cycles (the
    chip's own compile) against its measured seconds (median of `steps` after 3): which kinds of
    kernel libtpu's cycle count misjudges, and by how much."""
    import jax
    import jax.numpy as jnp

    def gemm(m: int, k: int, n: int, dtype: Any) -> tuple[str, Any, Any]:
        return (f"gemm {m}x{k}x{n} {jnp.dtype(dtype).name}", lambda a, b: a @ b,
                lambda: (jnp.ones((m, k), dtype), jnp.ones((k, n), dtype)))

    def cast_gemm(m: int, k: int, n: int) -> tuple[str, Any, Any]:  # f32 in HBM, cast to bf16 in the fusion
        return (f"gemm {m}x{k}x{n} float32 cast to bfloat16",
                lambda a, b: a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16),
                lambda: (jnp.ones((m, k), jnp.float32), jnp.ones((k, n), jnp.float32)))

    def scores(b: int, h: int, q: int, d: int, dtype: Any) -> tuple[str, Any, Any]:  # attention's Q K^T
        return (f"scores {b}x{h}x{q}x{d} {jnp.dtype(dtype).name}", lambda x, y: jnp.einsum("bhqd,bhkd->bhqk", x, y),
                lambda: (jnp.ones((b, h, q, d), dtype), jnp.ones((b, h, q, d), dtype)))

    def unary(n: int, dtype: Any) -> tuple[str, Any, Any]:
        return (f"tanh {n} {jnp.dtype(dtype).name}", jnp.tanh, lambda: (jnp.ones((n // 1024, 1024), dtype),))

    def add_one(n: int, dtype: Any) -> tuple[str, Any, Any]:  # bound by HBM: reads and writes n
        return (f"add-one {n} {jnp.dtype(dtype).name}", lambda x: x + 1, lambda: (jnp.ones((n // 1024, 1024), dtype),))

    def reduce(n: int) -> tuple[str, Any, Any]:
        return (f"sum-rows {n} float32", lambda x: x.sum(axis=1), lambda: (jnp.ones((n // 4096, 4096), jnp.float32),))

    cases = [*(gemm(m, k, n, d) for m, k, n in ((1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192),
                                                 (16384, 4096, 16384), (65536, 4096, 1024),
                                                 (8192, 16384, 16384), (16384, 8192, 16384))
               for d in (jnp.bfloat16, jnp.float32)),
             *(unary(n, d) for n in (2**22, 2**26, 2**28) for d in (jnp.bfloat16, jnp.float32)),
             *(reduce(n) for n in (2**22, 2**26, 2**28)),
             *(add_one(n, d) for n in (2**26, 2**28, 2**29) for d in (jnp.bfloat16, jnp.float32)),
             # where libtpu's float32 price departs from the chip's: more shapes, a cast, attention's scores
             *(gemm(m, k, n, d) for m, k, n in ((2048, 2048, 2048), (16384, 16384, 8192), (8192, 4096, 16384))
               for d in (jnp.bfloat16, jnp.float32)),
             *(cast_gemm(m, k, n) for m, k, n in ((8192, 8192, 8192), (8192, 16384, 16384))),
             *(scores(8, 16, 1024, 64, d) for d in (jnp.bfloat16, jnp.float32))]
    rows = []
    for name, fn, make in cases:  # one case's buffers on the chip at a time
        args = make()
        compiled = jax.jit(fn).lower(*args).compile()
        cycles = estimated_cycles(compiled.as_text() or "")
        for _ in range(3):
            jax.block_until_ready(compiled(*args))
        times = []
        for _ in range(steps):
            begin = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            times.append(time.perf_counter() - begin)
        seconds = statistics.median(times)
        del args
        rows.append({"case": name, "cycles": cycles, "seconds": seconds, "device": jax.devices()[0].device_kind,
                     "libtpu": _libtpu()})
        print(f"{name:34s} {cycles:>12d} cycles {seconds * 1e3:9.3f} ms  {cycles / seconds / 1e9:6.3f} G cycles/s",
              flush=True)
    return rows


PROFILED = ("llama full b4", "llama full b16", "llama minimal b4", "llama minimal b7", "gpt nothing_saveable b8",
            "gpt checkpoint_dots b4", "mlp nothing_saveable b8192", "mlp everything_saveable b8192",
            # the other twelve points that ran (a second chip session): every point's kernels measured
            "llama full b8", "llama full b20", "llama full b24", "llama full b25", "llama minimal b5",
            "llama minimal b6", "gpt nothing_saveable b4", "gpt nothing_saveable b16", "gpt nothing_saveable b24",
            "gpt checkpoint_dots b2", "gpt checkpoint_dots b8", "mlp nothing_saveable b65536",
            # a third session: the MLP in bf16, and the GPT search's leaders (its pick, the measured best)
            "mlp-bf16 nothing_saveable b8192", "mlp-bf16 everything_saveable b8192", "gpt everything_saveable b4",
            "gpt nothing_saveable b10")


def traced(trace: Path) -> dict[str, dict[str, list[float]]]:
    """A profiler trace's chip plane: per line (its steps, modules and ops), each event's name (an
    op's: its instruction's) with its count and total ns."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(next(trace.rglob("*.xplane.pb"))))
    lines: dict[str, dict[str, list[float]]] = {}
    for plane in data.planes:
        if plane.name != "/device:TPU:0":  # the chip's own plane: its steps, module and per-op events
            continue
        for line in plane.lines:
            if line.name not in ("Steps", "XLA Modules", "XLA Ops"):
                continue
            found = lines.setdefault(line.name, {})
            for event in line.events:  # an op's event is named by its instruction's text: its name leads
                op = event.name.split(" ", 1)[0].lstrip("%") if line.name == "XLA Ops" else event.name[:80]
                count_ns = found.setdefault(op, [0, 0.0])
                count_ns[0] += 1
                count_ns[1] += event.duration_ns
    return lines


def profile_row(name: str, target: str, policy: str, defines: dict[str, Any], out: Path,
                steps: int = 3) -> dict[str, Any]:
    """On the chip: one point's step traced by the profiler, each kernel's measured time per step
    (the device plane's per-op events, summed by name and divided by the steps traced) and the
    compiled module's text (gzipped beside the rows), for the kernel-by-kernel comparison with
    libtpu's estimated_cycles."""
    import gzip
    import tempfile

    import jax
    import jax.numpy as jnp

    fn, args, donate = step_of(target, policy, defines)
    device = jax.devices()[0]
    compiled = jax.jit(fn, donate_argnums=donate).lower(*_placed(args, device)).compile()
    hlo = out / (name.replace(" ", "_") + ".hlo.txt.gz")
    hlo.write_bytes(gzip.compress((compiled.as_text() or "").encode()))
    values = list(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), args))
    trained = [i for i in donate if i != len(args) - 1]

    def step() -> None:
        loss, params, state = compiled(*values)
        jax.block_until_ready((loss, params, state))
        values[trained[0]], values[-1] = params, state

    for _ in range(3):
        step()
    with tempfile.TemporaryDirectory() as trace:
        begin = time.perf_counter()
        with jax.profiler.trace(trace):
            for _ in range(steps):
                step()
        wall = (time.perf_counter() - begin) / steps
        lines = traced(Path(trace))
    return {"case": name, "target": target, "policy": policy, "defines": defines, "steps": steps,
            "traced_wall_seconds_per_step": wall, "device": device.device_kind, "libtpu": _libtpu(),
            "hlo": hlo.name, "lines": {k: {n: [c / steps, ns / steps] for n, (c, ns) in v.items()}
                                       for k, v in lines.items()}}


def table(chip: Path, here: Path) -> str:
    """The Markdown table docs/guide/tpu.md shows: each point's plan on the chip and deviceless,
    both verdicts, and the measured seconds per step."""
    def rows(path: Path) -> dict[str, dict[str, Any]]:
        return {r["case"]: r for r in map(json.loads, path.read_text().splitlines())}

    def plan(r: dict[str, Any]) -> str:
        p = r.get("plan")
        if p is None:  # refused: the bytes the chip's check found required
            return _required(r) + " required"
        return f"{p['temp_size_in_bytes'] / GIB:.3f} + {p['argument_size_in_bytes'] / GIB:.3f}"

    measured, predicted = rows(chip), rows(here)
    out = ["| point | chip: temp + args, GiB | deviceless | chip | deviceless | s/step, chip |",
           "|---|---:|---:|---|---|---:|"]
    for case, m in measured.items():
        p = predicted.get(case, {})
        seconds = f"{m['seconds_per_step']:.4f}" if "seconds_per_step" in m else "-"
        out.append(f"| {case} | {plan(m)} | {plan(p) if p else '-'} | {m['verdict']} | {p.get('verdict', '-')} "
                   f"| {seconds} |")
    return "\n".join(out)


def _new_remat() -> dict[str, bool]:
    """JAX's new remat, where the run has it on (JAX_REMAT3=1): the step is then its program."""
    from te_ckpt_audit import _jax_compat as jc

    return {"remat3": True} if jc.remat3_on() else {}


def _libtpu() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--table", nargs=2, type=Path, metavar=("CHIP", "DEVICELESS"),
                       help="print the Markdown table of two files of rows")
    where.add_argument("--kernels", action="store_true",
                       help="on the chip: single kernels' estimated cycles against their measured time")
    where.add_argument("--estimate", type=Path, metavar="CHIP",
                       help="te-ckpt-audit's own --tpu --time estimate of each point that ran, against its time")
    where.add_argument("--cost", action="store_true",
                       help="whole processes: --tpu v5e against --tpu v5e --time, medians of 3 and their ratio")
    where.add_argument("--kinds", type=Path, metavar="PROFILE",
                       help="the profiled points' measured kernel time by kind against libtpu's estimates")
    where.add_argument("--truth-table", nargs=3, type=Path, metavar=("CHIP", "DEVICELESS", "TIME"),
                       help="the README's table: every point's verdicts, plans and times")
    where.add_argument("--time-table", type=Path, metavar="ROWS", help="print the Markdown table of --estimate's rows")
    where.add_argument("--rules", nargs="+", type=Path, metavar="FILE",
                       help="KINDS TIME [TIME ...]: rules for timing kernels against the chip's rows")
    where.add_argument("--maxtext", action="store_true",
                       help="MaxText's published v5e recipes through maxtext --tpu v5e --time (MaxText's jax)")
    where.add_argument("--on-chip", action="store_true", help="compile and run on this machine's TPU")
    where.add_argument("--profile", type=Path, metavar="DIR",
                       help="on the chip: trace the profiled points, per-kernel times and HLO into DIR")
    where.add_argument("--deviceless", metavar="TOPOLOGY", help="compile here for TOPOLOGY (v5e:1x1), no TPU")
    parser.add_argument("--cases", default="llama,gpt,mlp", help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--from-search", type=Path, metavar="JSON",
                        help="with --on-chip: the points of a `recommend --maximize throughput -f json` of the GPT")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--out", type=Path, help="JSON lines, appended")
    parser.add_argument("--held-out", action="store_true",
                        help="with --estimate: rows the constant was not fitted on, every one held out")
    parser.add_argument("--skip", type=Path, help="with --profile: the points a file of rows has already")
    ns = parser.parse_args()
    if ns.table:
        print(table(*ns.table))
        return
    if ns.time_table:
        print(time_table(ns.time_table))
        return
    if ns.rules:
        rows = rule_rows(*ns.rules)
        if ns.out is not None:
            ns.out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        return
    if ns.truth_table:
        print(truth_table(*ns.truth_table))
        return
    if ns.profile:
        ns.profile.mkdir(parents=True, exist_ok=True)
        cases = {c[0]: c for group in CASES.values() for c in group}
        with (ns.profile / "profile.jsonl").open("a") as f:
            done = {json.loads(line)["case"] for line in ns.skip.read_text().splitlines()} if ns.skip else set()
            for name in (n for n in PROFILED if ns.only in n and n not in done):
                row = profile_row(*cases[name], out=ns.profile)
                f.write(json.dumps(row, sort_keys=True) + "\n")
                f.flush()
                print(f"{name:34s} traced {row['traced_wall_seconds_per_step']:.4f} s/step, "
                      f"{sum(len(v) for v in row['lines'].values())} kernels", flush=True)
        return
    studies = {"kernels": lambda: kernel_rows(), "cost": lambda: cost_rows(), "kinds": lambda: kind_rows(ns.kinds),
               "estimate": lambda: time_rows(ns.estimate, not ns.held_out), "maxtext": lambda: maxtext_rows()}
    for flag, study in studies.items():
        if getattr(ns, flag):
            rows = study()
            if ns.out is not None:
                ns.out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
            return
    if ns.out is None:
        parser.error("--out is required with --on-chip and --deviceless")
    done = {json.loads(line)["case"] for line in ns.out.read_text().splitlines()} if ns.out.exists() else set()
    if ns.from_search is not None:
        points = json.loads(ns.from_search.read_text())["throughput"]["points"]
        CASES["search"] = [(f"gpt {p['policy']} b{p['value']}", SEARCH_TARGET, p["policy"],
                            {**GPT, "batch": p["value"]}) for p in points]
        ns.cases = "search"
    for group in ns.cases.split(","):
        for name, target, policy, defines in CASES[group]:
            if ns.only not in name or name in done:  # a rerun appends only what is missing
                continue
            row = (on_chip(name, target, policy, defines) if ns.on_chip
                   else deviceless(name, target, policy, defines, ns.deviceless))
            with ns.out.open("a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
            plan = row.get("plan", {})
            total = sum(plan.get(f, 0) for f in FIELDS[:2] + FIELDS[3:4]) - plan.get("alias_size_in_bytes", 0)
            print(f"{name:34s} {row.get('verdict', 'planned'):18s} plan {total / GIB:6.2f} GiB "
                  f"temp {plan.get('temp_size_in_bytes', 0) / GIB:6.2f} GiB "
                  f"{row.get('seconds_per_step', 0):.4f} s/step", flush=True)


if __name__ == "__main__":
    main()
