"""Enumerate setups, find each one's largest safe micro-batch, and rank them by time or cost.

"Safe" is the definition of models/fit.py's largest_safe_batch, which the accuracy benchmark scores:
the predictor's *upper* bound on per-GPU peak reserved memory stays within capacity·(1 − margin),
and the batch stays below any batch observed at the allocator wall or out of memory. A fixed
CUDA-context reserve (torch's reserved bytes omit the context) can be taken off on top; it is 0 by
default, so the default budget is exactly the benchmark's. Memory grows with batch, so a
doubling-then-bisection search needs about 2·log2(batch) predictions per setup.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from calibration.settings import Setting
from models.errors import FtplanError
from models.fit import MAX_BATCH, SAFETY_MARGIN
from models.hardware import GIB, GpuSpec
from models.prediction import Prediction
from planner.eta import Eta, estimate_eta

TRAINING_KINDS = ("any", "full", "lora")
RANK_BY = ("time", "cost")
DEFAULT_LORA_RANKS = (16, 64)
DEFAULT_SAFETY_MARGIN = SAFETY_MARGIN
DEFAULT_CONTEXT_RESERVE_GIB = 0.0
MAX_SEARCH_BATCH = MAX_BATCH


class Predictor(Protocol):
    def predict(self, setting: Setting, micro_batch: int, gpu: GpuSpec) -> Prediction: ...


@dataclass(frozen=True)
class MemoryBudget:
    """How much of a card a plan may use: capacity·(1 − margin) − context reserve."""

    capacity_bytes: int
    safety_margin: float = DEFAULT_SAFETY_MARGIN
    context_reserve_bytes: int = int(DEFAULT_CONTEXT_RESERVE_GIB * GIB)
    capacity_source: str = "catalog"

    def __post_init__(self) -> None:
        if not 0 <= self.safety_margin < 1:
            raise FtplanError(f"safety margin must be in [0, 1), got {self.safety_margin}")
        if self.context_reserve_bytes < 0:
            raise FtplanError(f"CUDA-context reserve must be >= 0, got {self.context_reserve_bytes / GIB:g} GiB")
        if self.usable_bytes <= 0:
            raise FtplanError(f"no usable memory: {self.describe()}")

    @property
    def usable_bytes(self) -> int:
        return int(self.capacity_bytes * (1 - self.safety_margin) - self.context_reserve_bytes)

    def describe(self) -> str:
        text = (f"usable {self.usable_bytes / GIB:.1f} GiB = {self.capacity_bytes / GIB:.1f} GiB "
                f"({self.capacity_source}) × "
                f"(1 − {self.safety_margin:.0%} safety margin)")
        if self.context_reserve_bytes:
            text += f" − {self.context_reserve_bytes / GIB:g} GiB CUDA-context reserve"
        return text


def is_safe(prediction: Prediction, budget: MemoryBudget) -> bool:
    below_wall = prediction.wall_batch is None or prediction.micro_batch < prediction.wall_batch
    return below_wall and prediction.peak_reserved.upper <= budget.usable_bytes


def largest_safe_batch(predict: Callable[[int], Prediction], budget: MemoryBudget,
                       max_batch: int = MAX_SEARCH_BATCH) -> Prediction | None:
    """The prediction at the largest safe micro-batch ≤ max_batch, or None when batch 1 is unsafe."""
    best = predict(1)
    if not is_safe(best, budget):
        return None
    low, high = 1, None  # low is safe; high (when known) is unsafe
    while high is None and low < max_batch:
        trial = predict(min(2 * low, max_batch))
        if is_safe(trial, budget):
            low, best = trial.micro_batch, trial
        else:
            high = trial.micro_batch
    while high is not None and high - low > 1:
        trial = predict((low + high) // 2)
        if is_safe(trial, budget):
            low, best = trial.micro_batch, trial
        else:
            high = trial.micro_batch
    return best


def enumerate_settings(base: Setting, lora_ranks: Iterable[int] = DEFAULT_LORA_RANKS,
                       extra: Iterable[Setting] = ()) -> list[Setting]:
    """Every setup of base's model, sequence length and GPUs: ZeRO stage × offload × Liger × LoRA/full × checkpointing.

    On one GPU, ZeRO without offload partitions nothing, so it is left out unless calibrated (extra).
    """
    ranks = (0, *lora_ranks)
    if any(r <= 0 for r in ranks[1:]):
        raise FtplanError(f"LoRA ranks must be positive, got {list(lora_ranks)}")
    zero = [(0, False), (2, True), (3, True)]
    if base.world_size > 1:
        zero += [(2, False), (3, False)]
    settings = [base.with_(zero_stage=stage, offload_optimizer=offload, liger=liger, lora_rank=rank,
                           gradient_checkpointing=checkpointing)
                for (stage, offload), liger, rank, checkpointing
                in itertools.product(zero, (False, True), ranks, (False, True))]
    same_run = (base.model, base.seq_len, base.gpus, base.nodes)
    for setting in extra:
        if (setting.model, setting.seq_len, setting.gpus, setting.nodes) == same_run:
            settings.append(setting)
    return list(dict.fromkeys(settings))


@dataclass(frozen=True)
class SetupPlan:
    """One setup's verdict: its largest safe batch with the prediction there, or why it cannot run."""

    setting: Setting
    at_batch_one: Prediction
    best: Prediction | None = None
    eta: Eta | None = None

    @property
    def fits(self) -> bool:
        return self.best is not None

    @property
    def batch(self) -> int:
        return self.best.micro_batch if self.best else 0

    @property
    def training(self) -> str:
        return "lora" if self.setting.lora_rank else "full"

    @property
    def label(self) -> str:
        """The setting's label, plus what it omits when it differs from the defaults (calibrated extras)."""
        default = Setting(model=self.setting.model)
        extras = [self.setting.precision] if self.setting.precision != default.precision else []
        extras += [self.setting.optimizer] if self.setting.optimizer != default.optimizer else []
        extras += [self.setting.alloc_conf.replace(":True", "")] if self.setting.alloc_conf else []
        return " ".join([self.setting.label(), *extras])


@dataclass(frozen=True)
class PlanRequest:
    """What the user wants trained, on what, and how to choose."""

    base: Setting
    dataset_size: int
    epochs: float
    gpu: GpuSpec
    budget: MemoryBudget
    price_per_gpu_hour: float | None = None
    max_hours: float | None = None
    by: str = "time"
    training: str = "any"
    lora_ranks: tuple[int, ...] = DEFAULT_LORA_RANKS

    def __post_init__(self) -> None:
        if self.dataset_size <= 0:
            raise FtplanError(f"dataset size must be positive, got {self.dataset_size}")
        if self.epochs <= 0:
            raise FtplanError(f"epochs must be positive, got {self.epochs}")
        if self.training not in TRAINING_KINDS:
            raise FtplanError(f"training must be one of {', '.join(TRAINING_KINDS)}, got '{self.training}'")
        if self.by not in RANK_BY:
            raise FtplanError(f"--by must be one of {', '.join(RANK_BY)}, got '{self.by}'")
        if self.by == "cost" and self.price_per_gpu_hour is None:
            raise FtplanError("ranking by cost needs --price-per-hour")
        for name, value in (("price per hour", self.price_per_gpu_hour), ("max hours", self.max_hours)):
            if value is not None and value <= 0:
                raise FtplanError(f"{name} must be positive, got {value}")


@dataclass(frozen=True)
class Plan:
    """Every setup considered: ranked (fits, within --max-hours), too slow, and cannot fit at batch 1."""

    request: PlanRequest
    ranked: list[SetupPlan]
    too_slow: list[SetupPlan] = field(default_factory=list)
    unfit: list[SetupPlan] = field(default_factory=list)

    @property
    def recommended(self) -> SetupPlan | None:
        """The best setup of the user's training choice (full, LoRA, or either)."""
        wanted = self.request.training
        return next((s for s in self.ranked if wanted == "any" or s.training == wanted), None)


def plan_setup(predictor: Predictor, setting: Setting, request: PlanRequest) -> SetupPlan:
    """Largest safe batch of one setting, and the run's ETA there."""
    def predict(batch: int) -> Prediction:
        return predictor.predict(setting, batch, request.gpu)

    # A per-GPU batch beyond the samples each GPU sees in one epoch only pads the last step.
    max_batch = min(MAX_SEARCH_BATCH, -(-request.dataset_size // setting.world_size))
    at_one = predict(1)
    best = largest_safe_batch(predict, request.budget, max_batch)
    if best is None:
        return SetupPlan(setting, at_one)
    eta = estimate_eta(best.seconds_per_step.mean, request.dataset_size, request.epochs, best.micro_batch,
                       setting.world_size, request.price_per_gpu_hour)
    return SetupPlan(setting, at_one, best, eta)


def make_plan(predictor: Predictor, request: PlanRequest, extra: Iterable[Setting] = ()) -> Plan:
    """Search every setup and rank those that fit by total time (or cost), fastest first."""
    settings = enumerate_settings(request.base, request.lora_ranks, extra)
    setups = [plan_setup(predictor, s, request) for s in settings]
    fitting = [s for s in setups if s.fits]
    unfit = [s for s in setups if not s.fits]
    if not fitting:
        raise FtplanError(
            f"no setup of {request.base.model} at seq-len {request.base.seq_len} fits on {request.gpu.name} "
            f"even at batch 1 ({request.budget.describe()}); the smallest needs "
            f"{min(s.at_batch_one.peak_reserved.upper for s in unfit) / GIB:.1f} GiB; "
            "try a shorter --seq-len, more GPUs with ZeRO-3, or a larger card")
    key = (lambda s: (s.eta.cost, s.eta.total_seconds)) if request.by == "cost" else \
          (lambda s: (s.eta.total_seconds, -s.batch))
    fitting.sort(key=key)
    limit = request.max_hours
    ranked = [s for s in fitting if limit is None or s.eta.hours <= limit]
    too_slow = [s for s in fitting if limit is not None and s.eta.hours > limit]
    unfit.sort(key=lambda s: s.at_batch_one.peak_reserved.upper)
    return Plan(request, ranked, too_slow, unfit)
