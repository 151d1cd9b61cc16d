"""One rank of one calibration trial: a short real fine-tune, measured.

A recipe in the torchtune sense: build the model from its config with random weights (memory and
speed do not depend on weight values), train it with the Hugging Face Trainer exactly as users do
(bf16 mixed precision, AdamW, DeepSpeed ZeRO/offload, Liger, LoRA, gradient checkpointing), and
write what was measured to a result file. Runs in its own process, started by ftplan.calibration.launcher,
so an OOM or crash ends only this trial and CUDA statistics start clean.

Usage: python -m ftplan.calibration.trial --spec SPEC.json --result RESULT.json
Exit codes: 0 ok, 3 out of memory, 1 any other error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from ftplan.calibration import measure
from ftplan.calibration.deepspeed_config import deepspeed_config
from ftplan.calibration.scratch import trial_folder
from ftplan.core import recipe
from ftplan.core.architecture import load_architecture
from ftplan.core.settings import Setting

EXIT_OK, EXIT_ERROR, EXIT_OOM = 0, 1, 3


def quantize_to_nf4(model, compute_dtype, device: str) -> None:
    """Replace every nn.Linear of the decoder layers by a bitsandbytes NF4 Linear4bit with double
    quantization, as `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True)` loads a checkpoint (lm_head and embeddings stay unquantized);
    moving each to the device quantizes it. transformers' from_config takes no quantization_config, and
    random weights have no checkpoint to load, so the layers are converted in place."""
    import bitsandbytes as bnb
    import torch

    layers = model.get_decoder().layers
    for module in list(layers.modules()):
        for name, child in list(module.named_children()):
            if not isinstance(child, torch.nn.Linear):
                continue
            quantized = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                          compute_dtype=compute_dtype, compress_statistics=True, quant_type="nf4",
                                          device="meta")
            quantized.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4",
                                                 compress_statistics=True)
            if child.bias is not None:
                quantized.bias = child.bias
            setattr(module, name, quantized.to(device))
    model.is_loaded_in_4bit = True


def build_model(setting: Setting, device: str):
    """The architecture with random weights, loaded as the recipe loads it (ftplan.core.recipe.model_arguments:
    dtype and attention implementation) and with its LoRA adapters; Liger is the Trainer's use_liger_kernel,
    as in the emitted config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = load_architecture(setting.model)
    config = AutoConfig.for_model(**{k: v for k, v in arch.config.items() if not k.startswith("_")})
    loading = recipe.model_arguments(setting)
    base_dtype = getattr(torch, loading["dtype"])
    with torch.device(device if device == "cuda" else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, loading["dtype"]),
                                                 attn_implementation=loading["attn_implementation"])
    model.config.use_cache = False
    if setting.quantization:
        from peft import prepare_model_for_kbit_training

        quantize_to_nf4(model, base_dtype, device)
        if device == "cuda":
            torch.cuda.empty_cache()  # the bf16 weights just replaced
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=setting.gradient_checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = recipe.lora_arguments(setting)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**lora))
        if setting.gradient_checkpointing:
            model.enable_input_require_grads()
    return model, arch


MIXED_BATCHES = 3  # micro-batches of mixed lengths before the heaviest ones, so the allocator meets many shapes


def row_lengths(setting: Setting, micro_batch: int, rows: int, seed: int = 0) -> list[int]:
    """Token counts of the trial's rows, in training order, so that every micro-batch after the mixed ones is
    the heaviest the recipe's collator makes at seq_len, carrying the mask a real run's batches carry:
    - none: rows of exactly seq_len (no padding, so no mask reaches attention);
    - max_length: rows shorter than seq_len (padded to it, so every batch carries a padding mask);
    - longest: each micro-batch one row of seq_len and shorter ones (padded to seq_len; one row alone is unpadded).
    """
    import random

    full = setting.seq_len
    if setting.padding == "none":
        return [full] * rows
    draw = random.Random(seed)
    shorter = [draw.randint(max(1, full // 2), max(1, full - 1)) for _ in range(rows)]
    mixed = [draw.randint(max(1, full // 8), full) for _ in range(MIXED_BATCHES * micro_batch)]
    if setting.padding == "max_length":
        heavy = shorter
    else:
        heavy = [full if i % micro_batch == 0 else shorter[i] for i in range(rows)]
    return (mixed + heavy)[:rows] if rows > len(mixed) else heavy[:rows]


class RandomTokens:
    """Random rows of exactly seq_len tokens with an all-ones mask (labels = inputs), for plain Trainer checks."""

    def __init__(self, samples: int, seq_len: int, vocab: int, seed: int = 0):
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (samples, seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        ids = self.tokens[index]
        return {"input_ids": ids, "attention_mask": ids.new_ones(ids.shape), "labels": ids}


class RandomRows:
    """A map-style dataset of random token rows of the given lengths (labels = inputs); the collator pads them."""

    def __init__(self, lengths: list[int], vocab: int, seed: int = 0):
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.rows = [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        ids = self.rows[index]
        return {"input_ids": ids, "labels": list(ids)}


def padding_tokenizer():
    """A real fast tokenizer that only pads (pad id 0, right side): the collator needs one, not its vocabulary."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]")),
                                        pad_token="[PAD]", unk_token="[UNK]")
    tokenizer.padding_side = recipe.PADDING_SIDE
    return tokenizer


def data_collator(setting: Setting):
    """The recipe's collator, as the emitted training_args.py builds it."""
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(padding_tokenizer(), **recipe.collator_arguments(setting, setting.seq_len))


# Warm-up lasts until step time settles: the first steps pay for lazy initialisation, allocator growth
# and (on a CPU) cold caches and thread pools; on a 2-core CPU the fourth step still ran 2x the later ones.
SETTLED = 0.10          # a step within 10% of the one before it
MAX_WARMUP_STEPS = 12   # never warm up longer than this, settled or not


def warmup_done(seconds: list[float], min_steps: int) -> bool:
    """Whether warm-up is over after these warm-up step times: at least min_steps (0: no warm-up at all),
    and the last step within SETTLED of the one before it, or MAX_WARMUP_STEPS reached."""
    if min_steps == 0:
        return True
    if len(seconds) < max(min_steps, 2):
        return False
    return len(seconds) >= max(min_steps, MAX_WARMUP_STEPS) or abs(seconds[-1] - seconds[-2]) <= SETTLED * seconds[-2]


def _sync(device: str) -> None:
    """Wait for the GPU's queued kernels, so a step's time is its own and not the launch of the next."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _slowest_rank(seconds: float, device: str) -> float:
    """Every rank must end warm-up at the same step, or the ranks would wait on each other forever."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return seconds
    value = torch.tensor([seconds], device="cuda" if device == "cuda" else "cpu")
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def step_timer(device: str, warmup_steps: int, steps: int):
    """A TrainerCallback that warms up until step time settles (warmup_done), then times `steps`
    optimizer steps and stops training (synchronising only at step edges)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.warmup_seconds: list[float] = []
            self.seconds: list[float] = []
            self.measuring = warmup_done([], warmup_steps)
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            if self.measuring and not self.seconds:
                measure.reset_peak_memory(device)  # peak over the measured steps, after one-off set-up
            _sync(device)
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync(device)
            elapsed = time.perf_counter() - self._start
            if self.measuring:
                self.seconds.append(elapsed)
                control.should_training_stop = len(self.seconds) >= steps
            else:
                self.warmup_seconds.append(_slowest_rank(elapsed, device))
                self.measuring = warmup_done(self.warmup_seconds, warmup_steps)

    return StepTimer()


def training_arguments(setting: Setting, micro_batch: int, steps: int, device: str, output_dir: str):
    """The recipe's Trainer arguments (ftplan.core.recipe.trainer_arguments, as emitted) plus what only a short
    measured run needs: a step limit, no saving or logging, and rows kept in order."""
    from transformers import TrainingArguments

    return TrainingArguments(
        **recipe.current_names(recipe.trainer_arguments(setting), TrainingArguments),
        output_dir=output_dir,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=1,
        max_steps=steps,
        learning_rate=1e-5,
        deepspeed=deepspeed_config(setting),
        use_cpu=device == "cpu",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )


def ordered_trainer():
    """Trainer that keeps the rows in order, so each micro-batch is the one row_lengths built (shuffling changes
    which rows meet, not what a batch of them costs)."""
    from torch.utils.data import SequentialSampler
    from transformers import Trainer

    class OrderedTrainer(Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    return OrderedTrainer


def _train_without_process_group() -> None:
    """One GPU without DeepSpeed trains as `python train.py` does, with no process group.

    With the launcher's RANK/WORLD_SIZE set, the Trainer creates a one-rank NCCL group whose lazily
    built communicator needs fresh device memory at the end of training; at the memory wall that
    failed as "NCCL ... unhandled cuda error" on the H200 (qwen2.5-0.5b, batch 19) after every step
    had run. DeepSpeed needs the group and builds its communicator at start-up, before memory fills.
    """
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)


def run_trial(spec: dict) -> dict:
    """Train for warm-up + measured steps and return the measurements (raises on OOM or failure)."""

    setting = Setting.from_dict(spec["setting"])
    device, micro_batch = spec["device"], spec["micro_batch"]
    warmup, steps = spec.get("warmup_steps", 2), spec.get("steps", 4)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and not setting.uses_deepspeed:
        _train_without_process_group()
    if device == "cuda":
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    model, arch = build_model(setting, device)
    timer = step_timer(device, warmup, steps)
    most_steps = max(warmup, MAX_WARMUP_STEPS) + steps  # the timer stops training once its steps are measured
    with trial_folder() as output_dir:
        args = training_arguments(setting, micro_batch, most_steps, device, str(output_dir))
        rows = micro_batch * world * (most_steps + MIXED_BATCHES)
        dataset = RandomRows(row_lengths(setting, micro_batch * world, rows), arch.vocab)
        trainer = ordered_trainer()(model=model, args=args, train_dataset=dataset, data_collator=data_collator(setting),
                                    callbacks=[timer])
        trainer.train()
    allocated, reserved, retries = measure.peak_memory(device)
    name, total = measure.gpu_identity(device)
    return {
        "peak_allocated_bytes": allocated,
        "peak_reserved_bytes": reserved,
        "num_alloc_retries": retries,
        "step_seconds": timer.seconds,
        "params_total": arch.params_total,
        "params_trainable": sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad),
        "gpu_name": name,
        "gpu_memory_total_bytes": total,
    }  # ds_numel: under ZeRO-3 a parameter's local numel() is only its partition


def write_result(path: Path, result: dict) -> None:
    """Atomically, so the launcher never reads half a result."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", spec["setting"].get("alloc_conf", ""))
    identity = {"device": spec["device"], "alloc_conf": measure.alloc_conf(), "versions": measure.library_versions()}
    try:  # known before training, so OOM and error results name their card too
        identity["gpu_name"], identity["gpu_memory_total_bytes"] = measure.gpu_identity(spec["device"])
    except Exception as exc:  # noqa: BLE001 - a broken device shows up as the trial's own error below
        identity["message"] = f"device not usable: {exc}"
    try:
        result = {"status": "ok", "message": "", **identity, **run_trial(spec)}
        code = EXIT_OK
    except BaseException as exc:  # noqa: BLE001 - every failure must become a result, never a hang
        if isinstance(exc, KeyboardInterrupt):
            raise
        oom = measure.is_oom(exc)
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        if not oom:
            traceback.print_exc()
        result = {**identity, "status": "oom" if oom else "error", "message": message}
        code = EXIT_OOM if oom else EXIT_ERROR
    write_result(args.result, result)
    return code


if __name__ == "__main__":
    sys.exit(main())
