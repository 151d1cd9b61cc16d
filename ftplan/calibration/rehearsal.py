"""One rehearsal: what `ftplan plan --emit DIR` wrote, run unchanged for a few steps, measured.

This is the user's train.py: it imports DIR/training_args.py and builds the run from its training_arguments(),
data_collator(), model_kwargs() and prepare_model(), with the architecture's random weights and random token
ids at the dataset's own lengths (plan.json; memory and speed depend on neither the weights nor the ids).
Only the order of the rows (the heaviest micro-batches first, then a random mix; packed rows come as TRL packs
them) and the step limit are the rehearsal's own. Runs in its own process, like a calibration trial, so an OOM ends only it.

Usage: python -m ftplan.calibration.rehearsal --dir DIR --steps N --result RESULT.json
Exit codes: 0 ok, 3 out of memory, 1 any other error.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

from ftplan.calibration import measure
from ftplan.calibration.trial import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OOM,
    RandomRows,
    ordered_trainer,
    padding_tokenizer,
    quantize_to_nf4,
    write_result,
)
from ftplan.core.architecture import load_architecture
from ftplan.core.settings import Setting

HEAVY_STEPS = 2  # optimizer steps of the longest samples first: the peak a run meets when they arrive


def rehearsal_lengths(plan: dict, steps: int, seed: int = 0) -> tuple[list[int], int]:
    """Token counts of the rehearsal's rows in training order, and how many steps of them are the heaviest.

    With a dataset: its longest rows for the first steps, then rows drawn at random (what a shuffled epoch
    feeds). Without one: rows shorter than the planned length, which the collator pads to it, as real
    samples padded to max_length are (each batch carries a padding mask).
    """
    rows_per_step = plan["micro_batch"] * plan["accumulation"]
    draw = random.Random(seed)
    lengths = plan.get("lengths")
    if not lengths:
        full = plan["length"]
        return [draw.randint(max(1, full // 2), max(1, full - 1)) for _ in range(rows_per_step * steps)], 0
    heavy_steps = min(HEAVY_STEPS, steps)
    ordered = sorted(lengths, reverse=True)
    heavy = ordered[:rows_per_step * heavy_steps]
    mixed = [draw.choice(lengths) for _ in range(rows_per_step * (steps - heavy_steps))]
    heavy += [ordered[0]] * (rows_per_step * heavy_steps - len(heavy))  # a dataset smaller than the heavy steps
    return heavy + mixed, heavy_steps


def packed_sample_lengths(plan: dict, steps: int, seed: int = 0) -> list[int]:
    """Samples drawn at random from the plan's lengths until they fill a tenth more packed rows than `steps`
    optimizer steps take: TRL packs them (best-fit decreasing) into rows, nearly all full, so which rows come
    first does not change a step's cost."""
    rows = plan["micro_batch"] * plan["accumulation"] * steps
    draw, lengths, drawn = random.Random(seed), plan["lengths"], []
    while sum(drawn) < 1.1 * rows * plan["length"] + plan["length"]:
        drawn.append(min(draw.choice(lengths), plan["length"]))
    return drawn


def packed_trainer(model, args, lengths: list[int], vocab: int, callbacks: list):
    """TRL's SFTTrainer on pre-tokenized samples, as the emitted training_args.py asks (SFTConfig with packing):
    it packs them and collates padding-free, as the user's run does."""
    from datasets import Dataset
    from trl import SFTTrainer

    dataset = Dataset.from_dict({"input_ids": RandomRows(lengths, vocab).rows})
    return SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=padding_tokenizer(),
                      callbacks=callbacks)


def load_emitted(directory: Path):
    """DIR/training_args.py as a module, imported as train.py imports it (before CUDA starts). From its source,
    whose digest rehearse recorded: bytecode in the folder's __pycache__ with the source's size and time in its
    header would run in its place, so its loader reads no cache (the modules it imports keep theirs)."""
    path = str(directory / "training_args.py")
    spec = importlib.util.spec_from_file_location("training_args", path, loader=_SourceOnly("training_args", path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _SourceOnly(importlib.machinery.SourceFileLoader):
    """A loader that never reads or writes bytecode: without the source's stats, CPython skips the cache."""

    def path_stats(self, path: str) -> dict:
        raise OSError("the source is read, never cached bytecode")


def build_model(emitted, setting: Setting):
    """The architecture with random weights, loaded with the folder's model_kwargs() and prepare_model()."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = load_architecture(setting.model)
    config = AutoConfig.for_model(**{k: v for k, v in arch.config.items() if not k.startswith("_")})
    kwargs = emitted.model_kwargs()
    quantization = kwargs.pop("quantization_config", None)  # from_config loads no checkpoint to quantize
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    if quantization is not None:
        quantize_to_nf4(model, quantization.bnb_4bit_compute_dtype, "cuda")
        torch.cuda.empty_cache()
    return emitted.prepare_model(model), arch


def step_clock():
    """A TrainerCallback timing every optimizer step (CUDA synchronised at both ends)."""
    import torch
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            self.seconds.append(time.perf_counter() - self._start)

    return StepClock()


def rehearse(emitted, plan: dict, steps: int) -> dict:
    """Run the folder's training for `steps` optimizer steps; return what was measured (raises on OOM)."""
    setting = Setting.from_dict(plan["setting"])
    if not setting.uses_deepspeed:
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(name, None)  # one GPU without DeepSpeed trains as `python train.py`
    import torch

    torch.cuda.set_device(0)
    model, arch = build_model(emitted, setting)
    clock = step_clock()
    with tempfile.TemporaryDirectory(prefix="ftplan-rehearsal-") as output_dir:
        args = emitted.training_arguments(output_dir=output_dir, max_steps=steps, report_to=[], save_strategy="no",
                                          logging_strategy="no", disable_tqdm=True)
        if plan["strategy"] == "pack":
            heavy_steps = 0
            trainer = packed_trainer(model, args, packed_sample_lengths(plan, steps), arch.vocab, [clock])
        else:
            lengths, heavy_steps = rehearsal_lengths(plan, steps)
            trainer = ordered_trainer()(model=model, args=args, train_dataset=RandomRows(lengths, arch.vocab),
                                        data_collator=emitted.data_collator(padding_tokenizer()), callbacks=[clock])
        trainer.train()
    allocated, reserved, retries = measure.peak_memory("cuda")
    return {"peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved, "num_alloc_retries": retries,
            "step_seconds": clock.seconds, "heavy_steps": heavy_steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    emitted = load_emitted(args.dir)  # first: it sets PYTORCH_CUDA_ALLOC_CONF, read once when CUDA starts
    plan = json.loads((args.dir / "plan.json").read_text())
    identity = {"alloc_conf": measure.alloc_conf(), "versions": measure.library_versions()}
    try:
        identity["gpu_name"], identity["gpu_memory_total_bytes"] = measure.gpu_identity("cuda")
        result, code = {"status": "ok", "message": "", **identity, **rehearse(emitted, plan, args.steps)}, EXIT_OK
    except BaseException as exc:  # noqa: BLE001 - every failure must become a result, never a hang
        if isinstance(exc, KeyboardInterrupt):
            raise
        oom = measure.is_oom(exc)
        if not oom:
            traceback.print_exc()
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        result, code = {**identity, "status": "oom" if oom else "error", "message": message}, (EXIT_OOM if oom else EXIT_ERROR)
        if oom:
            result["peak_allocated_bytes"], result["peak_reserved_bytes"], _ = measure.peak_memory("cuda")
    write_result(args.result, result)
    return code


if __name__ == "__main__":
    sys.exit(main())
