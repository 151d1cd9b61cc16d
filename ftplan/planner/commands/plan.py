"""`ftplan plan`: every setup ranked by time to completion (or cost), with a reasoned recommendation;
over a range of GPU counts, the scaling of full and LoRA fine-tuning and the count to use."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click
from click.core import ParameterSource

from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import find_gpu, load_catalog
from ftplan.core.settings import PRECISIONS, Setting
from ftplan.models.communication import describe_layout, estimate_overlap
from ftplan.planner.batching import STRATEGIES, TOO_LONG
from ftplan.planner.commands.options import DEFAULT_GPUS_PER_NODE, positive_int_list, step_time_cv_option
from ftplan.planner.dataset_plan import DatasetOptions, dataset_plan_to_dict, plan_dataset_file
from ftplan.planner.gpu_counts import plan_gpu_counts
from ftplan.planner.inputs import (
    FINITE_FLOAT,
    budget_options,
    calibrations_option,
    gpu_options,
    link_options,
    load_evidence,
)
from ftplan.planner.render import (
    make_console,
    plan_to_dict,
    print_plan,
    print_scaling,
    scaling_to_dict,
)
from ftplan.planner.scaling import node_layout, parse_gpu_counts, with_step_time_cv
from ftplan.planner.search import DEFAULT_LORA_RANKS, PlanRequest, make_plan

host_memory_option = click.option(
    "--host-memory-gib", type=float, default=None,
    help="Host RAM per node, GiB. Offload setups that need more (less the safety margin) are left out; "
         "default: unknown, offload rows only show what they need.")


@click.command("plan")
@click.option("--model", required=True, help="Architecture id (see `ftplan models`) or a path to a config.json.")
@click.option("--dataset-size", type=int, default=None, help="Training samples per epoch (needed without --dataset).")
@click.option("--epochs", type=FINITE_FLOAT, default=1.0, show_default=True)
@click.option("--seq-len", type=int, default=2048, show_default=True, help="Tokens per sample (padded).")
@gpu_options
@click.option("--gpus", default="1", show_default=True,
              help="GPUs in all: a count (8), a list (1,2,4) or a doubling range (1..128); several counts add a "
                   "scaling table and choose the count.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=DEFAULT_GPUS_PER_NODE, show_default=True,
              help="Most GPUs one node holds: each count is spread evenly over as few nodes as hold it, and the "
                   "nodes talk over the inter-node link.")
@step_time_cv_option
@link_options
@click.option("--price-per-hour", type=FINITE_FLOAT, default=None, help="Price per GPU-hour; cost = hours × price × GPUs.")
@click.option("--max-hours", type=FINITE_FLOAT, default=None,
              help="Leave out setups that take longer; with several GPU counts, choose the cheapest count that meets it.")
@click.option("--by", type=click.Choice(["time", "cost"]), default="time", show_default=True, help="Rank by.")
@click.option("--any", "training", flag_value="any", default=True, help="Recommend full fine-tuning or LoRA (default).")
@click.option("--full", "training", flag_value="full", help="Recommend among full fine-tuning setups only.")
@click.option("--lora", "training", flag_value="lora", help="Recommend among LoRA setups only.")
@click.option("--lora-ranks", default=",".join(map(str, DEFAULT_LORA_RANKS)), show_default=True,
              callback=positive_int_list("LoRA ranks"), help="LoRA ranks to consider.")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="Plan this precision regime only.  [default: rank bf16 mixed precision and pure bf16]")
@budget_options
@host_memory_option
@calibrations_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--all", "show_all", is_flag=True,
              help="List every setup that fits, not only the best of each family (full or LoRA, offload, Liger, "
                   "checkpointing, precision).")
@click.option("--emit", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the recommended setup's ds_config.json, training_args.json and README.txt into this "
                   "new or empty folder.")
@click.option("--force", is_flag=True,
              help="With --emit into a folder that is not empty: replace the files ftplan wrote there, keep the rest.")
@click.option("--dataset", type=click.Path(path_type=Path), default=None,
              help="Plan from this dataset's token lengths (JSONL, JSON, CSV, Parquet or a save_to_disk folder) "
                   "instead of --dataset-size × --seq-len; --seq-len, if given, is the longest a sample may be.")
@click.option("--text-field", default=None, help="With --dataset: the text field.  [default: text, or messages]")
@click.option("--ids-field", default=None, help="With --dataset: a field of token ids, counted as they are.")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None,
              help="With --dataset: a local tokenizer folder or tokenizer.json; without it, tokens are estimated "
                   "from characters.")
@click.option("--batching", "batching_strategy", type=click.Choice(STRATEGIES), default="dynamic", show_default=True,
              help="With --dataset: pad every sample to the longest, dynamic padding in random order, "
                   "group_by_length, or packing into rows of --pack-length.")
@click.option("--pack-length", type=click.IntRange(min=1), default=None,
              help="With --batching pack: tokens per packed row.  [default: --seq-len]")
@click.option("--global-batch", type=click.IntRange(min=1), default=None,
              help="With --dataset: samples (packed rows) per optimizer step; the plan splits it into micro-batch × "
                   "gradient accumulation × GPUs.")
@click.option("--too-long", type=click.Choice(TOO_LONG), default="truncate", show_default=True,
              help="With --dataset: what to do with samples longer than --seq-len (or --pack-length).")
def command(model: str, dataset_size: int, epochs: float, seq_len: int, gpu_name: str, gpu_specs: Path | None,
            gpus: str, gpus_per_node: int, step_time_cv: float | None, intra_node_bandwidth: str | None,
            inter_node_bandwidth: str | None, price_per_hour: float | None, max_hours: float | None, by: str, training: str,
            lora_ranks: tuple[int, ...], precision: str | None, safety_margin: float | None, context_reserve_gib: float,
            host_memory_gib: float | None, calibrations: tuple[Path, ...], as_json: bool, show_all: bool,
            emit: Path | None, force: bool, dataset: Path | None = None, text_field: str | None = None,
            ids_field: str | None = None, tokenizer: Path | None = None, batching_strategy: str = "dynamic",
            pack_length: int | None = None, global_batch: int | None = None, too_long: str = "truncate") -> None:
    """Which setup finishes fastest (or cheapest) on this GPU, with its largest safe batch, ETA and cost;
    with several GPU counts, how full and LoRA fine-tuning scale and which count to use."""
    load_architecture(model)  # an unknown model fails here, with close names, before any fitting
    if dataset is None and dataset_size is None:
        raise click.UsageError("Missing option '--dataset-size' (or --dataset, to plan from its token lengths)")
    seq_len_given = click.get_current_context().get_parameter_source("seq_len") != ParameterSource.DEFAULT
    if dataset is not None:
        dataset_size = dataset_size or 1  # replaced by the dataset's own rows
    counts = parse_gpu_counts(gpus)
    base = Setting(model=model, seq_len=seq_len)
    catalog = load_catalog(gpu_specs)
    gpu = find_gpu(gpu_name, catalog)
    evidence = load_evidence(calibrations, catalog)
    links, links_text = evidence.links(gpu, intra_node_bandwidth, inter_node_bandwidth)
    links, spread_text = with_step_time_cv(links, step_time_cv, evidence.records)
    links_text += f" {spread_text}"
    predictor = evidence.predictor_with(links)
    request = PlanRequest(base=base, dataset_size=dataset_size, epochs=epochs, gpu=gpu,
                          budget=evidence.budget(gpu, safety_margin, context_reserve_gib),
                          price_per_gpu_hour=price_per_hour, max_hours=max_hours, by=by, training=training,
                          lora_ranks=lora_ranks, host_memory_gib=host_memory_gib, precision=precision)
    extra, failed = evidence.calibrated_settings(model), evidence.failed_trials(model)
    dataset_plan, dataset_lines = None, []
    if dataset is not None and len(parse_gpu_counts(gpus)) > 1:
        raise FtplanError("--dataset plans one GPU count at a time; give --gpus N")
    scaling = None
    if len(counts) == 1:
        per_node, nodes = node_layout(counts[0], gpus_per_node)
        links_text = f"Layout: {describe_layout(per_node, nodes)}. {links_text}"
        plan = make_plan(predictor, replace(request, base=base.with_(gpus=per_node, nodes=nodes)), extra)
        if dataset is not None:
            options = DatasetOptions(batching_strategy, pack_length or (seq_len if batching_strategy == "pack" else None),
                                     seq_len if seq_len_given else None, too_long, global_batch)
            dataset_plan, dataset_lines = plan_dataset_file(
                predictor, replace(request, base=base.with_(gpus=per_node, nodes=nodes)), dataset, options,
                text_field, ids_field, tokenizer, extra)
            plan = dataset_plan.plan
    else:
        scaling = plan_gpu_counts(predictor, request, counts, gpus_per_node, extra)
        plan = scaling.plan
    overlap = estimate_overlap(evidence.records, links)
    links_text += f" Overlap of communication with backward: {overlap.overlap:g}; {overlap.source}."
    if as_json:
        click.echo(json.dumps({**(plan_to_dict(plan, failed) if plan else {}),
                               "inputs": [{"path": str(i.path), "records": i.records,
                                           "from_training_runs": i.from_training_runs} for i in evidence.inputs],
                               "links": {**links.__dict__, "description": links_text},
                               "scaling": scaling_to_dict(scaling) if scaling else None,
                               **({"dataset": dataset_plan_to_dict(dataset_plan, dataset_lines)} if dataset_plan else {})},
                              indent=2))
    else:
        console = make_console()
        console.print(evidence.describe())
        if max(counts) > 1:
            console.print(links_text)
        if scaling is not None:
            print_scaling(scaling, console, failed)
        for line in dataset_lines:
            console.print(line)
        if plan is not None:
            print_plan(plan, console, failed, show_all)
    if emit is not None:
        if plan is None or plan.recommended is None:
            raise FtplanError("nothing to emit: no setup was recommended")
        from ftplan.planner.emit import write_configs
        written = write_configs(emit, plan.recommended, plan.request, force)
        click.echo(f"wrote {', '.join(str(p) for p in written)}", err=as_json)
