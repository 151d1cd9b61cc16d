"""Under an ASCII or Latin-1 locale the output degrades to plain characters instead of a UnicodeEncodeError traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

FTPLAN = (sys.executable, "-c", "from ftplan.cli.main import main; main()")
LOCALES = {
    "C locale": {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"},
    "latin-1": {"PYTHONIOENCODING": "latin-1"},
    "ascii": {"PYTHONIOENCODING": "ascii"},
}


@pytest.mark.parametrize("name", LOCALES)
def test_a_table_with_non_ascii_characters_prints_in_a_narrow_encoding(tmp_path, name):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "LC_ALL", "LANG", "PYTHONUTF8")}
    env.update(LOCALES[name], FTPLAN_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="100")
    result = subprocess.run([*FTPLAN, "fit", "--out", str(tmp_path / "fits.json")], env=env, capture_output=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in result.stderr
    assert b"R2 mem" in result.stdout or b"R\xb2 mem" in result.stdout
