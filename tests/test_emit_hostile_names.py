"""Names the user controls (a GPU name from --gpu-specs, a model folder's path) reach the emitted training_args.py
only as Python literals: a name holding triple quotes and newlines must not become code when the file is imported."""

from __future__ import annotations

import ast
import runpy
import shutil

import pytest

from ftplan.core.hardware import GpuSpec
from ftplan.core.paths import architectures_dir
from ftplan.core.settings import Setting
from ftplan.models.safe_batch import MemoryBudget
from ftplan.planner.emit import TRAINING_ARGS_PY, write_configs
from ftplan.planner.search import PlanRequest, plan_setup
from tests.helpers import FakePredictor

# closes the docstring, runs a line, reopens it; a backslash and ''' for other quotings; no "/", so it can name a folder
HOSTILE = 'x"""\nopen("injected", "w").write("ran")\n"""\\\n' + "'''#"


@pytest.mark.parametrize("where", ["gpu", "model"])
def test_a_hostile_name_is_written_as_a_literal_and_importing_the_file_runs_nothing(tmp_path, monkeypatch, where):
    pytest.importorskip("transformers")  # here, not at import: collecting the suite must not load it
    monkeypatch.chdir(tmp_path)
    model_folder = tmp_path / HOSTILE  # a local model folder, as --model takes it
    model_folder.mkdir()
    shutil.copy(architectures_dir() / "tiny-llama.json", model_folder / "config.json")
    gpu = GpuSpec(HOSTILE if where == "gpu" else "TEST-80", 80, 100, 1000)
    setting = Setting(model=str(model_folder) if where == "model" else "llama-3-8b", lora_rank=16)
    request = PlanRequest(base=setting, dataset_size=1000, epochs=1, gpu=gpu, budget=MemoryBudget(gpu.memory_bytes))
    folder = tmp_path / "configs"
    write_configs(folder, plan_setup(FakePredictor(), setting, request), request)

    source = (folder / TRAINING_ARGS_PY).read_text()
    assert "injected" not in ast.get_docstring(ast.parse(source))
    namespace = runpy.run_path(str(folder / TRAINING_ARGS_PY))
    assert not (tmp_path / "injected").exists()
    assert HOSTILE in namespace["PLAN"]
