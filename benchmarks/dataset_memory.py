"""Predicted vs measured tokens per step and peak memory for dynamic padding and packing, from real training
on real text: does a plan from the dataset hold when the model trains on it?

Corpus: the paragraphs of the README text (the METADATA long description) of every Python package installed
in this environment, the corpus of benchmarks/dataset_batching.py, tokenized by a byte-level BPE of 8k tokens
trained on it; a fixed random subset of --samples paragraphs, truncated at --max-length tokens.

Predicted, by ftplan alone: real tokens per micro-batch (mean length × batch) and padded tokens per micro-batch
(ftplan.models.batching: the expected longest sample of a random batch × batch for dynamic padding; the row ×
batch for packing), and peak memory: a calibration trial (the trial `ftplan calibrate --dataset` runs, random
tokens) at the longest micro-batch the plan names, batch × the longest sample, or batch × the packed row.
Measured: one epoch of real training with the Hugging Face Trainer in random order; dynamic padding through
DataCollatorForSeq2Seq(padding="longest"), packing through ftplan's best-fit decreasing rows flattened
padding-free by DataCollatorWithFlattening (as TRL's bfd packing does). Each step's tokens and peak memory are
recorded (tokens over full micro-batches: an epoch's last, partial one is left out); peak memory is measured
as calibration measures it (ftplan.calibration.measure: the process's peak resident set on a CPU, the caching
allocator's peak reserved bytes on a GPU), reset at every step.

On a GPU the trial's and the epoch's peak allocated bytes (what tensors held) and allocator retries are printed
beside reserved: allocated that matches the trial while reserved grows means the growth is blocks the allocator
caches, not more tensors. Whether that cache can be reused when memory runs short shows only near the limit:
num_alloc_retries counts the times cudaMalloc failed and the allocator freed its cache and tried again (an OOM
follows when that fails too). --alloc-conf sets PYTORCH_CUDA_ALLOC_CONF for the trial and the epoch alike
(expandable_segments:True, to compare with the default allocator).

    python benchmarks/dataset_memory.py            # CPU, tiny-llama: about 2 minutes on 2 cores
    python benchmarks/dataset_memory.py --device cuda --model qwen2.5-0.5b --samples 0 --max-length 2048 \\
        --batch-sizes 4,8                         # a real-size model (random weights) on a GPU
    ... --alloc-conf expandable_segments:True     # the same with expandable segments
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ftplan.calibration.launcher import TrialSpec, run_trial
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.batching import apply_limit, batching, pack_assignment

sys.path.insert(0, str(Path(__file__).parent))
from dataset_batching import corpus  # the same real corpus as the padding benchmark

VOCAB = 8000
PAD = "[PAD]"
SEED = 0
TRIAL_TIMEOUT = 600.0
PRECISION = {"cpu": "fp32", "cuda": "bf16"}  # as `ftplan calibrate` defaults on each device


def tokenized_paragraphs(samples: int, max_length: int, tokenizer_path: Path) -> tuple[list[list[int]], int, int]:
    """Token ids of a fixed random subset of the corpus's paragraphs, truncated; (ids, paragraphs, truncated)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = corpus()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=VOCAB, show_progress=False,
                                                             special_tokens=[PAD]))
    tokenizer.save(str(tokenizer_path))
    paragraphs = [p.strip() for text in texts for p in text.split("\n\n") if p.strip()]
    if samples:
        chosen = np.random.default_rng(SEED).choice(len(paragraphs), min(samples, len(paragraphs)), replace=False)
        paragraphs = [paragraphs[i] for i in sorted(chosen)]
    ids = [e.ids for e in tokenizer.encode_batch(paragraphs) if e.ids]
    truncated = sum(len(i) > max_length for i in ids)
    return [i[:max_length] for i in ids], len(texts), truncated


def calibrated_peak(setting: Setting, batch: int, device: str) -> dict:
    """The calibration trial at this shape (random tokens, warm-up, three measured steps): its peak reserved and
    allocated bytes and allocator retries (setting.alloc_conf is its PYTORCH_CUDA_ALLOC_CONF)."""
    outcome = run_trial(TrialSpec(setting, batch, device, steps=3, warmup_steps=2), TRIAL_TIMEOUT)
    rank = outcome.ranks[0]
    if rank.status != "ok":
        raise SystemExit(f"calibration trial at {setting.seq_len} tokens x {batch} failed: {rank.message}")
    return {"peak": rank.result["peak_reserved_bytes"], "allocated": rank.result["peak_allocated_bytes"],
            "retries": rank.result.get("num_alloc_retries") or 0}


def measured_epoch(setting: Setting, batch: int, device: str, strategy: str, items: list, tokenizer: Path,
                   workdir: Path) -> list[dict]:
    """One epoch of real training in a fresh process (a clean peak); each step's tokens and peak memory."""
    spec, result = workdir / f"{strategy}-{batch}.json", workdir / f"{strategy}-{batch}.result.json"
    spec.write_text(json.dumps({"setting": setting.to_dict(), "batch": batch, "device": device, "strategy": strategy,
                                "items": items, "tokenizer": str(tokenizer)}))
    run = subprocess.run([sys.executable, __file__, "--worker", str(spec), str(result)], capture_output=True, text=True,
                         check=False)
    if run.returncode:
        raise SystemExit(f"training {strategy} at batch {batch} failed:\n{run.stderr[-3000:]}")
    return json.loads(result.read_text())


def worker(spec_path: Path, result_path: Path) -> None:
    """Train one epoch as a user would, recording every step's real and padded tokens, its peak reserved and
    allocated memory, and the allocator's retries so far (a running count)."""
    from transformers import (
        DataCollatorForSeq2Seq,
        DataCollatorWithFlattening,
        PreTrainedTokenizerFast,
        Trainer,
        TrainerCallback,
    )

    from ftplan.calibration import measure
    from ftplan.calibration.trial import build_model, training_arguments

    spec = json.loads(spec_path.read_text())
    setting, device, batch = Setting.from_dict(spec["setting"]), spec["device"], spec["batch"]
    if spec["strategy"] == "pack":  # a micro-batch of rows becomes one padding-free sequence (TRL's padding_free)
        flatten = DataCollatorWithFlattening()
        items = [{"samples": row} for row in spec["items"]]

        def collate(rows: list[dict]) -> dict:
            return flatten([{"input_ids": s} for row in rows for s in row["samples"]])
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=spec["tokenizer"], pad_token=PAD)
        collate = DataCollatorForSeq2Seq(tokenizer, padding="longest")
        items = [{"input_ids": ids, "labels": ids} for ids in spec["items"]]
    steps: list[dict] = []

    class Counting(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            ids, mask = inputs["input_ids"], inputs.get("attention_mask")
            steps.append({"padded": ids.numel(), "real": int(mask.sum()) if mask is not None else ids.numel()})
            return super().training_step(model, inputs, num_items_in_batch)

    class PeakPerStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            measure.reset_peak_memory(device)

        def on_step_end(self, args, state, control, **kwargs):
            steps[-1]["allocated"], steps[-1]["peak"], steps[-1]["retries"] = measure.peak_memory(device)

    model, _ = build_model(setting, device)
    with tempfile.TemporaryDirectory(prefix="ftplan-bench-") as output_dir:
        args = training_arguments(setting, batch, math.ceil(len(items) / batch), device, output_dir)
        Counting(model=model, args=args, train_dataset=items, data_collator=collate,
                 callbacks=[PeakPerStep()]).train()
    result_path.write_text(json.dumps(steps))


def error(predicted: float, measured: float) -> str:
    return f"{predicted / measured - 1:+.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", default="tiny-llama", help="an architecture id of ftplan/data/architectures")
    parser.add_argument("--samples", type=int, default=600, help="paragraphs to train on; 0 for all")
    parser.add_argument("--max-length", type=int, default=512, help="truncation, and the packed row's length")
    parser.add_argument("--batch-sizes", default="4,8")
    parser.add_argument("--alloc-conf", default=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                        help="PYTORCH_CUDA_ALLOC_CONF of the trial and the epoch, e.g. expandable_segments:True "
                             "(default: $PYTORCH_CUDA_ALLOC_CONF)")
    parser.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    gpu = args.device == "cuda"
    if gpu:  # the trials and the epochs run in child processes, which take it from here before CUDA starts
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf
    with tempfile.TemporaryDirectory(prefix="ftplan-bench-") as tmp:
        workdir = Path(tmp)
        ids, documents, truncated = tokenized_paragraphs(args.samples, args.max_length, workdir / "tokenizer.json")
        lengths = apply_limit([len(i) for i in ids], args.max_length).lengths
        print(f"corpus: {len(ids)} paragraphs of the README text of {documents} installed Python packages "
              f"({sys.prefix}), {lengths.sum():,} tokens (8k byte-level BPE), p50 {np.median(lengths):.0f}, "
              f"p99 {np.percentile(lengths, 99):.0f}, max {lengths.max()}, {truncated} truncated at {args.max_length}")
        print(f"model {args.model} on {args.device} ({PRECISION[args.device]}); one epoch per row; "
              "tokens per micro-batch (step), peak memory in GiB"
              + (f"; PYTORCH_CUDA_ALLOC_CONF={args.alloc_conf!r}" if gpu else ""))
        header = (f"{'strategy':8} {'batch':>5} {'real pred':>9} {'meas':>8} {'err':>6} {'padded pred':>11} "
                  f"{'meas':>8} {'err':>6} {'peak pred':>9} {'meas':>7} {'err':>6}  peak step / longest")
        print(header + (f"  {'alloc pred':>10} {'meas':>7} {'err':>6} {'retries':>7}" if gpu else ""))
        rows = pack_assignment(lengths, args.max_length)
        for strategy in ("dynamic", "pack"):
            items = [[ids[i] for i in row] for row in rows] if strategy == "pack" else ids
            for batch in batches:
                shape = batching(strategy, lengths, batch, pack_length=args.max_length)
                setting = Setting(model=args.model, seq_len=shape.memory_length, precision=PRECISION[args.device],
                                  alloc_conf=args.alloc_conf if gpu else "")
                trial = calibrated_peak(setting, batch, args.device)
                predicted_peak = trial["peak"]
                steps = measured_epoch(setting, batch, args.device, strategy, items, workdir / "tokenizer.json",
                                       workdir)
                full = steps[:-1] if len(items) % batch else steps
                real = np.mean([s["real"] for s in full])
                padded = np.mean([s["padded"] for s in full])
                peak_step = max(steps, key=lambda s: s["peak"])
                longest = batch * shape.memory_length
                print(f"{strategy:8} {batch:5d} {shape.real_tokens_per_micro_batch:9.0f} {real:8.0f} "
                      f"{error(shape.real_tokens_per_micro_batch, real):>6} "
                      f"{shape.padded_tokens_per_micro_batch:11.0f} {padded:8.0f} "
                      f"{error(shape.padded_tokens_per_micro_batch, padded):>6} {predicted_peak / GIB:9.3f} "
                      f"{peak_step['peak'] / GIB:7.3f} {error(predicted_peak, peak_step['peak']):>6}  "
                      f"{peak_step['padded']:,} / {longest:,} tokens ({len(steps)} steps)", end="")
                if gpu:  # the epoch's highest allocated peak; retries in the trial / over the epoch
                    allocated = max(s["allocated"] for s in steps)
                    retries = f"{trial['retries']}/{steps[-1]['retries']}"
                    print(f"  {trial['allocated'] / GIB:10.3f} {allocated / GIB:7.3f} "
                          f"{error(trial['allocated'], allocated):>6} {retries:>7}", end="")
                print()


if __name__ == "__main__":
    sys.exit(main())
