"""Printing at the edge: rich tables for people, plain dicts for --json. No decisions are made here."""

from __future__ import annotations

import math
import os
import re

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from ftplan.core.hardware import CPU, GpuSpec
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.communication.layout import describe_layout
from ftplan.models.eta import Eta, format_duration
from ftplan.models.prediction import SOURCE_MEASURED, Prediction
from ftplan.models.safe_batch import MemoryBudget
from ftplan.planner import advice
from ftplan.planner.gpu_counts import KINDS, UNCHECKED, ScalingPlan
from ftplan.planner.search import Plan, SetupPlan, fits_budget

SOURCE_STYLE = {"measured": "green", "interpolated": "green", "extrapolated": "yellow"}  # anything else: red
# Piped output has no terminal to measure and rich would assume 80 columns; files and pagers take wider lines,
# and prose is left unwrapped there so that grep finds whole sentences.
PIPED_WIDTH = 120
KIND_NAMES = {"full": "full fine-tuning", "lora": "LoRA"}
# A rule under the header, no other lines, one space of padding between columns: tables that fit 100 columns.
GPU_WORD = re.compile(r"\d+(x\d+)?gpu")  # the GPU count in a setup's label
COMPACT = {"box": box.SIMPLE_HEAD, "pad_edge": False, "collapse_padding": True, "show_edge": False}


def make_console() -> Console:
    """A console as wide as the terminal (rich measures it, $COLUMNS overrides); piped, PIPED_WIDTH columns
    for tables and unwrapped prose."""
    console = Console()
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(width=PIPED_WIDTH, soft_wrap=True)
    return console


def print_table(console: Console, table: Table) -> None:
    """Print a table within the console's width, wrapping only its text columns and never below their longest
    word; when even that is too wide, print it wider. rich alone would cut cells ("6,738,415,6…"), and a cut
    number is a wrong number."""
    unbounded = console.options.update_width(10**4)
    spans = []  # (narrowest, widest) content width of each column
    for column in table.columns:
        sizes = [Measurement.get(console, unbounded, cell) for cell in [column.header, *column.cells]]
        widest = max(size.maximum for size in sizes)
        spans.append((widest if column.no_wrap else max(size.minimum for size in sizes), widest))
    natural = Measurement.get(console, unbounded, table).maximum
    widths = [widest for _, widest in spans]
    excess = natural - console.width
    while excess > 0:  # narrow the text column with the most room above its longest word, a character at a time
        shrinkable = [k for k, width in enumerate(widths) if width > spans[k][0]]
        if not shrinkable:
            break
        widths[max(shrinkable, key=lambda k: widths[k] - spans[k][0])] -= 1
        excess -= 1
    for column, width in zip(table.columns, widths):
        column.width = width
    need = natural - sum(widest for _, widest in spans) + sum(widths)
    if need <= console.width:
        console.print(table)
        return
    width = console.width
    console.width = need
    try:
        console.print(table)
    finally:
        console.width = width


def _cost(eta: Eta) -> str:
    return "-" if eta.cost is None else f"{eta.cost:,.2f}"


def _samples(request) -> str:
    rows = "packed rows" if request.base.padding == "packed" else "samples"  # a packed plan counts its rows
    return f"{request.dataset_size:,} {rows} × {request.epochs:g} epoch{'' if request.epochs == 1 else 's'}"


def _per_device(request) -> str:
    return "of this host's RAM" if request.gpu.name == CPU else "per GPU"


def _source_cell(label: str) -> str:
    return f"[{SOURCE_STYLE.get(label.split(' ')[0], 'red')}]{label}[/]"


def _host_cell(setup: SetupPlan) -> str:
    """Host RAM per node an offload row needs (a lower bound: the process itself comes on top)."""
    if not setup.host_bytes:
        return "-"
    return f"≥{setup.host_bytes / GIB:,.1f}" if setup.host_bytes >= 0.05 * GIB else "<0.1"


def table_label(label: str, seq_len: int) -> str:
    """A setup's label without what the table already says elsewhere (sequence length, GPU count)."""
    return " ".join(word for word in label.split() if word != f"s{seq_len}" and not GPU_WORD.fullmatch(word))


def _plan_rows(plan: Plan, show_all: bool) -> list[list[SetupPlan]]:
    """The rows to show, in sections: every setup of the kind asked for (--full, --lora, or both) with
    show_all, else the best of each family by kind of training, the recommendation's kind first."""
    rec = plan.recommended
    if show_all:
        return [plan.candidates]
    rows = advice.family_best(plan)
    kinds = ["full", "lora"] if plan.request.training == "any" else [plan.request.training]
    if rec is not None and rec.training in kinds:
        kinds.sort(key=lambda kind: kind != rec.training)
        rows.sort(key=lambda s: s is not rec)  # on top even when a faster, less measured setup ranks above it
    return [section for kind in kinds if (section := [s for s in rows if s.training == kind])]


def plan_table(plan: Plan, failed: dict[Setting, str], show_all: bool = False) -> Table:
    """The ranked setups: with show_all every one, else the best of each family (see _plan_rows).

    Columns are few and short so the table fits a 100-column terminal; `#` is the rank among the setups of
    the kind asked for.
    """
    sections = _plan_rows(plan, show_all)
    priced = plan.request.price_per_gpu_hour is not None
    offload = any(s.host_bytes for section in sections for s in section)
    table = Table(title=_plan_title(plan, sections, show_all), **COMPACT)
    _add_plan_columns(table, priced, offload, plan.request.host_memory_gib)
    rank = {id(s): i for i, s in enumerate(plan.candidates, start=1)}
    for section in sections:
        for setup in section:
            table.add_row(*_plan_cells(plan, setup, rank[id(setup)], failed, priced, offload),
                          style="bold" if setup is plan.recommended else None)
        table.add_section()
    return table


def _plan_title(plan: Plan, sections: list[list[SetupPlan]], show_all: bool) -> str:
    """What the table is of, and how much of the plan it leaves out, so a short table is not read as all there is."""
    request = plan.request
    usable = request.budget.usable_bytes / GIB
    shown, kind = sum(map(len, sections)), {"any": "", "full": " full fine-tuning", "lora": " LoRA"}[request.training]
    limit = f" within --max-hours {request.max_hours:g}" if request.max_hours is not None else ""
    which = (f"no{kind} setup fits{limit}" if not plan.candidates else f"every{kind} setup that fits" if show_all else
             f"best of each family, {shown} of {len(plan.candidates)}{kind} setups that fit (--all lists every one)")
    return (f"{request.base.model}, {_samples(request)}, seq {request.base.seq_len}, "
            f"{request.base.world_size} × {request.gpu.name} ({usable:.1f} GiB usable {_per_device(request)}): {which}")


def _add_plan_columns(table: Table, priced: bool, offload: bool, host_memory_gib: float | None) -> None:
    """Cost and host-RAM columns only where they say something, to keep the table within 100 columns."""
    table.add_column("#", no_wrap=True)
    table.add_column("setup", overflow="fold")  # squeezed, a word breaks across lines rather than lose letters
    table.add_column("batch", justify="right", no_wrap=True)
    table.add_column("GiB/GPU\n(upper)", justify="right", no_wrap=True)
    table.add_column("s/step", justify="right", no_wrap=True)
    table.add_column("ETA\nh:mm", justify="right", no_wrap=True)
    if priced:
        table.add_column("cost", justify="right", no_wrap=True)
    if offload:
        host = host_memory_gib
        table.add_column("host GiB" + (f"\nof {host:g}" if host is not None else ""), justify="right", no_wrap=True)
    table.add_column("evidence", overflow="fold")


def _plan_cells(plan: Plan, setup: SetupPlan, rank: int, failed: dict[Setting, str], priced: bool,
                offload: bool) -> list[str]:
    """One setup's row, in the columns _add_plan_columns made; an arrow marks the recommendation."""
    best, eta = setup.best, setup.eta
    cells = [f"→{rank}" if setup is plan.recommended else str(rank),
             table_label(setup.label, plan.request.base.seq_len),
             str(setup.batch), f"{best.peak_reserved.mean / GIB:.1f} ({best.peak_reserved.upper / GIB:.1f})",
             f"{eta.seconds_per_step:.2f}", format_duration(eta.total_seconds)]
    cells += [_cost(eta)] if priced else []
    cells += [_host_cell(setup)] if offload else []
    cells.append(_source_cell(advice.source_label(setup, failed)))
    return cells


def training_table(plan: Plan, failed: dict[Setting, str]) -> Table:
    """Best full fine-tuning and best LoRA side by side: what each costs here and what it trades."""
    options = advice.training_options(plan)
    table = Table("", *(KIND_NAMES[o.kind] for o in options), **COMPACT)
    rows = {"setup": lambda o: o.setup.label,
            "batch per GPU": lambda o: str(o.setup.batch),
            "ETA h:mm": lambda o: format_duration(o.setup.eta.total_seconds),
            "GiB/GPU (upper)": lambda o: f"{o.setup.best.peak_reserved.mean / GIB:.1f} "
                                         f"({o.setup.best.peak_reserved.upper / GIB:.1f})",
            "evidence": lambda o: _source_cell(advice.source_label(o.setup, failed)),
            "trades": lambda o: o.trade}
    if plan.request.price_per_gpu_hour is not None:
        rows["cost"] = lambda o: _cost(o.setup.eta)
    for name, cell in rows.items():
        table.add_row(name, *(cell(o) for o in options))
    return table


def print_plan(plan: Plan, console: Console, failed: dict[Setting, str], show_all: bool = False) -> None:
    """The table, then what its terms mean and what it leaves out, so the recommendation after it is read in full."""
    if plan.candidates:
        print_table(console, plan_table(plan, failed, show_all))
    else:  # no empty table: the title says what was asked, the lists below why nothing is in it
        console.print(_plan_title(plan, [], show_all), markup=False)
    _print_terms(plan, console)
    _print_left_out(plan, console, show_all)
    _print_caveats(plan, console, failed)
    _print_recommendation(plan, console, failed)
    for warning in advice.warnings_for(plan):
        console.print(f"[yellow]warning:[/] {warning}")
    for note in advice.notes_for(plan):
        console.print(f"note: {note}")


def _print_terms(plan: Plan, console: Console) -> None:
    """What the table's memory, evidence and cost mean, since the columns are too narrow to say."""
    budget = plan.request.budget
    console.print(f"Memory: {budget.describe()}; a batch is safe when it stays below any batch seen at the "
                  "allocator wall or OOM and either the upper bound of its predicted peak reserved memory or the "
                  "measured peak of a batch at least as large stays within it. "
                  "Evidence: verified (`ftplan rehearse` ran this emitted folder at that batch), measured (a "
                  "calibration trial of the recipe ran that batch), interpolated, extrapolated ×k (k times the largest "
                  "calibrated batch, or from another length, card or GPU count) or the prior alone. "
                  "ETA: hours:minutes, rounded up to the minute.")
    if plan.request.price_per_gpu_hour is not None:
        console.print(f"Cost = hours × {plan.request.price_per_gpu_hour:g} per GPU-hour × "
                      f"{plan.request.base.world_size} GPU(s).")


def _print_left_out(plan: Plan, console: Console, show_all: bool) -> None:
    """The setups the table leaves out, and why: too slow, too big for the GPU, or short of host RAM."""
    if plan.too_slow:
        console.print(f"Over --max-hours {plan.request.max_hours:g}: " + "; ".join(
            f"{s.label} ({format_duration(s.eta.total_seconds)})" for s in plan.too_slow))
    gpu_unfit = [s for s in plan.unfit if not s.host_short]
    host_unfit = [s for s in plan.unfit if s.host_short]
    if gpu_unfit:
        console.print("Cannot fit even at batch 1: " + "; ".join(
            [f"{s.label} (needs {_gib_needed([s])})" for s in gpu_unfit] if show_all else _unfit_groups(gpu_unfit)))
    if host_unfit:
        console.print(f"Not enough host RAM (you have {plan.request.host_memory_gib:g} GiB per node): " + "; ".join(
            f"{s.label} (needs {s.host_bytes / GIB:,.1f} GiB of host RAM per node for offloaded optimizer states)"
            for s in host_unfit))


def _print_caveats(plan: Plan, console: Console, failed: dict[Setting, str]) -> None:
    """What the host column leaves out and what was never measured, before a recommendation is read as certain."""
    if any(s.host_bytes for s in plan.ranked):
        console.print("host GiB: host RAM each node pins for CPU optimizer offload (optimizer states, master "
                      "weights, gradients; models/host_memory.py), a lower bound: the process itself comes on top.")
    for note in advice.unmeasured_notes(plan, failed):
        console.print(f"[red]unmeasured:[/] {note}")


def _print_recommendation(plan: Plan, console: Console, failed: dict[Setting, str]) -> None:
    """The recommendation and its reasons; with both kinds in play, the best of each first, as that choice is the user's."""
    rec = plan.recommended
    both = plan.request.training == "any" and len(advice.training_options(plan)) == 2
    if both:
        console.print("\n[bold]Full fine-tuning or LoRA?[/] They train differently, so the choice is yours "
                      "(--full or --lora plans, recommends and emits only that kind). The best of each:")
        print_table(console, training_table(plan, failed))
    if rec is not None:
        metric = "cheapest" if plan.request.by == "cost" else "fastest"
        which = f" (the {metric} of both kinds)" if both else ""
        console.print(f"\n[bold]Recommendation: {rec.label}, batch {rec.batch} per GPU, "
                      f"ETA {format_duration(rec.eta.total_seconds)}[/]{_upper_time(rec.eta)}{which}")
        _print_bullets(console, advice.reasons(plan, training_note=not both))


def _print_bullets(console: Console, lines: list[str]) -> None:
    """A bulleted list: on a terminal its wrapped lines keep their indent; piped, one unwrapped line a bullet, as the
    rest of the prose (a grid wrapped them at 120 columns and padded them with spaces)."""
    if console.soft_wrap:
        for line in lines:
            console.print(f"  • {line}")
    else:
        console.print(_bullets(lines))


def _bullets(lines: list[str]) -> Table:
    """A bulleted list whose wrapped lines keep their indent."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for line in lines:
        grid.add_row("  •", line)
    return grid


def _gib_needed(setups: list[SetupPlan]) -> str:
    needs = [s.at_batch_one.peak_reserved.upper / GIB for s in setups]
    return f"{min(needs):.1f} GiB" if f"{min(needs):.1f}" == f"{max(needs):.1f}" else f"{min(needs):.1f}-{max(needs):.1f} GiB"


def _unfit_groups(setups: list[SetupPlan]) -> list[str]:
    """Setups that cannot fit, one entry for a setup and its Liger/checkpointing variants."""
    groups: dict[str, list[SetupPlan]] = {}
    for setup in setups:
        groups.setdefault(setup.setting.with_(liger=False, gradient_checkpointing=False).label(), []).append(setup)
    return [f"{label} (needs {_gib_needed(group)})" if len(group) == 1 else
            f"{label} in {len(group)} Liger/checkpointing variants (needs {_gib_needed(group)})"
            for label, group in groups.items()]


def host_line(host_bytes: int, host_memory_gib: float | None, enough: bool) -> str | None:
    """`ftplan eta`'s host-memory verdict for an offload setting (None without offload)."""
    if not host_bytes:
        return None
    need = f"needs {host_bytes / GIB:,.1f} GiB of host RAM per node for offloaded optimizer states"
    if host_memory_gib is None:
        return f"host memory: {need} (lower bound; --host-memory-gib checks it)"
    return f"host memory: {'fits' if enough else 'NOT enough'}: {need}; you have {host_memory_gib:g}"


def memory_verdict(prediction: Prediction, budget: MemoryBudget) -> str:
    """The one wording of whether a batch fits, for `eta` and `predict`: the rule of models/safe_batch.py,
    with the reason that decided it."""
    reserved = prediction.peak_reserved
    if prediction.wall_batch is not None and prediction.micro_batch >= prediction.wall_batch:
        verdict = f"NOT safe (batch {prediction.wall_batch} was seen at the allocator wall or OOM)"
    elif reserved.upper <= budget.usable_bytes:
        verdict = "fits (upper bound within the usable memory)"
    elif fits_budget(prediction, budget):
        verdict = "fits (a batch this large ran within the usable memory; the model's bound is above it)"
    elif prediction.source == SOURCE_MEASURED:
        verdict = "NOT safe (this batch ran, but its measured peak leaves less free than the safety margin)"
    elif reserved.mean > budget.usable_bytes:
        verdict = "does NOT fit (even the predicted peak is above the usable memory)"
    else:
        verdict = "NOT safe (upper bound above the usable memory)"
    return (f"memory: {verdict}: peak reserved {reserved.mean / GIB:.1f} GiB (upper {reserved.upper / GIB:.1f}) "
            f"vs {budget.describe()}")


def eta_lines(prediction: Prediction, eta: Eta, budget: MemoryBudget) -> list[str]:
    lines = [f"steps: {eta.steps:,}",
             f"seconds per step: {eta.seconds_per_step:.2f} (upper {prediction.seconds_per_step.upper:.2f})",
             f"total time: {format_duration(eta.total_seconds)} ({eta.hours:.2f} h)" + _upper_time(eta),
             f"cost: {_cost(eta)}" + (f" (price per GPU-hour × GPUs; up to {eta.upper_cost:,.2f} at the step time's "
                                      "upper bound)" if eta.cost is not None and eta.upper_cost is not None else
                                      " (price per GPU-hour × GPUs)" if eta.cost is not None else ""),
             memory_verdict(prediction, budget),
             f"source: {prediction.source}"]
    return lines + [f"note: {note}" for note in prediction.notes]


def _upper_time(eta: Eta) -> str:
    """', up to H:MM at the step time's upper bound', where the ETA has one: the figure to budget GPU hours by."""
    upper = eta.upper_total_seconds
    return "" if upper is None else f", up to {format_duration(upper)} at the step time's upper bound"


def gpu_table(catalog: dict[str, GpuSpec]) -> Table:
    """The catalog with the other names each card answers to (its sources: gpu_sources)."""
    table = Table(title="GPUs (--gpu takes a name or an alias, in any case)", **COMPACT)
    for name in ("name", "aliases", "datasheet\nGB", "PyTorch\nGiB", "bf16\nTFLOP/s", "memory\nGB/s", "GPU-GPU\nGB/s",
                 "interconnect"):
        wraps = name in ("aliases", "interconnect")
        table.add_column(name, no_wrap=not wraps, justify="left" if wraps or name == "name" else "right")
    for spec in catalog.values():
        datasheet = "-" if spec.name == CPU else f"{spec.memory_gib:.4g}"  # the host's RAM, in GiB, has none
        table.add_row(spec.name, " ".join(spec.alias_names), datasheet,
                      f"{spec.memory_bytes / GIB:.2f}", f"{spec.bf16_dense_tflops:g}", f"{spec.memory_bandwidth_gbs:g}",
                      f"{spec.intra_node_gbs:g}" if spec.intra_node_gbs else "-", spec.interconnect.split("(")[0].strip() or "-")
    return table


def gpu_sources(catalog: dict[str, GpuSpec]) -> list[str]:
    """Where each card's figures come from, one line a card (too long for a table column)."""
    return [f"{spec.name}: {spec.source or 'no source given'}" for spec in catalog.values()]


def _number(value: float, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def scaling_table(scaling: ScalingPlan, failed: dict[Setting, str]) -> Table:
    """Per training kind and GPU count: its best setup, the upper bound of its per-GPU memory (what decides
    its batch), throughput and scaling, ETA and cost (GPU-hours when no price was given). The predicted mean and
    seconds per step are in the setups' table below it."""
    request = scaling.request
    priced = request.price_per_gpu_hour is not None
    table = Table(title=f"{request.base.model} on {request.gpu.name}, {_samples(request)}, seq {request.base.seq_len}: "
                        f"best setup per GPU count ({request.budget.usable_bytes / GIB:.1f} GiB usable "
                        f"{_per_device(request)})",
                  **COMPACT)
    for name in ("GPUs", "best setup", "batch", "GiB/GPU\nbound", "samples\n/s",
                 "speed-\nup", "effic.", "ETA\nh:mm", "cost" if priced else "GPU-h", "evidence"):
        wraps = name in ("GPUs", "best setup", "evidence")  # '16 (2×8)' may break before its layout
        table.add_column(name, no_wrap=not wraps, justify="left" if wraps else "right", overflow="fold")
    chosen = scaling.chosen
    for kind, rows in scaling.tables.items():
        for row in rows.to_dict("records"):
            bold = chosen is not None and kind == scaling.chosen_kind and row["gpus"] == chosen.gpus
            source = "prior, unmeasured" if row["source"] == "prior" else row["source"]
            if advice.failed_like(Setting.from_dict(row["setting"]), failed):
                source = "prior: trial failed"
            spend = row["cost"] if priced else row["hours"] * row["gpus"]
            table.add_row(("→" if bold else "") + _gpus_cell(row), table_label(row["setup"], request.base.seq_len),
                          str(row["micro_batch"]), f"{row['reserved_upper_gib']:.1f}",
                          f"{row['samples_per_second']:.1f}",
                          _number(row["speedup"], ".1f") + ("" if math.isnan(row["speedup"]) else "x"),
                          _number(row["efficiency"], ".0%") + ("*" if row.get("above_ideal") else ""),
                          format_duration(row["hours"] * 3600),
                          f"{spend:,.2f}", _source_cell(source), style="bold" if bold else None)
        table.add_section()
    return table


def _gpus_cell(row: dict) -> str:
    """'16 (2×8)': GPUs in all, and over how many nodes of how many when more than one."""
    return str(row["gpus"]) + (f" ({row['nodes']}×{row['gpus_per_node']})" if row["nodes"] > 1 else "")


def print_scaling(scaling: ScalingPlan, console: Console, failed: dict[Setting, str]) -> None:
    print_table(console, scaling_table(scaling, failed))
    console.print("GPUs: in all, (nodes × GPUs per node) when several nodes. Speed-up and efficiency: samples/s "
                  "against the best setup of the same training on one GPU.")
    for kind, rows in scaling.tables.items():
        for row in rows.to_dict("records"):
            if row.get("above_ideal"):
                console.print(f"* {KINDS[kind]} at {row['gpus']} GPUs, efficiency {row['efficiency']:.0%}: "
                              f"{row['above_ideal']}.")
    console.print(f"[yellow]unchecked:[/] {UNCHECKED}")
    for count in scaling.counts:
        if count.error:
            console.print(f"{count.gpus} GPUs: {count.error}")
    chosen = scaling.chosen
    if chosen is None:
        console.print(f"[yellow]warning:[/] {scaling.reason}")
        return
    where = describe_layout(chosen.gpus_per_node, chosen.nodes).split(": ", 1)[1]
    console.print(f"\n[bold]GPU count: {chosen.gpus} ({where}), {KINDS[scaling.chosen_kind]}[/], because {scaling.reason}. "
                  f"Setups at {chosen.gpus} GPU{'s' if chosen.gpus > 1 else ''}:")
