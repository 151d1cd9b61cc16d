"""Network constants estimated from calibration records: the spread of step times and how much communication
overlaps backward."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from ftplan.core.settings import Setting
from ftplan.models.communication.links import Links
from ftplan.models.communication.traffic import (
    DEFAULT_BACKWARD_FRACTION,
    DEFAULT_OVERLAP,
    communication_seconds,
    exposed_communication_seconds,
    step_traffic,
)


def step_time_cv(records: Iterable[dict]) -> float:
    """Pooled coefficient of variation of step times: each ok record's timed steps (3 or more) as
    deviations from that record's own mean, pooled over records (one degree of freedom per record).

    Pooled rather than a median of per-record spreads: the slowest rank is a tail statistic, and the
    records whose steps vary most are the ones a median would drop. On the shipped H200 records the
    pooled figure (0.033) is over four times the median (0.007), and even it, through a normal tail,
    understates the resampled slowest of 128 steps (about 1.12 x the mean against 1.09:
    tests/test_multinode_model.py).
    """
    squares, degrees = 0.0, 0
    for record in records:
        steps = record.get("step_seconds") or []
        if record.get("status") != "ok" or len(steps) < 3:
            continue
        mean = statistics.fmean(steps)
        if mean <= 0:
            continue
        squares += sum((t / mean - 1) ** 2 for t in steps)
        degrees += len(steps) - 1
    return math.sqrt(squares / degrees) if degrees else 0.0


@dataclass(frozen=True)
class OverlapEstimate:
    overlap: float
    pairs: int
    source: str


def _pair_overlap(record: dict, base: dict, setting: Setting, links: Links, backward_fraction: float) -> float | None:
    """One pair's overlap: (all collectives - measured exposure) / (all collectives - the schedule's exposure);
    None where the schedule hides nothing, so the pair says nothing about overlap."""
    traffic = step_traffic(setting, record["params_total"], record["params_trainable"])
    compute = base["seconds_per_step"]
    total = communication_seconds(traffic, setting.gpus, setting.nodes, links)
    scheduled = exposed_communication_seconds(traffic, compute, backward_fraction * compute, setting.gpus,
                                              setting.nodes, links, overlap=1.0)
    if total - scheduled <= 0:
        return None
    exposed = record["seconds_per_step"] - compute
    return min(1.0, max(0.0, (total - exposed) / (total - scheduled)))


def estimate_overlap(records: Iterable[dict], links: Links,
                     backward_fraction: float = DEFAULT_BACKWARD_FRACTION) -> OverlapEstimate:
    """How much of the bucket schedule's overlap multi-GPU records show, against single-GPU records
    of the same setting and batch.

    For each pair the measured extra time is the exposed communication; (all collectives - measured
    exposure) / (all collectives - the schedule's exposure) is that pair's overlap. The median over
    pairs is returned; with no pairs, DEFAULT_OVERLAP (the schedule as DDP runs it).
    """
    ok = [r for r in records if r.get("status") == "ok" and r.get("seconds_per_step")]
    single = {(r["setting_key"], r["micro_batch"]): r for r in ok if r.get("gpus", 1) * r.get("nodes", 1) == 1}
    overlaps = []
    for record in ok:
        setting = Setting.from_dict(record)
        if setting.world_size == 1:
            continue
        base = single.get((setting.with_(gpus=1, nodes=1).key(), record["micro_batch"]))
        if base is None:
            continue
        overlap = _pair_overlap(record, base, setting, links, backward_fraction)
        if overlap is not None:
            overlaps.append(overlap)
    if not overlaps:
        return OverlapEstimate(DEFAULT_OVERLAP, 0, "default: DDP's bucket schedule (no multi-GPU records paired "
                                                   "with single-GPU ones)")
    return OverlapEstimate(statistics.median(overlaps), len(overlaps),
                           f"calibrated: median of {len(overlaps)} multi-GPU vs single-GPU record pairs")
