"""What the TPU's host adds to a step (issues 56 and 58), measured on the lent TPU v5e: the cost of
dispatching a step from Python, the small steps' time on the device alone, and the host link that
offloaded residuals cross.

    # on the lent TPU v5e (the device tool), every study in one process:
    PYTHONPATH=. python bench/tpu_host.py --on-chip --out $OUT/tpu-v5e-host.jsonl
    # here: the rows read against te-ckpt-audit's estimate
    python bench/tpu_host.py --table bench/data/tpu-v5e-host.jsonl

Rows, one JSON line each (`study`):
- `dispatch`: a jitted function of N donated f32[8,128] arrays returning each plus one (one fused
  kernel), steps dispatched back to back as bench/tpu_small.py's `_pipelined` runs them, called
  through the AOT `Compiled` object (as bench/tpu_small.py calls its steps) and through `jax.jit`'s
  own call: what one step costs the host, by the number of arrays it takes.
- `step`: bench/tpu_small.py's small steps three ways: the AOT call (as committed there), `jax.jit`'s
  call, and K steps inside one program (`lax.fori_loop`; one dispatch per K steps): the device's own
  time per step, with te-ckpt-audit's estimate of the one-step program beside it.
- `link`: a 64 MiB to 1 GiB f32 array copied to pinned host memory and back by a jitted identity
  with the memory kind as its output sharding (the copies XLA makes for an offloaded residual),
  median of 5 (each waited on): bytes per second each way.
- `offload`: a GPT step whose named residuals are saved on the device, offloaded to host memory
  (`save_and_offload_only_these_names`) or recomputed, each run as a training loop runs it, with
  te-ckpt-audit's estimate of the same program.
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
sys.path.insert(0, str(ROOT / "bench"))

LEAVES = (1, 4, 16, 64, 256)
STEPS = ("gpt-small nothing_saveable b2", "gpt-small checkpoint_dots b8", "llama-tiny full b2",
         "llama-tiny minimal b8", "mlp-small nothing_saveable b256", "mlp-small checkpoint_dots b1024",
         "gpt-unrolled nothing_saveable b4", "convnet checkpoint_dots b32")
# held-out steps the estimate missed most (bench/data/tpu-v5e-small-held.jsonl): device or host?
HELD_STEPS = ("gpt-unrolled4 checkpoint_dots b8", "llama-tiny full b16")
LOOP = 16  # steps inside one program
LINK_MIB = (64, 256, 1024)
GPT = {"layers": 6, "seq": 1024, "d_model": 1024, "heads": 16, "d_ff": 4096, "vocab": 32768, "batch": 8}
NAMES = "context,ffn1,ffn2,out_proj,qkv_proj"
OFFLOAD = (("saved", f"save_only_these_names:{NAMES}"),
           ("offloaded", f"save_and_offload_only_these_names:offload={NAMES}"),
           ("ffn1 offloaded", "save_and_offload_only_these_names:save=context,ffn2,out_proj,qkv_proj;offload=ffn1"),
           ("recomputed", "nothing_saveable"))


def _device() -> Any:
    import jax

    return jax.devices()[0]


def dispatch_rows() -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    from tpu_small import _pipelined

    rows = []
    for n in LEAVES:
        def plus_one(*xs: jax.Array) -> tuple[jax.Array, ...]:
            return tuple(x + 1.0 for x in xs)

        donate = tuple(range(n))
        values = [jnp.zeros((8, 128), jnp.float32) for _ in range(n)]
        compiled = jax.jit(plus_one, donate_argnums=donate).lower(*values).compile()
        aot, steps = _pipelined(compiled, values, lambda _, out: list(out))
        values = [jnp.zeros((8, 128), jnp.float32) for _ in range(n)]
        jitted = jax.jit(plus_one, donate_argnums=donate)
        fast, _ = _pipelined(jitted, values, lambda _, out: list(out))
        rows.append({"study": "dispatch", "arrays": n, "aot_seconds_per_step": aot, "jit_seconds_per_step": fast,
                     "pipelined_steps": steps})
    return rows


def step_row(name: str, target: str, policy: str, defines: dict[str, Any]) -> dict[str, Any]:
    """One of bench/tpu_small.py's steps three ways: the AOT call, `jax.jit`'s call, and `LOOP` steps
    in one program (the device's own time per step); te-ckpt-audit's estimate of the one-step program."""
    import jax
    import jax.numpy as jnp
    from tpu_small import _estimate, _pipelined
    from tpu_truth import _placed, step_of

    fn, args, donate = step_of(target, policy, defines)
    trained, state = [i for i in donate if i != len(args) - 1][0], len(args) - 1
    placed = _placed(args, _device())

    def fresh() -> list[Any]:
        return list(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), args))

    def feed(values: list[Any], out: Any) -> list[Any]:
        values = list(values)
        values[trained], values[state] = out[-2], out[-1]
        return values

    def many(*values: Any) -> tuple[Any, Any]:
        def body(_: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
            now = list(values)
            now[trained], now[state] = carry
            out = fn(*now)
            return out[-2], out[-1]

        return jax.lax.fori_loop(0, LOOP, body, (values[trained], values[state]))

    one = jax.jit(fn, donate_argnums=donate).lower(*placed).compile()
    aot, steps = _pipelined(one, fresh(), feed)
    fast, _ = _pipelined(jax.jit(fn, donate_argnums=donate), fresh(), feed)
    looped = jax.jit(many, donate_argnums=(trained, state)).lower(*placed).compile()
    inside, _ = _pipelined(looped, fresh(), feed)
    return {"study": "step", "case": name, "arrays": len(jax.tree.leaves(args)), "aot_seconds_per_step": aot,
            "jit_seconds_per_step": fast, "device_seconds_per_step": inside / LOOP, "loop": LOOP,
            "pipelined_steps": steps, **_estimate(one.as_text() or "")}


def step_rows(only: str = "") -> list[dict[str, Any]]:
    from tpu_small import CASES, HELD_OUT

    rows = []
    for case in (c for c in CASES + HELD_OUT if c[0] in STEPS + HELD_STEPS
                                           and any(o in c[0] for o in only.split(","))):
        rows.append(step_row(*case))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def link_rows() -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    device = _device()
    host, hbm = SingleDeviceSharding(device, memory_kind="pinned_host"), SingleDeviceSharding(device)
    rows = []
    for mib in LINK_MIB:
        x = jnp.ones((mib * 2**18,), jnp.float32)
        out = jax.jit(lambda a: a, out_shardings=host).lower(x).compile()
        on_host = out(x).block_until_ready()
        back = jax.jit(lambda a: a, out_shardings=hbm).lower(on_host).compile()
        times: dict[str, list[float]] = {"to_host": [], "to_device": []}
        for _ in range(6):
            for way, fn, arg in (("to_host", out, x), ("to_device", back, on_host)):
                begin = time.perf_counter()
                fn(arg).block_until_ready()
                times[way].append(time.perf_counter() - begin)
        row: dict[str, Any] = {"study": "link", "bytes": mib * 2**20}
        for way, found in times.items():
            seconds = statistics.median(found[1:])
            row[f"{way}_seconds"], row[f"{way}_bytes_per_second"] = seconds, mib * 2**20 / seconds
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def offload_rows() -> list[dict[str, Any]]:
    from tpu_small import timed_on_chip

    rows = []
    for how, policy in OFFLOAD:
        row = {"study": "offload", "case": f"gpt 6 layers b8, {how}", "policy": policy, "defines": GPT,
               **timed_on_chip("sample_models/gpt.py:loss", policy, GPT)}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "plan"}), flush=True)
    return rows


def table(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    print("| arrays | AOT call, ms | jax.jit call, ms |\n|---:|---:|---:|")
    for r in (r for r in rows if r["study"] == "dispatch"):
        print(f"| {r['arrays']} | {r['aot_seconds_per_step'] * 1e3:.3f} | {r['jit_seconds_per_step'] * 1e3:.3f} |")
    print("\n| step | arrays | AOT call, ms | jax.jit call, ms | device alone, ms | estimate, ms |\n"
          "|---|---:|---:|---:|---:|---:|")
    for r in (r for r in rows if r["study"] == "step"):
        print(f"| {r['case']} | {r['arrays']} | {r['aot_seconds_per_step'] * 1e3:.3f} | "
              f"{r['jit_seconds_per_step'] * 1e3:.3f} | {r['device_seconds_per_step'] * 1e3:.3f} | "
              f"{r['estimated_seconds'] * 1e3:.3f} |")
    print("\n| bytes | to host, GB/s | to device, GB/s |\n|---:|---:|---:|")
    for r in (r for r in rows if r["study"] == "link"):
        print(f"| {r['bytes'] / 2**20:.0f} MiB | {r['to_host_bytes_per_second'] / 1e9:.1f} | "
              f"{r['to_device_bytes_per_second'] / 1e9:.1f} |")
    print("\n| step | chip, ms | estimate, ms | temp |\n|---|---:|---:|---:|")
    for r in (r for r in rows if r["study"] == "offload"):
        print(f"| {r['case']} | {r.get('seconds_per_step', 0) * 1e3:.2f} | {r.get('estimated_seconds', 0) * 1e3:.2f} | "
              f"{r.get('plan', {}).get('temp_size_in_bytes', 0) / 2**30:.2f} GiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--on-chip", action="store_true", help="every study on this machine's TPU")
    where.add_argument("--table", type=Path, metavar="ROWS", help="the Markdown tables of the chip's rows")
    parser.add_argument("--out", type=Path, help="with --on-chip: JSON lines, appended")
    parser.add_argument("--studies", default="dispatch,step,link,offload")
    parser.add_argument("--only", default="",
                        help="only the steps whose name contains this (or one of these, comma-separated)")
    args = parser.parse_args()
    if args.table:
        table(args.table)
        return
    studies = {"dispatch": dispatch_rows, "step": lambda: step_rows(args.only), "link": link_rows,
               "offload": offload_rows}
    for study in args.studies.split(","):
        begin = time.perf_counter()
        try:
            rows = studies[study]()
        except Exception as exc:  # noqa: BLE001 - one study's failure is recorded, the others run
            rows = [{"study": study, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}]
        print(f"# {study}: {time.perf_counter() - begin:.0f} s", flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)


if __name__ == "__main__":
    main()
