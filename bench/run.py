"""te-ckpt-audit benchmarks: every figure is a ratio against a baseline measured in the same run.

    python bench/run.py            # all of it (a few minutes on 2 cores)
    python bench/run.py --quick    # fewer repeats, no 96-layer runs

(a) whole processes, median of --repeats runs: `te-ckpt-audit` comparing 5 policies against ONE
    `jax.ad_checkpoint.print_saved_residuals` call on the same function with its own policy
    (scanned GPT sample at 24 layers, the Flax sample, and the Flax sample unrolled at 24 layers,
    one `nn.remat` body per block). Goal: ratio <= 1.5.
(b) a GPT-3-175B-shaped stack (hidden 12288, 96 heads, sequence 2048, batch 1, bf16,
    ShapeDtypeStructs only) at 48 and 96 unrolled layers and 96 scanned, each in a fresh process:
    time and peak RSS of the audit against the floor, one `jax.make_jaxpr` of the VJP of the same
    function. Goals: <= 2x time, <= 1.5x RSS, and 48 -> 96 layers <= 2.2x time.
(c) the marginal cost of one more policy after the first, in one process: each further policy's
    analysis against one linearization of the same function (JAX's saved_residuals), on unrolled
    and scanned stacks. Goal: ratio <= 0.25. Also shown: how much of a policy's time is JAX's own
    linearization of the function with the policy applied (the floor while JAX is the truth).
(d) start-up: `te-ckpt-audit --version` against `python -c "import jax"`. Goal: ratio <= 1.2.
(e) is bench/zoo.py (the zoo's models need the zoo's environment).
Then where the time goes: load+trace / analysis / render, in one process, for (a)'s GPT.

Timings on a shared 2-core machine are noisy; the medians and same-run baselines are the point.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

ROOT = Path(__file__).resolve().parent.parent
POLICIES = [
    "nothing_saveable",
    "checkpoint_dots",
    "checkpoint_dots_and_te_gemms",
    "dots_and_te_gemms_with_no_batch_dims",
    "everything_saveable",
]
GPT3 = ["batch=1", "seq=2048", "d_model=12288", "heads=96", "d_ff=49152", "vocab=50304", "dtype=bfloat16"]

# One process of each kind. They print a JSON line: {"seconds": ..., "rss_mib": ...}.
_PRELUDE = """
import json, resource, sys, time
t0 = time.perf_counter()
import jax
sys.path.insert(0, {root!r})
"""
_BASELINE = _PRELUDE + """
import importlib
from te_ckpt_audit.trace._loading import load_inputs, load_target
from te_ckpt_audit.config import parse_defines
target = load_target({target!r})
args = load_inputs(target, defines=parse_defines({defines!r})).args
leaves, tree = jax.tree_util.tree_flatten(args)
dyn = [i for i, x in enumerate(leaves) if isinstance(x, jax.ShapeDtypeStruct)]
def f(*xs):
    full = list(leaves)
    for i, x in zip(dyn, xs):
        full[i] = x
    return target.fn(*jax.tree_util.tree_unflatten(tree, full))
{work}
print(json.dumps({{"seconds": time.perf_counter() - t0,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""
_PRINT_SAVED = "jax.ad_checkpoint.print_saved_residuals(f, *[leaves[i] for i in dyn])"
_FLOOR = (
    "jax.make_jaxpr(lambda *xs: jax.vjp(f, *xs)[1](jax.numpy.ones((), jax.numpy.float32)))"
    "(*[leaves[i] for i in dyn])"
)
_AUDIT = _PRELUDE + """
from te_ckpt_audit import audit_target
from te_ckpt_audit.render import render_json
report = audit_target({target!r}, {policies!r}, defines={defines!r})
render_json(report)
print(json.dumps({{"seconds": time.perf_counter() - t0,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "activation_gib": report.results[1].totals.activation_bytes / 2**30}}))
"""


def _run(code: str) -> dict[str, float]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cli_seconds(target: str, defines: list[str]) -> float:
    args = ["te-ckpt-audit", target, "--format", "json"]
    args += [a for p in POLICIES for a in ("-p", p)] + [a for d in defines for a in ("-D", d)]
    t0 = time.perf_counter()
    subprocess.run(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return time.perf_counter() - t0


def _baseline_seconds(target: str, defines: list[str]) -> float:
    code = _BASELINE.format(root=str(ROOT), target=target, defines=defines, work=_PRINT_SAVED)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, check=True,
                   env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return time.perf_counter() - t0


def bench_a(repeats: int) -> None:
    print(f"(a) te-ckpt-audit, 5 policies, vs ONE print_saved_residuals; whole processes, median of {repeats}")
    cases = [
        ("sample_models/gpt.py:loss", ["layers=24"]),
        ("sample_models/flax_model.py:loss", []),
        ("sample_models/flax_model.py:loss", ["layers=24", "scan=False"]),  # unrolled: 24 distinct bodies
    ]
    for target, defines in cases:
        ours = statistics.median(_cli_seconds(target, defines) for _ in range(repeats))
        base = statistics.median(_baseline_seconds(target, defines) for _ in range(repeats))
        goal = "meets" if ours / base <= 1.5 else "MISSES"
        print(f"    {target} {' '.join(defines):10s} audit {ours:6.2f} s  print_saved_residuals "
              f"{base:6.2f} s  ratio {ours / base:5.2f}  ({goal} the 1.5 goal)")


def bench_b(quick: bool) -> None:
    print("(b) GPT-3-175B shapes (ShapeDtypeStruct, bf16): audit of 5 policies vs one make_jaxpr of the VJP")
    cases = [("48 unrolled", ["layers=48", "scan=False"]), ("96 scanned", ["layers=96", "scan=True"])]
    if not quick:
        cases.insert(1, ("96 unrolled", ["layers=96", "scan=False"]))
    times = {}
    for label, extra in cases:
        defines = GPT3 + extra
        target = "sample_models/gpt.py:loss"
        floor = _run(_BASELINE.format(root=str(ROOT), target=target, defines=defines, work=_FLOOR))
        ours = _run(_AUDIT.format(root=str(ROOT), target=target, defines=defines, policies=POLICIES))
        times[label] = ours["seconds"]
        t_ratio, m_ratio = ours["seconds"] / floor["seconds"], ours["rss_mib"] / floor["rss_mib"]
        print(f"    {label:12s} audit {ours['seconds']:6.2f} s {ours['rss_mib']:6.0f} MiB | floor "
              f"{floor['seconds']:6.2f} s {floor['rss_mib']:6.0f} MiB | time x{t_ratio:4.2f} "
              f"({'meets' if t_ratio <= 2 else 'MISSES'} 2), RSS x{m_ratio:4.2f} "
              f"({'meets' if m_ratio <= 1.5 else 'MISSES'} 1.5) | checkpoint_dots keeps "
              f"{ours['activation_gib']:.1f} GiB")
    if "96 unrolled" in times:
        scale = times["96 unrolled"] / times["48 unrolled"]
        print(f"    48 -> 96 unrolled layers: audit time x{scale:4.2f} ({'meets' if scale <= 2.2 else 'MISSES'} 2.2)")


def bench_c(repeats: int) -> None:
    """The marginal cost of one more policy, in one process: each policy's analysis once a first
    policy has run, against one linearization (JAX's saved_residuals) of the same function."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from _reference import bind_static  # the tests': the function of its array inputs alone

    from te_ckpt_audit import Session
    from te_ckpt_audit._jax_compat import saved_residuals
    from te_ckpt_audit.config import parse_defines
    from te_ckpt_audit.trace._loading import load_inputs, load_target
    from te_ckpt_audit.trace._trace import trace

    print(f"(c) one more policy after the first vs one linearization (JAX's saved_residuals); one process, "
          f"median of {repeats}")
    cases = [
        ("sample_models/flax_model.py:loss", ["layers=24", "scan=False"]),
        ("sample_models/gpt.py:loss", GPT3 + ["layers=48", "scan=False"]),
        ("sample_models/gpt.py:loss", ["layers=24"]),
        ("sample_models/flax_model.py:loss", []),
    ]
    for target, defines in cases:
        loaded = load_target(target)
        args = load_inputs(loaded, defines=parse_defines(defines)).args
        f, dyn = bind_static(loaded.fn, args)
        once = [_seconds(saved_residuals, f, *dyn) for _ in range(repeats + 1)][1:]
        # JAX's linearization of the traced function alone (no user code, each on a fresh trace:
        # JAX caches per jaxpr object, and a new policy finds its caches cold)
        fresh = [trace(loaded.fn, args, target) for _ in range(repeats)]
        alone = statistics.median([_seconds(_linearize, t.jaxpr, t.avals) for t in fresh])
        traced = fresh[0]
        more = []
        for _ in range(repeats):  # a session per round: each policy is analysed once in a session
            session = Session(traced)
            session.report([POLICIES[0], "nothing_saveable"])  # the first policy, and the warnings' baseline
            more += [_seconds(session.report, [p]) for p in POLICIES[1:]]
        # the floor of a policy: JAX's linearization of the function with that policy applied
        # (a swapped body is a new object each time, so JAX's caches for it are cold, as for ours)
        jax_alone = statistics.median(
            _seconds(_linearize_policy, traced, p) for p in POLICIES[1:] for _ in range(repeats)
        )
        ratio = statistics.median(more) / statistics.median(once)
        label = " ".join(d for d in defines if not d.startswith(tuple(g.split("=")[0] for g in GPT3))) or "-"
        shapes = " GPT-3" if defines[: len(GPT3)] == GPT3 else ""
        print(f"    {target:34s} {label + shapes:22s} one policy more {statistics.median(more):6.3f} s | "
              f"saved_residuals {statistics.median(once):6.3f} s  ratio {ratio:5.2f} "
              f"({'meets' if ratio <= 0.25 else 'MISSES'} 0.25) | linearize traced {alone:6.3f} s  ratio "
              f"{statistics.median(more) / alone:5.2f} | of which JAX's {jax_alone:6.3f} s "
              f"({100 * jax_alone / statistics.median(more):3.0f}%)")


def bench_d(repeats: int) -> None:
    print(f"(d) start-up: `te-ckpt-audit --version` vs `python -c 'import jax'`; whole processes, median of {repeats}")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    ours = statistics.median(
        _seconds(subprocess.run, ["te-ckpt-audit", "--version"], env=env, check=True, capture_output=True)
        for _ in range(repeats)
    )
    base = statistics.median(
        _seconds(subprocess.run, [sys.executable, "-c", "import jax"], env=env, check=True)
        for _ in range(repeats)
    )
    print(f"    --version {ours:5.2f} s  import jax {base:5.2f} s  ratio {ours / base:4.2f}  "
          f"({'meets' if ours / base <= 1.2 else 'MISSES'} the 1.2 goal)")


def profile() -> None:
    sys.path.insert(0, str(ROOT))
    from te_ckpt_audit import Session
    from te_ckpt_audit.config import parse_defines
    from te_ckpt_audit.render import TableView, render_json, render_table
    from te_ckpt_audit.trace._loading import load_inputs, load_target
    from te_ckpt_audit.trace._trace import trace

    target = "sample_models/gpt.py:loss"
    t0 = time.perf_counter()
    loaded = load_target(target)
    traced = trace(loaded.fn, load_inputs(loaded, defines=parse_defines(["layers=24"])).args, target)
    t1 = time.perf_counter()
    report = Session(traced).report(POLICIES)
    t2 = time.perf_counter()
    render_json(report)
    render_table(report, TableView(equations=True))
    t3 = time.perf_counter()
    total = t3 - t0
    print("where the time goes (gpt, 24 layers, 5 policies, one process, jax already imported)")
    for name, s in [("load + trace", t1 - t0), ("analysis", t2 - t1), ("render", t3 - t2)]:
        print(f"    {name:13s} {s:6.2f} s  {100 * s / total:5.1f}%")


def _linearize(closed: Any, avals: list[Any]) -> None:
    """JAX's linearization of a traced function (a fresh function: jax caches traces per function)."""
    from te_ckpt_audit._jax_compat import jaxpr_as_fun, linearize_for_vjp

    fun = jaxpr_as_fun(closed)
    jax.make_jaxpr(lambda *xs: linearize_for_vjp(fun, xs)[0])(*avals)


def _linearize_policy(traced: Any, policy: str) -> None:
    """JAX's linearization of `traced` with `policy` applied as the audit applies it, alone."""
    from te_ckpt_audit._jax_compat import linearize_for_vjp
    from te_ckpt_audit.analysis._apply import policy_function, resolve_scope
    from te_ckpt_audit.records import Scope
    from te_ckpt_audit.specs import resolve_policy

    spec = resolve_policy(policy)
    fun = policy_function(traced, spec, resolve_scope(traced, spec, Scope.AUTO), calls=True)
    jax.make_jaxpr(lambda *xs: linearize_for_vjp(fun, xs)[0])(*traced.avals)


def _seconds(work: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    t0 = time.perf_counter()
    work(*args, **kwargs)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 repeats, no 96-layer unrolled run")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    bench_a(repeats)
    bench_b(args.quick)
    bench_c(repeats)
    bench_d(repeats)
    profile()


if __name__ == "__main__":
    main()
