"""`--out` of calibrate (and the callback, and calibrate-network) appends only to a calibration store:
never to a user's own file, never through a symlink (as root that reaches any file), never to a FIFO."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ftplan.core.errors import FtplanError
from ftplan.store.records import append_record
from tests.helpers import within
from tests.test_calibrate_cli import calibrate

RECORD = {"schema_version": 1, "kind": "network", "backend": "gloo", "ranks": 2, "latency_s": 1e-5, "bandwidth_gbs": 1.0}


def test_calibrate_refuses_a_users_dataset_and_leaves_it_as_it_was(fake_trial, tmp_path):
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({"text": f"sample {i}"}) + "\n" for i in range(50)))
    before = dataset.read_bytes()
    fake_trial()
    result = calibrate(dataset, "--batch-sizes", "1")
    assert result.exit_code != 0 and "holds no ftplan record" in str(result.exception)
    assert dataset.read_bytes() == before


def test_calibrate_refuses_a_symlink_and_leaves_its_target_untouched(fake_trial, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("")  # empty: as a store it would be taken, through the link it must not be
    link = tmp_path / "c.jsonl"
    link.symlink_to(target)
    fake_trial()
    result = calibrate(link, "--batch-sizes", "1")
    assert result.exit_code != 0 and "symlink" in str(result.exception)
    assert target.read_text() == ""


def test_calibrate_out_dev_stdout_is_refused_at_once_and_runs_no_trial(fake_trial, tmp_path):
    started = tmp_path / "started.log"
    fake_trial(log=str(started))
    with within(30):
        result = calibrate(Path("/dev/stdout"), "--batch-sizes", "1")
    assert result.exit_code != 0 and "symlink" in str(result.exception)
    assert not started.exists()


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "c.jsonl"
    os.mkfifo(fifo)
    with within(10), pytest.raises(FtplanError, match="not a regular file"):
        append_record(fifo, RECORD)


def test_a_store_whose_first_line_was_torn_by_a_kill_is_still_appended_to(tmp_path):
    out = tmp_path / "c.jsonl"
    whole = json.dumps(RECORD) + "\n"
    out.write_text(whole[:10] + "\n" + whole)
    append_record(out, {**RECORD, "ranks": 4})
    assert out.read_text().count("\n") == 3
