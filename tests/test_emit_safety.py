"""`--emit DIR` never overwrites the user's files, never writes through a symlink, never leaves a stale file
beside a new plan, and writes a folder that still works when copied elsewhere (issue 17 #11)."""

from __future__ import annotations

import json
import shutil

import pytest

from ftplan.core.errors import FtplanError
from ftplan.core.hardware import GpuSpec
from ftplan.core.settings import Setting
from ftplan.models.safe_batch import MemoryBudget
from ftplan.planner.emit import DS_CONFIG, MANIFEST, PLAN_JSON, README, TRAINING_ARGS, TRAINING_ARGS_PY, write_configs
from ftplan.planner.search import PlanRequest, plan_setup
from ftplan.core.recipe import current_names
from tests.helpers import FakePredictor, run_ftplan

GPU = GpuSpec("TEST-80", 80, 100, 1000)
DEEPSPEED = Setting(model="llama-3-8b", zero_stage=2, offload_optimizer=True)
PLAIN_LORA = Setting(model="llama-3-8b", lora_rank=16)


def emit(directory, setting: Setting, force: bool = False) -> list:
    request = PlanRequest(base=setting, dataset_size=1000, epochs=1, gpu=GPU, budget=MemoryBudget(GPU.memory_bytes))
    return write_configs(directory, plan_setup(FakePredictor(), setting, request), request, force=force)


def test_a_folder_holding_the_users_files_is_refused_and_left_as_it_was(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(FtplanError, match="not empty.*--force"):
        emit(tmp_path, DEEPSPEED)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"] and notes.read_text() == "mine"


def test_force_replaces_only_ftplans_own_files_and_removes_a_stale_ds_config(tmp_path):
    emit(tmp_path, DEEPSPEED)
    assert (tmp_path / DS_CONFIG).exists()
    (tmp_path / "train.py").write_text("user code")
    emit(tmp_path, PLAIN_LORA, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([MANIFEST, README, TRAINING_ARGS, TRAINING_ARGS_PY, PLAN_JSON, "train.py"])
    assert "deepspeed" not in json.loads((tmp_path / TRAINING_ARGS).read_text())
    assert (tmp_path / "train.py").read_text() == "user code"


def test_an_emit_folder_that_is_a_symlink_is_refused_even_with_force(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "configs"
    link.symlink_to(target)
    with pytest.raises(FtplanError, match="symlink"):
        emit(link, DEEPSPEED, force=True)
    assert not any(target.iterdir())


@pytest.mark.parametrize("name", [TRAINING_ARGS, TRAINING_ARGS_PY, DS_CONFIG, README])
def test_a_config_file_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path, name):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / name).symlink_to(outside)
    with pytest.raises(FtplanError, match="symlink"):
        emit(folder, PLAIN_LORA, force=True)  # a plan without DeepSpeed would remove ds_config.json
    assert outside.read_text() == "precious" and (folder / name).is_symlink()


def test_the_emitted_folder_runs_from_wherever_it_is_copied(tmp_path, monkeypatch):
    from transformers import TrainingArguments

    emit(tmp_path / "configs", DEEPSPEED)
    copy = shutil.copytree(tmp_path / "configs", tmp_path / "cluster" / "job")
    shutil.rmtree(tmp_path / "configs")
    kwargs = json.loads((copy / TRAINING_ARGS).read_text())
    assert kwargs["deepspeed"] == DS_CONFIG and kwargs["output_dir"] == "output"
    monkeypatch.chdir(copy)
    args = TrainingArguments(**current_names(kwargs, TrainingArguments), use_cpu=True)  # no GPU here: bf16 needs use_cpu
    assert args.hf_deepspeed_config.config["zero_optimization"]["stage"] == 2
    assert "from this folder" in (copy / README).read_text()


def test_plan_emit_into_a_non_empty_folder_is_one_error_line_and_force_writes_it(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    args = ["plan", "--model", "llama-3.2-1b", "--dataset-size", 1000, "--gpu", "H200", "--json", "--emit", folder]
    code, _out, err = run_ftplan(args, capsys, monkeypatch)
    assert code != 0 and err.strip().count("\n") == 0 and "--force" in err, err
    assert not (folder / TRAINING_ARGS).exists()
    code, _out, err = run_ftplan([*args, "--force"], capsys, monkeypatch)
    assert code == 0, err
    assert (folder / TRAINING_ARGS).exists() and (folder / "notes.txt").read_text() == "mine"
