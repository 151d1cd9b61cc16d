"""calibrate and calibrate-network where torch is not installed (the planner-only install): one line naming the
calibrate extra, exit 2, and nothing written, instead of an error record per trial or a traceback."""

from __future__ import annotations

import sys

import pytest

from ftplan.calibration import launcher
from ftplan.core.settings import Setting
from ftplan.cli.main import main


@pytest.fixture
def no_torch(monkeypatch):
    """A None entry in sys.modules is how Python spells 'this module cannot be imported'."""
    for module in ("torch", "transformers"):
        monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize("args", [["calibrate", "--model", "tiny-llama", "--device", "cpu"],
                                  ["calibrate-network"]])
def test_without_torch_the_command_names_the_extra_and_writes_nothing(no_torch, monkeypatch, tmp_path, capsys, args):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: ") and "torch" in err and 'pip install "ftplan[calibrate]"' in err
    assert list(tmp_path.iterdir()) == []


def test_a_setting_whose_package_is_missing_is_skipped_before_it_runs(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    assert "peft not installed" in launcher.setting_problem(Setting(model="tiny-llama", lora_rank=8), "cpu")
    assert launcher.setting_problem(Setting(model="tiny-llama"), "cpu") is None


def test_rehearse_and_calibrate_on_a_gpu_without_torch_name_what_to_install(monkeypatch):
    """cuda_problem asks a child interpreter; one without torch answers with a ModuleNotFoundError."""
    import subprocess

    failed = subprocess.CompletedProcess([], 1, b"", b"Traceback ...\nModuleNotFoundError: No module named 'torch'\n")
    monkeypatch.setattr(launcher.subprocess, "run", lambda *args, **kwargs: failed)
    assert "pip install 'ftplan[calibrate]'" in launcher.cuda_problem()


def test_the_callback_without_transformers_names_the_extra(no_torch, monkeypatch):
    """A bare ModuleNotFoundError traceback from deep in the callback module was all a planner-only install said."""
    monkeypatch.delitem(sys.modules, "ftplan.calibration.callback", raising=False)
    import ftplan

    with pytest.raises(ImportError, match=r'needs transformers .*pip install "ftplan\[calibrate\]"'):
        ftplan.FtplanCallback  # noqa: B018 - the lazy attribute is the import
