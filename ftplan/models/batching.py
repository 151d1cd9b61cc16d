"""Batching strategies as arithmetic over a dataset's token lengths: how long the longest micro-batch is
(memory is allocated at its padded shape), how many tokens a micro-batch holds on average (time), and how
many micro-batches an epoch has. No tokenizer, model or GPU here: lengths in, numbers out.

Strategies, named as users know them:
- pad: every sample padded to the longest one (`padding="max_length"` with max_length at that sample);
- dynamic: random order, each micro-batch padded to its own longest sample (`DataCollatorWithPadding`);
- group: Trainer's `group_by_length` (LengthGroupedSampler: random megabatches of 50 × the batch, each
  sorted by length, so a micro-batch holds samples of similar length);
- pack: samples packed whole into rows of `pack_length` tokens by best-fit decreasing (TRL's "bfd").

In random order every sample is met once an epoch, so the longest micro-batch of a run of one epoch or
more always holds the longest sample: dynamic padding and group_by_length save time, never peak memory.
Only a run shorter than one epoch may miss the tail; `worst_length` gives the longest sample it meets at
a chosen confidence (order statistics of a draw without replacement).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ftplan.core.errors import FtplanError

STRATEGIES = ("pad", "dynamic", "group", "pack")
TOO_LONG = ("truncate", "drop")
PERCENTILES = (50, 90, 95, 99)
DEFAULT_CONFIDENCE = 0.99
# Trainer's LengthGroupedSampler: megabatches of min(samples // (4 × batch), 50) batches.
MEGABATCH_CAP = 50
SIMULATION_SEED = 0
# Without a target global batch, the batch reported as "enough" is the smallest whose throughput is within
# this fraction of the best that fits: past it a larger batch buys memory pressure, not speed.
SATURATION_TOLERANCE = 0.05


@dataclass(frozen=True)
class LengthStats:
    """Token lengths of a dataset: what the plan prints before it plans."""

    count: int
    total_tokens: int
    mean: float
    max: int
    min: int
    percentiles: dict[int, float]

    @classmethod
    def of(cls, lengths: Sequence[int] | np.ndarray) -> LengthStats:
        values = _as_lengths(lengths)
        return cls(count=len(values), total_tokens=int(values.sum()), mean=float(values.mean()),
                   max=int(values.max()), min=int(values.min()),
                   percentiles={p: float(np.percentile(values, p)) for p in PERCENTILES})


@dataclass(frozen=True)
class LimitedLengths:
    """Lengths after the length limit: samples over it truncated to it or dropped (the user's choice)."""

    lengths: np.ndarray
    limit: int
    over: int           # samples longer than the limit
    too_long: str       # what was done with them
    tokens_lost: int    # tokens cut off or dropped


def apply_limit(lengths: Sequence[int] | np.ndarray, limit: int | None, too_long: str = "truncate") -> LimitedLengths:
    """Count the samples longer than `limit`, then truncate or drop them; no limit keeps every sample whole."""
    values = _as_lengths(lengths)
    if too_long not in TOO_LONG:
        raise FtplanError(f"too-long must be one of {', '.join(TOO_LONG)}, got '{too_long}'")
    if limit is None:
        return LimitedLengths(values, int(values.max()), 0, too_long, 0)
    if limit < 1:
        raise FtplanError(f"length limit must be positive, got {limit}")
    over = values > limit
    lost = int((values[over] - limit).sum()) if too_long == "truncate" else int(values[over].sum())
    kept = np.minimum(values, limit) if too_long == "truncate" else values[~over]
    if kept.size == 0:
        raise FtplanError(f"every sample is longer than {limit} tokens and --too-long drop removes them all")
    return LimitedLengths(kept, limit, int(over.sum()), too_long, lost)


def expected_max_length(lengths: Sequence[int] | np.ndarray, k: int) -> float:
    """E[longest of k samples drawn at random without replacement]: the mean padded length of a batch of k.

    With lengths sorted x_1 ≤ … ≤ x_N, P(max ≤ x_i) = C(i, k) / C(N, k) (every one of the k from the first i).
    """
    values = np.sort(_as_lengths(lengths))
    n = len(values)
    k = min(k, n)
    if k < 1:
        raise FtplanError(f"batch must be at least 1, got {k}")
    cdf = _at_most(np.arange(1, n + 1), n, k)
    return float(np.dot(values, np.diff(cdf, prepend=0.0)))


def worst_length(lengths: Sequence[int] | np.ndarray, samples_seen: int, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The longest sample a run meets, at `confidence`, when it draws `samples_seen` samples in random order.

    A run of one epoch or more meets every sample, so this is the longest one; a shorter run may miss it.
    """
    if not 0 < confidence <= 1:
        raise FtplanError(f"confidence must be in (0, 1], got {confidence}")
    values = np.sort(_as_lengths(lengths))
    n = len(values)
    if samples_seen >= n:
        return int(values[-1])
    cdf = _at_most(np.arange(1, n + 1), n, max(samples_seen, 1))
    return int(values[min(int(np.searchsorted(cdf, confidence - 1e-12)), n - 1)])


def _at_most(i: np.ndarray, n: int, k: int) -> np.ndarray:
    """C(i, k) / C(n, k) for each i in 1..n (0 where i < k): the product of (j - k) / j over j = i+1..n, its logs
    summed from the top so large datasets do not overflow. Not through scipy's log-gamma: the difference of four
    log-gammas near 10^7 was off by 1e-8 at two million samples (these sums by 2e-14), and importing
    scipy.special took longer than planning from cached lengths."""
    logs = np.log1p(-k / np.arange(k + 1, n + 1, dtype=float))
    above = np.append(np.cumsum(logs[::-1])[::-1], 0.0)  # above[m]: the log of the product over j > k + m
    out = np.zeros(len(i))
    ok = i >= k
    out[ok] = np.exp(above[i[ok] - k])
    return out


def group_padded_lengths(lengths: Sequence[int] | np.ndarray, micro_batch: int, sampler_batch: int | None = None,
                         megabatch: int | None = None, seed: int = SIMULATION_SEED) -> np.ndarray:
    """Padded length of every micro-batch of one epoch under group_by_length, simulated with a fixed seed.

    As Trainer's LengthGroupedSampler: a random permutation cut into megabatches of megabatch samples
    (default min(N // (4·sampler_batch), 50) × sampler_batch, sampler_batch = micro-batch × accumulation),
    each sorted longest first, then cut into micro-batches.
    """
    values = _as_lengths(lengths)
    n = len(values)
    sampler_batch = sampler_batch or micro_batch
    if megabatch is None:
        megabatch = max(min(n // (4 * sampler_batch), MEGABATCH_CAP), 1) * sampler_batch
    order = np.random.default_rng(seed).permutation(n)
    padded = []
    for start in range(0, n, megabatch):
        chunk = np.sort(values[order[start:start + megabatch]])[::-1]
        padded.extend(chunk[j] for j in range(0, len(chunk), micro_batch))  # first of each chunk is its longest
    return np.asarray(padded, dtype=np.int64)


def pack_rows(lengths: Sequence[int] | np.ndarray, pack_length: int) -> np.ndarray:
    """Fill (tokens) of each row when whole samples are packed into rows of pack_length by best-fit decreasing."""
    values = _as_lengths(lengths)
    return np.asarray([int(values[row].sum()) for row in pack_assignment(values, pack_length)], dtype=np.int64)


def pack_assignment(lengths: Sequence[int] | np.ndarray, pack_length: int) -> list[list[int]]:
    """The samples (indices into lengths) of each row when packed into rows of pack_length by best-fit decreasing.

    Samples must already be at most pack_length (apply_limit). Longest first, each sample goes into the
    fullest row that still holds it, else opens a row.
    """
    values = _as_lengths(lengths)
    order = np.argsort(-values, kind="stable")
    if values[order[0]] > pack_length:
        raise FtplanError(f"a sample of {values[order[0]]} tokens does not fit a packed row of {pack_length}")
    free: list[int] = []  # free space of open rows, sorted ascending
    rows: list[list[int]] = []
    rows_by_free: dict[int, list[int]] = {}
    for index in order.tolist():
        length = int(values[index])
        at = bisect.bisect_left(free, length)
        if at < len(free):
            space = free.pop(at)
            row = rows_by_free[space].pop()
        else:
            space, row = pack_length, len(rows)
            rows.append([])
        rows[row].append(index)
        left = space - length
        bisect.insort(free, left)
        rows_by_free.setdefault(left, []).append(row)
    return rows


@dataclass(frozen=True)
class Batching:
    """One strategy at one micro-batch: the shape that sets memory and the tokens that set time.

    rows: what a micro-batch holds (samples, or packed rows for pack) in one epoch. memory_length: padded
    length of the longest micro-batch the run meets, the sequence length to plan memory at. time_length:
    mean padded length of a step's slowest micro-batch (the step waits for the slowest GPU), the sequence
    length to predict step time at. real_tokens_per_row: the tokens that train, padding left out.
    """

    strategy: str
    micro_batch: int
    world_size: int
    rows: int
    memory_length: int
    time_length: float
    real_tokens_per_row: float

    @property
    def padded_tokens_per_micro_batch(self) -> float:
        return self.micro_batch * self.time_length

    @property
    def real_tokens_per_micro_batch(self) -> float:
        return self.micro_batch * self.real_tokens_per_row

    @property
    def padding_fraction(self) -> float:
        """Share of the computed tokens that are padding."""
        return max(0.0, 1 - self.real_tokens_per_row / self.time_length)


def batching(strategy: str, lengths: Sequence[int] | np.ndarray, micro_batch: int, world_size: int = 1,
             accumulation: int = 1, pack_length: int | None = None, epochs: float = 1.0,
             confidence: float = DEFAULT_CONFIDENCE, megabatch: int | None = None) -> Batching:
    """The numbers of one strategy over lengths that are already within the limit (apply_limit)."""
    if strategy not in STRATEGIES:
        raise FtplanError(f"batching must be one of {', '.join(STRATEGIES)}, got '{strategy}'")
    if micro_batch < 1 or world_size < 1 or accumulation < 1:
        raise FtplanError("micro-batch, GPUs and accumulation must be positive")
    values = _as_lengths(lengths)
    n, mean_real = len(values), float(values.mean())
    per_step = micro_batch * world_size  # samples of the GPUs' micro-batches run side by side
    seen = math.ceil(n * epochs)
    if strategy == "pad":
        longest = int(values.max())
        return Batching(strategy, micro_batch, world_size, n, longest, float(longest), mean_real)
    if strategy == "dynamic":
        return Batching(strategy, micro_batch, world_size, n, worst_length(values, seen, confidence),
                        expected_max_length(values, per_step), mean_real)
    if strategy == "group":
        padded = group_padded_lengths(values, micro_batch, micro_batch * accumulation * world_size, megabatch)
        usable = len(padded) - len(padded) % world_size
        slowest = padded[:usable].reshape(-1, world_size).max(axis=1) if usable else padded
        return Batching(strategy, micro_batch, world_size, n, worst_length(values, seen, confidence),
                        float(slowest.mean()), mean_real)
    if pack_length is None:
        raise FtplanError("packing needs a pack length (--pack-length)")
    fills = pack_rows(values, pack_length)
    return Batching(strategy, micro_batch, world_size, len(fills), pack_length, float(pack_length),
                    float(fills.mean()))


def steps_per_epoch(rows: int, micro_batch: int, accumulation: int, world_size: int) -> int:
    """Optimizer steps of one epoch: ceil(rows / (micro-batch × accumulation × GPUs))."""
    return math.ceil(rows / (micro_batch * accumulation * world_size))


def split_global_batch(global_batch: int, world_size: int, max_micro_batch: int,
                       rows_per_second: Callable[[int], float],
                       max_accumulating_micro_batch: int | None = None) -> tuple[int, int]:
    """(micro-batch, accumulation) with micro-batch × accumulation × GPUs = global_batch, the micro-batch at
    most max_micro_batch (the largest that fits) and of the highest throughput, or the largest within FASTER_BY of
    it: accumulating more for a fit's wiggle would cost the kept gradients' memory and update nothing sooner.
    A micro-batch that accumulates must also be at most max_accumulating_micro_batch (the largest that fits with
    the kept gradients; None: as max_micro_batch).
    """
    if global_batch < 1:
        raise FtplanError(f"global batch must be positive, got {global_batch}")
    if global_batch % world_size:
        raise FtplanError(f"a global batch of {global_batch} does not split evenly over {world_size} GPUs; "
                          f"use a multiple of {world_size}")
    per_gpu = global_batch // world_size
    accumulating = max_micro_batch if max_accumulating_micro_batch is None else max_accumulating_micro_batch
    options = [b for b in range(1, min(per_gpu, max_micro_batch) + 1)
               if per_gpu % b == 0 and (b == per_gpu or b <= accumulating)]
    if not options:
        raise FtplanError(f"no micro-batch fits for a global batch of {global_batch}")
    speeds = {b: rows_per_second(b) for b in options}
    top = max(speeds.values())
    best = max(b for b in options if speeds[b] >= top - FASTER_BY * abs(top))
    return best, per_gpu // best


# A smaller micro-batch replaces the largest fitting one only when it is faster by more than this share: the fits'
# small wiggles would otherwise trade memory headroom for nothing.
FASTER_BY = 0.02


def fastest_batch(max_micro_batch: int, rows_per_second: Callable[[int], float], faster_by: float = FASTER_BY) -> int:
    """The largest fitting micro-batch, unless a smaller one is clearly faster: a packed micro-batch's attention
    grows with its square (models/prior.py), and a dynamically padded one pads to its longest sample, so on a long
    tail more rows can mean more padding than work (Llama-3.2-1B on 500 source files: batch 1 ran 31% faster than 2)."""
    best = max(range(1, max_micro_batch + 1), key=lambda batch: (rows_per_second(batch), batch))
    return max_micro_batch if rows_per_second(max_micro_batch) >= (1 - faster_by) * rows_per_second(best) else best


def saturating_batch(max_micro_batch: int, rows_per_second: Callable[[int], float],
                     tolerance: float = SATURATION_TOLERANCE) -> int:
    """The smallest micro-batch (powers of two and the largest that fits) whose throughput is within
    `tolerance` of the best one: where a larger batch stops paying."""
    candidates = sorted({*(2 ** i for i in range(max_micro_batch.bit_length()) if 2 ** i <= max_micro_batch),
                         max_micro_batch})
    speeds = {b: rows_per_second(b) for b in candidates}
    top = max(speeds.values())
    return next(b for b in candidates if speeds[b] >= (1 - tolerance) * top)


def _as_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    values = np.asarray(lengths, dtype=np.int64).ravel()
    if values.size == 0:
        raise FtplanError("the dataset has no samples")
    if (values < 1).any():
        raise FtplanError("every sample must have at least one token")
    return values
