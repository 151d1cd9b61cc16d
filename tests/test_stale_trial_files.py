"""kill -9 of `ftplan calibrate` runs no cleanup: its `ftplan-trial-*` folder and its trial's claim file stayed
forever. The next calibration removes those whose process is gone, and a finished one leaves no claims folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ftplan.calibration import scratch
from tests.helpers import start_fake_calibration

ARGS = ("calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--batch-sizes", "1,2",
        "--machine", "test-box")


def calibration(out: Path, behaviour: dict) -> subprocess.Popen:
    return start_fake_calibration(ARGS, out, behaviour, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for(path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_the_next_calibration_removes_what_a_killed_one_left(tmp_path, monkeypatch):
    temp, out, started = tmp_path / "tmp", tmp_path / "c.jsonl", tmp_path / "started.log"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the calibrations' temporary folder
    killed = calibration(out, {"sleep": 60, "log": str(started)})
    wait_for(started)
    killed.kill()
    killed.wait()
    assert list(temp.glob("ftplan-trial-*")) and list(out.with_name("c.jsonl.claims").iterdir())  # what it left

    assert calibration(out, {}).wait(timeout=120) == 0
    assert list(temp.glob("ftplan-trial-*")) == []
    assert not out.with_name("c.jsonl.claims").exists()


def test_only_folders_of_this_host_whose_process_is_gone_are_removed(tmp_path):
    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()
    host = scratch._host()
    dead, live = tmp_path / f"ftplan-trial-{ended.pid}-{host}-abc", tmp_path / f"ftplan-trial-{os.getpid()}-{host}-abc"
    elsewhere, unnamed = tmp_path / f"ftplan-trial-{ended.pid}-other_host-abc", tmp_path / "ftplan-trial-abc123"
    for folder in (dead, live, elsewhere, unnamed):
        (folder / "inside").mkdir(parents=True)
    scratch.remove_stale_folders(tmp_path)
    assert sorted(tmp_path.iterdir()) == sorted([live, elsewhere, unnamed])
