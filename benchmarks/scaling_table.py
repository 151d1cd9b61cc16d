"""Predicted speed-up and efficiency of full vs LoRA fine-tuning of Llama-3-8B at 1-128 H200s over a slow network.

8 GPUs per node on NVLink 4; 600 MB/s between nodes (plain cloud networking). The compute time of
one GPU's step comes from a real H200 calibration of that model (data/calibrations/h200.jsonl)
where one exists, else from the analytic prior (FLOPs over the datasheet's bf16 throughput times
the documented default MFU, plus the optimizer step); the output says which.

    python benchmarks/scaling_table.py [--calibrations PATH] [--plot PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from pathlib import Path

from ftplan.cli.plots import plot_scaling
from ftplan.core.architecture import load_architecture
from ftplan.core.hardware import find_gpu
from ftplan.core.paths import calibrations_dir
from ftplan.core.settings import Setting
from ftplan.models.communication.estimates import estimate_overlap, step_time_cv
from ftplan.models.communication.links import links_from_catalog
from ftplan.models.communication.traffic import step_traffic
from ftplan.models.prior import prior_estimate
from ftplan.models.scaling import scaling_table
from ftplan.store.records import RecordWarning, read_records

MODEL = "llama-3-8b"
GPU = "H200"
GPU_COUNTS = [1, 8, 32, 128]
GPUS_PER_NODE = 8
INTER_NODE_GBS = 0.6
SEQ_LEN, MICRO_BATCH = 2048, 4
SETTINGS = {"full": Setting(MODEL, seq_len=SEQ_LEN, gradient_checkpointing=True),
            "LoRA r16": Setting(MODEL, seq_len=SEQ_LEN, gradient_checkpointing=True, lora_rank=16)}


def single_gpu_step(records: list[dict], setting: Setting) -> tuple[Setting, int, float, int, int, str]:
    """(setting, micro-batch, seconds/step, params total, params trainable, where it came from):
    the fastest-per-sample one-GPU record of the model fine-tuned the same way (full or LoRA), else the
    analytic prior for `setting`. Only the model's own: another of its size (OLMoE-1B-7B's LoRA) stood in for
    it under its name."""
    lora = setting.lora_rank > 0
    measured = [r for r in records if r["status"] == "ok" and r.get("seconds_per_step")
                and r.get("gpus", 1) * r.get("nodes", 1) == 1 and r["model"] == setting.model
                and (r.get("lora_rank", 0) > 0) == lora]
    if measured:
        best = max(measured, key=lambda r: r["micro_batch"] / r["seconds_per_step"])
        chosen = Setting.from_dict(best)
        return (chosen, best["micro_batch"], best["seconds_per_step"], best["params_total"], best["params_trainable"],
                f"calibrated: {best['model']} {chosen.label()} batch {best['micro_batch']} ({best['_source']})")
    arch = load_architecture(setting.model)
    estimate = prior_estimate(arch, setting, MICRO_BATCH, find_gpu(GPU))
    return (setting, MICRO_BATCH, estimate.seconds_per_step, arch.params_total,
            arch.trainable_params(setting.lora_rank, setting.lora_targets),
            f"ANALYTIC ESTIMATE (no {setting.model} H200 calibration): FLOPs / ({GPU} bf16 datasheet x default MFU) "
            f"+ optimizer step, {setting.label()} batch {MICRO_BATCH}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrations", type=Path, default=calibrations_dir() / "h200.jsonl")
    parser.add_argument("--plot", type=Path, default=None, help="also write the speed-up/efficiency plot here")
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordWarning)
        records = read_records([args.calibrations]) if args.calibrations.exists() else []
    links = dataclasses.replace(links_from_catalog(intra=find_gpu(GPU).interconnect, inter="cloud"),
                                inter_node_gbs=INTER_NODE_GBS, source="catalog, inter-node set to 600 MB/s")
    overlap, cv = estimate_overlap(records, links), step_time_cv(records)
    print(f"{MODEL} on {GPU}, {GPUS_PER_NODE} per node; links: {links.intra_node_gbs:g} GB/s and "
          f"{links.intra_latency_s * 1e6:g} us/hop inside a node, {links.inter_node_gbs:g} GB/s and "
          f"{links.inter_latency_s * 1e6:g} us/hop between nodes ({links.source})")
    print(f"overlap with backward {overlap.overlap:g} ({overlap.source}); step-time cv {cv:.3g}"
          f" ({'from ' + str(args.calibrations) if records else 'no records: stragglers ignored'})")
    tables = {}
    for name, wanted in SETTINGS.items():
        setting, batch, seconds, total, trainable, source = single_gpu_step(records, wanted)
        traffic = step_traffic(setting, total, trainable)
        tables[name] = scaling_table(seconds, traffic.gradient_bytes, batch, GPU_COUNTS, GPUS_PER_NODE, links,
                                     overlap.overlap, cv, gathered_parameter_bytes=traffic.gathered_parameter_bytes,
                                     offloaded_bytes=traffic.offloaded_bytes)
        print(f"{name}: {trainable:,} trainable parameters, {traffic.gradient_bytes / 1e9:.3g} GB of gradients per step; "
              f"one GPU {seconds:.3f} s/step [{source}]")
    print()
    print("| GPUs | nodes | " + " | ".join(f"{n} s/step | {n} speed-up | {n} efficiency" for n in tables) + " |")
    print("|" + "---:|" * (2 + 3 * len(tables)))
    for i, gpus in enumerate(GPU_COUNTS):
        cells = [str(gpus), str(int(tables["full"].iloc[i]["nodes"]))]
        for table in tables.values():
            row = table.iloc[i]
            cells += [f"{row['seconds_per_step']:.3f}", f"{row['speedup']:.1f}x", f"{row['efficiency']:.0%}"]
        print("| " + " | ".join(cells) + " |")
    if args.plot:
        print(f"\nplot: {plot_scaling(tables, args.plot)}")


if __name__ == "__main__":
    main()
