#!/usr/bin/env bash
# The zoo lane: real models from JAX libraries, in training mode, each audited under six policies
# and compared with JAX's own saved_residuals (zoo/test_zoo.py). Three cached environments
# (zoo/setup.sh), one pytest run each; arguments go to pytest:
#   1. python3 (3.11 here) with jax 0.10.2: Flax NNX, Equinox, KerasHub, RecurrentGemma, Tunix,
#      transformers 4.57's Flax BERT (transformers 5 has no Flax: it skips in the MaxText lanes)
#      (MaxText skips: every MaxText release needs Python >= 3.12);
#   2. Python 3.12 with jax 0.10.2: MaxText 0.2.4, the last release that runs on jax 0.10;
#   3. Python 3.12 with the newest jax (ZOO_NEWEST_JAX): MaxText 0.2.5 and every other model.
# ZOO_PYTHON312 names the Python 3.12 (default: pyenv's, else python3.12 on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
PY312="${ZOO_PYTHON312:-$(ls "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null | tail -n 1)}"
PY312="${PY312:-$(command -v python3.12 || true)}"
NEWEST="${ZOO_NEWEST_JAX:-0.12.0.1}"

lane() {  # lane PYTHON JAX_VERSION PYTEST_ARGS...
  local py jax
  py="$1" jax="$2"
  shift 2
  echo "zoo lane: $("$py" -c 'import platform; print(platform.python_version())'), jax $jax" >&2
  local env_py
  env_py="$(PYTHON="$py" JAX_VERSION="$jax" bash zoo/setup.sh | tail -n 1)"
  "$env_py" -m pytest -c zoo/pytest.ini zoo/test_zoo.py "$@"
}

# Every lane runs; the script fails if any did.
status=0
lane python3 0.10.2 "$@" || status=1
if [ -z "$PY312" ]; then
  echo "zoo lane: no Python 3.12 here (set ZOO_PYTHON312): MaxText not run" >&2
  exit 1
fi
lane "$PY312" 0.10.2 -k maxtext "$@" || status=1
lane "$PY312" "$NEWEST" "$@" || status=1
exit "$status"
