"""A full disk never leaves a torn record or a traceback: the append is all or nothing, and calibrate stops with one line."""

import errno
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from ftplan.core.errors import FtplanError
from ftplan.store.records import append_record, build_record, read_records
from ftplan.core.settings import Setting
from tests.helpers import run_ftplan

FAKE_TRIAL = (sys.executable, str(Path(__file__).parent / "fixtures" / "fake_trial.py"))
RECORD = build_record(Setting(model="tiny-llama", seq_len=64), 1, "ok", gpu_name="fake")


def fill_disk(monkeypatch, target: Path, first_write_bytes: int) -> None:
    """os.write to target writes first_write_bytes once, then fails with ENOSPC, as a filling disk does."""
    real_write = os.write
    calls = []

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") != str(target):
            return real_write(fd, data)
        calls.append(fd)
        if len(calls) == 1 and first_write_bytes:
            return real_write(fd, data[:first_write_bytes])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("first_write_bytes", [0, 10])
def test_a_short_or_failed_append_raises_one_line_and_leaves_the_file_as_it_was(tmp_path, monkeypatch, first_write_bytes):
    out = tmp_path / "c.jsonl"
    append_record(out, RECORD)
    before = out.read_bytes()
    fill_disk(monkeypatch, out, first_write_bytes)
    with pytest.raises(FtplanError, match="No space left on device") as raised:
        append_record(out, {**RECORD, "micro_batch": 2})
    assert "\n" not in str(raised.value)
    assert out.read_bytes() == before
    monkeypatch.undo()
    append_record(out, {**RECORD, "micro_batch": 2})  # space again: the next append lands on a clean line
    assert len(read_records([out])) == 2


def test_calibrate_on_a_full_disk_exits_non_zero_with_one_line_and_no_torn_record(tmp_path, monkeypatch, capsys):
    out = tmp_path / "c.jsonl"
    monkeypatch.setenv("FAKE_TRIAL", json.dumps({}))
    fill_disk(monkeypatch, out, 25)
    code, _out, err = run_ftplan(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64",
                                  "--max-batch", "2", "--machine", "box", "--out", out], capsys, monkeypatch, trial_command=FAKE_TRIAL)
    assert code != 0
    assert err.strip().count("\n") == 0 and "No space left on device" in err, err
    assert "Traceback" not in err
    assert out.read_bytes() == b""


def test_calibrate_checks_free_space_before_a_trial_runs_and_names_the_folder(tmp_path, monkeypatch, capsys):
    out, log = tmp_path / "c.jsonl", tmp_path / "trials.log"
    monkeypatch.setenv("FAKE_TRIAL", json.dumps({"log": str(log)}))
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=4096) if Path(path) == tmp_path
                        else real(path))
    code, _out, err = run_ftplan(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64",
                                  "--max-batch", "2", "--machine", "box", "--out", out], capsys, monkeypatch, trial_command=FAKE_TRIAL)
    assert code != 0 and err.strip().count("\n") == 0, err
    assert f"only 4,096 bytes free at {tmp_path}" in err
    assert not log.exists()  # no trial started
