"""What plan, eta and report read from the user: the GPU, the memory budget, and the calibrations.

Shared so the three commands state the same defaults and fail on bad input with the same one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import click

from calibration.records import read_records
from calibration.settings import Setting
from models.errors import FtplanError
from models.hardware import GIB, GpuSpec, find_gpu, load_catalog
from models.paths import calibrations_dir
from models.safe_batch import DEFAULT_CONTEXT_RESERVE_GIB, MemoryBudget
from planner.search import DEFAULT_SAFETY_MARGIN


def gpu_options(command: Callable) -> Callable:
    """--gpu NAME and --gpu-specs FILE."""
    command = click.option("--gpu-specs", type=click.Path(path_type=Path), default=None,
                           help="CSV of GPU specs (columns as in `ftplan gpus`) overriding or extending the catalog.")(command)
    return click.option("--gpu", "gpu_name", required=True, help="GPU model, e.g. H200 (see `ftplan gpus`).")(command)


def budget_options(command: Callable) -> Callable:
    """--safety-margin and --context-reserve-gib: the policy that turns capacity into usable memory."""
    command = click.option("--context-reserve-gib", type=float, default=DEFAULT_CONTEXT_RESERVE_GIB, show_default=True,
                           help="GiB kept for the CUDA context and NCCL buffers on top of the margin "
                                "(torch's reserved bytes omit them).")(command)
    return click.option("--safety-margin", type=float, default=DEFAULT_SAFETY_MARGIN, show_default=True,
                        help="Fraction of capacity kept free above the upper prediction bound.")(command)


def calibrations_option(command: Callable) -> Callable:
    return click.option("--calibrations", multiple=True, type=click.Path(path_type=Path),
                        help="Calibration JSONL file or folder (repeatable); default: the calibrations shipped in data/.")(command)


@dataclass(frozen=True)
class Evidence:
    """The calibration records a command works from, the predictor fitted on them, and the GPU catalog."""

    records: list[dict]
    predictor: object
    catalog: dict[str, GpuSpec]

    def calibrated_settings(self, model: str) -> list[Setting]:
        """Settings of this model with measured trials, on any GPU (the predictor transfers across cards)."""
        return list(dict.fromkeys(Setting.from_dict(r) for r in self.records
                                  if r["model"] == model and r["status"] == "ok"))

    @cached_property
    def _cards(self) -> dict[str, GpuSpec | None]:
        cards: dict[str, GpuSpec | None] = {}
        for name in {str(r.get("gpu_name")) for r in self.records}:
            try:
                cards[name] = find_gpu(name, self.catalog)
            except FtplanError:
                cards[name] = None  # a card outside the catalog: its records still inform the prior
        return cards

    def card_of(self, record: dict) -> GpuSpec | None:
        """The catalog card a record was measured on (record names like 'NVIDIA H200' resolve by alias)."""
        return self._cards.get(str(record.get("gpu_name")))

    def measured_capacity(self, gpu: GpuSpec) -> int | None:
        """The card's total memory as the calibration runs on it saw it, which datasheets round."""
        totals = [r.get("gpu_memory_total_bytes") or 0 for r in self.records if self.card_of(r) == gpu]
        return max(totals, default=0) or None

    def budget(self, gpu: GpuSpec, safety_margin: float, context_reserve_gib: float) -> MemoryBudget:
        """Capacity from the user's own spec if given, else as measured, else the catalog's."""
        shipped = load_catalog().get(gpu.name) == gpu
        measured = self.measured_capacity(gpu) if shipped else None
        return MemoryBudget(measured or gpu.memory_bytes, safety_margin, int(context_reserve_gib * GIB),
                            "measured by calibration" if measured else ("catalog" if shipped else "your GPU specs"))


def load_evidence(calibrations: Sequence[Path], catalog: dict[str, GpuSpec]) -> Evidence:
    """Records from the given files (default: data/calibrations/) and the predictor fitted on them."""
    from models.predictor import Predictor  # imported late: `ftplan gpus` and `--help` need no fitting code

    if calibrations:
        records = read_records(calibrations)
        if not records:
            raise FtplanError(f"no valid calibration records in {', '.join(map(str, calibrations))}")
    else:
        folder = calibrations_dir()
        records = read_records([folder]) if folder.is_dir() else []
    return Evidence(records, Predictor.from_records(records, gpu_catalog=catalog), catalog)


def resolve_gpu(name: str, specs: Path | None) -> GpuSpec:
    """The GPU by name or alias, from the catalog merged with the user's specs file."""
    return find_gpu(name, load_catalog(specs))


def load_predictor(calibrations: Sequence[Path] = (), catalog: dict[str, GpuSpec] | None = None):
    """The predictor alone, for commands that need no records."""
    return load_evidence(calibrations, catalog if catalog is not None else load_catalog()).predictor
