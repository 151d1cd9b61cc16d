"""Dataset files a new user brings: rows without text, TRL's prompt/completion and chat formats, bad ids,
corrupt save_to_disk indexes. Each is counted in full or refused in one line, never undercounted."""

from __future__ import annotations

import json
import warnings

import pytest

from ftplan.core.errors import FtplanError
from ftplan.planner.dataset import load_lengths


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_without_the_text_field_are_refused_with_a_count_and_a_line(tmp_path):
    rows = [{"text": "a" * 4000}, {"body": "b" * 40000}, {"text": None}, {"text": 7}]
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))
    with pytest.raises(FtplanError, match=r"3 of 4 rows have no text in 'text'.*e\.g\. line 3"):
        load_lengths(data)


def test_empty_text_counts_zero_tokens_with_one_warning(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"text": ""}, {"text": "a" * 40}, {"text": ""}])
    with pytest.warns(UserWarning, match="2 of 3 samples are empty") as caught:
        result = load_lengths(data)
    assert result.lengths.tolist() == [10] and len(caught) == 1


def test_empty_csv_cells_are_empty_text_not_missing_rows(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text('text,label\n"",x\nNA words here!,y\n')
    with pytest.warns(UserWarning, match="1 of 2 samples are empty"):
        assert load_lengths(data).lengths.tolist() == [4]  # 'NA words here!' is 14 characters, not a null


def test_prompt_and_completion_are_both_counted(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "p" * 400, "completion": "c" * 4000}])
    result = load_lengths(data)
    assert result.lengths.tolist() == [1100]
    assert "'prompt' + 'completion'" in result.method
    with pytest.raises(FtplanError, match=r"1 of 2 rows have no text in 'prompt' or 'completion'.*line 2"):
        load_lengths(_jsonl(tmp_path / "e.jsonl", [{"prompt": "p", "completion": "c"}, {"prompt": "p"}]))


def test_explicit_text_field_overrides_prompt_and_completion(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "p" * 400, "completion": "c" * 4000}])
    assert load_lengths(data, text_field="prompt").lengths.tolist() == [100]


def test_chat_messages_sum_every_turn_and_say_the_template_is_not_counted(tmp_path):
    chat = [{"role": "user", "content": "u" * 400}, {"role": "assistant", "content": "a" * 3999}]
    result = load_lengths(_jsonl(tmp_path / "d.jsonl", [{"messages": chat}]))
    assert result.lengths.tolist() == [1100]  # 400 + newline + 3999 characters
    assert "'messages'" in result.method and "chat template" in result.method


def test_chat_content_given_as_parts_and_sharegpt_values_are_counted(tmp_path):
    """OpenAI-style content parts ({"type": "text", "text": ...}) counted as empty: 1 token a
    sample. An image part adds nothing."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "u" * 400}, {"type": "image_url", "image_url": {}}]},
             {"role": "assistant", "content": [{"type": "text", "text": "a" * 3999}]}]
    sharegpt = [{"from": "human", "value": "u" * 400}, {"from": "gpt", "value": "a" * 3999}]
    assert load_lengths(_jsonl(tmp_path / "d.jsonl", [{"messages": parts}])).lengths.tolist() == [1100]
    assert load_lengths(_jsonl(tmp_path / "s.jsonl", [{"conversations": sharegpt}])).lengths.tolist() == [1100]


def test_the_arguments_of_an_assistants_tool_calls_are_counted(tmp_path):
    """A tool call's 800 characters of arguments counted as 2 tokens: only a turn's content was read."""
    call = {"type": "function", "function": {"name": "search", "arguments": json.dumps({"query": "q" * 800})}}
    chat = [{"role": "user", "content": "u" * 400}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    (length,) = load_lengths(_jsonl(tmp_path / "d.jsonl", [{"messages": chat}])).lengths.tolist()
    assert length >= (400 + 800) // 4


def test_nested_ids_and_a_list_of_numbers_for_a_chat_are_refused_not_counted(tmp_path):
    """[[1, 2], [3]] counted 2 tokens, and "messages": [1, 2] the text "1\\n2"."""
    nested = _jsonl(tmp_path / "ids.jsonl", [{"input_ids": [[1, 2], [3]]}])
    with pytest.raises(FtplanError, match=r"holds list \[\[1, 2\], \[3\]\] at line 1, not a list of token ids"):
        load_lengths(nested, ids_field="input_ids")
    numbers = _jsonl(tmp_path / "chat.jsonl", [{"messages": [1, 2]}])
    with pytest.raises(FtplanError, match="rows have no text in 'messages'"):
        load_lengths(numbers)


def test_ids_that_are_not_a_list_name_the_line(tmp_path):
    data = _jsonl(tmp_path / "d.jsonl", [{"input_ids": [1, 2, 3]}, {"input_ids": "abc"}])
    with pytest.raises(FtplanError, match=r"'input_ids' holds str 'abc' at line 2, not a list of token ids"):
        load_lengths(data, ids_field="input_ids")
    csv = tmp_path / "d.csv"
    csv.write_text('input_ids\n"[1, 2]"\n"[3,"\n')
    with pytest.raises(FtplanError, match="row 2, not a list"):
        load_lengths(csv)


@pytest.mark.parametrize("index", ["{not json", "[1, 2]", '{"_data_files": [{"name": "x"}]}', "\xff"])
def test_corrupt_save_to_disk_index_is_one_line(tmp_path, index):
    (tmp_path / "state.json").write_bytes(index.encode("latin-1"))
    with pytest.raises(FtplanError, match="state.json"):
        load_lengths(tmp_path)


def test_undecodable_dataset_csv_is_one_line(tmp_path):
    data = tmp_path / "d.csv"
    data.write_bytes(b"text\n\xff\xfe\x00garbage\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FtplanError, match="cannot read"):
            load_lengths(data)


ROWS = [{"text": "w" * (40 + 4 * i)} for i in range(50)]


@pytest.mark.parametrize("document", [ROWS, {"text": [r["text"] for r in ROWS]}, {"data": ROWS}],
                         ids=["rows", "columns", "one key holding the rows"])
@pytest.mark.parametrize("indent", [None, 2], ids=["one line", "indented"])
def test_a_json_document_is_read_as_json_dump_wrote_it_on_one_line_or_indented(tmp_path, document, indent):
    data = tmp_path / "d.json"
    data.write_text(json.dumps(document, indent=indent))  # pandas' JSON Lines reader once took 1 row or 50 columns
    assert load_lengths(data).lengths.tolist() == [10 + i for i in range(50)]


def test_a_json_file_of_one_object_a_line_is_json_lines_and_a_list_of_numbers_is_refused(tmp_path):
    assert load_lengths(_jsonl(tmp_path / "d.json", ROWS)).lengths.tolist() == [10 + i for i in range(50)]
    numbers = tmp_path / "n.json"
    numbers.write_text("[1, 2, 3]")
    with pytest.raises(FtplanError, match="not all objects"):
        load_lengths(numbers)


def test_a_json_file_of_one_chat_is_one_sample_not_one_per_turn(tmp_path):
    chat = {"messages": [{"role": "user", "content": "u" * 400}, {"role": "assistant", "content": "a" * 3999}]}
    data = tmp_path / "chat.json"
    data.write_text(json.dumps(chat))
    assert load_lengths(data).lengths.tolist() == [1100]  # as the same chat on a JSONL line
    data.write_text(json.dumps([chat, chat]))
    assert load_lengths(data).lengths.tolist() == [1100, 1100]
