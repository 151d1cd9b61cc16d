"""Plan from the dataset's token lengths instead of one padded sequence length.

Memory is planned at the longest micro-batch the run will meet (the setting's seq_len is that batch's
padded length: the longest sample for pad, dynamic and group_by_length, the row for packing), because the
OOM a user meets hundreds of steps in is the step that draws the long tail. Time is predicted at the mean
padded length of a step's micro-batch (the calibration's step time is a function of tokens per
micro-batch, measured across sequence lengths), and steps count the real rows (samples or packed rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ftplan.core.errors import DoesNotFit, FtplanError
from ftplan.core.hardware import CPU
from ftplan.core.settings import Setting
from ftplan.models.batching import (
    DEFAULT_CONFIDENCE,
    STRATEGIES,
    TOO_LONG,
    Batching,
    LengthStats,
    LimitedLengths,
    apply_limit,
    batching,
    fastest_batch,
    saturating_batch,
    split_global_batch,
)
from ftplan.models.eta import Eta, steps_to_finish
from ftplan.models.prediction import Estimate, Prediction
from ftplan.models.predictor import with_accumulation
from ftplan.planner.dataset import CHARS_PER_TOKEN, DatasetLengths, load_lengths
from ftplan.planner.search import Plan, PlanRequest, Predictor, SetupPlan, make_plan, safe_prediction

# Batchings whose padded shape changes from step to step. On a GPU such shapes fragment PyTorch's caching
# allocator: on an H200 (benchmarks/gpu/results/dataset_memory_h200_2026-12-03.txt) a random-order epoch of
# dynamic padding reserved 1.82x (batch 4) and 1.79x (batch 8) what a fixed-shape calibration trial at its
# longest micro-batch reserved, the longest batch being the peak step. PyTorch documents expandable segments
# for exactly this ("a job changing allocation sizes frequently, such as having a changing batch size"):
# ALLOC_CONF_DOC. Packing, measured at 1.10x and 1.38x, compared flattened rows with a trial of separate
# rows, so its gap is not the allocator's alone and it gets no note yet.
VARIABLE_SHAPES = ("dynamic", "group")
EXPANDABLE_SEGMENTS = "expandable_segments:True"
ALLOC_CONF_DOC = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
VARIABLE_SHAPE_RESULTS = "benchmarks/gpu/results/dataset_memory_h200_2026-12-03.txt"
REHEARSAL_RESULTS = "benchmarks/gpu/results/emitted_runs_h200.jsonl, emitted_runs_h100_2026-12-07.jsonl"


@dataclass(frozen=True)
class DatasetOptions:
    """How the user batches: strategy, pack length, length limit and what to do over it, target global batch."""

    strategy: str = "dynamic"
    pack_length: int | None = None
    max_length: int | None = None  # samples longer are truncated or dropped; None keeps every sample whole
    too_long: str = "truncate"
    global_batch: int | None = None
    confidence: float = DEFAULT_CONFIDENCE

    def __post_init__(self) -> None:
        """The API builds these from a caller's values: a bad name or type is a one-line error here, not a KeyError
        later (ranges are checked where they are used, as for the CLI)."""
        if self.strategy not in STRATEGIES:
            raise FtplanError(f"batching strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.too_long not in TOO_LONG:
            raise FtplanError(f"too_long must be one of {', '.join(TOO_LONG)}, got {self.too_long!r}")
        for name in ("pack_length", "max_length", "global_batch"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise FtplanError(f"{name} must be a whole number or None, got {value!r}")
        if not 0 < self.confidence < 1:
            raise FtplanError(f"confidence must be between 0 and 1, got {self.confidence!r}")


@dataclass(frozen=True)
class SetupBatching:
    """One setup's micro-batch × accumulation, what a micro-batch holds, and where throughput stops growing."""

    setting: Setting
    micro_batch: int
    accumulation: int
    batching: Batching
    largest_fitting: int
    saturating: int | None  # without a target global batch: the smallest batch within 5% of the best throughput
    rows_per_second: float

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accumulation * self.setting.world_size

    @property
    def real_tokens_per_step(self) -> float:
        return self.batching.real_tokens_per_micro_batch * self.accumulation * self.setting.world_size


@dataclass(frozen=True)
class DatasetPlan:
    """The plan, the length distribution it rests on, and each fitting setup's batching."""

    plan: Plan
    stats: LengthStats
    limited: LimitedLengths
    options: DatasetOptions
    setups: dict[Setting, SetupBatching]
    left_out: tuple[SetupPlan, ...] = ()  # fit, but no micro-batch of the global batch fits with the kept gradients

    @property
    def recommended(self) -> SetupBatching | None:
        best = self.plan.recommended
        return self.setups.get(best.setting) if best else None

    @property
    def notes(self) -> tuple[str, ...]:
        """What the plan's numbers do not show: the allocator's growth under variable shapes on a GPU, and the
        setups the global batch left out."""
        notes = allocator_notes(self.options.strategy, self.plan.request.gpu.name, self.plan.request.base.alloc_conf)
        if self.left_out:
            notes += (f"Left out for --global-batch {self.options.global_batch}: "
                      + "; ".join(f"{s.label} (fits micro-batch {s.batch} without accumulation)" for s in self.left_out)
                      + ": it needs gradient accumulation, and no micro-batch of it fits with the gradients "
                        "accumulation keeps; a smaller --global-batch keeps them.",)
        return notes


# The collator each batching strategy emits, as the recipe's padding (ftplan.core.recipe).
STRATEGY_PADDING = {"pad": "max_length", "dynamic": "longest", "group": "longest", "pack": "packed"}


def recommended_alloc_conf(strategy: str, device: str) -> str:
    """PYTORCH_CUDA_ALLOC_CONF a run of this batching should set on this device ('' for none)."""
    return EXPANDABLE_SEGMENTS if strategy in VARIABLE_SHAPES and device != CPU else ""


def allocator_notes(strategy: str, device: str, alloc_conf: str = "") -> tuple[str, ...]:
    """The note a plan prints when its batching gives the GPU's caching allocator shapes that change each step,
    under the default allocator (expandable segments, the remedy, already set: nothing to say)."""
    if not recommended_alloc_conf(strategy, device) or EXPANDABLE_SEGMENTS in alloc_conf:
        return ()
    name = "group_by_length" if strategy == "group" else "dynamic padding"
    return ((f"{name} changes the micro-batch's shape every step, which fragments PyTorch's CUDA caching "
             "allocator. Rehearsed for 20 steps, the heaviest batches first and then a random mix, emitted "
             f"dynamic-padding configs reserved up to 6.7% above the fixed-shape prediction and inside its bound "
             f"({REHEARSAL_RESULTS}); over a whole random-order epoch an H200 once reserved up to 1.8× what a "
             f"fixed-shape trial at the longest micro-batch did ({VARIABLE_SHAPE_RESULTS}; allocated memory not "
             "recorded), so the safe batch is unchanged and `ftplan rehearse` checks this run. PyTorch recommends "
             f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE_SEGMENTS} for changing shapes ({ALLOC_CONF_DOC}): calibrate and "
             "plan with --alloc-conf expandable_segments:True to run with it, measured (--emit sets the allocator "
             "the plan was made for)."),)


def _length_limit(options: DatasetOptions) -> int | None:
    """Packing cuts rows at the pack length, and a --max-length below it cuts the samples sooner."""
    limit = options.pack_length if options.strategy == "pack" else options.max_length
    if options.strategy == "pack" and options.max_length is not None:
        limit = min(limit or options.max_length, options.max_length)
    return limit


def _check_rows(shape: Batching, world: int, options: DatasetOptions) -> None:
    """Refuse a step bigger than the dataset before planning steps that can never be filled."""
    if world > shape.rows or (options.global_batch or 0) > shape.rows:
        what = f"{world:,} GPUs" if world > shape.rows else f"a global batch of {options.global_batch:,}"
        raise FtplanError(f"{what} for the dataset's {shape.rows:,} {'packed rows' if options.strategy == 'pack' else 'samples'}"
                          f": an optimizer step cannot hold more than the dataset; give at most {shape.rows:,}")


@dataclass
class _SetupTimer:
    """Times each fitting setup at the dataset's real lengths; the padded-length plan only decided what fits.

    The batchings are cached across setups: each asks for the same few batches, and a batching of
    100,000 lengths sorts them.
    """

    predictor: Predictor
    request: PlanRequest
    options: DatasetOptions
    limited: LimitedLengths
    shape: Batching  # at micro-batch 1 on the base layout: pad and pack keep its rows and lengths at any batch
    cache: dict[tuple[int, int, int], Batching] = field(default_factory=dict)

    def shape_at(self, setting: Setting, batch: int, accumulation: int = 1) -> Batching:
        if self.options.strategy in ("pad", "pack"):  # rows and lengths do not depend on the batch
            return replace(self.shape, micro_batch=batch, world_size=setting.world_size)
        key = (batch, accumulation, setting.world_size)
        if key not in self.cache:
            self.cache[key] = batching(self.options.strategy, self.limited.lengths, batch, setting.world_size,
                                       accumulation, self.options.pack_length, self.request.epochs,
                                       self.options.confidence)
        return self.cache[key]

    def step_seconds(self, setting: Setting, batch: int, accumulation: int = 1) -> float:
        """Seconds of one optimizer step of `accumulation` micro-batches. Time follows the mean padded length of a
        micro-batch, not the longest one memory is planned at."""
        return self.step_estimate(setting, batch, accumulation).mean

    def step_estimate(self, setting: Setting, batch: int, accumulation: int = 1) -> Estimate:
        """step_seconds with its upper bound."""
        length = max(1, round(self.shape_at(setting, batch, accumulation).time_length))
        prediction = self.predictor.predict(setting.with_(seq_len=length), batch, self.request.gpu)
        return prediction.optimizer_step(accumulation)

    def _split(self, setting: Setting, largest: int) -> tuple[int, int, int | None] | None:
        """A target global batch fixes micro-batch × accumulation; without one the largest fitting batch runs, or
        with dynamic padding, grouping and packing a clearly faster smaller one; the batch where throughput stops
        growing is worth reporting. None: the global batch needs accumulation, and no micro-batch of this setup
        fits with the gradients it keeps."""
        def rows_per_second(batch: int) -> float:
            return batch * setting.world_size / self.step_seconds(setting, batch)

        if self.options.global_batch is not None:
            accumulating = self._largest_accumulating(setting, largest)
            if self.options.global_batch > largest * setting.world_size and not accumulating:
                return None
            per_gpu = max(1, self.options.global_batch // setting.world_size)

            def split_rows_per_second(batch: int) -> float:  # the optimizer step's update is paid once per split
                accumulation = max(1, per_gpu // batch)
                return batch * accumulation * setting.world_size / self.step_seconds(setting, batch, accumulation)

            micro, accumulation = split_global_batch(self.options.global_batch, setting.world_size, largest,
                                                     split_rows_per_second, accumulating)
            return micro, accumulation, None
        micro = largest if self.options.strategy == "pad" else fastest_batch(largest, rows_per_second)
        return micro, 1, saturating_batch(micro, rows_per_second)

    def memory_at(self, setting: Setting, batch: int, accumulation: int = 1) -> Prediction:
        """Memory at the longest batch's length, with the gradients accumulation keeps between micro-steps."""
        return with_accumulation(self.predictor.predict(setting, batch, self.request.gpu), accumulation)

    def _largest_accumulating(self, setting: Setting, largest: int) -> int:
        """The largest micro-batch that stays safe while gradient accumulation keeps the gradients (0: none)."""
        best = safe_prediction(lambda batch: self.memory_at(setting, batch, 2), self.request.budget, largest)
        return best.micro_batch if best is not None else 0

    def time(self, setup: SetupPlan) -> tuple[SetupPlan, SetupBatching] | None:
        """The setup with its ETA from real rows and tokens, and the batching that ETA assumes (None: the target
        global batch does not fit it)."""
        setting, request = setup.setting, self.request
        split = self._split(setting, setup.batch)
        if split is None:
            return None
        micro, accumulation, saturating = split
        shape_used = self.shape_at(setting, micro, accumulation)
        step = self.step_estimate(setting, micro, accumulation)
        per_step = step.mean
        steps = steps_to_finish(shape_used.rows, request.epochs, micro, setting.world_size, accumulation)
        total = steps * per_step
        price = request.price_per_gpu_hour
        eta = Eta(steps, per_step, total, None if price is None else total / 3600 * price * setting.world_size,
                  upper_seconds_per_step=step.upper)
        best = self.memory_at(setting, micro, accumulation)
        chosen = SetupBatching(setting, micro, accumulation, shape_used, setup.batch, saturating,
                               micro * accumulation * setting.world_size / per_step)
        return replace(setup, best=best, eta=eta), chosen


def _rank(setups: Iterable[SetupPlan], request: PlanRequest) -> tuple[list[SetupPlan], list[SetupPlan]]:
    """Rank again, and split at the deadline, by the real-length ETAs: the padded-length ones ranked the plan."""
    key = (lambda s: (s.eta.cost, s.eta.total_seconds)) if request.by == "cost" else \
          (lambda s: (s.eta.total_seconds, -s.batch))
    fitting = sorted(setups, key=key)
    limit_hours = request.max_hours
    ranked = [s for s in fitting if limit_hours is None or s.eta.hours <= limit_hours]
    too_slow = [s for s in fitting if limit_hours is not None and s.eta.hours > limit_hours]
    return ranked, too_slow


def plan_from_lengths(predictor: Predictor, request: PlanRequest, lengths: Iterable[int] | np.ndarray,
                      options: DatasetOptions, extra: Iterable[Setting] = ()) -> DatasetPlan:
    """make_plan at the longest batch's length, then each setup's steps and ETA from its real tokens per step.

    request.dataset_size is replaced by the dataset's rows, and request.base.seq_len by the memory length.
    """
    values = np.asarray(list(lengths) if not isinstance(lengths, np.ndarray) else lengths)
    stats = LengthStats.of(values)
    limited = apply_limit(values, _length_limit(options), options.too_long)
    shape = batching(options.strategy, limited.lengths, 1, request.base.world_size, pack_length=options.pack_length,
                     epochs=request.epochs, confidence=options.confidence)
    _check_rows(shape, request.base.world_size, options)
    padding = STRATEGY_PADDING[options.strategy]
    memory_request = replace(request, base=request.base.with_(seq_len=shape.memory_length, padding=padding),
                             dataset_size=shape.rows)
    plan = make_plan(predictor, memory_request, [s.with_(seq_len=shape.memory_length, padding=padding) for s in extra])
    timer = _SetupTimer(predictor, request, options, limited, shape)
    considered = [*plan.ranked, *plan.too_slow]
    timed = {s.setting: t for s in considered if (t := timer.time(s)) is not None}
    if not timed:
        raise DoesNotFit(f"no setup fits a global batch of {options.global_batch}: it needs gradient accumulation, "
                         "and no micro-batch fits with the gradients accumulation keeps; try a smaller --global-batch")
    ranked, too_slow = _rank((s for s, _ in timed.values()), request)
    return DatasetPlan(replace(plan, request=memory_request, ranked=ranked, too_slow=too_slow), stats, limited,
                       options, {b.setting: b for _, b in timed.values()},
                       tuple(s for s in considered if s.setting not in timed))


# A length limit that loses more of the tokens than this is said as a warning, not as a count among the stats.
MUCH_LOST = 0.10


def _percentiles_text(stats: LengthStats) -> str:
    return ", ".join(f"p{p} {v:,.0f}" for p, v in stats.percentiles.items())


def describe_lengths(stats: LengthStats, limited: LimitedLengths, method: str) -> list[str]:
    """The length distribution and what the limit did, as printed before the plan."""
    lines = [(f"Dataset: {stats.count:,} samples, {stats.total_tokens:,} tokens (mean {stats.mean:,.0f}, "
              f"{_percentiles_text(stats)}, max {stats.max:,}); tokens counted by {method}.")]
    if limited.over:
        done = "truncated to" if limited.too_long == "truncate" else "dropped, as over"
        lines.append(f"{limited.over:,} samples are longer than {limited.limit:,} tokens: {done} {limited.limit:,} "
                     f"({limited.tokens_lost:,} tokens lost; --too-long chooses truncate or drop).")
        lost = limited.tokens_lost / stats.total_tokens
        if lost > MUCH_LOST:
            lines.append(f"warning: the limit loses {lost:.0%} of the dataset's tokens: the plan trains on the rest; "
                         "a longer --seq-len (or --pack-length) keeps more")
    return lines


def describe_batching(choice: SetupBatching, strategy: str) -> list[str]:
    """The recommended setup's batching: shape that sets memory, tokens that set time, batch split."""
    shape = choice.batching
    names = {"pad": "padding to the longest sample", "dynamic": "dynamic padding in random order",
             "group": "group_by_length", "pack": f"packing into rows of {shape.memory_length:,} tokens"}
    row = "packed row" if strategy == "pack" else "sample"
    lines = [(f"Batching: {names[strategy]}. Memory planned at the longest micro-batch: {choice.micro_batch} × "
              f"{shape.memory_length:,} tokens; time at {shape.time_length:,.0f} padded tokens per {row} on average "
              f"({shape.padding_fraction:.0%} padding); {shape.rows:,} {row}s per epoch."),
             (f"Global batch {choice.global_batch} = micro-batch {choice.micro_batch} × gradient accumulation "
              f"{choice.accumulation} × {choice.setting.world_size} GPU(s); {choice.real_tokens_per_step:,.0f} real "
              f"tokens per optimizer step; {choice.rows_per_second:,.2f} {row}s/s.")]
    if choice.saturating is not None and choice.saturating < choice.largest_fitting:
        lines.append(f"Throughput stops improving at micro-batch {choice.saturating} (within 5% of the best; "
                     f"{choice.largest_fitting} fits): a smaller batch costs little time and leaves memory headroom.")
    return lines


def plan_dataset_file(predictor: Predictor, request: PlanRequest, path: Path, options: DatasetOptions,
                      text_field: str | None = None, ids_field: str | None = None, tokenizer: Path | None = None,
                      extra: Iterable[Setting] = (), chars_per_token: float | None = None,
                      ) -> tuple[DatasetPlan, list[str]]:
    """`ftplan plan --dataset`: read the lengths, plan with them, and the lines that explain both."""
    read = load_lengths(path, text_field, ids_field, tokenizer,
                        CHARS_PER_TOKEN if chars_per_token is None else chars_per_token)
    try:
        result = plan_from_lengths(predictor, request, read.lengths, options, extra)
    except DoesNotFit as exc:  # at a long tail's longest sample: say the tail, and the limit that would cut it
        raise DoesNotFit(f"{exc}; {_shorter_limit_hint(read.lengths, options)}") from None
    lines = describe_lengths(result.stats, result.limited, read.method)
    if result.recommended is not None:
        lines += describe_batching(result.recommended, options.strategy)
    return result, lines


def _shorter_limit_hint(lengths: np.ndarray, options: DatasetOptions) -> str:
    """The dataset's length distribution, and what truncating at its 99th percentile would cost when that is
    below the limit already given."""
    stats = LengthStats.of(lengths)
    p99 = round(stats.percentiles[99])
    hint = f"the dataset's samples: {_percentiles_text(stats)}, max {stats.max:,} tokens"
    if options.max_length is not None and p99 >= options.max_length:
        return hint
    lost = apply_limit(lengths, p99, "truncate").tokens_lost / stats.total_tokens
    return f"{hint}; --seq-len {p99} (its p99) truncates the longest 1% and loses {lost:.1%} of its tokens"


def calibration_length(read: DatasetLengths, limit: int | None = None,
                       too_long: str = "truncate") -> tuple[int, list[str]]:
    """`ftplan calibrate --dataset`: the sequence length to calibrate at, and the lines that explain it.

    That is the longest sample left after the limit: a run meets every sample once an epoch and its peak
    is set by the longest micro-batch (the memory length of plan_from_lengths), so trials at this length
    measure in their first step the peak a real run hits when the long samples arrive.
    """
    limited = apply_limit(read.lengths, limit, too_long)
    length = int(limited.lengths.max())
    lines = describe_lengths(LengthStats.of(read.lengths), limited, read.method)
    lines.append(f"Calibrating at the dataset's longest sample{' left after the limit' if limited.over else ''}, "
                 f"{length:,} tokens: the peak a real run meets when its longest micro-batch arrives.")
    return length, lines


def dataset_plan_to_dict(result: DatasetPlan, lines: list[str]) -> dict:
    """The dataset part of `plan --json`: distribution, strategy and the recommended setup's batching."""
    stats, choice = result.stats, result.recommended
    return {
        "lengths": {"count": stats.count, "total_tokens": stats.total_tokens, "mean": stats.mean, "max": stats.max,
                    "percentiles": {f"p{p}": v for p, v in stats.percentiles.items()},
                    "over_limit": result.limited.over, "limit": result.limited.limit,
                    "too_long": result.limited.too_long, "tokens_lost": result.limited.tokens_lost},
        "batching": result.options.strategy,
        "recommended": None if choice is None else {
            "micro_batch": choice.micro_batch, "gradient_accumulation": choice.accumulation,
            "gpus": choice.setting.world_size, "global_batch": choice.global_batch,
            "memory_length": choice.batching.memory_length, "time_length": choice.batching.time_length,
            "rows_per_epoch": choice.batching.rows, "real_tokens_per_step": choice.real_tokens_per_step,
            "largest_fitting_micro_batch": choice.largest_fitting, "saturating_micro_batch": choice.saturating},
        "description": lines,
        "notes": list(result.notes),
    }
