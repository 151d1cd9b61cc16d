"""The recipe: what a training run is made of beyond its batch, written once for the trial and for `--emit`.

A calibration trial and the emitted training_args.py build the run from these same dictionaries, so a
record describes exactly what the emitted config does: Trainer arguments, the collator (padding, its
side, pad-to-multiple, hence the attention mask the batches carry), the model's dtype and attention
implementation, and PYTORCH_CUDA_ALLOC_CONF. No torch here: the planner writes them as text.
"""

from __future__ import annotations

import re
import shlex

from ftplan.core.architecture import ALL_LINEAR_TARGETS, cached_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.settings import Setting

PADDING_SIDE = "right"  # causal-LM training pads on the right: the loss ignores the padded tail (-100 labels)
# The trial's and the emitted collator's padding argument per recipe padding (packed rows are flattened instead).
# "none": rows of exactly seq_len (run_clm-style chunks) pad nothing at max_length, so no mask reaches attention.
COLLATOR_PADDING = {"max_length": "max_length", "longest": "longest", "none": "max_length"}


def trainer_arguments(setting: Setting) -> dict:
    """TrainingArguments keys that change memory or time: precision, optimizer, checkpointing, Liger.

    The checkpointing keys carry transformers' older names; training_args.py renames them to the installed
    version's (activation_checkpointing since 5.2x), so neither the trial nor the user sees a deprecated key.
    """
    args = {
        "optim": setting.optimizer,
        "bf16": setting.precision in ("bf16", "bf16-pure"),
        "fp16": setting.precision == "fp16",
        "gradient_checkpointing": setting.gradient_checkpointing,
        "use_liger_kernel": setting.liger,
    }
    if setting.gradient_checkpointing:
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    return args


def current_names(kwargs: dict, arguments_class) -> dict:
    """The checkpointing keys under the installed transformers' names (activation_checkpointing in newer 5.x).

    Self-contained: training_args.py carries this function's source, so the user's run renames as the trial does.
    """
    import inspect

    known = inspect.signature(arguments_class).parameters
    renamed = dict(kwargs)
    for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                     ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
        if old in renamed and new in known:
            renamed[new] = renamed.pop(old)
    return renamed


def collator_arguments(setting: Setting, length: int) -> dict:
    """DataCollatorForSeq2Seq's keyword arguments for the recipe's padding, at the planned padded length."""
    args: dict = {"padding": COLLATOR_PADDING.get(setting.padding, "longest")}
    if args["padding"] == "max_length":
        args["max_length"] = length
    if setting.pad_to_multiple_of:
        args["pad_to_multiple_of"] = setting.pad_to_multiple_of
    return args


def model_arguments(setting: Setting) -> dict:
    """from_pretrained / from_config keywords: the weights' dtype and the attention implementation.

    Full fine-tuning under bf16 mixed precision keeps fp32 weights (the Trainer autocasts); a LoRA base is
    frozen in bf16; bf16-pure loads everything in bf16, as `dtype=torch.bfloat16` does.
    """
    half = setting.precision == "bf16-pure" or (setting.lora_rank > 0 and setting.precision in ("bf16", "fp16"))
    dtype = ("float16" if setting.precision == "fp16" else "bfloat16") if half else "float32"
    return {"dtype": dtype, "attn_implementation": setting.attention}


def lora_arguments(setting: Setting) -> dict | None:
    """peft.LoraConfig keywords, or None for full fine-tuning; every linear of the decoder is written
    "all-linear", as users write it (PEFT then adds an MoE's fused experts itself)."""
    if not setting.lora_rank:
        return None
    from ftplan.core.architecture import load_architecture

    arch = load_architecture(setting.model)
    every = arch.resolve_lora_targets(setting.lora_targets) == arch.all_linear_targets()
    return {"r": setting.lora_rank, "lora_alpha": 2 * setting.lora_rank,
            "target_modules": "all-linear" if every else list(setting.lora_targets), "task_type": "CAUSAL_LM"}


def quantization_arguments(setting: Setting) -> dict | None:
    """transformers.BitsAndBytesConfig keywords of a QLoRA base (NF4, double quantization), or None.

    The trial quantizes its random-weight layers in place to the same Linear4bit (trial.quantize_to_nf4):
    from_config takes no quantization_config.
    """
    if setting.quantization != "nf4":
        return None
    compute = "float16" if setting.precision == "fp16" else "bfloat16"
    return {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": compute}


def differences(emitted: Setting, calibrated: Setting) -> list[str]:
    """The recipe fields in which an emitted run differs from a calibrated one, in words (empty: the same run)."""
    names = {"padding": "collator padding", "attention": "attention implementation", "alloc_conf":
             "PYTORCH_CUDA_ALLOC_CONF", "pad_to_multiple_of": "pad_to_multiple_of", "optimizer": "optimizer"}
    return [f"{names[field]} {getattr(calibrated, field)!r} calibrated, {getattr(emitted, field)!r} emitted"
            for field in names if getattr(emitted, field) != getattr(calibrated, field)]


# PyTorch's caching-allocator options (CUDA semantics, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF").
ALLOC_CONF_KEYS = ("backend", "max_split_size_mb", "roundup_power2_divisions", "max_non_split_rounding_mb",
                   "garbage_collection_threshold", "expandable_segments", "pinned_use_cuda_host_register",
                   "pinned_num_register_threads", "pinned_use_background_threads", "release_lock_on_cudamalloc")
_ALLOC_CONF_VALUE = re.compile(r"[A-Za-z0-9_.]+|\[[0-9:,]+\]")


def check_alloc_conf(text: str) -> str:
    """The PYTORCH_CUDA_ALLOC_CONF text, refused unless it is key:value pairs PyTorch knows: it reaches the emitted
    README's shell line and a record's setting, and PyTorch itself only objects once CUDA starts."""
    if not text:
        return text
    seen: set[str] = set()
    for pair in re.split(r",(?![^\[]*\])", text):  # roundup_power2_divisions:[256:1,512:2] keeps its list
        key, _, value = pair.partition(":")
        if key.strip() not in ALLOC_CONF_KEYS or not _ALLOC_CONF_VALUE.fullmatch(value.strip()):
            raise FtplanError(f"PYTORCH_CUDA_ALLOC_CONF {text!r}: {pair!r} is not key:value with a key among "
                              f"{', '.join(ALLOC_CONF_KEYS)} (e.g. expandable_segments:True)")
        if key.strip() in seen:  # PyTorch keeps the last, the record's setting would name both
            raise FtplanError(f"PYTORCH_CUDA_ALLOC_CONF {text!r} sets {key.strip()} twice")
        seen.add(key.strip())
        allowed = ALLOC_CONF_VALUES.get(key.strip())
        if allowed is not None and not allowed[0](value.strip()):
            raise FtplanError(f"PYTORCH_CUDA_ALLOC_CONF {text!r}: {key.strip()} takes {allowed[1]}, got {value.strip()!r}")
    return text


def _number(text: str, low: float, high: float) -> bool:
    try:
        return low < float(text) < high
    except ValueError:
        return False


# What PyTorch's allocator accepts for each key (c10/core/AllocatorConfig.cpp): a value it refuses stops the run when
# CUDA starts, after the plan was made for it ('expandable_segments:maybe' was planned, labelled and emitted).
_SWITCH = (lambda v: v in ("True", "False"), "True or False")
ALLOC_CONF_VALUES = {
    "expandable_segments": _SWITCH, "release_lock_on_cudamalloc": _SWITCH, "pinned_use_cuda_host_register": _SWITCH,
    "pinned_use_background_threads": _SWITCH,
    "backend": (lambda v: v in ("native", "cudaMallocAsync"), "native or cudaMallocAsync"),
    "max_split_size_mb": (lambda v: v.isdigit() and int(v) >= 20, "a whole number of MB, at least 20"),
    "max_non_split_rounding_mb": (str.isdigit, "a whole number of MB"),
    "garbage_collection_threshold": (lambda v: _number(v, 0.0, 1.0), "a fraction between 0 and 1"),
    "pinned_num_register_threads": (lambda v: v.isdigit() and int(v) in (1, 2, 4, 8, 16, 32, 64, 128),
                                    "a power of 2 up to 128"),
}


def calibrate_command(setting: Setting, on_cpu: bool = False) -> str:
    """The `ftplan calibrate` line that measures this setting's recipe on the card it runs on (or this CPU), on
    one node of its GPUs."""
    default = Setting(model=setting.model)
    flags = [f"--model {setting.model}", f"--seq-len {setting.seq_len}"] + (["--device cpu"] if on_cpu else [])
    flags += [f"--zero-stage {setting.zero_stage}"] if setting.zero_stage else []
    flags += ["--offload on"] if setting.offload_optimizer else []
    flags += ["--liger on"] if setting.liger else []
    flags += ["--gradient-checkpointing on"] if setting.gradient_checkpointing else []
    flags += [f"--lora-rank {setting.lora_rank}"] if setting.lora_rank else []
    flags += ([f"--lora-targets {','.join(setting.lora_targets)}"]
              if setting.lora_rank and setting.lora_targets != ALL_LINEAR_TARGETS else [])
    flags += [f"--quantization {setting.quantization}"] if setting.quantization else []
    flags += [f"--precision {setting.precision}"] if setting.precision != default.precision else []
    flags += [f"--optimizer {setting.optimizer}"] if setting.optimizer != default.optimizer else []
    flags += [f"--padding {setting.padding}"] if setting.padding != "packed" else []
    flags += [f"--attention {setting.attention}"] if (setting.attention
                                                      != cached_architecture(setting.model).default_attention) else []
    flags += [f"--alloc-conf {shlex.quote(setting.alloc_conf)}"] if setting.alloc_conf else []
    # one node's GPUs: calibrate runs on one host, and plans model the link between nodes
    flags += [f"--gpus {setting.gpus}"] if setting.gpus > 1 else []
    return "ftplan calibrate " + " ".join(flags)
