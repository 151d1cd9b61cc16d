"""Packing's attention path on the GPU, against the prior: k rows packed and flattened into one sequence (TRL's
padding-free collation: position_ids restart per row, no attention mask) against the same k rows padded and masked
(DataCollatorForSeq2Seq), one training step each, peak allocated memory and step time. The prior says the packed
micro-batch adds a (kL)² mask per layer and k times the masked attention (models/prior.py, packed_attention_extra).

    python benchmarks/gpu/packed_path.py MODEL SEQ K1,K2,...     # on the GPU; prints one JSON line per k
    python benchmarks/gpu/packed_path.py slowdown                 # here: the flattened kernel's slowdown they imply
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path


def step_peak(model, optimizer, batch: dict) -> tuple[int, float]:
    """Peak allocated bytes and median seconds of three training steps on this batch."""
    import torch

    seconds = []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return torch.cuda.max_memory_allocated(), statistics.median(seconds[1:])


def main(model_id: str, seq: int, ks: list[int]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftplan.core.architecture import load_architecture
    from ftplan.core.settings import Setting
    from ftplan.models.prior import packed_attention_extra

    arch = load_architecture(model_id)
    config = AutoConfig.for_model(**{k: v for k, v in arch.config.items() if not k.startswith("_")})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for k in ks:
        ids = torch.randint(1, arch.vocab, (k, seq), device="cuda")
        mask = torch.ones_like(ids)
        mask[:, -1] = 0  # one pad a row: the padded batch carries a mask, as the collator's does
        padded = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        flat = ids.reshape(1, -1)
        packed = {"input_ids": flat, "labels": flat,
                  "position_ids": torch.arange(seq, device="cuda").repeat(k).reshape(1, -1)}
        row = {"model": model_id, "seq": seq, "k": k}
        for name, batch in (("padded", padded), ("packed", packed)):
            try:
                row[f"{name}_bytes"], row[f"{name}_seconds"] = step_peak(model, optimizer, batch)
            except torch.OutOfMemoryError:
                row[f"{name}_bytes"] = row[f"{name}_seconds"] = None
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        extra_bytes, extra_flops = packed_attention_extra(arch, Setting(model_id, seq_len=seq, padding="packed"), k)
        row["prior_extra_bytes"], row["prior_extra_flops"] = extra_bytes, extra_flops
        print(json.dumps(row), flush=True)


RESULTS = Path(__file__).parent / "results" / "packed_path_h200.jsonl"
# Below this many rows the packed extra hides under a step's launch-bound floor (k = 4 added 0.03 s where 0.05 was
# priced), so it says nothing of the kernel's rate.
MIN_ROWS_FOR_SLOWDOWN = 8


def implied_slowdowns(results: Path = RESULTS) -> list[tuple[str, int, float]]:
    """(model, k, slowdown) per measured k >= MIN_ROWS_FOR_SLOWDOWN: the FLATTENED_MASK_SLOWDOWN that makes the
    prior's packed extra (k² squares at the slowed masked rate, less the k rows priced) equal the measured one,
    with the shipped H200 constants."""
    from ftplan.core.architecture import load_architecture
    from ftplan.core.hardware import find_gpu
    from ftplan.core.settings import Setting
    from ftplan.evidence.workspace import Workspace
    from ftplan.models.prior import ComputeRate, masked_attention_flops

    gpu, predictor = find_gpu("H200"), Workspace.open("H200").predictor
    found = []
    for row in map(json.loads, results.read_text().splitlines()):
        k = row["k"]
        if k < MIN_ROWS_FOR_SLOWDOWN or row["packed_seconds"] is None:
            continue
        setting = Setting(row["model"], seq_len=row["seq"], padding="packed")
        constants = predictor.constants_for(row["model"])
        rate = ComputeRate(constants.mfu, constants.loss_bytes_per_logit, 0, constants.masked_attention_cost)
        square = rate.packed_seconds(masked_attention_flops(load_architecture(row["model"]), setting), gpu)
        extra = row["packed_seconds"] - row["padded_seconds"]
        found.append((row["model"], k, (extra / square + k) / k**2))
    return found


if __name__ == "__main__":
    if sys.argv[1:] == ["slowdown"]:
        for model, k, slowdown in implied_slowdowns():
            print(f"{model} k={k}: the flattened masked kernel {slowdown:.3f}x the padded masked rate per FLOP")
    else:
        main(sys.argv[1], int(sys.argv[2]), [int(k) for k in sys.argv[3].split(",")])
