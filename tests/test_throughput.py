"""`--maximize throughput`'s search (`_throughput.search`) on synthetic steps whose peak and time
are written by the test: the best pair it returns is the best of every value on its grid, brute
forced; every point it reports was evaluated, once; the compile limit bounds it and says so. The
same search on compiled steps runs in tests/test_step_time.py (the gpu-target lane)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from te_ckpt_audit import UsageError
from te_ckpt_audit.records import Point, Throughput
from te_ckpt_audit.search._throughput import grain_of, search, spread, throughput_keyword, throughput_of

MEMORY = 1000  # bytes the synthetic GPU holds


@dataclasses.dataclass(frozen=True)
class Step:
    """A policy's synthetic step: peak = fixed + per_example x batch; seconds = overhead +
    cost x batch (+ a penalty past `knee`, where a larger batch runs slower per example)."""

    fixed: int
    per_example: int
    overhead: float
    cost: float
    knee: int | None = None

    def point(self, policy: str, value: int) -> Point:
        peak = self.fixed + self.per_example * value
        late = 0.0 if self.knee is None else 0.5 * max(0, value - self.knee) ** 2
        seconds = self.overhead + self.cost * value + late
        fits = peak <= MEMORY
        return Point(policy, value, peak, fits, seconds, throughput_of(value, seconds, 1, None))


class Evaluator:
    def __init__(self, steps: dict[str, Step]) -> None:
        self.steps, self.calls = steps, list[tuple[str, int]]()

    def __call__(self, batch: Sequence[tuple[str, int]]) -> list[Point]:
        self.calls.extend(batch)
        return [self.steps[p].point(p, v) for p, v in batch]

    def brute_best(self, start: int) -> tuple[str, int]:
        """The best fitting pair over every value the search may try: the ladder below the start,
        and multiples of the start's grain from it up."""
        grain = grain_of(start)
        values = {start >> k for k in range(start.bit_length())} | set(range(start, 64 * start, grain))
        points = [s.point(p, v) for p, s in self.steps.items() for v in sorted(values)]
        best = max((q for q in points if q.fits), key=lambda q: q.throughput or 0.0)
        return best.policy, best.value


def _run(steps: dict[str, Step], start: int = 8, **kw: int) -> tuple[Throughput, Evaluator]:
    ev = Evaluator(steps)
    found = search(ev, list(steps), start, "batch", "batch", **kw)
    return found, ev


def _checked(found: Throughput, ev: Evaluator) -> None:
    """Every point reported was evaluated, once, and is the evaluator's own."""
    assert len(ev.calls) == len(set(ev.calls)) == len(found.points)
    assert {(p.policy, p.value) for p in found.points} == set(ev.calls)
    assert all(p == ev.steps[p.policy].point(p.policy, p.value) for p in found.points)


# saving everything: no recompute (cost 1) but 40 bytes an example; recomputing: 1.33x the time, 8 bytes
SAVES = Step(fixed=200, per_example=40, overhead=0.0, cost=1.0)
RECOMPUTES = Step(fixed=200, per_example=8, overhead=0.0, cost=1.33)


def _overhead(seconds: float) -> dict[str, Step]:
    """Both policies with a fixed cost per step."""
    return {"saves": dataclasses.replace(SAVES, overhead=seconds),
            "recomputes": dataclasses.replace(RECOMPUTES, overhead=seconds)}


def test_a_policy_that_fits_a_larger_batch_wins_when_small_batches_waste_the_gpu() -> None:
    # a fixed cost per step (kernels too small to fill the GPU): the larger batch amortises it
    steps = _overhead(40.0)
    found, ev = _run(steps, max_compiles=24)  # unbounded: the brute force is the check
    _checked(found, ev)
    assert found.best is not None and (found.best.policy, found.best.value) == ev.brute_best(8) == ("recomputes", 96)
    assert not found.bounded
    saves = max((p for p in found.points if p.policy == "saves" and p.fits), key=lambda p: p.throughput or 0)
    assert saves.value == 16 and (saves.throughput or 0) < (found.best.throughput or 0)


def test_the_least_recompute_policy_wins_when_the_gpu_is_already_full() -> None:
    steps = _overhead(1.0)
    found, ev = _run(steps)
    _checked(found, ev)
    assert found.best is not None and (found.best.policy, found.best.value) == ev.brute_best(8) == ("saves", 16)


def test_throughput_is_not_assumed_to_grow_with_the_batch() -> None:
    # past batch 12 each example costs more: the best point compiled is inside the ladder, not at its edge
    steps = {"saves": dataclasses.replace(SAVES, overhead=10.0, knee=12)}
    found, ev = _run(steps, start=4)
    _checked(found, ev)
    assert [p.value for p in found.points] == [4, 8, 16, 32, 24, 20]
    assert found.best is not None and found.best.value == 16
    assert found.best.throughput == max(p.throughput or 0 for p in found.points if p.fits)
    assert found.best.value < max(p.value for p in found.points if p.fits) == 20


def test_a_start_that_does_not_fit_halves_until_one_does() -> None:
    found, ev = _run({"saves": dataclasses.replace(SAVES, overhead=10.0)}, start=64)
    _checked(found, ev)
    assert [p.value for p in found.points] == [64, 32, 16]  # 24 is off the start's grain (64)
    assert found.best is not None and (found.best.policy, found.best.value) == ev.brute_best(64) == ("saves", 16)


def test_a_per_device_batch_bisects_its_edge_in_steps_of_one() -> None:
    """A per-device batch (MaxText's) splits evenly over any mesh at any count: from a start of 4
    the edge between 4 (fits) and 8 (does not) is bisected to 6, then 7; on the start's grain (4)
    it was left at 4, a factor of two short (the first published-run search stopped there)."""
    steps = {"saves": dataclasses.replace(SAVES, overhead=10.0, per_example=110)}  # 7 fit, 8 do not
    on_grain, _ = _run(steps, start=4)
    assert [p.value for p in on_grain.points] == [4, 8] and on_grain.best is not None and on_grain.best.value == 4
    found, ev = _run(steps, start=4, grain=1)
    _checked(found, ev)
    assert [p.value for p in found.points] == [4, 8, 6, 7]
    assert found.best is not None and found.best.value == 7


def test_max_compiles_bounds_the_search_and_says_so() -> None:
    steps = {"saves": SAVES, "recomputes": RECOMPUTES}
    found, ev = _run(steps, max_compiles=3)
    _checked(found, ev)
    assert len(found.points) == 3 and found.bounded and found.max_compiles == 3
    unbounded, _ = _run(steps)
    assert not unbounded.bounded and len(unbounded.points) > 3


def test_jobs_compile_several_points_a_round_and_find_the_same_best() -> None:
    steps = _overhead(40.0)
    one, _ = _run(steps)
    four, ev = _run(steps, jobs=4)
    _checked(four, ev)
    assert four.best == one.best


def test_given_values_are_each_tried_under_every_policy() -> None:
    ev = Evaluator({"saves": SAVES, "recomputes": RECOMPUTES})
    found = search(ev, ["saves", "recomputes"], 8, "batch", "batch", values=[4, 16, 64])
    _checked(found, ev)
    assert sorted(ev.calls) == sorted((p, v) for p in ("saves", "recomputes") for v in (4, 16, 64))


def test_the_frontier_is_throughput_against_peak() -> None:
    steps = _overhead(40.0)
    found, _ = _run(steps)
    frontier = found.frontier
    assert frontier and all(p.fits for p in frontier)
    assert [p.peak_bytes for p in frontier] == sorted(p.peak_bytes or 0 for p in frontier)
    assert all((a.throughput or 0) < (b.throughput or 0) for a, b in zip(frontier, frontier[1:], strict=False))
    assert frontier[-1] == found.best
    doc = found.to_dict()
    assert doc["best"] == dataclasses.asdict(found.best) and len(doc["frontier"]) == len(frontier)


def test_bad_searches_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="no policy"):
        search(Evaluator({}), [], 8, "batch", "batch")
    with pytest.raises(UsageError, match="positive"):
        search(Evaluator({"saves": SAVES}), ["saves"], 0, "batch", "batch")


def test_helpers() -> None:
    assert throughput_keyword("throughput") == "batch" and throughput_keyword("throughput:gbs") == "gbs"
    assert throughput_keyword("batch") is None and throughput_keyword(None) is None
    assert spread(["a", "b", "c", "d", "e"], 2) == ["a", "e"] and spread(["a"], 3) == ["a"]
    assert throughput_of(8, 2.0, 4, None) == 1.0 and throughput_of(8, 2.0, 4, 800) == 100.0
    assert throughput_of(8, None, 1, None) is None


def test_a_policy_whose_throughput_stops_growing_stops_climbing_and_says_so() -> None:
    # no fixed cost: every batch runs at the same rate, so doubling gains nothing past the first rung
    roomy = dataclasses.replace(RECOMPUTES, per_example=1)
    found, ev = _run({"roomy": roomy})
    _checked(found, ev)
    assert [p.value for p in found.points] == [8, 16] and found.saturated == ("roomy",) and not found.bounded
    growing, _ = _run({"roomy": dataclasses.replace(roomy, overhead=40.0)}, max_compiles=4)
    assert growing.saturated == () and growing.bounded


def test_a_step_its_own_cost_dominates_climbs_by_fours_and_a_jump_past_the_edge_is_bisected() -> None:
    """A small model on a large chip: the step takes about the same time at every batch, so each
    doubling nearly doubles throughput and the memory edge is far. The ladder climbed by twos and
    spent its compiles before the edge; after a doubling that gained 60% it climbs by fours, and
    the edge a jump overshot is bisected as before."""
    flat = {"flat": Step(fixed=0, per_example=1, overhead=1.0, cost=0.0001)}  # fits up to MEMORY examples
    found, ev = _run(flat, start=1, max_compiles=40)
    _checked(found, ev)
    climbed = [v for _, v in ev.calls]
    assert climbed[:5] == [1, 2, 8, 32, 128]  # twice, then fours
    assert found.best is not None and MEMORY // 2 < found.best.value <= MEMORY  # the edge, bisected
    assert not found.bounded
    slow = {"slow": Step(fixed=0, per_example=1, overhead=0.0, cost=1.0)}  # no gain from the batch at all
    found, ev = _run(slow, start=1)
    assert [v for _, v in ev.calls] == [1, 2] and found.saturated == ("slow",)
