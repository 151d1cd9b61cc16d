"""Every module of the package opens with a docstring saying its job: the first thing a reader meets."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ftplan"


def test_every_module_opens_with_a_docstring():
    silent = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
              if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()]
    assert not silent, silent
