"""Eager attention against SDPA's masked path, as the shipped models price it, on held-out measurements.

benchmarks/gpu/calibrate_eager_path.sh calibrates the same padded rows with attn_implementation eager and sdpa on
one card. For each eager record this prints today's prediction (the shipped records hold no eager trial, so it is
the prior's, or an sdpa fit's where one shipped) and, beside the sdpa record at the same batch, the step time eager
adds against what the prior says it adds (its score traffic over bandwidth, its full-square matmuls, less the
masked SDPA kernel's extra).

    python benchmarks/eager_path.py benchmarks/gpu/results/eager_path_h200_DATE.jsonl
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from ftplan.core.architecture import cached_architecture
from ftplan.core.settings import Setting
from ftplan.evidence.workspace import Workspace
from ftplan.models.prior import prior_estimate
from ftplan.store.records import read_records


def compare(path: Path) -> list[tuple[float, float, float]]:
    """(allocated, step-time, added-time) relative errors of each eager record, printed as a table."""
    records = [r for r in read_records([path]) if r.get("status") == "ok" and r.get("seconds_per_step")]
    sdpa = {(Setting.from_dict(r).with_(attention="eager"), r["micro_batch"]): r for r in records
            if r.get("attention") == "sdpa"}
    print(f"{'setting':44} {'batch':>5} {'alloc err':>9} {'s/step':>7} {'pred':>6} {'err':>7} "
          f"{'eager adds':>10} {'prior adds':>10}")
    errors, workspaces = [], {}
    for record in (r for r in records if r.get("attention") == "eager"):
        setting, batch = Setting.from_dict(record), record["micro_batch"]
        if record["gpu_name"] not in workspaces:  # one card's records and fits, read once
            workspaces[record["gpu_name"]] = Workspace.open(record["gpu_name"])
        workspace = workspaces[record["gpu_name"]]
        gpu, predictor = workspace.card, workspace.predictor
        prediction = workspace.predict(setting, batch)
        measured = record["seconds_per_step"]
        row = [record["peak_allocated_bytes"] / prediction.peak_allocated.mean - 1,
               measured / prediction.seconds_per_step.mean - 1, float("nan")]
        added = prior_added = ""
        if (setting, batch) in sdpa:
            arch, constants = cached_architecture(setting.model), predictor.constants_for(setting.model)
            plain = sdpa[setting, batch]["seconds_per_step"]
            prior_delta = (prior_estimate(arch, setting, batch, gpu, constants).seconds_per_step
                           - prior_estimate(arch, setting.with_(attention="sdpa"), batch, gpu, constants).seconds_per_step)
            row[2] = prior_delta / (measured - plain) - 1
            added, prior_added = f"{measured - plain:10.3f}", f"{prior_delta:10.3f}"
        print(f"{setting.label():44} {batch:5} {row[0]:+9.1%} {measured:7.3f} {prediction.seconds_per_step.mean:6.3f}"
              f" {row[1]:+7.1%} {added:>10} {prior_added:>10}")
        errors.append(tuple(row))
    if errors:
        for name, index in (("allocated", 0), ("step time", 1), ("eager's added time", 2)):
            values = [abs(e[index]) for e in errors if e[index] == e[index]]
            if values:
                print(f"{name}: |err| median {statistics.median(values):.1%} max {max(values):.1%} ({len(values)} records)")
    return errors


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    compare(Path(sys.argv[1]))
