"""`ftplan report`: PNG charts of the calibrations and of what the planner makes of them."""

from __future__ import annotations

from pathlib import Path

import click

from ftplan.cli.commands.input_options import (
    GPU_SPECS_HELP,
    FiniteFloat,
    budget_options,
    calibrations_option,
    link_options,
)
from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import CPU, load_catalog
from ftplan.core.settings import Setting
from ftplan.evidence.inputs import load_evidence
from ftplan.models.fit import known_terms, with_gpu_names


@click.command("report")
@click.option("--model", default=None, help="Only this model's calibrations (default: all).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("report"), show_default=True,
              help="Folder for the PNG files; one with files in it only with --force.")
@click.option("--force", is_flag=True, help="Write into a folder that has files in it, replacing same-named charts.")
@click.option("--dataset-size", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Samples per epoch for the time-to-completion chart.")
@click.option("--epochs", type=FiniteFloat(min=0, min_open=True), default=1.0, show_default=True,
              help="Passes over the dataset, for the time-to-completion chart.")
@click.option("--gpu-specs", type=click.Path(path_type=Path), default=None, help=GPU_SPECS_HELP)
@click.option("--gpus", default="1..128", show_default=True, help="GPU counts of the scaling chart (as in `ftplan plan`).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True,
              help="GPUs a node holds in the scaling chart; beyond it nodes talk over the inter-node link.")
@link_options
@budget_options
@calibrations_option
def command(model: str | None, out: Path, dataset_size: int, epochs: float, gpu_specs: Path | None, gpus: str,
            gpus_per_node: int, intra_node_bandwidth: str | None, inter_node_bandwidth: str | None,
            safety_margin: float | None, context_reserve_gib: float, calibrations: tuple[Path, ...],
            force: bool = False) -> None:
    """Peak memory and seconds per step vs batch per calibrated setting (measured, fitted, upper bound, the card's
    limit), hours to completion vs batch per setup with a line at the best, and per calibrated model and card the
    speed-up and scaling efficiency of full and LoRA fine-tuning against GPU count: the charts behind `ftplan plan`."""
    from ftplan.cli import plots
    from ftplan.models.scaling import parse_gpu_counts

    counts = parse_gpu_counts(gpus)
    if model is not None:
        load_architecture(model)  # an unknown name is said as such (with close names), not as 'no records of it'
    evidence = load_evidence(calibrations, load_catalog(gpu_specs))
    # a record whose model no longer loads (its config deleted) is left out, as plan leaves it out
    records = [r for r in with_gpu_names(evidence.records)
               if (model is None or r["model"] == model) and known_terms(r) is not None]
    cards = {r.get("gpu_name"): evidence.card_of(r) for r in records}
    cards = {name: card for name, card in cards.items() if card is not None}
    budgets = {name: evidence.budget(card, safety_margin, context_reserve_gib) for name, card in cards.items()}
    curves = plots.collect_curves(records, evidence.predictor, cards, budgets)
    if not curves:
        which = f" of {model}" if model else ""
        raise FtplanError(f"no calibration records{which} on a known GPU to plot (pass --calibrations PATH)")
    if not force and out.is_dir() and any(out.iterdir()):  # nothing a user wrote is replaced unasked
        raise FtplanError(f"{out} has files in it; pass --force to write the charts there, or choose another --out")
    links = sorted(p.name for p in out.iterdir() if p.is_symlink()) if out.is_dir() else []
    if links:  # a chart written through one would land wherever it points
        raise FtplanError(f"{out / links[0]} is a symlink; write the charts to a folder without links")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FtplanError(f"cannot create {out}: {exc.strerror}") from None
    scaled = [(name, card, model_id) for name, card in cards.items() if card.name != CPU  # a CPU does not scale
              for model_id in sorted({r["model"] for r in records if r.get("gpu_name") == name})]
    click.echo(f"charting {len(curves)} calibrated settings, then GPU scaling of {len(scaled)} model-and-card pair(s) "
               f"at {len(counts)} GPU count(s): a plan each", err=True)  # half a minute for the shipped records
    click.echo(f"wrote {plots.plot_memory(curves, out / plots.MEMORY_PNG)}")
    click.echo(f"wrote {plots.plot_seconds(curves, out / plots.TIME_PNG)}")
    click.echo(f"wrote {plots.plot_completion(curves, dataset_size, epochs, out / plots.COMPLETION_PNG)}")
    for name, card, model_id in scaled:
        links, _ = evidence.links(card, intra_node_bandwidth, inter_node_bandwidth)
        base = Setting(model=model_id, seq_len=max(r["seq_len"] for r in records if r["model"] == model_id))
        path = plots.plot_gpu_scaling(evidence.predictor_with(links), links.inter_node_gbs, base, card, budgets[name],
                                      counts, gpus_per_node, dataset_size, epochs,
                                      evidence.calibrated_settings(model_id), out)
        click.echo(f"wrote {path}")

