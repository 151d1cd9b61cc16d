"""Two recipes that differ in one memory-bound path, same rows, same host, against the shipped models' price.

    python benchmarks/paired_paths.py eager benchmarks/gpu/results/eager_path_h100_2026-12-07.jsonl
    python benchmarks/paired_paths.py lora benchmarks/gpu/results/lora_traffic_h100_2026-12-07.jsonl

eager: benchmarks/gpu/calibrate_eager_path.sh calibrates the same padded rows with attn_implementation eager and
sdpa; eager adds its score traffic and full-square matmuls, less the masked SDPA kernel's extra.
lora: benchmarks/gpu/calibrate_lora_traffic.sh calibrates LoRA on every linear and on q_proj and v_proj only; the
matmul FLOPs are the same, so the time between them is the adapters' memory traffic (models/traffic.py).

For each record of the variant this prints today's prediction (the shipped records hold none of these trials, so
it is the prior's, or a relative's fit) and, beside the base record at the same batch, the step time the variant
adds against what the prior says it adds.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ftplan.core.architecture import cached_architecture
from ftplan.core.settings import Setting
from ftplan.evidence.workspace import Workspace
from ftplan.models.prior import prior_estimate
from ftplan.store.records import read_records


@dataclass(frozen=True)
class Pairing:
    """Which records are the variant, and the base recipe each is paired with."""

    is_variant: Callable[[Setting], bool]
    base_of: Callable[[Setting], Setting]


PAIRINGS = {
    "eager": Pairing(lambda s: s.attention == "eager", lambda s: s.with_(attention="sdpa")),
    "lora": Pairing(lambda s: len(s.lora_targets) > 2, lambda s: s.with_(lora_targets=("q_proj", "v_proj"))),
}


def compare(path: Path, pairing: Pairing) -> list[tuple[float, float, float]]:
    """(allocated, step-time, added-time) relative errors of each variant record, printed as a table; then per
    recipe the added time's slope in batch, measured and priced (a per-step launch cost cancels out of it)."""
    records = [r for r in read_records([path]) if r.get("status") == "ok" and r.get("seconds_per_step")]
    by_recipe = {(Setting.from_dict(r), r["micro_batch"]): r for r in records}
    print(f"{'setting':44} {'batch':>5} {'alloc err':>9} {'s/step':>7} {'pred':>6} {'err':>7} "
          f"{'adds':>7} {'prior adds':>10}")
    errors, workspaces, added_by_recipe = [], {}, {}
    for record in records:
        setting, batch = Setting.from_dict(record), record["micro_batch"]
        if not pairing.is_variant(setting):
            continue
        if record["gpu_name"] not in workspaces:  # one card's records and fits, read once
            workspaces[record["gpu_name"]] = Workspace.open(record["gpu_name"])
        workspace = workspaces[record["gpu_name"]]
        gpu, predictor = workspace.card, workspace.predictor
        prediction = workspace.predict(setting, batch)
        measured = record["seconds_per_step"]
        row = [record["peak_allocated_bytes"] / prediction.peak_allocated.mean - 1,
               measured / prediction.seconds_per_step.mean - 1, float("nan")]
        added = prior_added = ""
        base = pairing.base_of(setting)
        if (base, batch) in by_recipe:
            arch, constants = cached_architecture(setting.model), predictor.constants_for(setting.model)
            plain = by_recipe[base, batch]["seconds_per_step"]
            prior_delta = (prior_estimate(arch, setting, batch, gpu, constants).seconds_per_step
                           - prior_estimate(arch, base, batch, gpu, constants).seconds_per_step)
            row[2] = prior_delta / (measured - plain) - 1
            added_by_recipe.setdefault(setting.model + " " + setting.label(), []).append(
                (batch, measured - plain, prior_delta))
            added, prior_added = f"{measured - plain:7.3f}", f"{prior_delta:10.3f}"
        print(f"{setting.model + ' ' + setting.label():44} {batch:5} {row[0]:+9.1%} {measured:7.3f} "
              f"{prediction.seconds_per_step.mean:6.3f} {row[1]:+7.1%} {added:>7} {prior_added:>10}")
        errors.append(tuple(row))
    for recipe, points in added_by_recipe.items():
        if len(points) > 1:
            (low, measured_low, priced_low), (high, measured_high, priced_high) = min(points), max(points)
            print(f"{recipe}: added time per sample, batches {low}-{high}: measured "
                  f"{(measured_high - measured_low) / (high - low) * 1e3:.1f} ms, priced "
                  f"{(priced_high - priced_low) / (high - low) * 1e3:.1f} ms")
    for name, index in (("allocated", 0), ("step time", 1), ("added time", 2)):
        values = [abs(e[index]) for e in errors if e[index] == e[index]]
        if values:
            print(f"{name}: |err| median {statistics.median(values):.1%} max {max(values):.1%} ({len(values)} records)")
    return errors


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in PAIRINGS:
        sys.exit(__doc__)
    compare(Path(sys.argv[2]), PAIRINGS[sys.argv[1]])
