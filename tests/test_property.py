"""Property: for generated programs (tests/_gen.py) and policies, the residuals te-ckpt-audit
reports are exactly JAX's own `saved_residuals`: shape, dtype as JAX prints it, bytes; activation,
argument, host and constant totals; literals listed apart at 0 bytes; recompute within the forward
FLOPs; a policy JAX cannot differentiate under fails its own row. Deterministic: the same programs
every run."""

from __future__ import annotations

import os

import pytest
from _gen import ALL_FEATURES, SPECS, Block, Program, check, features, programs
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# CI runs 300 programs, two policies each; TE_CKPT_AUDIT_PROPERTY_EXAMPLES runs more (or fewer).
EXAMPLES = int(os.environ.get("TE_CKPT_AUDIT_PROPERTY_EXAMPLES", "300"))
PER_PROGRAM = 2  # policies per program, drawn from SPECS (each class below runs all of them)

DETERMINISTIC = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@DETERMINISTIC
@given(prog=programs(), specs=st.lists(st.sampled_from(SPECS), min_size=PER_PROGRAM, max_size=PER_PROGRAM, unique=True))
def test_generated_programs_match_jax(prog: Program, specs: list[str]) -> None:
    assert check(prog, specs) == []


def test_the_generator_reaches_every_class() -> None:
    """The property above is only as good as what it draws: every op, block kind, key kind, input
    kind and checkpoint shape comes up within the same number of draws."""
    seen: set[str] = set()

    @settings(DETERMINISTIC, phases=[Phase.generate])
    @given(programs())
    def collect(prog: Program) -> None:
        seen.update(features(prog))

    collect()
    assert ALL_FEATURES - seen == set()


def _block(kind: str, *ops: str, remat: bool = False, own: str = "nothing_saveable", passthrough: str = "") -> Block:
    return Block(kind, ops, remat or kind == "remat", own, 0, passthrough, "")


def _prog(*blocks: Block, dtype: str = "float32", key: str = "", key_input: bool = True, weak: str = "") -> Program:
    return Program(dtype, key, key_input, weak, blocks, False)


# One small program per class the generator draws, under every policy: a failure here names its
# class (the property's counterexamples are larger).
CLASSES = {
    **{
        f"dropout-{key}-{'input' if key_input else 'inside'}": _prog(
            _block("remat", "dot", "drop", "sin"), key=key, key_input=key_input
        )
        for key in ("raw", "threefry2x32", "rbg", "unsafe_rbg")
        for key_input in (True, False)
    },
    "key-scan-carry": _prog(_block("scan", "drop", "dot", "tanh", remat=True), key="threefry2x32"),
    "key-fori-carry": _prog(_block("fori", "drop", "sin"), key="rbg"),
    "while-off-path": _prog(_block("remat", "while_sg", "dot", "while_int", "sin")),
    "cond": _prog(_block("cond", "dot", "sin", remat=True)),
    "jit": _prog(_block("jit", "dot", "tanh", remat=True)),
    "solve": _prog(_block("plain", "solve", "sin")),
    "inv": _prog(_block("plain", "inv", "sin")),
    "slogdet": _prog(_block("plain", "slogdet", "sin")),
    "custom_linear_solve": _prog(_block("plain", "cls", "sin")),
    "cg": _prog(_block("plain", "cg", "sin")),
    "custom_jvp": _prog(_block("remat", "dot", "cjvp", "sin")),
    "complex-error-row": _prog(_block("plain", "dot", "complex")),
    "weak-sds-bf16": _prog(_block("plain", "weak", "dot"), dtype="bfloat16", weak="sds"),
    "weak-array-bf16": _prog(_block("plain", "weak", "dot"), dtype="bfloat16", weak="array"),
    "passthrough-input": _prog(_block("remat", "dot", "sin", passthrough="input")),
    "passthrough-twice": _prog(_block("remat", "dot", "sin", passthrough="twice")),
    "remat-only-in-custom-vjp-fwd": _prog(_block("plain", "sin"), _block("cvjp", "dot", "sin", remat=True)),
    "literal": _prog(_block("plain", "lit", "dot")),
}


@pytest.mark.parametrize("name", list(CLASSES))
def test_each_program_class_matches_jax(name: str) -> None:
    assert check(CLASSES[name]) == []
