"""Printing at the edge: rich tables for people, plain dicts for --json. No decisions are made here."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Column, Table

from ftplan.core.hardware import GpuSpec
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.prediction import Estimate, Prediction
from ftplan.models.safe_batch import MemoryBudget
from ftplan.planner import advice
from ftplan.planner.eta import Eta, format_duration
from ftplan.planner.gpu_counts import KINDS, ScalingPlan
from ftplan.planner.search import Plan, SetupPlan

SOURCE_STYLE = {"measured": "green", "interpolated": "green", "extrapolated": "yellow"}  # anything else: red


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
            "hours": eta.hours, "cost": eta.cost}


def setup_to_dict(setup: SetupPlan, failed: dict[Setting, str] | None = None) -> dict:
    failed = failed or {}
    return {"label": setup.label, "training": setup.training, "setting": setup.setting.to_dict(),
            "fits": setup.fits, "largest_safe_batch": setup.batch,
            "prediction": prediction_to_dict(setup.best or setup.at_batch_one),
            "eta": eta_to_dict(setup.eta) if setup.eta else None,
            "calibration_failed": failed.get(setup.setting.with_(gpus=1, nodes=1)),
            "host_gib_per_node": setup.host_bytes / GIB, "host_memory_short": setup.host_short}


def plan_to_dict(plan: Plan, failed: dict[Setting, str] | None = None) -> dict:
    """The whole plan as data: request, memory budget, every setup, the recommendation and its reasons."""
    request, budget = plan.request, plan.request.budget
    rec = plan.recommended
    return {
        "request": {"model": request.base.model, "seq_len": request.base.seq_len, "gpu": request.gpu.name,
                    "gpus": request.base.gpus, "nodes": request.base.nodes, "dataset_size": request.dataset_size,
                    "epochs": request.epochs, "price_per_gpu_hour": request.price_per_gpu_hour,
                    "max_hours": request.max_hours, "by": request.by, "training": request.training,
                    "host_memory_gib": request.host_memory_gib},
        "memory_budget": {"capacity_gib": budget.capacity_bytes / GIB, "safety_margin": budget.margin, "measured_limit_gib": budget.measured_limit_bytes / GIB,
                          "context_reserve_gib": budget.context_reserve_bytes / GIB,
                          "usable_gib": budget.usable_bytes / GIB},
        "ranked": [setup_to_dict(s, failed) for s in plan.ranked],
        "over_max_hours": [setup_to_dict(s, failed) for s in plan.too_slow],
        "cannot_fit": [setup_to_dict(s, failed) for s in plan.unfit],
        "recommendation": setup_to_dict(rec, failed) if rec else None,
        "reasons": advice.reasons(plan),
        "warnings": advice.warnings_for(plan),
        "notes": advice.notes_for(plan),
        "unmeasured": advice.unmeasured_notes(plan, failed or {}),
    }


def _cost(eta: Eta) -> str:
    return "-" if eta.cost is None else f"{eta.cost:,.2f}"


def _samples(request) -> str:
    return f"{request.dataset_size:,} samples × {request.epochs:g} epoch{'' if request.epochs == 1 else 's'}"


def _source_cell(label: str) -> str:
    return f"[{SOURCE_STYLE.get(label.split(' ')[0], 'red')}]{label}[/]"


def _host_cell(setup: SetupPlan) -> str:
    """Host RAM per node an offload row needs (a lower bound: the process itself comes on top)."""
    return f"≥{setup.host_bytes / GIB:,.1f}" if setup.host_bytes else "-"


def plan_table(plan: Plan, failed: dict[Setting, str], limit: int | None = None) -> Table:
    """The ranked setups (the first `limit`, the recommendation always among them)."""
    usable = plan.request.budget.usable_bytes / GIB
    title = (f"{plan.request.base.model}, {_samples(plan.request)}, "
             f"seq {plan.request.base.seq_len}, {plan.request.base.world_size} × {plan.request.gpu.name}")
    host = plan.request.host_memory_gib
    table = Table("#", "setup", "batch/GPU", f"reserved GiB (upper) / {usable:.1f}",
                  "host GiB/node" + (f" / {host:g}" if host is not None else ""), "s/step", "steps",
                  "ETA h:mm", "cost", "source", title=title)
    rec = plan.recommended
    for rank, setup in enumerate(plan.ranked, start=1):
        if limit is not None and rank > limit and setup is not rec:
            continue
        best, eta = setup.best, setup.eta
        table.add_row(f"→{rank}" if setup is rec else str(rank), setup.label, str(setup.batch),
                      f"{best.peak_reserved.mean / GIB:.1f} ({best.peak_reserved.upper / GIB:.1f})",
                      _host_cell(setup), f"{eta.seconds_per_step:.2f}", f"{eta.steps:,}", format_duration(eta.total_seconds),
                      _cost(eta), _source_cell(advice.source_label(setup, failed)),
                      style="bold" if setup is rec else None)
    return table


def print_plan(plan: Plan, console: Console, failed: dict[Setting, str], limit: int | None = None) -> None:
    budget = plan.request.budget
    console.print(plan_table(plan, failed, limit))
    if limit is not None and len(plan.ranked) > limit:
        console.print(f"({len(plan.ranked) - limit} more setups at this count: --gpus {plan.request.base.world_size} "
                      "or --json lists them all)")
    console.print(f"Memory: {budget.describe()}; a batch is safe when the upper bound of predicted peak "
                  "reserved memory stays within it and below any batch seen at the allocator wall or OOM.")
    if plan.request.price_per_gpu_hour is not None:
        console.print(f"Cost = hours × {plan.request.price_per_gpu_hour:g} per GPU-hour × "
                      f"{plan.request.base.world_size} GPU(s).")
    if plan.too_slow:
        console.print(f"Over --max-hours {plan.request.max_hours:g}: " + "; ".join(
            f"{s.label} ({format_duration(s.eta.total_seconds)})" for s in plan.too_slow))
    gpu_unfit = [s for s in plan.unfit if not s.host_short]
    host_unfit = [s for s in plan.unfit if s.host_short]
    if gpu_unfit:
        console.print("Cannot fit even at batch 1: " + "; ".join(
            f"{s.label} (needs {s.at_batch_one.peak_reserved.upper / GIB:.1f} GiB)" for s in gpu_unfit))
    if host_unfit:
        console.print(f"Not enough host RAM (you have {plan.request.host_memory_gib:g} GiB per node): " + "; ".join(
            f"{s.label} (needs {s.host_bytes / GIB:,.1f} GiB of host RAM per node for offloaded optimizer states)"
            for s in host_unfit))
    if any(s.host_bytes for s in plan.ranked):
        console.print("host GiB/node: host RAM each node pins for CPU optimizer offload (optimizer states, master "
                      "weights, gradients; models/host_memory.py), a lower bound: the process itself comes on top.")
    for note in advice.unmeasured_notes(plan, failed):
        console.print(f"[red]unmeasured:[/] {note}")
    rec = plan.recommended
    if rec is not None:
        console.print(f"\n[bold]Recommendation: {rec.label}, batch {rec.batch} per GPU, "
                      f"ETA {format_duration(rec.eta.total_seconds)}[/]")
        for reason in advice.reasons(plan):
            console.print(f"  • {reason}")
    for warning in advice.warnings_for(plan):
        console.print(f"[yellow]warning:[/] {warning}")
    for note in advice.notes_for(plan):
        console.print(f"note: {note}")


def host_line(host_bytes: int, host_memory_gib: float | None, enough: bool) -> str | None:
    """`ftplan eta`'s host-memory verdict for an offload setting (None without offload)."""
    if not host_bytes:
        return None
    need = f"needs {host_bytes / GIB:,.1f} GiB of host RAM per node for offloaded optimizer states"
    if host_memory_gib is None:
        return f"host memory: {need} (lower bound; --host-memory-gib checks it)"
    return f"host memory: {'fits' if enough else 'NOT enough'}: {need}; you have {host_memory_gib:g}"


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
    table = Table("name", "memory GiB", "PyTorch GiB", "bf16 dense TFLOP/s", "bandwidth GB/s", "GPU-GPU GB/s", "interconnect",
                  "source")
    for spec in catalog.values():
        table.add_row(spec.name, f"{spec.memory_gib:g}", f"{spec.memory_bytes / GIB:.2f}", f"{spec.bf16_dense_tflops:g}",
                      f"{spec.memory_bandwidth_gbs:g}", f"{spec.intra_node_gbs:g}", spec.interconnect, spec.source)
    return table


def _number(value: float, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def scaling_table(scaling: ScalingPlan, failed: dict[Setting, str]) -> Table:
    """Per training kind and GPU count: its best setup, per-GPU memory, speed and scaling, ETA and cost
    (GPU-hours when no price was given)."""
    request = scaling.request
    priced = request.price_per_gpu_hour is not None
    columns = ["kind", "GPUs", "best setup at that count", "batch", "GiB/GPU (upper)", "s/step", "samples/s",
               "speed-up", "effic.", "ETA h:mm", "cost" if priced else "GPU-h", "source"]
    table = Table(*(Column(name, no_wrap=True) for name in columns),
                  title=f"{request.base.model} on {request.gpu.name}, {_samples(request)}, seq {request.base.seq_len}: "
                        f"best setup per GPU count ({request.budget.usable_bytes / GIB:.1f} GiB usable per GPU)")
    chosen = scaling.chosen
    for kind, rows in scaling.tables.items():
        for row in rows.to_dict("records"):
            bold = chosen is not None and kind == scaling.chosen_kind and row["gpus"] == chosen.gpus
            source = "prior, unmeasured" if row["source"] == "prior" else row["source"]
            if advice.failed_like(Setting.from_dict(row["setting"]), failed):
                source = "unmeasured: trial failed"
            spend = row["cost"] if priced else row["hours"] * row["gpus"]
            table.add_row(("→ " if bold else "") + ("full" if kind == "full" else "LoRA"), str(row["gpus"]),
                          row["setup"], str(row["micro_batch"]),
                          f"{row['reserved_gib']:.1f} ({row['reserved_upper_gib']:.1f})",
                          f"{row['seconds_per_step']:.2f}", f"{row['samples_per_second']:.1f}",
                          _number(row["speedup"], ".1f") + ("" if math.isnan(row["speedup"]) else "x"),
                          _number(row["efficiency"], ".0%"), format_duration(row["hours"] * 3600),
                          f"{spend:,.2f}", _source_cell(source), style="bold" if bold else None)
        table.add_section()
    return table


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


def print_scaling(scaling: ScalingPlan, console: Console, failed: dict[Setting, str]) -> None:
    console.print(scaling_table(scaling, failed))
    console.print("Speed-up and efficiency: samples/s against the best setup of the same training on one GPU "
                  "(above 1 when more GPUs let a larger batch or a setup without offload fit).")
    for count in scaling.counts:
        if count.error:
            console.print(f"{count.gpus} GPUs: {count.error}")
    chosen = scaling.chosen
    if chosen is None:
        console.print(f"[yellow]warning:[/] {scaling.reason}")
        return
    where = f"{chosen.gpus_per_node} GPUs × {chosen.nodes} nodes" if chosen.nodes > 1 else f"{chosen.gpus} GPU(s), one node"
    console.print(f"\n[bold]GPU count: {chosen.gpus} ({where}), {KINDS[scaling.chosen_kind]}[/], because {scaling.reason}. "
                  f"Setups at {chosen.gpus} GPUs:")
