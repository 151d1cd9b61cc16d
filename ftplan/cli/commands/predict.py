"""`ftplan predict`: peak memory per GPU and seconds per step for one setting and batch size.

The JSON keys peak_allocated_gib, peak_reserved_gib and seconds_per_step are a contract other
tools script against; everything else in the object is extra.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ftplan.cli.commands.input_options import budget_options, calibrations_option, link_options
from ftplan.cli.commands.options import (
    checked_architecture,
    setting_from_options,
    setting_options,
    step_time_cv_option,
)
from ftplan.cli.render import make_console, memory_verdict
from ftplan.core.errors import EXIT_DOES_NOT_FIT
from ftplan.core.hardware import GpuSpec
from ftplan.core.units import GIB
from ftplan.models.communication.layout import describe_layout
from ftplan.models.prediction import Prediction
from ftplan.models.safe_batch import MemoryBudget, proven_batch
from ftplan.planner.search import fits_budget
from ftplan.evidence.workspace import Workspace

DEFAULT_GPU = "H200"  # the card the shipped calibrations were measured on


@click.command("predict")
@setting_options
@click.option("--batch-size", type=click.IntRange(min=1), required=True, help="Micro-batch per GPU.")
@click.option("--gpu", "gpu_name", default=DEFAULT_GPU, show_default=True, help="GPU model (see `ftplan gpus`).")
@click.option("--gpu-specs", type=click.Path(path_type=Path), default=None,
              help="CSV of GPU specs (columns as in `ftplan gpus`) overriding or extending the catalog.")
@link_options
@step_time_cv_option
@budget_options
@calibrations_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(batch_size: int, gpu_name: str, gpu_specs: Path | None, intra_node_bandwidth: str | None,
            inter_node_bandwidth: str | None, step_time_cv: float | None, safety_margin: float | None,
            context_reserve_gib: float, calibrations: tuple[Path, ...], as_json: bool, **options) -> None:
    """Predicted peak allocated and reserved memory per GPU and seconds per optimizer step."""
    setting = setting_from_options(options)
    checked_architecture(setting.model)
    workspace = Workspace.open(gpu_name, calibrations, gpu_specs, intra_node_bandwidth, inter_node_bandwidth,
                               step_time_cv)
    gpu = workspace.card
    prediction = workspace.predict(setting, batch_size)
    budget = workspace.budget(safety_margin, context_reserve_gib)
    layout = describe_layout(setting.gpus, setting.nodes)
    if as_json:
        click.echo(json.dumps({**prediction_to_dict(prediction, gpu, budget),
                               "layout": {"gpus": setting.world_size, "gpus_per_node": setting.gpus,
                                          "nodes": setting.nodes, "description": layout}}, indent=2))
    else:
        console = make_console()
        console.print(f"layout: {layout}")
        if setting.world_size > 1:
            console.print(workspace.links_text(setting.nodes))
        print_prediction(prediction, gpu, budget, console)
    if not fits_budget(prediction, budget):
        raise click.exceptions.Exit(EXIT_DOES_NOT_FIT)  # as `eta` does: a script reads the answer from the status


def prediction_to_dict(prediction: Prediction, gpu: GpuSpec, budget: MemoryBudget) -> dict:
    return {
        "peak_allocated_gib": prediction.peak_allocated.mean / GIB,
        "peak_reserved_gib": prediction.peak_reserved.mean / GIB,
        "seconds_per_step": prediction.seconds_per_step.mean,
        "peak_allocated_upper_gib": prediction.peak_allocated.upper / GIB,
        "peak_reserved_upper_gib": prediction.peak_reserved.upper / GIB,
        "seconds_per_step_upper": prediction.seconds_per_step.upper,
        "fits_in_memory": fits_budget(prediction, budget),
        "gpu": gpu.name,
        "gpu_memory_gib": budget.capacity_bytes / GIB,
        "usable_gib": budget.usable_bytes / GIB,
        "micro_batch": prediction.micro_batch,
        "setting": prediction.setting.to_dict(),
        "source": prediction.source,
        "evidence": prediction.evidence,
        "wall_batch": prediction.wall_batch,
        "proven_batch": proven_batch(prediction.measured_healthy, budget.usable_bytes),
        "notes": list(prediction.notes),
    }


def print_prediction(prediction: Prediction, gpu: GpuSpec, budget: MemoryBudget, console: Console) -> None:
    table = Table("", "predicted", "upper bound", title=f"{prediction.setting.model} {prediction.setting.label()}, "
                  f"micro-batch {prediction.micro_batch} on {gpu.name} ({budget.capacity_bytes / GIB:.1f} GiB)")
    table.add_row("peak allocated / GPU", f"{prediction.peak_allocated.mean / GIB:.2f} GiB",
                  f"{prediction.peak_allocated.upper / GIB:.2f} GiB")
    table.add_row("peak reserved / GPU", f"{prediction.peak_reserved.mean / GIB:.2f} GiB",
                  f"{prediction.peak_reserved.upper / GIB:.2f} GiB")
    table.add_row("seconds / step", f"{prediction.seconds_per_step.mean:.3f}", f"{prediction.seconds_per_step.upper:.3f}")
    console.print(table)
    console.print(f"evidence: {prediction.evidence}")
    if prediction.wall_batch is not None:
        console.print(f"allocator wall or OOM observed at micro-batch {prediction.wall_batch}")
    proven = proven_batch(prediction.measured_healthy, budget.usable_bytes)
    if proven is not None:
        console.print(f"measured healthy up to micro-batch {proven} within the usable memory")
    console.print(memory_verdict(prediction, budget), markup=False)
    for note in prediction.notes:
        console.print(f"note: {note}")
