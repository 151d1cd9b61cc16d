"""Which micro-batch to try next for one setting: the batch-size ladder.

Pure logic over the outcomes known so far (from this run or from records of an earlier, killed
run), so a resumed calibration continues exactly where it stopped and never repeats a trial.
Doubling from 1 finds the first OOM in log2 steps; bisecting the gap to the last batch that fit
then pins down the largest fitting batch exactly, which is the ground truth the planner needs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

OK, OOM, ERROR = "ok", "oom", "error"


@dataclass(frozen=True)
class LadderStep:
    """The next micro-batch to run, or None with the reason the ladder is finished."""

    batch: int | None
    reason: str


def largest_fitting(outcomes: Mapping[int, str]) -> int | None:
    """The largest batch that ran below the smallest OOM (memory is monotone in batch)."""
    first_oom = min((b for b, s in outcomes.items() if s == OOM), default=math.inf)
    return max((b for b, s in outcomes.items() if s == OK and b < first_oom), default=None)


def next_step(outcomes: Mapping[int, str], max_batch: int, batch_sizes: Sequence[int] | None = None) -> LadderStep:
    """Decide the next trial of a setting from its known outcomes (batch -> ok|oom|error)."""
    errors = sorted(b for b, s in outcomes.items() if s == ERROR)
    if errors:
        return LadderStep(None, f"stopped: batch {errors[0]} failed with an error (not an OOM)")
    if batch_sizes is not None:
        return _next_listed(outcomes, batch_sizes)
    return _next_on_ladder(outcomes, max_batch)


def _next_listed(outcomes: Mapping[int, str], batch_sizes: Sequence[int]) -> LadderStep:
    first_oom = min((b for b, s in outcomes.items() if s == OOM), default=math.inf)
    for batch in batch_sizes:
        if batch not in outcomes and batch < first_oom:
            return LadderStep(batch, "listed batch size")
    skipped = [b for b in batch_sizes if b not in outcomes]
    if skipped:
        return LadderStep(None, f"done: skipped {', '.join(map(str, skipped))}, larger than batch {first_oom} that ran out of memory")
    return LadderStep(None, "done: every listed batch size ran")


def _next_on_ladder(outcomes: Mapping[int, str], max_batch: int) -> LadderStep:
    fit = largest_fitting(outcomes)
    first_oom = min((b for b, s in outcomes.items() if s == OOM), default=None)
    if first_oom is None:
        if fit is None:
            return LadderStep(1, "doubling")
        if fit >= max_batch:
            return LadderStep(None, f"done: batch {fit} fits; stopped at --max-batch {max_batch}")
        return LadderStep(min(2 * fit, max_batch), "doubling")
    if fit is None:
        fit = 0
    if first_oom - fit <= 1:
        if fit == 0:
            return LadderStep(None, "done: batch 1 does not fit")
        return LadderStep(None, f"done: largest fitting batch is {fit} (batch {first_oom} ran out of memory)")
    return LadderStep((fit + first_oom) // 2, f"bisecting between {fit} and {first_oom}")


def remaining_estimate(outcomes: Mapping[int, str], max_batch: int, batch_sizes: Sequence[int] | None = None) -> int:
    """How many more trials the setting probably needs (assuming no further OOM while doubling)."""
    step = next_step(outcomes, max_batch, batch_sizes)
    if step.batch is None:
        return 0
    if batch_sizes is not None:
        return sum(1 for b in batch_sizes if b not in outcomes)
    first_oom = min((b for b, s in outcomes.items() if s == OOM), default=None)
    if first_oom is not None:
        return math.ceil(math.log2(first_oom - (largest_fitting(outcomes) or 0)))
    return 1 + max(0, math.ceil(math.log2(max_batch / step.batch)))
