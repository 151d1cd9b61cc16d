"""Scaling over GPU counts: speed-up, efficiency, and the count that meets a deadline at least cost.

One row per GPU count from the time model of ftplan.models.communication, so the planner can answer
`--gpus 1..128` and the report can plot full against LoRA fine-tuning.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from ftplan.core.errors import FtplanError
from ftplan.core.settings import MAX_GPUS
from ftplan.models.communication.estimates import step_time_cv
from ftplan.models.communication.links import Links
from ftplan.models.communication.step import data_parallel_step_seconds
from ftplan.models.communication.traffic import DEFAULT_BACKWARD_FRACTION, DEFAULT_OVERLAP

if TYPE_CHECKING:  # the tables are built for GPU-count plans only; a one-GPU plan needs no pandas
    import pandas as pd

DEFAULT_GPUS_PER_NODE = 8  # a full cloud or DGX node; `--gpus-per-node 1` for single-GPU instances
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")
MAX_GPU_COUNTS = 32  # each count is a whole setup search (about a second): 200 listed ran over 300 s
MAX_COUNT_DIGITS = 40  # far above any cluster; int() of 4,301 digits raises, and doubling to them takes forever


def parse_gpu_counts(text: str) -> list[int]:
    """GPU counts from '8', '1,2,4,8' or '1..128' (a range doubles from its start: 1,2,4,...,128;
    its end is always included); parts can be mixed: '1..8,12'."""
    counts: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        match = _RANGE.match(part)
        if match and max(len(match[1]), len(match[2])) <= MAX_COUNT_DIGITS:
            start, end = int(match[1]), int(match[2])
            if start < 1 or end < start:
                raise FtplanError(f"GPU range '{part}' must go up from at least 1, e.g. 1..128")
            doublings = (end // start).bit_length()  # exact: a float's log2 overflowed at 1..1e400
            _check_how_many(doublings)
            counts.update(start * 2**i for i in range(doublings))
            counts.add(end)
        elif part.isdigit() and len(part) <= MAX_COUNT_DIGITS and int(part) >= 1:
            counts.add(int(part))
        else:
            raise FtplanError(f"cannot read GPU count '{part[:40]}' in --gpus: give e.g. 8, 1,2,4,8 or 1..128")
        _check_how_many(len(counts))
    return sorted(counts)


def _check_how_many(counts: int) -> None:
    if counts > MAX_GPU_COUNTS:
        raise FtplanError(f"more than {MAX_GPU_COUNTS} GPU counts given; at most {MAX_GPU_COUNTS} are planned (each is "
                          "a whole setup search): give fewer, e.g. a doubling range such as 1..128")


def node_layout(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(GPUs per node, nodes) for `gpus` GPUs in all: as few nodes of at most gpus_per_node GPUs as
    hold them evenly (9 GPUs at 8 per node: 3 nodes of 3), since every node runs the same ranks."""
    if gpus < 1 or gpus_per_node < 1:
        raise FtplanError(f"GPU counts must be positive, got {gpus} GPUs at {gpus_per_node} per node")
    if gpus > MAX_GPUS:  # the search for an even split steps through node counts: a 20-digit prime never ended
        raise FtplanError(f"{gpus:,} GPUs is more than any cluster ({MAX_GPUS:,} at most); check --gpus")
    nodes = math.ceil(gpus / gpus_per_node)
    while gpus % nodes:
        nodes += 1
    return gpus // nodes, nodes


def fixed_layout(gpus: int, nodes: int) -> tuple[int, int]:
    """(GPUs per node, nodes) when the user names the node count: the GPUs must split evenly."""
    if gpus % nodes:
        raise FtplanError(f"{gpus} GPUs do not split evenly over {nodes} nodes; --gpus counts GPUs in all")
    return gpus // nodes, nodes


def with_step_time_cv(links: Links, cv: float | None, records: list[dict]) -> tuple[Links, str]:
    """The links carrying the cluster's step-time spread, and a sentence saying where it came from:
    --step-time-cv when given, else the pooled spread of the calibration records' timed steps."""
    if cv is not None:
        return replace(links, step_time_cv=cv), f"Step-time spread: cv {cv:g} (--step-time-cv)."
    timed = sum(1 for r in records if r.get("status") == "ok" and len(r.get("step_seconds") or []) >= 3)
    measured = step_time_cv(records)
    if not timed:
        return replace(links, step_time_cv=0.0), ("Step-time spread: none assumed (no calibration record times "
                                                  "several steps; --step-time-cv sets your cluster's).")
    return replace(links, step_time_cv=measured), (
        f"Step-time spread: cv {measured:.3g}, pooled over {timed} calibration records (a dedicated GPU; shared cloud "
        "instances vary more: --step-time-cv sets yours).")


def scaling_table(single_gpu_seconds: float, gradient_bytes: int, micro_batch: int, gpu_counts: list[int],
                  gpus_per_node: int, links: Links, overlap: float = DEFAULT_OVERLAP, cv: float = 0.0, *,
                  gathered_parameter_bytes: int = 0, offloaded_bytes: int = 0,
                  backward_fraction: float = DEFAULT_BACKWARD_FRACTION) -> pd.DataFrame:
    """Per GPU count: nodes, seconds per step, samples/s, speed-up over one GPU and efficiency.

    single_gpu_seconds is one GPU's optimizer step without communication; micro_batch is per GPU.
    """
    import pandas as pd

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
        per_node, nodes = node_layout(gpus, gpus_per_node)
        rows.append({"gpus": gpus, "gpus_per_node": per_node, "nodes": nodes, "samples_per_step": micro_batch * gpus,
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
                     max_hours: float | None = None, by: str = "time") -> pd.Series:
    """The row that finishes within max_hours at least cost (then soonest), or, without a deadline, the one
    that finishes first (then cheapest), or the cheapest (then soonest) when ranked by cost."""
    eta = with_eta(table, dataset_size, epochs, price_per_gpu_hour)
    if max_hours is None:
        order = ["cost", "hours", "gpus"] if by == "cost" else ["hours", "cost", "gpus"]
        return eta.sort_values(order).iloc[0]
    if max_hours <= 0:
        raise FtplanError(f"--max-hours must be positive, got {max_hours}")
    in_time = eta[eta["hours"] <= max_hours]
    if in_time.empty:
        fastest = eta.sort_values("hours").iloc[0]
        raise FtplanError(f"no GPU count finishes within {max_hours:g} h; the fastest, {int(fastest['gpus'])} GPUs, "
                          f"needs {fastest['hours']:.1f} h")
    return in_time.sort_values(["cost", "hours", "gpus"]).iloc[0]

