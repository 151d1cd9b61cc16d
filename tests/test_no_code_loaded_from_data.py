"""No code or object is ever loaded from a data file: calibrations, fits and catalogs are shared
between people and machines, so reading one must never run anything. The sources use no pickle-like
loader or eval, and every file under data/ is plain JSON, JSONL, CSV or Markdown."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ftplan", "benchmarks", "tests")
DATA = ROOT / "ftplan" / "data"
# Modules whose loaders build objects (or run code) from bytes.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve", "jsonpickle"}
UNSAFE_BUILTINS = {"eval", "exec", "compile", "__import__"}


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _unsafe_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Call):
            found += [(node.lineno, problem) for problem in [_unsafe_call(node)] if problem]
    return found


def _unsafe_call(call: ast.Call) -> str | None:
    name = ast.unparse(call.func)
    keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
    if name in UNSAFE_BUILTINS:
        return f"{name}()"
    if name.split(".")[-1] == "load" and name.split(".")[0] in {"torch", "yaml"}:
        return f"{name}()" if "yaml" not in name or "SafeLoader" not in keywords.get("Loader", "") else None
    if name in {"yaml.unsafe_load", "yaml.full_load"}:
        return f"{name}()"
    if name in {"np.load", "numpy.load"} and keywords.get("allow_pickle", "False") != "False":
        return f"{name}(allow_pickle=...)"
    if name.endswith(("read_pickle", ".from_pickle")):
        return f"{name}()"
    return None


def test_the_checker_finds_each_kind_of_unsafe_load():
    code = ("import pickle\nfrom joblib import load\neval(s)\nexec(s)\ntorch.load(f)\nyaml.load(f)\n"
            "np.load(f, allow_pickle=True)\npd.read_pickle(f)\n"
            "yaml.load(f, Loader=yaml.SafeLoader)\nnp.load(f)\njson.load(f)\n")
    assert [line for line, _ in _unsafe_uses(ast.parse(code))] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_no_source_loads_objects_or_code_from_data():
    offenders = {str(source.relative_to(ROOT)): uses for source in _sources() if source != Path(__file__)
                 for uses in [_unsafe_uses(ast.parse(source.read_text(), str(source)))] if uses}
    assert offenders == {}  # this file itself names the loaders only to look for them


def test_every_data_file_is_plain_json_jsonl_csv_or_markdown():
    files = sorted(p for p in DATA.rglob("*") if p.is_file())
    assert files, "data/ is empty"
    for path in files:
        text = path.read_bytes().decode("utf-8")  # text, not a binary blob
        assert "\x00" not in text, path
        if path.suffix == ".json":
            json.loads(text)
        elif path.suffix == ".jsonl":
            assert all(isinstance(json.loads(line), dict) for line in text.splitlines() if line.strip()), path
        elif path.suffix == ".csv":
            rows = list(csv.reader(text.splitlines()))
            assert rows and all(len(row) == len(rows[0]) for row in rows), path
        else:
            assert path.suffix == ".md", f"{path}: only .json, .jsonl, .csv and .md belong in data/"
