#!/usr/bin/env bash
# Print the path of a Python X.Y interpreter, found, never downloaded: pyenv's newest X.Y.* (under
# PYENV_ROOT, else ~/.pyenv), else pythonX.Y on PATH.
#
#   bash .ci/python.sh 3.12     # /root/.pyenv/versions/3.12.1/bin/python3.12
set -euo pipefail
minor="$1"
found="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$minor".*/bin/"python$minor" 2>/dev/null | sort -V | tail -n 1 || true)"
found="${found:-$(command -v "python$minor" || true)}"
if [ -z "$found" ]; then
  echo "ci/python: no Python $minor here: install it with pyenv (pyenv install $minor) or put python$minor on PATH" >&2
  exit 1
fi
echo "$found"
