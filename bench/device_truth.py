"""On a machine with an accelerator (any JAX backend): the bytes JAX really keeps between the
forward and the backward pass, measured by the device's allocator, against the activation bytes the
audit reports for the same model and remat policy.

    PYTHONPATH=.:build/devdeps python bench/device_truth.py            # every case
    PYTHONPATH=.:build/devdeps python bench/device_truth.py --quick    # the first case only

For each case: the audit (`audit_target`, policy `as-is`: the model's own checkpoints, traced
abstractly, nothing allocated) gives activation bytes; then the model's inputs are made on the
device (zeros), and `jax.vjp` runs the forward pass there, eagerly, holding what the backward pass
needs. Measured: the logical bytes of the arrays the vjp holds that are not the inputs, and the
growth of the device's `bytes_in_use` while the vjp is held (its padding included; read a second
after the forward pass, once what it dropped is freed). Printed per case with their ratios to the
audit's figure. Arguments kept alive (the parameters, the batch) are the inputs themselves,
allocated before: neither side counts them. docs/runs.md ("Runs that happened") has the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (name, target, defines): Llama 2's architecture at 1.3B parameters, scanned, under MaxText's remat
# policies (the sample's own checkpoints); dimensions multiples of 128, so the device pads nothing
LLAMA = {"model": "llama-1b", "per_device_batch": 2, "seq": 1024}
CASES = [
    ("llama-1.3B full", "sample_models/llama.py:loss", {**LLAMA, "remat": "full"}),
    ("llama-1.3B minimal", "sample_models/llama.py:loss", {**LLAMA, "remat": "minimal"}),
    ("llama-1.3B save_qkv_proj", "sample_models/llama.py:loss", {**LLAMA, "remat": "save_qkv_proj"}),
    ("llama-1.3B minimal_flash", "sample_models/llama.py:loss", {**LLAMA, "remat": "minimal_flash"}),
    ("GPT-12 d=1024 own checkpoints", "sample_models/gpt.py:loss",
     {"layers": 12, "batch": 8, "seq": 512, "d_model": 1024, "heads": 16, "d_ff": 4096, "vocab": 32768}),
]


def _made(tree: Any) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype) if isinstance(s, jax.ShapeDtypeStruct) else s, tree)


def measure(target: str, defines: dict[str, Any]) -> dict[str, Any]:
    import jax

    from te_ckpt_audit import audit_target
    from te_ckpt_audit.trace._loading import find_inputs_callable, load_target

    report = audit_target(target, ["as-is"], defines=defines)
    ours = report.results[0].totals.activation_bytes
    loaded = load_target(target)
    make, _ = find_inputs_callable(loaded, None)
    args = _made(make(**defines))
    jax.block_until_ready([a for a in jax.tree.leaves(args) if isinstance(a, jax.Array)])
    device = jax.devices()[0]
    gc.collect()
    before = (device.memory_stats() or {}).get("bytes_in_use")
    params, rest = args[0], args[1:]
    out, vjp = jax.vjp(lambda p: loaded.fn(p, *rest), params)
    held = [x for x in jax.tree.leaves(vjp) if isinstance(x, jax.Array)]
    jax.block_until_ready(held)
    del out
    gc.collect()
    time.sleep(1.0)  # buffers the forward pass dropped are freed as their computations retire
    after = (device.memory_stats() or {}).get("bytes_in_use")
    inputs = {id(a) for a in jax.tree.leaves(args)}
    logical = sum(x.nbytes for x in held if id(x) not in inputs)
    grown = None if before is None or after is None else after - before
    del vjp, held
    return {"audit": ours, "logical": logical, "device": grown, "backend": device.platform,
            "kind": device.device_kind}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the first case only")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    rows = []
    for name, target, defines in CASES[:1] if args.quick else CASES:
        start = time.perf_counter()
        row = {"case": name, **measure(target, defines)}
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        device = "n/a" if row["device"] is None else f"{row['device']:,} ({row['device'] / row['audit']:.4f}x)"
        print(f"{name} on {row['kind']}: audit {row['audit']:,} B; the vjp holds {row['logical']:,} B "
              f"({row['logical'] / row['audit']:.4f}x); the device's allocator grew {device}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["logical"] == r["audit"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
