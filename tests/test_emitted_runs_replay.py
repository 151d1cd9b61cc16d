"""Today's models against the H200 rehearsals of emitted configs (benchmarks/gpu/emitted_runs.py replay):
held-out, end-to-end runs of the user's own training script, none of them in the package's records."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.gpu.emitted_runs import H100_GROWN, H100_REHEARSALS, PACKED_REHEARSALS, WHOLE_ROW_REHEARSALS, rehearsals, replayed

RUNS = rehearsals()


def _errors(run: dict, plan: dict) -> tuple[str, float, float, float, bool]:
    """(evidence, allocated error, step-time error, how far beyond the calibrated batches, time within its bound)."""
    memory, time = replayed(plan, run["micro_batch"], run.get("accumulation", 1))
    step = statistics.median(run["step_seconds"][run.get("heavy_steps", 0) + 1:])  # an optimizer step
    return (memory.source, run["peak_allocated_bytes"] / memory.peak_allocated.mean - 1, step / time.mean - 1,
            memory.extrapolation, step <= time.upper)


@pytest.fixture(scope="module")
def calibrated() -> list[tuple[str, float, float, float, bool]]:
    errors = [_errors(run, plan) for run, plan in RUNS if run["status"] == "ok"]
    return [e for e in errors if e[0] != "prior"]


def test_calibrated_predictions_hold_on_the_users_runs(calibrated):
    """Issue 24's targets where calibrations exist: allocated within 3%; step time within 10% (dynamic padding
    included: its masked attention path is priced) up to 2.5 times the calibrated batches, and inside its
    bound beyond (a ladder of 1, 2, 4 stretched to 16 underestimates the slope of a launch-bound start)."""
    assert len(calibrated) >= 30
    assert max(abs(a) for _, a, *_ in calibrated) <= 0.03
    assert max(abs(t) for _, _, t, beyond, _ in calibrated if beyond <= 2.5) <= 0.10
    assert all(inside for *_, inside in calibrated)


def test_every_planned_batch_ran_within_the_predicted_reserved_bound():
    """The first rehearsal of each folder is its planned batch (later ones are probes or grown batches, run to
    find the largest that fits, not promised to)."""
    planned = {}
    for run, plan in RUNS:
        if "@" not in run["emit_dir"]:
            planned.setdefault((run["emit_dir"], plan["headline"], plan["predicted"]["peak_reserved_upper_bytes"]), run)
    assert len(planned) >= 25
    for (name, _, upper), run in planned.items():
        assert run["status"] == "ok" and run["peak_reserved_bytes"] <= upper, name


def _largest_safe_measured() -> dict[str, tuple[dict, int]]:
    """Per folder rehearse grew (2026-12-04): its plan and the largest batch that ran within the plan's usable memory."""
    grown: dict[str, tuple[dict, int]] = {}
    for run, plan in RUNS:
        if plan["rehearsals"] and "@" not in run["emit_dir"] and run["status"] == "ok" \
                and run["peak_reserved_bytes"] <= plan["usable_bytes"]:
            _, largest = grown.get(run["emit_dir"], (plan, 0))
            grown[run["emit_dir"]] = (plan, max(largest, run["micro_batch"]))
    return grown


def test_calibrated_plans_reach_the_largest_batch_that_runs():
    """Issue 24's target, where the setup was calibrated (with or without the padding mask): today's largest safe
    batch ran safely and is at least 90% of the largest that ran, or one batch short of it."""
    from ftplan.core.settings import Setting
    from ftplan.evidence.workspace import Workspace
    from ftplan.planner.search import safe_prediction

    workspace = Workspace.open("H200")
    checked = 0
    for name, (plan, largest) in _largest_safe_measured().items():
        setting = Setting.from_dict(plan["setting"])
        planned = safe_prediction(lambda batch: workspace.predict(setting, batch), workspace.budget())
        if planned.source == "prior":
            continue
        checked += 1
        assert planned.micro_batch <= largest, name
        assert planned.micro_batch >= min(0.9 * largest, largest - 1), (name, planned.micro_batch, largest)
    assert checked >= 7


def test_the_bound_of_a_padding_relative_covers_the_priors_error_on_the_mask_twice():
    """A plan from a calibration without the mask adds PADDING_CHANGE_MARGIN of the prior's attention-path change
    to its bound: at least twice the prior's largest error on the masked excess over the shipped pairs."""
    from benchmarks.gpu.mask_path import excess_error, masked_pairs
    from ftplan.core.paths import calibrations_dir
    from ftplan.models.predictor import PADDING_CHANGE_MARGIN
    from ftplan.store.records import read_records

    pairs = masked_pairs(read_records(sorted(calibrations_dir().glob("*.jsonl"))))
    assert len(pairs) >= 10 and len({masked["model"] for _, masked in pairs}) >= 3
    assert max(abs(excess_error(*pair)) for pair in pairs) * 2 <= PADDING_CHANGE_MARGIN


def test_packed_memory_holds_on_the_users_run_through_trls_sfttrainer():
    """The packed folder run by TRL's SFTTrainer on an H100 at micro-batches 3-12, a new flattened length every
    step and then padded to whole rows, some accumulating: with TRL's fused LM head counted (no fp32 logits) and
    the gradients accumulation keeps, allocated memory is within 3.5% and the measured reserved peak within the
    predicted bound; without the head the prediction was 35% high and the plan's largest batch 7 where 11 ran,
    without the kept gradients 11 x 3 was 4.2% over. (The accumulating runs of a new length every step, lowered
    from an OOM at 13, held the card's whole 78.3 GiB reserved: fragmentation at the wall, which the whole-row
    padding ended; 12 x 2 of it stayed at 75.2.)"""
    runs = [(run, plan, source is WHOLE_ROW_REHEARSALS or run.get("accumulation", 1) == 1)
            for source in (PACKED_REHEARSALS, WHOLE_ROW_REHEARSALS)
            for run, plan in rehearsals(source) if run["status"] == "ok"]
    assert len(runs) >= 10 and any(run.get("accumulation", 1) > 1 for run, _, bounded in runs if bounded)
    for run, plan, bounded in runs:
        memory, _time = replayed(plan, run["micro_batch"], run.get("accumulation", 1))
        assert run["peak_allocated_bytes"] == pytest.approx(memory.peak_allocated.mean, rel=0.035), run["emit_dir"]
        assert not bounded or run["peak_reserved_bytes"] <= memory.peak_reserved.upper, run["emit_dir"]


def test_packed_step_time_holds_once_the_micro_batches_are_padded_to_whole_rows():
    """Issue 24's 10% where packing's shapes repeat (SFTConfig pad_to_multiple_of): the H100's rehearsals at 4-12 rows
    (the flattened kernel's slowdown fitted on the H200's packed_path runs, not on these). A new length every step
    had run 43-120% over: cuDNN rebuilt its plans on the host each step."""
    runs = [(run, plan) for run, plan in rehearsals(WHOLE_ROW_REHEARSALS) if run["status"] == "ok"]
    assert len(runs) >= 4
    for run, plan in runs:
        *_, step_error, _beyond, inside = _errors(run, plan)
        assert abs(step_error) <= 0.10 and inside, (run["emit_dir"], step_error)


def test_h100_plans_from_the_h200s_records_ran_within_their_bounds():
    """Eight folders planned for an H100 from H200 records only, rehearsed there unchanged (2026-12-07): none ran
    out of memory, allocated memory carried across cards within 3.1%, the reserved peak and the step time inside
    their bounds. The mean step time, scaled by the datasheets' throughput (equal on both cards), runs 2-47% fast:
    the H100's 0.70 of the bandwidth slows the step's bandwidth-bound kernels."""
    runs = rehearsals(H100_REHEARSALS)
    assert len(runs) >= 8 and len({plan["setting"]["model"] for _, plan in runs}) >= 5
    for run, plan in runs:
        assert run["status"] == "ok", run["emit_dir"]
        memory, time = replayed(plan, run["micro_batch"], run.get("accumulation", 1))
        assert run["peak_allocated_bytes"] == pytest.approx(memory.peak_allocated.mean, rel=0.031), run["emit_dir"]
        assert run["peak_reserved_bytes"] <= memory.peak_reserved.upper, run["emit_dir"]
        *_, step_error, _beyond, inside = _errors(run, plan)
        assert inside and step_error > -0.05, (run["emit_dir"], step_error)


def test_h100_plans_from_the_h200s_records_reach_the_largest_batch_that_ran_there():
    """The same recipe on a card of the same compute capability keeps the fit's memory bound (it had taken the
    prior's 30% error): the H100's planned batch never exceeds the largest that ran inside its usable memory and is
    within one batch of it (first planned 2 where 4 ran for Qwen3-1.7B full, 4 where 6 ran for Gemma-3-1B LoRA)."""
    from ftplan.core.settings import Setting
    from ftplan.evidence.workspace import Workspace
    from ftplan.planner.search import safe_prediction

    workspace = Workspace.open("H100")
    largest: dict[str, tuple[dict, int]] = {}
    for run, plan in rehearsals(H100_GROWN):
        safe = run["status"] == "ok" and run["peak_reserved_bytes"] <= plan["usable_bytes"]
        _, best = largest.get(run["emit_dir"], (plan, 0))
        largest[run["emit_dir"]] = (plan, max(best, run["micro_batch"] if safe else 0))
    assert len(largest) >= 7
    for name, (plan, ran) in largest.items():
        setting = Setting.from_dict(plan["setting"])
        planned = safe_prediction(lambda batch: workspace.predict(setting, batch), workspace.budget()).micro_batch
        assert ran - 1 <= planned <= ran, (name, planned, ran)
