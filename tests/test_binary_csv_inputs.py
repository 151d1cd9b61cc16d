"""User-supplied CSVs that are not text (a binary file passed as --gpu-specs) fail in one line, not a traceback."""

from __future__ import annotations

import pytest

from ftplan.core.errors import FtplanError
from ftplan.core.hardware import load_catalog
from ftplan.cli.main import main


def test_binary_gpu_specs_are_one_line(tmp_path, capsys):
    specs = tmp_path / "g.csv"
    specs.write_bytes(b"garbage\x00\xff")
    with pytest.raises(FtplanError, match="cannot read GPU specs"):
        load_catalog(specs)
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", "qwen2.5-0.5b", "--gpu", "Tiny", "--gpu-specs", str(specs), "--dataset-size", "10"])
    assert exit_.value.code == 2 and capsys.readouterr().err.startswith("error: cannot read GPU specs")
