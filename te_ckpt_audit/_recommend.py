"""Recommend: the policy whose activation bytes fit a budget with the least recompute.

The search space is exponential (every subset of the model's checkpoint names, alone or with a
dot/TE GEMM preset, and with offloading every way to split a subset between device and host), so
the search measures and then proposes:

1. every named preset is analysed;
2. on each base (names alone, and each dot/TE GEMM preset), every name alone: its marginal bytes
   and the recompute FLOPs it saves (one analysis per name and base);
3. an additive model of those marginals proposes, per base, the Pareto-optimal subsets near the
   budget (an exact knapsack frontier over the estimates); the best proposals are analysed;
4. a local search (add one name, swap one for another) around the best verified fits, which
   catches what the additive model misses (a saved name that makes another cheaper to recompute);
5. with offloading allowed, names of the fastest candidates that do not fit move to host memory,
   largest first, until the rest fits; then those that need not be offloaded move back.

Every figure reported (the winner, the frontier, every evaluated point) is an `analyse` result,
JAX's own linearization; estimates only choose what to analyse next.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax

from ._analysis import analyse
from ._api import traced_target
from ._heap import without_gc
from ._mesh import build_mesh, parse_mesh, per_device, spec_of
from ._trace import Traced
from .errors import TargetError, UsageError
from .report import AuditReport, MeshSpec, PolicyResult, Scope, ShardingSource, TeKind
from .specs import resolve_policy

SCHEMA = "te-ckpt-audit-recommend/1"

# Named presets: JAX's and the TE-aware ones. `everything_saveable` and `nothing_saveable` are the
# two ends of the frontier.
PRESETS = (
    "nothing_saveable",
    "checkpoint_dots_with_no_batch_dims",
    "checkpoint_dots",
    "te_gemms_saveable",
    "dots_and_te_gemms_with_no_batch_dims",
    "checkpoint_dots_and_te_gemms",
    "everything_saveable",
)
OFFLOAD_PRESETS = ("offload_dot_with_no_batch_dims",)
# Presets a subset of names is combined with (`save_only_these_names:...+BASE`): TE-aware where the
# model has TE GEMMs, JAX's own where it has none (the same policies there, with JAX's names).
TE_BASES = ("te_gemms_saveable", "dots_and_te_gemms_with_no_batch_dims", "checkpoint_dots_and_te_gemms")
JAX_BASES = ("checkpoint_dots_with_no_batch_dims", "checkpoint_dots")
DEFAULT_MAX_EVALS = 64
_UNSPEAKABLE = re.compile(r"[,;+=:\s]")  # a name with these cannot be written in a spec


class CandidateKind(enum.StrEnum):
    PRESET = "preset"  # a named policy
    NAMES = "names"  # save_only_these_names over a subset
    COMBINED = "combined"  # a subset and a preset: SPEC+PRESET (save_from_both_policies)
    OFFLOAD = "offload"  # save_and_offload_only_these_names


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One evaluated policy, with JAX's figures for it. `base` is the preset a name subset is
    combined with (for a preset, itself); `saved`/`offloaded` are the checkpoint names it keeps on
    device / on host."""

    policy: str  # the spec, as --policy takes it
    kind: CandidateKind
    base: str | None
    saved: tuple[str, ...]
    offloaded: tuple[str, ...]
    activation_bytes: int  # what the budget holds: bytes on one device with a mesh, else in all
    host_bytes: int
    recompute_flops: int
    forward_flops: int
    fits: bool
    error: str | None = None  # why JAX could not differentiate under it
    global_activation_bytes: int | None = None  # with a mesh: the activation bytes of whole arrays

    @property
    def recompute_percent(self) -> float:
        return 100.0 * self.recompute_flops / self.forward_flops if self.forward_flops else 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Recommendation:
    """What `recommend` found. `recommended` is None when nothing fits; `closest` is then the
    candidate with the fewest activation bytes. `frontier` is the Pareto frontier of (activation
    bytes, recompute FLOPs) over `evaluated`, fewest bytes first. `report` holds the full analysis
    of every frontier point and of the winner (for the HTML report)."""

    target: str
    budget_bytes: int
    mesh: MeshSpec | None  # the budget is per device on it
    names: tuple[str, ...]  # the checkpoint names searched over
    skipped_names: tuple[str, ...]  # names a spec cannot spell (they hold , ; + = : or spaces)
    allow_offload: bool
    max_evals: int
    recommended: Candidate | None
    closest: Candidate | None
    frontier: tuple[Candidate, ...]
    evaluated: tuple[Candidate, ...]
    report: AuditReport

    @property
    def fits(self) -> bool:
        return self.recommended is not None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (schema ``te-ckpt-audit-recommend/1``): plain, ordered, deterministic."""
        return {
            "schema": SCHEMA,
            "target": self.target,
            "budget_bytes": self.budget_bytes,
            "mesh": None if self.mesh is None else {a.name: a.size for a in self.mesh.axes},
            "names": list(self.names),
            "skipped_names": list(self.skipped_names),
            "allow_offload": self.allow_offload,
            "max_evals": self.max_evals,
            "evaluations": len(self.evaluated),
            "forward_flops": self.report.forward_flops,
            "fits": self.fits,
            "recommended": None if self.recommended is None else candidate_dict(self.recommended),
            "closest": None if self.closest is None else candidate_dict(self.closest),
            "frontier": [candidate_dict(c) for c in self.frontier],
            "evaluated": [candidate_dict(c) for c in self.evaluated],
        }


def candidate_dict(c: Candidate) -> dict[str, Any]:
    return {
        "policy": c.policy,
        "kind": c.kind.value,
        "base": c.base,
        "saved": list(c.saved),
        "offloaded": list(c.offloaded),
        "activation_bytes": c.activation_bytes,
        "host_bytes": c.host_bytes,
        "recompute_flops": c.recompute_flops,
        "forward_flops": c.forward_flops,
        "recompute_percent": round(c.recompute_percent, 4),
        "fits": c.fits,
        "error": c.error,
        "global_activation_bytes": c.global_activation_bytes,
    }


def spec_text(base: str | None, saved: Iterable[str] = (), offloaded: Iterable[str] = ()) -> str:
    """The --policy spec of a base preset with names saved (and offloaded).

    >>> spec_text("checkpoint_dots", ["ffn1", "context"])
    'save_only_these_names:ffn1,context+checkpoint_dots'
    """
    saved, offloaded = list(saved), list(offloaded)
    if offloaded:
        if base is not None:
            raise ValueError("an offload policy cannot be combined with a preset")
        return f"save_and_offload_only_these_names:save={','.join(saved)};offload={','.join(offloaded)}"
    names = f"save_only_these_names:{','.join(saved)}" if saved else None
    if names and base:
        return f"{names}+{base}"
    return names or base or "nothing_saveable"


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def check_budget(budget_bytes: float) -> int:
    """A budget is a finite number of bytes above zero."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int | float):
        raise UsageError(f"budget must be a number of bytes, not {budget_bytes!r}", "e.g. --budget 6GiB")
    if not math.isfinite(budget_bytes) or budget_bytes <= 0:
        raise UsageError(f"budget must be a finite size above zero, not {budget_bytes!r}", "e.g. --budget 6GiB")
    return int(budget_bytes)


class _Evaluator:
    """Analyses candidates, each once, up to `max_evals` analyses; keeps every result."""

    def __init__(
        self, traced: Traced, scope: Scope, budget: int, max_evals: int,
        progress: Callable[[str], None], mesh: jax.sharding.Mesh | None,
    ) -> None:
        self.traced, self.scope, self.budget, self.max_evals = traced, scope, budget, max_evals
        self.progress, self.mesh = progress, mesh
        self.done: dict[str, Candidate] = {}
        self.results: dict[str, PolicyResult] = {}

    @property
    def left(self) -> int:
        return self.max_evals - len(self.done)

    def get(self, kind: CandidateKind, base: str | None, saved: Sequence[str] = (),
            offloaded: Sequence[str] = ()) -> Candidate | None:
        """The candidate, analysed now if new; None when no analyses are left."""
        text = spec_text(base, saved, offloaded)
        if text in self.done:
            return self.done[text]
        if self.left <= 0:
            return None
        if not saved and not offloaded:
            kind = CandidateKind.PRESET
        spec = resolve_policy(text)  # the spec a user types: what we report is what --policy runs
        self.progress(f"analysing {text}")
        try:
            result = analyse(self.traced, spec, self.scope)
            if self.mesh is not None:
                result = per_device(self.traced, spec, result, self.mesh)
            error = None
        except TargetError as exc:
            result, error = None, exc.message
        forward = sum(e.flops * e.multiplicity for e in self.traced.rows.equations())
        if result is None:
            cand = Candidate(text, kind, base, tuple(saved), tuple(offloaded), 0, 0, 0, forward, False, error)
        else:
            self.results[text] = result
            t = result.totals
            device = t.activation_bytes if t.activation_bytes_per_device is None else t.activation_bytes_per_device
            cand = Candidate(
                text, kind, base, tuple(saved), tuple(offloaded), device, t.host_bytes,
                result.recompute_flops, result.forward_flops, device <= self.budget, None,
                None if self.mesh is None else t.activation_bytes,
            )
        self.done[text] = cand
        return cand


def _rank(c: Candidate) -> tuple[Any, ...]:
    """Least recompute; then least host traffic, fewest device bytes, simplest spec."""
    return (c.recompute_flops, c.host_bytes, c.activation_bytes, len(c.saved) + len(c.offloaded), c.policy)


def best_fit(candidates: Iterable[Candidate]) -> Candidate | None:
    fits = [c for c in candidates if c.fits and c.error is None]
    return min(fits, key=_rank) if fits else None


def pareto_frontier(candidates: Iterable[Candidate]) -> tuple[Candidate, ...]:
    """Points no other point beats on both activation bytes and recompute FLOPs, fewest bytes
    first; of equal points, the best ranked."""
    ok = sorted((c for c in candidates if c.error is None), key=lambda c: (c.activation_bytes, *_rank(c)))
    out: list[Candidate] = []
    for c in ok:
        if not out or c.recompute_flops < out[-1].recompute_flops:
            out.append(c)
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class _Marginal:
    bytes: int  # device bytes saving the name adds
    flops: int  # recompute FLOPs saving it saves


def _estimated_frontier(
    base_bytes: int, base_flops: int, names: Sequence[str], marginal: Mapping[str, _Marginal], cap: int = 4096
) -> list[tuple[int, int, frozenset[str]]]:
    """The Pareto frontier of (bytes, recompute) over every subset, under the additive model: a
    knapsack solved exactly by dynamic programming over non-dominated partial subsets."""
    states: list[tuple[int, int, frozenset[str]]] = [(base_bytes, base_flops, frozenset())]
    for n in names:
        m = marginal[n]
        grown = states + [(b + m.bytes, f - m.flops, s | {n}) for b, f, s in states]
        grown.sort(key=lambda t: (t[0], t[1], sorted(t[2], key=_natural)))
        states = []
        for st in grown:
            if not states or st[1] < states[-1][1]:
                states.append(st)
        if len(states) > cap:  # thin evenly, keeping both ends
            step = len(states) / cap
            states = [states[int(i * step)] for i in range(cap - 1)] + [states[-1]]
    return states


def _ordered(names: Iterable[str], order: Sequence[str]) -> tuple[str, ...]:
    chosen = set(names)
    return tuple(n for n in order if n in chosen)


@without_gc
def recommend(
    traced: Traced,
    budget_bytes: float,
    *,
    allow_offload: bool = False,
    max_evals: int = DEFAULT_MAX_EVALS,
    scope: Scope | str = Scope.AUTO,
    presets: Sequence[str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
    mesh: jax.sharding.Mesh | None = None,
    exhaustive: bool = False,
) -> Recommendation:
    """The policy with the least recompute FLOPs whose activation bytes fit `budget_bytes`, and
    the Pareto frontier of everything analysed (at most `max_evals` analyses, each exact). With
    `mesh` (the inputs traced placed on it: `place_args`), the budget holds per-device bytes.
    With `exhaustive`, every candidate of the space is analysed instead (2^names per base: for
    checking the search on small models).

    >>> import jax, jax.numpy as jnp
    >>> from jax.ad_checkpoint import checkpoint_name
    >>> from te_ckpt_audit._trace import trace
    >>> f = lambda x: jnp.sum(jnp.sin(checkpoint_name(jnp.sin(x), "a")))
    >>> t = trace(f, (jax.ShapeDtypeStruct((256,), jnp.float32),))
    >>> r = recommend(t, 1024)
    >>> r.recommended.policy, r.recommended.activation_bytes
    ('save_only_these_names:a', 1024)
    """
    budget = check_budget(budget_bytes)
    if isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < 1:
        raise UsageError(f"max evaluations must be at least 1, not {max_evals!r}", "e.g. --max-evals 64")
    scope = Scope(scope)
    preset_list = list(PRESETS if presets is None else presets)
    if allow_offload and presets is None:
        preset_list += OFFLOAD_PRESETS
    for p in preset_list:
        resolve_policy(p)  # a bad preset fails here, before any analysis
    ev = _Evaluator(traced, scope, budget, math.inf if exhaustive else max_evals, progress, mesh)  # type: ignore[arg-type]
    # JAX traces custom_vjp forward rules on the first differentiation: the names and equations in
    # them are known once one policy is analysed (without presets, the empty subset of names)
    for p in preset_list or [spec_text(None)]:
        ev.get(CandidateKind.PRESET, p)
    found = sorted(traced.rows.names, key=_natural)
    names = tuple(n for n in found if not _UNSPEAKABLE.search(n))
    skipped = tuple(n for n in found if _UNSPEAKABLE.search(n))
    if not names and not preset_list:
        raise UsageError(
            f"{traced.target or 'the function'} has no checkpoint names and no presets are left to search",
            "tag activations with jax.ad_checkpoint.checkpoint_name, or search the presets too",
        )
    has_te = any(e.is_te_gemm for e in traced.rows.equations())
    bases: list[str | None] = [None, *(TE_BASES if has_te else JAX_BASES)]
    kind_of: dict[str | None, CandidateKind] = {None: CandidateKind.NAMES}
    if exhaustive:
        _exhaustive(ev, names, bases, allow_offload)
    elif names:
        _propose(ev, names, bases, kind_of, allow_offload)

    evaluated = tuple(ev.done.values())
    winner = best_fit(evaluated)
    closest = None
    if winner is None:
        ok = [c for c in evaluated if c.error is None]
        closest = min(ok, key=lambda c: (c.activation_bytes, *_rank(c))) if ok else None
    frontier = pareto_frontier(evaluated)
    shown = list(frontier)
    for extra in (winner, closest):
        if extra is not None and extra not in shown:
            shown.append(extra)
    report = AuditReport(
        target=traced.target,
        arguments=tuple(f"{n}: {a.dtype}{list(a.shape)}" for n, a in zip(traced.arg_names, traced.avals, strict=True)),
        jax_version=jax.__version__,
        te=_te(traced),
        equations=traced.rows.equations(),
        results=tuple(ev.results[c.policy] for c in shown if c.policy in ev.results),
        mesh=None if mesh is None else spec_of(mesh),
        sharding_source=None if mesh is None else ShardingSource.COMPILED,
    )
    if not evaluated or all(c.error is not None for c in evaluated):
        first = next((c.error for c in evaluated if c.error), None)
        raise TargetError(first or "no candidate could be analysed", "rerun with --debug for the traceback")
    return Recommendation(
        target=traced.target,
        budget_bytes=budget,
        mesh=None if mesh is None else spec_of(mesh),
        names=names,
        skipped_names=skipped,
        allow_offload=allow_offload,
        max_evals=max_evals,
        recommended=winner,
        closest=closest,
        frontier=frontier,
        evaluated=evaluated,
        report=report,
    )


def _te(traced: Traced) -> TeKind:
    return TeKind.of(traced.rows.equations())


def _subsets(names: Sequence[str]) -> Iterable[tuple[str, ...]]:
    for mask in range(1 << len(names)):
        yield tuple(n for i, n in enumerate(names) if mask >> i & 1)


def _exhaustive(ev: _Evaluator, names: Sequence[str], bases: Sequence[str | None], allow_offload: bool) -> None:
    for base in bases:
        for subset in _subsets(names):
            ev.get(CandidateKind.NAMES if base is None else CandidateKind.COMBINED, base, subset)
    if allow_offload:  # each name remat, saved or offloaded: 3^names
        for mask in range(3 ** len(names)):
            digits = [(mask // 3**i) % 3 for i in range(len(names))]
            saved = [n for n, d in zip(names, digits, strict=True) if d == 1]
            off = [n for n, d in zip(names, digits, strict=True) if d == 2]
            if off:
                ev.get(CandidateKind.OFFLOAD, None, saved, off)


def _propose(
    ev: _Evaluator, names: Sequence[str], bases: Sequence[str | None],
    kind_of: Mapping[str | None, CandidateKind], allow_offload: bool,
) -> None:
    def kind(base: str | None) -> CandidateKind:
        return kind_of.get(base, CandidateKind.COMBINED)

    # 2. marginals: each name alone on each base (names alone first: they matter most)
    marginals: dict[str | None, dict[str, _Marginal]] = {}
    for base in bases:
        start = ev.get(kind(base), base)
        if start is None or start.error is not None:
            continue
        m: dict[str, _Marginal] = {}
        for n in names:
            c = ev.get(kind(base), base, (n,))
            if c is None:
                break
            if c.error is None:
                m[n] = _Marginal(c.activation_bytes - start.activation_bytes, start.recompute_flops - c.recompute_flops)
        if len(m) == len(names):
            marginals[base] = m

    # 3. proposals: per base, the estimated frontier's best fits and the first point past the budget
    proposals: list[tuple[int, int, str | None, frozenset[str]]] = []
    for base, m in marginals.items():
        start = ev.done[spec_text(base)]
        est = _estimated_frontier(start.activation_bytes, start.recompute_flops, names, m)
        fitting = [e for e in est if e[0] <= ev.budget]
        over = [e for e in est if e[0] > ev.budget]
        for b, f, s in fitting[-3:] + over[:1]:
            proposals.append((f, b, base, s))
    proposals.sort(key=lambda p: (p[0], p[1], p[2] or "", sorted(p[3], key=_natural)))
    for _, _, base, s in proposals:
        if ev.get(kind(base), base, _ordered(s, names)) is None:
            return

    # 4. local search around the best verified fit of each base, best bases first
    starts = sorted(
        (c for c in ev.done.values() if c.fits and c.error is None and c.kind is not CandidateKind.OFFLOAD
         and (c.base in marginals)),
        key=_rank,
    )
    seen_bases: set[str | None] = set()
    for c in starts:
        if c.base in seen_bases:
            continue
        seen_bases.add(c.base)
        if not _climb(ev, c, names, marginals[c.base], kind(c.base)):
            return

    # 5. offload: the fastest candidates that do not fit, names moved to host until they do
    if allow_offload:
        _offload(ev, names, marginals.get(None, {}))


def _climb(ev: _Evaluator, start: Candidate, names: Sequence[str], m: Mapping[str, _Marginal],
           kind: CandidateKind) -> bool:
    """Best-improvement hill climbing over add-one and swap-one neighbours that the estimates say
    fit; False when the analyses ran out."""
    current = start
    while True:
        s = set(current.saved)
        neighbours: list[tuple[int, frozenset[str]]] = []
        for n in names:
            if n not in s:
                neighbours.append((m[n].flops, frozenset(s | {n})))
                for o in s:
                    neighbours.append((m[n].flops - m[o].flops, frozenset((s - {o}) | {n})))
        here = current.activation_bytes  # estimates start from the current point's exact bytes
        neighbours = [
            nb for nb in neighbours
            if nb[0] >= 0 and here + _delta_bytes(m, s, nb[1]) <= ev.budget
        ]
        neighbours.sort(key=lambda nb: (-nb[0], sorted(nb[1], key=_natural)))
        best = current
        for _, t in neighbours:
            c = ev.get(kind, current.base, _ordered(t, names))
            if c is None:
                return False
            if c.fits and c.error is None and _rank(c) < _rank(best):
                best = c
                break  # first improvement: move on from there
        if best is current:
            return True
        current = best


def _delta_bytes(m: Mapping[str, _Marginal], old: set[str], new: frozenset[str]) -> int:
    return sum(m[n].bytes for n in new - old) - sum(m[n].bytes for n in old - new)


def _offload(ev: _Evaluator, names: Sequence[str], m: Mapping[str, _Marginal]) -> None:
    if not m:
        return
    # every name kept is the least recompute names alone can give: offloading starts there
    if ev.get(CandidateKind.NAMES, None, tuple(names)) is None:
        return
    fast = sorted(
        (c for c in ev.done.values() if not c.fits and c.error is None and c.base is None and c.saved
         and not c.offloaded),
        key=_rank,
    )[:3]
    for c in fast:
        saved = list(c.saved)
        offloaded: list[str] = []
        excess = c.activation_bytes - ev.budget
        for n in sorted(saved, key=lambda n: (-m[n].bytes, _natural(n))):
            if excess <= 0:
                break
            saved.remove(n)
            offloaded.append(n)
            excess -= m[n].bytes
        cand = ev.get(CandidateKind.OFFLOAD, None, _ordered(saved, names), _ordered(offloaded, names))
        if cand is None:
            return
        # names that fit back on the device need not go to host: fewer host bytes, same recompute
        while cand.fits and cand.offloaded:
            back = None
            for n in sorted(cand.offloaded, key=lambda n: (m[n].bytes, _natural(n))):
                if cand.activation_bytes + m[n].bytes <= ev.budget:
                    back = n
                    break
            if back is None:
                break
            nxt = ev.get(
                CandidateKind.OFFLOAD, None, _ordered((*cand.saved, back), names),
                _ordered(set(cand.offloaded) - {back}, names),
            )
            if nxt is None:
                return
            if not (nxt.fits and _rank(nxt) < _rank(cand)):
                break
            cand = nxt


def recommend_target(
    target: str,
    budget_bytes: float,
    *,
    inputs: str | None = None,
    overrides: Mapping[str, str] | Sequence[str] = (),
    allow_offload: bool = False,
    max_evals: int = DEFAULT_MAX_EVALS,
    scope: Scope | str = Scope.AUTO,
    presets: Sequence[str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
    mesh: MeshSpec | str | None = None,
) -> Recommendation:
    """Load `file.py:fn` and its example inputs, trace once, and `recommend`. With `mesh` (a
    MeshSpec or "data=8,model=4") the budget is per device. Bad arguments fail before the target's
    code runs."""
    check_budget(budget_bytes)
    if isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < 1:
        raise UsageError(f"max evaluations must be at least 1, not {max_evals!r}", "e.g. --max-evals 64")
    spec = parse_mesh(mesh) if isinstance(mesh, str) else mesh
    on = None if spec is None else build_mesh(spec)
    with traced_target(target, inputs, overrides, on, progress) as traced:
        return recommend(
            traced, budget_bytes, allow_offload=allow_offload, max_evals=max_evals, scope=scope,
            presets=presets, progress=progress, mesh=on,
        )
