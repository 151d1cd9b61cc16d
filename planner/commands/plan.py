"""`ftplan plan`: every setup ranked by time to completion (or cost), with a reasoned recommendation."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from calibration.settings import Setting
from models.architecture import load_architecture
from models.errors import FtplanError
from models.hardware import find_gpu, load_catalog
from planner.inputs import budget_options, calibrations_option, gpu_options, load_evidence
from planner.render import plan_to_dict, print_plan
from planner.search import DEFAULT_LORA_RANKS, PlanRequest, make_plan


def _ranks(_ctx, _param, value: str) -> tuple[int, ...]:
    try:
        ranks = tuple(int(r) for r in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got '{value}'") from None
    if any(r <= 0 for r in ranks):
        raise click.BadParameter(f"LoRA ranks must be positive, got '{value}'")
    return ranks


@click.command("plan")
@click.option("--model", required=True, help="Architecture id (see `ftplan models`) or a path to a config.json.")
@click.option("--dataset-size", type=int, required=True, help="Training samples per epoch.")
@click.option("--epochs", type=float, default=1.0, show_default=True)
@click.option("--seq-len", type=int, default=2048, show_default=True, help="Tokens per sample (padded).")
@gpu_options
@click.option("--gpus", type=int, default=1, show_default=True, help="GPUs per node.")
@click.option("--nodes", type=int, default=1, show_default=True)
@click.option("--price-per-hour", type=float, default=None, help="Price per GPU-hour; cost = hours × price × GPUs.")
@click.option("--max-hours", type=float, default=None, help="Leave out setups that take longer.")
@click.option("--by", type=click.Choice(["time", "cost"]), default="time", show_default=True, help="Rank by.")
@click.option("--any", "training", flag_value="any", default=True, help="Recommend full fine-tuning or LoRA (default).")
@click.option("--full", "training", flag_value="full", help="Recommend among full fine-tuning setups only.")
@click.option("--lora", "training", flag_value="lora", help="Recommend among LoRA setups only.")
@click.option("--lora-ranks", default=",".join(map(str, DEFAULT_LORA_RANKS)), show_default=True, callback=_ranks,
              help="LoRA ranks to consider.")
@budget_options
@calibrations_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--emit", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the recommended setup's ds_config.json, training_args.json and README.txt here.")
def command(model: str, dataset_size: int, epochs: float, seq_len: int, gpu_name: str, gpu_specs: Path | None,
            gpus: int, nodes: int, price_per_hour: float | None, max_hours: float | None, by: str, training: str,
            lora_ranks: tuple[int, ...], safety_margin: float, context_reserve_gib: float,
            calibrations: tuple[Path, ...], as_json: bool, emit: Path | None) -> None:
    """Which setup finishes fastest (or cheapest) on this GPU, with its largest safe batch, ETA and cost."""
    load_architecture(model)  # an unknown model fails here, with close names, before any fitting
    base = Setting(model=model, seq_len=seq_len, gpus=gpus, nodes=nodes)
    catalog = load_catalog(gpu_specs)
    gpu = find_gpu(gpu_name, catalog)
    evidence = load_evidence(calibrations, catalog)
    request = PlanRequest(base=base, dataset_size=dataset_size, epochs=epochs, gpu=gpu,
                          budget=evidence.budget(gpu, safety_margin, context_reserve_gib),
                          price_per_gpu_hour=price_per_hour, max_hours=max_hours, by=by, training=training,
                          lora_ranks=lora_ranks)
    plan = make_plan(evidence.predictor, request, evidence.calibrated_settings(model))
    if as_json:
        click.echo(json.dumps(plan_to_dict(plan), indent=2))
    else:
        print_plan(plan, Console(width=160))
    if emit is not None:
        if plan.recommended is None:
            raise FtplanError("nothing to emit: no setup was recommended")
        from planner.emit import write_configs
        written = write_configs(emit, plan.recommended, request)
        click.echo(f"wrote {', '.join(str(p) for p in written)}", err=as_json)
