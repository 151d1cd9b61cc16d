"""What every predictor returns, so the planner never cares whether a number came from a fit or the prior."""

from __future__ import annotations

from dataclasses import dataclass, field

from ftplan.core.settings import Setting

# Where a prediction came from, in decreasing order of trust.
SOURCE_CALIBRATED = "calibrated"      # inside the calibrated batch range of this exact setting
SOURCE_EXTRAPOLATED = "extrapolated"  # fitted line for this setting, batch outside the calibrated range
SOURCE_PRIOR = "prior"                # analytic prior (possibly corrected by related calibrations)


@dataclass(frozen=True)
class Estimate:
    """A point prediction with its upper prediction bound (about 95%, from residuals or prior error)."""

    mean: float
    upper: float


@dataclass(frozen=True)
class Prediction:
    """Per-GPU peak memory (bytes) and seconds per optimizer step for one setting and micro-batch."""

    setting: Setting
    micro_batch: int
    gpu: str
    peak_allocated: Estimate
    peak_reserved: Estimate
    seconds_per_step: Estimate
    source: str
    wall_batch: int | None = None           # smallest batch observed at the allocator wall or OOM, if known
    measured_healthy: tuple[tuple[int, float], ...] = ()  # (batch, measured peak bytes) that ran below it
    notes: tuple[str, ...] = field(default=())
