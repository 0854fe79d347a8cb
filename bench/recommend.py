"""Benchmark: `recommend`'s search against exhaustive search, on a model with 8 checkpoint names;
and the search's estimator on 160 names against one analysis.

    python bench/recommend.py              # budgets across the whole frontier
    python bench/recommend.py --quick      # three budgets

Exhaustive search analyses every candidate of the space (presets, and all 2^8 subsets of the names
alone and with each dot/TE GEMM preset: about a thousand JAX linearizations), once; the optimum for
any budget is then the least recompute among its points that fit. The search runs once per budget.
For each budget it must find the same optimum (the same recompute FLOPs; its spec may differ only
where two policies tie); the run prints both times and their ratio, and exits 1 on any mismatch.
Each search gets a session of its own (the trace shared), so no search reuses another's analyses.

The estimator (the exact knapsack over each name's additive estimate, on bit masks) runs once per
base policy before any analysis; with 160 names its time is printed against one JAX analysis of
the same 8-layer model (the baseline: JAX's own `saved_residuals` of it under `checkpoint_dots`,
what one verified point costs at the least).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sample_models import eight_names  # noqa: E402
from te_ckpt_audit._jax_compat import saved_residuals  # noqa: E402
from te_ckpt_audit._session import Session  # noqa: E402
from te_ckpt_audit.search._recommend import _estimated_frontier, _Marginal, recommend  # noqa: E402
from te_ckpt_audit.trace._trace import trace  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="three budgets")
    args = parser.parse_args()
    traced = trace(eight_names.loss, eight_names.loss_inputs(layers=8), "sample_models/eight_names.py:loss")
    print(f"model: {traced.target}, names: {', '.join(sorted(traced.rows.names))}")

    start = time.perf_counter()
    every = recommend(Session(traced), 10**15, exhaustive=True)
    exhaustive_s = time.perf_counter() - start
    points = [c for c in every.evaluated if c.error is None]
    print(f"exhaustive: {len(every.evaluated)} policies analysed in {exhaustive_s:.1f} s")

    # budgets between each pair of neighbouring frontier points, and on them
    sizes = sorted({c.activation_bytes for c in every.frontier if c.activation_bytes > 0})
    budgets = sorted({*sizes, *((a + b) // 2 for a, b in zip(sizes, sizes[1:], strict=False))})
    if args.quick:
        budgets = [budgets[len(budgets) // 4], budgets[len(budgets) // 2], budgets[3 * len(budgets) // 4]]

    search_s = 0.0
    evals = 0
    mismatches = 0
    print(f"{'budget B':>9}  {'evals':>5}  {'search s':>8}  {'recompute':>10}  {'exhaustive':>10}  policy")
    for budget in budgets:
        start = time.perf_counter()
        rec = recommend(Session(traced), budget)
        took = time.perf_counter() - start
        search_s += took
        evals += len(rec.evaluated)
        best = min((c for c in points if c.activation_bytes <= budget),
                   key=lambda c: (c.recompute_flops, c.activation_bytes))
        got = rec.recommended
        same = got is not None and got.recompute_flops == best.recompute_flops
        mismatches += not same
        print(f"{budget:>9}  {len(rec.evaluated):>5}  {took:>8.2f}  {got.recompute_flops if got else '-':>10}  "
              f"{best.recompute_flops:>10}  {got.policy if got else '-'}{'' if same else '  MISMATCH: ' + best.policy}")

    per_search = search_s / len(budgets)
    print(f"\nsame optimum as exhaustive: {len(budgets) - mismatches} of {len(budgets)} budgets")
    print(f"exhaustive search: {exhaustive_s:.1f} s ({len(every.evaluated)} analyses, all budgets at once)")
    print(f"search:            {per_search:.2f} s per budget on average ({evals / len(budgets):.0f} analyses)")
    print(f"ratio:             exhaustive / search = {exhaustive_s / per_search:.1f}x")
    estimator()
    return 1 if mismatches else 0


def estimator(names: int = 160) -> None:
    """The estimator's frontier over `names` names (random marginals, fixed seed), against JAX's
    `saved_residuals` of the 8-layer model under checkpoint_dots."""
    import jax

    fn = jax.checkpoint(eight_names.loss, policy=jax.checkpoint_policies.checkpoint_dots)
    start = time.perf_counter()
    saved_residuals(fn, *eight_names.loss_inputs(layers=8))
    one_analysis = time.perf_counter() - start
    rng = random.Random(0)
    labels = [f"n{i}" for i in range(names)]
    marginal = {n: _Marginal(rng.randrange(1, 1 << 20), rng.randrange(1, 1 << 30)) for n in labels}
    start = time.perf_counter()
    front = _estimated_frontier(1 << 30, 1 << 40, labels, marginal)
    took = time.perf_counter() - start
    print(f"\nestimator, {names} names: {took:.2f} s ({len(front)} frontier points); "
          f"one analysis (baseline): {one_analysis:.3f} s; ratio {took / one_analysis:.1f}x")


if __name__ == "__main__":
    sys.exit(main())
