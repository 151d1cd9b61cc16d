"""The built wheel is the tool: its data ships inside it, and it runs from any folder, even one with a
`models/` package of its own (which once shadowed ftplan's top-level `models`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_built_wheel_installs_and_plans_from_a_folder_with_its_own_models_package(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "dist"), "-q"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("ftplan-*.whl")
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                                str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    assert sorted(p.name for p in target.iterdir() if p.is_dir() and not p.name.endswith(".dist-info")) == ["bin", "ftplan"]
    user = tmp_path / "user-project"
    (user / "models").mkdir(parents=True)
    (user / "models" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(target)}  # the wheel's copy, ahead of the checkout's editable install

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "ftplan", *args], cwd=user, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    where = subprocess.run([sys.executable, "-c", "import ftplan; print(ftplan.__file__)"], cwd=user, env=env,
                           capture_output=True, text=True).stdout
    assert where.startswith(str(target))
    assert "llama-3-8b" in run("models")
    assert "Recommendation:" in run("plan", "--model", "llama-3-8b", "--dataset-size", "19692", "--gpu", "H200")
