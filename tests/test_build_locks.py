"""A trial ended mid-build leaves PyTorch's extension lock; every later trial loading that op waited on it for its
whole --timeout (a DeepSpeed CPU Adam build killed by the watchdog, then every ZeRO offload trial timed out)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from ftplan.calibration.build_locks import STALE_AFTER_SECONDS, clear_build_locks
from ftplan.calibration.launcher import RankLaunch, run_ranks

# A stand-in for a trial that takes the build lock as torch's FileBaton does, then is ended before releasing it.
BUILDING = ("import os, sys, time; folder = sys.argv[1]; os.makedirs(folder, exist_ok=True); "
            "os.close(os.open(os.path.join(folder, 'lock'), os.O_CREAT | os.O_EXCL)); time.sleep(60)")


def test_a_trial_ended_mid_build_leaves_no_lock_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    older = tmp_path / "ext" / "py311_cpu" / "other"
    older.mkdir(parents=True)
    (older / "lock").touch()
    os.utime(older / "lock", (time.time() - 60, time.time() - 60))  # another build, begun before this trial
    with pytest.warns(UserWarning, match="cpu_adam/lock: a build the ended trial had begun"):
        ended = run_ranks([RankLaunch([sys.executable, "-c", BUILDING, str(tmp_path / "ext" / "py311_cpu" / "cpu_adam")],
                                      tmp_path / "rank0.log")], timeout=2)
    assert ended.stopped and not (tmp_path / "ext" / "py311_cpu" / "cpu_adam" / "lock").exists()
    assert (older / "lock").exists()


def test_only_locks_older_than_any_build_are_cleared_at_the_start(tmp_path):
    fresh, stale = tmp_path / "py311_cpu" / "a" / "lock", tmp_path / "py311_cpu" / "b" / "lock"
    for lock in (fresh, stale):
        lock.parent.mkdir(parents=True)
        lock.touch()
    os.utime(stale, (time.time() - STALE_AFTER_SECONDS - 5,) * 2)
    assert clear_build_locks(root=tmp_path) == [stale] and fresh.exists() and not stale.exists()
