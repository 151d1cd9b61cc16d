"""The fit cache is keyed on the content of every input of a fit, the architecture configs included (after a
config.json the records name is edited, the next plan refits), and a cache file it cannot trust is refitted:
one edited with its digest recomputed, one others could write, a FIFO, a device, a huge file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from ftplan.core.hardware import load_catalog
from ftplan.core.paths import architectures_dir
from ftplan.models.predictor import Predictor
from ftplan.store.fit_cache import MAX_CACHE_BYTES, cache_key, cached_predictor
from tests.helpers import SETTING, synthetic_records, within


def test_editing_a_recorded_models_config_changes_the_cache_key(tmp_path):
    config = tmp_path / "my-model" / "config.json"
    config.parent.mkdir()
    shutil.copy(architectures_dir() / "qwen2.5-0.5b.json", config)
    records = synthetic_records([1, 2, 4], setting=SETTING.with_(model=str(config)))
    before = cache_key(records, load_catalog())
    assert cache_key(records, load_catalog()) == before  # a key, not a timestamp

    edited = json.loads(config.read_text())
    edited["num_hidden_layers"] *= 4
    config.write_text(json.dumps(edited))
    assert cache_key(records, load_catalog()) != before


@pytest.mark.parametrize("plant", ["fifo", "dev-zero", "huge"])
def test_a_cache_file_that_is_a_fifo_a_device_or_huge_is_refitted_at_once(tmp_path, monkeypatch, plant):
    monkeypatch.setenv("FTPLAN_CACHE_DIR", str(tmp_path))
    records = synthetic_records([1, 2, 4])
    path = tmp_path / f"predictor-{cache_key(records, load_catalog())}.json"
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        with path.open("wb") as handle:
            handle.truncate(MAX_CACHE_BYTES + 1)  # sparse: no disk used
    with within(20):
        predictor = cached_predictor(records, load_catalog())
    assert predictor.fits.fits


def stored_cache(tmp_path, monkeypatch):
    """(records, their cache file) after one plan stored its fit in tmp_path."""
    monkeypatch.setenv("FTPLAN_CACHE_DIR", str(tmp_path))
    records = synthetic_records([1, 2, 4])
    cached_predictor(records, load_catalog())
    return records, tmp_path / f"predictor-{cache_key(records, load_catalog())}.json"


def test_a_cache_edited_with_its_digest_recomputed_is_refitted_not_trusted(tmp_path, monkeypatch):
    records, path = stored_cache(tmp_path, monkeypatch)
    data = json.loads(path.read_text())
    for constants in data["payload"]["constants"].values():
        constants["memory_margin"] = 0.0  # the tamperer's aim: every plan's upper bound at its mean
    data["digest"] = hashlib.sha256(json.dumps(data["payload"], sort_keys=True).encode()).hexdigest()
    path.write_text(json.dumps(data))

    constants = cached_predictor(records, load_catalog()).constants
    assert constants and all(c.memory_margin > 0 for c in constants.values())


def test_a_cache_file_others_could_write_is_refitted(tmp_path, monkeypatch):
    records, path = stored_cache(tmp_path, monkeypatch)
    path.chmod(0o666)
    fitted, fit = [], Predictor.fit
    monkeypatch.setattr(Predictor, "fit", lambda *args: fitted.append(args) or fit(*args))
    cached_predictor(records, load_catalog())
    assert len(fitted) == 1
