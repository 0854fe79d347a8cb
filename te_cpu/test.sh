#!/usr/bin/env bash
# The te lane: real Transformer Engine on this CPU-only machine. Sets up (or reuses) the cached TE
# environment, then runs the tests marked `te` on an emulated H100 (compute capability 9.0, 132 SMs),
# and the MXFP8 test on an emulated B200 (10.0, 148 SMs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash te_cpu/setup.sh | tail -n 1)"
# One CPU device: the emulated driver is one GPU, and TE asks it about every local jax device
# (tests/conftest.py otherwise gives the mesh tests eight, and TE fails on "invalid CUDA device ID").
export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=1"
"$PY" -m te_ckpt_audit_cli.emulate --gpu "${TE_CKPT_AUDIT_GPU:-9.0:132}" -- \
  "$PY" -m pytest -m te tests/test_real_te.py "$@"
# MXFP8 needs compute capability >= 9.9: the same file again on an emulated B200, for that test.
"$PY" -m te_ckpt_audit_cli.emulate --gpu 10.0:148 -- \
  "$PY" -m pytest -m te tests/test_real_te.py -k "mxfp8 or blackwell" "$@"
# MaxText's own train step with TE's FP8 compiled for H100s (a GPU target: jax >= 0.12). MaxText
# installs without its declared deps (TensorFlow, torch, ...), then what its train step imports,
# held to this environment's jax; one A3 host is 8 GPUs, so this file gets 8 CPU devices.
if "$PY" -c 'import jax, sys; sys.exit(tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12))'; then
  PINS="$("$PY" -c 'import jax, jaxlib; print(f"jax=={jax.__version__} jaxlib=={jaxlib.__version__}")')"
  "$PY" -m pip install -q --disable-pip-version-check --no-deps "maxtext==0.2.5"
  # shellcheck disable=SC2046,SC2086
  "$PY" -m pip install -q --disable-pip-version-check $PINS $(sed 's/#.*//' zoo/maxtext-requirements.txt)
  XLA_FLAGS="${XLA_FLAGS/--xla_force_host_platform_device_count=1/--xla_force_host_platform_device_count=8}" \
    "$PY" -m te_ckpt_audit_cli.emulate --gpu "${TE_CKPT_AUDIT_GPU:-9.0:132}" -- \
    "$PY" -m pytest -m te tests/test_maxtext_te.py "$@"
fi
