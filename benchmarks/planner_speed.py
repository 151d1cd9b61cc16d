"""How fast `ftplan plan` answers: importing the planner (must not import torch) and searching every setup.

Run: python benchmarks/planner_speed.py [--model llama-3-8b] [--gpu H200] [--calibrations PATH]
Prints the import time, whether torch was imported, the predictor fitting time and the plan time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

IMPORT_PROBE = ("import sys, time; t = time.perf_counter(); import planner.cli, planner.search, planner.render; "
                "print(time.perf_counter() - t, 'torch' in sys.modules)")


def import_seconds() -> tuple[float, bool]:
    """Import time in a fresh interpreter, and whether torch came along."""
    out = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), out[1] == "True"


def plan_seconds(model: str, gpu: str, calibrations: list[Path], dataset_size: int) -> tuple[float, float, int]:
    """(seconds to load records and fit the predictor, seconds for the whole setup search, setups searched)."""
    from calibration.settings import Setting
    from models.hardware import find_gpu, load_catalog
    from planner.inputs import load_evidence
    from planner.search import PlanRequest, make_plan

    start = time.perf_counter()
    catalog = load_catalog()
    card = find_gpu(gpu, catalog)
    evidence = load_evidence(calibrations, catalog)
    fitted = time.perf_counter()
    request = PlanRequest(base=Setting(model=model), dataset_size=dataset_size, epochs=1, gpu=card,
                          budget=evidence.budget(card, 0.05, 0.0))
    plan = make_plan(evidence.predictor, request, evidence.calibrated_settings(model))
    done = time.perf_counter()
    return fitted - start, done - fitted, len(plan.ranked) + len(plan.too_slow) + len(plan.unfit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--gpu", default="H200")
    parser.add_argument("--dataset-size", type=int, default=19692)
    parser.add_argument("--calibrations", type=Path, action="append", default=[])
    args = parser.parse_args()
    seconds, torch_imported = import_seconds()
    print(f"import planner: {seconds:.2f} s, torch imported: {torch_imported}")
    fit, search, setups = plan_seconds(args.model, args.gpu, args.calibrations, args.dataset_size)
    print(f"load records + fit predictor: {fit:.2f} s")
    print(f"plan search over {setups} setups: {search:.3f} s")


if __name__ == "__main__":
    main()
