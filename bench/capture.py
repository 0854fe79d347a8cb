"""Every command's output over every sample model, written to a folder, so that a refactor can
show its outputs byte-identical before and after (`diff -r BEFORE AFTER`).

    python bench/capture.py /tmp/before       # at the old commit
    python bench/capture.py /tmp/after        # at the new one; then: diff -r /tmp/before /tmp/after

Each command's stdout, stderr (paths and timings that vary between checkouts masked) and exit
code go to one file named after it. The commands run this checkout's code, installed or not (a
folder of links to its packages goes first on PYTHONPATH), so a worktree of an older commit
captures its own outputs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["mlp", "gpt", "flax_model", "te_transformer", "fp8_block", "eight_names"]
COMMANDS: list[tuple[str, list[str]]] = []
for m in MODELS:
    target = f"sample_models/{m}.py:loss"
    COMMANDS += [
        (f"{m}-table", [target]),
        (f"{m}-json", [target, "-f", "json"]),
        (f"{m}-markdown", [target, "-f", "markdown"]),
        (f"{m}-github", [target, "-f", "github"]),
        (f"{m}-equations", [target, "--equations", "-p", "nothing_saveable", "-p", "checkpoint_dots"]),
        (f"{m}-compile", [target, "--compile", "-p", "nothing_saveable", "-f", "json"]),
        (f"{m}-recommend", ["recommend", target, "--budget", "64KiB"]),
        (f"{m}-recommend-json", ["recommend", target, "--budget", "64KiB", "-f", "json"]),
    ]
COMMANDS += [
    ("gpt-as-is", ["sample_models/gpt.py:loss", "-p", "as-is", "-f", "json"]),
    ("gpt-offload", ["recommend", "sample_models/gpt.py:loss", "--budget", "64KiB", "--allow-offload"]),
    ("megatron-mesh", ["sample_models/megatron_tp.py:loss", "--mesh", "data=2,model=4", "-f", "json"]),
    ("megatron-mesh-table", ["sample_models/megatron_tp.py:loss", "--mesh", "data=2,model=4"]),
    ("megatron-recommend-mesh", ["recommend", "sample_models/megatron_tp.py:loss", "--mesh", "data=2,model=4",
                                 "--budget", "32KiB"]),
    ("check", ["check", "--format", "markdown"]),
    ("policies", ["policies"]),
    ("gpus", ["gpus"]),
    ("bad-target", ["sample_models/mlp.py:nope"]),
    ("bad-policy", ["sample_models/mlp.py:loss", "-p", "checkpoint_dotz"]),
]
_VARYING = re.compile(r"\d+\.\d+ s\b|in \d+(\.\d+)? s\b")


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["COLUMNS"] = "120"
    shim = Path(tempfile.mkdtemp(prefix="capture-"))
    (shim / "te_ckpt_audit_cli").symlink_to(ROOT / "cli")
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for name, args in COMMANDS:
        done = subprocess.run([sys.executable, "-m", "te_ckpt_audit_cli", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=900)
        text = f"$ te-ckpt-audit {' '.join(args)}\nexit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n"
        text = text.replace(str(ROOT), "<root>") + _VARYING.sub("<s>", done.stderr.replace(str(ROOT), "<root>"))
        (out / f"{name}.txt").write_text(text)
        print(f"{name}: exit {done.returncode}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
