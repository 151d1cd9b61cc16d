"""Steps, wall time and cost of a whole training run, from one per-step prediction.

Kept apart from the search so `ftplan eta` and `ftplan plan` share one definition of each number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ftplan.core.errors import FtplanError


@dataclass(frozen=True)
class Eta:
    """A training run's length. cost is None when no price was given; price is per GPU-hour. The upper figures
    take the step time's upper bound (None where none was given): what a budget for GPU hours should hold."""

    steps: int
    seconds_per_step: float
    total_seconds: float
    cost: float | None
    upper_seconds_per_step: float | None = None

    @property
    def hours(self) -> float:
        return self.total_seconds / 3600

    @property
    def upper_total_seconds(self) -> float | None:
        return None if self.upper_seconds_per_step is None else self.steps * self.upper_seconds_per_step

    @property
    def upper_cost(self) -> float | None:
        if self.cost is None or self.upper_seconds_per_step is None:
            return None
        return self.cost * self.upper_seconds_per_step / self.seconds_per_step if self.seconds_per_step else self.cost


# More optimizer steps than any fine-tune takes (a million steps of a second is eleven days): beyond it
# an input is a typo, and float arithmetic on it overflows.
MAX_STEPS = 1e12
MAX_SAMPLES = 1e12  # more samples than any fine-tuning set (a trillion); larger ones overflow float arithmetic


def check_samples(dataset_size: int, epochs: float) -> None:
    """Refuse a dataset size or epoch count nobody can mean, with the limit, before any arithmetic overflows."""
    for name, value in (("dataset size", dataset_size), ("epochs", epochs)):
        if not value > 0:  # NaN too
            raise FtplanError(f"{name} must be positive, got {value}")
    if dataset_size > MAX_SAMPLES:
        shown = f"{dataset_size:,}" if len(str(int(dataset_size))) <= 20 else f"of {len(str(int(dataset_size)))} digits"
        raise FtplanError(f"dataset size {shown} is more than {MAX_SAMPLES:.0e} samples; check --dataset-size")


MAX_PRICE_PER_GPU_HOUR = 1e6  # a thousand times any cloud's; 1e308 printed costs of Infinity, invalid JSON


def check_price(price_per_gpu_hour: float | None) -> None:
    """A price per GPU-hour a cost can be computed from: positive, and short of overflowing into Infinity."""
    if price_per_gpu_hour is None:
        return
    if not price_per_gpu_hour > 0:
        raise FtplanError(f"price per hour must be positive, got {price_per_gpu_hour}")
    if price_per_gpu_hour > MAX_PRICE_PER_GPU_HOUR:
        raise FtplanError(f"price per hour {price_per_gpu_hour:g} is above {MAX_PRICE_PER_GPU_HOUR:.0e} a GPU-hour; "
                          "check --price-per-hour")


def steps_to_finish(dataset_size: int, epochs: float, micro_batch: int, world_size: int,
                    accumulation: int = 1) -> int:
    """Optimizer steps for `epochs` passes, counted as Trainer counts them: each GPU's sampler hands it
    ceil(samples / GPUs) samples an epoch, in ceil(that / micro-batch) micro-batches (the last one partial), one
    optimizer step per `accumulation` of them (the last one partial too), and ceil(epochs × steps an epoch) in
    all. 100 samples at batch 33 for 2.5 epochs are 10 steps, not ceil(250 / 33) = 8."""
    check_samples(dataset_size, epochs)
    for name, value in (("batch size", micro_batch), ("GPU count", world_size), ("gradient accumulation", accumulation)):
        if value <= 0:
            raise FtplanError(f"{name} must be positive, got {value}")
    share = largest_micro_batch(dataset_size, world_size)
    if micro_batch > share:  # the sampler hands each GPU at most `share` samples an epoch: no step is full
        raise FtplanError(f"batch {micro_batch:,} per GPU × {world_size} GPU(s) is more than the dataset's "
                          f"{dataset_size:,} samples, so no step is ever full; use a batch up to {share:,}")
    per_epoch = math.ceil(math.ceil(share / micro_batch) / accumulation)
    steps = epochs * per_epoch
    if not steps <= MAX_STEPS:  # also catches inf and nan from absurd inputs
        raise FtplanError(f"{dataset_size:,} samples × {epochs:g} epochs is more than {MAX_STEPS:.0e} optimizer steps; "
                          "check --dataset-size and --epochs")
    return math.ceil(steps)


def largest_micro_batch(dataset_size: int, world_size: int) -> int:
    """Samples each GPU gets an epoch (a distributed sampler pads the last round): the largest full micro-batch."""
    return -(-dataset_size // world_size)


def estimate_eta(seconds_per_step: float, dataset_size: int, epochs: float, micro_batch: int,
                 world_size: int, price_per_gpu_hour: float | None = None,
                 upper_seconds_per_step: float | None = None) -> Eta:
    """Total time = steps × s/step; cost = hours × price per GPU-hour × GPUs (every GPU is billed)."""
    steps = steps_to_finish(dataset_size, epochs, micro_batch, world_size)
    total = steps * seconds_per_step
    cost = None if price_per_gpu_hour is None else total / 3600 * price_per_gpu_hour * world_size
    return Eta(steps=steps, seconds_per_step=seconds_per_step, total_seconds=total, cost=cost,
               upper_seconds_per_step=upper_seconds_per_step)


def format_duration(seconds: float) -> str:
    """h:mm, rounded up to the minute so a short run never shows as 0:00."""
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60}:{minutes % 60:02d}"


def spoken_duration(seconds: float) -> str:
    """A duration in prose, as fine as a comparison needs: '42 s' and '3.5 min' for short runs (two of them read
    '0:01' against '0:01' in h:mm), else whole minutes rounded up as the tables' h:mm are ('1 h 05 min')."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    hours, minutes = divmod(math.ceil(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"
