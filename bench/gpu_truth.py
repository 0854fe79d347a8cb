"""On a machine with an NVIDIA GPU: run the steps `--gpu` predicts, for real, and print predicted
against measured per policy (issue 26, item 10).

    python bench/gpu_truth.py            # every case, about 6 minutes on one H100 or H200
    python bench/gpu_truth.py --quick    # the first case only

Where the GPU's own jax cannot compile for `--gpu` (which needs jax 0.12 and its CUDA 12 plugin,
the [gpu] extra: the lent H200's image has jax 0.11.2 with CUDA 13, and the extra's wheels are more
than the device tool carries), measure there and predict here:

    python bench/gpu_truth.py --measure DIR   # on the GPU: DIR/measured.jsonl and each step's profile
    python bench/gpu_truth.py --predict DIR   # here, with the [gpu] extra: DIR/compared.jsonl, printed

For each case and policy two fresh processes run:
- predict: `te-ckpt-audit TARGET --gpu NAME -p POLICY -f json`, NAME the catalog's model of the GPU
  found here, compiled without touching the GPU (JAX on its CPU backend, as the command keeps it);
- measure: the same session's training step (`te_ckpt_audit.targets._step.training_step` of the
  function as written, the program the prediction compiled) jitted on the real GPU with random
  inputs, run twice (compiled and warm), then five steps dispatched back to back with one wait, as
  a training loop runs them; the peak of `jax.devices()[0].memory_stats()["peak_bytes_in_use"]`
  and the five steps' mean time.
Each process is fresh, so the device's peak is that step's alone. The measuring process also
profiles three more steps (JAX's profiler; `get_profiled_instructions_proto`, the PGLE profile) and
the step time is estimated twice: `--time`, and `--time --calibrate` with that profile. Both run at the same memory
fraction (XLA_PYTHON_CLIENT_MEM_FRACTION, default 0.75). Printed: the compiled range, the
measured peak, their ratio, the step time, and whether the prediction's fit verdict held.
The cases are sized to fill a good part of an 80 GB or 141 GB device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "build" / "gpu-truth-profiles"  # each step's PGLE profile, as --calibrate takes it

# (name, target, defines, policies): a Llama 2 architecture at 1.3B parameters (24 layers, 2048
# wide), scanned, adamw; a deep unrolled GPT; the sample GPT with its own per-layer checkpoints
CASES = [
    ("llama-1.3B scanned, batch 8 x 2048", "sample_models/llama.py:loss",
     ["model=llama-1b", "per_device_batch=8", "seq=2048", "remat=full"], ["as-is", "everything_saveable"]),
    ("llama-1.3B unrolled minimal_flash, batch 4 x 2048", "sample_models/llama.py:loss",
     ["model=llama-1b", "per_device_batch=4", "seq=2048", "remat=minimal_flash", "scan=False"], ["as-is"]),
    ("GPT-48 d=1024 scanned", "sample_models/gpt.py:loss",
     ["layers=48", "batch=16", "seq=1024", "d_model=1024", "heads=16", "vocab=32000"],
     ["as-is", "nothing_saveable", "checkpoint_dots"]),
]

MEASURE = r"""
import glob, json, os, sys, tempfile, time
import jax, jax.numpy as jnp
import optax
from te_ckpt_audit import Session, resolve_policy
from te_ckpt_audit.analysis._apply import policy_function
from te_ckpt_audit.targets._step import training_step
from te_ckpt_audit.config import parse_defines

target, policy, defines = sys.argv[1], sys.argv[2], sys.argv[3:]
STEPS = 5
session = Session.of_target(target, defines=parse_defines(defines))
spec = resolve_policy(policy)
traced = session._traced
fun = policy_function(traced, spec, session.resolved_scope(spec))  # as written: what --gpu compiles
step = training_step(traced, fun, traced.avals, optax.adamw(1e-3))
key = iter(jax.random.split(jax.random.key(0), 100000))
def real(a):
    if not isinstance(a, jax.ShapeDtypeStruct):
        return a
    if jnp.issubdtype(a.dtype, jnp.floating):
        return (0.02 * jax.random.normal(next(key), a.shape, jnp.float32)).astype(a.dtype)
    return jax.random.randint(next(key), a.shape, 0, 2, a.dtype)
*args, state = jax.tree.map(real, step.args)
state = jax.tree.map(jnp.zeros_like, state)
jitted = jax.jit(step.fn, donate_argnums=step.donate)
params = step.donate[:-1]
def run(steps):
    global state
    for _ in range(steps):  # dispatched back to back, as a training loop runs them
        with jax.numpy_dtype_promotion("standard"):
            loss, new, state = jitted(*args, state)
        for i, p in zip(params, [new] if len(params) == 1 else new):
            args[i] = p
    jax.block_until_ready(state)
run(2)  # compiled, and warm
stats = jax.devices()[0].memory_stats() or {}
start = time.perf_counter()
run(STEPS)
step_s = (time.perf_counter() - start) / STEPS
profile = os.environ.get("TRUTH_PROFILE")
if profile:  # three more steps under JAX's profiler: the PGLE profile --calibrate takes
    from jax.experimental.profiler import get_profiled_instructions_proto
    traces = tempfile.mkdtemp()
    jax.profiler.start_trace(traces)
    run(3)
    jax.profiler.stop_trace()
    run = sorted(glob.glob(os.path.join(traces, "plugins", "profile", "*")))[-1]
    with open(profile, "wb") as f:
        f.write(get_profiled_instructions_proto(run))
print(json.dumps({"peak": stats.get("peak_bytes_in_use"), "limit": stats.get("bytes_limit"),
                  "step_s": step_s, "device": jax.devices()[0].device_kind, "jax": jax.__version__}))
"""


def _catalog_name(device_kind: str) -> str:
    kind = device_kind.lower()
    for needle, name in (("h200", "h200"), ("h100", "h100-sxm"), ("a100", "a100-80gb"), ("l40s", "l40s"),
                         ("b200", "b200")):
        if needle in kind:
            return name
    sys.exit(f"no catalog GPU for {device_kind!r}: add --gpu-config support here")


def _run(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode not in (0, 1):
        sys.exit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1] if "{" not in done.stdout[:1] else done.stdout)


def measure(quick: bool, profiles: Path, out: Path | None = None) -> list[dict[str, Any]]:
    """Each case's steps run on the GPU here (a fresh process each), with its PGLE profile; each row
    written to `out` as it is measured (a run cut short keeps the rows it made)."""
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    profiles.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name, target, defines, policies in CASES[:1] if quick else CASES:
        for policy in policies:
            profile = profiles / f"{len(rows)}-{policy}.pb"
            measured = _run([sys.executable, "-c", MEASURE, target, policy, *defines],
                            {**env, "TRUTH_PROFILE": str(profile)})
            rows.append({"case": name, "target": target, "defines": defines, "policy": policy,
                         "profile": profile.name, **measured})
            if out is not None:
                with out.open("a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
            print(f"{name:<48} {policy:<20} measured {rows[-1]['step_s']:.4f} s, peak "
                  f"{(rows[-1]['peak'] or 0) / 2**30:.2f} GiB on {rows[-1]['device']}", flush=True)
    return rows


def predict(rows: list[dict[str, Any]], profiles: Path) -> list[dict[str, Any]]:
    """`--gpu` on each measured row, without a GPU: the estimate, and the estimate calibrated by the
    step's own profile."""
    env = {**os.environ, "TE_CKPT_AUDIT_CACHE": str(ROOT / "build" / "gpu-truth-cache")}
    out = []
    for row in rows:
        gpu = _catalog_name(str(row["device"]))
        argv = [sys.executable, "-m", "te_ckpt_audit_cli", row["target"], "--gpu", gpu, "--optimizer", "adamw",
                "-p", row["policy"], "--jobs", "1", "-f", "json", "--time", *[f"-D{d}" for d in row["defines"]]]
        result = _run(argv, env)["results"][0]  # type: ignore[index]
        profile = profiles / row["profile"]
        calibrated = (_run([*argv, "--calibrate", str(profile)], env)["results"][0]  # type: ignore[index]
                      if profile.is_file() and profile.stat().st_size else {"time": {"seconds": None}})
        out.append({**row, "gpu": gpu, "peak_range": [result["peak"]["bytes_per_device_min"],
                                                     result["peak"]["bytes_per_device"]],
                    "fits": result["peak"]["fits"], "estimate_s": result["time"]["seconds"],
                    "calibrated_s": calibrated["time"]["seconds"]})
    return out


def report(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        low, high = r["peak_range"]
        ratio = r["peak"] / high if r["peak"] and high else float("nan")
        print(f"{r['case']:<48} {r['policy']:<20} peak predicted {low / 2**30:7.2f}..{high / 2**30:7.2f} GiB, "
              f"measured {(r['peak'] or 0) / 2**30:7.2f} GiB ({ratio:5.3f} of the top), fits {r['fits']}; step "
              f"measured {r['step_s']:.4f} s, estimated {r['estimate_s']:.4f} s, calibrated by its profile "
              f"{'-' if r['calibrated_s'] is None else format(r['calibrated_s'], '.4f')} s")
    inside = sum(1 for r in rows if r["peak"] and r["peak_range"][0] <= r["peak"] <= r["peak_range"][1])
    print(f"\n{inside} of {len(rows)} measured peaks inside the predicted range")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the first case only")
    parser.add_argument("--measure", type=Path, metavar="DIR",
                        help="only run the steps on this GPU: measured.jsonl and the profiles into DIR")
    parser.add_argument("--predict", type=Path, metavar="DIR",
                        help="only predict, without a GPU, the steps --measure wrote into DIR (needs the [gpu] extra)")
    args = parser.parse_args()
    fraction = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")
    if args.predict:
        rows = predict([json.loads(line) for line in (args.predict / "measured.jsonl").read_text().splitlines()],
                       args.predict)
        (args.predict / "compared.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        report(rows)
        return 0
    print(f"measured on the GPU here at XLA_PYTHON_CLIENT_MEM_FRACTION={fraction}")
    if args.measure:
        args.measure.mkdir(parents=True, exist_ok=True)
        (args.measure / "measured.jsonl").write_text("")
        measure(args.quick, args.measure, args.measure / "measured.jsonl")
        return 0
    rows = measure(args.quick, PROFILES)
    report(predict(rows, PROFILES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
