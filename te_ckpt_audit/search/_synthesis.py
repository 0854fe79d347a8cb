"""`recommend --maximize throughput --synthesize`: the policy made for the step, not chosen among
presets: which of the model's checkpoint names to save, with the batch, for the most estimated
throughput whose step the target takes.

The decision per name is save (on the device) or recompute; one decision per name holds for every
layer of a scanned stack (a `scan` repeats one body), so a stack of any depth costs the same
search. The solver, per batch value on the ladder (the start, doubled while saving nothing still
fits; halved first where the start does not):

0. the ladder climbs by doubling while saving nothing fits and doubling gains 2% or more (it
   stops at the compile limit, the presets' compiles kept for the end);
1. two compiles measure the ends: nothing saved (`nothing_saveable`) and every name saved, each
   the target's own verdict, peak and estimated step time (`--time`'s estimate);
2. an additive model spreads the difference over the names: a name's memory is its residual bytes
   (JAX's own, from the audit, scaled by the batch) times the ends' ratio of compiled peak to
   residual bytes; its time saved is its recompute (the audit's FLOPs) at the step's own FLOP rate
   (the first end's seconds over its FLOPs: three forward passes and its recompute) less its bytes
   written and read back at one price per byte, the price that makes the names' sum the ends'
   measured difference (`name_seconds`). A name can cost time (a large tensor cheap to recompute,
   attention scores): it is never chosen for speed. Where every name does not fit (the target
   gives it no time), no price per byte is known and recompute alone is priced;
3. the subset that saves the most time within the memory left (the target's usable bytes less the
   first end's peak) is found exactly, by a dynamic programme over the Pareto frontier of
   (bytes, seconds) subsets: optimal under the model, every subset considered;
4. the pick is compiled; where the target refuses it (memory is not additive: XLA fuses,
   schedules and rematerializes on its own), the memory allowed shrinks by the overshoot and the
   programme runs again, at most twice per value.

Then the presets are compiled at the pick's value, marked beside it; where one of them beats
saving nothing, the solver runs once more with it as the base (the ends: the preset alone, every
name on top of it), so that the names it saves add to what the preset saves: the pick is at least
the best preset compiled. Every point reported was compiled and timed; the model only chooses what
to compile, at most `max_compiles` in all.
Offloading to host memory is not among the decisions yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._progress import Progress, quiet
from .._session import Session
from ..errors import UsageError
from ..gpus import GpuRequest
from ..records import Point, Proposal, SynthesisName, Synthesized, Throughput
from ..registry import NOTHING_SAVEABLE
from ..specs import names_spec, resolve_policy
from ..tpus import TpuRequest
from ._throughput import SATURATED, Evaluate, doubling_gain, ladder_step

DEFAULT_MAX_COMPILES = 20  # per value two ends and a pick (and its corrections); the presets; one more round
FIRST_COMPILES = 2  # the first batch's two ends, nothing saved and every name saved, before any pick
CORRECTIONS = 2  # re-solves per value after a refused pick
SOLVER = ("exact 0/1 knapsack over the names (Pareto-frontier dynamic programme) on an additive model of "
          "per-name bytes and seconds, fitted per batch on two compiles (nothing saved, every name saved); "
          "each pick compiled, a refused one re-solved with less memory; then once more on the best preset")


def host_link_of(on: GpuRequest | TpuRequest, allow_offload: bool) -> tuple[float, str | None]:
    """What `--allow-offload` gives the solver on this target: the host link's bytes per second each
    direction (0: no offload), and where it was asked and cannot be given, why (said in its line)."""
    if not allow_offload:
        return 0.0, None
    model = on.target.model if isinstance(on, TpuRequest) else on.model
    return (model.host_link, None) if model.host_link else (0.0, f"the host link of {model.name} is not known")


def check_max_compiles(max_compiles: int) -> None:
    """`--synthesize` compiles the first batch's two ends before it can pick anything: a limit
    below that is a usage error, not a search that compiles nothing and says nothing fits."""
    if max_compiles < FIRST_COMPILES:
        raise UsageError(f"$synthesize$ compiles {FIRST_COMPILES} steps (nothing saved, every name saved) before "
                         f"its first pick: $max_compiles$ {max_compiles} is too few",
                         f"give $max_compiles$ {FIRST_COMPILES} or more, or leave it out")


def name_costs(session: Session, names: Sequence[str], progress: Progress = quiet) -> tuple[SynthesisName, ...]:
    """Each name's bytes and recompute saving, from the audit (JAX's own linearization), and the
    line it names where the tool gave it."""
    nothing = session.result(resolve_policy(NOTHING_SAVEABLE), progress)
    lines = session.line_names
    out = []
    for name in names:
        alone = session.result(names_spec((name,)), progress)
        kept = alone.totals.gated_bytes - nothing.totals.gated_bytes  # per device on a mesh
        out.append(SynthesisName(name, max(kept, 0), max(nothing.recompute_flops - alone.recompute_flops, 0),
                                 lines.get(name)))
    return tuple(out)


def best_subset(items: Sequence[tuple[str, float, float]], room: float) -> tuple[tuple[str, ...], float, float]:
    """The names whose seconds saved sum highest with bytes summing within `room`: exact, over
    the Pareto frontier of (bytes, seconds) of every subset. Items are (name, bytes, seconds);
    a name that saves no time is never chosen.

    >>> best_subset([("a", 3, 1.0), ("b", 2, 0.8), ("c", 2, 0.7)], 4)
    (('b', 'c'), 4.0, 1.5)
    """
    chosen, bytes_, seconds = best_choice([(name, ((size, sec, DEVICE),)) for name, size, sec in items], room)
    return tuple(sorted(chosen)), bytes_, seconds


DEVICE, OFFLOAD = "device", "offload"  # a name's choices beside recomputing it


def best_choice(items: Sequence[tuple[str, Sequence[tuple[float, float, str]]]],
                room: float) -> tuple[dict[str, str], float, float]:
    """For each name one of its options (bytes on the device, seconds saved, choice), or none of
    them (recomputed), so that the seconds saved sum highest with the bytes summing within `room`:
    exact, over the Pareto frontier of (bytes, seconds) of every assignment (a multiple-choice
    knapsack). An option that saves no time is never chosen.

    >>> best_choice([("a", ((3, 1.0, "device"), (0, 0.6, "offload"))), ("b", ((2, 0.8, "device"),))], 2)
    ({'a': 'offload', 'b': 'device'}, 2.0, 1.4)
    """
    frontier: list[tuple[float, float, tuple[tuple[str, str], ...]]] = [(0.0, 0.0, ())]
    for name, options in items:
        grown = list(frontier)
        for size, seconds, choice in options:
            if seconds > 0:
                grown += [(b + size, s + seconds, (*picked, (name, choice))) for b, s, picked in frontier
                          if b + size <= room]
        frontier = []
        for entry in sorted(grown, key=lambda x: (x[0], -x[1])):  # keep one only if it saves more than any smaller
            if not frontier or entry[1] > frontier[-1][1]:
                frontier.append(entry)
    bytes_, seconds, picked = max(frontier, key=lambda x: (x[1], -x[0]))
    return dict(picked), bytes_, seconds


def synthesize(
    evaluate: Evaluate, costs: Sequence[SynthesisName], start: int, keyword: str, usable: int, *,
    step_flops: int = 0, max_compiles: int = DEFAULT_MAX_COMPILES, presets: Sequence[str] = (),
    device: str = "GPU", estimator: str = "XLA's cost models", unit: str | None = None, on_presets: bool = True,
    host_link: float = 0.0, not_offloaded: str | None = None, seeds: Sequence[str] = (),
) -> Throughput:
    """The fastest (subset of names, value) whose step the target takes, by the solver above; then,
    while compiles are left, the `presets` at the pick's value, marked beside it. `unit`: what the
    throughput counts (the keyword's own by default); `on_presets=False`: no names on top of a
    preset (MaxText's custom policy cannot add names to one of its presets); `host_link` (bytes/s
    each direction, a GPU's PCIe): each name may be offloaded to host memory too (`--allow-offload`);
    `not_offloaded`: why it was asked for and not given (`host_link_of`), said in the solver's line;
    `seeds`: other policies compiled at the pick's value before the presets (the byte frontier's
    name sets that the search without --synthesize compiles), so that the answer is never below theirs
    where the additive model misjudges a set."""
    names = sorted((c for c in costs if c.name), key=lambda c: c.name)
    if not names:
        raise UsageError("--synthesize chooses among the model's checkpoint names, and it has none",
                         "give tensors names with jax.ad_checkpoint.checkpoint_name (recommend lists where)")
    every = names_spec(tuple(c.name for c in names)).text  # the names sorted: best_subset spells alike
    reserve = min(len(seeds) + len(presets), max_compiles // 3)  # the seeds and presets beside the pick
    points: dict[tuple[str, int], Point] = {}
    proposals: list[Proposal] = []

    def compiled(wanted: Sequence[tuple[str, int]], limit: int = max_compiles - reserve) -> list[Point] | None:
        todo = [w for w in dict.fromkeys(wanted) if w not in points]
        if len(points) + len(todo) > limit:
            return None
        if todo:
            for w, p in zip(todo, evaluate(todo), strict=True):
                points[w] = p
        return [points[w] for w in wanted]

    def pick(value: int, low: Point, high: Point, base: str | None) -> bool:
        """The solver's pick at `value` over the ends `low` (the base alone) and `high` (every name
        on it), compiled, re-solved where refused; False where the compile limit stopped it."""
        every_here = names_spec(tuple(c.name for c in names), base=base).text
        proposal = _solve(low, high, names, value / start, usable, base, step_flops=step_flops, host_link=host_link)
        for _ in range(CORRECTIONS + 1):
            spec, extra, saved = proposal
            if spec in (low.policy, every_here):
                point = points[(spec, value)]
            else:
                found = compiled([(spec, value)], max_compiles if base is not None else max_compiles - reserve)
                if found is None:
                    return False
                point = found[0]
            proposals.append(Proposal(value, spec, int(extra), (low.seconds or 0.0) - saved, point.fits))
            if point.fits or spec == low.policy:
                return True
            over = (point.peak_bytes or usable) - usable
            proposal = _solve(low, high, names, value / start, usable, base, shrink=max(over, int(extra * 0.25)),
                              cap=extra, step_flops=step_flops, host_link=host_link)
        return True

    bounded = False
    value, tried_down = start, False
    below: Point | None = None  # the best fitting point of the rung below: the ladder stops where doubling gains < 2%
    while True:
        ends = compiled([(NOTHING_SAVEABLE, value), (every, value)])
        if ends is None:
            bounded = True
            break
        low, high = ends
        if not low.fits:
            if value == start and not tried_down and value > 1:
                value, tried_down = value // 2, True  # the start does not fit: one step down
                continue
            if below is not None and value == 4 * below.value:  # a jump past the edge: the rung it skipped
                value, tried_down = 2 * below.value, True
                continue
            break
        if value < start:  # found a fitting value below the start: that is the ladder's top
            tried_down = True
        if not pick(value, low, high, None):
            bounded = True
        here = _fastest(p for (_, v), p in points.items() if v == value)
        gain = doubling_gain(below, here)
        if bounded or tried_down or (gain is not None and gain < SATURATED):
            break
        below = here
        value *= ladder_step(gain)
    made = _fastest(points.values())
    if made is not None:
        for preset in (*seeds, *presets):  # at the pick's value: what the synthesis is measured against
            if compiled([(preset, made.value)], max_compiles) is None:
                bounded = True
                break
    plain = {v: (p.seconds, p.peak_bytes) for (q, v), p in points.items() if q == NOTHING_SAVEABLE}
    best_preset = _fastest(p for p in points.values() if p.policy in presets and p.policy != NOTHING_SAVEABLE
                           and (p.seconds, p.peak_bytes) != plain.get(p.value))  # not one that saves nothing here
    if made is not None and best_preset is not None and not bounded and on_presets:  # names on the best preset
        on_top = names_spec(tuple(c.name for c in names), base=best_preset.policy).text
        ends = compiled([(on_top, best_preset.value)], max_compiles)
        if ends is None or not pick(best_preset.value, best_preset, ends[0], best_preset.policy):
            bounded = True
    best = _fastest(points.values(), presets)  # a preset may still be the fastest (or tie): then it is the answer
    searched = tuple(dict.fromkeys([NOTHING_SAVEABLE, *(p.policy for p in points.values())]))
    solver = SOLVER if not host_link else (
        f"{SOLVER}; each name saved on the device, offloaded to host memory (its copies out and back over the "
        f"host link, {host_link / 1e9:g} GB/s each direction, counted in full) or recomputed: a multiple-choice "
        "knapsack")
    if not_offloaded:
        solver = f"{solver}; nothing offloaded: {not_offloaded}"
    synthesis = Synthesized(tuple(names), tuple(proposals), solver, tuple(presets))
    return Throughput(keyword, unit or keyword, best, tuple(points.values()), searched, max_compiles, bounded, (),
                      device, estimator, synthesis)


def _fastest(points: Iterable[Point], presets: Sequence[str] = ()) -> Point | None:
    """The fitting point of most throughput, the smaller value on a tie, then one of `presets`
    (the same step under a preset's name is the simpler answer)."""
    fitting = [p for p in points if p.fits and p.throughput is not None]
    return max(fitting, key=lambda p: (p.throughput or 0.0, -p.value, p.policy in presets), default=None)


def _solve(low: Point, high: Point, names: Sequence[SynthesisName], scale: float, usable: int, base: str | None,
           shrink: float = 0.0, cap: float | None = None, step_flops: int = 0,
           host_link: float = 0.0) -> tuple[str, float, float]:
    """The pick at one value over a base (None: nothing saved): (spec, predicted extra bytes over the
    base alone, predicted seconds saved). With `host_link` (bytes/s each direction) and no base, a
    name may also be offloaded: no bytes on the device, its seconds less its copy to host memory and
    back over the link, counted in full (the compile's estimate then says what the schedule hides)."""
    total_bytes = sum(n.bytes for n in names) * scale
    measured = (high.peak_bytes or 0) - (low.peak_bytes or 0) if high.peak_bytes and low.peak_bytes else total_bytes
    ratio = max(measured, 0) / total_bytes if total_bytes > 0 else 1.0
    offload = host_link > 0 and base is None
    items = [(n.name, ((n.bytes * scale * ratio, seconds, DEVICE),
                       *(((0.0, seconds - 2 * n.bytes * scale / host_link, OFFLOAD),) if offload else ())))
             for n, seconds in zip(names, name_seconds(low, high, names, scale, step_flops), strict=True)]
    room = float("inf") if high.fits and cap is None else usable - (low.peak_bytes or 0)
    if cap is not None:
        room = min(room, cap) - shrink
    chosen, extra, saved = best_choice(items, max(room, 0.0))
    if not chosen:
        return low.policy, 0.0, 0.0
    kept = sorted(n for n, c in chosen.items() if c == DEVICE)
    moved = sorted(n for n, c in chosen.items() if c == OFFLOAD)
    return names_spec(kept, moved, base=base).text, extra, saved


def name_seconds(low: Point, high: Point, names: Sequence[SynthesisName], scale: float,
                 step_flops: int = 0) -> list[float]:
    """What saving each name takes off the step, fitted to the ends `low` (the base alone) and
    `high` (every name on it). With the step's FLOPs known: a name saves its recompute at the step's
    own FLOP rate (the low end's seconds over its FLOPs) and costs its bytes written and read back
    at one price per byte, the price that makes the names' sum the ends' measured difference (none
    where saving everything is faster than the FLOP rate alone says, or where every name saved does
    not fit and has no time): a large tensor cheap to recompute (attention scores) costs time, a
    projection's output saves it. Without the FLOPs, the ends' difference spread by recompute FLOPs.

    >>> low, high = Point("nothing", 1, 10, True, 1.0, 1.0), Point("every", 1, 20, True, 0.9, 1.1)
    >>> names = [SynthesisName("proj", 10, 300), SynthesisName("scores", 100, 100)]
    >>> [round(s, 3) for s in name_seconds(low, high, names, 1.0, step_flops=1000)]
    [0.273, -0.173]
    """
    flops = [n.recompute_flops * scale for n in names]
    total_flops = sum(flops)
    if not low.seconds or not total_flops:
        return [0.0 for _ in names]
    if not step_flops:  # the old rule: the ends' difference, by recompute FLOPs
        gained = low.seconds - high.seconds if high.seconds else 0.0
        return [gained * f / total_flops for f in flops]
    rate = low.seconds / (step_flops * scale)  # seconds per FLOP, the step's own
    traffic = [2 * n.bytes * scale for n in names]  # written in the forward pass, read in the backward
    per_byte = 0.0
    if high.seconds and sum(traffic):
        per_byte = max(0.0, (rate * total_flops - (low.seconds - high.seconds)) / sum(traffic))
    return [rate * f - per_byte * t for f, t in zip(flops, traffic, strict=True)]
