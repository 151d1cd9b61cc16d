"""Which planned batches `ftplan rehearse` verified: the emitted folder of that exact setup, batch split and
padded length ran on this card and stayed inside the memory budget, so the plan may call them "verified"."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from ftplan.core.architecture import cached_architecture
from ftplan.core.hardware import GpuSpec
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.prediction import SOURCE_VERIFIED
from ftplan.planner.dataset_plan import DatasetPlan
from ftplan.planner.emit_batching import PlannedBatch, planned_batch
from ftplan.planner.search import Plan, SetupPlan


def _rehearsed(record: dict, setting: Setting, batch: PlannedBatch, usable_bytes: int) -> bool:
    """The record is a safe rehearsal of this very folder: recipe, architecture (a config.json edited since is
    another model under the same path), split, strategy and length all alike."""
    return (record.get("status") == "ok" and Setting.from_dict(record) == setting
            and record.get("arch_hash") == cached_architecture(setting.model).hash
            and record.get("micro_batch") == batch.micro_batch
            and record.get("accumulation", 1) == batch.accumulation
            and record.get("strategy") == batch.strategy and record.get("padded_length") == batch.length
            and 0 < int(record.get("peak_reserved_bytes") or 0) <= usable_bytes)


def mark_verified(plan: Plan, rehearsals: Iterable[dict], dataset: DatasetPlan | None,
                  card_of: Callable[[dict], GpuSpec | None]) -> Plan:
    """The plan with every setup whose planned batch was rehearsed safely labelled "verified"."""
    request = plan.request
    on_card = [r for r in rehearsals if card_of(r) == request.gpu]
    if not on_card:
        return plan

    def marked(setup: SetupPlan) -> SetupPlan:
        if not setup.fits:
            return setup
        batch = planned_batch(setup, request, dataset)
        runs = [r for r in on_card if _rehearsed(r, setup.setting, batch, request.budget.usable_bytes)]
        if not runs:
            return setup
        reserved = max(int(r["peak_reserved_bytes"]) for r in runs)
        note = (f"verified: `ftplan rehearse` ran this emitted folder at micro-batch {batch.micro_batch} "
                f"({reserved / GIB:.1f} GiB reserved)")
        return replace(setup, best=replace(setup.best, source=SOURCE_VERIFIED, notes=(*setup.best.notes, note)))

    return replace(plan, ranked=[marked(s) for s in plan.ranked], too_slow=[marked(s) for s in plan.too_slow])
