"""kill -9 of `ftplan calibrate` at seeded random moments, again and again, then a torn record write:
nothing finished is lost, nothing is torn or duplicated, and each re-run runs only what is left.

test_resume.py kills after a chosen record count; here the moments are random (seeded, so a failure
reproduces), the same file survives a chain of kills, and the writer is killed inside a record.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from ftplan.calibration.runner import known_outcomes
from ftplan.store.records import RecordWarning, read_records
from tests.helpers import start_fake_calibration

FIXTURES = Path(__file__).parent / "fixtures"
WRITER = (sys.executable, str(FIXTURES / "reliability" / "record_writer.py"))
# Two settings (Liger off/on), ladder 1, 2, 4, 8 on each: eight trials of ~0.15 s.
ARGS = ("calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--liger", "both",
        "--max-batch", "8", "--machine", "test-box")
ALL_TRIALS = 8


def _calibrate(out: Path, starts: Path) -> subprocess.Popen:
    return start_fake_calibration(ARGS, out, {"sleep": 0.15, "log": str(starts)}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)


def _trials(out: Path) -> list[tuple[str, int]]:
    """(setting_key, batch) of every record; any skipped line fails the test."""
    if not out.exists():
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordWarning)
        return [(r["setting_key"], r["micro_batch"]) for r in read_records([out])]


def _started(starts: Path) -> set[tuple[str, int]]:
    if not starts.exists():
        return set()
    return {(key, int(batch)) for key, batch, _rank, _pid in map(str.split, starts.read_text().splitlines())}


def _pids(starts: Path) -> list[int]:
    return [int(line.split()[3]) for line in starts.read_text().splitlines()] if starts.exists() else []


def _assert_gone(pids: list[int], within: float = 10) -> None:
    deadline = time.monotonic() + within
    for pid in pids:
        while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
            assert time.monotonic() < deadline, f"rank {pid} outlived its killed calibration"
            time.sleep(0.05)


def test_a_chain_of_random_sigkills_loses_nothing_and_each_rerun_runs_only_the_rest(tmp_path):
    rng = random.Random(8)  # seeded, so a failure reproduces
    out = tmp_path / "c.jsonl"
    kills = 0
    for attempt, limit in enumerate([rng.uniform(0.2, 1.5) for _ in range(4)] + [60]):  # four kills, then finish
        before_text = out.read_bytes() if out.exists() else b""
        before = _trials(out)
        starts = tmp_path / f"starts-{attempt}.log"
        proc = _calibrate(out, starts)
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            kills += 1
        _assert_gone(_pids(starts))
        after = _trials(out)
        now = out.read_bytes() if out.exists() else b""  # a kill can land before the file is created
        assert now.startswith(before_text)  # append-only: nothing finished was rewritten or lost
        assert after[:len(before)] == before and len(after) == len(set(after))  # no duplicate trial
        assert _started(starts).isdisjoint(before)  # a re-run never repeats a recorded trial
        if proc.returncode == 0:
            break
    assert proc.returncode == 0, proc.stderr.read()
    assert kills >= 2  # the seed really killed it mid-run, more than once
    assert len(_trials(out)) == ALL_TRIALS


def test_a_record_torn_by_sigkill_inside_its_write_is_skipped_and_never_glued_to_the_next(tmp_path):
    out = tmp_path / "c.jsonl"
    torn = subprocess.run([*WRITER, str(out), "killed", "3", "--tear"], capture_output=True)
    assert torn.returncode == -9
    fragment = out.read_bytes().rsplit(b"\n", 1)[1]
    assert fragment and not fragment.endswith(b"\n")  # half a record at the end of the file

    survivor = subprocess.run([*WRITER, str(out), "next", "2"], capture_output=True)  # another process appends
    assert survivor.returncode == 0, survivor.stderr
    with pytest.warns(RecordWarning) as caught:
        records = read_records([out])
    assert [str(w.message) for w in caught] == [f"{out}:4: corrupt or truncated record skipped"]
    assert [(r["writer"], r["index"]) for r in records] == [("killed", 0), ("killed", 1), ("killed", 2),
                                                            ("next", 0), ("next", 1)]
    assert out.read_bytes().splitlines()[3] == fragment


def test_a_trial_whose_record_was_torn_is_not_counted_as_finished(tmp_path):
    """So the re-run measures it again instead of trusting half a line."""
    out = tmp_path / "c.jsonl"
    subprocess.run([*WRITER, str(out), "killed", "2", "--tear"], capture_output=True)  # batches 1, 2 whole; 3 torn
    (done,) = known_outcomes(out, "test-box", "cpu").values()
    assert done == {1: "ok", 2: "ok"}
