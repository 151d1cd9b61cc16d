"""The report's charts: memory and step time against batch per calibrated setting, time to completion, scaling.

matplotlib (Agg, no display) is imported inside the functions, so the rest of the planner never
pays for it. Curves come from the same Predictor and budget the planner searches with, so the
charts show exactly what `ftplan plan` decided from. Every chart names its model, card and sequence
length in its panel titles and explains its marks in one legend, so a PNG read on its own says
what it shows.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ftplan.core.hardware import GpuSpec
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.eta import estimate_eta, largest_micro_batch
from ftplan.models.safe_batch import MemoryBudget
from ftplan.planner.search import PlanRequest, Predictor, safe_prediction

if TYPE_CHECKING:
    import pandas as pd

MEMORY_PNG = "memory_vs_batch.png"
TIME_PNG = "seconds_per_step_vs_batch.png"
COMPLETION_PNG = "time_to_completion_vs_batch.png"
SCALING_PNG = "scaling_{model}_{gpu}.png"
COLUMNS = 3  # panels per row


@dataclass(frozen=True)
class Curves:
    """One calibrated setting on one GPU: its measured points and the predictor's curves over batch."""

    label: str                    # the setting without its model, e.g. 'ddp liger full s2048'
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

    @property
    def title(self) -> str:
        """Model first: several models share a setting's label."""
        return f"{self.setting.model}: {self.label} on {self.gpu.name}"


def collect_curves(records: list[dict], predictor: Predictor, gpus: dict[str, GpuSpec],
                   budgets: dict[str, MemoryBudget]) -> list[Curves]:
    """Curves of every (setting, GPU) among the records, by model; gpus and budgets map record GPU names to cards."""
    groups: dict[tuple[Setting, str], list[dict]] = {}
    for record in records:
        if record.get("gpu_name") in gpus:
            groups.setdefault((Setting.from_dict(record), record["gpu_name"]), []).append(record)
    curves = []
    for (setting, gpu_name), group in sorted(groups.items(), key=lambda item: (item[0][0].model, item[0][1],
                                                                                item[0][0].label())):
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
        curves.append(Curves(" ".join(filter(None, [setting.label(), setting.alloc_conf])), setting, gpu, budget, ok,
                             ooms, batches, [(p.peak_reserved.mean, p.peak_reserved.upper) for p in predictions],
                             [p.peak_allocated.mean for p in predictions],
                             [(p.seconds_per_step.mean, p.seconds_per_step.upper) for p in predictions], safe))
    return curves


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _grid(count: int, panel: tuple[float, float] = (6.2, 4.4)):
    """A figure of `count` panels, laid out by matplotlib so titles, suptitle and legend never overlap."""
    plt = _pyplot()
    columns = min(COLUMNS, count)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(panel[0] * columns, panel[1] * rows + 1.2), squeeze=False,
                                layout="constrained")
    for axis in axes.flat[count:]:
        axis.set_visible(False)
    return plt, figure, list(axes.flat[:count])


def _integer_batches(axis) -> None:
    from matplotlib.ticker import MaxNLocator
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(plt, figure, path: Path, title: str, legend_axis=None, columns: int = 5) -> Path:
    """The title on top with one legend for every panel under it (their marks mean the same everywhere):
    the legend carries the title, as a suptitle and a figure legend overlap in matplotlib's layout."""
    title = textwrap.fill(title, int(figure.get_figwidth() * 8))  # about 8 characters an inch at 15 points
    if legend_axis is None:
        figure.suptitle(title, fontsize=15)
    else:
        handles, labels = legend_axis.get_legend_handles_labels()
        fit = max(1, int(figure.get_figwidth() / 3.2))  # entries a row that fit: about 3 inches each
        figure.legend(handles, labels, loc="outside upper center", ncols=min(columns, len(labels), fit), fontsize=11,
                      title=title, title_fontsize=15, frameon=False)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _limits(c: Curves) -> str:
    """The numbers behind a panel's lines, for its second title line."""
    oom = f", first OOM {c.oom_batches[0]}" if c.oom_batches else ""
    safe = f"largest safe batch {c.safe_batch}" if c.safe_batch else "no safe batch"
    return f"{safe}{oom}; usable {c.budget.usable_bytes / GIB:.1f} of {c.budget.capacity_bytes / GIB:.1f} GiB"


def plot_memory(curves: list[Curves], path: Path) -> Path:
    """Measured peak reserved/allocated, the fitted reserved line with its upper bound, the card and the usable limit."""
    plt, figure, axes = _grid(len(curves))
    for axis, c in zip(axes, curves):
        mean = [m / GIB for m, _ in c.reserved]
        upper = [u / GIB for _, u in c.reserved]
        axis.fill_between(c.batches, mean, upper, color="tab:blue", alpha=0.2, label="reserved: upper bound (planned)")
        axis.plot(c.batches, mean, color="tab:blue", label="reserved: prediction")
        axis.plot(c.batches, [a / GIB for a in c.allocated], color="tab:green", ls="--", label="allocated: prediction")
        axis.scatter([r["micro_batch"] for r in c.measured], [r.get("peak_reserved_bytes", 0) / GIB for r in c.measured],
                     color="tab:blue", zorder=3, label="reserved: measured")
        axis.scatter([r["micro_batch"] for r in c.measured], [r["peak_allocated_bytes"] / GIB for r in c.measured],
                     color="tab:green", marker="s", zorder=3, label="allocated: measured")
        axis.axhline(c.budget.capacity_bytes / GIB, color="black", lw=1.5, label="card's capacity")
        axis.axhline(c.budget.usable_bytes / GIB, color="tab:red", ls=":", label="usable (capacity less margins)")
        for batch in c.oom_batches:
            axis.axvline(batch, color="tab:red", alpha=0.5, lw=3, label="ran out of memory" if batch == c.oom_batches[0] else None)
        if c.safe_batch:
            axis.axvline(c.safe_batch, color="tab:purple", ls="--", label="largest safe batch (plan)")
        axis.set_title(f"{c.title}\n{_limits(c)}", fontsize=10)
        axis.set(xlabel="micro-batch per GPU", ylabel="peak memory per GPU (GiB)",
                 ylim=(0, c.budget.capacity_bytes / GIB * 1.08))
        axis.grid(alpha=0.3)
        _integer_batches(axis)
    legend = max(axes, key=lambda a: len(a.get_legend_handles_labels()[1]))  # the panel that shows every mark
    return _save(plt, figure, path, "Peak memory per GPU against micro-batch: points measured, lines ftplan's "
                                    "prediction", legend)


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
            axis.axvline(c.safe_batch, color="tab:purple", ls="--", label="largest safe batch (plan)")
        safe = f"largest safe batch {c.safe_batch}" if c.safe_batch else "no safe batch"
        axis.set_title(f"{c.title}\n{safe}", fontsize=10)
        axis.set(xlabel="micro-batch per GPU", ylabel="seconds per optimizer step", ylim=(0, None))
        axis.grid(alpha=0.3)
        _integer_batches(axis)
    legend = max(axes, key=lambda a: len(a.get_legend_handles_labels()[1]))
    return _save(plt, figure, path, "Seconds per optimizer step against micro-batch: points measured, lines "
                                    "ftplan's prediction", legend)


def _completion_label(c: Curves, seq_len: int) -> str:
    """The setup without the panel's length; rows of exactly that length say so (plan's recipe pads, with a mask,
    and a 'fastest' without the word read as plan's batch, one larger than plan gave)."""
    return c.label.replace(f" s{seq_len}", "") + (" unpadded" if c.setting.padding == "none" else "")


def plot_completion(curves: list[Curves], dataset_size: int, epochs: float, path: Path) -> Path:
    """Hours to finish against batch, one panel per model, sequence length and card (only those runs are
    comparable), one line per setup up to its largest safe batch, and a line at the panel's fastest. Not `plan`'s
    pick: the panel holds every calibrated padding (equal-length rows among them), plan weighs the one asked."""
    panels = completion_panels(curves)
    plt, figure, axes = _grid(max(1, len(panels)), panel=(7.0, 4.8))
    for axis, ((model, seq_len, gpu), group) in zip(axes, panels.items()):
        best = None
        for c in group:
            largest = min(c.safe_batch, largest_micro_batch(dataset_size, c.setting.world_size))
            safe = [b for b in c.batches if b <= largest]
            hours = [estimate_eta(c.seconds[b - 1][0], dataset_size, epochs, b, c.setting.world_size).hours for b in safe]
            line, = axis.plot(safe, hours, marker=".", label=_completion_label(c, seq_len))
            axis.scatter([safe[-1]], [hours[-1]], color=line.get_color(), s=60, zorder=3)
            if best is None or hours[-1] < best[0]:
                best = (hours[-1], _completion_label(c, seq_len), safe[-1])
        axis.axhline(best[0], color="black", ls="--",
                     label=f"fastest calibrated: {best[1]}, batch {best[2]}, {best[0]:.2f} h")
        axis.set_title(f"{model}, {seq_len} tokens a sample, on {gpu}", fontsize=11)
        axis.set(xlabel="micro-batch per GPU (dot: largest safe batch)", ylabel="hours to completion", ylim=(0, None))
        axis.grid(alpha=0.3)
        _integer_batches(axis)
        axis.legend(fontsize=8, loc="upper right")
    if not panels:
        axes[0].text(0.5, 0.5, "no calibrated setting has a safe batch on its card", ha="center",
                     transform=axes[0].transAxes)
    return _save(plt, figure, path, f"Hours to train {dataset_size:,} samples × {epochs:g} epoch"
                                    f"{'' if epochs == 1 else 's'} against micro-batch, per setup "
                                    "(compare within a panel: same model, length and card)")


def completion_panels(curves: list[Curves]) -> dict[tuple[str, int, str], list[Curves]]:
    """Curves with a safe batch by (model, sequence length, card): times compare only within one of these."""
    panels: dict[tuple[str, int, str], list[Curves]] = {}
    for c in curves:
        if c.safe_batch:
            panels.setdefault((c.setting.model, c.setting.seq_len, c.gpu.name), []).append(c)
    return panels


def plot_gpu_scaling(predictor: Predictor, inter_node_gbs: float, base: Setting, gpu: GpuSpec, budget: MemoryBudget,
                     gpu_counts: list[int], gpus_per_node: int, dataset_size: int, epochs: float,
                     extra: list[Setting], out: Path) -> Path:
    """Speed-up and scaling efficiency against GPU count of the best full and LoRA setup, with where nodes start,
    where the best setup changes, and why any efficiency passes 100%."""
    from ftplan.planner.gpu_counts import plan_gpu_counts

    request = PlanRequest(base=base, dataset_size=dataset_size, epochs=epochs, gpu=gpu, budget=budget)
    scaling = plan_gpu_counts(predictor, request, gpu_counts, gpus_per_node, extra)
    tables = {kind: table for kind, table in scaling.tables.items()
              if not table.empty and not table["speedup"].isna().all()}
    notes = above_ideal_notes(tables)
    plt = _pyplot()
    height = 0.25 * sum(len(note) // 160 + 1 for note in notes) + 0.2
    figure = plt.figure(figsize=(14, 5.6 + height), layout="constrained")
    grid = figure.add_gridspec(2 if notes else 1, 2, height_ratios=[5.6, height] if notes else None)
    speed, efficiency = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])
    counts = sorted({g for t in tables.values() for g in t["gpus"]}) or sorted(gpu_counts)
    _draw_best_setups(speed, efficiency, tables, counts)
    _style_scaling_axes(speed, efficiency, tables, counts, gpus_per_node, inter_node_gbs)
    figure.suptitle(f"{base.model} on {gpu.name}, {base.seq_len} tokens a sample, {gpus_per_node} GPUs a node: "
                    "best full and LoRA setup at each GPU count (labels: where the best setup changes)", fontsize=12)
    if notes:
        _write_notes(figure.add_subplot(grid[1, :]), notes)
    path = out / SCALING_PNG.format(model=base.model, gpu=gpu.name)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _draw_best_setups(speed, efficiency, tables: dict, counts: list[int]) -> None:
    """Each kind's curves against the ideal, each named where its best setup changes: that is where a curve bends."""
    from ftplan.planner.gpu_counts import KINDS

    speed.plot(counts, counts, color="grey", ls=":", label="ideal (speed-up = GPUs)")
    efficiency.axhline(1.0, color="grey", ls=":")
    for index, (kind, table) in enumerate(tables.items()):
        line, = speed.plot(table["gpus"], table["speedup"], marker="o", label=KINDS[kind])
        efficiency.plot(table["gpus"], table["efficiency"], marker="o", color=line.get_color(), label=KINDS[kind])
        previous = None
        for row in table.to_dict("records"):
            setup = _setup_words(row["setting"])
            if setup != previous:  # name the setup where the best one changes
                speed.annotate(setup, (row["gpus"], row["speedup"]), textcoords="offset points", fontsize=8,
                               xytext=(6, -14) if index == 0 else (-6, 8), ha="left" if index == 0 else "right",
                               color=line.get_color())
            previous = setup


def _style_scaling_axes(speed, efficiency, tables: dict, counts: list[int], gpus_per_node: int,
                        inter_node_gbs: float) -> None:
    """Shade the counts that span nodes, since the network, not the GPUs, sets their speed; then scales and legends."""
    if max(counts) > gpus_per_node:
        for axis in (speed, efficiency):
            axis.axvspan(gpus_per_node * 2 ** 0.5, max(counts) * 1.3, color="tab:red", alpha=0.07,
                         label=f"several nodes: {_rate(inter_node_gbs)} between them")
    for axis in (speed, efficiency):
        axis.set_xscale("log", base=2)
        axis.set_xlim(min(counts) / 1.3, max(counts) * 1.3)
        axis.set_xticks(counts, [str(c) for c in counts])
        axis.set_xlabel("GPUs")
        axis.grid(True, alpha=0.3)
    speed.set_yscale("log", base=2)
    speed.set_ylabel("speed-up over the best setup on one GPU (samples/s)")
    speed.legend(fontsize=9, loc="upper left")
    top = max([1.0, *(t["efficiency"].max() for t in tables.values())])
    efficiency.set_ylim(0, top * 1.1)
    efficiency.set_ylabel("scaling efficiency (speed-up / GPUs)")
    efficiency.legend(fontsize=9, loc="lower left")


def _write_notes(text, notes: list[str]) -> None:
    """Why an efficiency passes 100%, under the charts: a reader would otherwise take it for a bug."""
    text.axis("off")
    lines = [textwrap.fill(note, 160, subsequent_indent="    ") for note in notes]
    text.text(0, 1, "Efficiency above 100% (more than linear):\n" + "\n".join(lines), fontsize=9, va="top",
              transform=text.transAxes)


def above_ideal_notes(tables: dict) -> list[str]:
    """One sentence for each GPU count that scales better than linearly (from 100.5%, which reads above
    100%), saying why: the scaling table's `above_ideal` column where it has one."""
    from ftplan.planner.gpu_counts import KINDS

    return [f"{KINDS[kind]} at {row['gpus']} GPUs, {row['efficiency']:.0%}: "
            + (row.get("above_ideal") or "more GPUs let a larger batch or a setup without CPU offload fit than on one")
            for kind, table in tables.items() for row in table.to_dict("records") if row["efficiency"] >= 1.005]


def _setup_words(setting: dict) -> str:
    """A setup's label without its sequence length and GPU count (the chart's axes say them)."""
    one = Setting.from_dict(setting).with_(gpus=1, nodes=1)
    return one.label().replace(f" s{one.seq_len}", "")


def _rate(gbs: float) -> str:
    return f"{gbs:g} GB/s" if gbs >= 1 else f"{gbs * 1000:g} MB/s"


def plot_scaling(tables: dict[str, pd.DataFrame], path: Path) -> Path:
    """Speed-up and efficiency against GPU count, one line per table (e.g. 'full', 'LoRA r16')."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
