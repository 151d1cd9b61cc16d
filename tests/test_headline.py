"""A plan opens with what its table cannot show: a winner chosen by the prior alone (with the best calibrated
alternative and the exact command that would measure it) and records from other library versions (issue 24 #6, #7)."""

from __future__ import annotations

import pytest

from ftplan.planner import api
from ftplan.cli.commands.calibrate import command as calibrate
from ftplan.core.architecture import run_attention
from ftplan.core.settings import Setting
from ftplan.core.recipe import calibrate_command
from ftplan.planner.headline import trial_overhead_seconds, version_lines


def test_a_prior_only_winner_is_said_first_with_the_best_calibrated_alternative_and_its_calibrate_command():
    result = api.plan("llama-3.2-1b", 1000, "H200", training="full")
    rec = result.recommendation
    assert rec.best.source == "prior"
    first, alternative, command = result.headline[:3]
    assert "analytic prior alone" in first and rec.label in first
    assert "best calibrated alternative" in alternative and any(f"({s})" in alternative for s in ("measured", "interpolated", "extrapolated"))
    assert f"`{calibrate_command(rec.setting)}`" in command and "GPU-minutes" in command
    assert result.to_dict()["warnings"][:3] == list(result.headline[:3])


def test_a_measured_winner_opens_with_no_prior_warning():
    result = api.plan("qwen2.5-0.5b", 1000, "H200", training="full", padding="none")
    assert result.recommendation.best.source != "prior"
    assert not any("prior alone" in line for line in result.headline)


@pytest.mark.parametrize("setting", [
    Setting(model="llama-3-8b", zero_stage=2, offload_optimizer=True, liger=True, lora_rank=16,
            gradient_checkpointing=True, precision="bf16", padding="longest", alloc_conf="expandable_segments:True"),
    Setting(model="llama-3.2-1b", precision="bf16-pure", optimizer="adamw_8bit", attention="eager", seq_len=1024),
    Setting(model="llama-3-8b", lora_rank=8, lora_targets=("q_proj", "v_proj"), quantization="nf4",
            optimizer="paged_adamw_8bit", gpus=2),
])
def test_the_calibrate_command_parses_back_to_the_very_setting(setting):
    argv = calibrate_command(setting).split()[2:]
    params = calibrate.make_context("calibrate", argv).params
    assert params["models"] == (setting.model,) and params["seq_lens"] == (setting.seq_len,)
    assert params["zero_stages"] == (setting.zero_stage,) and params["lora_ranks"] == (setting.lora_rank,)
    assert (params["offload"] == "on") == setting.offload_optimizer and (params["liger"] == "on") == setting.liger
    assert (params["gradient_checkpointing"] == "on") == setting.gradient_checkpointing
    assert tuple(params["lora_targets"]) == setting.lora_targets and params["quantization"] == setting.quantization
    assert (params["precision"] or "bf16") == setting.precision and params["optimizer"] == setting.optimizer
    assert params["paddings"] == (setting.padding,)
    assert run_attention(setting.model, params["attention"]) == setting.attention
    assert params["alloc_conf"] == setting.alloc_conf and params["gpus"] == setting.world_size


def test_a_trial_overhead_is_its_time_outside_the_timed_and_untimed_steps():
    records = [{"status": "ok", "trial_seconds": 20.0, "seconds_per_step": 1.0, "steps_measured": 4},
               {"status": "ok", "trial_seconds": 40.0, "seconds_per_step": 2.0, "steps_measured": 4},
               {"status": "oom", "trial_seconds": 99.0}]
    assert trial_overhead_seconds(records) == pytest.approx((14 + 28) / 2)


def test_versions_that_differ_from_the_installed_ones_or_among_the_records_are_named():
    records = [{"versions": {"torch": "2.11.0", "transformers": "5.17.0"}}]
    assert version_lines(records, {"torch": "2.11.0", "transformers": "5.17.0"}) == []
    assert version_lines(records, {"torch": None, "transformers": None}) == []  # a planning-only install
    [line] = version_lines(records, {"torch": "2.13.0", "transformers": "5.17.0"})
    assert "torch 2.11.0 (installed here: 2.13.0)" in line and "transformers" not in line
    [line] = version_lines([*records, {"versions": {"transformers": "5.20.0"}}], {})
    assert "transformers 5.17.0/5.20.0" in line


def test_a_batch_that_leaves_only_a_few_optimizer_steps_is_said_and_a_long_run_is_not():
    few = api.plan("qwen2.5-0.5b", 300, "H200", training="full", padding="none")
    assert few.recommendation.eta.steps < 20
    assert any(f"makes {few.recommendation.eta.steps} optimizer steps" in line for line in few.headline)
    many = api.plan("qwen2.5-0.5b", 100_000, "H200", training="full", padding="none")
    assert not any("optimizer step" in line for line in many.headline)


def test_the_calibrated_alternative_is_of_the_winners_training_kind_where_one_was_calibrated():
    result = api.plan("gemma-3-1b", 50000, "H200")
    rec = result.recommendation
    assert rec.best.source == "prior" and rec.training == "lora"
    alternative = next(line for line in result.headline if "best calibrated alternative" in line)
    assert "lora" in alternative.split(",")[0] and "different training" not in alternative


def test_a_cpu_plans_calibrate_command_runs_on_the_cpu():
    """It left out --device cpu, so the printed command failed with 'no CUDA GPU is visible here'."""
    result = api.plan("tiny-llama", 1000, "cpu", seq_len=256, precision="fp32")
    command = next(line for line in result.headline if line.startswith("to measure it"))
    assert "--device cpu" in command and "GPU-minutes" not in command
    from ftplan.evidence.workspace import Workspace

    assert "(this host's RAM)" in Workspace.open("cpu").budget().describe()  # it said "catalog", which has no figure
    argv = command.split("`")[1].split()[2:]
    assert calibrate.make_context("calibrate", argv).params["device"] == "cpu"


def test_an_extrapolated_cpu_plan_is_confirmed_by_running_train_py_not_by_rehearse(tmp_path):
    import json

    from tests.helpers import synthetic_records

    setting = Setting("tiny-llama", seq_len=256, precision="fp32", padding="max_length")
    records = [dict(r, device="cpu", gpu_name="cpu") for r in synthetic_records(
        [1, 2, 4], seq_lens=(256,), setting=setting, memory=lambda b, s: (0.6 + 0.04 * b) * 2**30,
        seconds=lambda b, s: 1e-4 * b)]  # faster than the prior's setups
    (tmp_path / "cpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = api.plan("tiny-llama", 1000, "cpu", seq_len=256, precision="fp32", training="full",
                      calibrations=[tmp_path / "cpu.jsonl"])
    assert result.recommendation.best.source == "extrapolated"
    (line,) = [w for w in result.to_dict()["warnings"] if "beyond what was calibrated" in w]
    assert "run the emitted train.py" in line and "rehearse" not in line


def test_a_multi_node_setups_calibrate_command_runs_on_one_node():
    """`--gpus 128` was offered for a 16 x 8 plan, and `--gpus 9` for 3 x 3: calibrate runs on one host."""
    command = calibrate_command(Setting("llama-3.2-1b", gpus=8, nodes=16))
    assert command.endswith("--gpus 8") and "--gpus 128" not in command
    assert "--gpus" not in calibrate_command(Setting("llama-3.2-1b", gpus=1, nodes=3))
