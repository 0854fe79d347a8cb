#!/usr/bin/env bash
# Set up Transformer Engine for JAX on a machine WITHOUT a GPU, for te-ckpt-audit to trace real TE
# models. One command; idempotent; the environment is cached, keyed by versions.
#
#   bash te_cpu/setup.sh            # prints the environment's python on its last line
#
# What it does (about 5 GB of disk, ~5 minutes the first time, seconds when cached):
#   1. a virtual environment with jax, the CUDA 12 wheels TE links against, and te-ckpt-audit;
#   2. builds TE's JAX extension with g++ only (no CUDA toolkit: headers come from the wheels);
#   3. compiles te_cpu/fakecuda.c, the emulated driver preloaded only into the tracing process.
set -euo pipefail

TE_VERSION="${TE_VERSION:-2.20.2}"
JAX_VERSION="${JAX_VERSION:-0.10.2}"
PY="${PYTHON:-python3}"
PYV="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${TE_CKPT_AUDIT_CACHE:-$HOME/.cache/te-ckpt-audit}"
ENV="$CACHE/te-$TE_VERSION-jax-$JAX_VERSION-py$PYV"
STAMP="$ENV/.complete"

log() { echo "te_cpu/setup: $*" >&2; }

if [ ! -f "$STAMP" ]; then
  log "creating $ENV"
  rm -rf "$ENV"
  "$PY" -m venv "$ENV"
  PIP=("$ENV/bin/python" -m pip install -q --disable-pip-version-check)
  "${PIP[@]}" --upgrade pip setuptools wheel
  log "installing jax $JAX_VERSION and the CUDA 12 wheels TE builds and links against"
  "${PIP[@]}" "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" "jax-cuda12-plugin==$JAX_VERSION" \
    nvidia-nvtx-cu12 nvidia-cuda-cccl-cu12 nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12 \
    nvidia-cublas-cu12 "nvidia-cudnn-cu12>=9.12" nvidia-nccl-cu12 nvidia-cuda-nvrtc-cu12 \
    nvidia-curand-cu12 "nvidia-cudnn-frontend==1.28.0" "pybind11[global]" flax
  log "building transformer-engine[jax]==$TE_VERSION (g++ only; a few minutes)"
  # A stray nvcc on PATH makes TE's build pick CUDA_HOME from it; the wheels are the toolkit here.
  NVTE_BUILD_USE_NVIDIA_WHEELS=1 NVTE_FRAMEWORK=jax MAX_JOBS="${MAX_JOBS:-2}" \
    "${PIP[@]}" --no-build-isolation "transformer-engine-cu12==$TE_VERSION" \
    "transformer-engine[jax]==$TE_VERSION"
  touch "$STAMP"
fi

# Installed from this checkout, with its test extras? Asked from / in isolated mode (-I): from the
# repository root, `import te_ckpt_audit` would find the source tree itself and always say yes.
if ! (cd / && "$ENV/bin/python" -I -c "import sys, pytest, hypothesis, te_ckpt_audit; sys.exit(not te_ckpt_audit.__file__.startswith('$ROOT/'))") 2>/dev/null; then
  "$ENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]" >/dev/null 2>&1 \
    || "$ENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]"
fi
log "compiling the emulated CUDA driver"
NV="$("$ENV/bin/python" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0] + "/x"))')"
mkdir -p "$ENV/fakecuda"
# Every driver symbol that the CUDA libraries of this environment link against must exist.
"$ENV/bin/python" "$ROOT/te_cpu/stubs.py" "$ROOT/te_cpu/fakecuda.c" "$ENV/fakecuda/stubs.c" \
  $(find "$NV" "$ENV"/lib/python*/site-packages/transformer_engine -name '*.so*' -type f)
gcc -O2 -Wall -shared -fPIC -Wl,-soname,libcuda.so.1 -I"$NV/cuda_runtime/include" -I"$NV/cuda_nvcc/include" \
  -o "$ENV/fakecuda/libcuda.so.1" "$ROOT/te_cpu/fakecuda.c" "$ENV/fakecuda/stubs.c" -ldl
echo "$ENV/bin/python"
