#!/usr/bin/env bash
# One CI lane, by name; .ci/run runs them all. Each lane is its own process, so `set -e` holds in
# it whatever the caller does with its exit code. Arguments after the name go to pytest.
#
#   bash .ci/lane.sh py311-jax0.10.2     # the README's test command, lint, typing, memory gate
#   bash .ci/lane.sh py312-newest        # the whole suite on Python 3.12 with the newest jax
#   bash .ci/lane.sh te-jax0.10.2 | te-newest | gpu-target | tpu-target | zoo | remat3 | browser
set -euo pipefail
cd "$(dirname "$0")/.."

# The newest jax release, tested here; pyproject.toml's upper bound is the next minor.
JAX_NEWEST="${JAX_NEWEST:-0.12.0.1}"
NEWEST_PYTHON="${NEWEST_PYTHON:-3.12}"

name="$1"
shift
case "$name" in
  py311-jax0.10.2)
    python3 -m pip install -q -e ".[test,dev]"
    python3 -m pytest -n auto "$@"
    python3 -m ruff check .
    python3 -m mypy te_ckpt_audit cli
    te-ckpt-audit check --format markdown
    ;;
  py312-newest)
    PY="$(bash .ci/venv.sh "$NEWEST_PYTHON" "$JAX_NEWEST" | tail -n 1)"
    "$PY" -c 'import sys, jax; print(f"python {sys.version.split()[0]}, jax {jax.__version__}")'
    "$PY" -m pytest -n auto "$@"
    ;;
  gpu-target)
    # --gpu: steps compiled for GPU models through JAX's CUDA plugin (the [gpu] extra, ~2.7 GB with cuDNN);
    # here every compile test must run: a missing piece fails the lane instead of skipping
    PY="$(bash .ci/venv.sh "$NEWEST_PYTHON" "$JAX_NEWEST" test,gpu,cluster | tail -n 1)"
    # `te-ckpt-audit maxtext`: MaxText itself (no deps: it declares TensorFlow, torch, ...) and what
    # its train step imports, held to the lane's jax
    PINS="$(dirname "$(dirname "$PY")")/constraints.txt"
    "$PY" -m pip install -q -c "$PINS" --no-deps "maxtext==0.2.5"
    "$PY" -m pip install -q -c "$PINS" $(sed 's/#.*//' zoo/maxtext-requirements.txt)
    TE_CKPT_AUDIT_GPU_LANE=1 TE_CKPT_AUDIT_CACHE="$(mktemp -d)" "$PY" -m pytest tests/test_gpu.py tests/test_user_step.py \
      tests/test_own_mesh.py tests/test_maxtext.py tests/test_cluster.py tests/test_step_time.py "$@"
    ;;
  tpu-target)
    # --tpu: steps compiled by libtpu for TPU slices without a TPU (the [tpu] extra, ~230 MB), on the jax
    # and libtpu the lent v5e runs; here every libtpu test must run: a missing piece fails the lane
    PY="$(bash .ci/venv.sh 3.11 0.10.2 test,tpu | tail -n 1)"
    TE_CKPT_AUDIT_TPU_LANE=1 JAX_PLATFORMS=cpu "$PY" -m pytest tests/test_tpu_target.py tests/test_tpus.py "$@"
    # `maxtext --tpu`: MaxText's own step on libtpu needs MaxText's jax (0.12, Python 3.12) and its libtpu
    PY="$(bash .ci/venv.sh "$NEWEST_PYTHON" "$JAX_NEWEST" test,tpu | tail -n 1)"
    PINS="$(dirname "$(dirname "$PY")")/constraints.txt"
    "$PY" -m pip install -q -c "$PINS" --no-deps "maxtext==0.2.5"
    "$PY" -m pip install -q -c "$PINS" $(sed 's/#.*//' zoo/maxtext-requirements.txt)
    TE_CKPT_AUDIT_MAXTEXT_TPU_LANE=1 JAX_PLATFORMS=cpu "$PY" -m pytest tests/test_maxtext_tpu.py "$@"
    ;;
  remat3)
    # JAX's new remat and custom_vjp (jax_remat3, jax_custom_vjp3) on the newest jax: the truth sets run
    # with the flags on, so the audit and JAX's own saved_residuals both run under them (JAX's own remat
    # tests as programs, the generated adversarial programs, the sample models), then the zoo's newest
    # models. tests/test_remat3.py sets the flags itself (it runs in the whole suite's lanes).
    PY="$(bash .ci/venv.sh "$NEWEST_PYTHON" "$JAX_NEWEST" | tail -n 1)"
    TRUTH=(tests/test_exactness.py tests/test_programs.py tests/test_intern.py tests/test_shared_work.py
           tests/test_policies.py tests/test_hostile.py)
    JAX_REMAT3=1 "$PY" -m pytest -n auto "${TRUTH[@]}" tests/test_property.py "$@"
    # both flags: not the generated programs, whose custom_jvp-in-custom_vjp class JAX itself fails on
    # there ("StoreException: Store occupied"; docs/contributing/jax.md)
    JAX_REMAT3=1 JAX_CUSTOM_VJP3=1 "$PY" -m pytest -n auto "${TRUTH[@]}" "$@"
    PY312="$(bash .ci/python.sh "$NEWEST_PYTHON")"
    ZOO_PY="$(PYTHON="$PY312" JAX_VERSION="$JAX_NEWEST" bash zoo/setup.sh | tail -n 1)"
    JAX_REMAT3=1 "$ZOO_PY" -m pytest -c zoo/pytest.ini zoo/test_zoo.py -q "$@"
    ;;
  te-jax0.10.2)
    bash te_cpu/test.sh -q "$@"
    ;;
  te-newest)
    PYTHON="$(bash .ci/python.sh "$NEWEST_PYTHON")" JAX_VERSION="$JAX_NEWEST" bash te_cpu/test.sh -q "$@"
    ;;
  zoo)
    bash zoo/test.sh -q "$@"
    ;;
  browser)
    python3 -m pip install -q -e ".[docs]"
    bash .ci/browser_check.sh  # the docs site and the HTML reports in headless Chromium; screenshots in build/browser-check/
    ;;
  *)
    echo "ci/lane: no lane named $name" >&2
    exit 2
    ;;
esac
