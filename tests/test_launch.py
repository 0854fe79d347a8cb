"""The console script's entry point: `--version` answers without importing jax, typer or rich."""

from __future__ import annotations

import subprocess
import sys

import jax

import te_ckpt_audit

_PROBE = (
    "import sys; sys.argv = ['te-ckpt-audit', '--version']\n"
    "from te_ckpt_audit_cli._launch import main\n"
    "main()\n"
    "print(sorted(m for m in ('jax', 'typer', 'rich') if m in sys.modules))\n"
)


def test_version_without_importing_jax() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [f"te-ckpt-audit {te_ckpt_audit.__version__} (jax {jax.__version__})", "[]"]
