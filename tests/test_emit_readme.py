"""The emitted README.txt tells a newcomer only what is true of the folder: it names only files written, loads
the arguments the way that keeps the planned batching (packing lives in training_args.py alone), and carries
the plan's warnings, which the terminal showed once."""

from __future__ import annotations

import json

import pytest

from ftplan.planner.emit import DS_CONFIG, README
from tests.helpers import run_ftplan

PLAN = ["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset-size", "1000"]


def emit(tmp_path, capsys, monkeypatch, *args):
    folder = tmp_path / "configs"
    code, out, err = run_ftplan([*PLAN, *args, "--emit", folder], capsys, monkeypatch)
    assert code == 0, err
    return folder, out + err


def test_a_plan_without_deepspeed_names_no_ds_config(tmp_path, capsys, monkeypatch):
    folder, _ = emit(tmp_path, capsys, monkeypatch, "--full")
    assert not (folder / DS_CONFIG).exists()
    assert DS_CONFIG not in (folder / README).read_text()


def test_a_packed_plan_loads_its_arguments_from_training_args_py(tmp_path, capsys, monkeypatch):
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({"text": "word " * (20 + i % 50)}) + "\n" for i in range(200)))
    folder = tmp_path / "configs"
    code, _out, err = run_ftplan(["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset", dataset,
                                  "--batching", "pack", "--pack-length", "512", "--emit", folder], capsys, monkeypatch)
    assert code == 0, err
    text = (folder / README).read_text()
    assert "json.load(open('training_args.json'))" not in text and "training_arguments()" in text


def test_the_plans_warnings_are_written_into_the_readme(tmp_path, capsys, monkeypatch):
    folder, printed = emit(tmp_path, capsys, monkeypatch)
    warned = [line.split(": ", 1)[1] for line in printed.splitlines() if line.startswith("warning: ")]
    text = (folder / README).read_text()
    assert warned and "WARNINGS from the plan:" in text
    assert all(w[:60] in text for w in warned)


def test_plan_alloc_conf_is_the_emitted_allocator_configuration(tmp_path, capsys, monkeypatch):
    """The dynamic-padding note says to plan with --alloc-conf; plan once had no such option."""
    folder, _ = emit(tmp_path, capsys, monkeypatch, "--alloc-conf", "expandable_segments:True")
    assert "ALLOC_CONF = 'expandable_segments:True'" in (folder / "training_args.py").read_text()
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in (folder / README).read_text()


def test_an_allocator_configuration_that_is_not_pytorchs_is_refused_and_a_valid_one_is_shell_quoted(
        tmp_path, capsys, monkeypatch):
    code, _, err = run_ftplan([*PLAN, "--alloc-conf", "$(touch pwned)", "--emit", tmp_path / "bad"], capsys, monkeypatch)
    assert code == 2 and "is not key:value" in err and not (tmp_path / "bad").exists()  # README.txt once ran it
    folder, _ = emit(tmp_path, capsys, monkeypatch, "--alloc-conf", "roundup_power2_divisions:[256:1,512:2]")
    assert "export PYTORCH_CUDA_ALLOC_CONF='roundup_power2_divisions:[256:1,512:2]'" in (folder / README).read_text()


@pytest.mark.parametrize("conf, message", [
    ("expandable_segments:maybe", "expandable_segments takes True or False, got 'maybe'"),
    ("max_split_size_mb:abc", "max_split_size_mb takes a whole number of MB, at least 20"),
    ("backend:foo", "backend takes native or cudaMallocAsync"),
    ("garbage_collection_threshold:2", "garbage_collection_threshold takes a fraction between 0 and 1"),
    ("expandable_segments:True,expandable_segments:False", "sets expandable_segments twice"),  # PyTorch keeps the last
])
def test_an_allocator_value_pytorch_refuses_is_refused_before_it_is_planned(capsys, monkeypatch, conf, message):
    """Only the keys were checked: 'expandable_segments:maybe' was planned, labelled and would have been emitted, and
    the user's run would stop when CUDA starts; a key set twice was recorded as both."""
    code, _, err = run_ftplan([*PLAN, "--alloc-conf", conf], capsys, monkeypatch)
    assert code == 2 and message in err, err
