"""predict, eta and plan judge memory by one budget: the card's PyTorch capacity less the margin, for predicted
bounds and measured peaks alike (a tester found predict comparing with the datasheet's 141 "GiB" while eta
said NOT safe, and plan recommending a batch that ran at 98.7% of the card)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_ftplan

LIGER_QWEN = ["--model", "qwen2.5-0.5b", "--gpu", "H200", "--liger", "--padding", "none"]  # the unmasked ladder


def _predict(batch: int, capsys, monkeypatch, *extra) -> dict:
    code, out, err = run_ftplan(["predict", *LIGER_QWEN, "--batch-size", batch, "--json", *extra], capsys, monkeypatch)
    result = json.loads(out)
    assert code == (0 if result["fits_in_memory"] else 3), err  # 3: the "does not fit" exit status
    return result


def _eta(batch: int, capsys, monkeypatch, *extra) -> dict:
    code, out, err = run_ftplan(["eta", *LIGER_QWEN, "--batch-size", batch, "--dataset-size", 10000, "--json", *extra],
                                capsys, monkeypatch)
    result = json.loads(out)
    assert code == (0 if result["fits"] else 3), err  # 3: the "does not fit" exit status
    return result


@pytest.mark.parametrize("batch", [8, 56])
def test_predict_and_eta_agree_on_whether_a_batch_fits(batch, capsys, monkeypatch):
    predicted, eta = _predict(batch, capsys, monkeypatch), _eta(batch, capsys, monkeypatch)
    assert predicted["fits_in_memory"] == eta["fits"]
    assert predicted["gpu_memory_gib"] == pytest.approx(139.8, abs=0.05)  # what PyTorch reports, not 141


def test_a_batch_that_ran_at_the_edge_of_the_card_needs_the_user_to_drop_the_margin(capsys, monkeypatch):
    # batch 56 ran with 138.0 of 139.8 GiB reserved (57 ran out of memory): inside the card, not inside 2% of it
    assert not _predict(56, capsys, monkeypatch)["fits_in_memory"]
    assert _predict(56, capsys, monkeypatch, "--safety-margin", 0)["fits_in_memory"]
    code, out, _ = run_ftplan(["eta", *LIGER_QWEN, "--batch-size", 56, "--dataset-size", 10000], capsys, monkeypatch)
    assert "NOT safe (this batch ran, but its measured peak leaves less free than the safety margin)" in " ".join(out.split())
    code, out, err = run_ftplan(["plan", "--model", "qwen2.5-0.5b", "--gpu", "H200", "--full", "--dataset-size", 10000,
                                 "--json"], capsys, monkeypatch)
    assert code == 0, err
    for setup in json.loads(out)["ranked"]:
        assert setup["prediction"]["peak_reserved_gib"]["mean"] <= 139.8 * 0.98, setup["label"]


def test_the_safety_margin_is_typed_as_its_help_shows_it(capsys, monkeypatch):
    """The help says [default: 2%], and '8%' was refused as not a float."""
    as_percent, as_fraction = _predict(8, capsys, monkeypatch, "--safety-margin", "8%"), \
        _predict(8, capsys, monkeypatch, "--safety-margin", "0.08")
    assert as_percent["usable_gib"] == as_fraction["usable_gib"] < _predict(8, capsys, monkeypatch)["usable_gib"]
