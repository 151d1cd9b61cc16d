"""Every command of the H200 family script runs on a CPU with a tiny config of each family, so it cannot
fail on the GPU for a code reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
TINY = ROOT / "tests" / "fixtures" / "families"


def test_calibrate_families_runs_every_command_on_a_cpu(tmp_path):
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(tmp_path), "SEQ": "32", "LADDER_TOP": "2",
           "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "BUDGET": "900",
           "QWEN3": str(TINY / "tiny-qwen3.json"), "GEMMA": str(TINY / "tiny-gemma2.json"),
           "PHI": str(TINY / "tiny-phi3.json"), "MOE": str(TINY / "tiny-olmoe.json"), "BIG": "tiny-llama"}
    run = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/calibrate_families.sh")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SKIPPED" not in run.stdout
    records = [json.loads(line) for line in (tmp_path / "families.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "ok" for r in records), [r.get("message") for r in records]
    assert {r["model"].rsplit("/", 1)[-1] for r in records} == {
        "tiny-qwen3.json", "tiny-gemma2.json", "tiny-phi3.json", "tiny-olmoe.json", "tiny-llama"}
    assert any(r["quantization"] == "nf4" and r["optimizer"] == "paged_adamw_8bit" for r in records)
