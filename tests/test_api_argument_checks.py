"""The Python API checks what a notebook passes, as click checks the CLI: a string or a fraction is a
one-line FtplanError, never a bare TypeError or a fractional batch predicted as if it were real."""

from __future__ import annotations

import pytest

import ftplan
from ftplan.core.errors import FtplanError


@pytest.mark.parametrize("kwargs, message", [
    ({"dataset_size": "abc"}, "dataset_size must be a whole number, got 'abc'"),
    ({"dataset_size": 10.5}, "dataset_size must be a whole number"),
    ({"dataset_size": 100, "seq_len": 100.5}, "seq_len must be a whole number"),
    ({"dataset_size": 100, "epochs": "x"}, "epochs must be a number"),
    ({"dataset_size": 100, "gpus": 2.5}, "gpus must be a whole number"),
    ({"dataset_size": 100, "lora_ranks": [8.0]}, r"lora_ranks\[0\] must be a whole number"),
    ({"dataset_size": 100, "gpu": 200}, "gpu must be a string"),
    ({"dataset_size": 100, "inter_node_bandwidth": 5}, "inter_node_bandwidth must be a string"),
    ({"dataset_size": 100, "context_reserve_gib": float("nan")}, "context_reserve_gib must be a finite number"),
    ({"dataset_size": 100, "price_per_hour": float("inf")}, "price_per_hour must be a finite number"),
    ({"dataset_size": 100, "max_hours": float("nan")}, "max_hours must be a finite number"),
    ({"dataset": 5}, "dataset must be a string"),
    ({"dataset_size": 100, "dataset_options": "pack"}, "dataset_options must be a DatasetOptions"),
    ({"dataset_size": 100, "calibrations": 5}, "calibrations must be a path or a list of paths"),
    ({"dataset_size": 100, "calibrations": [5]}, r"calibrations\[0\] must be a string"),
    ({"dataset_size": 100, "lora_ranks": 16}, "lora_ranks must be a list, got 16"),
    ({"dataset_size": 100, "allow": "qlora"}, "allow must be a list, got 'qlora'"),
    ({"dataset_size": 100, "allow": ["4bit"]}, "allow takes 'qlora', got '4bit'"),
    ({"dataset_size": 100, "chars_per_token": 3.0}, "chars_per_token reads a dataset: give dataset= too"),
])
def test_plan_refuses_mistyped_arguments(kwargs, message):
    with pytest.raises(ftplan.FtplanError, match=message):  # the package's own name for the error a user catches
        ftplan.plan(**{"model": "llama-3-8b", "gpu": "H200", **kwargs})


@pytest.mark.parametrize("batch, setting, message", [
    (4.5, {}, "batch_size must be a whole number, got 4.5"),
    ("4", {}, "batch_size must be a whole number"),
    (4, {"seq_len": "x"}, "seq_len must be a whole number"),
    (4, {"seqlen": 512}, "unknown setting field"),
    (4, {"lora_rank": 16, "lora_targets": "q_proj"}, "lora_targets must be a list of module names, got 'q_proj'"),
    (4, {"lora_rank": 8, "lora_targets": []}, r"lora_targets must be a list of module names, got \[\]"),
    (4, {"lora_rank": 8, "lora_targets": None}, "lora_targets must be a list of module names, got None"),
])
def test_predict_refuses_a_fractional_batch_and_mistyped_settings(batch, setting, message):
    with pytest.raises(FtplanError, match=message):
        ftplan.predict("llama-3-8b", batch, "H200", **setting)


def test_numpy_integers_are_whole_numbers():
    np = pytest.importorskip("numpy")
    assert ftplan.predict("llama-3-8b", np.int64(4), "H200", seq_len=np.int64(512)).micro_batch == 4


def test_nan_epochs_are_not_positive():
    with pytest.raises(FtplanError, match="epochs must be positive, got nan"):
        ftplan.plan(model="llama-3-8b", dataset_size=100, gpu="H200", epochs=float("nan"))


@pytest.mark.parametrize("switch", ["liger", "gradient_checkpointing", "offload_optimizer"])
def test_a_switch_given_as_a_string_is_refused_not_taken_as_on(switch):
    with pytest.raises(FtplanError, match=f"{switch} must be True or False, got 'no'"):
        ftplan.predict("llama-3-8b", 4, "H200", **{switch: "no"})  # "no" is truthy: it once planned Liger on


def test_one_calibration_path_may_come_alone(tmp_path):
    """A string was iterated: 'rec.jsonl' read as the files 'r', 'e', 'c'..."""
    import json

    from tests.helpers import synthetic_records

    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records([1, 2, 4])))
    assert ftplan.predict("llama-3-8b", 2, "H200", calibrations=str(path)).micro_batch == 2


@pytest.mark.parametrize("chars", [float("nan"), float("inf"), 0, 1e-9])
def test_a_character_count_that_is_not_a_positive_number_is_refused(tmp_path, chars):
    """NaN was a bare ValueError, inf read every sample as empty, 0 fell back to 4 without a word, and 1e-9 planned
    samples of a trillion tokens (the CLI's range, 0.1 to 100, holds for the API too)."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    with pytest.raises(FtplanError, match="characters per token must be a positive number from 0.1 to 100"):
        ftplan.plan("llama-3.2-1b", gpu="H100", dataset=str(data), chars_per_token=chars)


@pytest.mark.parametrize("setting, words", [
    ({"alloc_conf": None}, "alloc_conf must be text"),  # it read as another recipe: 'interpolated', not 'measured'
    ({"lora_rank": 16, "lora_targets": ["q_proj", "q_proj"]}, "LoRA targets name q_proj more than once"),
    ({"gpus": 10**9}, "more than any cluster"),
])
def test_a_setting_no_run_has_is_refused_by_the_api_too(setting, words):
    with pytest.raises(FtplanError, match=words):
        ftplan.predict("llama-3.2-1b", 2, "H200", **setting)
