"""The quantization table of docs/guide/te.md: real TE 2.20.2's DenseGeneral, LayerNormMLP and TransformerLayer
under each FP8/FP4 recipe this emulated GPU supports, and each policy: activation bytes, the
quantized share, and the quantizations the backward pass runs again. Markdown rows on stdout.

    bash te_cpu/quantization_table.sh      # both emulated GPUs (H100, then B200 for MXFP8 and NVFP4)
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
warnings.simplefilter("ignore")

import test_real_te as cases  # noqa: E402  (the te lane's own models, recipes and policies)

from te_ckpt_audit import audit  # noqa: E402
from te_ckpt_audit.render import format_bytes  # noqa: E402


def main() -> None:
    cc = cases._emulated_cc()
    for kind, recipe in cases.QUANT_CASES:
        if not (cases.NEEDS[recipe] <= cc) or (cc >= 9.9 and cases.NEEDS[recipe] < 9.9):
            continue  # each recipe once: on the H100 where it runs there, else on the B200
        fn, args = cases._quant_case(kind, recipe)
        policies = cases.QUANT_POLICIES if kind != "TransformerLayer" else cases.QUANT_POLICIES[:-1]
        with jax.numpy_dtype_promotion("standard"):
            report = audit(fn, *args, policies=policies)
        for r in report.results:
            t = r.totals
            print(f"| {kind} | {recipe} | `{r.policy}` | {format_bytes(t.activation_bytes)} | "
                  f"{format_bytes(t.quantized_bytes)} | {r.requantized} |")


if __name__ == "__main__":
    main()
