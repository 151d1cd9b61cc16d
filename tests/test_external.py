"""The loader of the public measurements: their CSVs become records in ftplan's contract."""

from __future__ import annotations

import warnings

import pytest

from benchmarks.external import DEFAULT_DIR, load_external
from ftplan.store.records import RecordWarning, append_record, read_records

pytestmark = pytest.mark.skipif(not DEFAULT_DIR.is_dir(), reason="public measurements not present")
MIB = 1024**2


def test_every_public_run_becomes_a_valid_record(tmp_path):
    records = load_external()
    path = tmp_path / "external.jsonl"
    for record in records:
        append_record(path, {k: v for k, v in record.items() if k != "_source"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordWarning)
        assert len(read_records([path])) == len(records) == 44


def test_eight_rank_run_keeps_every_rank_and_the_largest_peak():
    record = next(r for r in load_external() if r["model"] == "llama-3-8b" and r["micro_batch"] == 1)
    assert len(record["peak_allocated_bytes_per_gpu"]) == 8
    assert record["peak_allocated_bytes"] == 26571 * MIB  # the largest of the eight ranks
    assert record["seconds_per_step"] == pytest.approx(1 / 0.988, rel=1e-3)
    assert (record["gpu_name"], record["precision"], record["zero_stage"]) == ("A100-80GB", "fp16", 3)


def test_out_of_memory_runs_are_oom_records():
    ooms = sorted((r["model"], r["micro_batch"]) for r in load_external() if r["status"] == "oom")
    assert ooms == [("llama-3-8b", 13), ("qwen1.5-0.5b", 3), ("qwen1.5-0.5b", 4), ("qwen1.5-0.5b", 4),
                    ("qwen1.5-0.5b", 6)]


def test_absent_folder_gives_no_records(tmp_path):
    assert load_external(tmp_path / "absent") == []
