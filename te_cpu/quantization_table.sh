#!/usr/bin/env bash
# The quantization table of docs/guide/te.md (te_cpu/quantization_table.py) on the emulated H100, then B200.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash te_cpu/setup.sh | tail -n 1)"
export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=1"
echo "| module | recipe | policy | activation | quantized | re-quantized |"
echo "|---|---|---|---:|---:|---:|"
for gpu in 9.0:132 10.0:148; do
  "$PY" -m te_ckpt_audit_cli.emulate --gpu "$gpu" -- "$PY" te_cpu/quantization_table.py
done
