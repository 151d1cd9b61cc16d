"""The signed cache files: a write that fails (a full disk) leaves no temporary file behind to keep it full."""

from __future__ import annotations

import json

import pytest

from ftplan.store import signed_files


def test_a_failed_write_removes_its_temporary_file_and_a_good_one_reads_back(tmp_path, monkeypatch):
    target = tmp_path / "entry.json"
    signed_files.write_signed(target, {"a": 1})
    assert signed_files.read_signed(target, 2**20) == {"a": 1}

    def full_disk(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", full_disk)
    signed_files.write_signed(tmp_path / "other.json", {"b": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.json", signed_files.KEY_FILE]


@pytest.mark.parametrize("tampered", ['{"payload": {"a": 2}, "digest": "00"}', "{torn", ""])
def test_an_edited_or_torn_file_reads_as_absent(tmp_path, tampered):
    target = tmp_path / "entry.json"
    signed_files.write_signed(target, {"a": 1})
    target.write_text(tampered)
    assert signed_files.read_signed(target, 2**20) is None
