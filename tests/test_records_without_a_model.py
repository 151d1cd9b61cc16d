"""A Trainer run recorded with an optimizer or LoRA target ftplan has no model for must not break every later
plan of that model and GPU: the record is skipped with a warning naming its file and line."""

from __future__ import annotations

import json

import pytest

from ftplan.core.paths import calibrations_dir
from tests.helpers import run_ftplan

PLAN = ["plan", "--model", "qwen2.5-0.5b", "--dataset-size", "1000", "--gpu", "H200"]


def shipped_record(model: str) -> dict:
    lines = (calibrations_dir() / "h200.jsonl").read_text().splitlines()
    return next(r for r in map(json.loads, lines) if r["model"] == model and r["status"] == "ok")


@pytest.mark.parametrize("change, words", [({"optimizer": "sgd"}, "optimizer 'sgd' has no memory model"),
                                           ({"lora_rank": 8, "lora_targets": ["lm_head"]}, "unknown LoRA target")])
def test_a_record_of_a_setting_without_a_model_is_skipped_with_its_file_and_line(tmp_path, capsys, monkeypatch,
                                                                                  change, words):
    runs = tmp_path / "runs.jsonl"
    record = {**shipped_record("qwen2.5-0.5b"), **change, "source": "trainer_callback", "setting_key": "changed"}
    runs.write_text("\n" + json.dumps(record) + "\n")  # on line 2
    code, out, err = run_ftplan([*PLAN, "--calibrations", calibrations_dir(), "--calibrations", runs], capsys, monkeypatch)
    assert code == 0, err
    assert f"{runs}:2: " in err and words in err and "record skipped" in err
    assert "Recommended" in out or "→" in out
