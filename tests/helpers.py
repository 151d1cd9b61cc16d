"""A predictor stand-in for planner tests: linear memory and time per setting, with knobs for the edge cases.

Its numbers are test inputs chosen to make offload slower and Liger/checkpointing lighter, as the
physics says; they are not measurements and never leave the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ftplan.core.hardware import GpuSpec
from ftplan.store.records import build_record
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.prediction import Estimate, Prediction


@dataclass
class FakePredictor:
    full_static_gib: float = 60.0
    offload_static_gib: float = 20.0
    lora_static_gib: float = 18.0
    per_sample_gib: float = 10.0
    upper_factor: float = 1.05
    source: str = "measured"
    wall_batch: int | None = None
    calls: list[tuple[Setting, int]] = field(default_factory=list)

    def predict(self, setting: Setting, micro_batch: int, gpu: GpuSpec) -> Prediction:
        self.calls.append((setting, micro_batch))
        static = self.lora_static_gib if setting.lora_rank else (
            self.offload_static_gib if setting.offload_optimizer else self.full_static_gib)
        per_sample = self.per_sample_gib * (0.4 if setting.gradient_checkpointing else 1) * (0.5 if setting.liger else 1)
        memory = (static + per_sample * micro_batch) * GIB
        seconds = (0.5 + 0.4 * micro_batch) * (1.33 if setting.gradient_checkpointing else 1) \
            * (0.7 if setting.lora_rank else 1) + (3.0 if setting.offload_optimizer else 0)
        return Prediction(setting=setting, micro_batch=micro_batch, gpu=gpu.name,
                          peak_allocated=Estimate(0.9 * memory, 0.9 * memory * self.upper_factor),
                          peak_reserved=Estimate(memory, memory * self.upper_factor),
                          seconds_per_step=Estimate(seconds, seconds * 1.1), source=self.source,
                          wall_batch=self.wall_batch)


def write_external_jsonl(path):
    """The public measurements (../shared/external) as a calibration file; skips the test where they are absent."""
    import json

    import pytest

    from benchmarks.external import load_external

    records = load_external()
    if not records:
        pytest.skip("public measurements (../shared/external/seed000) not present")
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "_source"}) + "\n" for r in records))
    return path


def run_ftplan(args, capsys, monkeypatch, trial_command=None):
    """Run the real entry point in-process: (exit code, stdout, stderr), as a user's shell would see them;
    trial_command: a stand-in for the real trial."""
    from ftplan.cli.main import main

    try:
        main(list(map(str, args)), trial_command=trial_command)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def planned_batch_fits(prediction: dict, plan: dict) -> bool:
    """models/safe_batch.py's rule read back from `ftplan plan --json`: the upper bound within the usable
    memory, or the batch (or a larger one) measured healthy with a peak within the planned card."""
    budget = plan["memory_budget"]
    measured = any(m["batch"] >= prediction["micro_batch"] and m["peak_reserved_gib"] <= budget["capacity_gib"]
                   for m in prediction["measured_healthy"])
    return prediction["peak_reserved_gib"]["upper"] <= budget["usable_gib"] or measured


SETTING = Setting(model="qwen2.5-0.5b", seq_len=2048, gradient_checkpointing=True)


def synthetic_records(batches, seq_lens=(2048,), memory=None, seconds=None, setting=SETTING, **extra) -> list[dict]:
    """Records of a convex, piecewise-linear memory curve (two phases) and linear step time."""
    memory = memory or (lambda b, s: max(10 * GIB + 0.6 * GIB * b * s / 2048, 9 * GIB + 1.5 * GIB * b * s / 2048))
    seconds = seconds or (lambda b, s: 0.2 + 0.1 * b * s / 2048)
    return [build_record(setting.with_(seq_len=s), b, "ok", gpu_name="H200", gpu_memory_total_bytes=141 * GIB,
                         peak_allocated_bytes=memory(b, s), peak_reserved_bytes=memory(b, s) + GIB,
                         seconds_per_step=seconds(b, s), num_alloc_retries=0, **extra)
            for s in seq_lens for b in batches]


FAKE_TRIAL_FTPLAN = (sys.executable, str(Path(__file__).parent / "fixtures" / "ftplan_with_fake_trial.py"))


def start_fake_calibration(args, out: Path, behaviour: dict, **popen) -> subprocess.Popen:
    """`ftplan calibrate` as a real process whose trials are the fake trial (FAKE_TRIAL=behaviour), appending to out."""
    env = {**os.environ, "FAKE_TRIAL": json.dumps(behaviour)}
    return subprocess.Popen([*FAKE_TRIAL_FTPLAN, *args, "--out", str(out)], env=env, text=True, **popen)


@contextlib.contextmanager
def within(seconds: int):
    """Fail the test with TimeoutError, not a hung suite, when the block runs longer (a FIFO read, say)."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
