"""A record whose machine_id, device or arch_hash is a dict or a list (hand-edited, or written by another tool)
is skipped with a file:line warning: taken in, it crashed plan, predict, fit and calibrate's resume."""

from __future__ import annotations

import json

import pytest

from ftplan.calibration.runner import pinned_machine_id
from ftplan.core.paths import calibrations_dir
from ftplan.store.records import RecordWarning, read_records
from tests.helpers import run_ftplan

MODEL = ["--model", "qwen2.5-0.5b", "--gpu", "H200"]
COMMANDS = [["plan", *MODEL, "--dataset-size", "1000"], ["predict", *MODEL, "--batch-size", "2"], ["fit"]]
BAD = [("machine_id", {"host": "a"}), ("device", ["cuda"]), ("arch_hash", {"x": [1]})]


def bad_file(tmp_path, key, value):
    record = json.loads((calibrations_dir() / "h200.jsonl").read_text().splitlines()[0])
    path = tmp_path / "edited.jsonl"
    path.write_text(json.dumps({**record, key: value}) + "\n")
    return path


@pytest.mark.parametrize("key, value", BAD)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_every_command_skips_the_record_with_its_file_and_line(tmp_path, capsys, monkeypatch, command, key, value):
    path = bad_file(tmp_path, key, value)
    inputs = ["--calibrations", calibrations_dir(), "--calibrations", path]
    if command == ["fit"]:
        inputs = [calibrations_dir(), path, "--out", tmp_path / "fits.json"]
    code, _out, err = run_ftplan([*command, *inputs], capsys, monkeypatch)
    assert code == 0, err
    assert "Traceback" not in err and f"{path}:1: {key} is" in err


@pytest.mark.parametrize("key, value", BAD)
def test_calibrates_resume_reads_past_it(tmp_path, key, value):
    path = bad_file(tmp_path, key, value)
    with pytest.warns(RecordWarning, match=f"{key} is"):
        assert read_records([path]) == []
    assert pinned_machine_id(path) is None
