"""Plans, setups, predictions and ETAs as plain dicts: what `--json` prints and the Python API returns."""

from __future__ import annotations

import math

from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.eta import Eta
from ftplan.models.prediction import Estimate, Prediction
from ftplan.planner import advice
from ftplan.planner.gpu_counts import ScalingPlan
from ftplan.planner.search import Plan, SetupPlan


def _gib(estimate: Estimate) -> dict:
    return {"mean": estimate.mean / GIB, "upper": estimate.upper / GIB}


def prediction_to_dict(prediction: Prediction) -> dict:
    return {"micro_batch": prediction.micro_batch,
            "peak_allocated_gib": _gib(prediction.peak_allocated),
            "peak_reserved_gib": _gib(prediction.peak_reserved),
            "seconds_per_step": {"mean": prediction.seconds_per_step.mean,
                                 "upper": prediction.seconds_per_step.upper},
            "source": prediction.source, "evidence": prediction.evidence, "wall_batch": prediction.wall_batch,
            "measured_healthy": [{"batch": b, "peak_reserved_gib": peak / GIB} for b, peak in prediction.measured_healthy],
            "notes": list(prediction.notes)}


def eta_to_dict(eta: Eta) -> dict:
    return {"steps": eta.steps, "seconds_per_step": eta.seconds_per_step, "total_seconds": eta.total_seconds,
            "hours": eta.hours, "cost": eta.cost, "seconds_per_step_upper": eta.upper_seconds_per_step,
            "total_seconds_upper": eta.upper_total_seconds, "cost_upper": eta.upper_cost}


def setup_to_dict(setup: SetupPlan, failed: dict[Setting, str] | None = None,
                  largest: dict[Setting, int] | None = None) -> dict:
    """One setup as data. micro_batch is the batch it runs; largest_safe_batch the largest that fits, which
    differs where a dataset's long tail makes a smaller batch faster (largest: those batches by setting)."""
    failed = failed or {}
    return {"label": setup.label, "training": setup.training, "setting": setup.setting.to_dict(),
            "fits": setup.fits, "micro_batch": setup.batch,
            "largest_safe_batch": (largest or {}).get(setup.setting, setup.batch),
            "prediction": prediction_to_dict(setup.best or setup.at_batch_one),
            "eta": eta_to_dict(setup.eta) if setup.eta else None,
            "calibration_failed": advice.failed_like(setup.setting, failed),
            "host_gib_per_node": setup.host_bytes / GIB, "host_memory_short": setup.host_short}


def plan_to_dict(plan: Plan, failed: dict[Setting, str] | None = None,
                 largest: dict[Setting, int] | None = None) -> dict:
    """The whole plan as data: request, memory budget, every setup, the recommendation and its reasons
    (largest: each setting's largest safe batch where it runs a smaller one, as setup_to_dict takes it)."""
    request, budget = plan.request, plan.request.budget
    rec = plan.recommended
    return {
        "request": {"model": request.base.model, "seq_len": request.base.seq_len, "gpu": request.gpu.name,
                    "gpus": request.base.gpus, "nodes": request.base.nodes, "dataset_size": request.dataset_size,
                    "epochs": request.epochs, "price_per_gpu_hour": request.price_per_gpu_hour,
                    "max_hours": request.max_hours, "by": request.by, "training": request.training,
                    "host_memory_gib": request.host_memory_gib},
        "memory_budget": {"capacity_gib": budget.capacity_bytes / GIB, "safety_margin": budget.margin,
                          "context_reserve_gib": budget.context_reserve_bytes / GIB,
                          "usable_gib": budget.usable_bytes / GIB},
        "ranked": [setup_to_dict(s, failed, largest) for s in plan.ranked],
        "over_max_hours": [setup_to_dict(s, failed, largest) for s in plan.too_slow],
        "cannot_fit": [setup_to_dict(s, failed) for s in plan.unfit],
        "recommendation": setup_to_dict(rec, failed, largest) if rec else None,
        "best_by_training": [{"training": o.kind, "setup": setup_to_dict(o.setup, failed, largest),
                              "trainable_params": o.trainable_params, "trades": o.trade}
                             for o in advice.training_options(plan)],
        "reasons": advice.reasons(plan),
        "warnings": advice.warnings_for(plan),
        "notes": advice.notes_for(plan),
        "unmeasured": advice.unmeasured_notes(plan, failed or {}),
    }


def scaling_to_dict(scaling: ScalingPlan) -> dict:
    """The scaling table per training kind (NaN speed-ups as null), the chosen count and why."""
    def rows(frame) -> list[dict]:
        return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
                for row in frame.to_dict("records")]
    chosen = scaling.chosen
    return {"gpu_counts": [c.gpus for c in scaling.counts],
            "tables": {kind: rows(frame) for kind, frame in scaling.tables.items()},
            "not_fitting": {c.gpus: c.error for c in scaling.counts if c.error},
            "chosen": None if chosen is None else {"gpus": chosen.gpus, "gpus_per_node": chosen.gpus_per_node,
                                                   "nodes": chosen.nodes, "training": scaling.chosen_kind},
            "reason": scaling.reason}
