"""The click options that describe a Setting, in one place so predict, eta and plan read them alike."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import click

from ftplan.cli.commands.input_options import FiniteFloat
from ftplan.core.architecture import ALL_LINEAR_TARGETS, Architecture, load_architecture, run_attention
from ftplan.core.errors import FtplanError
from ftplan.core.recipe import check_alloc_conf
from ftplan.core.settings import ATTENTIONS, DEFAULT_SEQ_LEN, PADDINGS, PRECISIONS, ZERO_STAGES, Setting
from ftplan.models.scaling import DEFAULT_GPUS_PER_NODE, fixed_layout, node_layout


def positive_int_list(what: str, maximum: int | None = None):
    """A click callback turning '1,2,4' into positive ints of at most `maximum` (None stays None); `what` names
    them in errors."""
    def parse(_ctx, _param, value: str | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        try:
            numbers = tuple(int(v) for v in value.split(","))
        except ValueError:
            raise click.BadParameter(f"expected comma-separated integers, got '{value}'") from None
        if any(n <= 0 for n in numbers):
            raise click.BadParameter(f"{what} must be positive, got '{value}'")
        if maximum is not None and max(numbers) > maximum:
            raise click.BadParameter(f"{what} must be at most {maximum:,}, got {max(numbers):,}")
        return numbers
    return parse


def parse_targets(_ctx, _param, value: str) -> tuple[str, ...]:
    targets = tuple(t.strip() for t in value.split(",") if t.strip())
    unknown = sorted(set(targets) - set(ALL_LINEAR_TARGETS))
    if not targets or unknown:
        raise click.BadParameter(f"choose comma-separated modules from {','.join(ALL_LINEAR_TARGETS)}, got '{value}'")
    return targets


def on_off_option(name: str, help_text: str):
    """A switch given bare (`--liger`) or with a value (`--liger on`, as `calibrate` and the printed calibrate
    commands spell it), so a flag copied from either command means the same."""
    return click.option(name, type=click.Choice(["on", "off"]), is_flag=False, flag_value="on", default="off",
                        show_default=True, callback=lambda _ctx, _param, value: value == "on",
                        help=f"{help_text} Bare, or on/off.")


MODEL_HELP = "Architecture id (see `ftplan models`), a config.json, or a local Hugging Face model folder."


def checked_architecture(model: str) -> Architecture:
    """The model's architecture (an unknown one fails here, with close names, before any fitting), its config's
    caveats said as warnings: what it is planned as where it differs (a classification head, GPTQ weights)."""
    arch = load_architecture(model)
    for caveat in arch.caveats:
        warnings.warn(caveat, UserWarning, stacklevel=2)
    return arch

SETTING_OPTIONS = (
    click.option("--model", required=True, help=MODEL_HELP),
    click.option("--seq-len", type=click.IntRange(min=1), default=DEFAULT_SEQ_LEN, show_default=True, help="Tokens per sample (padded)."),
    click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True,
                 help="bf16: mixed precision with fp32 weights and optimizer states (Trainer's bf16=True); bf16-pure: "
                      "the model loaded in bf16, 8 bytes a parameter instead of 16 (plain PyTorch, no ZeRO)."),
    click.option("--zero-stage", type=click.Choice([str(s) for s in ZERO_STAGES]), default="0", show_default=True,
                 help="DeepSpeed ZeRO stage; 0 means no DeepSpeed."),
    on_off_option("--offload", "Offload optimizer states to the CPU (needs --zero-stage 1-3)."),
    on_off_option("--liger", "Liger kernels with fused linear cross-entropy."),
    click.option("--lora-rank", type=click.IntRange(min=0), default=0, show_default=True,
                 help="LoRA adapter rank; 0 means full fine-tuning."),
    click.option("--lora-targets", default=",".join(ALL_LINEAR_TARGETS), show_default=True, callback=parse_targets,
                 help="Modules that get LoRA adapters."),
    on_off_option("--gradient-checkpointing",
                  "Recompute activations during backward: far less activation memory, about a third more compute."),
    click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True,
                 help="GPUs in all (as in `ftplan plan`), spread evenly over nodes of at most --gpus-per-node."),
    click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
                 help=f"Most GPUs one node holds; nodes talk over the inter-node link.  [default: {DEFAULT_GPUS_PER_NODE}]"),
    click.option("--nodes", type=click.IntRange(min=1), default=None,
                 help="Spread --gpus evenly over exactly this many nodes instead.  [default: as few as "
                      "--gpus-per-node allows]"),
    click.option("--quantization", type=click.Choice(["", "nf4"]), default="", show_default=True,
                 help="nf4: QLoRA, LoRA on a 4-bit NormalFloat base with double quantization (needs --lora-rank)."),
    click.option("--alloc-conf", default="", callback=lambda _ctx, _param, value: check_alloc_conf(value),
                 help="PYTORCH_CUDA_ALLOC_CONF of the run, e.g. expandable_segments:True."),
    click.option("--padding", type=click.Choice(PADDINGS), default="max_length", show_default=True,
                 help="How the collator shapes batches: max_length/longest pad with a mask (SDPA's masked path), "
                      "none is rows of exactly --seq-len with no mask, packed is flattened rows. Every batch is "
                      "priced at --seq-len: for a dataset's real lengths use `ftplan plan --dataset`."),
    click.option("--attention", type=click.Choice(ATTENTIONS), default=None,
                 help="attn_implementation the model is loaded with.  [default: sdpa; eager where SDPA cannot "
                      "compute the model's attention: Gemma 2's softcapping]"),
)


step_time_cv_option = click.option(
    "--step-time-cv", type=FiniteFloat(0, 10), default=None,
    help="Spread of one GPU's step times (std / mean) on your cluster; every step waits for the slowest of the "
         "ranks.  [default: the calibration records' own spread]")


def setting_options(command: Callable) -> Callable:
    """Add every Setting option to a click command; build the Setting with `setting_from_options`."""
    for option in reversed(SETTING_OPTIONS):
        command = option(command)
    return command


def layout_from_options(gpus: int, gpus_per_node: int | None, nodes: int | None) -> tuple[int, int]:
    """(GPUs per node, nodes) for --gpus in all: over --nodes when given, else nodes of at most
    --gpus-per-node (default 8) filled evenly."""
    if nodes is None:
        return node_layout(gpus, gpus_per_node or DEFAULT_GPUS_PER_NODE)
    per_node, nodes = fixed_layout(gpus, nodes)
    if gpus_per_node is not None and gpus_per_node != per_node:
        raise FtplanError(f"--gpus {gpus} over --nodes {nodes} puts {per_node} GPUs on each node, not "
                          f"--gpus-per-node {gpus_per_node}; give one of the two")
    return per_node, nodes


def setting_from_options(options: dict) -> Setting:
    """The Setting the parsed options describe (raises FtplanError for impossible combinations).
    Setting.gpus is GPUs per node, as in every record; --gpus is GPUs in all."""
    per_node, nodes = layout_from_options(options["gpus"], options["gpus_per_node"], options["nodes"])
    return Setting(model=options["model"], seq_len=options["seq_len"], precision=options["precision"],
                   zero_stage=int(options["zero_stage"]), offload_optimizer=options["offload"], liger=options["liger"],
                   lora_rank=options["lora_rank"], lora_targets=options["lora_targets"],
                   gradient_checkpointing=options["gradient_checkpointing"], gpus=per_node,
                   nodes=nodes, alloc_conf=options["alloc_conf"], padding=options["padding"],
                   attention=run_attention(options["model"], options["attention"]),
                   quantization=options["quantization"])
