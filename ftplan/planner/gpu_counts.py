"""Plan over GPU counts: the best full and LoRA setup at each count, their scaling, and the count to use.

Each count is a whole setup search (ftplan.planner.search) at that world size, nodes filled up to
--gpus-per-node, so per-GPU memory follows ZeRO partitioning and time follows the communication
model inside models.Predictor. Speed-up is against the best setup of the same training kind on one
GPU; it can exceed the GPU count when partitioning lets a larger batch or a setup without offload
fit (ZeRO's "superlinear" case). The count itself is chosen by ftplan.models.scaling.choose_gpu_count:
least cost within --max-hours, else the first to finish.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ftplan.core.errors import DoesNotFit, FtplanError
from ftplan.core.units import GIB
from ftplan.models.eta import spoken_duration
from ftplan.models.scaling import choose_gpu_count, node_layout
from ftplan.planner.search import Plan, PlanRequest, Predictor, SetupPlan, make_plan

if TYPE_CHECKING:  # pandas loads with the first count search: a one-GPU plan never needs it
    import pandas as pd

KINDS = {"full": "full fine-tuning", "lora": "LoRA"}


@dataclass(frozen=True)
class CountPlan:
    """The setup search at one GPU count; plan is None when nothing fits there (error says why)."""

    gpus: int
    gpus_per_node: int
    nodes: int
    plan: Plan | None
    error: str | None = None
    does_not_fit: bool = False  # the error is that nothing fits (exit 3), not a bad request

    def best(self, kind: str) -> SetupPlan | None:
        """The setup the plan would recommend among this training kind."""
        if self.plan is None:
            return None
        return replace(self.plan, request=replace(self.plan.request, training=kind)).recommended


@dataclass(frozen=True)
class ScalingPlan:
    request: PlanRequest
    counts: list[CountPlan]
    tables: dict[str, pd.DataFrame]     # "full" / "lora": one row per GPU count where that kind fits
    chosen: CountPlan | None
    chosen_kind: str | None
    reason: str                          # why this count, or why none

    @property
    def plan(self) -> Plan | None:
        """The full setup ranking at the chosen count, with the user's --max-hours applied."""
        return self.chosen.plan if self.chosen else None


def plan_at(predictor: Predictor, request: PlanRequest, gpus: int, gpus_per_node: int, extra=()) -> CountPlan:
    """The setup search at `gpus` GPUs, as few nodes as possible."""
    per_node, nodes = node_layout(gpus, gpus_per_node)
    at_count = replace(request, base=request.base.with_(gpus=per_node, nodes=nodes))
    try:
        return CountPlan(gpus, per_node, nodes, make_plan(predictor, at_count, extra))
    except FtplanError as exc:
        return CountPlan(gpus, per_node, nodes, None, str(exc), isinstance(exc, DoesNotFit))


COLUMNS = ("gpus", "gpus_per_node", "nodes", "setup", "setting", "micro_batch", "reserved_gib", "reserved_upper_gib", "seconds_per_step",
           "samples_per_step", "samples_per_second", "steps", "hours", "cost", "source")


def _row(count: CountPlan, setup: SetupPlan) -> dict:
    best, eta = setup.best, setup.eta
    return {"gpus": count.gpus, "gpus_per_node": count.gpus_per_node, "nodes": count.nodes, "setup": setup.label, "setting": setup.setting.to_dict(),
            "micro_batch": setup.batch,
            "reserved_gib": best.peak_reserved.mean / GIB, "reserved_upper_gib": best.peak_reserved.upper / GIB,
            "seconds_per_step": eta.seconds_per_step, "samples_per_step": setup.batch * count.gpus,
            "samples_per_second": setup.batch * count.gpus / eta.seconds_per_step, "steps": eta.steps,
            "hours": eta.hours, "cost": eta.cost, "source": best.evidence}


def scaling_rows(counts: list[CountPlan], kind: str) -> pd.DataFrame:
    """One row per count where `kind` fits; speed-up and efficiency against its best one-GPU setup
    (NaN when that kind does not fit on one GPU)."""
    import pandas as pd

    table = pd.DataFrame([_row(c, best) for c in counts if (best := c.best(kind)) is not None], columns=COLUMNS)
    one = table.loc[table["gpus"] == 1]
    base = one["samples_per_second"].iloc[0] if not one.empty else math.nan
    table = table.assign(speedup=table["samples_per_second"] / base,
                         efficiency=table["samples_per_second"] / base / table["gpus"])
    baseline = one.iloc[0] if not one.empty else None
    return table.assign(above_ideal=[_above_ideal(row, baseline) for row in table.to_dict("records")])


# Said next to every scaling table until a multi-GPU calibration of our own checks the time model.
UNCHECKED = ("Multi-GPU step times are modelled (ring or tree all-reduce per bucket behind backward, the slowest "
             "rank, per-step overheads that do not shrink) and have not been checked against a multi-GPU "
             "measurement of our own; benchmarks/scaling_accuracy.py compares the model with published "
             "multi-node runs and overestimates most of their speed-ups (README, Several GPUs and nodes).")


def _above_ideal(row: dict, baseline: dict | None) -> str:
    """Why a count scales better than linearly (efficiency above 100%), or '': more GPUs can only
    help a step by letting a different setup or a larger batch fit, or by partitioning the optimizer."""
    if baseline is None or not row["efficiency"] > 1 + 1e-9:
        return ""
    setting, one = row["setting"], baseline["setting"]
    if one["offload_optimizer"] and not setting["offload_optimizer"]:
        return (f"CPU offload is no longer needed at {row['gpus']} GPUs: ZeRO partitions the optimizer states, so "
                "they fit on the GPUs and each step skips the PCIe transfers and the CPU Adam step")
    if row["micro_batch"] > baseline["micro_batch"]:
        return (f"batch {row['micro_batch']} per GPU fits at {row['gpus']} GPUs against {baseline['micro_batch']} on one: "
                "partitioned states leave room, and larger batches use the GPU better")
    if row["setup"] != baseline["setup"]:
        return f"a faster setup fits at {row['gpus']} GPUs ({row['setup']} against {baseline['setup']} on one)"
    return f"ZeRO splits the optimizer step over {row['gpus']} GPUs, so each rank's share of it shrinks"


def plan_gpu_counts(predictor: Predictor, request: PlanRequest, gpu_counts: list[int], gpus_per_node: int,
                    extra=(), progress: Callable[[str], None] | None = None) -> ScalingPlan:
    """Search every count (one GPU always, as the speed-up's baseline) and choose the count to use.

    Without a price, cost is counted in GPU-hours, so --max-hours still picks the least wasteful count.
    progress hears of each count as its search starts: a search takes about a second, and 32 of them
    in silence look like a hang.
    """
    import pandas as pd

    open_ended = replace(request, max_hours=None)  # the deadline is choose_gpu_count's to apply
    searched = sorted({1, *gpu_counts})
    counts = []
    for index, n in enumerate(searched, 1):
        if progress is not None:
            progress(f"planning at {n} GPU{'s' if n > 1 else ''} ({index} of {len(searched)} counts)")
        counts.append(plan_at(predictor, open_ended, n, gpus_per_node, extra))
    tables = {kind: scaling_rows(counts, kind) for kind in KINDS}
    asked = [c for c in counts if c.gpus in gpu_counts]
    kinds = list(KINDS) if request.training == "any" else [request.training]
    pool = pd.concat([tables[k][tables[k]["gpus"].isin(gpu_counts)].assign(kind=k) for k in kinds],
                     ignore_index=True)
    if pool.empty:
        last = asked[-1]
        if last.error and not last.does_not_fit:
            raise FtplanError(last.error)
        raise DoesNotFit(last.error or f"no setup of {request.base.model} fits on {request.gpu.name}")
    price = request.price_per_gpu_hour if request.price_per_gpu_hour is not None else 1.0
    try:
        row = choose_gpu_count(pool, request.dataset_size, request.epochs, price, request.max_hours, request.by)
    except FtplanError as exc:
        return ScalingPlan(request, counts, tables, None, None, str(exc))
    chosen = next(c for c in counts if c.gpus == row["gpus"])
    kind = row["kind"]
    final = plan_at(predictor, replace(request, training=kind), chosen.gpus, gpus_per_node, extra)
    unit = "cost" if request.price_per_gpu_hour is not None else "GPU-hours"
    if request.max_hours is None and request.by == "cost":
        reason = (f"it costs least ({row['cost']:,.2f}, {spoken_duration(row['hours'] * 3600)}) among "
                  f"{', '.join(map(str, gpu_counts))} GPUs")
    elif request.max_hours is None:
        reason = (f"it finishes first ({spoken_duration(row['hours'] * 3600)}) among {', '.join(map(str, gpu_counts))} GPUs"
                  + (f", then at the least {unit}" if len(pool[pool['hours'] == row['hours']]) > 1 else ""))
    else:
        reason = (f"it meets --max-hours {request.max_hours:g} ({spoken_duration(row['hours'] * 3600)}) at the least {unit} "
                  f"({row['cost']:,.2f})")
    return ScalingPlan(request, counts, tables, final, kind, reason)
