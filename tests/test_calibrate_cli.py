"""`ftplan calibrate` through click: the ladder, isolation of failing trials, resume, and bad input."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from ftplan.store.records import RecordWarning, read_records
from ftplan.models.fitset import FitSet
from ftplan.cli.main import Dependencies, cli
from tests.helpers import planned_batch_fits

FAKE_TRIAL = (sys.executable, str(Path(__file__).parent / "fixtures" / "fake_trial.py"))


def calibrate(out: Path, *args: str, seq_len: int = 64, trial_command=FAKE_TRIAL):
    """Calibrate the tiny model on the CPU; trial_command None runs the real trial."""
    return CliRunner().invoke(cli, ["calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", str(seq_len),
                                    "--machine", "test-box", "--out", str(out), *args], terminal_width=200,
                              obj=Dependencies(trial_command))


def trials(out: Path) -> list[tuple[int, int, str]]:
    return [(r["seq_len"], r["micro_batch"], r["status"]) for r in read_records([out])]


def test_the_ladder_doubles_to_the_first_oom_then_bisects(fake_trial, tmp_path):
    fake_trial(oom_above=5)
    result = calibrate(tmp_path / "c.jsonl", "--max-batch", "64")
    assert result.exit_code == 0, result.output
    assert [(b, s) for _, b, s in trials(tmp_path / "c.jsonl")] == [
        (1, "ok"), (2, "ok"), (4, "ok"), (8, "oom"), (6, "oom"), (5, "ok")]
    assert "largest fitting batch is 5 (batch 6 ran out of memory)" in result.output


def test_records_carry_the_setting_the_measurements_and_their_provenance(fake_trial, tmp_path):
    fake_trial()
    calibrate(tmp_path / "c.jsonl", "--batch-sizes", "3", "--gpus", "2", "--lora-rank", "8")
    (record,) = read_records([tmp_path / "c.jsonl"])
    assert record["lora_rank"] == 8 and record["gpus"] == record["gpu_count"] == 2
    assert record["machine_id"] == "test-box" and record["source"] == "calibrate" and record["device"] == "cpu"
    assert record["peak_allocated_bytes_per_gpu"] == [130_000_000, 131_000_000]
    assert record["peak_allocated_bytes"] == 131_000_000
    assert record["step_seconds"] == [0.2, 0.3, 0.2]  # per step, the slower of the two ranks
    assert record["seconds_per_step"] == 0.2
    assert record["tokens_per_second"] == pytest.approx(3 * 64 * 2 / 0.2)
    assert record["command"].startswith("ftplan calibrate --model tiny-llama --device cpu")


def test_a_crashing_trial_stops_only_its_own_setting(fake_trial, tmp_path):
    fake_trial(fail={"rank": 0, "mode": "raise", "batch": 2, "seq_len": 64})
    result = calibrate(tmp_path / "c.jsonl", "--seq-len", "128", "--max-batch", "4")
    assert result.exit_code == 0, result.output
    assert trials(tmp_path / "c.jsonl") == [(64, 1, "ok"), (64, 2, "error"),
                                            (128, 1, "ok"), (128, 2, "ok"), (128, 4, "ok")]
    error = read_records([tmp_path / "c.jsonl"])[1]
    assert error["message"].endswith("RuntimeError: fake rank failure")
    assert "batch 2 failed with an error (not an OOM)" in result.output


def test_rerunning_the_recorded_command_runs_nothing_again_but_retries_errors(fake_trial, tmp_path):
    out = tmp_path / "c.jsonl"
    fake_trial(fail={"rank": 0, "mode": "exit", "batch": 4})
    calibrate(out, "--max-batch", "8")
    fake_trial()
    command = read_records([out])[0]["command"]
    result = CliRunner().invoke(cli, shlex.split(command)[1:], obj=Dependencies(FAKE_TRIAL))
    assert result.exit_code == 0, result.output
    assert [(b, s) for _, b, s in trials(out)] == [(1, "ok"), (2, "ok"), (4, "error"), (4, "ok"), (8, "ok")]


@pytest.mark.parametrize("args, message", [
    (["--offload", "on"], "--offload on needs DeepSpeed ZeRO"),
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--lora-rank", "8", "--lora-targets", "q_proj,nonsense"], "unknown LoRA target module(s) ['nonsense']"),
    (["--lora-targets", "q_proj"], "--lora-targets needs a --lora-rank above 0"),
    (["--out", "/proc/no-such-dir/c.jsonl"], "cannot write calibration file /proc/no-such-dir/c.jsonl"),
])
def test_invalid_combinations_are_one_line_errors(fake_trial, tmp_path, args, message):
    result = calibrate(tmp_path / "c.jsonl", *args)
    assert isinstance(result.exception, FtplanError)
    assert message in str(result.exception) and "\n" not in str(result.exception)
    assert not (tmp_path / "c.jsonl").exists()


def test_offload_both_pairs_offload_only_with_zero_stages(fake_trial, tmp_path):
    fake_trial()
    calibrate(tmp_path / "c.jsonl", "--offload", "both", "--zero-stage", "0", "--zero-stage", "2", "--batch-sizes", "1")
    combos = {(r["zero_stage"], r["offload_optimizer"]) for r in read_records([tmp_path / "c.jsonl"])}
    assert combos == {(0, False), (2, False), (2, True)}


def test_bad_batch_sizes_are_rejected_before_anything_runs(fake_trial, tmp_path):
    result = calibrate(tmp_path / "c.jsonl", "--batch-sizes", "1,two")
    assert result.exit_code == 2 and "expected comma-separated integers" in result.output


def test_a_line_torn_by_a_kill_mid_write_is_skipped_and_the_next_record_starts_on_its_own_line(fake_trial, tmp_path):
    out = tmp_path / "c.jsonl"
    fake_trial()
    calibrate(out, "--batch-sizes", "1")
    whole = out.read_text()
    out.write_text(whole + whole[: len(whole) // 2])  # what a writer killed inside write() leaves
    calibrate(out, "--batch-sizes", "1,2")
    with pytest.warns(RecordWarning, match=r"c\.jsonl:2: corrupt or truncated record skipped"):
        assert [b for _, b, _ in trials(out)] == [1, 2]


def test_a_real_cpu_calibration_of_the_tiny_model_fits_and_plans_within_its_budget(tmp_path, one_torch_thread):
    """The whole product on a CPU: calibrate, fit, predict and plan through the CLI, one real calibration.

    Sequence length 512, not 64: at 64 tokens a sample adds a few MB, less than the noise of a process's RSS.
    """
    out = tmp_path / "c.jsonl"
    result = calibrate(out, "--batch-sizes", "1,2,4", "--precision", "fp32", "--steps", "2", "--warmup-steps", "1",
                       "--timeout", "120", seq_len=512, trial_command=None)
    assert result.exit_code == 0, result.output
    records = read_records([out])
    assert [(r["micro_batch"], r["status"]) for r in records] == [(1, "ok"), (2, "ok"), (4, "ok")], \
        [r["message"] for r in records]
    peaks = [r["peak_allocated_bytes"] for r in records]
    assert peaks == sorted(set(peaks)) and 50 * 2**20 < peaks[0] < 8 * 2**30  # grows with batch, plausible size
    arch = load_architecture("tiny-llama")
    for r in records:
        assert r["params_total"] == r["params_trainable"] == arch.params_total
        assert r["steps_measured"] == 2 and 0 < r["seconds_per_step"] < 60
        assert r["tokens_per_second"] == pytest.approx(r["micro_batch"] * 512 / r["seconds_per_step"])
        assert r["gpu_name"] == "cpu" and r["versions"]["torch"] and r["arch_hash"] == arch.hash

    fits = tmp_path / "fits.json"
    fitted = CliRunner().invoke(cli, ["fit", str(out), "--out", str(fits)], terminal_width=200)
    assert fitted.exit_code == 0, fitted.output
    (fit,) = FitSet.load(fits).fits
    assert fit.r2["memory"] > 0.9, fit.r2  # memory is close to linear in batch

    # A "card" with room for about batch 2: the plan must pick a batch whose upper bound fits the budget.
    specs = tmp_path / "gpus.csv"
    room_gib = (peaks[1] + (peaks[2] - peaks[1]) / 4) / 2**30
    specs.write_text(f"name,memory_gib,bf16_dense_tflops,memory_bandwidth_gbs\ncpu,{room_gib / 0.98},1,10\n")
    common = ["--model", "tiny-llama", "--seq-len", "512", "--gpu", "cpu", "--gpu-specs", str(specs),
              "--calibrations", str(out)]
    planned = CliRunner().invoke(cli, ["plan", *common, "--dataset-size", "100", "--full", "--json"])
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.stdout)
    assert all(planned_batch_fits(row["prediction"], plan) for row in plan["ranked"])
    (calibrated,) = [row for row in plan["ranked"] if row["setting"]["precision"] == "fp32"]  # the measured one
    assert calibrated["prediction"]["source"] in ("measured", "interpolated")
    assert 1 <= calibrated["largest_safe_batch"] <= 2

    predicted = CliRunner().invoke(cli, ["predict", *common, "--precision", "fp32", "--batch-size", "4", "--json"])
    prediction = json.loads(predicted.stdout)
    assert not prediction["fits_in_memory"] and predicted.exit_code == 3, predicted.output  # beyond the card's room
    assert prediction["peak_allocated_gib"] == pytest.approx(peaks[2] / 2**30, rel=0.05)
    assert prediction["seconds_per_step"] > 0 and prediction["peak_reserved_gib"] >= prediction["peak_allocated_gib"]


def test_records_of_another_machine_or_another_version_of_the_config_do_not_count_as_done(fake_trial, tmp_path):
    out, config = tmp_path / "c.jsonl", tmp_path / "tiny.json"
    config.write_text(json.dumps(load_architecture("tiny-llama").config))
    fake_trial()
    calibrate(out, "--model", str(config), "--batch-sizes", "1")
    calibrate(out, "--model", str(config), "--batch-sizes", "1", "--machine", "other-box")
    config.write_text(json.dumps({**load_architecture("tiny-llama").config, "num_hidden_layers": 3}))
    calibrate(out, "--model", str(config), "--batch-sizes", "1")
    tiny = [r for r in read_records([out]) if r["model"] == str(config)]
    assert [r["machine_id"] for r in tiny] == ["test-box", "other-box", "test-box"]
    assert len({r["arch_hash"] for r in tiny}) == 2


def test_default_cuda_calibration_runs_three_small_batches_then_verifies_the_planned_one(tmp_path):
    """Three points, then the batch the planner would recommend; an OOM there bisects down (fake trial:
    out of memory above batch 300, memory linear in batch, a 10 GB card)."""
    fixture = Path(__file__).parent / "fixtures" / "ftplan_with_fake_trial.py"
    out = tmp_path / "c.jsonl"
    env = {**os.environ, "FAKE_TRIAL": json.dumps({"oom_above": 300})}
    done = subprocess.run([sys.executable, str(fixture), "calibrate", "--model", "tiny-llama", "--device", "cuda",
                           "--seq-len", "64", "--machine", "box", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    batches = [(r["micro_batch"], r["status"]) for r in read_records([out])]
    assert batches[:3] == [(1, "ok"), (2, "ok"), (4, "ok")]
    verified = batches[3:]
    assert 1 <= len(verified) <= 3, batches
    assert verified[0][0] > 4  # the planned batch, far beyond the three points
    if verified[0][1] == "oom":  # then bisect towards the largest that ran
        assert verified[1][0] == (4 + verified[0][0]) // 2


def test_a_ladder_whose_step_time_falls_is_warned_about_when_measured(fake_trial, tmp_path):
    """A busy host's ladder (2.7, 1.5, 1.3 s at batches 1, 2, 4) was accepted silently; only a later plan warned,
    and nothing said how to measure again (a re-run resumes, so it runs nothing)."""
    fake_trial(busy_host=True)
    result = calibrate(tmp_path / "c.jsonl", "--batch-sizes", "1,2,4", "--no-verify")
    assert result.exit_code == 0, result.output
    assert "tiny-llama ddp full s64 fp32 padded: step time fell as the batch grew (batch 1: 1 s, batch 2: 0.5 s" \
        in result.output and f"delete these records from {tmp_path / 'c.jsonl'}" in result.output
    fake_trial()
    quiet = calibrate(tmp_path / "d.jsonl", "--batch-sizes", "1,2,4", "--no-verify")
    assert quiet.exit_code == 0 and "step time fell" not in quiet.output


def test_a_trial_whose_steps_were_far_apart_is_warned_about_when_measured(tmp_path):
    """A busy CPU's batch-4 steps took 0.25, 1.17, 3.29 and 3.36 s, recorded ok without a word; a plan then
    extrapolated that trial to 546 s a step at batch 521."""
    from ftplan.cli.commands.calibrate import noisy_ladders
    from ftplan.core.settings import Setting

    base = {**Setting("tiny-llama", seq_len=64, precision="fp32").to_dict(), "status": "ok", "setting_key": "k"}
    busy = {**base, "micro_batch": 4, "seconds_per_step": 2.2, "step_seconds": [0.252, 1.173, 3.285, 3.36]}
    quiet = {**base, "micro_batch": 2, "seconds_per_step": 0.3, "step_seconds": [0.29, 0.30, 0.31, 0.30]}
    (line,) = noisy_ladders([quiet, busy], tmp_path / "c.jsonl")
    assert "batch 4: its steps took 0.25 to 3.36 s, so the host was busy" in line and "delete these records" in line
