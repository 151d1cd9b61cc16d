"""Hostile calibration files: every bad line is a warning naming file:line (escaped), the rest is read,
memory stays bounded, and warnings are summarised; never a traceback."""

from __future__ import annotations

import json
import tracemalloc
import warnings

import pytest

from ftplan.core.errors import FtplanError
from ftplan.core.paths import calibrations_dir
from ftplan.store.records import MAX_LINE_BYTES, WARNINGS_PER_FILE, RecordWarning, read_records
from tests.helpers import run_ftplan

GOOD, OTHER = (calibrations_dir() / "h200.jsonl").read_text().splitlines()[:2]
NETWORK = {"schema_version": 1, "kind": "network", "backend": "nccl", "ranks": 8, "nodes": 1,
           "latency_s": 1e-5, "bandwidth_gbs": 150.0}


def changed(**changes) -> str:
    return json.dumps({**json.loads(GOOD), **changes})


HOSTILE = {
    "deep nesting": ("[" * 100_000, "nested too deeply"),
    "5000-digit integer": ('{"micro_batch": ' + "9" * 5000 + "}", "corrupt or truncated"),
    "huge peak": (changed(peak_reserved_bytes=1e30), "peak_reserved_bytes is 1e+30, above"),
    "huge integer batch": (changed(micro_batch=10**30), "micro_batch is 1000000000000000000000000000000, above"),
    "float batch": (changed(micro_batch=1e30), "micro_batch is 1e+30, not an integer"),
    "negative seq_len": (changed(seq_len=-64), "sequence length must be positive"),
    "negative step time": (changed(step_seconds=[0.1, -0.2]), "negative step_seconds"),
    "trial time as text": (changed(trial_seconds="abc"), "trial_seconds is 'abc', not a number"),  # a plan's headline
    "steps as text": (changed(steps_measured="x"), "steps_measured is 'x', not an integer"),
}

HOSTILE_NETWORK = {
    "bandwidth as text": ({"bandwidth_gbs": "fast"}, "bandwidth_gbs is 'fast', not a number"),
    "zero bandwidth": ({"bandwidth_gbs": 0}, "bandwidth_gbs must be between 1e-06 and 1e+07, got 0"),
    "bandwidth of no link": ({"bandwidth_gbs": 1e-300}, "bandwidth_gbs must be between 1e-06 and 1e+07"),
    "negative latency": ({"latency_s": -1.0}, "latency_s must be between 0 and 1 s, got -1.0"),
    "latency of no link": ({"latency_s": 1e300}, "latency_s must be between 0 and 1 s"),  # 300-digit ETAs
    "ranks as text": ({"ranks": "eight"}, "ranks is 'eight', not an integer"),
    "timestamp as a number": ({"timestamp": 5}, "timestamp is 5, not text"),  # sorted beside text: a TypeError
}


def read_with_warnings(path, kind="trial") -> tuple[list[dict], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records([path], kind)
    return records, [str(w.message) for w in caught if issubclass(w.category, RecordWarning)]


def assert_line_two_is_skipped(folder, bad: str, words: str) -> None:
    """A bad line between two good ones: the good ones read, one warning naming file:2 with these words."""
    path = folder / "c.jsonl"
    path.write_text("\n".join([GOOD, bad, OTHER]) + "\n")
    records, messages = read_with_warnings(path)
    assert len(records) == 2
    assert len(messages) == 1 and messages[0].startswith(f"{path}:2: ") and words in messages[0], messages


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_trial_line_is_a_warning_naming_file_and_line(tmp_path, name):
    assert_line_two_is_skipped(tmp_path, *HOSTILE[name])


@pytest.mark.parametrize("name", HOSTILE_NETWORK)
def test_a_hostile_network_record_is_a_warning_not_a_type_error_in_every_plan(tmp_path, name):
    changes, words = HOSTILE_NETWORK[name]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([json.dumps(NETWORK), json.dumps({**NETWORK, **changes})]) + "\n")
    records, messages = read_with_warnings(path, "network")
    assert len(records) == 1
    assert len(messages) == 1 and messages[0].startswith(f"{path}:2: ") and words in messages[0], messages


def test_a_line_longer_than_the_limit_is_skipped_without_being_held_in_memory(tmp_path):
    path = tmp_path / "junk.jsonl"
    with path.open("wb") as f:
        f.write(GOOD.encode() + b"\n")
        for _ in range(16):
            f.write(b"x" * MAX_LINE_BYTES)
        f.write(b"\n" + OTHER.encode() + b"\n")
    tracemalloc.start()
    try:
        records, messages = read_with_warnings(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(records) == 2
    assert messages == [f"{path}:2: line longer than {MAX_LINE_BYTES // 2**20} MiB; record skipped"]
    assert peak < 4 * MAX_LINE_BYTES


def test_warnings_are_summarised_after_a_few_per_file(tmp_path):
    path = tmp_path / "junk.jsonl"
    path.write_text("".join(f"junk {i}\n" for i in range(1000)) + GOOD + "\n")
    records, messages = read_with_warnings(path)
    assert len(records) == 1
    assert len(messages) == WARNINGS_PER_FILE + 1
    assert messages[-1] == f"{path}: ... and {1000 - WARNINGS_PER_FILE} more bad lines skipped"


def test_a_device_such_as_dev_zero_is_refused_in_one_line():
    with pytest.raises(FtplanError, match="/dev/zero is not a regular file"):
        read_records(["/dev/zero"])


def test_control_and_bidi_characters_from_a_file_are_escaped_in_warnings(tmp_path):
    path = tmp_path / "c\u202e\x01.jsonl"
    path.write_text(changed(status="\u202eko\x00") + "\n")
    _records, messages = read_with_warnings(path)
    assert len(messages) == 1
    assert "\u202e" not in messages[0] and "\x00" not in messages[0] and "\x01" not in messages[0]
    assert "\\u202e" in messages[0]


def test_the_cli_escapes_control_and_bidi_characters_in_every_warning(tmp_path, capsys, monkeypatch):
    path = tmp_path / "c.jsonl"
    path.write_text(changed(gpu_name="H200\u202e\x00evil") + "\n")  # one record: the fit warns, naming its GPU
    _code, _out, err = run_ftplan(["fit", "--out", tmp_path / "fits.json", path], capsys, monkeypatch)
    assert "evil" in err
    assert "\u202e" not in err and "\x00" not in err
    assert "H200\\u202e\\x00evil" in err


def test_a_record_saved_as_latin_1_is_named_as_not_utf8_not_as_torn(tmp_path):
    path = tmp_path / "c.jsonl"
    edited = json.dumps({**json.loads(GOOD), "micro_batch": 977, "machine": "Büro"}, ensure_ascii=False)
    assert read_with_warnings(_written(tmp_path / "utf8.jsonl", edited.encode()))[0]  # valid, saved as UTF-8
    path.write_bytes(b"\n".join([GOOD.encode(), edited.encode("latin-1"), OTHER.encode()]) + b"\n")
    records, messages = read_with_warnings(path)
    assert len(records) == 2
    assert messages == [f"{path}:2: not UTF-8 text (save the file as UTF-8); record skipped"]


def _written(path, content: bytes):
    path.write_bytes(content + b"\n")
    return path


def test_a_byte_order_mark_an_editor_saved_is_read_past(tmp_path):
    """The first record of a file saved with a BOM was 'corrupt or truncated', and calibrate re-ran its trial."""
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n" + OTHER.encode() + b"\n")
    records, messages = read_with_warnings(path)
    assert len(records) == 2 and messages == []
