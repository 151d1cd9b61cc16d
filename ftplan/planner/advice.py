"""Why the recommended setup wins, and how far to trust it, in sentences a user can act on.

Each reason compares the recommendation with its twin that differs in one switch (optimizer offload,
Liger, gradient checkpointing), so the user sees what that switch costs or buys on this run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftplan.core.architecture import cached_architecture, load_architecture
from ftplan.core.hardware import CPU
from ftplan.core.settings import PADDINGS, Setting
from ftplan.core.units import GIB
from ftplan.models.eta import spoken_duration
from ftplan.models.host_memory import host_bytes_per_node
from ftplan.models.prediction import (
    SOURCE_EXTRAPOLATED,
    SOURCE_PRIOR,
)
from ftplan.planner.search import NEAR_TIE, Plan, PlanRequest, SetupPlan


@dataclass(frozen=True)
class Switch:
    name: str
    field: str
    why: str
    values: tuple = (False, True)
    states: tuple[str, str] = ("off", "on")


SWITCHES = (
    Switch("optimizer offload", "offload_optimizer",
           "offload keeps optimizer states and the Adam step on the CPU: it frees GPU memory but pays "
           "PCIe transfers and CPU compute on every step"),
    Switch("Liger", "liger",
           "Liger's fused linear cross-entropy never materialises the logits, so per-sample memory falls "
           "and its gain grows with batch size"),
    Switch("gradient checkpointing", "gradient_checkpointing",
           "checkpointing recomputes the forward pass during backward: about a third more compute per "
           "step for far less activation memory"),
    Switch("precision", "precision",
           "pure bf16 (the model loaded in bf16) keeps weights, gradients and AdamW moments in bf16, 8 bytes "
           "a parameter instead of 16, and no fp32 master copy: updates smaller than bf16 can hold are lost, "
           "which low learning rates and long runs feel most",
           values=("bf16", "bf16-pure"), states=("bf16 mixed precision", "pure bf16")),
)


def _twin(plan: Plan, setup: SetupPlan, switch: Switch) -> SetupPlan | None:
    """The best-ranked setup equal to `setup` except for this switch (any ZeRO stage when it is offload)."""
    if getattr(setup.setting, switch.field) not in switch.values:
        return None
    flipped = switch.values[1 - switch.values.index(getattr(setup.setting, switch.field))]
    ignore = {switch.field} | ({"zero_stage"} if switch.field == "offload_optimizer" else set())
    mine = {k: v for k, v in setup.setting.to_dict().items() if k not in ignore}
    for candidate in [*plan.ranked, *plan.too_slow, *plan.unfit]:
        theirs = candidate.setting.to_dict()
        if theirs[switch.field] == flipped and all(theirs[k] == v for k, v in mine.items()):
            return candidate
    return None


def _compare(plan: Plan, rec: SetupPlan, switch: Switch) -> str | None:
    twin = _twin(plan, rec, switch)
    if twin is None:
        return None
    index = switch.values.index(getattr(rec.setting, switch.field))
    state, other_state = switch.states[index], switch.states[1 - index]
    usable = plan.request.budget.usable_bytes / GIB
    if twin.host_short:
        return f"{switch.name} {state}: without that, {host_shortfall(twin, plan.request)}. {switch.why}."
    if not twin.fits:
        need = twin.at_batch_one.peak_reserved.upper / GIB
        # the twin is named: another family (LoRA beside full, say) may well fit without this switch
        return (f"{switch.name} {state}: without that, {twin.label} does not fit even at batch 1 "
                f"({need:.1f} GiB > {usable:.1f} GiB usable). {switch.why}.")
    # the ETA's step time, as the table prints it: with a dataset it is timed at the mean padded length,
    # while the prediction (`best`) sits at the longest batch's length, which sets memory
    ours, theirs = rec.eta.seconds_per_step, twin.eta.seconds_per_step
    if twin.eta.total_seconds <= rec.eta.total_seconds * (1 + NEAR_TIE):
        verdict = f"within {NEAR_TIE:.0%}, it makes no real difference on this run"
    elif rec.batch > twin.batch and ours >= theirs:
        verdict = "the larger batch outweighs the slower step"
    elif rec.batch <= twin.batch and ours < theirs:
        verdict = "the faster step outweighs the other's batch"
    else:
        verdict = "fewer steps and time per sample decide it"
    # the twin is named: the compact table shows each family's best, which can be another LoRA rank or ZeRO stage
    return (f"{switch.name} {state}: batch {rec.batch} at {ours:.2f} s/step, "
            f"{spoken_duration(rec.eta.total_seconds)} in total, against {twin.label} ({switch.name} "
            f"{other_state}): batch {twin.batch} at {theirs:.2f} s/step, "
            f"{spoken_duration(twin.eta.total_seconds)}; {verdict}. {switch.why}.")


def _training_note(plan: Plan, rec: SetupPlan) -> str:
    """Full fine-tuning and LoRA are different trainings: say what LoRA trades, and name the best of the other."""
    arch = load_architecture(plan.request.base.model)
    other_kind = "full" if rec.training == "lora" else "lora"
    other = plan.best_of(other_kind)  # the choice best_by_training shows, not merely the fastest of the kind
    if rec.training == "lora":
        trainable = arch.lora_params(rec.setting.lora_rank, rec.setting.lora_targets)
        note = (f"LoRA r={rec.setting.lora_rank} trains {trainable:,} of {arch.params_total:,} parameters "
                f"({trainable / arch.params_total:.2%}): less memory and traffic, but it is a different training "
                "(low-rank adapters, frozen base weights) that can fall short of full fine-tuning on large "
                "domain shifts.")
    else:
        note = f"Full fine-tuning updates all {arch.params_total:,} parameters."
    if other is not None:
        flag = "--full" if other_kind == "full" else "--lora"
        note += (f" Best {'full fine-tuning' if other_kind == 'full' else 'LoRA'} setup: {other.label}, "
                 f"batch {other.batch}, {spoken_duration(other.eta.total_seconds)}"
                 + (f", needing at least {other.host_bytes / GIB:,.1f} GiB of host RAM per node for its offload"
                    if other.host_bytes else "")
                 + f" ({flag} to recommend among those).")
    return note


def family(setup: SetupPlan) -> tuple:
    """What a user chooses between (full or LoRA, offload, Liger, checkpointing, precision); the ZeRO stage
    without offload and the LoRA rank only tune a family, so the compact table shows each family's best."""
    s = setup.setting
    return setup.training, s.offload_optimizer, s.liger, s.gradient_checkpointing, s.precision


def first_of_each_family(setups: list[SetupPlan]) -> list[SetupPlan]:
    """The first setup of each family, in the order given."""
    first: dict[tuple, SetupPlan] = {}
    for setup in setups:
        first.setdefault(family(setup), setup)
    return [s for s in setups if any(s is f for f in first.values())]


def family_best(plan: Plan) -> list[SetupPlan]:
    """The best-ranked setup of each family, the recommendation in place of its family's first, in rank order."""
    rec = plan.recommended
    ranked = plan.ranked if rec is None else [s for s in plan.ranked if s is rec or family(s) != family(rec)]
    return first_of_each_family(ranked)


@dataclass(frozen=True)
class TrainingOption:
    """The best setup of one kind of training, and what choosing it trades against the other kind."""

    kind: str
    setup: SetupPlan
    trainable_params: int
    trade: str


def training_options(plan: Plan) -> list[TrainingOption]:
    """Best full fine-tuning and best LoRA setup (those that fit), full first, each with its trade-off.

    Full fine-tuning and LoRA are different trainings, not faster and slower ways to one result: when the
    user names neither, both are shown and the choice is theirs.
    """
    arch = load_architecture(plan.request.base.model)
    full, lora = plan.best_of("full"), plan.best_of("lora")
    options = []
    if full is not None:
        trade = (f"all {arch.params_total:,} parameters learn: the most room for a large shift in domain or task; "
                 f"gradients and optimizer states for every weight ({_vs(full, lora, 'LoRA')})")
        options.append(TrainingOption("full", full, arch.params_total, trade))
    if lora is not None:
        trainable = arch.lora_params(lora.setting.lora_rank, lora.setting.lora_targets)
        trade = (f"{trainable:,} adapter parameters ({trainable / arch.params_total:.2%}) learn on a frozen base: "
                 f"less memory and traffic, small checkpoints, but low-rank updates can fall short of full "
                 f"fine-tuning on a large domain shift ({_vs(lora, full, 'full fine-tuning')})")
        options.append(TrainingOption("lora", lora, trainable, trade))
    return options


def _vs(setup: SetupPlan, other: SetupPlan | None, other_name: str) -> str:
    """Time against the other kind's best, in the words of the trade-off sentence."""
    if other is None:
        return f"{other_name} does not fit"
    ratio = setup.eta.total_seconds / other.eta.total_seconds
    if abs(ratio - 1) <= NEAR_TIE:
        return f"about {other_name}'s time"
    return f"{ratio:.1f}× {other_name}'s time" if ratio > 1 else f"{1 / ratio:.1f}× faster than {other_name}"


def reasons(plan: Plan, training_note: bool = True) -> list[str]:
    """Why the recommendation wins: its headline, one comparison per switch, and (unless training_note is
    False, when both kinds are shown side by side) what LoRA trades."""
    rec = plan.recommended
    if rec is None:
        return []
    metric = "cheapest" if plan.request.by == "cost" else "fastest"
    kind = {"any": "", "full": " full fine-tuning", "lora": " LoRA"}[plan.request.training]
    fastest = plan.fastest
    better_measured = fastest is not rec and rec.best.source != fastest.best.source
    why = "better-measured" if better_measured else "simpler (no DeepSpeed or CPU offload)"
    standing = (f"the {metric}{kind} setup that fits" if fastest is rec
                else f"the {'best-measured' if better_measured else 'simplest'}{kind} setup within {NEAR_TIE:.0%} "
                     f"of the {metric}")
    lines = [f"{rec.label} is {standing}: batch {rec.batch} per GPU, "
             f"{rec.eta.steps:,} steps × {rec.eta.seconds_per_step:.2f} s = {spoken_duration(rec.eta.total_seconds)}"
             + (f", {rec.eta.cost:,.2f} in total" if rec.eta.cost is not None else "") + "."]
    if fastest is not rec:
        lines.append(f"{fastest.label} is predicted {spoken_duration(fastest.eta.total_seconds)} "
                     f"({fastest.best.source}), within the time model's {NEAR_TIE:.0%} uncertainty of this "
                     f"({rec.best.source}): the {why} setup is recommended.")
    lines += [line for switch in SWITCHES if (line := _compare(plan, rec, switch))]
    if training_note:
        lines.append(_training_note(plan, rec))
    return lines


def warnings_for(plan: Plan) -> list[str]:
    """How far to trust the recommendation: extrapolation, offload's host RAM, or nothing to recommend (a winner
    from the prior alone opens the plan instead: planner/headline.py)."""
    rec = plan.recommended
    if rec is None:
        limit = plan.request.max_hours
        kind = {"any": "", "full": "full fine-tuning ", "lora": "LoRA "}[plan.request.training]
        why = f" within {limit:g} h" if limit is not None else ""
        return [f"no {kind}setup fits and finishes{why}; each one left out is listed with why (over --max-hours, "
                "cannot fit)"]
    found = []
    if rec.best.source == SOURCE_EXTRAPOLATED:
        confirm = ("run the emitted train.py for a few steps at that batch" if plan.request.gpu.name == CPU else
                   "`ftplan rehearse` runs the emitted folder at that batch (`ftplan calibrate` verifies the "
                   "recommended batch too)")
        found.append(f"{rec.label} at batch {rec.batch} is {rec.best.evidence} beyond what was calibrated: "
                     f"its safety bound is widened for that distance; confirm it before committing: {confirm}")
    if rec.setting.offload_optimizer:
        have = plan.request.host_memory_gib
        found.append(f"{rec.label} offloads the optimizer: each node needs at least {rec.host_bytes / GIB:,.1f} GiB "
                     "of host RAM for offloaded optimizer states, master weights and gradients, plus the process "
                     "itself (not modelled); "
                     + ("pass --host-memory-gib to check your hosts" if have is None
                        else f"your hosts have {have:g} GiB"))
    return found + _beyond_context(rec.setting)


def _beyond_context(setting: Setting) -> list[str]:
    """A planned length past the model's trained context: it plans, but the model was not trained to attend that
    far, and with --dataset the length is the longest sample's unless --seq-len caps it."""
    context = cached_architecture(setting.model).config.get("max_position_embeddings")
    if not context or setting.seq_len <= context:
        return []
    cap = "--pack-length (a packed row's length)" if setting.padding == "packed" else "--seq-len (with --dataset too)"
    return [f"the plan's sequence length, {setting.seq_len:,} tokens, is past {setting.model}'s context of "
            f"{context:,} (max_position_embeddings): its memory and time are planned, but the model was not trained "
            f"that long; cap it with {cap} or use a long-context variant"]


def notes_for(plan: Plan) -> list[str]:
    """Where the recommendation's numbers come from (the predictor's notes), minus what a warning already says."""
    rec = plan.recommended
    if rec is None:
        return []
    return [note for note in rec.best.notes
            if not (rec.best.source == SOURCE_EXTRAPOLATED and note.endswith(": extrapolated"))]


# Host memory of the machine that ran the shipped H200 calibrations (data/calibrations/README.md).
SHIPPED_CALIBRATION_HOST_GIB = 125


def host_shortfall(setup: SetupPlan, request: PlanRequest) -> str:
    """Why an offload setup cannot run on the user's hosts, in the words the lists and reasons share."""
    return (f"needs {setup.host_bytes / GIB:,.1f} GiB of host RAM per node for offloaded optimizer states; "
            f"you have {request.host_memory_gib:g}")


def failed_like(setting: Setting, failed: dict[Setting, str]) -> str | None:
    """Why the calibration trial of this setting (on one GPU) failed, or None when it did not. A trial that
    failed (not of OOM: an error, a kill) fails whatever the padding, so an unpadded trial's failure is the
    padded row's too."""
    one_gpu = setting.with_(gpus=1, nodes=1)
    return next((failed[s] for s in (one_gpu, *(one_gpu.with_(padding=p) for p in PADDINGS)) if s in failed), None)


def source_label(setup: SetupPlan, failed: dict[Setting, str]) -> str:
    """How a row's numbers were obtained, in words a user cannot misread as a measurement."""
    if failed_like(setup.setting, failed):
        return "prior: trial failed"
    prediction = setup.best or setup.at_batch_one
    return "prior, unmeasured" if prediction.source == SOURCE_PRIOR else prediction.evidence


def unmeasured_notes(plan: Plan, failed: dict[Setting, str]) -> list[str]:
    """Why some rows rest on the prior: a calibration trial that failed, and what offload asks of the host."""
    notes = []
    marked = [s for s in plan.ranked if failed_like(s.setting, failed)]
    for setting, why in failed.items():
        if setting.model != plan.request.base.model or setting.seq_len != plan.request.base.seq_len:
            continue
        line = (f"{setting.label()} was calibrated but its trial failed ({why}); "
                + ("rows marked 'trial failed' are the prior's guess for it" if marked else
                   "what the plan says of it is the prior's guess"))
        if setting.offload_optimizer:
            need = host_bytes_per_node(cached_architecture(setting.model), setting) / GIB
            line += (f". Its CPU offload pins at least {need:,.1f} GiB of host RAM on one GPU "
                     "(fp32 master weights, fp32 gradients, Adam moments and a half-precision buffer, "
                     "models/host_memory.py)")
            if "host out of memory" in why:
                line += (f", more than the host had (the shipped H200 calibration host has "
                         f"{SHIPPED_CALIBRATION_HOST_GIB} GiB and its OOM killer ended the 8B offload trial)")
            line += (". Offload rows show the host RAM they need per node; --host-memory-gib leaves out those "
                     "your hosts cannot hold")
        notes.append(line + ".")
    return notes
