"""Read the training setting of a live Hugging Face Trainer run, as ftplan's Setting describes it.

Kept apart from the callback because it is pure inspection of the Trainer's arguments, the model
(PEFT config, Liger patches, checkpointing) and the DeepSpeed config, with no measuring or I/O
beyond writing an unknown model's config next to the records.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ftplan.calibration import measure
from ftplan.core.architecture import (
    ALL_LINEAR_TARGETS,
    EXPERTS_TARGET,
    Architecture,
    available_architectures,
    load_architecture,
)
from ftplan.core.paths import file_name_part


def setting_fields(args, model, arch: Architecture, collator=None) -> dict:
    """Setting fields (all but the sequence length) as this run uses them; collator: the Trainer's data collator,
    whose padding decides the attention mask the batches carry."""
    zero_stage, offload = deepspeed_zero(args)
    lora_rank, lora_targets = lora_setting(model, arch)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", args.world_size))
    return {
        "model": arch.id,
        "precision": _precision(args, model),
        "optimizer": getattr(args.optim, "value", str(args.optim)),
        "zero_stage": zero_stage,
        "offload_optimizer": offload,
        "liger": bool(args.use_liger_kernel) or liger_applied(model),
        "lora_rank": lora_rank,
        "lora_targets": lora_targets,
        "gradient_checkpointing": _checkpointing(args, model),
        "gpus": local,
        "nodes": max(1, int(args.world_size) // local),
        "alloc_conf": measure.alloc_conf(),
        "attention": getattr(model.config, "_attn_implementation", None) or "sdpa",
        **collator_padding(collator),
    }


def collator_padding(collator) -> dict:
    """The recipe's padding fields (core/recipe.py) read from the collator: DataCollatorForSeq2Seq (or WithPadding)
    padding to max_length or to the longest, TRL's padding-free rows packed; anything else (default_data_collator,
    a user's function) is taken as rows of one length, no padding mask. The run was recorded as unpadded and met
    no calibration of the emitted padded recipe."""
    collator = getattr(collator, "data_collator", collator)  # the Trainer's RemoveColumnsCollator wraps the user's
    if getattr(collator, "padding_free", False):
        return {"padding": "packed", "pad_to_multiple_of": 0}
    padding = getattr(collator, "padding", False)
    padding = getattr(padding, "value", padding)  # transformers' PaddingStrategy
    name = "max_length" if padding == "max_length" else "longest" if padding in (True, "longest") else "none"
    multiple = int(getattr(collator, "pad_to_multiple_of", None) or 0) if name != "none" else 0
    return {"padding": name, "pad_to_multiple_of": multiple}


def _precision(args, model) -> str:
    """bf16-pure when the trained weights themselves are bf16 (a model loaded with torch_dtype=bfloat16
    outside DeepSpeed), else the Trainer's mixed-precision flag."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if trainable and not deepspeed_zero(args)[0] and all(str(p.dtype) == "torch.bfloat16" for p in trainable):
        return "bf16-pure"
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def deepspeed_zero(args) -> tuple[int, bool]:
    """ZeRO stage and optimizer offload from the DeepSpeed config the Trainer uses (0, False without one)."""
    config = None
    if getattr(args, "hf_deepspeed_config", None) is not None:
        config = args.hf_deepspeed_config.config
    elif getattr(args, "deepspeed_plugin", None) is not None:
        config = args.deepspeed_plugin.deepspeed_config
    elif isinstance(args.deepspeed, dict):
        config = args.deepspeed
    elif args.deepspeed:
        config = json.loads(Path(args.deepspeed).read_text())
    zero = (config or {}).get("zero_optimization", {})
    stage = int(zero.get("stage", 0)) if config else 0
    offload = (zero.get("offload_optimizer") or {}).get("device", "none") in ("cpu", "nvme")
    return stage, offload and stage > 0


def lora_setting(model, arch: Architecture) -> tuple[int, tuple[str, ...]]:
    """LoRA rank and targets as the calibrations write them: LoRA on every linear (and an MoE's experts) is the
    default targets, whatever names PEFT expanded `all-linear` to (Phi-3's fused qkv_proj, Qwen2-MoE's shared
    expert), so the run meets the records of its setting."""
    rank, targets = _lora(model)
    if rank and arch.resolve_lora_targets(targets) == arch.all_linear_targets():
        return rank, ALL_LINEAR_TARGETS
    return rank, targets


def _lora(model) -> tuple[int, tuple[str, ...]]:
    """LoRA rank and adapted module names (short names, in ftplan's order); (0, all-linear) for full fine-tuning.
    Parameters PEFT adapts in place (target_parameters: an MoE's router and fused experts) read as EXPERTS_TARGET."""
    config = (getattr(model, "peft_config", None) or {}).get("default")
    if config is None or not getattr(config, "r", 0):
        return 0, ALL_LINEAR_TARGETS
    targets = config.target_modules
    if targets is None or targets == "all-linear":
        return config.r, ALL_LINEAR_TARGETS
    names = {t.rsplit(".", 1)[-1] for t in ([targets] if isinstance(targets, str) else targets)}
    ordered = tuple(t for t in ALL_LINEAR_TARGETS if t in names) + tuple(sorted(names - set(ALL_LINEAR_TARGETS)))
    return config.r, ordered + ((EXPERTS_TARGET,) if getattr(config, "target_parameters", None) else ())


def _checkpointing(args, model) -> bool:
    """Activation checkpointing asked of the Trainer, or enabled on the model by hand."""
    asked = getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", False)
    return bool(asked) or any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def liger_applied(model) -> bool:
    """Liger applied by hand (apply_liger_kernel_to_*): some module or forward now comes from liger_kernel."""
    return any(type(m).__module__.startswith("liger_kernel")
               or getattr(m.forward, "__module__", "").startswith("liger_kernel") for m in model.modules())


def run_architecture(model, config_dir: Path) -> Architecture:
    """The shipped architecture with the same shape, else the model's config written to config_dir."""
    config = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_")}
    candidate = Architecture(id="", config=config)
    for arch_id in available_architectures():
        shipped = load_architecture(arch_id)
        if shipped.shape == candidate.shape:
            return shipped
    path = (config_dir / f"ftplan-{file_name_part(config.get('model_type'))}-{candidate.hash}.json").resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
    arch = load_architecture(str(path))
    return Architecture(id=str(path), config=arch.config)
