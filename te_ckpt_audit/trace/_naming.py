"""Checkpoint names the tool gives where the model gives none (`--name-lines`).

Each line of the user's own code that makes a matmul (JAX's dot_general or convolution, TE's
GEMMs) inside a checkpoint gets a name, `<file stem>_<line>` (`gpt_52` for `sample_models/gpt.py`
line 52): every matmul output of that line is passed through `checkpoint_name(..., "gpt_52")`, as
the user would write it there. Where the line is inside a helper called from several lines (a
`_conv` every block calls), the name goes to each calling line instead, one level out at a time,
so that one name is one decision the user can paste at one line. The names are added to the traced
jaxpr before it is tagged, so every later stage (the audit, the compiles, the search) sees them as
the model's own, and a pick that saves one is the policy the user gets by pasting that one call.
A function without any checkpoint has its matmul lines named everywhere (a policy then goes around
the whole function). Bodies of custom_vjp and custom_jvp rules are left alone: JAX traces their
forward rule when it differentiates, not from this jaxpr.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import jax.numpy as jnp

from .. import _jax_compat as jc
from .._jaxpr import is_gemm, map_sub_jaxprs, open_jaxpr, sub_jaxprs
from ..policies import is_te_gemm
from ..records import SourceLocation
from ._source import SourceFinder

_CUSTOM_RULES = (jc.custom_vjp_call_p, jc.custom_jvp_call_p)
_DEPTH = 4  # call levels a name may move out of a shared helper

Chain = tuple[SourceLocation, ...]  # the user's frames that made one matmul, innermost first


def line_name(file: str, line: int) -> str:
    """The name the tool gives a line: the file's stem and the line, as an identifier.

    >>> line_name("sample_models/gpt.py", 52)
    'gpt_52'
    """
    stem = re.sub(r"\W+", "_", Path(file).stem).strip("_").lower() or "line"
    return f"{stem}_{line}" if not stem[0].isdigit() else f"x{stem}_{line}"


def name_lines(jaxpr: jc.Jaxpr, finder: SourceFinder) -> tuple[jc.Jaxpr, dict[str, str]]:
    """`jaxpr` with the matmuls of the user's lines named (inside checkpoints where it has any),
    and the names given: name -> "file:line"."""
    everywhere = not _has_remat(jaxpr, {})
    chains: dict[int, Chain] = {}
    for eqn in _matmuls(jaxpr, everywhere, set()):
        chain = finder.user_lines(eqn)
        if chain:
            chains[id(eqn)] = chain
    where = _lines(set(chains.values()))
    named: dict[str, str] = {}
    for chain in chains.values():
        at = where[chain]
        named.setdefault(line_name(at.file, at.line), f"{at.file}:{at.line}")
    names = {k: line_name(where[c].file, where[c].line) for k, c in chains.items()}
    return _named(jaxpr, names, {}), named


def _lines(chains: set[Chain]) -> dict[Chain, SourceLocation]:
    """The line each chain is named at: its innermost, or the line that calls it where that line
    is a helper's that several lines call."""
    depth = dict.fromkeys(chains, 0)
    for _ in range(_DEPTH):
        callers: dict[SourceLocation, set[SourceLocation | None]] = {}
        for c, k in depth.items():
            callers.setdefault(c[k], set()).add(c[k + 1] if k + 1 < len(c) else None)
        moved = False
        for c, k in depth.items():
            if len(callers[c[k]]) > 1 and k + 1 < len(c):
                depth[c] = k + 1
                moved = True
        if not moved:
            break
    return {c: c[k] for c, k in depth.items()}


def _has_remat(jaxpr: jc.Jaxpr, seen: dict[int, bool]) -> bool:
    if id(jaxpr) not in seen:
        seen[id(jaxpr)] = any(
            eqn.primitive is jc.remat_p or (eqn.primitive not in _CUSTOM_RULES and any(
                _has_remat(open_jaxpr(sub), seen) for _, _, sub in sub_jaxprs(eqn.params)))
            for eqn in jaxpr.eqns)
    return seen[id(jaxpr)]


def _matmuls(jaxpr: jc.Jaxpr, inside: bool, seen: set[tuple[int, bool]]) -> Iterator[jc.JaxprEqn]:
    """The matmuls to name: those with a floating output, inside a checkpoint where `inside`."""
    if (id(jaxpr), inside) in seen:
        return
    seen.add((id(jaxpr), inside))
    for eqn in jaxpr.eqns:
        if eqn.primitive in _CUSTOM_RULES:
            continue
        for _, _, sub in sub_jaxprs(eqn.params):
            yield from _matmuls(open_jaxpr(sub), inside or eqn.primitive is jc.remat_p, seen)
        if inside and _is_named_matmul(eqn):
            yield eqn


def _is_named_matmul(eqn: jc.JaxprEqn) -> bool:
    if not (is_gemm(eqn.primitive) or is_te_gemm(eqn.primitive)) or not eqn.outvars:
        return False
    out = eqn.outvars[0]
    dtype = getattr(out.aval, "dtype", None)
    return (not isinstance(out, jc.DropVar) and dtype is not None and bool(getattr(out.aval, "shape", ()))
            and jnp.issubdtype(dtype, jnp.floating))


def _named(jaxpr: jc.Jaxpr, names: dict[int, str], memo: dict[int, tuple[object, object]]) -> jc.Jaxpr:
    """`jaxpr` with each equation of `names` (by id) followed by its `checkpoint_name`."""
    renamed: dict[jc.Var, jc.Var] = {}

    def atom(v: jc.Atom) -> jc.Atom:
        return v if isinstance(v, jc.Literal) else renamed.get(v, v)

    def inner(_: int, sub: jc.Jaxpr) -> jc.Jaxpr:
        return _named(sub, names, memo)

    eqns: list[jc.JaxprEqn] = []
    changed = False
    for eqn in jaxpr.eqns:
        name = names.get(id(eqn))  # by the equation as traced, before it is rebuilt below
        invars = [atom(v) for v in eqn.invars]
        params = eqn.params if eqn.primitive in _CUSTOM_RULES else map_sub_jaxprs(eqn.params, inner, memo)  # type: ignore[arg-type]
        if any(params[k] is not eqn.params[k] for k in params) or any(
                a is not b for a, b in zip(invars, eqn.invars, strict=True)):
            eqn = eqn.replace(invars=invars, params=params)
            changed = True
        eqns.append(eqn)
        if name is None:
            continue
        out = eqn.outvars[0]
        fresh = jc.Var(out.aval)
        eqns.append(jc.new_jaxpr_eqn([out], [fresh], jc.name_p, {"name": name}, set(), eqn.source_info, eqn.ctx))
        renamed[out] = fresh
        changed = True
    if not changed:
        return jaxpr
    return jaxpr.replace(eqns=eqns, outvars=[atom(v) for v in jaxpr.outvars])
