"""The attention path, measured against the prior: peak allocated memory of padded, masked batches (the emitted
collator's, --padding max_length) minus that of equal-length unmasked rows (--padding none) at the same model,
setting and batch, beside what the prior counts for the difference (models/activations.py,
masked_attention_bytes_per_token: K/V expanded to every query head and the additive mask, per layer and token).

    python benchmarks/gpu/mask_path.py records.jsonl     # after calibrate_h200.sh 5
"""

from __future__ import annotations

import sys
from pathlib import Path

from ftplan.core.architecture import load_architecture
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.activations import masked_attention_bytes_per_token
from ftplan.store.records import read_records


def predicted_excess(record: dict) -> float:
    """What the prior says masking adds at this record's batch, in bytes (every layer's saved tensors)."""
    setting = Setting.from_dict(record)
    arch = load_architecture(setting.model)
    return masked_attention_bytes_per_token(arch, setting) * arch.layers * record["micro_batch"] * setting.seq_len


def masked_pairs(records: list[dict]) -> list[tuple[dict, dict]]:
    """(unmasked, masked) healthy records of one full fine-tuning setting and batch that differ only in the mask."""
    healthy = [r for r in records if r["status"] == "ok"]
    unmasked = {(Setting.from_dict(r).with_(padding="max_length").key(), r["micro_batch"]): r
                for r in healthy if r.get("padding", "none") == "none"}
    pairs = []
    for masked in sorted((r for r in healthy if r.get("padding") == "max_length"),
                         key=lambda r: (r["model"], r["micro_batch"])):
        setting = Setting.from_dict(masked)
        plain = unmasked.get((setting.key(), masked["micro_batch"]))
        if plain is not None and not (setting.gradient_checkpointing or setting.liger or setting.lora_rank):
            pairs.append((plain, masked))
    return pairs


def excess_error(plain: dict, masked: dict) -> float:
    """The prior's relative error on what the mask added to peak allocated memory."""
    measured = masked["peak_allocated_bytes"] - plain["peak_allocated_bytes"]
    return (predicted_excess(masked) - measured) / measured


def main(path: Path) -> None:
    print(f"{'model':14} {'q/kv':>5} {'batch':>5} {'alloc none':>10} {'alloc mask':>10} {'measured':>9} "
          f"{'prior':>7} {'error':>7} {'s none':>7} {'s mask':>7}")
    errors = []
    for plain, masked in masked_pairs(read_records([path])):
        arch = load_architecture(masked["model"])
        measured = masked["peak_allocated_bytes"] - plain["peak_allocated_bytes"]
        error = excess_error(plain, masked)
        errors.append(error)
        print(f"{masked['model']:14} {arch.heads // arch.kv_heads:>5} {masked['micro_batch']:>5} "
              f"{plain['peak_allocated_bytes'] / GIB:>10.2f} {masked['peak_allocated_bytes'] / GIB:>10.2f} "
              f"{measured / GIB:>9.2f} {predicted_excess(masked) / GIB:>7.2f} {error:>+7.0%} "
              f"{plain['seconds_per_step']:>7.3f} {masked['seconds_per_step']:>7.3f}")
    if errors:
        print(f"prior's error on the masked excess: median {sorted(errors)[len(errors) // 2]:+.0%}, "
              f"largest {max(errors, key=abs):+.1%}, over {len(errors)} pairs")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
