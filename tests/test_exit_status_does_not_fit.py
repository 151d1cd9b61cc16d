""""Does not fit" is an answer, not bad input: plan, eta and predict exit 3 for it (2 stays bad input, 0 a plan that fits),
so a script can branch on the status."""

from __future__ import annotations

import json

import pytest

from ftplan.core.errors import EXIT_DOES_NOT_FIT
from tests.helpers import run_ftplan

PLAN = ["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset-size", "1000000"]
ETA = ["eta", "--model", "llama-3-8b", "--gpu", "RTX-3090", "--dataset-size", "1000"]
PREDICT = ["predict", "--model", "llama-3-8b", "--gpu", "RTX-3090"]


@pytest.mark.parametrize("args", [
    [*PLAN, "--max-hours", "0.001"],
    [*PLAN, "--max-hours", "0.001", "--json"],
    ["plan", "--model", "llama-3-8b", "--gpu", "RTX-3090", "--dataset-size", "1000", "--seq-len", "32768", "--full"],
    [*ETA, "--batch-size", "64"],
    [*ETA, "--batch-size", "64", "--json"],
    [*PREDICT, "--batch-size", "64"],
    [*PREDICT, "--batch-size", "64", "--json"],
], ids=["plan-max-hours", "plan-max-hours-json", "plan-card-too-small", "eta-not-safe", "eta-not-safe-json",
        "predict-not-safe", "predict-not-safe-json"])
def test_nothing_fitting_exits_3_after_saying_why(capsys, monkeypatch, args):
    code, out, err = run_ftplan(args, capsys, monkeypatch)
    assert code == EXIT_DOES_NOT_FIT == 3, err
    assert "Traceback" not in err and (out or err)
    if "--json" in args:
        json.loads(out)  # the answer is still printed whole


def test_a_plan_that_fits_exits_0_and_bad_input_2(capsys, monkeypatch):
    assert run_ftplan(PLAN, capsys, monkeypatch)[0] == 0
    assert run_ftplan(["predict", "--model", "llama-3.2-1b", "--batch-size", "1"], capsys, monkeypatch)[0] == 0
    assert run_ftplan([*PLAN, "--epochs", "-1"], capsys, monkeypatch)[0] == 2


@pytest.mark.parametrize("kind, offered", [(None, True), ("--lora", True), ("--full", False)])
def test_a_card_too_small_for_bf16_lora_points_to_qlora(capsys, monkeypatch, kind, offered):
    """Llama-3-8B on a 24 GB card: no bf16 setup fits, a 4-bit base does, and the error named every way out but
    that one (--full excludes LoRA, so it is not offered there)."""
    args = ["plan", "--model", "llama-3-8b", "--gpu", "RTX-3090", "--dataset-size", "1000", *([kind] if kind else [])]
    code, _out, err = run_ftplan(args, capsys, monkeypatch)
    assert code == 3 and ("--allow qlora" in err) == offered, err
    if offered:
        assert run_ftplan([*args, "--allow", "qlora"], capsys, monkeypatch)[0] == 0


def test_a_plan_with_nothing_within_max_hours_prints_no_empty_table(capsys, monkeypatch):
    """It printed a table of headers only, '0 of 0 setups that fit', and a warning pointing 'below the table' to
    lists printed above it."""
    code, out, _ = run_ftplan([*PLAN, "--max-hours", "0.001"], capsys, monkeypatch)
    said = " ".join(out.split())
    assert code == 3 and "no setup fits within --max-hours 0.001" in said and "Over --max-hours 0.001:" in said
    assert "s/step" not in said and "0 of 0" not in said and "below the table" not in said
