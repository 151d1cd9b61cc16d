"""Steps, time and cost of a whole run."""

import pytest

from ftplan.core.errors import FtplanError
from ftplan.models.eta import estimate_eta, format_duration, steps_to_finish


def test_steps_round_up_so_the_last_partial_batch_is_counted():
    assert steps_to_finish(19692, 1, 8, 1) == 2462  # 19692 / 8 = 2461.5
    assert steps_to_finish(19692, 3, 4, 8) == 1848  # each GPU: 2462 samples, 616 batches (the last partial), × 3


def test_fractional_epochs_count_steps_as_trainer_does():
    assert steps_to_finish(100, 2.5, 33, 1) == 10  # 4 batches an epoch (33, 33, 33, 1) × 2.5; not ceil(250 / 33)
    assert steps_to_finish(100, 1, 10, 1, accumulation=3) == 4  # 10 micro-batches in steps of 3, 3, 3, 1


def test_time_is_steps_times_seconds_and_cost_bills_every_gpu():
    eta = estimate_eta(2.0, 1000, 1, 10, 4, price_per_gpu_hour=3.0)
    assert eta.steps == 25 and eta.total_seconds == 50
    assert eta.cost == pytest.approx(50 / 3600 * 3.0 * 4)


def test_the_upper_eta_and_cost_take_the_step_times_upper_bound():
    eta = estimate_eta(2.0, 1000, 1, 10, 4, price_per_gpu_hour=3.0, upper_seconds_per_step=3.0)
    assert eta.upper_total_seconds == 75 and eta.upper_cost == pytest.approx(eta.cost * 1.5)
    assert estimate_eta(2.0, 1000, 1, 10, 4).upper_total_seconds is None


def test_no_price_means_no_cost():
    assert estimate_eta(1.0, 10, 1, 1, 1).cost is None


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (1, "0:01"), (3599, "1:00"), (3601, "1:01"), (90000, "25:00")])
def test_duration_is_hours_and_minutes_rounded_up(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("args", [(0, 1, 1, 1), (10, 0, 1, 1), (10, 1, 0, 1), (10, 1, 1, 0)])
def test_non_positive_inputs_are_refused(args):
    with pytest.raises(FtplanError, match="must be positive"):
        steps_to_finish(*args)


def test_eta_command_reports_steps_time_cost_and_the_memory_verdict(tmp_path, capsys, monkeypatch):
    import json

    from tests.helpers import run_ftplan, write_external_jsonl

    external = write_external_jsonl(tmp_path / "external.jsonl")
    base = ["eta", "--model", "qwen1.5-0.5b", "--precision", "fp16", "--zero-stage", "3", "--dataset-size", 19692,
            "--gpu", "RTX-3090", "--price-per-hour", 0.5, "--calibrations", external, "--padding", "none", "--json"]
    code, out, err = run_ftplan([*base, "--batch-size", 2], capsys, monkeypatch)
    assert code == 0, err
    fits = json.loads(out)
    assert fits["fits"] and fits["eta"]["steps"] == 9846 and fits["prediction"]["source"] == "measured"
    assert fits["eta"]["cost"] == pytest.approx(fits["eta"]["hours"] * 0.5)
    upper = fits["prediction"]["seconds_per_step"]["upper"]
    assert fits["eta"]["total_seconds_upper"] == pytest.approx(fits["eta"]["steps"] * upper)
    assert fits["eta"]["total_seconds_upper"] > fits["eta"]["total_seconds"]
    code, out, err = run_ftplan([*base, "--batch-size", 3], capsys, monkeypatch)  # ran out of memory when measured
    assert code == 3, err  # "does not fit"
    assert not json.loads(out)["fits"]
    code, out, err = run_ftplan([a for a in base if a != "--json"] + ["--batch-size", 3], capsys, monkeypatch)
    assert "NOT safe" in out and "total time:" in out and "steps: 6,564" in out


def test_an_accumulated_step_pays_the_optimizer_step_and_ddps_all_reduce_once():
    """The Trainer skips DDP's all-reduce (no_sync) on micro-steps before the last, and steps the optimizer once: a
    4-micro-step update of 4 GPUs costs 4 micro-steps of compute plus one update, not 4 of each (the ETA had charged
    the all-reduce and the optimizer step on every micro-step). DeepSpeed reduces on every micro-step."""
    from ftplan.core.settings import Setting
    from ftplan.evidence.workspace import Workspace

    workspace = Workspace.open("H100")
    ddp = workspace.predict(Setting("qwen2.5-0.5b", gpus=4, liger=True), 16)
    alone = workspace.predict(Setting("qwen2.5-0.5b", liger=True), 16)
    assert ddp.update_seconds > alone.update_seconds > 0  # the all-reduce on top of the optimizer step
    assert ddp.step_seconds(4) == pytest.approx(4 * ddp.seconds_per_step.mean - 3 * ddp.update_seconds)
    assert ddp.step_seconds(1) == ddp.seconds_per_step.mean
    offload = workspace.predict(Setting("qwen2.5-0.5b", zero_stage=2, offload_optimizer=True), 16)
    assert offload.step_seconds(4) < 4 * offload.seconds_per_step.mean - 2 * offload.update_seconds  # CPU Adam, once
