"""The CPU path for people without a GPU: calibrate in minutes, warm up until step time settles, plan on `cpu`."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from ftplan.calibration.trial import MAX_WARMUP_STEPS, warmup_done
from ftplan.core.hardware import CPU, find_gpu, host_memory_bytes, load_catalog
from ftplan.store.records import read_records
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from tests.helpers import run_ftplan, synthetic_records

FAKE_TRIAL = (sys.executable, str(Path(__file__).parent / "fixtures" / "fake_trial.py"))


def test_calibrate_on_a_cpu_defaults_to_a_short_fp32_ladder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL", "{}")
    out = tmp_path / "cpu.jsonl"
    code, _, err = run_ftplan(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--machine", "box",
                               "--out", out], capsys, monkeypatch, trial_command=FAKE_TRIAL)
    assert code == 0, err
    records = read_records([out])
    assert [(r["seq_len"], r["precision"], r["micro_batch"]) for r in records] == [(256, "fp32", b) for b in (1, 2, 4)]
    words = shlex.split(records[0]["command"])
    assert words[words.index("--seq-len") + 1] == "256" and words[words.index("--precision") + 1] == "fp32"


def test_a_gpu_calibration_keeps_its_defaults(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL", "{}")
    out = tmp_path / "gpu.jsonl"
    code, _, err = run_ftplan(["calibrate", "--model", "tiny-llama", "--device", "cuda", "--machine", "box",
                               "--batch-sizes", "1", "--out", out], capsys, monkeypatch, trial_command=FAKE_TRIAL)
    assert code == 0, err
    assert [(r["seq_len"], r["precision"]) for r in read_records([out])] == [(2048, "bf16")]


@pytest.mark.parametrize("seconds, done", [
    ([3.2, 3.1], True),               # settled at once: the two warm-up steps asked for
    ([3.2, 2.4], False),              # still getting faster
    ([3.2, 2.4, 1.1, 0.30], False),   # a CPU's first steps: 10x the later ones
    ([3.2, 2.4, 1.1, 0.30, 0.28], True),
])
def test_warm_up_lasts_until_step_time_settles(seconds, done):
    assert warmup_done(seconds, 2) is done


def test_warm_up_respects_its_bounds():
    assert warmup_done([], 0)                                  # 0: time from the first step
    assert not warmup_done([1.0, 1.0], 3)                      # at least the steps asked for
    assert warmup_done([3.0 / (n + 1) for n in range(MAX_WARMUP_STEPS)], 2)  # never settled: stop at the cap


def test_the_cpu_is_a_device_the_planner_knows_with_the_hosts_memory():
    cpu = find_gpu("cpu")
    assert cpu.name == CPU and cpu.memory_bytes == pytest.approx(host_memory_bytes(), abs=GIB / 100)
    assert host_memory_bytes() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert CPU in load_catalog()


def test_plan_on_the_cpu_from_a_cpu_calibration_needs_no_gpu_specs(tmp_path, capsys, monkeypatch):
    setting = Setting("tiny-llama", seq_len=256, precision="fp32")
    records = [dict(r, device="cpu") for r in synthetic_records(
        [1, 2, 4], (256,), setting=setting, memory=lambda b, s: 0.5 * GIB + 0.02 * GIB * b,
        seconds=lambda b, s: 0.05 * b)]
    for record in records:
        record.update(gpu_name="cpu", gpu_memory_total_bytes=host_memory_bytes())
    (tmp_path / "cpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out, err = run_ftplan(["plan", "--model", "tiny-llama", "--seq-len", 256, "--dataset-size", 1000,
                                 "--gpu", "cpu", "--full", "--calibrations", tmp_path / "cpu.jsonl", "--json"],
                                capsys, monkeypatch)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["request"]["gpu"] == "cpu" and plan["memory_budget"]["capacity_gib"] == pytest.approx(
        host_memory_bytes() / GIB, rel=1e-3)
    (calibrated,) = [s for s in plan["ranked"] if s["setting"]["precision"] == "fp32"]
    assert calibrated["prediction"]["evidence"] != "prior"  # from the CPU calibration itself


def test_a_cpu_plan_ranks_only_setups_a_cpu_runs(tmp_path, capsys, monkeypatch):
    """Liger's kernels need CUDA and DeepSpeed an accelerator: the CPU plan leaves them out."""
    code, out, err = run_ftplan(["plan", "--model", "tiny-llama", "--seq-len", 256, "--dataset-size", 1000,
                                 "--gpu", "cpu", "--full", "--json", "--all"], capsys, monkeypatch)
    assert code == 0, err
    plan = json.loads(out)
    settings = [s["setting"] for s in plan["ranked"] + plan["over_max_hours"] + plan["cannot_fit"]]
    assert settings and not any(s["liger"] or s["zero_stage"] for s in settings)
