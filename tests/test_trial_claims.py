"""Two calibrations of one output file run each trial once between them (a trial is claimed before it runs),
and a duplicate measurement of one trial in a file is reported, not averaged into the fits."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

from ftplan.store.records import RecordWarning, build_record, read_records
from ftplan.core.settings import Setting
from tests.helpers import start_fake_calibration

ARGS = ("calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--gradient-checkpointing", "both",
        "--max-batch", "4", "--machine", "test-box")
ALL_TRIALS = 6


def start(out: Path, starts: Path) -> subprocess.Popen:
    return start_fake_calibration(ARGS, out, {"sleep": 0.3, "log": str(starts)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)


def started_trials(*logs: Path) -> list[tuple[str, str]]:
    return [tuple(line.split()[:2]) for log in logs if log.exists() for line in log.read_text().splitlines()]


def test_two_calibrations_of_the_same_settings_run_each_trial_once(tmp_path):
    out = tmp_path / "c.jsonl"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [start(out, log) for log in logs]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    started = started_trials(*logs)
    assert len(started) == len(set(started)) == ALL_TRIALS, started
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordWarning)
        keys = [(r["setting_key"], r["micro_batch"]) for r in read_records([out])]
    assert len(keys) == len(set(keys)) == ALL_TRIALS


def test_a_duplicate_measurement_of_one_trial_is_reported_and_only_the_first_kept(tmp_path):
    setting = Setting(model="tiny-llama", seq_len=64)
    common = {"source": "calibrate", "machine_id": "box", "device": "cpu", "arch_hash": "abc"}
    first = build_record(setting, 2, "ok", seconds_per_step=0.1, **common)
    second = build_record(setting, 2, "ok", seconds_per_step=0.9, **common)  # contended: a second run alongside
    other_machine = build_record(setting, 2, "ok", seconds_per_step=0.2, **{**common, "machine_id": "other"})
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (first, second, other_machine)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records([path])
    assert [r["seconds_per_step"] for r in records] == [0.1, 0.2]
    messages = [str(w.message) for w in caught if issubclass(w.category, RecordWarning)]
    assert messages == [f"{path}:2: duplicate measurement of tiny-llama {setting.label()} batch 2 on box "
                        f"(first at {path}:1); record skipped"]
