"""Physically impossible calibration records (a trial that ran in no time, held no memory, or ran batches of
fewer than one sample) are skipped with a file:line warning, like every other bad record."""

from __future__ import annotations

import json

import pytest

from tests.test_hostile_records import (
    GOOD,
    assert_line_two_is_skipped,
    changed,
    read_with_warnings,
)

IMPOSSIBLE = {
    "zero step time": (changed(seconds_per_step=0), "seconds_per_step is 0 in a trial that ran"),
    "negative step time": (changed(seconds_per_step=-0.5), "negative seconds_per_step"),
    "zero peak reserved": (changed(peak_reserved_bytes=0), "peak_reserved_bytes is 0 in a trial that ran"),
    "zero peak allocated": (changed(peak_allocated_bytes=0.0), "peak_allocated_bytes is 0 in a trial that ran"),
    "negative peak": (changed(peak_reserved_bytes=-1), "negative peak_reserved_bytes"),
    "batch zero": (changed(micro_batch=0), "micro_batch must be positive"),
    "allocated above reserved": (changed(peak_allocated_bytes=2**40, peak_reserved_bytes=2**30),
                                 "peak_allocated_bytes 1099511627776 is above peak_reserved_bytes 1073741824"),
}


@pytest.mark.parametrize("name", IMPOSSIBLE)
def test_an_impossible_record_is_skipped_with_its_line(tmp_path, name):
    assert_line_two_is_skipped(tmp_path, *IMPOSSIBLE[name])


def test_an_oom_record_that_measured_nothing_is_kept(tmp_path):
    oom = {**json.loads(GOOD), "status": "oom", "seconds_per_step": None, "peak_reserved_bytes": None}
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(oom) + "\n")
    records, messages = read_with_warnings(path)
    assert len(records) == 1 and not messages


def test_a_long_error_message_is_cut_to_what_a_trial_keeps(tmp_path):
    """A hand-made 100 kB message hung plan for minutes in the terminal's highlighter."""
    from ftplan.store.records import MAX_MESSAGE_CHARS

    failed = {**json.loads(GOOD), "status": "error", "message": "x" * 100_000}
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(failed) + "\n")
    (record,), _ = read_with_warnings(path)
    assert len(record["message"]) <= MAX_MESSAGE_CHARS + 10 and record["message"].startswith("x" * 100)


def test_a_capacity_above_the_cards_datasheet_is_left_out_with_its_line(tmp_path, capsys, monkeypatch):
    """One record claiming 1 PiB on an H200 made every plan's usable memory 1,027,604 GiB."""
    from ftplan.core.paths import calibrations_dir
    from tests.helpers import run_ftplan

    shipped = (calibrations_dir() / "h200.jsonl").read_text().splitlines()
    record = next(json.loads(line) for line in shipped if '"model": "llama-3.2-1b"' in line)
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({**record, "gpu_memory_total_bytes": 2**50, "machine_id": "x"}) + "\n")
    code, out, err = run_ftplan(["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset-size", 1000,
                                 "--calibrations", calibrations_dir(), "--calibrations", path, "--json"],
                                capsys, monkeypatch)
    assert code == 0 and "x.jsonl:1: gpu_memory_total_bytes" in err and "more than H200 has" in err
    assert json.loads(out)["memory_budget"]["capacity_gib"] == pytest.approx(139.8, abs=0.05)
