"""`ftplan eta`: steps, time to completion, cost and the memory verdict for one fully specified run."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ftplan.cli.commands.input_options import (
    FINITE_FLOAT,
    budget_options,
    calibrations_option,
    gpu_options,
    link_options,
)
from ftplan.cli.commands.options import (
    checked_architecture,
    setting_from_options,
    setting_options,
    step_time_cv_option,
)
from ftplan.cli.commands.plan import host_memory_option
from ftplan.cli.render import eta_lines, host_line
from ftplan.core.errors import EXIT_DOES_NOT_FIT
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.communication.layout import describe_layout
from ftplan.models.eta import check_price, estimate_eta
from ftplan.models.host_memory import host_bytes_per_node, usable_host_bytes
from ftplan.planner.as_data import eta_to_dict, prediction_to_dict
from ftplan.planner.search import fits_budget
from ftplan.evidence.workspace import Workspace


@click.command("eta")
@setting_options
@click.option("--batch-size", type=click.IntRange(min=1), required=True, help="Micro-batch per GPU.")
@click.option("--dataset-size", type=int, required=True, help="Training samples per epoch.")
@click.option("--epochs", type=FINITE_FLOAT, default=1.0, show_default=True,
              help="Passes over the dataset (fractions allowed).")
@click.option("--price-per-hour", type=FINITE_FLOAT, default=None, help="Price per GPU-hour; cost = hours × price × GPUs.")
@gpu_options
@link_options
@step_time_cv_option
@budget_options
@host_memory_option
@calibrations_option
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as JSON.")
def command(batch_size: int, dataset_size: int, epochs: float, price_per_hour: float | None, gpu_name: str,
            gpu_specs: Path | None, intra_node_bandwidth: str | None,
            inter_node_bandwidth: str | None, step_time_cv: float | None, safety_margin: float | None,
            context_reserve_gib: float, host_memory_gib: float | None,
            calibrations: tuple[Path, ...], as_json: bool, **options) -> None:
    """How long one configuration takes to finish, what it costs, and whether it fits in memory."""
    setting = setting_from_options(options)
    check_price(price_per_hour)
    host_bytes = host_bytes_per_node(checked_architecture(setting.model), setting)
    workspace = Workspace.open(gpu_name, calibrations, gpu_specs, intra_node_bandwidth, inter_node_bandwidth,
                               step_time_cv)
    gpu = workspace.card
    budget = workspace.budget(safety_margin, context_reserve_gib)
    host_enough = host_memory_gib is None or host_bytes <= usable_host_bytes(host_memory_gib, budget.margin)
    layout = {"gpus": setting.world_size, "gpus_per_node": setting.gpus, "nodes": setting.nodes,
              "description": describe_layout(setting.gpus, setting.nodes)}
    prediction = workspace.predict(setting, batch_size)
    eta = estimate_eta(prediction.seconds_per_step.mean, dataset_size, epochs, batch_size, setting.world_size,
                       price_per_hour, prediction.seconds_per_step.upper)
    fits = fits_budget(prediction, budget) and host_enough
    if as_json:
        click.echo(json.dumps({"setting": setting.to_dict(), "gpu": gpu.name, "fits": fits,
                               "host_gib_per_node": host_bytes / GIB, "host_memory_gib": host_memory_gib,
                               "host_memory_enough": host_enough,
                               "usable_gib": budget.usable_bytes / GIB, "eta": eta_to_dict(eta), "layout": layout,
                               "prediction": prediction_to_dict(prediction)}, indent=2))
    else:
        host = host_line(host_bytes, host_memory_gib, host_enough)
        _echo_eta(setting, gpu.name, batch_size, dataset_size, epochs, workspace.links_text(setting.nodes),
                  eta_lines(prediction, eta, budget) + ([host] if host else []))
    _exit_unless(fits)


def _echo_eta(setting: Setting, gpu_name: str, batch_size: int, dataset_size: int, epochs: float, links_text: str,
              lines: list[str]) -> None:
    """The run in words first, so the verdict lines below it are read as this run's; links only where GPUs talk."""
    click.echo(f"{setting.label()} on {setting.world_size} × {gpu_name}, batch {batch_size} per GPU, "
               f"{dataset_size:,} samples × {epochs:g} epoch{'' if epochs == 1 else 's'}")
    click.echo(f"  layout: {describe_layout(setting.gpus, setting.nodes)}")
    if setting.world_size > 1:
        click.echo(f"  {links_text}")
    for line in lines:
        click.echo(f"  {line}")


def _exit_unless(fits: bool) -> None:
    """Exit 3 when the configuration does not fit: a script reads the answer from the status."""
    if not fits:
        raise click.exceptions.Exit(EXIT_DOES_NOT_FIT)
