"""Token lengths cached by content: the same data is counted once, changed data or options again, and a cache
file that was tampered with is never trusted."""

from __future__ import annotations

import json

import pytest

from ftplan.planner import dataset
from ftplan.planner.dataset import load_lengths


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """A cache of this test's own, and the number of times the dataset was really read."""
    monkeypatch.setenv("FTPLAN_CACHE_DIR", str(tmp_path / "cache"))
    reads = []
    count = dataset._count_lengths

    def counting(*args):
        reads.append(args[0])
        return count(*args)

    monkeypatch.setattr(dataset, "_count_lengths", counting)
    return reads


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_the_same_content_is_counted_once_even_under_another_name(tmp_path, counted):
    first = load_lengths(_jsonl(tmp_path / "a.jsonl", ["a" * 8, "b" * 9]))
    again = load_lengths(_jsonl(tmp_path / "b.jsonl", ["a" * 8, "b" * 9]))
    assert len(counted) == 1
    assert again.lengths.tolist() == first.lengths.tolist() == [2, 3] and again.lengths.dtype == first.lengths.dtype
    assert (again.field, again.method, again.estimated) == (first.field, first.method, first.estimated)
    assert again.path == tmp_path / "b.jsonl"


def test_changed_content_or_options_are_counted_again(tmp_path, counted):
    path = _jsonl(tmp_path / "a.jsonl", ["a" * 8])
    assert load_lengths(path).lengths.tolist() == [2]
    _jsonl(path, ["a" * 12])
    assert load_lengths(path).lengths.tolist() == [3]
    assert load_lengths(path, chars_per_token=2).lengths.tolist() == [6]
    assert len(counted) == 3


def test_a_file_that_warned_is_read_again_and_warns_again(tmp_path, counted):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "abcd"}\n[]\n')
    for _ in range(2):
        with pytest.warns(UserWarning, match="line skipped"):
            assert load_lengths(path).lengths.tolist() == [1]
    assert len(counted) == 2


def test_a_tampered_cache_file_is_counted_again(tmp_path, counted):
    path = _jsonl(tmp_path / "a.jsonl", ["a" * 8])
    load_lengths(path)
    [cache] = (tmp_path / "cache").glob("lengths-*.json")
    data = json.loads(cache.read_text())
    data["payload"]["lengths"] = [1000]
    cache.write_text(json.dumps(data))
    assert load_lengths(path).lengths.tolist() == [2] and len(counted) == 2
