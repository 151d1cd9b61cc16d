"""Enumerate setups, find each one's largest safe micro-batch, and rank them by time or cost.

"Safe" is models/safe_batch.py's rule, the one the accuracy benchmark scores: the predictor's
*upper* bound on per-GPU peak reserved memory stays within the budget, and the batch stays below any
batch observed at the allocator wall or out of memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from ftplan.core.architecture import cached_architecture
from ftplan.core.errors import DoesNotFit, FtplanError
from ftplan.core.hardware import CPU, GpuSpec
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.eta import Eta, check_price, estimate_eta, largest_micro_batch
from ftplan.models.fit import MAX_BATCH, SAFETY_MARGIN, TIME_FLOOR
from ftplan.models.host_memory import host_bytes_per_node, usable_host_bytes
from ftplan.models.prediction import (
    SOURCE_EXTRAPOLATED,
    SOURCE_INTERPOLATED,
    SOURCE_MEASURED,
    SOURCE_VERIFIED,
    Prediction,
)
from ftplan.models.safe_batch import MemoryBudget, is_safe, largest_safe_batch

TRAINING_KINDS = ("any", "full", "lora")
ALLOWED = ("qlora",)  # setups planned only when asked for (--allow)
RANK_BY = ("time", "cost")
DEFAULT_LORA_RANKS = (16, 64)
DEFAULT_SAFETY_MARGIN = SAFETY_MARGIN
MAX_SEARCH_BATCH = MAX_BATCH
# Setups whose time (or cost) lies within the time fit's own floor of relative uncertainty of the
# best are a tie the numbers cannot break; the recommendation then goes to the best-measured one.
NEAR_TIE = TIME_FLOOR
TRUST = {SOURCE_VERIFIED: -1, SOURCE_MEASURED: 0, SOURCE_INTERPOLATED: 1, SOURCE_EXTRAPOLATED: 2}  # anything else (the prior) ranks after these


class Predictor(Protocol):
    def predict(self, setting: Setting, micro_batch: int, gpu: GpuSpec) -> Prediction: ...


def fits_budget(prediction: Prediction, budget: MemoryBudget) -> bool:
    """ftplan.models.safe_batch's rule applied to one prediction."""
    return is_safe(prediction.micro_batch, prediction.peak_reserved.upper, budget, prediction.wall_batch,
                   prediction.measured_healthy)


def safe_prediction(predict: Callable[[int], Prediction], budget: MemoryBudget,
                    max_batch: int = MAX_SEARCH_BATCH) -> Prediction | None:
    """The prediction at the largest safe micro-batch ≤ max_batch, or None when batch 1 is unsafe.

    The wall (or OOM) batch a prediction carries belongs to its setting, not to the batch asked.
    """
    first = predict(1)
    batch = largest_safe_batch(lambda b: predict(b).peak_reserved.upper, budget, first.wall_batch, max_batch,
                               first.measured_healthy)
    return predict(batch) if batch else None


# Regimes ranked when the user names none: mixed precision with fp32 master weights (Trainer's bf16=True)
# and pure bf16 (the model loaded in bf16). fp16 and fp32 are what older or CPU hardware runs: asked by name.
DEFAULT_PRECISIONS = ("bf16", "bf16-pure")


def enumerate_settings(base: Setting, lora_ranks: Iterable[int] = DEFAULT_LORA_RANKS,
                       extra: Iterable[Setting] = (), precisions: Iterable[str] = ("bf16",)) -> list[Setting]:
    """Every setup of base's model, sequence length and GPUs: ZeRO stage × offload × Liger × LoRA/full ×
    checkpointing, for each precision regime asked.

    On one GPU ZeRO partitions nothing: only ZeRO-2 with optimizer offload differs from plain training
    (ZeRO-3 + offload would add parameter gathering for the same memory), so the others are left out
    unless calibrated (extra). Pure bf16 is plain PyTorch full fine-tuning (DeepSpeed keeps an fp32
    master copy, and a LoRA base is already bf16), so it pairs with neither.
    """
    ranks = (0, *lora_ranks)
    if any(r <= 0 for r in ranks[1:]):
        raise FtplanError(f"LoRA ranks must be positive, got {list(lora_ranks)}")
    zero = [(0, False), (2, True)]
    if base.world_size > 1:
        zero += [(3, True), (2, False), (3, False)]
    settings = [base.with_(zero_stage=stage, offload_optimizer=offload, liger=liger, lora_rank=rank,
                           gradient_checkpointing=checkpointing, precision=precision)
                for precision, (stage, offload), liger, rank, checkpointing
                in itertools.product(precisions, zero, (False, True), ranks, (False, True))
                if precision != "bf16-pure" or (stage == 0 and rank == 0)]
    same_run = (base.model, base.seq_len, base.gpus, base.nodes)
    for setting in extra:
        if (setting.model, setting.seq_len, setting.gpus, setting.nodes) == same_run:
            settings.append(setting)
    return list(dict.fromkeys(settings))


@dataclass(frozen=True)
class SetupPlan:
    """One setup's verdict: its largest safe batch with the prediction there, or why it cannot run.

    host_bytes: host RAM per node its CPU optimizer offload needs (ftplan.models.host_memory; 0 without offload);
    host_short: it needs more than the user's --host-memory-gib allows, so it cannot run whatever the GPU.
    """

    setting: Setting
    at_batch_one: Prediction
    best: Prediction | None = None
    eta: Eta | None = None
    host_bytes: int = 0
    host_short: bool = False

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
        return self.setting.full_label()


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
    host_memory_gib: float | None = None  # host RAM per node; None: unknown, offload rows only show their need
    precision: str | None = None  # --precision: only this regime; None ranks DEFAULT_PRECISIONS and any calibrated one
    allow: tuple[str, ...] = ()  # opt-in setups (ALLOWED): "qlora" adds every LoRA setup on a 4-bit NF4 base

    def __post_init__(self) -> None:
        if self.host_memory_gib is not None:
            usable_host_bytes(self.host_memory_gib, self.budget.margin)  # rejects 0, negative, NaN
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
        check_price(self.price_per_gpu_hour)
        if self.max_hours is not None and self.max_hours <= 0:
            raise FtplanError(f"max hours must be positive, got {self.max_hours}")

    @property
    def usable_host_bytes(self) -> int | None:
        """Host RAM per node offload may fill (the GPU budget's safety margin kept free), None when unknown."""
        if self.host_memory_gib is None:
            return None
        return usable_host_bytes(self.host_memory_gib, self.budget.margin)


@dataclass(frozen=True)
class Plan:
    """Every setup considered: ranked (fits, within --max-hours), too slow, and cannot fit at batch 1."""

    request: PlanRequest
    ranked: list[SetupPlan]
    too_slow: list[SetupPlan] = field(default_factory=list)
    unfit: list[SetupPlan] = field(default_factory=list)

    @property
    def candidates(self) -> list[SetupPlan]:
        """Ranked setups of the user's training choice (full, LoRA, or either)."""
        wanted = self.request.training
        return [s for s in self.ranked if wanted == "any" or s.training == wanted]

    @property
    def recommended(self) -> SetupPlan | None:
        """The candidates' choice (`_choose`)."""
        return self._choose(self.candidates)

    def best_of(self, training: str) -> SetupPlan | None:
        """The same choice among one kind of training ("full" or "lora"): what the side-by-side shows of it."""
        return self._choose([s for s in self.ranked if s.training == training])

    def _choose(self, ranked: list[SetupPlan]) -> SetupPlan | None:
        """The best of `ranked`; among those within NEAR_TIE of it, the best-measured, then the one with the
        fewest moving parts, then the first. A near tie never trades fp32 master weights away: pure bf16 is not a
        simpler ZeRO-2 run in mixed precision, but another training's numerics."""
        if not ranked:
            return None
        score = (lambda s: s.eta.cost) if self.request.by == "cost" else (lambda s: s.eta.total_seconds)
        pure = ranked[0].setting.precision == "bf16-pure"
        tied = [s for s in ranked if score(s) <= score(ranked[0]) * (1 + NEAR_TIE)
                and (pure or s.setting.precision != "bf16-pure")]
        return min(tied, key=lambda s: (TRUST.get(s.best.source, len(TRUST)), _moving_parts(s.setting)))

    @property
    def fastest(self) -> SetupPlan | None:
        """The top-ranked candidate, which the recommendation passes over only for a better-measured near tie."""
        return next(iter(self.candidates), None)


def _moving_parts(setting: Setting) -> int:
    """What a near tie should not buy: DeepSpeed (another dependency and launcher) and CPU optimizer offload
    (host RAM, PCIe traffic, a CPU-Adam build)."""
    return int(setting.uses_deepspeed) + int(setting.offload_optimizer)


def plan_setup(predictor: Predictor, setting: Setting, request: PlanRequest) -> SetupPlan:
    """Largest safe batch of one setting, and the run's ETA there."""
    def predict(batch: int) -> Prediction:
        return predictor.predict(setting, batch, request.gpu)

    # A per-GPU batch beyond the samples each GPU sees in one epoch only pads the last step.
    max_batch = min(MAX_SEARCH_BATCH, largest_micro_batch(request.dataset_size, setting.world_size))
    at_one = predict(1)
    host = host_bytes_per_node(cached_architecture(setting.model), setting)
    usable_host = request.usable_host_bytes
    if usable_host is not None and host > usable_host:
        return SetupPlan(setting, at_one, host_bytes=host, host_short=True)
    best = safe_prediction(predict, request.budget, max_batch)
    if best is None:
        return SetupPlan(setting, at_one, host_bytes=host)
    eta = estimate_eta(best.seconds_per_step.mean, request.dataset_size, request.epochs, best.micro_batch,
                       setting.world_size, request.price_per_gpu_hour, best.seconds_per_step.upper)
    return SetupPlan(setting, at_one, best, eta, host_bytes=host)


def _qlora_untried(settings: list[Setting], request: PlanRequest) -> bool:
    """Whether a 4-bit base, which holds a quarter of bf16's weights, was left out only for want of asking."""
    return "qlora" not in request.allow and request.training != "full" and request.gpu.name != CPU and any(
        s.lora_rank and not s.uses_deepspeed and s.precision in ("bf16", "fp16") for s in settings)


def make_plan(predictor: Predictor, request: PlanRequest, extra: Iterable[Setting] = ()) -> Plan:
    """Search every setup and rank those that fit by total time (or cost), fastest first."""
    precisions = (request.precision,) if request.precision else DEFAULT_PRECISIONS
    allowed = [s for s in extra if request.precision in (None, s.precision)
               and (not s.quantization or "qlora" in request.allow)]  # a calibrated QLoRA is still opt-in
    settings = enumerate_settings(request.base, request.lora_ranks, allowed, precisions)
    if "qlora" in request.allow:
        settings += [s.with_(quantization="nf4") for s in settings
                     if s.lora_rank and not s.uses_deepspeed and s.precision in ("bf16", "fp16")]
    if request.gpu.name == CPU:  # Liger's kernels need CUDA (Triton), DeepSpeed an accelerator
        settings = [s for s in settings if not s.liger and not s.uses_deepspeed]
    setups = [plan_setup(predictor, s, request) for s in settings]
    fitting = [s for s in setups if s.fits]
    unfit = [s for s in setups if not s.fits]
    if not fitting:  # setups without offload never fall short of host RAM, so some are GPU-bound
        gpu_unfit = [s for s in unfit if not s.host_short]
        raise DoesNotFit(
            f"no setup of {request.base.model} at seq-len {request.base.seq_len} fits on {request.gpu.name} "
            f"even at batch 1 ({request.budget.describe()}); the smallest needs "
            f"{min(s.at_batch_one.peak_reserved.upper for s in gpu_unfit) / GIB:.1f} GiB; "
            "try a shorter --seq-len, more GPUs with ZeRO-3, "
            + ("--allow qlora (LoRA on a 4-bit base), " if _qlora_untried(settings, request) else "")
            + "or a larger card"
            + (f" (offload setups need more than the {request.host_memory_gib:g} GiB of host RAM per node)"
               if len(gpu_unfit) < len(unfit) else ""))
    key = (lambda s: (s.eta.cost, s.eta.total_seconds)) if request.by == "cost" else \
          (lambda s: (s.eta.total_seconds, -s.batch))
    fitting.sort(key=key)
    limit = request.max_hours
    ranked = [s for s in fitting if limit is None or s.eta.hours <= limit]
    too_slow = [s for s in fitting if limit is not None and s.eta.hours > limit]
    unfit.sort(key=lambda s: s.at_batch_one.peak_reserved.upper)
    return Plan(request, ranked, too_slow, unfit)
