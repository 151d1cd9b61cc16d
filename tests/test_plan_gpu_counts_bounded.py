"""A scaling plan is a setup search per GPU count (about a second each): 200 listed counts ran over 300 s in
silence. The number of counts is capped with a one-line error, and each search is announced as it starts."""

from __future__ import annotations

from tests.helpers import run_ftplan, within

PLAN = ["plan", "--model", "llama-3.2-1b", "--dataset-size", "100000", "--gpu", "H200"]


def test_more_gpu_counts_than_the_cap_are_refused_at_once_in_one_line(capsys, monkeypatch):
    with within(30):
        code, _out, err = run_ftplan([*PLAN, "--gpus", ",".join(map(str, range(1, 201)))], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and "more than 32 GPU counts given" in err, err


def test_a_range_to_a_400_digit_count_is_refused_in_one_line_without_overflow(capsys, monkeypatch):
    with within(30):
        code, _out, err = run_ftplan([*PLAN, "--gpus", "1.." + "9" * 400], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and "cannot read GPU count" in err, err


def test_each_counts_search_is_announced_on_stderr_as_it_starts(capsys, monkeypatch):
    code, out, err = run_ftplan([*PLAN, "--gpus", "2,4"], capsys, monkeypatch)
    assert code == 0, err
    announced = [line for line in err.splitlines() if line.startswith("planning at")]
    assert announced == ["planning at 1 GPU (1 of 3 counts)", "planning at 2 GPUs (2 of 3 counts)",
                         "planning at 4 GPUs (3 of 3 counts)"]
    assert "planning at" not in out
