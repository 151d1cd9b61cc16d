"""A rank that raises, exits hard or hangs in a real gloo process group: every rank is ended within
30 s (gloo's own timeout here is 30 minutes) and the calibration records the trial as failed, with why.

test_launcher.py covers the watchdog with fake ranks and one gloo rank raising; this drives the
whole `ftplan calibrate` path with ranks that really joined a group and block in all_reduce.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from ftplan.store.records import read_records
from tests.helpers import run_ftplan

RANK_SCRIPT = (sys.executable, str(Path(__file__).parent / "fixtures" / "reliability" / "gloo_rank.py"))
HANG_TIMEOUT = 12  # seconds; more than two ranks need to import torch and join on this loaded machine


@pytest.fixture(autouse=True)
def needs_torch_distributed():
    """Skips without torch.distributed; a fixture, not at import, so collecting the suite does not load torch."""
    pytest.importorskip("torch.distributed")


def _calibrate_with_fault(tmp_path, capsys, monkeypatch, *, gpus: int, fault: dict, timeout: float):
    """Run `ftplan calibrate` in-process with gloo ranks; return (exit code, the one record, rank logs, seconds)."""
    monkeypatch.setenv("FAULT", json.dumps(fault))
    out, logs = tmp_path / "c.jsonl", tmp_path / "logs"
    started = time.time()
    code, _out, err = run_ftplan(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64",
                                  "--gpus", gpus, "--batch-sizes", "1", "--timeout", timeout, "--machine", "test-box",
                                  "--out", out, "--log-dir", logs], capsys, monkeypatch, trial_command=RANK_SCRIPT)
    ended = time.time()
    assert "Traceback" not in err
    (record,) = read_records([out])
    return code, record, {int(p.stem.rsplit("rank", 1)[1]): p.read_text() for p in logs.glob("*.log")}, ended - started, ended


def _fault_time(log: str) -> float:
    return float(re.search(r"misbehaves \(\w+\) at ([\d.]+)", log).group(1))


@pytest.mark.parametrize("mode, gpus, reason", [
    # a raising rank exits 1, or, when gloo's threads are still running at exit, is aborted by the C++ runtime
    ("raise", 2, r"exited with code 1: \[rank1\]: RuntimeError: rank 1 fails mid-step|killed by SIGABRT"),
    ("os_exit", 3, r"exited with code 9: rank 2 misbehaves \(os_exit\)"),
])
def test_a_rank_dying_in_a_gloo_group_ends_every_rank_and_is_recorded_as_failed(tmp_path, capsys, monkeypatch,
                                                                                mode, gpus, reason):
    faulty = gpus - 1
    code, record, logs, seconds, ended = _calibrate_with_fault(tmp_path, capsys, monkeypatch, gpus=gpus,
                                                               fault={"rank": faulty, "mode": mode}, timeout=120)
    assert code == 1  # the failed trial is recorded, and a calibration that measured nothing says so in its status
    assert seconds < 30 and ended - _fault_time(logs[faulty]) < 30
    assert record["status"] == "error" and re.match(f"rank {faulty}: ({reason})", record["message"])
    for rank in range(faulty):
        assert f"rank {rank} entering all_reduce" in logs[rank]  # it was blocked in the collective


def test_a_rank_hanging_while_the_others_wait_in_all_reduce_is_ended_at_the_trial_timeout(tmp_path, capsys,
                                                                                            monkeypatch):
    code, record, logs, seconds, _ = _calibrate_with_fault(tmp_path, capsys, monkeypatch, gpus=2,
                                                           fault={"rank": 1, "mode": "hang"}, timeout=HANG_TIMEOUT)
    assert code == 1 and seconds < HANG_TIMEOUT + 30
    assert record["status"] == "error" and record["message"] == f"rank 0: timed out after {HANG_TIMEOUT} s"
    assert logs[0].rstrip().endswith("rank 0 entering all_reduce") and "misbehaves (hang)" in logs[1]
