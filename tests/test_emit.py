"""`--emit`: the recommended setup as files the Hugging Face Trainer and DeepSpeed accept as they are."""

from __future__ import annotations

import json

import pytest

from ftplan.core.errors import FtplanError
from ftplan.core.hardware import GpuSpec
from ftplan.core.settings import Setting
from ftplan.models.safe_batch import MemoryBudget
from ftplan.planner.emit import DS_CONFIG, README, TRAINING_ARGS, write_configs
from ftplan.planner.search import PlanRequest, plan_setup
from ftplan.core.recipe import current_names
from tests.helpers import FakePredictor, run_ftplan, write_external_jsonl

GPU = GpuSpec("TEST-80", 80, 100, 1000)


def _emit(tmp_path, setting: Setting):
    request = PlanRequest(base=setting, dataset_size=1000, epochs=2, gpu=GPU, budget=MemoryBudget(GPU.memory_bytes))
    setup = plan_setup(FakePredictor(), setting, request)
    write_configs(tmp_path, setup, request)
    return setup


def _training_arguments(tmp_path):
    from transformers import TrainingArguments

    kwargs = json.loads((tmp_path / TRAINING_ARGS).read_text())
    # this test machine has no GPU: bf16 needs use_cpu here; on the training machine the file runs as written
    return kwargs, TrainingArguments(**current_names(kwargs, TrainingArguments), use_cpu=True)


def test_deepspeed_offload_setup_loads_in_training_arguments_and_validates_in_deepspeed(tmp_path, monkeypatch):
    from deepspeed.runtime.config import DeepSpeedConfig

    setting = Setting(model="llama-3-8b", zero_stage=2, offload_optimizer=True, liger=True, gradient_checkpointing=True)
    setup = _emit(tmp_path, setting)
    monkeypatch.chdir(tmp_path)  # the folder's paths are relative to it, as its README says
    kwargs, args = _training_arguments(tmp_path)
    assert args.per_device_train_batch_size == setup.batch and args.num_train_epochs == 2
    assert args.gradient_checkpointing and args.bf16 and args.use_liger_kernel
    # the Trainer fills the "auto" values from its arguments; DeepSpeed then validates the result
    filled = args.hf_deepspeed_config.config
    config = DeepSpeedConfig(filled)
    assert config.zero_optimization_stage == 2
    assert config.zero_config.offload_optimizer.device == "cpu" and config.zero_config.offload_optimizer.pin_memory
    assert config.train_micro_batch_size_per_gpu == setup.batch and config.train_batch_size == setup.batch
    written = json.loads((tmp_path / DS_CONFIG).read_text())
    assert written["train_batch_size"] == "auto" and written["bf16"] == {"enabled": True}


def test_plain_lora_setup_needs_no_deepspeed_and_its_readme_has_the_peft_lines(tmp_path):
    _emit(tmp_path, Setting(model="llama-3-8b", lora_rank=16))
    assert not (tmp_path / DS_CONFIG).exists()
    kwargs, args = _training_arguments(tmp_path)
    assert "deepspeed" not in kwargs and not args.gradient_checkpointing
    readme = (tmp_path / README).read_text()
    assert "prepare_model" in readme and "get_peft_model" in (tmp_path / "training_args.py").read_text()


def test_plan_emit_writes_the_recommended_setup(tmp_path, capsys, monkeypatch):
    external = write_external_jsonl(tmp_path / "external.jsonl")
    out = tmp_path / "configs"
    code, stdout, err = run_ftplan(["plan", "--model", "qwen1.5-0.5b", "--dataset-size", 19692, "--gpu", "RTX-3090",
                                    "--calibrations", external, "--full", "--json", "--emit", out],
                                   capsys, monkeypatch)
    assert code == 0, err
    recommended = json.loads(stdout)["recommendation"]
    kwargs = json.loads((out / TRAINING_ARGS).read_text())
    assert kwargs["per_device_train_batch_size"] == recommended["largest_safe_batch"]
    assert (out / DS_CONFIG).exists() == (recommended["setting"]["zero_stage"] > 0)
    assert recommended["label"] in (out / README).read_text()


def test_unwritable_emit_folder_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(FtplanError, match="cannot write configs"):
        _emit(blocker / "sub", Setting(model="llama-3-8b"))


def test_a_multi_gpu_emit_succeeds_and_says_how_to_try_it_without_rehearse(tmp_path, capsys, monkeypatch):
    """rehearse runs one GPU; a 2-GPU folder was written and then the command exited 2 asking rehearse about it."""
    from tests.helpers import run_ftplan

    out = tmp_path / "two"
    code, stdout, stderr = run_ftplan(["plan", "--model", "qwen2.5-0.5b", "--gpu", "H100", "--gpus", "2",
                                       "--dataset-size", "1000", "--emit", out], capsys, monkeypatch)
    assert code == 0 and (out / "training_args.py").exists()
    assert "`ftplan rehearse` runs one GPU; this plan uses 2" in stdout + stderr
    readme = " ".join((out / "README.txt").read_text().split())  # the folder says the same, not "run rehearse"
    assert "`ftplan rehearse` runs one GPU and this plan uses 2" in readme and "rehearse THIS_FOLDER" not in readme


def test_an_occupied_emit_folder_is_refused_before_the_plan_is_made(tmp_path, capsys, monkeypatch):
    """The refusal came after the whole plan had printed; now it comes first, with nothing planned or written."""
    from tests.helpers import run_ftplan

    (tmp_path / "notes.txt").write_text("the user's")
    code, stdout, stderr = run_ftplan(["plan", "--model", "qwen2.5-0.5b", "--gpu", "H200", "--dataset-size", "100",
                                       "--emit", tmp_path], capsys, monkeypatch)
    assert code == 2 and "is not empty" in stderr and not stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
