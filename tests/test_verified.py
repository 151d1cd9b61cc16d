"""A planned batch is "verified" only when `ftplan rehearse` ran its own emitted folder safely; rehearsals
never enter a fit."""

from __future__ import annotations

import json

from ftplan.core.architecture import cached_architecture, load_architecture
from ftplan.core.paths import calibrations_dir
from ftplan.core.units import GIB
from ftplan.planner.emit import PLAN_JSON
from ftplan.planner.rehearse import Rehearsal, record_of
from ftplan.store.records import append_record
from tests.helpers import run_ftplan

PLAN = ["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset-size", "1000", "--full", "--json"]


def _plan(capsys, monkeypatch, *args) -> dict:
    code, out, err = run_ftplan([*PLAN, *args], capsys, monkeypatch)
    assert code == 0, err
    return json.loads(out)


def _rehearsed(tmp_path, capsys, monkeypatch, reserved_share: float, micro_shift: int = 0):
    """Emit the recommendation, store one rehearsal of it at reserved_share of the usable memory."""
    folder = tmp_path / "configs"
    _plan(capsys, monkeypatch, "--emit", folder)
    numbers = json.loads((folder / PLAN_JSON).read_text())
    result = {"peak_allocated_bytes": int(numbers["usable_bytes"] * reserved_share * 0.95),
              "peak_reserved_bytes": int(numbers["usable_bytes"] * reserved_share), "gpu_name": "NVIDIA H200",
              "step_seconds": [1.0] * 20, "heavy_steps": 4}
    run = Rehearsal(numbers["micro_batch"] + micro_shift, numbers["accumulation"], "ok", "", result,
                    numbers["usable_bytes"])
    store = tmp_path / "rehearsals.jsonl"
    append_record(store, record_of(numbers, run, "0" * 64, 30.0, folder.name))
    return numbers, ["--calibrations", calibrations_dir(), "--calibrations", store]


def _recommended(plan: dict) -> dict:
    return next(s for s in plan["ranked"] if s["label"] == plan["recommendation"]["label"])


def test_a_safe_rehearsal_of_the_emitted_folder_labels_its_batch_verified(tmp_path, capsys, monkeypatch):
    before = _recommended(_plan(capsys, monkeypatch))
    numbers, inputs = _rehearsed(tmp_path, capsys, monkeypatch, reserved_share=0.9)
    after = _recommended(_plan(capsys, monkeypatch, *inputs))
    assert before["prediction"]["source"] != "verified"
    assert after["label"] == before["label"] and after["prediction"]["source"] == "verified"
    # the rehearsal informs the label only: the fit (and so the predicted peak) is the same
    assert after["prediction"]["peak_reserved_gib"] == before["prediction"]["peak_reserved_gib"]
    assert after["largest_safe_batch"] == numbers["micro_batch"]
    code, out, _ = run_ftplan([a for a in PLAN if a != "--json"] + [str(a) for a in inputs], capsys, monkeypatch)
    assert "verified" in out


def test_a_rehearsal_over_the_budget_or_at_another_batch_verifies_nothing(tmp_path, capsys, monkeypatch):
    _, inputs = _rehearsed(tmp_path, capsys, monkeypatch, reserved_share=1.01)
    assert _recommended(_plan(capsys, monkeypatch, *inputs))["prediction"]["source"] != "verified"
    other = tmp_path / "other"
    other.mkdir()
    _, inputs = _rehearsed(other, capsys, monkeypatch, reserved_share=0.5, micro_shift=-1)
    assert _recommended(_plan(capsys, monkeypatch, *inputs))["prediction"]["source"] != "verified"


def test_usable_bytes_are_what_the_rehearsal_is_judged_against():
    run = Rehearsal(4, 1, "ok", "", {"peak_reserved_bytes": int(10 * GIB)}, int(9 * GIB))
    assert not run.safe and "over the budget" in run.verdict


def test_a_config_edited_after_its_rehearsal_is_not_verified(tmp_path, capsys, monkeypatch):
    """The rehearsal record named the model by its path only: an edited config.json (another intermediate size,
    vocabulary or head count) stayed 'verified'."""
    config = tmp_path / "mymodel" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(load_architecture("llama-3.2-1b").config))
    mine = [*PLAN[:2], str(config.parent), *PLAN[3:]]  # PLAN with the model's folder for its id
    folder = tmp_path / "configs"
    code, _, err = run_ftplan([*mine, "--emit", folder], capsys, monkeypatch)
    assert code == 0, err
    numbers = json.loads((folder / PLAN_JSON).read_text())
    result = {"peak_reserved_bytes": int(numbers["usable_bytes"] * 0.9), "gpu_name": "NVIDIA H200",
              "step_seconds": [1.0] * 20, "heavy_steps": 4}
    store = tmp_path / "rehearsals.jsonl"
    append_record(store, record_of(numbers, Rehearsal(numbers["micro_batch"], numbers["accumulation"], "ok", "",
                                                      result, numbers["usable_bytes"]), "0" * 64, 30.0, folder.name))

    def source() -> str:
        code, out, err = run_ftplan([*mine, "--calibrations", calibrations_dir(), "--calibrations", store],
                                    capsys, monkeypatch)
        assert code == 0, err
        return _recommended(json.loads(out))["prediction"]["source"]

    assert source() == "verified"
    config.write_text(json.dumps({**load_architecture("llama-3.2-1b").config, "intermediate_size": 8300}))
    cached_architecture.cache_clear()  # another process would read the file afresh
    assert source() != "verified"
