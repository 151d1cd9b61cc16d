"""What every predictor returns, so the planner never cares whether a number came from a fit or the prior."""

from __future__ import annotations

from dataclasses import dataclass, field

from ftplan.core.settings import Setting

# Where a prediction came from, in decreasing order of trust.
SOURCE_VERIFIED = "verified"          # the emitted folder of this plan itself ran at this batch (`ftplan rehearse`)
SOURCE_MEASURED = "measured"          # this exact setting, batch and card ran
SOURCE_INTERPOLATED = "interpolated"  # inside the calibrated batch range of this exact setting and card
SOURCE_EXTRAPOLATED = "extrapolated"  # beyond the calibrated batches, or from a relative (length, card, GPU count)
SOURCE_PRIOR = "prior"                # analytic prior alone (its constants learned from other calibrations)
SOURCE_CALIBRATED = SOURCE_INTERPOLATED  # inside the calibrated range (what the Trainer callback compares)


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
    extrapolation: float = 1.0              # batch (tokens) over the largest calibrated one, when beyond it
    # Of seconds_per_step, what an optimizer step pays once however many micro-steps it accumulates: the optimizer
    # step itself, and DDP's gradient all-reduce (the Trainer skips it, no_sync, on the micro-steps before the last).
    update_seconds: float = 0.0

    def optimizer_step(self, accumulation: int = 1) -> Estimate:
        """Seconds of one optimizer step over `accumulation` micro-steps of this micro-batch, mean and bound."""
        once = self.update_seconds
        return Estimate(accumulation * (self.seconds_per_step.mean - once) + once,
                        accumulation * (self.seconds_per_step.upper - once) + once)

    def step_seconds(self, accumulation: int = 1) -> float:
        """Mean seconds of one optimizer step over `accumulation` micro-steps of this micro-batch."""
        return self.optimizer_step(accumulation).mean

    @property
    def evidence(self) -> str:
        """What the numbers rest on, for every table row: measured, interpolated, extrapolated ×k or prior."""
        if self.source == SOURCE_EXTRAPOLATED and self.extrapolation > 1:
            return f"extrapolated ×{self.extrapolation:.1f}"
        return self.source
