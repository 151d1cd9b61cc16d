"""A training setting: everything except the micro-batch that changes memory or speed.

One frozen dataclass that serialises into every record, so fits, planner and calibration agree on
what "the same setting" means.
"""

from __future__ import annotations

import hashlib
import json
import numbers
from dataclasses import dataclass, fields, replace

from ftplan.core.architecture import ALL_LINEAR_TARGETS
from ftplan.core.errors import FtplanError

# bf16: mixed precision with fp32 weights and optimizer states (Trainer's bf16=True on an fp32 model,
# or DeepSpeed's fp32 master copy); bf16-pure: the model loaded in bf16 (`torch_dtype=torch.bfloat16`)
# and trained as is, so weights, gradients and AdamW moments are all bf16 (no master copy).
PRECISIONS = ("bf16", "bf16-pure", "fp16", "fp32")
# How the collator shapes a micro-batch, which decides the attention path (see ftplan/core/recipe.py):
# none: rows of exactly seq_len and no padding (no mask reaches attention; the trial's rows before recipes);
# max_length / longest: DataCollatorForSeq2Seq padding, whose padding mask sends SDPA down the masked path;
# packed: TRL's padding-free collation, one flattened row whose position_ids mark the samples, padded to whole
# packed rows (SFTConfig pad_to_multiple_of, so a micro-batch's shape repeats).
PADDINGS = ("none", "max_length", "longest", "packed")
DEFAULT_SEQ_LEN = 2048  # tokens per sample where none is said (plan, predict, the API)
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")
ZERO_STAGES = (0, 1, 2, 3)
MAX_GPUS = 2**20  # GPUs in one run: ten times the largest training clusters of 2026
MAX_TRIAL_BATCH = 2**20  # rows a micro-batch any trial or rehearsal runs: 10^20 built a row list until the timeout
MAX_TRIAL_SEQ_LEN = 2**24  # tokens a sample, past every model's context
INTEGER_FIELDS = ("seq_len", "zero_stage", "lora_rank", "gpus", "nodes", "pad_to_multiple_of")
SWITCH_FIELDS = ("offload_optimizer", "liger", "gradient_checkpointing")  # True or False, never "no" (truthy)
# "" keeps the frozen base in the compute dtype; "nf4" is QLoRA's 4-bit NormalFloat base with double
# quantization (bitsandbytes, as `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
# bnb_4bit_use_double_quant=True)` loads it).
QUANTIZATIONS = ("", "nf4")
# Fields added after records were first written: at their default they stay out of key(), so every old
# record (which measured exactly that default) keeps its setting key and resumes as before.
KEYLESS_DEFAULTS = {"attention": "sdpa", "padding": "none", "pad_to_multiple_of": 0, "quantization": ""}


@dataclass(frozen=True)
class Setting:
    """How a model is fine-tuned. zero_stage 0 means no DeepSpeed; lora_rank 0 means full fine-tuning."""

    model: str
    seq_len: int = DEFAULT_SEQ_LEN
    precision: str = "bf16"
    optimizer: str = "adamw_torch"
    zero_stage: int = 0
    offload_optimizer: bool = False
    liger: bool = False
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ALL_LINEAR_TARGETS
    gradient_checkpointing: bool = False
    gpus: int = 1
    nodes: int = 1
    alloc_conf: str = ""
    attention: str = "sdpa"
    padding: str = "none"
    pad_to_multiple_of: int = 0
    quantization: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        for name in INTEGER_FIELDS:  # the Python API passes what a notebook typed: 2048.5 would plan as a length
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise FtplanError(f"{name} must be a whole number, got {value!r}")
        for name in SWITCH_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise FtplanError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.seq_len <= 0:
            raise FtplanError(f"sequence length must be positive, got {self.seq_len}")
        if self.precision not in PRECISIONS:
            raise FtplanError(f"precision must be one of {', '.join(PRECISIONS)}, got '{self.precision}'")
        if self.zero_stage not in ZERO_STAGES:
            raise FtplanError(f"ZeRO stage must be 0-3, got {self.zero_stage}")
        if self.precision == "bf16-pure" and self.zero_stage:
            raise FtplanError("bf16-pure is plain PyTorch training of a bf16 model; DeepSpeed keeps an fp32 master copy (use bf16)")
        if self.offload_optimizer and self.zero_stage == 0:
            raise FtplanError("optimizer offload needs DeepSpeed ZeRO (stage 1-3)")
        if self.lora_rank < 0:
            raise FtplanError(f"LoRA rank must be >= 0, got {self.lora_rank}")
        if self.padding not in PADDINGS:
            raise FtplanError(f"padding must be one of {', '.join(PADDINGS)}, got '{self.padding}'")
        if self.attention not in ATTENTIONS:
            raise FtplanError(f"attention must be one of {', '.join(ATTENTIONS)}, got '{self.attention}'")
        if self.pad_to_multiple_of < 0:
            raise FtplanError(f"pad_to_multiple_of must be >= 0, got {self.pad_to_multiple_of}")
        if self.quantization not in QUANTIZATIONS:
            raise FtplanError(f"quantization must be one of {', '.join(map(repr, QUANTIZATIONS))}, got {self.quantization!r}")
        if self.quantization and (not self.lora_rank or self.uses_deepspeed or self.precision not in ("bf16", "fp16")):
            raise FtplanError("a 4-bit (nf4) base is QLoRA: it needs LoRA (--lora-rank), no DeepSpeed, and bf16 or fp16")
        if self.gpus <= 0 or self.nodes <= 0:
            raise FtplanError(f"GPU and node counts must be positive, got gpus={self.gpus} nodes={self.nodes}")
        if self.gpus * self.nodes > MAX_GPUS:
            raise FtplanError(f"{self.gpus * self.nodes:,} GPUs is more than any cluster ({MAX_GPUS:,} at most)")
        if not isinstance(self.alloc_conf, str):  # None read as another recipe than the default ''
            raise FtplanError(f"alloc_conf must be text ('' for PyTorch's default), got {self.alloc_conf!r}")
        repeated = sorted({t for t in self.lora_targets if self.lora_targets.count(t) > 1})
        if repeated:  # stored twice, the same adapters read as another recipe
            raise FtplanError(f"LoRA targets name {', '.join(repeated)} more than once")

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    @property
    def masked(self) -> bool:
        """Whether attention gets a mask: padded batches carry one, and transformers builds a block mask from a
        packed row's position_ids for SDPA and eager (flash-attention 2 runs packed rows as varlen, unmasked)."""
        if self.padding == "packed":
            return self.attention != "flash_attention_2"
        return self.padding != "none"

    @property
    def trl_lm_head(self) -> bool:
        """Whether the loss is TRL's fused LM head: packing runs through TRL's SFTTrainer, which (trl 1.16)
        patches the model to score labels in tiles (trl.trainer.utils.add_fused_lm_head) and never builds the
        fp32 logits; backward recomputes each tile. Liger's own fused loss is off there (TRL turns it off)."""
        return self.padding == "packed"

    @property
    def uses_deepspeed(self) -> bool:
        return self.zero_stage > 0

    def to_dict(self) -> dict:
        """The fields by name, lora_targets as a list. Not dataclasses.asdict: every field is a scalar or a tuple
        of strings, so its deep copy bought nothing, and a plan turns hundreds of settings into dicts."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["lora_targets"] = list(self.lora_targets)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Setting:
        """Build from a record or JSON; keys that are not setting fields are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def key(self) -> str:
        """Stable id of the setting, used to group records and to resume calibrations."""
        data = {k: v for k, v in self.to_dict().items() if not (k in KEYLESS_DEFAULTS and v == KEYLESS_DEFAULTS[k])}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def label(self) -> str:
        """Short human-readable name, e.g. 'zero2+offload liger lora16 gc s2048'."""
        parts = [f"zero{self.zero_stage}" + ("+offload" if self.offload_optimizer else "") if self.zero_stage else "ddp"]
        parts.append("liger" if self.liger else "")
        parts.append(f"{'q' if self.quantization else ''}lora{self.lora_rank}" if self.lora_rank else "full")
        parts.append("gc" if self.gradient_checkpointing else "")
        parts.append(f"s{self.seq_len}")
        parts.append(self.precision if self.precision != "bf16" else "")
        parts.append({"max_length": "padded", "longest": "dynpad", "packed": "packed"}.get(self.padding, ""))
        parts.append(self.attention if self.attention != "sdpa" else "")
        if self.world_size > 1:
            parts.append(f"{self.nodes}x{self.gpus}gpu" if self.nodes > 1 else f"{self.gpus}gpu")  # nodes × GPUs, as tables
        return " ".join(p for p in parts if p)

    def full_label(self) -> str:
        """label(), plus the recipe it omits where it differs from the defaults (optimizer, LoRA targets,
        allocator), so two calibrated setups never read alike."""
        default = Setting(model=self.model)
        extras = [self.optimizer] if self.optimizer != default.optimizer else []
        if self.lora_rank and self.lora_targets != default.lora_targets:
            extras.append("on " + "+".join(t.removesuffix("_proj") for t in self.lora_targets))
        extras += [self.alloc_conf.replace(":True", "")] if self.alloc_conf else []
        return " ".join([self.label(), *extras])

    def with_(self, **changes) -> Setting:
        return replace(self, **changes)
