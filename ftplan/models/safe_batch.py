"""The one rule that turns predicted memory and a card into a batch size: the largest safe micro-batch.

A batch is safe when it stays below any batch observed at the allocator wall or out of memory, and
either the *upper* bound of per-GPU peak reserved memory stays within capacity·(1 − margin) −
context reserve, or the batch was itself measured healthy with a peak within that same budget
(observations outrank any fit, both ways). One budget for both: a calibration trial runs a few
steps, a real run thousands with evaluation and checkpoints between them, so a batch that ran at
99% of the card is no safer than a prediction of 99% (qwen2.5-0.5b full ran at batch 19 with 138.7 of
139.8 GiB reserved; it is recorded, and planned only when the user lowers the margin).
The planner (over Predictor answers) and the accuracy benchmark (over one SettingFit) both call
`largest_safe_batch`, so the batch the planner recommends is the batch the benchmark scores.

The context reserve is 0 by default: capacities are what PyTorch can allocate on the card (measured
by calibration, else the catalog's PyTorch-reported total), so the CUDA context is already outside.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ftplan.core.errors import FtplanError
from ftplan.core.units import GIB
from ftplan.models.fit import MAX_BATCH, SAFETY_MARGIN, SettingFit

DEFAULT_CONTEXT_RESERVE_GIB = 0.0


@dataclass(frozen=True)
class MemoryBudget:
    """How much of a card a batch may use, predicted or measured: capacity·(1 − margin) − context reserve.

    safety_margin None is the default policy (SAFETY_MARGIN); a number is the user's.
    """

    capacity_bytes: int
    safety_margin: float | None = None
    context_reserve_bytes: int = int(DEFAULT_CONTEXT_RESERVE_GIB * GIB)
    capacity_source: str = "catalog"

    def __post_init__(self) -> None:
        if not 0 <= self.margin < 1:
            raise FtplanError(f"safety margin must be in [0, 1), got {self.margin}")
        if self.context_reserve_bytes < 0:
            raise FtplanError(f"CUDA-context reserve must be >= 0, got {self.context_reserve_bytes / GIB:g} GiB")
        if self.usable_bytes <= 0:
            raise FtplanError(f"no usable memory: {self.describe()}")

    @property
    def margin(self) -> float:
        """The margin above predicted bounds."""
        return SAFETY_MARGIN if self.safety_margin is None else self.safety_margin

    @property
    def usable_bytes(self) -> int:
        """What a predicted upper bound or a measured peak may reach."""
        return int(self.capacity_bytes * (1 - self.margin) - self.context_reserve_bytes)

    def describe(self) -> str:
        text = (f"usable {self.usable_bytes / GIB:.1f} GiB = {self.capacity_bytes / GIB:.1f} GiB "
                f"({self.capacity_source}) × (1 − {self.margin:.0%} safety margin)")
        if self.context_reserve_bytes:
            text += f" − {self.context_reserve_bytes / GIB:g} GiB CUDA-context reserve"
        return text


def proven_batch(measured_healthy: Sequence[tuple[int, float]], limit_bytes: int) -> int | None:
    """Largest batch that ran healthily with a measured peak within the limit: safe by observation
    where the fit's bound is cautious."""
    return max((batch for batch, peak in measured_healthy if peak <= limit_bytes), default=None)


def is_safe(batch: int, reserved_upper_bytes: float, budget: MemoryBudget, observed_limit: int | None,
            measured_healthy: Sequence[tuple[int, float]] = ()) -> bool:
    """The rule for one batch: below the smallest batch seen at the wall or OOM, and either no larger
    than a batch measured healthy within the card or under the usable memory."""
    below_limit = observed_limit is None or batch < observed_limit
    proven = proven_batch(measured_healthy, budget.usable_bytes)
    return bool(below_limit and ((proven is not None and batch <= proven) or reserved_upper_bytes <= budget.usable_bytes))


def largest_safe_batch(reserved_upper: Callable[[int], float], budget: MemoryBudget,
                       observed_limit: int | None = None, max_batch: int = MAX_BATCH,
                       measured_healthy: Sequence[tuple[int, float]] = ()) -> int:
    """Largest safe micro-batch ≤ max_batch, 0 when not even batch 1 is safe.

    reserved_upper(batch) is the upper bound of peak reserved bytes per GPU, non-decreasing in
    batch, so doubling then bisecting finds it with about 2·log2(batch) evaluations (each one a
    prediction, so few matter when the planner searches hundreds of setups).
    """
    def safe(batch: int) -> bool:
        return is_safe(batch, reserved_upper(batch), budget, observed_limit, measured_healthy)

    if max_batch < 1 or not safe(1):
        return 0
    low, high = 1, None  # low is safe; high (when known) is not
    while high is None and low < max_batch:
        trial = min(2 * low, max_batch)
        low, high = (trial, None) if safe(trial) else (low, trial)
    while high is not None and high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if safe(middle) else (low, middle)
    return low


def fit_largest_safe_batch(fit: SettingFit, seq_len: int, budget: MemoryBudget) -> int:
    """The rule applied to one fit at one sequence length, as the accuracy benchmark scores it."""
    return largest_safe_batch(lambda batch: fit.peak_reserved(batch, seq_len).upper, budget,
                              fit.observed_limit(seq_len), measured_healthy=fit.measured_healthy(seq_len))
