"""`ftplan calibrate` refuses what the real trial cannot run here before running anything: CUDA where
there is none, Liger on a CPU. The planner itself never imports torch to find out."""

from __future__ import annotations

import subprocess
import sys
import warnings

from ftplan.calibration.launcher import setting_problem
from ftplan.core.settings import Setting
from ftplan.cli.commands.calibrate import runnable_here
from tests.helpers import run_ftplan

PLAIN = Setting(model="tiny-llama", seq_len=64)
LIGER = PLAIN.with_(liger=True)


def test_device_cuda_without_a_visible_gpu_is_refused_in_one_line_before_any_trial(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "c.jsonl"
    code, _stdout, err = run_ftplan(["calibrate", "--model", "tiny-llama", "--device", "cuda", "--out", out],
                                    capsys, monkeypatch)
    assert code != 0
    assert err.count("\n") == 1 and "no CUDA GPU" in err and "--device cpu" in err, err
    assert not out.exists() or out.read_text() == ""


def test_liger_on_cpu_alone_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    out = tmp_path / "c.jsonl"
    code, _stdout, err = run_ftplan(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--liger", "on",
                                     "--out", out], capsys, monkeypatch)
    assert code != 0
    assert err.count("\n") == 1 and "Liger needs a CUDA GPU" in err, err
    assert not out.exists() or out.read_text() == ""


def test_liger_settings_on_cpu_are_skipped_with_a_warning_and_the_rest_run():
    assert setting_problem(LIGER, "cpu") == "Liger needs a CUDA GPU"
    assert setting_problem(LIGER, "cuda") is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert runnable_here([PLAIN, LIGER], "cpu") == [PLAIN]
    assert len(caught) == 1 and "Liger needs a CUDA GPU" in str(caught[0].message)


def test_the_planner_does_not_import_torch():
    probe = ("import sys; import ftplan.cli.main, ftplan.cli.commands.calibrate; "
             "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe]).returncode == 0
