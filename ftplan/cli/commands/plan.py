"""`ftplan plan`: every setup ranked by time to completion (or cost), with a reasoned recommendation;
over a range of GPU counts, the scaling of full and LoRA fine-tuning and the count to use."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import click
from click.core import ParameterSource

from ftplan.cli.commands.dataset_options import check_dataset_options, dataset_options
from ftplan.cli.commands.input_options import (
    FINITE_FLOAT,
    budget_options,
    calibrations_option,
    gpu_options,
    link_options,
)
from ftplan.cli.commands.options import MODEL_HELP, positive_int_list, step_time_cv_option
from ftplan.cli.render import (
    make_console,
    print_plan,
    print_scaling,
    table_label,
)
from ftplan.core.errors import EXIT_DOES_NOT_FIT, DoesNotFit, FtplanError
from ftplan.core.hardware import CPU
from ftplan.core.settings import DEFAULT_SEQ_LEN, PRECISIONS
from ftplan.models.batching import STRATEGIES
from ftplan.models.scaling import DEFAULT_GPUS_PER_NODE
from ftplan.planner import advice, api
from ftplan.planner.dataset_plan import DatasetOptions
from ftplan.planner.search import ALLOWED, DEFAULT_LORA_RANKS

host_memory_option = click.option(
    "--host-memory-gib", type=float, default=None,
    help="Host RAM per node, GiB. Offload setups that need more (less the safety margin) are left out; "
         "default: unknown, offload rows only show what they need.")



TRAINING = "ftplan.training"  # where --any, --full and --lora leave their choice in the click context


def _training(ctx: click.Context, choice: str, given: bool) -> None:
    """Keep the one training choice given; two of --any, --full, --lora were once accepted, the last one winning."""
    if not given:
        return
    chosen = ctx.meta.setdefault(TRAINING, choice)
    if chosen != choice:
        raise click.UsageError(f"--{chosen} and --{choice} contradict each other; give one")

@click.command("plan")
@click.option("--model", required=True, help=MODEL_HELP)
@click.option("--dataset-size", type=int, default=None, help="Training samples per epoch (needed without --dataset).")
@click.option("--epochs", type=FINITE_FLOAT, default=1.0, show_default=True,
              help="Passes over the dataset (fractions allowed).")
@click.option("--seq-len", type=int, default=DEFAULT_SEQ_LEN, show_default=True,
              help="Tokens per sample (padded). With --dataset: the longest a sample may be (longer ones are "
                   "truncated or dropped, --too-long); not given, the dataset's longest sample, and with "
                   f"--batching pack rows of {DEFAULT_SEQ_LEN} tokens (--pack-length sets them).")
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
@click.option("--any", is_flag=True, expose_value=False, callback=lambda ctx, _, given: _training(ctx, "any", given),
              help="Recommend full fine-tuning or LoRA (default).")
@click.option("--full", is_flag=True, expose_value=False, callback=lambda ctx, _, given: _training(ctx, "full", given),
              help="Recommend among full fine-tuning setups only.")
@click.option("--lora", is_flag=True, expose_value=False, callback=lambda ctx, _, given: _training(ctx, "lora", given),
              help="Recommend among LoRA setups only.")
@click.option("--lora-ranks", default=",".join(map(str, DEFAULT_LORA_RANKS)), show_default=True,
              callback=positive_int_list("LoRA ranks"), help="LoRA ranks to consider.")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="Plan this precision regime only.  [default: rank bf16 mixed precision and pure bf16]")
@click.option("--allow", "allow", type=click.Choice(ALLOWED), multiple=True,
              help="Also rank QLoRA: LoRA on a 4-bit NF4 base (bitsandbytes). It needs about a quarter of the "
                   "base's memory, but each linear is dequantized for every matmul, so a step is slower than "
                   "LoRA on a bf16 base; the time is measured where calibrated, else the prior's FLOPs, which "
                   "do not count the dequantization.")
@budget_options
@host_memory_option
@calibrations_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--all", "show_all", is_flag=True,
              help="List every setup that fits, not only the best of each family (full or LoRA, offload, Liger, "
                   "checkpointing, precision).")
@click.option("--emit", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the recommended setup's ds_config.json, training_args.json, training_args.py (arguments "
                   "and the batching's collator) and README.txt into this new or empty folder.")
@click.option("--force", is_flag=True,
              help="With --emit into a folder that is not empty: replace the files ftplan wrote there, keep the rest.")
@dataset_options
@click.option("--batching", "batching_strategy", type=click.Choice(STRATEGIES), default="dynamic", show_default=True,
              help="With --dataset: pad every sample to the longest, dynamic padding in random order, "
                   "group_by_length, or packing into rows of --pack-length.")
@click.option("--pack-length", type=click.IntRange(min=1), default=None,
              help="With --batching pack: tokens per packed row.  [default: --seq-len]")
@click.option("--global-batch", type=click.IntRange(min=1), default=None,
              help="With --dataset: samples (packed rows) per optimizer step; the plan splits it into micro-batch × "
                   "gradient accumulation × GPUs.")
@click.option("--padding", type=click.Choice(api.NO_DATASET_PADDINGS), default="max_length", show_default=True,
              help="Without --dataset: max_length pads every sample to --seq-len with a padding mask (SDPA's masked "
                   "path); none: your rows are already exactly --seq-len tokens (chunked as run_clm's group_texts "
                   "does), so no mask reaches attention.")
@click.option("--alloc-conf", default="", metavar="CONF",
              help="PYTORCH_CUDA_ALLOC_CONF the run will set (e.g. expandable_segments:True): setups are predicted "
                   "from calibrations with it, and --emit writes it.  [default: none, the allocator's default]")
@click.option("--emit-setup", default=None, metavar="LABEL",
              help="With --emit: write this ranked setup (its label as the table prints it, e.g. 'ddp lora16 "
                   "padded', or with the sequence length, 'ddp lora16 s2048 padded') instead of the recommendation.")
def command(model: str, dataset_size: int, epochs: float, seq_len: int, gpu_name: str, gpu_specs: Path | None,
            gpus: str, gpus_per_node: int, step_time_cv: float | None, intra_node_bandwidth: str | None,
            inter_node_bandwidth: str | None, price_per_hour: float | None, max_hours: float | None, by: str,
            lora_ranks: tuple[int, ...], precision: str | None, safety_margin: float | None, context_reserve_gib: float,
            host_memory_gib: float | None, calibrations: tuple[Path, ...], as_json: bool, show_all: bool,
            emit: Path | None, force: bool, dataset: Path | None = None, text_field: str | None = None,
            ids_field: str | None = None, tokenizer: Path | None = None, chars_per_token: float | None = None,
            too_long: str = "truncate", batching_strategy: str = "dynamic", pack_length: int | None = None,
            global_batch: int | None = None, allow: tuple[str, ...] = (), emit_setup: str | None = None,
            padding: str = "max_length", alloc_conf: str = "") -> None:
    """Which setup finishes fastest (or cheapest) on this GPU, with its largest safe batch, ETA and cost;
    with several GPU counts, how full and LoRA fine-tuning scale and which count to use."""
    ctx = click.get_current_context()
    options = _dataset_options(ctx)
    if dataset is not None and ctx.get_parameter_source("seq_len") == ParameterSource.DEFAULT:
        seq_len = None  # with a dataset, not given: its longest sample (the API resolves the limit and pack length)
    if emit_setup is not None and emit is None:
        raise FtplanError("--emit-setup chooses the setup --emit writes: give --emit DIR too")
    if emit is not None:
        from ftplan.planner.emit import refuse_occupied
        refuse_occupied(emit, force)
    with _warnings_kept() as caught, _nothing_fits_as_json(as_json):
        result = api.plan(model, dataset_size, gpu_name, epochs=epochs, seq_len=seq_len, gpus=gpus,
                          gpus_per_node=gpus_per_node, step_time_cv=step_time_cv, intra_node_bandwidth=intra_node_bandwidth,
                          inter_node_bandwidth=inter_node_bandwidth, price_per_hour=price_per_hour, max_hours=max_hours,
                          by=by, training=click.get_current_context().meta.get(TRAINING, "any"),
                          lora_ranks=None if ctx.get_parameter_source("lora_ranks") == ParameterSource.DEFAULT
                          else lora_ranks, precision=precision,
                          safety_margin=safety_margin, context_reserve_gib=context_reserve_gib,
                          host_memory_gib=host_memory_gib, calibrations=calibrations, gpu_specs=gpu_specs,
                          dataset=dataset, dataset_options=options, text_field=text_field, ids_field=ids_field,
                          tokenizer=tokenizer, chars_per_token=chars_per_token, allow=allow, padding=padding,
                          alloc_conf=alloc_conf, progress=lambda text: click.echo(text, err=True))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print_result(result, show_all)
    if emit is not None:
        _emit(emit, result, emit_setup, force, [str(w.message) for w in caught], as_json)
    if result.plan is not None and result.plan.recommended is None:  # all too slow for --max-hours, or of the wrong kind
        raise click.exceptions.Exit(EXIT_DOES_NOT_FIT)


# Options that shape a dataset's batching: without --dataset there is nothing for them to act on.
DATASET_ONLY = ("batching_strategy", "global_batch", "pack_length", "too_long")


def _dataset_options(ctx: click.Context) -> DatasetOptions:
    """How the dataset is batched, after the checks of option combinations that click's own types cannot make."""
    params = ctx.params
    if params["dataset"] is None and params["dataset_size"] is None:
        raise click.UsageError("Missing option '--dataset-size' (or --dataset, to plan from its token lengths)")
    check_dataset_options(params)
    if params["dataset"] is not None and params["dataset_size"] is not None:
        raise click.UsageError("--dataset-size is the sample count without --dataset; with one, its rows are counted")
    if params["pack_length"] is not None and params["batching_strategy"] != "pack":
        raise click.UsageError("--pack-length sets packed rows: it needs --batching pack")
    if params["dataset"] is not None and params["padding"] != "max_length":
        raise click.UsageError("--padding is for plans without --dataset; with one, --batching sets the padding")
    given = [f"--{name.replace('_strategy', '').replace('_', '-')}" for name in DATASET_ONLY
             if ctx.get_parameter_source(name) != ParameterSource.DEFAULT]
    if params["dataset"] is None and given:
        raise click.UsageError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} --dataset: without one "
                               "every sample is padded to --seq-len")
    return DatasetOptions(params["batching_strategy"], params["pack_length"], None, params["too_long"],
                          params["global_batch"])


@contextlib.contextmanager
def _nothing_fits_as_json(as_json: bool) -> Iterator[None]:
    """With --json, a plan where nothing fits still prints a document (no recommendation, the reason) for the
    script reading it; the error line and exit status 3 follow as without --json."""
    try:
        yield
    except DoesNotFit as exc:
        if as_json:
            reason = " ".join(str(exc).split())
            click.echo(json.dumps({"recommendation": None, "fits": False, "error": reason}, indent=2))
        raise


@contextlib.contextmanager
def _warnings_kept() -> Iterator[list[warnings.WarningMessage]]:
    """Warnings kept for the emitted README, then shown as ever, in the order they came, even when the plan fails."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield caught
    finally:
        for caught_warning in caught:
            warnings.showwarning(caught_warning.message, caught_warning.category, caught_warning.filename,
                                 caught_warning.lineno)


def _print_result(result: api.PlanResult, show_all: bool) -> None:
    """The plan for people: what it rests on first, then the scaling or the ranked table, then the notes."""
    plan, scaling, failed = result.plan, result.scaling, result.failed
    console = make_console()
    console.print(result.evidence.describe())
    for line in result.headline:
        console.print(f"[bold yellow]warning:[/] {line}")
    if scaling is not None or (plan is not None and plan.request.base.world_size > 1):
        console.print(result.links_text)
    if scaling is not None:
        print_scaling(scaling, console, failed)
    for line in result.dataset_lines:
        console.print(line)
    if plan is not None:
        print_plan(plan, console, failed, show_all)
    for note in result.dataset_plan.notes if result.dataset_plan else ():
        console.print(f"note: {note}")


def _emit(emit: Path, result: api.PlanResult, label: str | None, force: bool, caught: list[str], as_json: bool) -> None:
    """Write the chosen setup's folder, its README carrying every warning the terminal showed."""
    plan = result.plan
    chosen = _emitted_setup(plan, label)
    from ftplan.planner.emit import README, write_configs
    written = write_configs(emit, chosen, plan.request, force, result.dataset_plan,
                            [*result.headline, *advice.warnings_for(plan), *caught])
    click.echo(f"wrote {', '.join(str(p) for p in written)}", err=as_json)
    click.echo(f"use them: `from training_args import training_arguments, data_collator, model_kwargs, prepare_model` in train.py "
               f"(how: {emit / README})", err=as_json)
    click.echo(_rehearse_hint(emit, chosen), err=as_json)


def _rehearse_hint(emit: Path, chosen) -> str:
    """How to verify the folder on the GPU before the full run, and what that costs (rehearse runs one GPU)."""
    from ftplan.planner.rehearse import DEFAULT_STEPS, read_plan, rehearsal_seconds
    if chosen.setting.world_size > 1:
        return (f"`ftplan rehearse` runs one GPU; this plan uses {chosen.setting.world_size}: run the folder's launch "
                "command (README.txt) for a few steps on the cluster before the full run")
    numbers = read_plan(emit)
    if numbers.get("gpu") == CPU:
        return "before the full run, run your train.py from the folder for a few steps on this CPU"
    minutes = rehearsal_seconds(numbers, DEFAULT_STEPS) / 60
    return (f"verify it on the GPU before the full run: `ftplan rehearse {emit}` runs this folder unchanged for "
            f"{DEFAULT_STEPS} steps on the heaviest batches (about {minutes:.1f} GPU-minutes a run; it lowers the "
            "batch and rewrites the folder if it runs out of memory, and grows it while a safe run leaves room"
            + ("; packed rows need TRL installed, as training does" if chosen.setting.padding == "packed" else "") + ")")


def _emitted_setup(plan, label: str | None):
    """The setup --emit writes: the recommendation, or the ranked setup of the --emit-setup label."""
    if plan is None or (label is None and plan.recommended is None):
        raise DoesNotFit("nothing to emit: no setup was recommended")
    if label is None:
        return plan.recommended
    chosen = next((s for s in plan.ranked if s.label == label), None)
    if chosen is None:  # the table's label leaves out the sequence length (and GPU count) its header gives
        short = [s for s in plan.ranked if table_label(s.label, plan.request.base.seq_len) == label]
        chosen = short[0] if len(short) == 1 else None
    if chosen is None:
        raise FtplanError(f"--emit-setup {label!r} is not a ranked setup of this plan; ranked: "
                          f"{', '.join(repr(s.label) for s in plan.ranked) or 'none'}")
    return chosen

