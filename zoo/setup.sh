#!/usr/bin/env bash
# The model zoo's environment: real models from JAX libraries (Flax NNX, Equinox, KerasHub on the JAX
# backend, RecurrentGemma, Tunix, transformers' Flax BERT where MaxText is not, MaxText on
# Python >= 3.12), with te-ckpt-audit installed editable from
# this checkout with its test extras. One command; idempotent; cached, keyed by versions.
#
#   bash zoo/setup.sh                                         # python3, jax 0.10.2
#   PYTHON=python3.12 JAX_VERSION=0.12.0.1 bash zoo/setup.sh  # newest jax, MaxText 0.2.5
#
# Prints the environment's python on its last line. Nothing is downloaded at run time: the models
# are built from small configs with ShapeDtypeStruct parameters.
#
# Heavy dependencies are left out on purpose: keras-hub and MaxText declare TensorFlow (and MaxText
# torch, TE, cloud clients, ...), which none of the zoo's models import. Both install with --no-deps,
# plus the few packages they really import.
set -euo pipefail

JAX_VERSION="${JAX_VERSION:-0.10.2}"
PY="${PYTHON:-python3}"
PYV="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${TE_CKPT_AUDIT_CACHE:-$HOME/.cache/te-ckpt-audit}"

EQUINOX_VERSION="${EQUINOX_VERSION:-0.13.8}"
KERAS_VERSION="${KERAS_VERSION:-3.15.1}"
KERAS_HUB_VERSION="${KERAS_HUB_VERSION:-0.32.0}"
RECURRENTGEMMA_VERSION="${RECURRENTGEMMA_VERSION:-1.0.1}"
TUNIX_VERSION="${TUNIX_VERSION:-0.1.7}"
HAIKU_VERSION="${HAIKU_VERSION:-0.0.17}"
# transformers' Flax models end with 4.57 (5.x has none); MaxText's lanes keep the transformers 5
# MaxText imports, and transformers' BERT skips there.
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-4.57.6}"
# MaxText needs Python >= 3.12 in every release; 0.2.5 needs jax >= 0.11, 0.2.4 runs on jax 0.10.
if [ "$PYV" -ge 312 ]; then
  case "$JAX_VERSION" in
    0.10.*) MAXTEXT_VERSION="${MAXTEXT_VERSION:-0.2.4}" ;;
    *) MAXTEXT_VERSION="${MAXTEXT_VERSION:-0.2.5}" ;;
  esac
else
  MAXTEXT_VERSION="${MAXTEXT_VERSION:-}"
fi
if [ -n "$MAXTEXT_VERSION" ]; then TRANSFORMERS_VERSION=""; fi
# Flax: the newest release for this Python (Flax 0.12.9+ needs Python >= 3.12), unless pinned.
FLAX_SPEC="flax${FLAX_VERSION:+==$FLAX_VERSION}"

KEY="jax-$JAX_VERSION-py$PYV-eqx$EQUINOX_VERSION-keras$KERAS_VERSION-hub$KERAS_HUB_VERSION"
KEY="$KEY-rg$RECURRENTGEMMA_VERSION-tunix$TUNIX_VERSION-hk$HAIKU_VERSION${TRANSFORMERS_VERSION:+-tf$TRANSFORMERS_VERSION}"
KEY="$KEY${FLAX_VERSION:+-flax$FLAX_VERSION}${MAXTEXT_VERSION:+-maxtext$MAXTEXT_VERSION}"
ENV="$CACHE/zoo-$KEY"
STAMP="$ENV/.complete"

log() { echo "zoo/setup: $*" >&2; }
# pipq: pip install into "$ENV", quiet, its output shown only on failure.
source "$ROOT/.ci/pipq.sh"

if [ ! -f "$STAMP" ]; then
  log "creating $ENV"
  rm -rf "$ENV"
  "$PY" -m venv "$ENV"
  # jax stays at JAX_VERSION whatever a later install asks for.
  printf 'jax==%s\njaxlib==%s\n' "$JAX_VERSION" "$JAX_VERSION" >"$ENV/constraints.txt"
  PIP=(pipq -c "$ENV/constraints.txt")
  pipq --upgrade pip setuptools wheel
  log "installing jax $JAX_VERSION, flax, equinox $EQUINOX_VERSION, keras $KERAS_VERSION, recurrentgemma $RECURRENTGEMMA_VERSION"
  "${PIP[@]}" "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" "$FLAX_SPEC" "equinox==$EQUINOX_VERSION" \
    "keras==$KERAS_VERSION" "recurrentgemma==$RECURRENTGEMMA_VERSION"
  log "installing keras-hub $KERAS_HUB_VERSION without TensorFlow (--no-deps, plus what it imports)"
  "${PIP[@]}" --no-deps "keras-hub==$KERAS_HUB_VERSION"
  "${PIP[@]}" regex packaging tokenizers
  log "installing tunix $TUNIX_VERSION (--no-deps, plus what its Llama 3 imports: not TensorFlow Datasets)"
  "${PIP[@]}" --no-deps "google-tunix==$TUNIX_VERSION"
  "${PIP[@]}" google-metrax perfetto jaxtyping pillow pandas
  log "installing dm-haiku $HAIKU_VERSION (a conv net: ResNet-18)"
  "${PIP[@]}" "dm-haiku==$HAIKU_VERSION"
  if [ -n "$TRANSFORMERS_VERSION" ]; then
    log "installing transformers $TRANSFORMERS_VERSION (its Flax models)"
    "${PIP[@]}" "transformers==$TRANSFORMERS_VERSION"
  fi
  if [ -n "$MAXTEXT_VERSION" ]; then
    log "installing maxtext $MAXTEXT_VERSION (--no-deps, plus what its decoder imports)"
    "${PIP[@]}" --no-deps "maxtext==$MAXTEXT_VERSION"
    "${PIP[@]}" $(cat "$ROOT/zoo/maxtext-requirements.txt" | sed 's/#.*//')
  fi
  touch "$STAMP"
fi

# Installed from this checkout, with its test extras? Asked from / in isolated mode (-I): from the
# repository root, `import te_ckpt_audit` would find the source tree itself and always say yes.
# The checkout goes in with --no-deps and its dependencies and test extras are installed apart, so
# that the jax of this environment (JAX_VERSION) stays whatever the checkout's own pin says.
if ! (cd / && "$ENV/bin/python" -I -c "import sys, pytest, hypothesis, te_ckpt_audit; sys.exit(not te_ckpt_audit.__file__.startswith('$ROOT/'))") 2>/dev/null; then
  DEPS="$(cd / && "$ENV/bin/python" -I -c "
import re, sys, tomllib
p = tomllib.load(open(sys.argv[1], 'rb'))['project']
for d in p['dependencies'] + p['optional-dependencies']['test']:
    if re.split(r'[<>=!~ \[;]', d)[0] not in ('jax', 'jaxlib', 'flax'):
        print(d)" "$ROOT/pyproject.toml")"
  pipq -c "$ENV/constraints.txt" $DEPS
  pipq --no-deps -e "$ROOT"
fi
echo "$ENV/bin/python"
