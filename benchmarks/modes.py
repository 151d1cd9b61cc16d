"""The four trust tests of ftplan's largest safe batch, each against real ladders that reached an OOM.

- "3 smallest points": fit each ladder's three smallest ok batches, plan, compare with the truth.
- "3 points + verify": the same, then the verify step of `ftplan calibrate`
  (ftplan.calibration.verify) with its trials answered from the ladder: a batch the ladder ran is
  its record; one between two ladder batches that both ran is their linear interpolation (allocated
  memory is linear in batch to 0.3% on every shipped ladder); at or above the first OOM, an OOM.
- "other GPU": the public RTX 3090 and 8×A100 ladders predicted from the H200 calibrations and
  the prior alone (nothing measured on those cards), with the catalog's capacity of the card.
- "prior only": each own ladder predicted with every record of its setting left out.
Each row: planned and true largest batch (the largest that ran below the first OOM, at the allocator
wall or not), unsafe when planned > true, and the allocated-memory errors of every ok batch of the ladder, split into inside
and beyond the evidence.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable

import numpy as np

from ftplan.calibration.verify import next_verify_batch
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import find_gpu
from ftplan.core.settings import Setting
from ftplan.models.fit import compute_rate_for, fit_setting, group_records, setting_without_seq_len
from ftplan.models.predictor import Predictor
from ftplan.models.prior import ladder_slopes
from ftplan.models.safe_batch import MemoryBudget, fit_largest_safe_batch, largest_safe_batch
from ftplan.models.wall import healthy_points

TRAIN_POINTS = 3
MIN_LADDER_POINTS = 4  # three to fit, at least one held out


def ladders(records: list[dict]) -> list[tuple[list[dict], int]]:
    """(records of one setting at one length on one GPU, its true largest batch) for ladders that reached an OOM."""
    found = []
    for group in group_records(records):
        for seq in sorted({r["seq_len"] for r in group}):
            ladder = [r for r in group if r["seq_len"] == seq]
            healthy, _ = healthy_points(ladder)
            ooms = [r["micro_batch"] for r in ladder if r["status"] == "oom"]
            if not ooms or len(healthy) < MIN_LADDER_POINTS:
                continue
            ran = [r["micro_batch"] for r in ladder if r["status"] == "ok" and r["micro_batch"] < min(ooms)]
            true = max(ran, default=0)  # a batch at the allocator wall ran: it fits
            found.append((ladder, true))
    return found


def evaluate_modes(own: list[dict], public: list[dict]) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rate_of = _rates(own + public)
        own_ladders, public_ladders = ladders(own), ladders(public)
        rows = {
            "3 smallest points": [_three_points(ladder, true, rate_of, verify=False) for ladder, true in own_ladders + public_ladders],
            "3 points + verify": [_three_points(ladder, true, rate_of, verify=True) for ladder, true in own_ladders + public_ladders],
            "other GPU": [_from_predictor(Predictor.fit(own), ladder, true, "other GPU") for ladder, true in public_ladders],
            "prior only": [_from_predictor(Predictor.fit(_without(own, ladder)), ladder, true, "prior only")
                           for ladder, true in own_ladders],
        }
    return {mode: {"summary": summarise(found), "rows": found} for mode, found in rows.items()}


def _rates(records: list[dict]) -> Callable[[list[dict]], object]:
    groups = group_records(records)
    slopes = [ladder_slopes(g) for g in groups]

    def rate(ladder: list[dict]):
        workload = {**setting_without_seq_len(ladder[0]), "alloc_conf": ""}
        others = [s for g, found in zip(groups, slopes)
                  if {**setting_without_seq_len(g[0]), "alloc_conf": ""} != workload for s in found]
        return compute_rate_for(str(ladder[0].get("gpu_name")), others)
    return rate


def _three_points(ladder: list[dict], true: int, rate_of, verify: bool) -> dict:
    healthy, _ = healthy_points(ladder)
    ok = sorted(healthy, key=lambda r: r["micro_batch"])
    seq, capacity = ok[0]["seq_len"], max(r.get("gpu_memory_total_bytes") or 0 for r in ok)
    budget, rate = MemoryBudget(capacity), rate_of(ladder)
    known = ok[:TRAIN_POINTS]
    fit = fit_setting(known, rate)
    planned = fit_largest_safe_batch(fit, seq, budget)
    trials = TRAIN_POINTS
    while verify:
        outcomes = {r["micro_batch"]: r["status"] for r in known}
        batch = next_verify_batch(outcomes, planned, lambda b: fit.peak_reserved(b, seq).mean <= budget.usable_bytes,
                                  trials - TRAIN_POINTS)
        if batch is None:
            break
        known.append(_trial(ladder, [r for r in ladder if r["status"] == "ok"], batch, true))
        trials += 1
        fit = fit_setting(known, rate)
        planned = fit_largest_safe_batch(fit, seq, budget)
    first = fit_setting(ok[:TRAIN_POINTS], rate)  # memory errors are those of the three-point fit
    largest_train = ok[TRAIN_POINTS - 1]["micro_batch"]
    points = [(r["micro_batch"] > largest_train, _pct(first.peak_allocated(r["micro_batch"], seq).mean, r["peak_allocated_bytes"]),
               _pct(first.peak_reserved(r["micro_batch"], seq).mean, r.get("peak_reserved_bytes")),
               _pct(first.seconds_per_step(r["micro_batch"], seq).mean, r.get("seconds_per_step")))
              for r in ok[TRAIN_POINTS:]]
    return _row(ladder, true, planned, points, trials=trials,
                trial_seconds=sum(r.get("trial_seconds") or 0 for r in known))


def _trial(ladder: list[dict], ok: list[dict], batch: int, true: int) -> dict:
    """The ladder's answer to a verify trial at this batch (see the module docstring)."""
    ran = {r["micro_batch"]: r for r in ladder}
    if batch in ran:
        return ran[batch]
    template = ok[0]
    if batch > true:
        return {**template, "micro_batch": batch, "status": "oom", "peak_allocated_bytes": None,
                "peak_reserved_bytes": None, "seconds_per_step": None, "trial_seconds": None}
    below = max((r for r in ok if r["micro_batch"] < batch), key=lambda r: r["micro_batch"])
    above = min((r for r in ok if r["micro_batch"] > batch), key=lambda r: r["micro_batch"])
    share = (batch - below["micro_batch"]) / (above["micro_batch"] - below["micro_batch"])
    mixed = {key: below[key] + share * (above[key] - below[key])
             for key in ("peak_allocated_bytes", "peak_reserved_bytes", "seconds_per_step", "trial_seconds")
             if below.get(key) is not None and above.get(key) is not None}
    return {**below, **mixed, "micro_batch": batch, "num_alloc_retries": 0}


def _from_predictor(predictor: Predictor, ladder: list[dict], true: int, mode: str) -> dict:
    healthy, _ = healthy_points(ladder)
    setting = Setting.from_dict(ladder[0])
    gpu = find_gpu(str(ladder[0]["gpu_name"]))
    budget = MemoryBudget(gpu.memory_bytes)  # what a user planning for this card without a calibration gets

    def predict(batch: int):
        return predictor.predict(setting, batch, gpu)

    try:
        planned = largest_safe_batch(lambda b: predict(b).peak_reserved.upper, budget,
                                     predict(1).wall_batch, measured_healthy=predict(1).measured_healthy)
    except FtplanError:
        planned = 0
    points = [(True, _pct(predict(r["micro_batch"]).peak_allocated.mean, r["peak_allocated_bytes"]),
               _pct(predict(r["micro_batch"]).peak_reserved.mean, r.get("peak_reserved_bytes")),
               _pct(predict(r["micro_batch"]).seconds_per_step.mean, r.get("seconds_per_step"))) for r in healthy]
    return _row(ladder, true, planned, points, evidence=predict(max(planned, 1)).evidence)


def _without(records: list[dict], ladder: list[dict]) -> list[dict]:
    left_out = {**setting_without_seq_len(ladder[0]), "alloc_conf": ""}
    return [r for r in records if r.get("status") not in ("ok", "oom")
            or {**setting_without_seq_len(r), "alloc_conf": ""} != left_out]


def _pct(predicted: float, measured: float | None) -> float | None:
    return None if not measured else 100.0 * (predicted - measured) / measured


def _row(ladder: list[dict], true: int, planned: int, points: list[tuple], **extra) -> dict:
    setting = Setting.from_dict(ladder[0])
    return {"setting": f"{setting.model} {setting.label()}", "gpu": ladder[0].get("gpu_name"),
            "planned": planned, "true": true, "unsafe": planned > true,
            "beyond": [p[1] for p in points if p[0] and p[1] is not None],
            "inside": [p[1] for p in points if not p[0] and p[1] is not None],
            "reserved": [p[2] for p in points if p[2] is not None],
            "time": [p[3] for p in points if p[3] is not None], **extra}


def summarise(rows: list[dict]) -> dict:
    def med_max(values: list[float]) -> tuple[float | None, float | None]:
        values = [abs(v) for v in values]
        return (statistics.median(values), max(values)) if values else (None, None)

    ratios = [r["planned"] / r["true"] for r in rows if r["true"]]
    summary = {"ladders": len(rows), "unsafe": sum(r["unsafe"] for r in rows),
               "planned_over_true_median": statistics.median(ratios) if ratios else None,
               "planned_over_true_min": min(ratios, default=None)}
    for key in ("inside", "beyond", "reserved", "time"):
        summary[f"{key}_median_pct"], summary[f"{key}_max_pct"] = med_max([v for r in rows for v in r[key]])
    trials = [r["trials"] for r in rows if "trials" in r]
    summary["trials_median"] = float(np.median(trials)) if trials else None
    return summary
