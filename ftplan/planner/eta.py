"""Steps, wall time and cost of a whole training run, from one per-step prediction.

Kept apart from the search so `ftplan eta` and `ftplan plan` share one definition of each number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ftplan.core.errors import FtplanError


@dataclass(frozen=True)
class Eta:
    """A training run's length. cost is None when no price was given; price is per GPU-hour."""

    steps: int
    seconds_per_step: float
    total_seconds: float
    cost: float | None

    @property
    def hours(self) -> float:
        return self.total_seconds / 3600


# More optimizer steps than any fine-tune takes (a million steps of a second is eleven days): beyond it
# an input is a typo, and float arithmetic on it overflows.
MAX_STEPS = 1e12


def steps_to_finish(dataset_size: int, epochs: float, micro_batch: int, world_size: int,
                    accumulation: int = 1) -> int:
    """Optimizer steps for `epochs` passes: ceil(samples·epochs / (micro-batch·accumulation·GPUs))."""
    for name, value in (("dataset size", dataset_size), ("epochs", epochs), ("batch size", micro_batch),
                        ("GPU count", world_size), ("gradient accumulation", accumulation)):
        if value <= 0:
            raise FtplanError(f"{name} must be positive, got {value}")
    steps = dataset_size * epochs / (micro_batch * accumulation * world_size)
    if not steps <= MAX_STEPS:  # also catches inf and nan from absurd inputs
        raise FtplanError(f"{dataset_size:,} samples × {epochs:g} epochs is more than {MAX_STEPS:.0e} optimizer steps; "
                          "check --dataset-size and --epochs")
    return math.ceil(steps)


def estimate_eta(seconds_per_step: float, dataset_size: int, epochs: float, micro_batch: int,
                 world_size: int, price_per_gpu_hour: float | None = None) -> Eta:
    """Total time = steps × s/step; cost = hours × price per GPU-hour × GPUs (every GPU is billed)."""
    steps = steps_to_finish(dataset_size, epochs, micro_batch, world_size)
    total = steps * seconds_per_step
    cost = None if price_per_gpu_hour is None else total / 3600 * price_per_gpu_hour * world_size
    return Eta(steps=steps, seconds_per_step=seconds_per_step, total_seconds=total, cost=cost)


def format_duration(seconds: float) -> str:
    """h:mm, rounded up to the minute so a short run never shows as 0:00."""
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60}:{minutes % 60:02d}"
