"""What plan, eta and report read from the user: the GPU, the memory budget, and the predictor.

Shared so the three commands state the same defaults and fail on bad input with the same one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import click

from calibration.records import read_records
from models.errors import FtplanError
from models.hardware import GIB, GpuSpec, find_gpu, load_catalog
from planner.search import DEFAULT_CONTEXT_RESERVE_GIB, DEFAULT_SAFETY_MARGIN, MemoryBudget


def gpu_options(command: Callable) -> Callable:
    """--gpu NAME and --gpu-specs FILE."""
    command = click.option("--gpu-specs", type=click.Path(path_type=Path), default=None,
                           help="CSV of GPU specs (columns as in `ftplan gpus`) overriding or extending the catalog.")(command)
    return click.option("--gpu", "gpu_name", required=True, help="GPU model, e.g. H200 (see `ftplan gpus`).")(command)


def budget_options(command: Callable) -> Callable:
    """--safety-margin and --context-reserve-gib: the policy that turns capacity into usable memory."""
    command = click.option("--context-reserve-gib", type=float, default=DEFAULT_CONTEXT_RESERVE_GIB, show_default=True,
                           help="GiB kept for the CUDA context and NCCL buffers, which torch's reserved bytes omit.")(command)
    return click.option("--safety-margin", type=float, default=DEFAULT_SAFETY_MARGIN, show_default=True,
                        help="Fraction of capacity kept free on top of the upper prediction bound.")(command)


def calibrations_option(command: Callable) -> Callable:
    return click.option("--calibrations", multiple=True, type=click.Path(path_type=Path),
                        help="Calibration JSONL file or folder (repeatable); default: the calibrations shipped in data/.")(command)


def resolve_gpu(name: str, specs: Path | None) -> GpuSpec:
    return find_gpu(name, load_catalog(specs))


def memory_budget(gpu: GpuSpec, safety_margin: float, context_reserve_gib: float) -> MemoryBudget:
    return MemoryBudget(gpu.memory_bytes, safety_margin, int(context_reserve_gib * GIB))


def load_predictor(calibrations: Sequence[Path] = ()):
    """The real predictor, fitted on the given calibration files or, by default, on the shipped ones."""
    from models.predictor import Predictor  # imported late: `ftplan gpus` and `--help` need no fitting code
    if not calibrations:
        return Predictor.default()
    records = read_records(calibrations)
    if not records:
        raise FtplanError(f"no valid calibration records in {', '.join(map(str, calibrations))}")
    return Predictor.from_records(records)
