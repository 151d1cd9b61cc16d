"""What a plan must say before its table: a winner the prior alone chose (with the best measured alternative
and how to measure the winner), records taken with other library versions than the ones installed here, and a
batch so large that the run makes only a few optimizer steps."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

from ftplan.core.hardware import CPU, GpuSpec
from ftplan.core.recipe import calibrate_command
from ftplan.core.versions import installed_versions
from ftplan.models.eta import spoken_duration
from ftplan.models.prediction import (
    SOURCE_EXTRAPOLATED,
    SOURCE_INTERPOLATED,
    SOURCE_MEASURED,
    SOURCE_PRIOR,
    SOURCE_VERIFIED,
)
from ftplan.planner.gpu_counts import KINDS
from ftplan.planner.search import Plan, SetupPlan
from ftplan.store.records import same_device_kind

CALIBRATED_SOURCES = (SOURCE_VERIFIED, SOURCE_MEASURED, SOURCE_INTERPOLATED)
# `ftplan calibrate`'s default: batches 1, 2 and 4, then at most 3 verify trials bisecting to the safe batch.
DEFAULT_TRIAL_BATCHES = (1, 2, 4)
MAX_VERIFY_TRIALS = 3
UNTIMED_STEPS = 2  # calibrate's --warmup-steps default; warm-up may run longer, so the estimate is a floor
DEFAULT_MEASURED_STEPS = 4
COMPARED_PACKAGES = ("torch", "transformers", "peft", "deepspeed", "liger_kernel", "bitsandbytes", "trl")
# Fewer optimizer steps than this in the whole run: the fastest batch is then rarely the one a recipe trains
# well with (a 374-sample dataset was once planned at micro-batch 374, one step an epoch).
FEW_OPTIMIZER_STEPS = 20


def best_calibrated(plan: Plan, training: str | None = None) -> SetupPlan | None:
    """The fastest candidate resting on calibration (verified, measured or interpolated, else extrapolated), of
    this training kind ('full' or 'lora') where given."""
    candidates = [s for s in plan.candidates if training is None or s.training == training]
    for sources in (CALIBRATED_SOURCES, (SOURCE_EXTRAPOLATED,)):
        found = next((s for s in candidates if s.best.source in sources), None)
        if found is not None:
            return found
    return None


def trial_overhead_seconds(records: Iterable[dict]) -> float | None:
    """A trial's time outside its timed steps (start-up, model build, warm-up), the median over the records."""
    overheads = [float(r["trial_seconds"]) - (int(r.get("steps_measured") or DEFAULT_MEASURED_STEPS) + UNTIMED_STEPS)
                 * float(r["seconds_per_step"])
                 for r in records if r.get("status") == "ok" and r.get("trial_seconds") and r.get("seconds_per_step")]
    return max(0.0, statistics.median(overheads)) if overheads else None


def calibration_seconds(setup: SetupPlan, records: list[dict]) -> tuple[float, float] | None:
    """The fewest and most GPU seconds `ftplan calibrate` takes on this setup: the default batches and one to
    three verify trials at the planned batch, each its overhead (this model's trials, else any) plus its steps."""
    same_model = [r for r in records if r.get("model") == setup.setting.model]
    overhead = trial_overhead_seconds(same_model) or trial_overhead_seconds(records)
    if overhead is None:
        return None
    # at the length calibrate runs (the setting's, a dataset's longest), not the ETA's mean padded batch: a
    # long-tailed dataset's 181,361 tokens priced at its mean length said 1-2 GPU-minutes for 72-second steps
    per_sample = setup.best.seconds_per_step.mean / setup.batch  # step time grows about linearly with the batch

    def trial(batch: int) -> float:
        return overhead + (UNTIMED_STEPS + DEFAULT_MEASURED_STEPS) * per_sample * batch

    ladder = sum(trial(b) for b in DEFAULT_TRIAL_BATCHES)
    gpus = setup.setting.gpus  # one node, as calibrate_command runs it
    return (ladder + trial(setup.batch)) * gpus, (ladder + MAX_VERIFY_TRIALS * trial(setup.batch)) * gpus


def prior_winner_lines(plan: Plan, records: list[dict]) -> list[str]:
    """When the recommendation rests on the prior alone: say so, name the best calibrated alternative, and give
    the command (and the GPU time) that would measure the winner."""
    rec = plan.recommended
    if rec is None or rec.best.source != SOURCE_PRIOR:
        return []
    lines = [(f"{rec.label} is recommended from the analytic prior alone: it was never calibrated on "
              f"{plan.request.gpu.name}, so its batch {rec.batch} and ETA {spoken_duration(rec.eta.total_seconds)} "
              "are estimates, not measurements")]
    alternative = best_calibrated(plan, rec.training) or best_calibrated(plan)
    if alternative is not None:
        other_kind = (f"; {KINDS[alternative.training]}, a different training"
                      if alternative.training != rec.training else "")
        lines.append(f"best calibrated alternative: {alternative.label}, batch {alternative.batch} per GPU, ETA "
                     f"{spoken_duration(alternative.eta.total_seconds)} ({alternative.best.source}{other_kind})"
                     + (f"; `--emit-setup '{alternative.label}'` emits it" if alternative is not rec else ""))
    card = plan.request.gpu.name
    seconds = calibration_seconds(rec, [r for r in records if r.get("gpu_name") and same_device_kind(r, card)])
    on_cpu = card == CPU
    took = (f", about {_minutes(*seconds)} {'CPU' if on_cpu else 'GPU'}-minutes ({len(DEFAULT_TRIAL_BATCHES) + 1}-"
            f"{len(DEFAULT_TRIAL_BATCHES) + MAX_VERIFY_TRIALS} trials)" if seconds else "")
    where = (f"one node of {rec.setting.gpus} {plan.request.gpu.name}" if rec.setting.nodes > 1
             else f"the {plan.request.gpu.name}")
    lines.append(f"to measure it, run on {where}: `{calibrate_command(rec.setting, on_cpu)}`{took}"
                 + ("; packing is not calibrated yet, so this measures padded batches" if rec.setting.padding == "packed"
                    else ""))
    return lines


def version_lines(records: Iterable[dict], installed: dict[str, str | None] | None = None) -> list[str]:
    """The packages whose versions in the records differ from those installed here (or among the records)."""
    here = installed_versions() if installed is None else installed
    seen: dict[str, set[str]] = {}
    for record in records:
        versions = record.get("versions")
        for name in COMPARED_PACKAGES:
            value = versions.get(name) if isinstance(versions, dict) else None
            if isinstance(value, str):
                seen.setdefault(name, set()).add(value)
    differing = []
    for name in COMPARED_PACKAGES:
        measured = sorted(seen.get(name, ()))
        mine = here.get(name)
        if len(measured) > 1 or (measured and mine and mine not in measured):
            differing.append(f"{name} {'/'.join(measured)}" + (f" (installed here: {mine})" if mine else ""))
    if not differing:
        return []
    return ["the calibrations were measured with " + ", ".join(differing)
            + ": memory and speed can change between versions; calibrate with the versions you will train with"]


def headline(plan: Plan | None, records: list[dict], card_of: Callable[[dict], GpuSpec | None],
             global_batch: int | None = None) -> list[str]:
    """The lines a plan opens with, for the recommendation's card (global_batch: the user's --global-batch)."""
    if plan is None:
        return []
    on_card = [r for r in records if card_of(r) == plan.request.gpu]
    rec = plan.recommended
    used = [r for r in on_card if rec is not None and r.get("model") == rec.setting.model]
    return [*prior_winner_lines(plan, on_card), *version_lines(used), *few_steps_lines(plan, global_batch)]


def few_steps_lines(plan: Plan, global_batch: int | None = None) -> list[str]:
    """A recommendation whose batch leaves the run only a few optimizer steps: say so, and how to choose the batch
    where the plan chose it (a global batch the user set is theirs to keep)."""
    rec = plan.recommended
    if rec is None or rec.eta.steps >= FEW_OPTIMIZER_STEPS:
        return []
    steps = f"the whole run makes {rec.eta.steps} optimizer step{'s' if rec.eta.steps != 1 else ''}"
    if global_batch is not None:
        return [f"{steps} at your --global-batch {global_batch} (micro-batch {rec.batch} per GPU)"]
    return [(f"{steps} (micro-batch {rec.batch} per GPU): the fastest batch is not always the one your recipe trains "
             "well with; the largest safe batch is an upper limit, and with --dataset a smaller --global-batch N makes "
             "more steps")]


def _minutes(low_seconds: float, high_seconds: float) -> str:
    """'2-5', or '2' where both round alike ('2-2' read as a typo)."""
    low, high = round(low_seconds / 60), round(high_seconds / 60)
    return f"{low}" if low == high else f"{low}-{high}"
