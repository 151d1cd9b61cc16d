"""Reading token lengths from local dataset files: formats, fields, a local tokenizer, the labelled estimate."""

from __future__ import annotations

import json

import pytest

from ftplan.core.errors import FtplanError
from ftplan.planner.dataset import load_lengths


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_text_without_a_tokenizer_is_an_estimate_that_says_so(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"text": "a" * 8}, {"text": "b" * 9}, {"text": "c"}])
    result = load_lengths(data)
    assert result.lengths.tolist() == [2, 3, 1]  # ceil(chars / 4)
    assert result.estimated and "ESTIMATE" in result.method and result.field == "text"


def test_stored_ids_are_counted_exactly_from_csv(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text('input_ids,label\n"[1, 2, 3]",x\n"[4]",y\n')
    result = load_lengths(data)
    assert result.lengths.tolist() == [3, 1] and not result.estimated


def test_named_fields_and_chat_messages(tmp_path):
    chat = [{"role": "user", "content": "abcd"}, {"role": "assistant", "content": "efgh"}]
    data = _jsonl(tmp_path / "d.jsonl", [{"body": "x" * 40, "messages": chat}])
    assert load_lengths(data, text_field="body").lengths.tolist() == [10]
    assert load_lengths(data, text_field="messages").lengths.tolist() == [3]  # "abcd\nefgh": 9 chars
    with pytest.raises(FtplanError, match="no field 'nope'"):
        load_lengths(data, text_field="nope")


def test_local_tokenizer_counts_tokens(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    tokenizer = tokenizers.Tokenizer(WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    folder = tmp_path / "tok"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    data = _jsonl(tmp_path / "d.jsonl", [{"text": "hello world"}, {"text": "hello there big world"}])
    for where in (folder, folder / "tokenizer.json"):
        result = load_lengths(data, tokenizer=where)
        assert result.lengths.tolist() == [2, 4] and not result.estimated
    with pytest.raises(FtplanError, match="no tokenizer.json"):
        load_lengths(data, tokenizer=tmp_path)


def test_missing_and_unknown_files_fail_in_one_line(tmp_path):
    with pytest.raises(FtplanError, match="does not exist"):
        load_lengths(tmp_path / "none.jsonl")
    (tmp_path / "d.xml").write_text("<a/>")
    with pytest.raises(FtplanError, match="unknown dataset format"):
        load_lengths(tmp_path / "d.xml")
    with pytest.raises(FtplanError, match="no text or input_ids"):
        load_lengths(_jsonl(tmp_path / "e.jsonl", [{"other": 1}]))


def test_parquet_and_save_to_disk_folder(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    table = pa.table({"input_ids": [[1, 2], [3, 4, 5]]})
    pq.write_table(table, tmp_path / "d.parquet")
    assert load_lengths(tmp_path / "d.parquet").lengths.tolist() == [2, 3]
    folder = tmp_path / "saved"
    folder.mkdir()
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    assert load_lengths(folder).lengths.tolist() == [2, 3]
