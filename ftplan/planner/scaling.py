"""Scaling over GPU counts: speed-up, efficiency, and the count that meets a deadline at least cost.

One row per GPU count from the time model of ftplan.models.communication, so the planner can answer
`--gpus 1..128` and the report can plot full against LoRA fine-tuning.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from ftplan.core.errors import FtplanError
from ftplan.models.communication import (
    DEFAULT_BACKWARD_FRACTION,
    DEFAULT_OVERLAP,
    Links,
    data_parallel_step_seconds,
)

_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")


def parse_gpu_counts(text: str) -> list[int]:
    """GPU counts from '8', '1,2,4,8' or '1..128' (a range doubles from its start: 1,2,4,...,128;
    its end is always included); parts can be mixed: '1..8,12'."""
    counts: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        match = _RANGE.match(part)
        if match:
            start, end = int(match[1]), int(match[2])
            if start < 1 or end < start:
                raise FtplanError(f"GPU range '{part}' must go up from at least 1, e.g. 1..128")
            counts.update(start * 2**i for i in range(int(math.log2(end / start)) + 1))
            counts.add(end)
        elif part.isdigit() and int(part) >= 1:
            counts.add(int(part))
        else:
            raise FtplanError(f"cannot read GPU count '{part}' in '{text}': give e.g. 8, 1,2,4,8 or 1..128")
    return sorted(counts)


def node_layout(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(GPUs per node, nodes): as few nodes as possible, GPUs spread evenly (a ragged last node is
    counted as full, which can only overestimate the time)."""
    nodes = math.ceil(gpus / gpus_per_node)
    return math.ceil(gpus / nodes), nodes


def scaling_table(single_gpu_seconds: float, gradient_bytes: int, micro_batch: int, gpu_counts: list[int],
                  gpus_per_node: int, links: Links, overlap: float = DEFAULT_OVERLAP, cv: float = 0.0, *,
                  gathered_parameter_bytes: int = 0, offloaded_bytes: int = 0,
                  backward_fraction: float = DEFAULT_BACKWARD_FRACTION) -> pd.DataFrame:
    """Per GPU count: nodes, seconds per step, samples/s, speed-up over one GPU and efficiency.

    single_gpu_seconds is one GPU's optimizer step without communication; micro_batch is per GPU.
    """
    if micro_batch < 1 or gpus_per_node < 1 or not gpu_counts or min(gpu_counts) < 1:
        raise FtplanError("micro-batch, GPUs per node and every GPU count must be positive")

    def step(gpus: int) -> float:
        per_node, nodes = node_layout(gpus, gpus_per_node)
        return data_parallel_step_seconds(single_gpu_seconds, gradient_bytes, per_node, nodes, links, overlap, cv,
                                          backward_fraction, gathered_parameter_bytes=gathered_parameter_bytes,
                                          offloaded_bytes=offloaded_bytes)

    one_gpu_rate = micro_batch / step(1)
    rows = []
    for gpus in sorted(set(gpu_counts)):
        seconds = step(gpus)
        rate = micro_batch * gpus / seconds
        rows.append({"gpus": gpus, "nodes": node_layout(gpus, gpus_per_node)[1], "samples_per_step": micro_batch * gpus,
                     "seconds_per_step": seconds, "samples_per_second": rate,
                     "speedup": rate / one_gpu_rate, "efficiency": rate / one_gpu_rate / gpus})
    return pd.DataFrame(rows)


def with_eta(table: pd.DataFrame, dataset_size: int, epochs: float, price_per_gpu_hour: float) -> pd.DataFrame:
    """The table plus hours and cost of the whole run (steps rounded up, every GPU billed)."""
    if dataset_size < 1 or epochs <= 0 or price_per_gpu_hour < 0:
        raise FtplanError("dataset size and epochs must be positive and the price non-negative")
    steps = (dataset_size * epochs / table["samples_per_step"]).apply(math.ceil)
    hours = steps * table["seconds_per_step"] / 3600
    return table.assign(steps=steps, hours=hours, cost=hours * table["gpus"] * price_per_gpu_hour)


def choose_gpu_count(table: pd.DataFrame, dataset_size: int, epochs: float, price_per_gpu_hour: float,
                     max_hours: float | None = None) -> pd.Series:
    """The row that finishes within max_hours at least cost (then soonest), or, without a deadline,
    the one that finishes first (then cheapest)."""
    eta = with_eta(table, dataset_size, epochs, price_per_gpu_hour)
    if max_hours is None:
        return eta.sort_values(["hours", "cost", "gpus"]).iloc[0]
    if max_hours <= 0:
        raise FtplanError(f"--max-hours must be positive, got {max_hours}")
    in_time = eta[eta["hours"] <= max_hours]
    if in_time.empty:
        fastest = eta.sort_values("hours").iloc[0]
        raise FtplanError(f"no GPU count finishes within {max_hours:g} h; the fastest, {int(fastest['gpus'])} GPUs, "
                          f"needs {fastest['hours']:.1f} h")
    return in_time.sort_values(["cost", "hours", "gpus"]).iloc[0]


def plot_scaling(tables: dict[str, pd.DataFrame], path: Path) -> Path:
    """Speed-up and efficiency against GPU count, one line per table (e.g. 'full', 'LoRA r16')."""
    import matplotlib  # noqa: PLC0415 - plotting is optional at import time

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, (speed, efficiency) = plt.subplots(1, 2, figsize=(11, 4.2))
    counts = sorted({g for t in tables.values() for g in t["gpus"]})
    speed.plot(counts, counts, color="grey", linestyle=":", label="ideal")
    for label, table in tables.items():
        speed.plot(table["gpus"], table["speedup"], marker="o", label=label)
        efficiency.plot(table["gpus"], table["efficiency"], marker="o", label=label)
    for axis in (speed, efficiency):
        axis.set_xscale("log", base=2)
        axis.set_xticks(counts, [str(c) for c in counts])
        axis.set_xlabel("GPUs")
        axis.grid(True, alpha=0.3)
    speed.set_yscale("log", base=2)
    speed.set_ylabel("speed-up over one GPU")
    efficiency.set_ylim(0, max([1.0, *(t["efficiency"].max() for t in tables.values())]) * 1.05)  # superlinear with ZeRO
    efficiency.set_ylabel("scaling efficiency (speed-up / GPUs)")
    speed.legend()
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
