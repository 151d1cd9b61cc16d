"""Finding the allocator wall: the largest batches that ran, but only just.

Near the card's capacity the caching allocator frees its cache and retries, allocated memory
stops growing and step time kinks upwards before the first OOM. Such points would bend a line
fitted through them, so they are kept apart as the observed limit of the setting.
"""

from __future__ import annotations

import numpy as np

STALL_FRACTION = 0.25  # a per-sample memory step below a quarter of the usual one means memory stopped growing
TIME_KINK = 0.25       # a step time 25% above the line through the smaller batches is a kink
NEAR_CAPACITY = 0.95   # reserved above this share of the card is capped by it, not by the model
WALL_ZONE = 0.85       # stalls and kinks count as the wall only with this share of the card in use


def wall_batches(points: list[dict]) -> list[int]:
    """Batches at the wall among the ok records of one setting and sequence length.

    Only the top of the ladder is examined, walking down from the largest batch and stopping at
    the first healthy point, so noise in the middle of the ladder is never mistaken for a wall.
    """
    points = sorted(points, key=lambda r: r["micro_batch"])
    walls: list[int] = []
    for i in range(len(points) - 1, 1, -1):
        if not _at_wall(points[i], points[:i]):
            break
        walls.append(points[i]["micro_batch"])
    return sorted(walls)


def healthy_points(records: list[dict]) -> tuple[list[dict], tuple[tuple[int, int], ...]]:
    """The ok records below the allocator wall, and the (seq_len, batch) points found at it."""
    ok = [r for r in records if r["status"] == "ok" and r.get("peak_allocated_bytes")]
    walls = tuple(sorted((seq, batch) for seq in {r["seq_len"] for r in ok}
                         for batch in wall_batches([r for r in ok if r["seq_len"] == seq])))
    return [r for r in ok if (r["seq_len"], r["micro_batch"]) not in walls], walls


def reserved_capped(record: dict) -> bool:
    """Whether reserved memory was limited by the card rather than by what the run asked for."""
    capacity = record.get("gpu_memory_total_bytes")
    reserved = record.get("peak_reserved_bytes")
    return bool(capacity and reserved and reserved >= NEAR_CAPACITY * capacity)


def _at_wall(point: dict, below: list[dict]) -> bool:
    if point.get("device") == "cpu":  # no caching allocator there, and CPU step times are too noisy for kinks
        return False
    if (point.get("num_alloc_retries") or 0) > 0:
        return True
    return _near_capacity(point) and (_memory_stalled(point, below) or _time_kinked(point, below))


def _near_capacity(point: dict) -> bool:
    """A stall or kink far from the card's capacity is something else (e.g. launch-bound small batches)."""
    capacity = point.get("gpu_memory_total_bytes")
    used = max(point.get("peak_reserved_bytes") or 0, point.get("peak_allocated_bytes") or 0)
    return not capacity or used >= WALL_ZONE * capacity


def _memory_stalled(point: dict, below: list[dict]) -> bool:
    if not point.get("peak_allocated_bytes"):
        return False
    # one point a batch: a batch measured twice (in two files) had no width to divide the memory step by
    by_batch = {r["micro_batch"]: r["peak_allocated_bytes"] for r in below if r.get("peak_allocated_bytes")}
    by_batch[point["micro_batch"]] = point["peak_allocated_bytes"]
    if len(by_batch) < 3:
        return False
    batch = np.array(list(by_batch), float)
    memory = np.array(list(by_batch.values()), float)
    per_sample = np.diff(memory) / np.diff(batch)
    return bool(per_sample[-1] < STALL_FRACTION * np.median(per_sample[:-1]))


def _time_kinked(point: dict, below: list[dict]) -> bool:
    """Slower than the last healthy segment extrapolated: step time is convex, so the last slope is the steepest."""
    timed = [r for r in below if r.get("seconds_per_step")]
    if len(timed) < 2 or not point.get("seconds_per_step"):
        return False
    (b0, t0), (b1, t1) = ((r["micro_batch"], r["seconds_per_step"]) for r in timed[-2:])
    if b1 == b0:  # the same batch measured twice (a duplicate record): no slope to extrapolate
        return False
    expected = t1 + max(0.0, (t1 - t0) / (b1 - b0)) * (point["micro_batch"] - b1)
    return bool(point["seconds_per_step"] > (1 + TIME_KINK) * expected)
