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

import concurrent.futures
import dataclasses
import difflib
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from .. import registry
from .._args import check_target_arg, gpu_arg, mesh_arg
from .._progress import Progress, quiet
from .._session import Session
from ..config import DefinesLike, as_defines
from ..errors import TargetError, UsageError
from ..gpus import GpuRequest
from ..records import (
    Candidate,
    CandidateKind,
    MeshSpec,
    NameToAdd,
    PolicyResult,
    Recommendation,
    Residual,
    ResidualKind,
    Scope,
)
from ..sizes import MAX_JOBS, count_at_least_one, positive_bytes, size_arg
from ..specs import PolicySpec, names_spec, resolve_policy, spellable
from ..targets import LogCapture
from ..tpus import TpuRequest
from ..trace._naming import line_name
from ..trace._trained import ParamsLike
from ._fit import DEFAULT_MAX_COMPILES, fit_on_gpu, largest_fitting
from ._synthesis import DEFAULT_MAX_COMPILES as SYNTHESIS_MAX_COMPILES
from ._synthesis import check_max_compiles, host_link_of, name_costs
from ._synthesis import synthesize as synthesize_policy
from ._throughput import DEFAULT_MAX_COMPILES as THROUGHPUT_MAX_COMPILES
from ._throughput import THROUGHPUT, per_device_of, spread, target_evaluator, target_search, throughput_keyword

# Presets a subset of names is combined with (`save_only_these_names:...+BASE`): TE-aware where the
# model has TE GEMMs, JAX's own where it has none (the same policies there, with JAX's names).
DEFAULT_MAX_EVALS = 64


def spec_text(base: str | None, saved: Iterable[str] = (), offloaded: Iterable[str] = ()) -> str:
    """The --policy spec of a base preset with names saved (and offloaded).

    >>> spec_text("checkpoint_dots", ["ffn1", "context"])
    'save_only_these_names:ffn1,context+checkpoint_dots'
    """
    return _spec(base, tuple(saved), tuple(offloaded)).text


def _spec(base: str | None, saved: tuple[str, ...], offloaded: tuple[str, ...]) -> PolicySpec:
    if not saved and not offloaded:
        return resolve_policy(base or registry.NOTHING_SAVEABLE)  # a preset, by its name
    return names_spec(saved, offloaded, base)


def _natural(name: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


class _Evaluator:
    """Analyses candidates through the session, each once, up to `max_evals` analyses."""

    def __init__(
        self, session: Session, budget: int, max_evals: float, progress: Progress
    ) -> None:
        self.session, self.budget, self.max_evals, self.progress = session, budget, max_evals, progress
        self.done: dict[str, Candidate] = {}
        self.results: dict[str, PolicyResult] = {}

    @property
    def left(self) -> float:
        return self.max_evals - len(self.done)

    def get(self, kind: CandidateKind, base: str | None, saved: Sequence[str] = (),
            offloaded: Sequence[str] = ()) -> Candidate | None:
        """The candidate, analysed now if new; None when no analyses are left."""
        spec = _spec(base, tuple(saved), tuple(offloaded))
        if spec.text in self.done:
            return self.done[spec.text]
        if self.left <= 0:
            return None
        if not saved and not offloaded:
            kind = CandidateKind.PRESET
        try:
            result = self.session.result(spec, self.progress)
            error = None
        except TargetError as exc:
            result, error = None, exc.message
        forward = self.session.forward_flops
        text = spec.text
        preset = base if base is not None else (text if kind is CandidateKind.PRESET else None)
        entry = None if preset is None else registry.known(preset)
        te_policy = preset if entry is not None and entry.te_aware else None
        maxtext = entry.maxtext[0] if entry is not None and entry.maxtext and kind is CandidateKind.PRESET else None
        if result is None:
            cand = Candidate(text, kind, base, tuple(saved), tuple(offloaded), 0, 0, 0, forward, False, error,
                             te_policy=te_policy, maxtext_policy=maxtext)
        else:
            self.results[text] = result
            t = result.totals
            device = t.activation_bytes if t.activation_bytes_per_device is None else t.activation_bytes_per_device
            cand = Candidate(
                text, kind, base, tuple(saved), tuple(offloaded), device, t.host_bytes,
                result.recompute_flops, result.forward_flops, device <= self.budget, None,
                None if self.session.mesh is None else t.activation_bytes, te_policy=te_policy, maxtext_policy=maxtext,
            )
        self.done[text] = cand
        return cand


def _rank(c: Candidate) -> tuple[int, int, int, int, str]:
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
    knapsack solved exactly by dynamic programming over non-dominated partial subsets (at most
    `cap` of them), each a bit mask over `names`. Among equal estimates the subset whose names come
    first wins. Its cost is names x cap, whatever the analyses left."""
    states: list[tuple[int, int, int]] = [(base_bytes, base_flops, 0)]
    for i, n in enumerate(names):
        m, bit = marginal[n], 1 << i
        grown = states + [(b + m.bytes, f - m.flops, s | bit) for b, f, s in states]
        grown.sort(key=lambda t: (t[0], t[1]))
        states = []
        for b, f, group in _runs(grown):
            if not states or f < states[-1][1]:
                states.append((b, f, min(group, key=_first_names)))
        if len(states) > cap:  # thin evenly, keeping both ends
            step = len(states) / cap
            states = [states[int(i * step)] for i in range(cap - 1)] + [states[-1]]
    return [(b, f, frozenset(names[j] for j in range(len(names)) if s >> j & 1)) for b, f, s in states]


def _runs(states: list[tuple[int, int, int]]) -> Iterator[tuple[int, int, list[int]]]:
    """(bytes, flops, masks) of each run of equal estimates in sorted `states`."""
    for (b, f), run in itertools.groupby(states, key=lambda t: (t[0], t[1])):
        yield b, f, [s for _, _, s in run]


def _first_names(mask: int) -> list[int]:
    """A subset's sort key: its name positions, in order (names come in natural order)."""
    return [j for j in range(mask.bit_length()) if mask >> j & 1]


def _ordered(names: Iterable[str], order: Sequence[str]) -> tuple[str, ...]:
    chosen = set(names)
    return tuple(n for n in order if n in chosen)


def recommend(
    session: Session,
    budget_bytes: float,
    *,
    allow_offload: bool = False,
    max_evals: int = DEFAULT_MAX_EVALS,
    presets: Sequence[str] | None = None,
    progress: Progress = quiet,
    exhaustive: bool = False,
) -> Recommendation:
    """The policy with the least recompute FLOPs whose activation bytes fit `budget_bytes`, and
    the Pareto frontier of everything analysed (at most `max_evals` analyses, each exact). On a
    session placed on a mesh, the budget holds per-device bytes. With `exhaustive`, every candidate
    of the space is analysed instead (2^names per base: for checking the search on small models).

    >>> import jax, jax.numpy as jnp
    >>> from jax.ad_checkpoint import checkpoint_name
    >>> f = lambda x: jnp.sum(jnp.sin(checkpoint_name(jnp.sin(x), "a")))
    >>> r = recommend(Session.of_function(f, jax.ShapeDtypeStruct((256,), jnp.float32)), 1024)
    >>> r.recommended.policy, r.recommended.activation_bytes
    ('save_only_these_names:a', 1024)
    """
    budget = positive_bytes(budget_bytes)
    count_at_least_one(max_evals, "max_evals", 64)
    preset_list = list(registry.presets() if presets is None else presets)
    if allow_offload and presets is None:
        preset_list += registry.searched(registry.Search.OFFLOAD)
    for p in preset_list:
        resolve_policy(p)  # a bad preset fails here, before any analysis
    ev = _Evaluator(session, budget, math.inf if exhaustive else max_evals, progress)
    # JAX traces custom_vjp forward rules on the first differentiation: the names and equations in
    # them are known once one policy is analysed (without presets, the empty subset of names)
    for p in preset_list or [spec_text(None)]:
        ev.get(CandidateKind.PRESET, p)
    found = sorted(session.checkpoint_names, key=_natural)
    names = tuple(n for n in found if spellable(n))
    skipped = tuple(n for n in found if not spellable(n))
    if not names and not preset_list:
        raise UsageError(
            f"{session.target or 'the function'} has no checkpoint names and no presets are left to search",
            "tag activations with jax.ad_checkpoint.checkpoint_name, or search the presets too",
        )
    bases: list[str | None] = [None, *registry.bases(te_aware=session.has_te_gemms)]
    kind_of: dict[str | None, CandidateKind] = {None: CandidateKind.NAMES}
    if exhaustive:
        _exhaustive(ev, names, bases, allow_offload)
    elif names:
        _propose(ev, names, bases, kind_of, allow_offload)
    return _found(ev, names, skipped, allow_offload, max_evals, tuple(preset_list))


def _found(
    ev: _Evaluator, names: tuple[str, ...], skipped: tuple[str, ...], allow_offload: bool, max_evals: int,
    presets: tuple[str, ...],
) -> Recommendation:
    """The record of a search: the winner (or the closest), the frontier, and the report of every
    point shown; `presets` the named policies it searched (none under --no-presets: --synthesize
    then compiles none beside its pick)."""
    evaluated = tuple(ev.done.values())
    if not evaluated or all(c.error is not None for c in evaluated):
        first = next((c.error for c in evaluated if c.error), None)
        raise TargetError(first or "no candidate could be analysed", "$debug$")
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
    report = ev.session.report_of([ev.results[c.policy] for c in shown if c.policy in ev.results])
    return Recommendation(
        target=ev.session.target,
        budget_bytes=ev.budget,
        mesh=report.mesh,
        names=names,
        skipped_names=skipped,
        allow_offload=allow_offload,
        max_evals=max_evals,
        recommended=winner,
        closest=closest,
        frontier=frontier,
        evaluated=evaluated,
        report=report,
        presets=presets,
        to_name=() if names or skipped else names_to_add(list(ev.results.values())),
    )


def _identifier(text: str) -> str:
    word = re.sub(r"\W+", "_", text).strip("_").lower()
    return word if word and not word[0].isdigit() else f"x_{word}"


def names_to_add(results: Sequence[PolicyResult], top: int = 5) -> tuple[NameToAdd, ...]:
    """For a model with no checkpoint names: its largest activations by the line of the user's code
    that makes them (one `checkpoint_name` there names every layer it makes: a loop's blocks, a
    scan's); a value made inside an installed library's code (Hugging Face's BERT called from one
    line of the user's) by its module path with the layer indices merged (`layer/*/attention`: one
    name in that code names every layer), under the policy that keeps the most; each with the name
    to give it: the line's as `--name-lines` gives it (`gpt_52`), else the module's last part, so
    that `recommend` can choose among them."""
    kept = max(results, key=lambda r: r.totals.activation_bytes, default=None)
    if kept is None:
        return ()
    places: dict[str, list[Residual]] = {}
    for r in kept.residuals:
        if r.kind is ResidualKind.ACTIVATION and r.bytes:
            places.setdefault(_place(r), []).append(r)
    ranked = sorted(places.items(), key=lambda kv: (-sum(r.bytes for r in kv[1]), kv[0]))[:top]
    out: list[NameToAdd] = []
    taken: set[str] = set()
    for where, made in ranked:
        first = made[0]
        line = f"{first.source.file}:{first.source.line}" if first.source else None
        by_line = line == where
        library = first.frame if not by_line and first.frame is not None else None
        if by_line and first.source:
            stem = line_name(first.source.file, first.source.line)
        elif first.module:  # the module's last part, or as many parts as tell it from those named before
            parts = [p for p in where.split("/") if p and p != "*"]
            stem = next((n for k in range(1, len(parts) + 1) if (n := _identifier("_".join(parts[-k:]))) not in taken),
                        _identifier(where))
        else:
            stem = _identifier(f"{first.primitive or 'value'}_{len(out)}")
        name = stem if stem not in taken else f"{stem}_{len(out)}"
        taken.add(name)
        out.append(NameToAdd(where, f"{library.file}:{library.line}" if library else line,
                             sum(r.bytes for r in made), tuple(dict.fromkeys(r.primitive or "?" for r in made)), name))
    return tuple(out)


def _place(r: Residual) -> str:
    """Where a residual is named: the user's line that makes it; its module path, layer indices
    merged, where an installed library's code below that line makes it (its innermost frame is not
    the user's); the producer where neither is known."""
    line = f"{r.source.file}:{r.source.line}" if r.source else None
    in_library = r.frame is not None and r.frame != r.source
    if r.module and (line is None or in_library):
        return _layers_merged(r.module)
    return line or r.module or r.primitive or "?"


def _layers_merged(module: str) -> str:
    """A module path with its layer indices as `*` (a number, or an instance number of a module
    that holds others): every layer's values are one place to name; the module that makes the
    value keeps its own (Dense_0 and Dense_1 are two places).

    >>> _layers_merged("FlaxBertModule/encoder/layer/0/attention/self/query"), _layers_merged("Net/Block_3/Dense_0")
    ('FlaxBertModule/encoder/layer/*/attention/self/query', 'Net/Block_*/Dense_0')
    """
    parts = module.split("/")
    return "/".join("*" if part.isdigit() else re.sub(r"_\d+$", "_*", part) if i < len(parts) - 1 else part
                    for i, part in enumerate(parts))


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
    budget: int | float | str | None = None,
    *,
    budget_bytes: int | float | None = None,
    inputs: str | None = None,
    defines: DefinesLike = None,
    allow_offload: bool = False,
    max_evals: int = DEFAULT_MAX_EVALS,
    scope: Scope = Scope.AUTO,
    presets: Sequence[str] | None = None,
    progress: Progress = quiet,
    mesh: MeshSpec | str | None = None,
    gpu: GpuRequest | None = None,
    max_compiles: int | None = None,
    maximize: str | None = None,
    params: ParamsLike = None,
    executor: concurrent.futures.Executor | None = None,
    jobs: int = 1,
    capture: LogCapture | None = None,
    tpu: TpuRequest | None = None,
    synthesize: bool = False,
    name_lines: bool | None = None,
) -> Recommendation:
    """Load `file.py:fn` and its example inputs, trace once, and `recommend`. `budget` is a size
    as the command line takes it ("6GiB", or bytes; `budget_bytes`, bytes, says the same). With
    `mesh` (a MeshSpec or "data=8,model=4") the budget is per device. With `gpu`, the winner is the
    least-recompute point whose compiled step fits that GPU (the budget, by default its usable
    memory, bounds the residual estimates that choose what to compile); with `maximize`, also the
    largest value of that inputs keyword that fits under it, or, with `maximize="throughput"`
    (`"throughput:KEYWORD"`), the frontier's policy and `batch` (KEYWORD) whose step fits with the
    most estimated throughput (`_throughput`), its one answer; `max_compiles` 8 by default. `params`
    names the trained arguments (the first by default); `executor` and `jobs`: compile that many
    points at once in its worker processes; `capture` keeps XLA's log lines off stderr. With `tpu`
    (a TpuRequest) instead of `gpu`, the same on a TPU slice: libtpu's verdict is the fit, its
    cycle estimates the time. With `synthesize` (and `maximize="throughput"`), the policy is made,
    not chosen among presets: which checkpoint names to save, with the batch (`_synthesis`), the
    byte frontier's name sets and the presets compiled beside the pick; `max_compiles` 20 by
    default. `name_lines`: each matmul line of the user's code gets the tool's checkpoint name
    (`gpt_45`), so that the search can decide on it; None: where `synthesize` finds a model that
    names nothing. Bad arguments fail before the target's code runs."""
    check_target_arg(target)
    placement: MeshSpec | None = mesh_arg(mesh)
    gpu_arg(gpu)
    if tpu is not None and not isinstance(tpu, TpuRequest):
        raise UsageError(f"$tpu$ wants a TpuRequest, not {type(tpu).__name__}", 'tpu=TpuRequest(parse_tpu("v5e"))')
    if gpu is not None and tpu is not None:
        raise UsageError("$gpu$ and $tpu$ both name the step's target", "give one of them")
    on: GpuRequest | TpuRequest | None = gpu if gpu is not None else tpu
    if budget is not None and budget_bytes is not None:
        raise UsageError("$budget$ and $budget_bytes$ both give the budget", "give one of them")
    if budget is None and budget_bytes is None and on is None:
        raise UsageError("recommend needs $budget$, or $gpu$ or $tpu$ (its usable memory)", "e.g. $budget$='6GiB'")
    if maximize is not None and on is None:
        raise UsageError(f"$maximize$ {maximize} finds what fits a GPU or a TPU", "add $gpu$ or $tpu$")
    if budget is not None:
        limit = size_arg(budget, "budget")
    elif budget_bytes is not None:
        limit = positive_bytes(budget_bytes, "budget_bytes")
    else:
        limit = positive_bytes(gpu.usable_bytes if gpu is not None else tpu.target.model.usable_bytes)  # type: ignore[union-attr]
    count_at_least_one(max_evals, "max_evals", 64)
    count_at_least_one(jobs, "jobs", 2, MAX_JOBS)
    keyword = throughput_keyword(maximize)
    if synthesize and keyword is None:
        raise UsageError("$synthesize$ makes the policy of the fastest step that fits", "add $maximize$ throughput")
    if max_compiles is None:
        max_compiles = (DEFAULT_MAX_COMPILES if keyword is None else
                        SYNTHESIS_MAX_COMPILES if synthesize else THROUGHPUT_MAX_COMPILES)
    count_at_least_one(max_compiles, "max_compiles", 8)
    if synthesize:
        check_max_compiles(max_compiles)
    given = as_defines(defines)

    naming = bool(name_lines)

    def session_with(extra: Mapping[str, str]) -> Session:
        return Session.of_target(
            target, inputs=inputs, defines={**given, **extra}, scope=Scope(scope), mesh=placement, params=params,
            name_lines=naming, progress=progress,
        )

    session = session_with({})
    if synthesize and name_lines is None and not session.checkpoint_names:  # nothing named: the tool names lines
        progress("the model names no tensors: naming each matmul line (--name-lines)")
        naming = True
        session = session_with({})
    if maximize == THROUGHPUT and keyword not in session.keywords:  # not named: the one batch keyword it takes
        batches = [k for k in session.keywords if "batch" in k.lower()]
        keyword = batches[0] if len(batches) == 1 else keyword
    start = 0 if maximize is None or on is None else _start_of(session, keyword or maximize, keyword is not None)
    rec = recommend(
        session, limit, allow_offload=allow_offload, max_evals=max_evals, presets=presets, progress=progress,
    )
    if on is None:
        return rec
    if keyword is not None and synthesize:
        on = dataclasses.replace(on, time=True)
        return _synthesized(rec, session, lambda v: session_with({keyword: str(v)}), keyword, start, on,
                            max_compiles, progress, executor, capture, limit, allow_offload)
    if keyword is not None:  # one question, one search: no memory pick compiled beside it, one compile limit
        on = dataclasses.replace(on, time=True)  # throughput is the step's estimated time
        policies = _frontier_policies(rec, max_compiles)
        fastest = target_search(lambda v: session_with({keyword: str(v)}), session, policies, keyword, start, on,
                                max_compiles=max_compiles, progress=progress, executor=executor, jobs=jobs,
                                capture=capture)
        return dataclasses.replace(rec, throughput=fastest, compiles=len(fastest.points),  # every point a compile
                                   **session.target_info(on))  # type: ignore[arg-type]
    rec = fit_on_gpu(session, rec, on, max_compiles, progress, executor, jobs, capture)
    if maximize is None or rec.recommended is None:
        return rec
    found = largest_fitting(lambda v: session_with({maximize: str(v)}), maximize, start, rec.recommended.policy, on,
                             max_compiles, progress, capture)
    return dataclasses.replace(rec, maximized=found)


def _frontier_policies(rec: Recommendation, max_compiles: int) -> list[str]:
    """The byte frontier's policies a throughput search compiles: a quarter of its compiles' worth,
    evenly spread (the search without --synthesize, and --synthesize beside its pick)."""
    return spread([c.policy for c in rec.frontier if c.error is None], max(2, max_compiles // 4))


def _synthesized(rec: Recommendation, session: Session, build: Callable[[int], Session], keyword: str, start: int,
                 on: GpuRequest | TpuRequest, max_compiles: int, progress: Progress,
                 executor: concurrent.futures.Executor | None, capture: LogCapture | None,
                 limit: int, allow_offload: bool = False) -> Recommendation:
    """`--synthesize`: the names' costs from the audit, the solver's picks compiled on the target,
    the byte frontier's name sets (as the search without it compiles them) and the presets beside
    the pick; the winner's candidate (at the start value) for the code to paste.
    With `allow_offload` on a GPU or a v5e, a name may be offloaded too (over its host link); where
    the target's host link was not measured (other TPUs), the solver says it did not offload."""
    if not rec.names:
        to_name = "; ".join(f"at {n.line or n.where}: {n.code()}" for n in rec.to_name[:3])
        raise UsageError("$synthesize$ chooses among the model's checkpoint names, and it has none",
                         f"name the largest activations first: {to_name}" if to_name else
                         "give tensors names with jax.ad_checkpoint.checkpoint_name")
    evaluate = target_evaluator(build, session, keyword, start, on, progress=progress, executor=executor,
                                capture=capture)
    costs = name_costs(session, rec.names, progress)
    usable = on.usable_bytes if isinstance(on, GpuRequest) else on.target.model.usable_bytes
    nothing = session.result(resolve_policy(registry.NOTHING_SAVEABLE), progress)
    flops = 3 * nothing.forward_flops + nothing.recompute_flops  # the step's, saving nothing, at the start value
    link, why = host_link_of(on, allow_offload)
    seeds = [p for p in _frontier_policies(rec, max_compiles) if p not in rec.presets]  # its name sets
    found = per_device_of(synthesize_policy(evaluate, costs, start, keyword, usable, step_flops=flops,
                                            max_compiles=max_compiles, presets=rec.presets, host_link=link,
                                            not_offloaded=why, seeds=seeds), on)
    evaluated = rec.evaluated
    if found.best is not None and all(c.policy != found.best.policy for c in evaluated):
        names, _, base = found.best.policy.partition("+")  # the synthesis spells save_only_these_names:...[+PRESET]
        saved = resolve_policy(names).names
        winner = _Evaluator(session, limit, 1, progress).get(
            CandidateKind.COMBINED if base else CandidateKind.NAMES, base or None, saved)
        evaluated = evaluated if winner is None or winner.policy != found.best.policy else (*evaluated, winner)
    return dataclasses.replace(rec, throughput=found, evaluated=evaluated, compiles=len(found.points),
                               **session.target_info(on))  # type: ignore[arg-type]


def _start_of(session: Session, keyword: str, throughput: bool = False) -> int:
    """The value of the inputs keyword a search starts from: its own (before any compile)."""
    if keyword not in session.keywords:
        close = difflib.get_close_matches(keyword, list(session.keywords), n=3)
        takes = ", ".join(session.keywords) or "none"
        if throughput:
            raise UsageError(f"$maximize$ throughput searches the inputs keyword {keyword!r}, which the inputs "
                             "callable does not take", f"name the batch keyword: $maximize$ throughput:KEYWORD "
                             f"(its keywords: {takes})")
        raise UsageError(f"$maximize$ {keyword}: the inputs callable takes no keyword {keyword!r}",
                         f"did you mean {' or '.join(close)}?" if close else f"its keywords: {takes}")
    start = session.keywords.get(keyword)
    if isinstance(start, bool) or not isinstance(start, int) or start < 1:
        raise UsageError(
            f"$maximize$ {keyword}: the inputs callable's {keyword} is {start!r}, not a positive int",
            f"give it an int default, or a start with $defines$ {keyword}=N",
        )
    return start
