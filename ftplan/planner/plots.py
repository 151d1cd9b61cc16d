"""The report's charts: memory and step time against batch per calibrated setting, and time to completion.

matplotlib (Agg, no display) is imported inside the functions, so the rest of the planner never
pays for it. Curves come from the same Predictor and budget the planner searches with, so the
charts show exactly what `ftplan plan` decided from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ftplan.core.hardware import GpuSpec
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.safe_batch import MemoryBudget
from ftplan.planner.eta import estimate_eta
from ftplan.planner.search import PlanRequest, Predictor, safe_prediction

MEMORY_PNG = "memory_vs_batch.png"
TIME_PNG = "seconds_per_step_vs_batch.png"
COMPLETION_PNG = "time_to_completion_vs_batch.png"
SCALING_PNG = "scaling_{model}_{gpu}.png"


@dataclass(frozen=True)
class Curves:
    """One calibrated setting on one GPU: its measured points and the predictor's curves over batch."""

    label: str
    setting: Setting
    gpu: GpuSpec
    budget: MemoryBudget
    measured: list[dict]          # ok records
    oom_batches: list[int]
    batches: list[int]
    reserved: list[tuple[float, float]]   # (mean, upper) bytes
    allocated: list[float]
    seconds: list[tuple[float, float]]
    safe_batch: int


def collect_curves(records: list[dict], predictor: Predictor, gpus: dict[str, GpuSpec],
                   budgets: dict[str, MemoryBudget]) -> list[Curves]:
    """Curves of every (setting, GPU) among the records; gpus and budgets map record GPU names to cards."""
    groups: dict[tuple[Setting, str], list[dict]] = {}
    for record in records:
        if record.get("gpu_name") in gpus:
            groups.setdefault((Setting.from_dict(record), record["gpu_name"]), []).append(record)
    curves = []
    for (setting, gpu_name), group in sorted(groups.items(), key=lambda item: (item[0][1], item[0][0].label())):
        ok = sorted((r for r in group if r["status"] == "ok" and r.get("peak_allocated_bytes")),
                    key=lambda r: r["micro_batch"])
        if not ok:
            continue
        gpu, budget = gpus[gpu_name], budgets[gpu_name]
        ooms = sorted(r["micro_batch"] for r in group if r["status"] == "oom")
        best = safe_prediction(lambda b: predictor.predict(setting, b, gpu), budget)
        safe = best.micro_batch if best else 0
        top = max([r["micro_batch"] for r in ok] + ooms + [safe])
        batches = list(range(1, math.ceil(top * 1.25) + 1))
        predictions = [predictor.predict(setting, b, gpu) for b in batches]
        curves.append(Curves(f"{setting.label()} {setting.precision}" + (f" {setting.alloc_conf}" if setting.alloc_conf else "")
                             + f" on {gpu.name}", setting, gpu, budget, ok, ooms, batches,
                             [(p.peak_reserved.mean, p.peak_reserved.upper) for p in predictions],
                             [p.peak_allocated.mean for p in predictions],
                             [(p.seconds_per_step.mean, p.seconds_per_step.upper) for p in predictions], safe))
    return curves


def _grid(count: int):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, count)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.2 * columns, 4.6 * rows), squeeze=False)
    for axis in axes.flat[count:]:
        axis.set_visible(False)
    return plt, figure, list(axes.flat[:count])


def _integer_batches(axis) -> None:
    from matplotlib.ticker import MaxNLocator
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(plt, figure, path: Path, title: str) -> Path:
    figure.suptitle(title, fontsize=14)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_memory(curves: list[Curves], path: Path) -> Path:
    """Measured peak reserved/allocated, the fitted reserved line with its upper bound, the card and the usable limit."""
    plt, figure, axes = _grid(len(curves))
    for axis, c in zip(axes, curves):
        mean = [m / GIB for m, _ in c.reserved]
        upper = [u / GIB for _, u in c.reserved]
        axis.fill_between(c.batches, mean, upper, color="tab:blue", alpha=0.2, label="reserved: upper bound")
        axis.plot(c.batches, mean, color="tab:blue", label="reserved: prediction")
        axis.plot(c.batches, [a / GIB for a in c.allocated], color="tab:green", ls="--", label="allocated: prediction")
        axis.scatter([r["micro_batch"] for r in c.measured], [r.get("peak_reserved_bytes", 0) / GIB for r in c.measured],
                     color="tab:blue", zorder=3, label="reserved: measured")
        axis.scatter([r["micro_batch"] for r in c.measured], [r["peak_allocated_bytes"] / GIB for r in c.measured],
                     color="tab:green", marker="s", zorder=3, label="allocated: measured")
        axis.axhline(c.budget.capacity_bytes / GIB, color="black", lw=1.5, label=f"card: {c.budget.capacity_bytes / GIB:.0f} GiB")
        axis.axhline(c.budget.usable_bytes / GIB, color="tab:red", ls=":", label=f"usable: {c.budget.usable_bytes / GIB:.1f} GiB")
        for batch in c.oom_batches:
            axis.axvline(batch, color="tab:red", alpha=0.5, lw=3, label="OOM" if batch == c.oom_batches[0] else None)
        if c.safe_batch:
            axis.axvline(c.safe_batch, color="tab:purple", ls="--", label=f"largest safe batch {c.safe_batch}")
        axis.set(title=c.label, xlabel="micro-batch per GPU", ylabel="peak memory per GPU (GiB)",
                 ylim=(0, c.budget.capacity_bytes / GIB * 1.08))
        axis.grid(alpha=0.3)
        _integer_batches(axis)
        axis.legend(fontsize=7, loc="lower right")
    return _save(plt, figure, path, "Peak memory vs micro-batch (points measured; lines: ftplan's prediction)")


def plot_seconds(curves: list[Curves], path: Path) -> Path:
    """Measured and predicted seconds per optimizer step."""
    plt, figure, axes = _grid(len(curves))
    for axis, c in zip(axes, curves):
        axis.fill_between(c.batches, [m for m, _ in c.seconds], [u for _, u in c.seconds], color="tab:orange",
                          alpha=0.2, label="upper bound")
        axis.plot(c.batches, [m for m, _ in c.seconds], color="tab:orange", label="prediction")
        timed = [r for r in c.measured if r.get("seconds_per_step")]
        axis.scatter([r["micro_batch"] for r in timed], [r["seconds_per_step"] for r in timed], color="tab:orange",
                     zorder=3, label="measured")
        if c.safe_batch:
            axis.axvline(c.safe_batch, color="tab:purple", ls="--", label=f"largest safe batch {c.safe_batch}")
        axis.set(title=c.label, xlabel="micro-batch per GPU", ylabel="seconds per step", ylim=(0, None))
        axis.grid(alpha=0.3)
        _integer_batches(axis)
        axis.legend(fontsize=8, loc="upper left")
    return _save(plt, figure, path, "Seconds per optimizer step vs micro-batch")


def plot_completion(curves: list[Curves], dataset_size: int, epochs: float, path: Path) -> Path:
    """Hours to finish against batch, per setup, up to its largest safe batch; a line at the best of all."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(11, 6.5))
    best = None
    for c in curves:
        safe = [b for b in c.batches if b <= c.safe_batch]
        if not safe:
            continue
        hours = [estimate_eta(c.seconds[b - 1][0], dataset_size, epochs, b, c.setting.world_size).hours for b in safe]
        line, = axis.plot(safe, hours, marker=".", label=c.label)
        axis.scatter([safe[-1]], [hours[-1]], color=line.get_color(), s=60, zorder=3)
        if best is None or hours[-1] < best[0]:
            best = (hours[-1], c.label, safe[-1])
    if best is not None:
        axis.axhline(best[0], color="black", ls="--", label=f"best: {best[1]}, batch {best[2]}, {best[0]:.2f} h")
    axis.set(xlabel="micro-batch per GPU (up to the largest safe batch, dot)", ylabel="hours to completion",
             title=f"Time to completion vs micro-batch: {dataset_size:,} samples × {epochs:g} epochs", ylim=(0, None))
    axis.grid(alpha=0.3)
    _integer_batches(axis)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_gpu_scaling(predictor: Predictor, inter_node_gbs: float, base: Setting, gpu: GpuSpec, budget: MemoryBudget,
                     gpu_counts: list[int], gpus_per_node: int, dataset_size: int, epochs: float,
                     extra: list[Setting], out: Path) -> Path:
    """Speed-up and efficiency against GPU count of the best full and LoRA setup (ftplan.planner.scaling.plot_scaling)."""
    from ftplan.planner.gpu_counts import plan_gpu_counts
    from ftplan.planner.scaling import plot_scaling

    request = PlanRequest(base=base, dataset_size=dataset_size, epochs=epochs, gpu=gpu, budget=budget)
    scaling = plan_gpu_counts(predictor, request, gpu_counts, gpus_per_node, extra)
    between = f", {inter_node_gbs * 1000:g} MB/s between nodes"
    tables = {f"{base.model} {'LoRA' if kind == 'lora' else kind}, {gpus_per_node}/node{between}": table
              for kind, table in scaling.tables.items() if not table.empty and not table["speedup"].isna().all()}
    return plot_scaling(tables, out / SCALING_PNG.format(model=base.model, gpu=gpu.name))
