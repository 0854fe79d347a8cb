"""The zoo's test configuration: JAX on CPU, Keras on its JAX backend, and a closing table of
model x policy outcomes (match, mismatch, error) with times."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zoo import _outcomes  # noqa: E402


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    table = _outcomes.render()
    if table:
        terminalreporter.write_sep("=", "model zoo: te-ckpt-audit against JAX's saved_residuals")
        terminalreporter.write_line(table)
