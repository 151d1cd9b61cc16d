"""How well ftplan predicts what it never calibrated: leave-one-model-out and leave-one-setting-out.

For each held-out group (every record of one model, or of one setting regardless of allocator
configuration), a Predictor is built from the other records only and asked for every held-out ok
record; without a relative to build on it answers from the analytic prior with constants fitted on
the rest. Printed: median and max absolute % error of peak allocated, peak reserved and step time,
for ftplan's own records (data/calibrations/) and, separately, the public measurements
(benchmarks/external.py), never mixed. Also prints the constants fitted on each whole data set,
which is where models/prior.py's documented defaults come from.

    python -m benchmarks.prior_accuracy [--json]
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.external import load_external
from calibration.records import read_records
from calibration.settings import Setting
from models.errors import FtplanError
from models.hardware import find_gpu, load_catalog
from models.paths import calibrations_dir
from models.predictor import Predictor
from models.prior import fit_constants

QUANTITIES = (("memory", "peak_allocated_bytes"), ("reserved", "peak_reserved_bytes"), ("time", "seconds_per_step"))


def _model_of(record: dict) -> str:
    return record["model"]


def _setting_of(record: dict) -> str:
    return Setting.from_dict(record).with_(alloc_conf="").key()


def held_out_errors(records: list[dict], group_of: Callable[[dict], str]) -> dict[str, list[float]]:
    """Absolute % errors per quantity when each group is predicted from the other groups alone."""
    catalog = load_catalog()
    errors: dict[str, list[float]] = {name: [] for name, _ in QUANTITIES}
    groups = sorted({group_of(r) for r in records})
    if len(groups) < 2:
        return errors
    for group in groups:
        rest = [r for r in records if group_of(r) != group]
        predictor = Predictor.from_records(rest, gpu_catalog=catalog)
        for record in records:
            if group_of(record) != group or record["status"] != "ok" or record.get("device", "cuda") != "cuda":
                continue
            try:
                gpu = find_gpu(str(record["gpu_name"]), catalog)
            except FtplanError:
                continue
            prediction = predictor.predict(Setting.from_dict(record), record["micro_batch"], gpu)
            predicted = {"memory": prediction.peak_allocated.mean, "reserved": prediction.peak_reserved.mean,
                         "time": prediction.seconds_per_step.mean}
            for name, key in QUANTITIES:
                if record.get(key):
                    errors[name].append(abs(predicted[name] / record[key] - 1) * 100)
    return errors


def summarise(errors: dict[str, list[float]]) -> dict:
    summary = {}
    for name, values in errors.items():
        summary[f"{name}_median_abs_pct_error"] = float(np.median(values)) if values else None
        summary[f"{name}_max_abs_pct_error"] = float(np.max(values)) if values else None
        summary[f"{name}_cases"] = len(values)
    return summary


def benchmark(records: list[dict]) -> dict:
    constants = fit_constants(records, load_catalog(), "this data set")
    return {"records": len(records),
            "leave_one_model_out": summarise(held_out_errors(records, _model_of)),
            "leave_one_setting_out": summarise(held_out_errors(records, _setting_of)),
            "fitted_constants": {k: v for k, v in vars(constants).items() if k != "scope"}}


def _print(title: str, result: dict, console: Console) -> None:
    table = Table("held out", "cases", *(f"{q} median / max abs %" for q, _ in QUANTITIES),
                  title=f"{title} ({result['records']} records)")
    for split in ("leave_one_model_out", "leave_one_setting_out"):
        row = result[split]
        cells = [f"{row[f'{q}_median_abs_pct_error']:.1f} / {row[f'{q}_max_abs_pct_error']:.1f}"
                 if row[f"{q}_cases"] else "n/a" for q, _ in QUANTITIES]
        table.add_row(split.replace("_", " "), str(row["memory_cases"]), *cells)
    console.print(table)
    console.print("constants fitted on all of it: " + ", ".join(
        f"{k}={v:.4g}" for k, v in result["fitted_constants"].items()))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def main(as_json: bool) -> None:
    """Leave-one-model-out and leave-one-setting-out accuracy of ftplan's uncalibrated predictions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folder = calibrations_dir()
        own = read_records([folder]) if folder.is_dir() else []
        results = {"ftplan_calibrations": benchmark(own), "public_measurements": benchmark(load_external())}
    if as_json:
        click.echo(json.dumps(results, indent=2))
        return
    console = Console(width=160)
    _print("ftplan's own calibrations (data/calibrations)", results["ftplan_calibrations"], console)
    _print("public measurements (gpjt/fine-tune-2024-04, not ftplan's)", results["public_measurements"], console)


if __name__ == "__main__":
    main()
