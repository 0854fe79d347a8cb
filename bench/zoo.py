"""Goal (e) of bench/run.py: on every model of the zoo, auditing 6 policies against ONE
`print_saved_residuals` on the same model (its own policy). Run it with the zoo's python:

    python="$(bash zoo/setup.sh | tail -n 1)"      # the zoo's environment (cached)
    "$python" bench/zoo.py                         # --repeats N (default 5)

Two views, both against a baseline measured in the same run:
  process  whole processes, median of --repeats alternated pairs: import the model's library, build
           its inputs, then either audit the 6 policies (trace once, as the CLI does) or make one
           print_saved_residuals call. This is what a user waits for. Goal: ratio <= 1.5.
  warm     in one process with everything imported and JAX warm: the audit's seconds against one
           print_saved_residuals. The library's import does not hide anything here.
"""

from __future__ import annotations

import argparse
import json
import os
import pkgutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from zoo.test_zoo import POLICIES  # noqa: E402  (the zoo lane's six)

_PROCESS = """
import sys, time
t0 = time.perf_counter()
sys.path[:0] = [{root!r}, {tests!r}]
import importlib, io, contextlib, json
import jax
module = importlib.import_module("zoo.models." + {model!r})
args = module.loss_inputs()
if {audit!r}:
    import gc
    gc.disable()  # as the command line does while it traces and analyses (the library leaves it alone)
    import te_ckpt_audit
    from te_ckpt_audit.render import render_json
    render_json(te_ckpt_audit.audit(module.loss, *args, policies={policies!r}))
else:
    from _reference import bind_static
    f, dyn = bind_static(module.loss, args)
    from jax.ad_checkpoint import print_saved_residuals
    with contextlib.redirect_stdout(io.StringIO()):
        print_saved_residuals(f, *dyn)
print(json.dumps({{"seconds": time.perf_counter() - t0}}))
"""


def _process(model: str, audit: bool) -> float:
    code = _PROCESS.format(root=str(ROOT), tests=str(ROOT / "tests"), model=model, audit=audit, policies=list(POLICIES))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"benchmark process failed ({model}):\n{out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def _warm(model: str, repeats: int) -> tuple[float, float]:
    import contextlib
    import importlib
    import io

    from _reference import bind_static
    from jax.ad_checkpoint import print_saved_residuals

    import te_ckpt_audit

    module = importlib.import_module(f"zoo.models.{model}")
    args = module.loss_inputs()
    f, dyn = bind_static(module.loss, args)

    def once() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            print_saved_residuals(f, *dyn)

    def audit() -> None:
        import gc

        gc.disable()  # as the command line does
        try:
            te_ckpt_audit.audit(module.loss, *args, policies=list(POLICIES))
        finally:
            gc.enable()

    once(), audit()  # warm-up: JAX's and the library's first-call costs are not the point here
    times: dict[str, list[float]] = {"once": [], "audit": []}
    for _ in range(repeats):
        for name, work in (("once", once), ("audit", audit)):
            t0 = time.perf_counter()
            work()
            times[name].append(time.perf_counter() - t0)
    return statistics.median(times["audit"]), statistics.median(times["once"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default=None, help="one zoo model by name (e.g. haiku_resnet)")
    args = parser.parse_args()
    import jax

    from zoo import models

    names = sorted(m.name for m in pkgutil.iter_modules(models.__path__) if not m.name.startswith("_"))
    names = [n for n in names if args.only in (None, n)]
    print(f"python {sys.version.split()[0]}, jax {jax.__version__}, {os.cpu_count()} cores; "
          f"(e) {len(POLICIES)} policies vs ONE print_saved_residuals, median of {args.repeats}")
    for name in names:
        try:
            __import__(f"zoo.models.{name}")
        except ModuleNotFoundError as err:
            print(f"    {name:24s} skipped: {err.name} is not installed in this environment")
            continue
        ours, base = [], []
        for _ in range(args.repeats):  # alternated pairs
            ours.append(_process(name, audit=True))
            base.append(_process(name, audit=False))
        p_ours, p_base = statistics.median(ours), statistics.median(base)
        w_ours, w_base = _warm(name, args.repeats)
        print(f"    {name:24s} process {p_ours:5.2f} s / {p_base:5.2f} s = {p_ours / p_base:4.2f} "
              f"({'meets' if p_ours / p_base <= 1.5 else 'MISSES'} 1.5) | warm {w_ours:6.3f} s / "
              f"{w_base:6.3f} s = {w_ours / w_base:4.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
