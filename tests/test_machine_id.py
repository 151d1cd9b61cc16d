"""The resume key survives a new host name (a restarted container): the output file pins its machine id,
and `ftplan calibrate` and the Trainer callback find their default file through one definition."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

from ftplan.calibration import measure
from ftplan.store.records import read_records
from tests.helpers import run_ftplan

FAKE_TRIAL = (sys.executable, str(Path(__file__).parent / "fixtures" / "fake_trial.py"))
ARGS = ["calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--max-batch", "4"]


def calibrate_on(host: str, args: list, starts: Path, capsys, monkeypatch) -> list[str]:
    """Run calibrate as if on a host of this name; the trials it started."""
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    monkeypatch.setenv("FAKE_TRIAL", json.dumps({"log": str(starts)}))
    starts.write_text("")
    code, _out, err = run_ftplan([*ARGS, *args], capsys, monkeypatch, trial_command=FAKE_TRIAL)
    assert code == 0, err
    return starts.read_text().splitlines()


def test_a_new_host_name_resumes_the_same_file_without_re_running_any_trial(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FTPLAN_MACHINE_ID", raising=False)
    out, starts = tmp_path / "c.jsonl", tmp_path / "starts.log"
    assert len(calibrate_on("host-a", ["--out", out], starts, capsys, monkeypatch)) == 3
    assert calibrate_on("host-b", ["--out", out], starts, capsys, monkeypatch) == []
    assert {r["machine_id"] for r in read_records([out])} == {"host-a"}


def test_calibrate_and_the_callback_share_one_default_file_honouring_ftplan_machine_id(tmp_path, capsys, monkeypatch):
    from ftplan.calibration.callback import default_out

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FTPLAN_MACHINE_ID", "box-7")
    calibrate_on("host-a", [], tmp_path / "starts.log", capsys, monkeypatch)
    assert default_out() == measure.default_records_path() == Path("calibrations") / "box-7.jsonl"
    assert {r["machine_id"] for r in read_records([default_out()])} == {"box-7"}


def test_a_machine_id_holding_a_path_stays_one_file_name_in_the_calibrations_folder(monkeypatch):
    monkeypatch.setenv("FTPLAN_MACHINE_ID", "../../etc/cron.d/x")
    path = measure.default_records_path()
    assert path.parent == Path("calibrations") and ".." not in path.parts and path.name.endswith(".jsonl")
