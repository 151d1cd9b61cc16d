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


def test_no_two_rows_of_the_shipped_fits_read_alike(tmp_path):
    """OLMoE's LoRA on every linear and on attention only printed as two 'ddp lora16 padded' rows."""
    from ftplan.core.paths import calibrations_dir

    out = tmp_path / "fits.json"
    result = CliRunner().invoke(cli, ["fit", str(calibrations_dir()), "--out", str(out)], terminal_width=250)
    assert result.exit_code == 0, result.output
    rows = [(fit.setting["model"], fit.setting_at(seq).full_label(), fit.gpu_name)
            for fit in FitSet.load(out).fits for seq in fit.seq_lens]
    assert len(rows) == len(set(rows)) and any("on q+k+v+o" in label for _, label, _ in rows)
    assert "on q+k+v+o" in " ".join(result.output.split())
