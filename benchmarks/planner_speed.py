"""How fast `ftplan plan` answers: imports (never torch), reading and fitting the calibrations (cold and from
the JSON fit cache), the setup search on one GPU and over GPU counts 1..128, the Python API call in a fresh
interpreter, the whole command, and `plan --dataset` over 100,000 rows with a tokenizer (cold, then with the
token lengths cached).

Run: python benchmarks/planner_speed.py [--model llama-3-8b] [--gpu H200] [--calibrations PATH]
         [--dataset-source TEXTS.jsonl --tokenizer tokenizer.json]
The dataset rows are chunks of DATASET_CHUNK_LINES lines of the source's "text" rows (code files, say),
cycled until there are --dataset-rows of them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATASET_CHUNK_LINES = 10
API_PROBE = "import ftplan; ftplan.plan({model!r}, {dataset_size}, {gpu!r})"
IMPORT_PROBE = ("import sys, time; t = time.perf_counter(); import {module}; "
                "print(time.perf_counter() - t, 'torch' in sys.modules)")


def import_seconds(module: str) -> tuple[float, bool]:
    """Import time in a fresh interpreter, and whether torch came along."""
    out = subprocess.run([sys.executable, "-c", IMPORT_PROBE.format(module=module)], capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), out[1] == "True"


def planner_seconds(model: str, gpu: str, calibrations: list[Path], dataset_size: int) -> dict[str, float]:
    """Seconds of each stage of the planner's own work, in this (already imported) interpreter."""
    from ftplan.core.hardware import find_gpu, load_catalog
    from ftplan.core.settings import Setting
    from ftplan.planner.gpu_counts import plan_gpu_counts
    from ftplan.evidence.inputs import load_evidence
    from ftplan.models.scaling import parse_gpu_counts
    from ftplan.planner.search import PlanRequest, make_plan

    timings = {}
    for cache in ("cold", "cached"):
        start = time.perf_counter()
        catalog = load_catalog()
        card = find_gpu(gpu, catalog)
        evidence = load_evidence(calibrations, catalog)
        links, _ = evidence.links(card)
        predictor = evidence.predictor_with(links)
        timings[f"read records + fit ({cache})"] = time.perf_counter() - start
    request = PlanRequest(base=Setting(model=model), dataset_size=dataset_size, epochs=1, gpu=card,
                          budget=evidence.budget(card, 0.02, 0.0))
    start = time.perf_counter()
    make_plan(predictor, request, evidence.calibrated_settings(model))
    timings["setup search, 1 GPU"] = time.perf_counter() - start
    start = time.perf_counter()
    plan_gpu_counts(evidence.predictor_with(links), request, parse_gpu_counts("1..128"), 8,
                    evidence.calibrated_settings(model))
    timings["setup search, GPU counts 1..128"] = time.perf_counter() - start
    return timings


def command_seconds(args: list[str], env: dict) -> float:
    return process_seconds(["-m", "ftplan", *args], env)


def process_seconds(args: list[str], env: dict) -> float:
    """Wall time of a fresh interpreter running args: start-up and imports count, as a user waits for them."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def write_dataset(source: Path, rows: int, out: Path) -> None:
    """rows JSONL rows, each DATASET_CHUNK_LINES lines of the source's texts, the texts cycled as needed."""
    texts = [json.loads(line)["text"] for line in source.read_text().splitlines() if line.strip()]
    written = 0
    with out.open("w") as handle:
        while written < rows:
            for text in texts:
                lines = text.splitlines()
                for start in range(0, len(lines), DATASET_CHUNK_LINES):
                    if written == rows:
                        return
                    handle.write(json.dumps({"text": "\n".join(lines[start:start + DATASET_CHUNK_LINES])}) + "\n")
                    written += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--gpu", default="H200")
    parser.add_argument("--dataset-size", type=int, default=19692)
    parser.add_argument("--calibrations", type=Path, action="append", default=[])
    parser.add_argument("--dataset-source", type=Path, help='JSONL whose "text" rows the dataset is cut from')
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json (or its folder) for plan --dataset")
    parser.add_argument("--dataset-rows", type=int, default=100_000)
    args = parser.parse_args()
    for module in ("ftplan.cli.main", "ftplan.cli.commands.plan"):
        seconds, torch_imported = import_seconds(module)
        print(f"import {module}: {seconds:.2f} s, torch imported: {torch_imported}")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["FTPLAN_CACHE_DIR"] = cache
        for stage, seconds in planner_seconds(args.model, args.gpu, args.calibrations, args.dataset_size).items():
            print(f"{stage}: {seconds:.3f} s")
        plan = ["plan", "--model", args.model, "--dataset-size", str(args.dataset_size), "--gpu", args.gpu,
                *[f"--calibrations={c}" for c in args.calibrations]]
        env = {**os.environ, "FTPLAN_CACHE_DIR": cache}
        print(f"whole command `ftplan {' '.join(plan[:7])}` (fits cached): {command_seconds(plan, env):.2f} s")
        print(f"same with --gpus 1..128: {command_seconds([*plan, '--gpus', '1..128'], env):.2f} s")
        api = API_PROBE.format(model=args.model, dataset_size=args.dataset_size, gpu=args.gpu)
        print(f"fresh interpreter `{api}` (fits cached): {process_seconds(['-c', api], env):.2f} s")
        if args.dataset_source and args.tokenizer:
            dataset_seconds(args, plan[:3] + plan[5:], env, Path(cache))
        else:
            print("plan --dataset: skipped (give --dataset-source and --tokenizer)")


def dataset_seconds(args: argparse.Namespace, plan: list[str], env: dict, workdir: Path) -> None:
    """`ftplan plan --dataset` over the generated rows: cold (nothing of this data cached), then warm."""
    dataset = workdir / "dataset.jsonl"
    write_dataset(args.dataset_source, args.dataset_rows, dataset)
    command = [*plan, "--dataset", str(dataset), "--tokenizer", str(args.tokenizer)]
    size = f"{args.dataset_rows:,} rows, {dataset.stat().st_size / 2**20:.0f} MiB"
    print(f"plan --dataset ({size}) --tokenizer, cold: {command_seconds(command, env):.2f} s")
    print(f"same, warm (token lengths cached): {command_seconds(command, env):.2f} s")


if __name__ == "__main__":
    main()
