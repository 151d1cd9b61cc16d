"""A FIFO among the calibrations never hangs a plan: one in a folder is passed over, one named on the command
line without a writer reads as empty."""

from __future__ import annotations

import os

from ftplan.core.paths import calibrations_dir
from tests.helpers import run_ftplan, within

PLAN = ["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset-size", "1000"]


def test_a_fifo_in_the_calibrations_folder_does_not_hang_the_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calibrations").mkdir()
    os.mkfifo(tmp_path / "calibrations" / "stuck.jsonl")
    with within(60):
        code, _out, err = run_ftplan(PLAN, capsys, monkeypatch)
    assert code == 0, err


def test_a_fifo_in_a_calibrations_folder_named_on_the_command_line_does_not_hang_the_plan(tmp_path, capsys,
                                                                                        monkeypatch):
    folder = tmp_path / "mine"
    folder.mkdir()
    os.mkfifo(folder / "stuck.jsonl")
    with within(60):
        code, _out, err = run_ftplan([*PLAN, "--calibrations", calibrations_dir(), "--calibrations", folder],
                                     capsys, monkeypatch)
    assert code == 0, err


def test_a_fifo_named_with_no_writer_reads_as_empty(tmp_path, capsys, monkeypatch):
    fifo = tmp_path / "stuck.jsonl"
    os.mkfifo(fifo)
    with within(60):
        code, _out, err = run_ftplan([*PLAN, "--calibrations", calibrations_dir(), "--calibrations", fifo],
                                     capsys, monkeypatch)
    assert code == 0, err
