"""The launcher ends every rank when one fails or hangs, and says why the trial failed."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from ftplan.calibration import launcher
from ftplan.calibration.launcher import TrialSpec, run_trial
from ftplan.core.errors import FtplanError
from ftplan.core.settings import Setting

FAKE_TRIAL = (sys.executable, str(Path(__file__).parent / "fixtures" / "fake_trial.py"))


def spec(gpus: int = 1, batch: int = 2, nodes: int = 1) -> TrialSpec:
    return TrialSpec(Setting("tiny-llama", seq_len=64, gpus=gpus, nodes=nodes), batch, "cpu", steps=3, warmup_steps=1)


def run_fake(monkeypatch, behaviour: dict, *, gpus: int = 3, timeout: float = 60.0, batch: int = 2):
    monkeypatch.setenv("FAKE_TRIAL", json.dumps(behaviour))
    return run_trial(spec(gpus, batch), timeout, FAKE_TRIAL)


def assert_all_gone(log: Path) -> None:
    for line in log.read_text().splitlines():
        pid = int(line.split()[3])
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_healthy_ranks_report_ok_with_their_results(monkeypatch):
    outcome = run_fake(monkeypatch, {}, gpus=2)
    assert outcome.status == "ok" and outcome.message == ""
    assert [r.result["peak_allocated_bytes"] for r in outcome.ranks] == [120_000_000, 121_000_000]


@pytest.mark.parametrize("mode, reason", [
    ("raise", "RuntimeError: fake rank failure"),
    ("exit", "exited with code 1"),
    ("os_exit", "exited with code 7"),
    ("sigkill", "killed by SIGKILL"),
])
def test_a_failing_rank_ends_every_other_rank_quickly(monkeypatch, tmp_path, mode, reason):
    log = tmp_path / "starts.log"
    started = time.monotonic()
    outcome = run_fake(monkeypatch, {"fail": {"rank": 1, "mode": mode}, "sleep": 3600, "log": str(log)})
    assert time.monotonic() - started < 30
    assert outcome.status == "error"
    assert outcome.message.startswith("rank 1: ") and reason in outcome.message
    assert [r.message for r in outcome.ranks if r.rank != 1] == ["stopped by the watchdog after rank 1 failed"] * 2
    assert_all_gone(log)


def test_an_oom_on_one_rank_makes_the_trial_an_oom_not_an_error(monkeypatch):
    outcome = run_fake(monkeypatch, {"oom_above": 1}, gpus=2)
    assert outcome.status == "oom" and "out of memory" in outcome.message


def test_a_hanging_rank_that_ignores_sigterm_is_killed_at_the_timeout(monkeypatch, tmp_path):
    monkeypatch.setattr(launcher, "KILL_GRACE_SECONDS", 1.0)
    log = tmp_path / "starts.log"
    started = time.monotonic()
    outcome = run_fake(monkeypatch, {"fail": {"rank": 2, "mode": "hang_ignoring_sigterm"}, "log": str(log)}, timeout=3)
    assert time.monotonic() - started < 30
    assert outcome.status == "error"
    assert outcome.ranks[2].message == "timed out after 3 s"
    assert [r.status for r in outcome.ranks[:2]] == ["ok", "ok"]
    assert_all_gone(log)


def test_a_rank_that_exits_cleanly_without_a_result_is_an_error(tmp_path):
    outcome = run_trial(spec(), 30, (sys.executable, "-c", "print('bye')"))
    assert outcome.status == "error" and outcome.message == "rank 0: exited without writing a result: bye"


def test_rank_logs_are_kept_when_a_log_dir_is_given(monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_TRIAL", json.dumps({"fail": {"rank": 0, "mode": "raise"}}))
    run_trial(spec(), 30, FAKE_TRIAL, log_dir=tmp_path / "logs")
    (log,) = (tmp_path / "logs").iterdir()
    assert "fake rank failure" in log.read_text()


def test_ranks_get_their_rank_and_a_shared_rendezvous(tmp_path):
    script = "import json,os,sys; print(json.dumps({k: os.environ[k] for k in ('RANK','LOCAL_RANK','WORLD_SIZE','MASTER_ADDR','MASTER_PORT')}))"
    run_trial(spec(gpus=2), 30, (sys.executable, "-c", script), log_dir=tmp_path)
    envs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.log"))]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "0", "2"), ("1", "1", "2")]
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] and envs[0]["MASTER_ADDR"] == "127.0.0.1"


def test_multi_node_trials_are_refused_with_one_line():
    with pytest.raises(FtplanError, match="2-node"):
        run_trial(spec(nodes=2), 30, FAKE_TRIAL)


def test_a_rank_failing_inside_a_gloo_group_does_not_leave_the_other_blocked_in_all_reduce():
    started = time.monotonic()
    outcome = run_trial(spec(gpus=2), 60, (sys.executable, str(Path(__file__).parent / "fixtures" / "gloo_trial.py")))
    assert time.monotonic() - started < 30
    assert outcome.status == "error"
    assert outcome.message.startswith("rank 1: exited with code 1: ")
    assert outcome.message.endswith("RuntimeError: rank 1 fails inside the process group")
    assert outcome.ranks[0].message == "stopped by the watchdog after rank 1 failed"


def test_a_rank_that_lost_its_peer_is_not_named_as_the_cause_when_both_ended_together():
    """gloo's error on the healthy rank is the echo of the peer's crash; the watchdog often sees both exits at once."""
    echo = launcher.RankOutcome(0, "error", "exited with code 1: RuntimeError: [../third_party/gloo/gloo/transport/"
                                            "tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234", {})
    cause = launcher.RankOutcome(1, "error", "exited with code 1: [rank1]: RuntimeError: rank 1 fails mid-step", {})
    assert launcher.TrialOutcome([echo, cause], 1.0).message == f"rank 1: {cause.message}"
