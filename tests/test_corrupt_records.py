"""Corrupt, truncated, foreign or mistyped calibration data: each bad line is named (file:line) and
skipped, the rest is still read, and the CLI fails with one line only when nothing usable remains."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from ftplan.core.errors import FtplanError
from ftplan.core.paths import calibrations_dir
from ftplan.store.records import RecordWarning, read_records
from ftplan.models.fitset import FitSet
from tests.helpers import run_ftplan

SHIPPED = calibrations_dir() / "h200.jsonl"
GOOD_LINES = SHIPPED.read_text().splitlines()
MODEL = json.loads(GOOD_LINES[0])["model"]


def _changed(**changes) -> str:
    return json.dumps({**json.loads(GOOD_LINES[0]), **changes})


def _without(*keys: str) -> str:
    return json.dumps({k: v for k, v in json.loads(GOOD_LINES[0]).items() if k not in keys})


# Each bad line, and the words its warning must hold.
BAD_LINES = {
    "truncated": (GOOD_LINES[0][: len(GOOD_LINES[0]) // 2], "corrupt or truncated"),
    "not json": ("hello world", "corrupt or truncated"),
    "binary": ("\x00\x01\x02\ufffd\x7f", "corrupt or truncated"),
    "json array": ("[1, 2, 3]", "not a JSON object"),
    "newer schema": (_changed(schema_version=99), "schema version 99 is newer"),
    "missing keys": (_without("micro_batch", "status"), "missing micro_batch, status"),
    "unknown status": (_changed(status="exploded"), "unknown status 'exploded'"),
    "batch as text": (_changed(micro_batch="two"), "micro_batch is 'two'"),
    "fractional batch": (_changed(micro_batch=2.5), "micro_batch is 2.5"),
    "zero batch": (_changed(micro_batch=0), "micro_batch must be positive"),
    "memory as text": (_changed(peak_allocated_bytes="lots"), "peak_allocated_bytes is 'lots'"),
    "negative memory": (_changed(peak_reserved_bytes=-5), "negative peak_reserved_bytes"),
    "gpus as text": (_changed(gpus="two"), "gpus is 'two'"),
    "impossible setting": (_changed(zero_stage=7), "ZeRO stage must be 0-3"),
    "boolean schema": (_changed(schema_version=True), "schema version True is not a positive integer"),
}


def _messages(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RecordWarning)]


@pytest.mark.parametrize("name", BAD_LINES)
def test_a_bad_line_between_good_ones_is_named_and_skipped_and_the_rest_read(tmp_path, name):
    bad, words = BAD_LINES[name]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([GOOD_LINES[0], bad, *GOOD_LINES[1:3]]) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records([path])
    assert [r["_source"] for r in records] == [f"{path}:1", f"{path}:3", f"{path}:4"]
    (message,) = _messages(caught)
    assert message.startswith(f"{path}:2: ") and words in message


def test_a_binary_file_is_skipped_line_by_line_never_decoded_whole(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(bytes(range(11, 256)) * 8 + b"\n" + GOOD_LINES[0].encode() + b"\n")
    with pytest.warns(RecordWarning, match=r"c\.jsonl:1: not UTF-8 text"):
        assert len(read_records([path])) == 1


def test_a_write_torn_inside_a_character_is_a_torn_record_not_a_wrong_encoding(tmp_path):
    path = tmp_path / "c.jsonl"
    line = GOOD_LINES[0].encode()
    torn = line[:-3] + "é".encode()[:1]
    path.write_bytes(torn + b"\n" + line + b"\n")
    with pytest.warns(RecordWarning, match=r"c\.jsonl:1: corrupt or truncated"):
        assert len(read_records([path])) == 1


def test_an_empty_file_reads_as_no_records_without_a_warning(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_records([path]) == []


@pytest.mark.parametrize("content", ["", "not json\n", "\x00\xff\xfe", '{"format": "ftplan-fits"}'])
def test_an_empty_garbage_or_foreign_fits_file_is_one_line_error_naming_it(tmp_path, content):
    path = tmp_path / "fits.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(FtplanError, match=str(path)) as raised:
        FitSet.load(path)
    assert "\n" not in str(raised.value)


def test_a_fits_file_whose_records_were_edited_is_refused(tmp_path, capsys, monkeypatch):
    fits_path = tmp_path / "fits.json"
    assert run_ftplan(["fit", SHIPPED, "--out", fits_path], capsys, monkeypatch)[0] == 0
    data = json.loads(fits_path.read_text())
    data["fits"][0]["records"][-1]["peak_allocated_bytes"] *= 3  # the fit no longer matches its evidence
    fits_path.write_text(json.dumps(data))
    with pytest.raises(FtplanError, match=f"{fits_path}.*does not match its records"):
        FitSet.load(fits_path)


CLI = {
    "fit": lambda path, tmp: ["fit", path, "--out", tmp / "fits.json"],
    "plan": lambda path, tmp: ["plan", "--model", MODEL, "--dataset-size", 1000, "--gpu", "H200", "--calibrations", path],
    "predict": lambda path, tmp: ["predict", "--model", MODEL, "--batch-size", 2, "--calibrations", path],
}


def _assert_no_traceback_and_warned(err: str, path: Path, lines: list[int]) -> None:
    assert "Traceback" not in err
    for line in lines:
        assert f"warning: {path}:{line}: " in err, err


@pytest.mark.parametrize("command", CLI)
def test_the_cli_warns_per_bad_line_and_still_uses_the_good_ones(tmp_path, capsys, monkeypatch, command):
    path = tmp_path / "mixed.jsonl"
    bad = [BAD_LINES[name][0] for name in ("truncated", "newer schema", "memory as text", "impossible setting")]
    path.write_text("\n".join([bad[0], *GOOD_LINES[:20], *bad[1:], *GOOD_LINES[20:]]) + "\n")
    code, _out, err = run_ftplan(CLI[command](path, tmp_path), capsys, monkeypatch)
    assert code == 0, err
    _assert_no_traceback_and_warned(err, path, [1, 22, 23, 24])
    assert not [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("command", CLI)
@pytest.mark.parametrize("content", [b"", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\n", b"garbage\n{\"a\": 1}\n"])
def test_the_cli_fails_with_one_line_when_nothing_usable_remains(tmp_path, capsys, monkeypatch, command, content):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    code, out, err = run_ftplan(CLI[command](path, tmp_path), capsys, monkeypatch)
    assert code == 2
    assert "Traceback" not in err and not out.strip()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0]
    assert all(line.startswith(("warning:", "error:")) for line in err.splitlines())
