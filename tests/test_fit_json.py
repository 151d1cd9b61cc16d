"""fits.json: exact round trip, provenance, and one clear error for a bad or mismatched file."""

from __future__ import annotations

import json

import pytest

from ftplan.core.errors import FtplanError
from ftplan.models.fitset import FitSet, fit_records
from tests.helpers import synthetic_records


@pytest.fixture(scope="module")
def fits() -> FitSet:
    records = synthetic_records([1, 2, 3, 4, 6], seq_lens=(1024, 2048))
    for number, record in enumerate(records, start=1):
        record["_source"] = f"h200.jsonl:{number}"
    return fit_records(records)


def test_json_round_trip_is_exact(fits, tmp_path):
    path = tmp_path / "fits.json"
    fits.save(path)
    loaded = FitSet.load(path)
    assert loaded.to_json() == fits.to_json()
    assert loaded.fits[0].peak_allocated(9, 1536) == fits.fits[0].peak_allocated(9, 1536)


def test_fits_file_names_its_records_and_inputs(fits):
    data = fits.to_json()
    assert data["provenance"]["inputs"] == ["h200.jsonl"]
    assert len(data["fits"][0]["records"]) == 10


def test_truncated_fits_file_is_a_one_line_error_naming_it(fits, tmp_path):
    path = tmp_path / "fits.json"
    path.write_text(json.dumps(fits.to_json())[:200])
    with pytest.raises(FtplanError, match=f"{path}.*corrupt or truncated"):
        FitSet.load(path)


def test_fits_file_missing_a_field_is_refused(fits, tmp_path):
    data = fits.to_json()
    del data["fits"][0]["peak_allocated"]
    path = tmp_path / "fits.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FtplanError, match=f"{path}.*incomplete"):
        FitSet.load(path)


def test_fit_edited_away_from_its_records_is_refused(fits, tmp_path):
    data = fits.to_json()
    data["fits"][0]["peak_allocated"]["lines"][0]["intercept"] *= 0.5
    path = tmp_path / "fits.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FtplanError, match=f"{path}.*does not match its records"):
        FitSet.load(path)


def test_other_json_is_not_taken_for_fits(tmp_path):
    path = tmp_path / "fits.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(FtplanError, match="not an ftplan fits file"):
        FitSet.load(path)
