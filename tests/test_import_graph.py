"""Arrows run down the layers only: core < models < store < evidence < calibration, planner < cli (calibration
may use models to choose its verify batch, and the evidence to predict the run it records). An upward import is how models/ once needed calibration/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ftplan"
ALLOWED = {
    "core": {"core"},
    "models": {"core", "models"},
    "store": {"core", "models", "store"},
    "evidence": {"core", "models", "store", "evidence"},
    "calibration": {"core", "calibration", "models", "store", "evidence"},
    "planner": {"core", "models", "store", "evidence", "calibration", "planner"},
    "cli": {"core", "models", "store", "evidence", "calibration", "planner", "cli"},
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


COMMAND_LINE_ONLY = {"click", "rich", "matplotlib"}  # the planner is a library: terminals and charts are cli/'s


def _third_party(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
    return found


def test_no_layer_below_the_command_line_imports_click_rich_or_matplotlib():
    wrong = [f"{path.relative_to(PACKAGE)} imports {', '.join(sorted(_third_party(path) & COMMAND_LINE_ONLY))}"
             for stage in set(ALLOWED) - {"cli", "calibration"} for path in sorted((PACKAGE / stage).rglob("*.py"))
             if _third_party(path) & COMMAND_LINE_ONLY]
    assert not wrong, wrong


def test_the_python_api_loads_neither_click_nor_rich():
    probe = "import sys, ftplan; ftplan.plan; print(sorted({'click', 'rich'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.strip() == "[]"


HEAVY = {"pandas", "scipy", "sklearn", "torch", "transformers", "click", "rich"}


def test_a_plan_from_cached_fits_loads_no_heavy_library():
    """`import ftplan; ftplan.plan(...)` answers in a fraction of a second only while none of these load: pandas
    and scipy alone took longer than the plan (benchmarks/planner_speed.py)."""
    probe = ("import sys, ftplan; ftplan.plan('llama-3-8b', 19692, 'H200'); "
             f"print(sorted({HEAVY!r} & set(sys.modules)))")
    subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True, cwd=PACKAGE.parent)  # fits the cache
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.strip() == "[]"


# models/communication/: one job a module, each building only on those it names (no cycles, no reach upward).
COMMUNICATION = {
    "layout": set(),
    "links": set(),
    "collectives": {"links"},
    "traffic": {"links", "collectives"},
    "step": {"links", "collectives", "traffic"},
    "estimates": {"links", "traffic"},
}


def test_the_communication_modules_use_only_those_below_them():
    folder = PACKAGE / "models" / "communication"
    assert {p.stem for p in folder.glob("*.py")} == {*COMMUNICATION, "__init__"}
    wrong = []
    for name, allowed in COMMUNICATION.items():
        used = {node.module.rsplit(".", 1)[1] for node in ast.walk(ast.parse((folder / f"{name}.py").read_text()))
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ftplan.models.communication.")}
        wrong += [f"{name} imports {m}" for m in used - allowed]
    assert not wrong, wrong
