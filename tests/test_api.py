"""The Python API gives what the CLI prints: `ftplan.plan(...).to_dict()` is `ftplan plan --json`."""

from __future__ import annotations

import json

import ftplan
from tests.helpers import run_ftplan


def test_plan_returns_the_recommendation_a_frame_and_the_cli_json(capsys, monkeypatch):
    result = ftplan.plan(model="llama-3-8b", dataset_size=19692, gpu="H200")
    code, out, _ = run_ftplan(["plan", "--model", "llama-3-8b", "--dataset-size", 19692, "--gpu", "H200", "--json"],
                              capsys, monkeypatch)
    assert code == 0
    assert json.loads(json.dumps(result.to_dict())) == json.loads(out)
    frame = result.to_frame()
    assert len(frame) == len(result.plan.ranked) + len(result.plan.too_slow) + len(result.plan.unfit)
    (recommended,) = frame[frame.recommended].to_dict("records")
    assert recommended["setup"] == result.recommendation.label and recommended["batch_per_gpu"] == result.recommendation.batch


def test_predict_says_what_its_numbers_rest_on():
    measured = ftplan.predict("llama-3-8b", 4, "H200", lora_rank=16, padding="none")  # the shipped H200 ladder ran it
    padded = ftplan.predict("llama-3-8b", 4, "H200", lora_rank=16)  # padded with a mask, like `ftplan predict`
    far = ftplan.predict("llama-3-8b", 4, "A100-80GB", lora_rank=16, gradient_checkpointing=True)
    assert measured.evidence == "measured" and padded.evidence != "measured"
    assert padded.setting.padding == "max_length" and padded.peak_allocated.mean > measured.peak_allocated.mean
    assert far.evidence != "measured" and far.peak_reserved.upper > far.peak_reserved.mean


def test_importing_ftplan_loads_nothing_heavy():
    import subprocess
    import sys

    code = "import sys, ftplan; print(sorted(m for m in ('pandas', 'torch', 'transformers') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


def test_a_dataset_plan_takes_its_batching_from_the_exported_options(tmp_path):
    import ftplan

    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({"text": "word " * (20 + i % 50)}) + "\n" for i in range(200)))
    result = ftplan.plan(model="llama-3.2-1b", gpu="H200", dataset=dataset, training="full",
                         dataset_options=ftplan.DatasetOptions(strategy="pack", pack_length=256, global_batch=16))
    data = result.to_dict()
    assert "DatasetOptions" in dir(ftplan) and "plan" in dir(ftplan)
    assert data["dataset"]["batching"] == "pack" and data["dataset"]["recommended"]["global_batch"] == 16
