"""`ftplan fit` through the CLI: records in, fits.json and a table out, bad input a one-line error."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ftplan.store.records import append_record
from ftplan.models.fitset import FitSet
from ftplan.cli.main import cli, main
from tests.helpers import synthetic_records


@pytest.fixture()
def records_file(tmp_path):
    path = tmp_path / "h200.jsonl"
    for record in synthetic_records([1, 2, 4, 8]):
        append_record(path, record)
    return path


def test_fit_writes_fits_and_prints_a_row_per_setting(records_file, tmp_path):
    out = tmp_path / "fits.json"
    result = CliRunner().invoke(cli, ["fit", str(records_file), "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "H200" in result.output and "1-8" in result.output
    fits = FitSet.load(out)
    assert fits.fits[0].calibrated_batches(2048) == [1, 2, 4, 8]
    assert json.loads(out.read_text())["provenance"]["inputs"] == [str(records_file)]


def test_fit_without_fittable_records_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", str(path), "--out", str(tmp_path / "fits.json")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
