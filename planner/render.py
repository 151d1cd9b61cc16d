"""Printing at the edge: rich tables for people, plain dicts for --json. No decisions are made here."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from models.hardware import GIB, GpuSpec
from models.prediction import Estimate, Prediction
from planner import advice
from planner.eta import Eta, format_duration
from models.safe_batch import MemoryBudget
from planner.search import Plan, SetupPlan

SOURCE_STYLE = {"calibrated": "green", "extrapolated": "yellow", "prior": "red"}


def _gib(estimate: Estimate) -> dict:
    return {"mean": estimate.mean / GIB, "upper": estimate.upper / GIB}


def prediction_to_dict(prediction: Prediction) -> dict:
    return {"micro_batch": prediction.micro_batch,
            "peak_allocated_gib": _gib(prediction.peak_allocated),
            "peak_reserved_gib": _gib(prediction.peak_reserved),
            "seconds_per_step": {"mean": prediction.seconds_per_step.mean,
                                 "upper": prediction.seconds_per_step.upper},
            "source": prediction.source, "wall_batch": prediction.wall_batch, "notes": list(prediction.notes)}


def eta_to_dict(eta: Eta) -> dict:
    return {"steps": eta.steps, "seconds_per_step": eta.seconds_per_step, "total_seconds": eta.total_seconds,
            "hours": eta.hours, "cost": eta.cost}


def setup_to_dict(setup: SetupPlan) -> dict:
    return {"label": setup.label, "training": setup.training, "setting": setup.setting.to_dict(),
            "fits": setup.fits, "largest_safe_batch": setup.batch,
            "prediction": prediction_to_dict(setup.best or setup.at_batch_one),
            "eta": eta_to_dict(setup.eta) if setup.eta else None}


def plan_to_dict(plan: Plan) -> dict:
    """The whole plan as data: request, memory budget, every setup, the recommendation and its reasons."""
    request, budget = plan.request, plan.request.budget
    rec = plan.recommended
    return {
        "request": {"model": request.base.model, "seq_len": request.base.seq_len, "gpu": request.gpu.name,
                    "gpus": request.base.gpus, "nodes": request.base.nodes, "dataset_size": request.dataset_size,
                    "epochs": request.epochs, "price_per_gpu_hour": request.price_per_gpu_hour,
                    "max_hours": request.max_hours, "by": request.by, "training": request.training},
        "memory_budget": {"capacity_gib": budget.capacity_bytes / GIB, "safety_margin": budget.safety_margin,
                          "context_reserve_gib": budget.context_reserve_bytes / GIB,
                          "usable_gib": budget.usable_bytes / GIB},
        "ranked": [setup_to_dict(s) for s in plan.ranked],
        "over_max_hours": [setup_to_dict(s) for s in plan.too_slow],
        "cannot_fit": [setup_to_dict(s) for s in plan.unfit],
        "recommendation": setup_to_dict(rec) if rec else None,
        "reasons": advice.reasons(plan),
        "warnings": advice.warnings_for(plan),
    }


def _cost(eta: Eta) -> str:
    return "-" if eta.cost is None else f"{eta.cost:,.2f}"


def plan_table(plan: Plan) -> Table:
    usable = plan.request.budget.usable_bytes / GIB
    title = (f"{plan.request.base.model}, {plan.request.dataset_size:,} samples × {plan.request.epochs:g} epochs, "
             f"seq {plan.request.base.seq_len}, {plan.request.base.world_size} × {plan.request.gpu.name}")
    table = Table("#", "setup", "batch/GPU", f"reserved GiB (upper) / {usable:.1f}", "s/step", "steps",
                  "ETA h:mm", "cost", "source", title=title)
    rec = plan.recommended
    for rank, setup in enumerate(plan.ranked, start=1):
        best, eta = setup.best, setup.eta
        table.add_row(str(rank), setup.label, str(setup.batch),
                      f"{best.peak_reserved.mean / GIB:.1f} ({best.peak_reserved.upper / GIB:.1f})",
                      f"{eta.seconds_per_step:.2f}", f"{eta.steps:,}", format_duration(eta.total_seconds),
                      _cost(eta), f"[{SOURCE_STYLE.get(best.source, '')}]{best.source}[/]",
                      style="bold" if setup is rec else None)
    return table


def print_plan(plan: Plan, console: Console) -> None:
    budget = plan.request.budget
    console.print(plan_table(plan))
    console.print(f"Memory: {budget.describe()}; a batch is safe when the upper bound of predicted peak "
                  "reserved memory stays within it and below any batch seen at the allocator wall or OOM.")
    if plan.request.price_per_gpu_hour is not None:
        console.print(f"Cost = hours × {plan.request.price_per_gpu_hour:g} per GPU-hour × "
                      f"{plan.request.base.world_size} GPU(s).")
    if plan.too_slow:
        console.print(f"Over --max-hours {plan.request.max_hours:g}: " + "; ".join(
            f"{s.label} ({format_duration(s.eta.total_seconds)})" for s in plan.too_slow))
    if plan.unfit:
        console.print("Cannot fit even at batch 1: " + "; ".join(
            f"{s.label} (needs {s.at_batch_one.peak_reserved.upper / GIB:.1f} GiB)" for s in plan.unfit))
    rec = plan.recommended
    if rec is not None:
        console.print(f"\n[bold]Recommendation: {rec.label}, batch {rec.batch} per GPU, "
                      f"ETA {format_duration(rec.eta.total_seconds)}[/]")
        for reason in advice.reasons(plan):
            console.print(f"  • {reason}")
    for warning in advice.warnings_for(plan):
        console.print(f"[yellow]warning:[/] {warning}")


def eta_lines(prediction: Prediction, eta: Eta, fits: bool, budget: MemoryBudget) -> list[str]:
    reserved = prediction.peak_reserved
    verdict = "fits safely" if fits else "NOT safe (upper bound above the usable memory)"
    if prediction.wall_batch is not None and prediction.micro_batch >= prediction.wall_batch:
        verdict = f"NOT safe (batch {prediction.wall_batch} was seen at the allocator wall or OOM)"
    lines = [f"steps: {eta.steps:,}",
             f"seconds per step: {eta.seconds_per_step:.2f} (upper {prediction.seconds_per_step.upper:.2f})",
             f"total time: {format_duration(eta.total_seconds)} ({eta.hours:.2f} h)",
             f"cost: {_cost(eta)}" + (" (price per GPU-hour × GPUs)" if eta.cost is not None else ""),
             f"memory: {verdict}: peak reserved {reserved.mean / GIB:.1f} GiB (upper {reserved.upper / GIB:.1f}) "
             f"vs {budget.describe()}",
             f"source: {prediction.source}"]
    return lines + [f"note: {note}" for note in prediction.notes]


def gpu_table(catalog: dict[str, GpuSpec]) -> Table:
    table = Table("name", "memory GiB", "bf16 dense TFLOP/s", "bandwidth GB/s", "GPU-GPU GB/s", "interconnect",
                  "source")
    for spec in catalog.values():
        table.add_row(spec.name, f"{spec.memory_gib:g}", f"{spec.bf16_dense_tflops:g}",
                      f"{spec.memory_bandwidth_gbs:g}", f"{spec.intra_node_gbs:g}", spec.interconnect, spec.source)
    return table
