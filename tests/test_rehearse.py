"""`ftplan rehearse` and what it rests on: the folder's plan.json, the heaviest-first row order, the lowered
batch that keeps the global batch, and rewriting only what ftplan wrote. The GPU run itself is measured by
benchmarks/gpu/emitted_runs.py; here the parts that decide what runs and what is written."""

from __future__ import annotations

import json

import pytest

from ftplan.calibration.rehearsal import HEAVY_STEPS, rehearsal_lengths
from ftplan.core.errors import FtplanError
from ftplan.planner.emit import PLAN_JSON, README, TRAINING_ARGS, TRAINING_ARGS_PY, rewrite_rehearsed
from ftplan.planner.rehearse import lowered, read_plan, rehearsal_seconds
from tests.helpers import run_ftplan

PLAN = ["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset-size", "1000", "--full"]


def emit(tmp_path, capsys, monkeypatch, *args):
    folder = tmp_path / "configs"
    code, out, err = run_ftplan([*PLAN, *args, "--emit", folder], capsys, monkeypatch)
    assert code == 0, err
    return folder


def test_rows_put_the_longest_samples_in_the_first_steps_then_a_random_mix():
    lengths = list(range(1, 501))
    plan = {"micro_batch": 4, "accumulation": 2, "length": 500, "lengths": lengths}
    rows, heavy = rehearsal_lengths(plan, steps=10)
    assert heavy == HEAVY_STEPS and len(rows) == 4 * 2 * 10
    assert rows[:8 * HEAVY_STEPS] == sorted(lengths, reverse=True)[:8 * HEAVY_STEPS]
    assert set(rows[8 * HEAVY_STEPS:]) <= set(lengths) and rows[8 * HEAVY_STEPS:] != sorted(rows[8 * HEAVY_STEPS:])


def test_rows_without_a_dataset_are_shorter_than_the_planned_length_so_every_batch_is_padded():
    rows, heavy = rehearsal_lengths({"micro_batch": 3, "accumulation": 1, "length": 2048, "lengths": None}, steps=5)
    assert heavy == 0 and len(rows) == 15 and all(1024 <= n < 2048 for n in rows)


@pytest.mark.parametrize("micro, accumulation, reserved, usable, expected", [
    (10, 1, 150, 137, (9, 2)),     # over by 9%: one less, accumulation keeps at least the global batch of 10
    (40, 1, 160, 100, (25, 2)),    # over by 60%: by the share it went over
    (2, 3, 200, 100, (1, 6)),
    (1, 1, 200, 100, (1, 1)),      # nothing below 1
])
def test_a_lowered_batch_keeps_the_global_batch(micro, accumulation, reserved, usable, expected):
    new = lowered(micro, accumulation, reserved, usable)
    assert new == expected and new[0] * new[1] >= micro * accumulation


def test_rewrite_changes_the_batch_split_in_every_file_and_keeps_force_working(tmp_path, capsys, monkeypatch):
    folder = emit(tmp_path, capsys, monkeypatch)
    rewrite_rehearsed(folder, 3, 5, {"verdict": "test"}, "LOWERED by a test")
    args = json.loads((folder / TRAINING_ARGS).read_text())
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == (3, 5)
    assert "'per_device_train_batch_size': 3" in (folder / TRAINING_ARGS_PY).read_text()
    readme = (folder / README).read_text()
    assert "micro-batch 3 x gradient accumulation 5 per GPU" in readme and readme.rstrip().endswith("LOWERED by a test")
    numbers = read_plan(folder)
    assert (numbers["micro_batch"], numbers["accumulation"], numbers["rehearsals"]) == (3, 5, [{"verdict": "test"}])
    code, _, err = run_ftplan([*PLAN, "--emit", folder, "--force"], capsys, monkeypatch)  # the manifest followed
    assert code == 0, err


def test_rewrite_never_replaces_a_file_the_user_edited(tmp_path, capsys, monkeypatch):
    folder = emit(tmp_path, capsys, monkeypatch)
    (folder / TRAINING_ARGS_PY).write_text("# mine\n")
    with pytest.raises(FtplanError, match="was not written by ftplan"):
        rewrite_rehearsed(folder, 2, 1, {}, "note")
    assert (folder / TRAINING_ARGS_PY).read_text() == "# mine\n"


def test_rehearse_refuses_a_folder_emit_did_not_write_in_one_line(tmp_path, capsys, monkeypatch):
    code, out, err = run_ftplan(["rehearse", tmp_path], capsys, monkeypatch)
    assert code == 2 and err.strip().count("\n") == 0 and "has no plan.json" in err
    (tmp_path / PLAN_JSON).write_text("[1, 2]")
    code, _, err = run_ftplan(["rehearse", tmp_path], capsys, monkeypatch)
    assert code == 2 and "not written by `ftplan plan --emit`" in err


def test_dry_run_prints_the_plan_and_its_gpu_time_without_a_gpu(tmp_path, capsys, monkeypatch):
    folder = emit(tmp_path, capsys, monkeypatch)
    code, out, err = run_ftplan(["rehearse", folder, "--dry-run"], capsys, monkeypatch)
    assert code == 0, err
    assert "micro-batch" in out and "GPU-minutes a run" in out


def test_emit_setup_writes_the_named_ranked_setup_or_lists_them(tmp_path, capsys, monkeypatch):
    code, _, err = run_ftplan([*PLAN, "--emit", tmp_path / "a", "--emit-setup", "no such"], capsys, monkeypatch)
    assert code == 2 and "ranked:" in err and "'ddp full s2048 padded'" in err
    folder = emit(tmp_path, capsys, monkeypatch, "--emit-setup", "ddp full s2048 padded")
    setting = read_plan(folder)["setting"]
    assert (setting["liger"], setting["zero_stage"], setting["padding"]) == (False, 0, "max_length")


def test_emitted_module_loads_the_model_as_the_trial_does_and_uses_current_argument_names(tmp_path, capsys,
                                                                                         monkeypatch):
    pytest.importorskip("transformers")
    import importlib.util
    import warnings

    folder = emit(tmp_path, capsys, monkeypatch, "--emit-setup", "ddp full gc s2048 padded")
    spec = importlib.util.spec_from_file_location("emitted_training_args", folder / TRAINING_ARGS_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.MODEL_KWARGS == {"dtype": "float32", "attn_implementation": "sdpa"} and module.LORA is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a deprecated key warns; the emitted names must not
        args = module.training_arguments(use_cpu=True, bf16=False)
    assert (getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing) is True


def test_plan_emit_says_how_to_rehearse_the_folder_and_its_gpu_time(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "configs"
    code, out, err = run_ftplan([*PLAN, "--emit", folder], capsys, monkeypatch)
    assert code == 0, err
    minutes = rehearsal_seconds(read_plan(folder), 20) / 60
    assert f"`ftplan rehearse {folder}`" in out and f"about {minutes:.1f} GPU-minutes" in out
