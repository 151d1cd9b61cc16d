"""Arrows run down the layers only: core < models < store < calibration, planner < cli (calibration may use
models to choose its verify batch). An upward import is how models/ once needed calibration/."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ftplan"
ALLOWED = {
    "core": {"core"},
    "models": {"core", "models"},
    "store": {"core", "models", "store"},
    "calibration": {"core", "calibration", "models", "store"},
    "planner": {"core", "models", "store", "calibration", "planner", "cli"},  # cli: until api.py stops reaching it
    "cli": {"core", "models", "store", "calibration", "planner", "cli"},
}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ftplan."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("ftplan.")}
    return found


def test_every_subpackage_imports_only_what_lies_below_it():
    wrong = []
    for stage, allowed in ALLOWED.items():
        for path in sorted((PACKAGE / stage).rglob("*.py")):
            wrong += [f"{path.relative_to(PACKAGE)} imports ftplan.{m}" for m in _imports(path) - allowed]
    assert not wrong, wrong


def test_no_module_outside_the_stages_hides_in_the_package():
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == {*ALLOWED, "data"}
