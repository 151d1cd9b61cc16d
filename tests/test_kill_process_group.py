"""kill -9 of `ftplan calibrate` ends its ranks and every process a rank started, not only the ranks (issue 17 #12).

Each rank already dies with the launcher (PR_SET_PDEATHSIG), but a rank's own child, re-parented to
PID 1 when the rank dies, lived on: a DataLoader worker or compile pool holding memory, or a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "reliability"
FTPLAN = (sys.executable, str(FIXTURES / "ftplan_with_spawning_rank.py"))
REPO = Path(__file__).resolve().parent.parent


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent (PID 1 in a container may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for_lines(path: Path, count: int, within: float) -> list[str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"only {path.read_text() if path.exists() else 'no'} ranks started their child in {within} s")


def test_sigkill_of_calibrate_ends_every_rank_and_the_child_each_rank_started(tmp_path):
    log = tmp_path / "spawned.log"
    calibrate = subprocess.Popen([*FTPLAN, "calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64",
                                  "--gpus", "2", "--batch-sizes", "1", "--machine", "box", "--out", str(tmp_path / "c.jsonl")],
                                 cwd=REPO, env={**os.environ, "SPAWN_LOG": str(log)},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pids = [int(pid) for line in wait_for_lines(log, 2, within=60) for pid in line.split()]
    finally:
        calibrate.kill()
        calibrate.wait()
    deadline = time.monotonic() + 5
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in pids if alive(pid)]
    for pid in survivors:
        os.kill(pid, 9)  # do not leave them to the next test
    assert not survivors, f"processes {survivors} of {pids} (rank, child per rank) outlived the killed calibration"
