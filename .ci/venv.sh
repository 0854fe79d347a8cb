#!/usr/bin/env bash
# A virtual environment for one CI lane: a Python minor version and an exact jax, cached under
# ${TE_CKPT_AUDIT_CACHE:-$HOME/.cache/te-ckpt-audit}, keyed by both versions. This checkout is
# installed into it (editable, with its test extras) on every call, so the lane tests this tree.
#
#   bash .ci/venv.sh 3.12 0.12.0.1            # prints the environment's python on its last line
#   bash .ci/venv.sh 3.12 0.12.0.1 test,gpu   # with other extras (an environment of its own)
#
# The interpreter is found by .ci/python.sh, never downloaded.
set -euo pipefail

PY_MINOR="$1"
JAX_VERSION="$2"
EXTRAS="${3:-test}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${TE_CKPT_AUDIT_CACHE:-$HOME/.cache/te-ckpt-audit}"

log() { echo "ci/venv: $*" >&2; }

ENV="$CACHE/venv-py${PY_MINOR/./}-jax-$JAX_VERSION"
if [ "$EXTRAS" != test ]; then ENV="$ENV-${EXTRAS//,/-}"; fi
STAMP="$ENV/.complete"
# pipq: pip install into "$ENV", quiet, its output shown only on failure.
source "$ROOT/.ci/pipq.sh"

if [ ! -f "$STAMP" ]; then
  PY="$(bash "$ROOT/.ci/python.sh" "$PY_MINOR")"
  log "creating $ENV with $PY"
  rm -rf "$ENV"
  "$PY" -m venv "$ENV"
  # jax stays at JAX_VERSION whatever a later install asks for.
  printf 'jax==%s\njaxlib==%s\n' "$JAX_VERSION" "$JAX_VERSION" >"$ENV/constraints.txt"
  pipq --upgrade pip setuptools wheel
  pipq -c "$ENV/constraints.txt" "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION"
  touch "$STAMP"
fi
pipq -c "$ENV/constraints.txt" -e "$ROOT[$EXTRAS]"
echo "$ENV/bin/python"
