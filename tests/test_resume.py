"""A calibration killed at any point loses no finished trial, tears no record, and resumes where it stopped.

These run `ftplan calibrate` as a real process (with the fake trial) and kill it for real.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftplan.store.records import read_records

FTPLAN = (sys.executable, str(Path(__file__).parent / "fixtures" / "ftplan_with_fake_trial.py"))
# Two settings (Liger off/on), ladder 1, 2, 4 on each: six trials.
ARGS = ("calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--liger", "both",
        "--max-batch", "4", "--machine", "test-box")
ALL_TRIALS = 6


def _as_a_foreground_job() -> None:
    """Ctrl-C reaches a foreground job: a shell's background job (pytest run with `&`) passes SIGINT on ignored,
    and the calibration would rightly ignore the test's SIGINT too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(out: Path, starts_log: Path, *extra: str, sleep: float = 0.4, **behaviour) -> subprocess.Popen:
    env = {**os.environ, "FAKE_TRIAL": json.dumps({"sleep": sleep, "log": str(starts_log), **behaviour})}
    return subprocess.Popen([*FTPLAN, *ARGS, "--out", str(out), *extra], env=env, preexec_fn=_as_a_foreground_job,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_records(out: Path, count: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (out.exists() and len(out.read_text().splitlines()) >= count):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "calibration made no progress"
        time.sleep(0.05)


def started_trials(starts_log: Path) -> list[tuple[str, int]]:
    return [(key, int(batch)) for key, batch, _rank, _pid in (line.split() for line in starts_log.read_text().splitlines())]


def assert_ranks_gone(starts_log: Path, within: float = 10) -> None:
    deadline = time.monotonic() + within
    for line in starts_log.read_text().splitlines():
        pid = int(line.split()[3])
        while _alive(pid):
            assert time.monotonic() < deadline, f"rank {pid} outlived the killed calibration"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def trial_keys(out: Path) -> list[tuple[str, int]]:
    return [(r["setting_key"], r["micro_batch"]) for r in read_records([out])]


@pytest.mark.parametrize("kill_after_records", [1, 4])
def test_sigkill_mid_trial_loses_nothing_and_the_rerun_runs_only_the_rest(tmp_path, kill_after_records):
    out, first_starts, second_starts = tmp_path / "c.jsonl", tmp_path / "first.log", tmp_path / "second.log"
    proc = start(out, first_starts, sleep=0.6)
    wait_for_records(out, kill_after_records, proc)
    time.sleep(0.3)  # inside the next trial (its ranks sleep 0.6 s)
    proc.kill()
    proc.wait()
    assert_ranks_gone(first_starts)
    finished = trial_keys(out)
    assert len(finished) == len(set(finished)) >= kill_after_records
    assert len(out.read_text().splitlines()) == len(finished)  # no torn line

    rerun = start(out, second_starts, sleep=0)
    assert rerun.wait(timeout=60) == 0, rerun.communicate()[0]
    assert set(started_trials(second_starts)).isdisjoint(finished)
    assert trial_keys(out)[:len(finished)] == finished
    assert len(trial_keys(out)) == len(set(trial_keys(out))) == ALL_TRIALS


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_ends_the_running_trials_ranks_and_exits_as_the_signal_says(tmp_path, stop):
    """130 after Ctrl-C, 143 after SIGTERM (it said 130 for both), as a shell reports either."""
    out, starts = tmp_path / "c.jsonl", tmp_path / "starts.log"
    proc = start(out, starts, "--gpus", "2", sleep=30)
    deadline = time.monotonic() + 30
    while not (starts.exists() and len(starts.read_text().splitlines()) == 2):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(stop)
    assert proc.wait(timeout=30) == 128 + stop
    assert_ranks_gone(starts, within=1)
    assert not out.exists() or out.read_text() == ""  # the interrupted trial leaves no record (it is re-run)


def test_two_calibrations_appending_to_one_file_interleave_no_lines(tmp_path):
    out = tmp_path / "c.jsonl"
    procs = [start(out, tmp_path / "a.log", sleep=0), start(out, tmp_path / "b.log", "--lora-rank", "8", sleep=0)]
    assert [p.wait(timeout=90) for p in procs] == [0, 0]
    lines = out.read_text().splitlines()
    assert all(json.loads(line)["schema_version"] == 1 for line in lines)
    assert len(lines) == len(set(trial_keys(out))) == 2 * ALL_TRIALS
