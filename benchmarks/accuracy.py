"""How good are the fits on batches and sequence lengths they never saw?

For every calibrated (setting, seq_len) with at least five ok batch sizes: fit on the three
smallest and predict every larger healthy one (points at the allocator wall are the fit's
observed limit, not something it predicts); step time also uses the compute rate learnt from the
*other* settings on the same GPU (never the setting itself, whatever its allocator configuration).
Where a setting has three or more sequence lengths, also fit on all but one and predict the one
left out. The analytic prior is scored too (benchmarks/prior_accuracy.py, under "prior"): leave
one model, one setting or one sequence length out. The predicted largest safe batch comes
from `ftplan.models.safe_batch`, the rule the planner uses.

    python benchmarks/accuracy.py [--json] [--data PATH ...] [--external DIR]

ftplan's own calibrations and the public measurements are evaluated and reported apart.
"""

from __future__ import annotations

import json
import statistics
import sys
import warnings
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from benchmarks.modes import evaluate_modes  # noqa: E402
from benchmarks.external import DEFAULT_DIR, load_external  # noqa: E402
from benchmarks.prior_accuracy import benchmark as prior_benchmark  # noqa: E402
from benchmarks.prior_accuracy import print_result as print_prior  # noqa: E402
from ftplan.core.errors import FtplanError  # noqa: E402
from ftplan.core.paths import calibrations_dir  # noqa: E402
from ftplan.store.records import read_records  # noqa: E402
from ftplan.models.fit import (  # noqa: E402
    compute_rate_for,
    fit_setting,
    group_records,
    setting_without_seq_len,
)
from ftplan.models.prior import ladder_slopes  # noqa: E402
from ftplan.models.safe_batch import MemoryBudget, fit_largest_safe_batch  # noqa: E402
from ftplan.models.wall import reserved_capped, wall_batches  # noqa: E402

MIN_OK_POINTS = 5
TRAIN_POINTS = 3
MIN_SEQ_LENS_FOR_HOLDOUT = 3  # two left to fit the sequence-length terms


def evaluate(records: list[dict]) -> dict:
    """Held-out errors per setting and pooled; the summary keys are the benchmark's contract."""
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        groups = group_records(records)
        slopes = [ladder_slopes(group) for group in groups]
        for group in groups:
            rate = compute_rate_for(str(group[0].get("gpu_name")), [
                s for other, found in zip(groups, slopes) if not _same_workload(other, group) for s in found])
            seq_lens = sorted({r["seq_len"] for r in group if r["status"] == "ok"})
            for seq in seq_lens:
                rows.extend(_larger_batches(group, seq, rate))
            if len(seq_lens) >= MIN_SEQ_LENS_FOR_HOLDOUT:
                rows.extend(_left_out_seq_len(group, seq, rate) for seq in seq_lens)
    rows = [row for row in rows if row]
    batch_rows = [r for r in rows if r["kind"] == "larger batches"]
    seq_rows = [r for r in rows if r["kind"] == "left-out seq_len"]
    return {**_summary(batch_rows), **{f"seq_holdout_{k}": v for k, v in _summary(seq_rows).items()
                                       if not k.startswith("max_batch")}, "settings": rows}


def _same_workload(a: list[dict], b: list[dict]) -> bool:
    """Same setting, whatever the allocator configuration or GPU: its step time is not evidence
    about itself, so its ladders never teach the compute rate used to predict it."""
    def workload(group: list[dict]) -> dict:
        return {**setting_without_seq_len(group[0]), "alloc_conf": ""}
    return workload(a) == workload(b)


def _larger_batches(group: list[dict], seq: int, rate) -> list[dict]:
    ok = sorted((r for r in group if r["status"] == "ok" and r["seq_len"] == seq), key=lambda r: r["micro_batch"])
    if len(ok) < MIN_OK_POINTS:
        return []
    walls = set(wall_batches(ok))
    train = ok[:TRAIN_POINTS]
    test = [r for r in ok[TRAIN_POINTS:] if r["micro_batch"] not in walls]
    try:
        fit = fit_setting(train, rate)
    except FtplanError:
        return []
    row = _errors(fit, test, "larger batches", seq)
    row["train_batches"] = [r["micro_batch"] for r in train]
    row.update(_max_batch(fit, group, ok, walls, seq, rate))
    return [row]


def _left_out_seq_len(group: list[dict], seq: int, rate) -> dict | None:
    train = [r for r in group if r["seq_len"] != seq]
    ok = [r for r in group if r["status"] == "ok" and r["seq_len"] == seq]
    walls = set(wall_batches(ok))
    try:
        fit = fit_setting(train, rate)
    except FtplanError:
        return None
    row = _errors(fit, [r for r in ok if r["micro_batch"] not in walls], "left-out seq_len", seq)
    row["train_batches"] = sorted({r["seq_len"] for r in train})
    return row


def _errors(fit, test: list[dict], kind: str, seq: int) -> dict:
    def pct(predicted: float, measured: float | None) -> float | None:
        return None if not measured else 100.0 * (predicted - measured) / measured

    points = []
    for r in test:
        batch = r["micro_batch"]
        points.append({"batch": batch,
                       "memory": pct(fit.peak_allocated(batch, seq).mean, r.get("peak_allocated_bytes")),
                       # reserved capped by the card measures the card, not the run
                       "reserved": None if reserved_capped(r) else pct(fit.peak_reserved(batch, seq).mean,
                                                                       r.get("peak_reserved_bytes")),
                       "time": pct(fit.seconds_per_step(batch, seq).mean, r.get("seconds_per_step"))})
    label = fit.label if kind == "larger batches" else f"{fit.label} -> s{seq}"
    return {"kind": kind, "setting": label, "gpu": fit.gpu_name, "seq_len": seq, "points": points}


def _max_batch(fit, group: list[dict], ok: list[dict], walls: set[int], seq: int, rate) -> dict:
    """Predicted largest safe batch against the largest batch that ran healthily before OOM or wall,
    what a safe but smaller prediction costs in throughput, and the allocator's overhead at the
    measured largest batch per byte of fp32 logits (the evidence for ftplan.models.fit.LOGIT_BLOCKS_HIGHEST)."""
    ooms = [r["micro_batch"] for r in group if r["status"] == "oom" and r["seq_len"] == seq]
    limit = min(ooms, default=None)  # a batch at the allocator wall ran: it fits
    capacity = max((r.get("gpu_memory_total_bytes") or 0) for r in ok)
    if limit is None or not capacity:
        return {"predicted_max_batch": None, "measured_max_batch": None}
    measured = max((r["micro_batch"] for r in ok if r["micro_batch"] < limit), default=0)
    predicted = fit_largest_safe_batch(fit, seq, MemoryBudget(capacity))
    at_max = next(r for r in ok if r["micro_batch"] == measured)
    logits = measured * seq * fit.logit_bytes_per_token
    overhead = at_max["peak_reserved_bytes"] - at_max["peak_allocated_bytes"] if at_max.get("peak_reserved_bytes") else None
    return {"predicted_max_batch": predicted, "measured_max_batch": measured,
            "throughput_given_up_pct": _throughput_given_up(ok, predicted, measured, seq, rate),
            "overhead_per_logit_byte_at_max": overhead / logits if logits and overhead is not None else None}


def _throughput_given_up(ok: list[dict], predicted: int, measured: int, seq: int, rate) -> float | None:
    """Share of the measured largest batch's samples per second that the predicted batch loses, on
    step times fitted to the whole measured ladder; None when the prediction would not fit (or is 0)."""
    if not 0 < predicted <= measured:
        return None
    ladder = fit_setting(ok, rate)

    def samples_per_second(batch: int) -> float:
        return batch / ladder.seconds_per_step(batch, seq).mean

    return 100.0 * (1 - samples_per_second(predicted) / samples_per_second(measured))


def _summary(rows: list[dict]) -> dict:
    def stats(name: str) -> tuple[float | None, float | None]:
        errors = [abs(p[name]) for row in rows for p in row["points"] if p[name] is not None]
        return (statistics.median(errors), max(errors)) if errors else (None, None)

    judged = [r for r in rows if r.get("measured_max_batch") is not None]
    summary = {}
    for key, name in (("memory", "memory"), ("reserved_memory", "reserved"), ("time", "time")):
        summary[f"{key}_median_abs_pct_error"], summary[f"{key}_max_abs_pct_error"] = stats(name)
    summary["max_batch_exact_fraction"] = (
        sum(r["predicted_max_batch"] == r["measured_max_batch"] for r in judged) / len(judged) if judged else None)
    summary["max_batch_unsafe_count"] = sum(r["predicted_max_batch"] > r["measured_max_batch"] for r in judged)
    summary["max_batch_settings_judged"] = len(judged)
    given_up = [r["throughput_given_up_pct"] for r in judged if r["throughput_given_up_pct"] is not None]
    summary["max_batch_throughput_given_up_max_pct"] = max(given_up, default=None)
    ratios = [r["overhead_per_logit_byte_at_max"] for r in judged if r["overhead_per_logit_byte_at_max"]]
    summary["max_batch_overhead_per_logit_byte_median"] = statistics.median(ratios) if ratios else None
    summary["max_batch_overhead_per_logit_byte_max"] = max(ratios, default=None)
    summary["test_points"] = sum(len(r["points"]) for r in rows)
    return summary


def _table(title: str, result: dict) -> Table:
    table = Table(title=title)
    for column in ("held out", "setting", "GPU", "train", "n", "alloc med/max %", "reserved med/max %",
                   "time med/max %", "max batch pred/meas", "speed given up %"):
        table.add_column(column)
    for row in result["settings"]:
        cells = [_med_max(row["points"], name) for name in ("memory", "reserved", "time")]
        batch = ("" if row.get("predicted_max_batch") is None
                 else f"{row['predicted_max_batch']}/{row['measured_max_batch']}")
        given_up = row.get("throughput_given_up_pct")
        table.add_row(row["kind"], row["setting"], row["gpu"], ",".join(map(str, row["train_batches"])),
                      str(len(row["points"])), *cells, batch, "" if given_up is None else f"{given_up:.1f}")
    return table


def _modes_table(modes: dict) -> Table:
    """One line per trust test (benchmarks/modes.py): unsafe plans, planned/true batch, memory and time errors."""
    table = Table(title="largest safe batch and errors per mode (ladders that reached an OOM)")
    for column in ("mode", "ladders", "unsafe", "planned/true med (min)", "alloc beyond med/max %",
                   "reserved med/max %", "time med/max %", "trials med"):
        table.add_column(column)

    def pair(s: dict, key: str) -> str:
        low, high = s[f"{key}_median_pct"], s[f"{key}_max_pct"]
        return "-" if low is None else f"{low:.1f} / {high:.1f}"

    for mode, found in modes.items():
        s = found["summary"]
        ratio = "-" if s["planned_over_true_median"] is None else \
            f"{s['planned_over_true_median']:.2f} ({s['planned_over_true_min']:.2f})"
        table.add_row(mode, str(s["ladders"]), str(s["unsafe"]), ratio, pair(s, "beyond"), pair(s, "reserved"),
                      pair(s, "time"), "-" if s["trials_median"] is None else f"{s['trials_median']:g}")
    return table


def _med_max(points: list[dict], name: str) -> str:
    errors = [abs(p[name]) for p in points if p[name] is not None]
    return f"{statistics.median(errors):.2f} / {max(errors):.2f}" if errors else "-"


def _overall(title: str, result: dict) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if key not in ("settings", "prior", "external"):
            table.add_row(key, "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value))
    return table


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--data", "paths", multiple=True, type=click.Path(path_type=Path),
              help="Calibration JSONL files or folders (default: the shipped data/calibrations/).")
@click.option("--external", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True,
              help="Folder of the public measurements; skipped when absent.")
def main(as_json: bool, paths: tuple[Path, ...], external: Path) -> None:
    """Accuracy of ftplan's fits on held-out batch sizes and sequence lengths."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            own = read_records(paths or [calibrations_dir()])
    except FtplanError as exc:
        raise click.ClickException(str(exc)) from None
    result = {**evaluate(own), "prior": prior_benchmark(own)}
    public = load_external(external)
    result["external"] = {**evaluate(public), "prior": prior_benchmark(public)} if public else None
    result["modes"] = evaluate_modes(own, public)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    console = Console()
    console.print(_modes_table(result["modes"]))
    console.print(_table("ftplan calibrations: held-out accuracy", result))
    console.print(_overall("ftplan calibrations: overall", result))
    print_prior("ftplan calibrations: the prior on what it never saw", result["prior"], console)
    if public:
        console.print(_table(f"public measurements ({external}): held-out accuracy", result["external"]))
        console.print(_overall("public measurements: overall", result["external"]))
        print_prior("public measurements: the prior on what it never saw", result["external"]["prior"], console)


if __name__ == "__main__":
    main()
