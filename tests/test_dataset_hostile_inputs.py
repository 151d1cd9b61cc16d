"""plan --dataset on hostile or broken inputs: one line or a warning naming the line, never a traceback, a hang
or unbounded memory (an array line, chats nested 500 deep, odd dataset_dict.json splits, a FIFO, /dev/zero,
a gzip that decompresses without end)."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from ftplan.core.errors import FtplanError
from ftplan.planner import dataset
from ftplan.planner.dataset import load_lengths
from tests.helpers import within


def jsonl(tmp_path, *lines: str, name="train.jsonl"):
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_bad_lines_are_skipped_with_a_warning_naming_each_line(tmp_path):
    path = jsonl(tmp_path, '{"text": "abcd"}', "[1, 2]", "{torn", "", '{"text": "abcdefgh"}')
    with pytest.warns(UserWarning) as caught:
        lengths = load_lengths(path)
    assert list(lengths.lengths) == [1, 2]
    messages = [str(w.message) for w in caught]
    assert f"{path}:2: a JSON list, not an object; line skipped" in messages
    assert f"{path}:3: not JSON (a torn or corrupt line); line skipped" in messages


def test_a_line_saved_as_latin_1_is_named_as_such_not_as_torn(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes('{"text": "abcd"}\n{"text": "Grüße"}\n'.encode("latin-1"))
    with pytest.warns(UserWarning) as caught:
        assert list(load_lengths(path).lengths) == [1]
    assert f"{path}:2: not UTF-8 text (save the file as UTF-8); line skipped" in [str(w.message) for w in caught]


def test_bad_lines_past_the_limit_are_counted_in_one_warning(tmp_path):
    path = jsonl(tmp_path, '{"text": "abcd"}', *["[]"] * (dataset.BAD_LINE_WARNINGS + 5))
    with pytest.warns(UserWarning) as caught:
        load_lengths(path)
    assert len(caught) == dataset.BAD_LINE_WARNINGS + 1 and "... and 5 more bad lines skipped" in str(caught[-1].message)


def test_an_error_in_a_row_names_its_line_not_a_byte_offset(tmp_path):
    path = jsonl(tmp_path, '{"text": "abcd"}', "", "[]", '{"text": 5}')
    with pytest.warns(UserWarning), pytest.raises(FtplanError, match="e.g. line 4;"):
        load_lengths(path)


def test_messages_nested_500_deep_are_counted_not_a_recursion_error(tmp_path):
    nested = "[" * 500 + '"x"' + "]" * 500
    path = jsonl(tmp_path, f'{{"messages": [{{"role": "user", "content": {nested}}}]}}', '{"messages": [{"content": "hi"}]}')
    assert len(load_lengths(path).lengths) == 2


@pytest.mark.parametrize("splits", ['{"splits": {"train": 1}}', '{"splits": 7}', '{"splits": ["."]}', '{"splits": [".."]}',
                                    '{"splits": ["a/b"]}'])
def test_odd_dataset_dict_splits_are_one_line(tmp_path, splits):
    (tmp_path / "dataset_dict.json").write_text(splits)
    with pytest.raises(FtplanError, match="split"):
        load_lengths(tmp_path)


def test_a_split_folder_holding_another_dataset_dict_is_refused(tmp_path):
    (tmp_path / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(FtplanError, match="another dataset_dict.json"):
        load_lengths(tmp_path)


def test_a_fifo_and_dev_zero_are_refused_at_once(tmp_path):
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    with within(10):
        for path in (fifo, link):
            with pytest.raises(FtplanError, match="not a regular file"):
                load_lengths(path)


def test_a_gzip_that_decompresses_past_the_limit_is_refused_while_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset, "MAX_DATASET_BYTES", 2**20)
    path = tmp_path / "train.jsonl.gz"
    line = (json.dumps({"text": "a" * 1000}) + "\n").encode()
    with gzip.open(path, "wb") as stream:
        stream.write(line * 2000)  # 2 MB of text in a few kB of gzip
    assert path.stat().st_size < 2**16
    with pytest.raises(FtplanError, match="plan from a sample"):
        load_lengths(path)


def test_millions_of_short_rows_are_refused_before_memory_runs_away(tmp_path, monkeypatch):
    """14 million short JSON lines (322 MB) took 5.5 GB as rows, one JSON document of them 4.3 GB."""
    monkeypatch.setattr(dataset, "MAX_DATASET_ROWS", 1000)
    monkeypatch.setattr(dataset, "MAX_JSON_DOCUMENT_BYTES", 20_000)
    row = json.dumps({"text": "hello world"})
    lines = tmp_path / "many.jsonl"
    lines.write_text((row + "\n") * 1001)
    with pytest.raises(FtplanError, match="over 1,000 rows; plan from a random sample"):
        dataset.load_lengths(lines)
    document = tmp_path / "many.json"
    document.write_text("[" + ",".join([row] * 1001) + "]")
    with pytest.raises(FtplanError, match="of one JSON document, which is parsed whole; write it as JSON Lines"):
        dataset.load_lengths(document)
    lines.write_text((row + "\n") * 1000)
    assert len(dataset.load_lengths(lines).lengths) == 1000  # at the limit, read in full
