# Sourced by the setup scripts (.ci/venv.sh, zoo/setup.sh): `pipq ARGS...` is `pip install` into
# "$ENV", quiet; the local index's "is ignored" warnings dropped, the rest shown on failure.
pipq() {
  local out
  if ! out="$("$ENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1)"; then
    echo "$out" | grep -v 'is ignored: it is neither' >&2
    return 1
  fi
}
