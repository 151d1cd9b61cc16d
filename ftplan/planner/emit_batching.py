"""What the planned batching asks of a Hugging Face training script: the collator, the sampler, the length
limit and the micro-batch × accumulation split, written as `training_args.py` beside training_args.json.

TrainingArguments cannot carry a collator or a tokenizer's truncation, yet they decide the padded shape
the plan's memory rests on, so the script builds both: dynamic padding and group_by_length pad each
micro-batch to its own longest sample (DataCollatorForSeq2Seq, which pads labels with -100), pad pads
every sample to the planned length, and packing is TRL's best-fit decreasing (`packing_strategy="bfd"`),
the packing ftplan.models.batching.pack_rows models.
"""

from __future__ import annotations

import inspect
import pprint
import textwrap
from dataclasses import dataclass

from ftplan.core import recipe
from ftplan.core.settings import Setting
from ftplan.planner.dataset_plan import ALLOC_CONF_DOC, DatasetPlan
from ftplan.planner.search import PlanRequest, SetupPlan

# Why packing pads the flattened micro-batch to whole rows: SDPA's masked kernel on Hopper (cuDNN, torch 2.11)
# builds an execution plan on the host for every new shape, 4-7 ms per layer call
# (benchmarks/gpu/results/packed_profile_h100.txt), and TRL's padding-free rows flatten to a new length nearly every
# step; padded to whole rows, a micro-batch takes one of at most micro-batch shapes, and a full one is exactly the
# micro-batch x row length the plan was made for (H100: 0.372 s a step before, 0.210 after).
PACKED_SHAPE_WHY = ("pad_to_multiple_of: each micro-batch flattens to whole rows of max_length tokens (the padding "
                    "trains nothing), so it takes the shape the plan is for, and SDPA's kernel plans (built on the "
                    "host per new shape) are reused instead of rebuilt every step.")

# transformers 5 names Trainer's length-grouped sampler this way; 4.x took group_by_length=True instead.
GROUP_BY_LENGTH = {"train_sampling_strategy": "group_by_length"}


@dataclass(frozen=True)
class PlannedBatch:
    """The batching the plan rests on: micro-batch × accumulation, strategy, padded (or row) length, limit."""

    micro_batch: int
    accumulation: int
    strategy: str        # pad, dynamic, group or pack (ftplan.models.batching.STRATEGIES)
    length: int          # the longest micro-batch's padded length: the sample length padded to, or the packed row
    limit: int | None    # samples over it are truncated or dropped; None when no sample of the dataset is over
    too_long: str
    from_dataset: bool
    alloc_conf: str = ""  # PYTORCH_CUDA_ALLOC_CONF of the planned recipe: what its predictions were made for
    setting: Setting | None = None  # the planned recipe (collator padding, attention, dtype)
    global_batch: int | None = None  # the global batch the user asked for (--global-batch); None: the plan's own
    largest_fitting: int = 0  # the largest micro-batch the plan found safe (the planned one may be faster and smaller)


def planned_batch(setup: SetupPlan, request: PlanRequest, dataset: DatasetPlan | None) -> PlannedBatch:
    """The setup's batching: the dataset plan's choice for it, or without a dataset, samples truncated and padded
    to --seq-len at the largest safe batch (what a plan from a sample count assumes: the collator pads a longer
    sample to its own length, not down to the plan's)."""
    choice = dataset.setups.get(setup.setting) if dataset is not None else None
    if choice is None:
        return PlannedBatch(setup.batch, 1, "pad", request.base.seq_len, request.base.seq_len, "truncate", False,
                            setup.setting.alloc_conf, setup.setting, largest_fitting=setup.batch)
    limited, strategy = dataset.limited, dataset.options.strategy
    return PlannedBatch(choice.micro_batch, choice.accumulation, strategy, choice.batching.memory_length,
                        limited.limit if limited.over else None, limited.too_long, True,
                        setup.setting.alloc_conf, setup.setting, dataset.options.global_batch, choice.largest_fitting)


def sampler_args(batch: PlannedBatch) -> dict:
    """TrainingArguments keys the batching sets besides the batch split: the length-grouped sampler for group."""
    return dict(GROUP_BY_LENGTH) if batch.strategy == "group" else {}


def collator_code(batch: PlannedBatch) -> tuple[str, str]:
    """(the expression that builds the collator from `tokenizer`, a comment saying what it does)."""
    if batch.strategy == "pack":
        return "None", (f"SFTTrainer packs whole samples into rows of {batch.length:,} tokens (best-fit decreasing) "
                        "and collates them without padding")
    arguments = ", ".join(f"{k}={v!r}" for k, v in recipe.collator_arguments(batch.setting, batch.length).items())
    code = f"DataCollatorForSeq2Seq(tokenizer, {arguments})"
    if batch.strategy == "pad":
        return code, f"every sample padded to {batch.length:,} tokens, the length the plan's memory and time assume"
    grouped = "; the sampler groups samples of similar length" if batch.strategy == "group" else ""
    return code, f"each micro-batch padded to its own longest sample (at most {batch.length:,} tokens){grouped}"


def length_limit_comment(batch: PlannedBatch) -> list[str]:
    """How to apply the plan's length limit when tokenizing: the collator never truncates (TRL's packing does)."""
    if batch.limit is None:
        return []
    if batch.too_long == "truncate" and batch.strategy == "pack":
        return [f"# SFTConfig(max_length={batch.limit}) truncates longer samples as it packs (best-fit decreasing), "
                "as the plan did."]
    if batch.too_long == "truncate":
        done = "the plan truncated longer samples" if batch.from_dataset else "the plan is for samples no longer"
        return [f"# Tokenize with truncation=True, max_length={batch.limit}: {done}."]
    tokenized = (" (SFTTrainer tokenizes text itself: tokenize first, or filter on the tokenizer's count of "
                 "s['text'])") if batch.strategy == "pack" else ""
    return [(f"# Drop samples over {batch.limit} tokens, as the plan did{tokenized}: "
             f"train = train.filter(lambda s: len(s['input_ids']) <= {batch.limit})")]


def alloc_conf_lines(batch: PlannedBatch) -> list[str]:
    """training_args.py's PYTORCH_CUDA_ALLOC_CONF, set before anything imports transformers.

    PyTorch reads the variable once, when CUDA starts in the process (the first tensor put on the GPU), so
    setting it here works only when train.py imports this module before that; README.txt's export works anyway.
    setdefault keeps a value the user exported.
    """
    return ["import os",
            "import warnings",
            "",
            "# The caching allocator's configuration the plan's memory was predicted (and calibrated) under; another",
            f"# one changes reserved memory, which decides an OOM ({ALLOC_CONF_DOC}).",
            "# PyTorch reads it once, when CUDA starts: import this module in train.py before anything is put on the GPU.",
            f"ALLOC_CONF = {batch.alloc_conf!r}",
            "if ALLOC_CONF:",
            '    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)',
            'if os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") != ALLOC_CONF:',
            '    warnings.warn(f"PYTORCH_CUDA_ALLOC_CONF is {os.environ[\'PYTORCH_CUDA_ALLOC_CONF\']!r}; the plan was made '
            'for {ALLOC_CONF!r}", stacklevel=2)',
            ""]


def _docstring_lines(packing: bool) -> list[str]:
    """The emitted module's docstring: the lines a train.py needs, so nobody must read the rest."""
    return [
        '"""Written by `ftplan plan` (the plan is PLAN below); use it from a train.py:',
        "",
        "    from training_args import training_arguments, data_collator, model_kwargs, prepare_model",
        "    model = prepare_model(AutoModelForCausalLM.from_pretrained(MODEL, **model_kwargs()))",
        *([("    trainer = SFTTrainer(model=model, args=training_arguments(), train_dataset=train, "
            "processing_class=tokenizer)")] if packing else
          ["    trainer = Trainer(model=model, args=training_arguments(), train_dataset=train,",
           "                      data_collator=data_collator(tokenizer))"]),
        "",
        ("SFTTrainer tokenizes and labels the samples; " if packing else
         "Samples hold input_ids and labels (labels = input_ids, -100 on the prompt); ")
        + "paths are relative to this file.",
        "README.txt beside it has the launch command (and the LoRA and Liger lines, where planned).",
        '"""',
    ]


def _constant_lines(kwargs: dict, batch: PlannedBatch, headline: str, packing: bool) -> list[str]:
    """Imports and the planned figures as module constants, where a reader of train.py can see them."""
    return [
        *alloc_conf_lines(batch),
        *(["import inspect"] if batch.strategy == "group" else []),
        "from pathlib import Path",
        "",
        f"from transformers import {'' if packing else 'DataCollatorForSeq2Seq, '}TrainingArguments",
        "",
        "HERE = Path(__file__).resolve().parent",
        f"PLAN = {headline!r}  # a repr: names from the user's files can hold quotes and newlines",
        (f"# micro-batch {batch.micro_batch} x gradient accumulation {batch.accumulation} per GPU; "
         f"{'packed rows' if packing else 'samples'} of at most {batch.length:,} tokens"),
        f"TRAINING_ARGS = {pprint.pformat(kwargs, sort_dicts=False, width=100)}",
        *length_limit_comment(batch),
    ]


def _training_arguments_lines(batch: PlannedBatch, packing: bool) -> list[str]:
    """training_arguments(): the paths made absolute, and the names the installed transformers (or TRL) takes."""
    lines = [
        "def training_arguments(**overrides):",
        '    """The planned arguments; overrides change any of them (report_to="wandb", say)."""',
        "    kwargs = {**TRAINING_ARGS, **overrides}",
        '    for key in ("output_dir", "deepspeed"):',
        "        if isinstance(kwargs.get(key), str):",
        "            kwargs[key] = str(HERE / kwargs[key])",
    ]
    if batch.strategy == "group":
        lines += ['    if "train_sampling_strategy" not in inspect.signature(TrainingArguments).parameters:  # 4.x',
                  '        kwargs["group_by_length"] = kwargs.pop("train_sampling_strategy") == "group_by_length"']
    if packing:
        return lines + ["    from trl import SFTConfig  # packing is TRL's (pip install trl)",
                        "",
                        *(f"    # {line}" for line in textwrap.wrap(PACKED_SHAPE_WHY, 100)),
                        f'    return SFTConfig(**current_names(kwargs, SFTConfig), max_length={batch.length}, '
                        f'packing=True, packing_strategy="bfd", pad_to_multiple_of={batch.length})']
    return lines + ["    return TrainingArguments(**current_names(kwargs, TrainingArguments))"]


def _data_collator_lines(batch: PlannedBatch) -> list[str]:
    """data_collator(tokenizer): the padded shape the planned memory rests on, with why in a comment."""
    collator, why = collator_code(batch)
    pad_token = [] if batch.strategy == "pack" else [
        "    if tokenizer.pad_token is None:  # Llama 3's and others' tokenizers have none; padding needs one, and the",
        "        tokenizer.pad_token = tokenizer.eos_token  # padded positions are masked and labelled -100 anyway",
        "    if tokenizer.pad_token is None:  # else the first batch fails inside the Trainer, after the model loads",
        "        raise ValueError(\"the tokenizer has neither a pad nor an eos token: set tokenizer.pad_token first\")"]
    return ["def data_collator(tokenizer):",
            '    """The collator of the planned batching: the padded shape the planned memory rests on."""',
            *(f"    # {line}" for line in textwrap.wrap(f"{why}.", 100)),
            *pad_token,
            f"    return {collator}"]


def training_args_py(kwargs: dict, batch: PlannedBatch, headline: str) -> str:
    """A module a train.py imports: training_arguments() and data_collator(tokenizer) for the planned setup."""
    packing = batch.strategy == "pack"
    lines = [*_docstring_lines(packing), "", *_constant_lines(kwargs, batch, headline, packing), "", "",
             *_training_arguments_lines(batch, packing), "", "",
             *inspect.getsource(recipe.current_names).rstrip().splitlines(), "", "",
             *_data_collator_lines(batch), "", *model_lines(batch.setting)]
    return "\n".join(lines)


def model_lines(setting: Setting) -> list[str]:
    """model_kwargs() and prepare_model(model): the model loaded and adapted as the calibration trial loads it
    (ftplan.core.recipe), since its dtype, attention implementation and adapters change memory and speed."""
    quantization = recipe.quantization_arguments(setting)
    return [
        "",
        f"MODEL_KWARGS = {recipe.model_arguments(setting)!r}",
        f"QUANTIZATION = {quantization!r}  # transformers.BitsAndBytesConfig keywords (QLoRA's 4-bit base), or None",
        f"LORA = {recipe.lora_arguments(setting)!r}  # peft.LoraConfig keywords, or None",
        "",
        "",
        "def model_kwargs():",
        '    """from_pretrained keywords: AutoModelForCausalLM.from_pretrained(MODEL, **model_kwargs())."""',
        "    import torch",
        "",
        '    kwargs = {**MODEL_KWARGS, "dtype": getattr(torch, MODEL_KWARGS["dtype"])}',
        "    if QUANTIZATION:",
        "        from transformers import BitsAndBytesConfig",
        "",
        '        compute = getattr(torch, QUANTIZATION["bnb_4bit_compute_dtype"])',
        '        kwargs["quantization_config"] = BitsAndBytesConfig(**{**QUANTIZATION, "bnb_4bit_compute_dtype": compute})',
        "    return kwargs",
        "",
        "",
        "def prepare_model(model):",
        '    """The planned adapters on the loaded model (QLoRA\'s k-bit preparation, PEFT LoRA), no KV cache."""',
        "    model.config.use_cache = False",
        "    if QUANTIZATION:",
        "        from peft import prepare_model_for_kbit_training",
        "",
        f"        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing={setting.gradient_checkpointing},",
        '                                                gradient_checkpointing_kwargs={"use_reentrant": False})',
        "    if LORA:",
        "        from peft import LoraConfig, get_peft_model",
        "",
        "        model = get_peft_model(model, LoraConfig(**LORA))",
        *(["        model.enable_input_require_grads()  # checkpointing through a frozen base"]
          if setting.gradient_checkpointing else []),
        "    return model",
        ""]
