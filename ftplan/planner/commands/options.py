"""The click options that describe a Setting, in one place so predict, eta and plan read them alike."""

from __future__ import annotations

from collections.abc import Callable

import click

from ftplan.core.architecture import ALL_LINEAR_TARGETS
from ftplan.core.settings import PRECISIONS, ZERO_STAGES, Setting


def positive_int_list(what: str):
    """A click callback turning '1,2,4' into positive ints (None stays None); `what` names them in errors."""
    def parse(_ctx, _param, value: str | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        try:
            numbers = tuple(int(v) for v in value.split(","))
        except ValueError:
            raise click.BadParameter(f"expected comma-separated integers, got '{value}'") from None
        if any(n <= 0 for n in numbers):
            raise click.BadParameter(f"{what} must be positive, got '{value}'")
        return numbers
    return parse


def parse_targets(_ctx, _param, value: str) -> tuple[str, ...]:
    targets = tuple(t.strip() for t in value.split(",") if t.strip())
    unknown = sorted(set(targets) - set(ALL_LINEAR_TARGETS))
    if not targets or unknown:
        raise click.BadParameter(f"choose comma-separated modules from {','.join(ALL_LINEAR_TARGETS)}, got '{value}'")
    return targets


SETTING_OPTIONS = (
    click.option("--model", required=True,
                 help="Architecture id (see `ftplan models`), a config.json, or a local Hugging Face model folder."),
    click.option("--seq-len", type=click.IntRange(min=1), default=2048, show_default=True, help="Tokens per sample (padded)."),
    click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True,
                 help="bf16: mixed precision with fp32 weights and optimizer states (Trainer's bf16=True); bf16-pure: "
                      "the model loaded in bf16, 8 bytes a parameter instead of 16 (plain PyTorch, no ZeRO)."),
    click.option("--zero-stage", type=click.Choice([str(s) for s in ZERO_STAGES]), default="0", show_default=True,
                 help="DeepSpeed ZeRO stage; 0 means no DeepSpeed."),
    click.option("--offload", is_flag=True, help="Offload optimizer states to the CPU (needs --zero-stage 1-3)."),
    click.option("--liger", is_flag=True, help="Liger kernels with fused linear cross-entropy."),
    click.option("--lora-rank", type=click.IntRange(min=0), default=0, show_default=True,
                 help="LoRA adapter rank; 0 means full fine-tuning."),
    click.option("--lora-targets", default=",".join(ALL_LINEAR_TARGETS), show_default=True, callback=parse_targets,
                 help="Modules that get LoRA adapters."),
    click.option("--gradient-checkpointing", is_flag=True,
                 help="Recompute activations during backward: far less activation memory, about a third more compute."),
    click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True, help="GPUs per node."),
    click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Nodes of --gpus GPUs each; nodes talk over the inter-node link."),
    click.option("--alloc-conf", default="", help="PYTORCH_CUDA_ALLOC_CONF of the run, e.g. expandable_segments:True."),
)


def setting_options(command: Callable) -> Callable:
    """Add every Setting option to a click command; build the Setting with `setting_from_options`."""
    for option in reversed(SETTING_OPTIONS):
        command = option(command)
    return command


def setting_from_options(options: dict) -> Setting:
    """The Setting the parsed options describe (raises FtplanError for impossible combinations)."""
    return Setting(model=options["model"], seq_len=options["seq_len"], precision=options["precision"],
                   zero_stage=int(options["zero_stage"]), offload_optimizer=options["offload"], liger=options["liger"],
                   lora_rank=options["lora_rank"], lora_targets=options["lora_targets"],
                   gradient_checkpointing=options["gradient_checkpointing"], gpus=options["gpus"],
                   nodes=options["nodes"], alloc_conf=options["alloc_conf"])
