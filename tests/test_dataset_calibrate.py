"""`ftplan calibrate --dataset`: trials run at the dataset's longest sample, so their first step measures
the peak a real run hits when the long samples arrive."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from ftplan.store.records import read_records
from tests.helpers import run_ftplan

FAKE_TRIAL = (sys.executable, str(Path(__file__).parent / "fixtures" / "fake_trial.py"))
LENGTHS = (10, 20, 30, 300)


@pytest.fixture
def fake_trial(monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL", "{}")


def _dataset(tmp_path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"input_ids": [1] * n}) + "\n" for n in LENGTHS))
    return path


def _calibrate(tmp_path, capsys, monkeypatch, *args, trial_command=FAKE_TRIAL):
    out = tmp_path / "c.jsonl"
    code, stdout, err = run_ftplan(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--machine", "box",
                                    "--out", out, "--batch-sizes", "1", *args], capsys, monkeypatch,
                                   trial_command=trial_command)
    return code, stdout, err, out


def test_trials_run_at_the_longest_sample_and_say_so(fake_trial, tmp_path, capsys, monkeypatch):
    code, stdout, err, out = _calibrate(tmp_path, capsys, monkeypatch, "--dataset", _dataset(tmp_path))
    assert code == 0, err
    assert [r["seq_len"] for r in read_records([out])] == [300]
    assert "Dataset: 4 samples, 360 tokens" in stdout
    assert "Calibrating at the dataset's longest sample, 300 tokens" in stdout


def test_the_recorded_command_resumes_without_running_again(fake_trial, tmp_path, capsys, monkeypatch):
    code, _, err, out = _calibrate(tmp_path, capsys, monkeypatch, "--dataset", _dataset(tmp_path))
    assert code == 0, err
    command = shlex.split(read_records([out])[0]["command"])[1:]
    code, stdout, err = run_ftplan(command, capsys, monkeypatch, trial_command=FAKE_TRIAL)
    assert code == 0, err
    assert "0 new record(s)" in stdout


@pytest.mark.parametrize("too_long, length", [("truncate", 100), ("drop", 30)])
def test_seq_len_caps_the_length_and_too_long_chooses_what_is_left(fake_trial, tmp_path, capsys, monkeypatch,
                                                                  too_long, length):
    code, stdout, err, out = _calibrate(tmp_path, capsys, monkeypatch, "--dataset", _dataset(tmp_path),
                                        "--seq-len", 100, "--too-long", too_long)
    assert code == 0, err
    assert [r["seq_len"] for r in read_records([out])] == [length]
    assert "1 samples are longer than 100 tokens" in stdout and f"left after the limit, {length} tokens" in stdout


def test_text_is_estimated_at_the_characters_per_token_given(fake_trial, tmp_path, capsys, monkeypatch):
    data = tmp_path / "t.jsonl"
    data.write_text(json.dumps({"text": "x" * 90}) + "\n" + json.dumps({"text": "short"}) + "\n")
    code, stdout, err, out = _calibrate(tmp_path, capsys, monkeypatch, "--dataset", data, "--chars-per-token", 3)
    assert code == 0, err
    assert [r["seq_len"] for r in read_records([out])] == [30]
    assert "ESTIMATE at 3 characters per token" in stdout


@pytest.mark.parametrize("args, message", [
    (["--seq-len", 64, "--seq-len", 128], "at most one --seq-len"),
    (["--tokenizer", "tok.json"], "--chars-per-token is the estimate without a tokenizer"),
    (["--dataset", "missing.jsonl"], "does not exist"),
])
def test_bad_dataset_input_is_one_line_and_runs_nothing(fake_trial, tmp_path, capsys, monkeypatch, args, message):
    dataset = [] if "--dataset" in args else ["--dataset", _dataset(tmp_path)]
    extra = ["--chars-per-token", 3] if "--tokenizer" in args else []
    code, _, err, out = _calibrate(tmp_path, capsys, monkeypatch, *dataset, *args, *extra)
    assert code != 0 and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists() or not read_records([out])


def test_dataset_options_without_a_dataset_are_refused(fake_trial, tmp_path, capsys, monkeypatch):
    code, _, err, _ = _calibrate(tmp_path, capsys, monkeypatch, "--text-field", "body")
    assert code != 0 and "--text-field needs --dataset" in err


def test_a_real_cpu_trial_measures_at_the_longest_sample(tmp_path, capsys, monkeypatch):
    """The real trial (tiny-llama on the CPU, one measured step) runs at the dataset's length."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a tiny model trains faster on one thread (conftest.one_torch_thread)
    code, _, err, out = _calibrate(tmp_path, capsys, monkeypatch, "--dataset", _dataset(tmp_path),
                                   "--steps", 1, "--warmup-steps", 0, trial_command=None)
    assert code == 0, err
    (record,) = read_records([out])
    assert record["status"] == "ok", record.get("message")
    assert record["seq_len"] == 300 and record["peak_reserved_bytes"] > 0
    assert record["tokens_per_second"] == pytest.approx(300 / record["seconds_per_step"])
