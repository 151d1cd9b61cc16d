"""Written by `ftplan plan` (the plan is PLAN below); use it from a train.py:

    from training_args import training_arguments, data_collator, model_kwargs, prepare_model
    model = prepare_model(AutoModelForCausalLM.from_pretrained(MODEL, **model_kwargs()))
    trainer = Trainer(model=model, args=training_arguments(), train_dataset=train,
                      data_collator=data_collator(tokenizer))

Samples hold input_ids and labels (labels = input_ids, -100 on the prompt); paths are relative to this file.
README.txt beside it has the launch command (and the LoRA and Liger lines, where planned).
"""

import os
import warnings

# The caching allocator's configuration the plan's memory was predicted (and calibrated) under; another
# one changes reserved memory, which decides an OOM (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf).
# PyTorch reads it once, when CUDA starts: import this module in train.py before anything is put on the GPU.
ALLOC_CONF = ''
if ALLOC_CONF:
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
if os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") != ALLOC_CONF:
    warnings.warn(f"PYTORCH_CUDA_ALLOC_CONF is {os.environ['PYTORCH_CUDA_ALLOC_CONF']!r}; the plan was made for {ALLOC_CONF!r}", stacklevel=2)

from pathlib import Path

from transformers import DataCollatorForSeq2Seq, TrainingArguments

HERE = Path(__file__).resolve().parent
PLAN = 'ddp full s2048 dynpad for llama-3.2-1b on 1 x H100'  # a repr: names from the user's files can hold quotes and newlines
# micro-batch 7 x gradient accumulation 1 per GPU; samples of at most 2,048 tokens
TRAINING_ARGS = {'output_dir': 'output',
 'per_device_train_batch_size': 7,
 'gradient_accumulation_steps': 1,
 'num_train_epochs': 1.0,
 'optim': 'adamw_torch',
 'bf16': True,
 'fp16': False,
 'gradient_checkpointing': False,
 'use_liger_kernel': False}
# Tokenize with truncation=True, max_length=2048: the plan truncated longer samples.


def training_arguments(**overrides):
    """The planned arguments; overrides change any of them (report_to="wandb", say)."""
    kwargs = {**TRAINING_ARGS, **overrides}
    for key in ("output_dir", "deepspeed"):
        if isinstance(kwargs.get(key), str):
            kwargs[key] = str(HERE / kwargs[key])
    return TrainingArguments(**current_names(kwargs, TrainingArguments))


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


def data_collator(tokenizer):
    """The collator of the planned batching: the padded shape the planned memory rests on."""
    # each micro-batch padded to its own longest sample (at most 2,048 tokens).
    if tokenizer.pad_token is None:  # Llama 3's and others' tokenizers have none; padding needs one, and the
        tokenizer.pad_token = tokenizer.eos_token  # padded positions are masked and labelled -100 anyway
    return DataCollatorForSeq2Seq(tokenizer, padding='longest')


MODEL_KWARGS = {'dtype': 'float32', 'attn_implementation': 'sdpa'}
QUANTIZATION = None  # transformers.BitsAndBytesConfig keywords (QLoRA's 4-bit base), or None
LORA = None  # peft.LoraConfig keywords, or None


def model_kwargs():
    """from_pretrained keywords: AutoModelForCausalLM.from_pretrained(MODEL, **model_kwargs())."""
    import torch

    kwargs = {**MODEL_KWARGS, "dtype": getattr(torch, MODEL_KWARGS["dtype"])}
    if QUANTIZATION:
        from transformers import BitsAndBytesConfig

        compute = getattr(torch, QUANTIZATION["bnb_4bit_compute_dtype"])
        kwargs["quantization_config"] = BitsAndBytesConfig(**{**QUANTIZATION, "bnb_4bit_compute_dtype": compute})
    return kwargs


def prepare_model(model):
    """The planned adapters on the loaded model (QLoRA's k-bit preparation, PEFT LoRA), no KV cache."""
    model.config.use_cache = False
    if QUANTIZATION:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    if LORA:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**LORA))
    return model
