"""`ftplan report` writes readable PNG charts from calibrations and the planner's view of them."""

from __future__ import annotations

from ftplan.cli.plots import COMPLETION_PNG, MEMORY_PNG, SCALING_PNG, TIME_PNG
from ftplan.core.architecture import load_architecture
from tests.helpers import run_ftplan, write_external_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_writes_the_charts_including_scaling_against_gpu_count(tmp_path, capsys, monkeypatch):
    external = write_external_jsonl(tmp_path / "external.jsonl")
    out = tmp_path / "report"
    code, stdout, err = run_ftplan(["report", "--model", "qwen1.5-0.5b", "--calibrations", external, "--out", out,
                                    "--dataset-size", 19692, "--gpus", "1..16", "--inter-node-bandwidth", "600MB/s"],
                                   capsys, monkeypatch)
    assert code == 0, err
    for name in (MEMORY_PNG, TIME_PNG, COMPLETION_PNG, SCALING_PNG.format(model="qwen1.5-0.5b", gpu="RTX-3090")):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 20_000, name  # a real chart, not an empty canvas
        assert str(out / name) in stdout


def test_report_writes_into_a_folder_with_files_only_with_force(tmp_path, capsys, monkeypatch):
    """A user's own memory_vs_batch.png in --out was replaced unasked."""
    external = write_external_jsonl(tmp_path / "external.jsonl")
    out = tmp_path / "report"
    out.mkdir()
    (out / MEMORY_PNG).write_text("the user's chart")
    args = ["report", "--model", "qwen1.5-0.5b", "--calibrations", external, "--out", out, "--gpus", "1"]
    code, _, err = run_ftplan(args, capsys, monkeypatch)
    assert code == 2 and "--force" in err and (out / MEMORY_PNG).read_text() == "the user's chart"
    (out / TIME_PNG).symlink_to(tmp_path / "precious.txt")
    code, _, err = run_ftplan([*args, "--force"], capsys, monkeypatch)
    assert code == 2 and "is a symlink" in err and not (tmp_path / "precious.txt").exists()
    (out / TIME_PNG).unlink()
    code, _, err = run_ftplan([*args, "--force"], capsys, monkeypatch)
    assert code == 0, err
    assert (out / MEMORY_PNG).read_bytes().startswith(PNG_MAGIC)


def test_a_record_of_a_deleted_model_config_is_left_out_not_the_end_of_the_report(tmp_path, capsys, monkeypatch):
    import json

    external = write_external_jsonl(tmp_path / "external.jsonl")
    config = tmp_path / "mine" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({k: v for k, v in load_architecture("tiny-llama").config.items()
                                  if not k.startswith("_")}))
    first = json.loads(external.read_text().splitlines()[0])
    (tmp_path / "gone.jsonl").write_text(json.dumps({**first, "model": str(config)}) + "\n")
    config.unlink()
    code, stdout, err = run_ftplan(["report", "--calibrations", external, "--calibrations",
                                    tmp_path / "gone.jsonl", "--out", tmp_path / "report", "--gpus", "1"],
                                   capsys, monkeypatch)
    assert code == 0, err
    assert (tmp_path / "report" / MEMORY_PNG).exists()


def test_curves_show_the_planners_largest_safe_batch_under_the_cards_limit(tmp_path):
    from ftplan.core.hardware import find_gpu
    from ftplan.store.records import read_records
    from ftplan.models.predictor import Predictor
    from ftplan.models.safe_batch import MemoryBudget
    from ftplan.cli.plots import collect_curves

    records = read_records([write_external_jsonl(tmp_path / "external.jsonl")])
    gpu = find_gpu("RTX-3090")
    budget = MemoryBudget(gpu.memory_bytes)
    curves = collect_curves(records, Predictor.fit(records), {"RTX-3090": gpu}, {"RTX-3090": budget})
    assert len(curves) == 4  # the four single-GPU set-ups of the public 0.5B measurements
    for c in curves:
        assert c.batches[0] == 1 and c.batches[-1] >= max(r["micro_batch"] for r in c.measured)
        assert all(batch > c.safe_batch for batch in c.oom_batches)
        proven = max(r["micro_batch"] for r in c.measured if r["status"] == "ok")
        assert c.reserved[c.safe_batch - 1][1] <= budget.usable_bytes or c.safe_batch <= proven


def test_an_oom_trial_that_never_learnt_its_gpu_name_shows_on_its_settings_chart(tmp_path, capsys, monkeypatch):
    """Llama-3-8B LoRA r16's batch 8 ran out of memory before it recorded the card's name: fit and predict counted
    it (the name of the same setting's trials on the same machine), the chart drew no OOM line."""
    from ftplan.cli import plots

    shown = []
    monkeypatch.setattr(plots, "plot_memory", lambda curves, path: shown.extend(curves) or path)
    monkeypatch.setattr(plots, "plot_seconds", lambda curves, path: path)
    monkeypatch.setattr(plots, "plot_completion", lambda curves, size, epochs, path: path)
    monkeypatch.setattr(plots, "plot_gpu_scaling", lambda *args: tmp_path / "scaling.png")
    code, _, err = run_ftplan(["report", "--model", "llama-3-8b", "--out", tmp_path / "report", "--gpus", "1"],
                              capsys, monkeypatch)
    assert code == 0, err
    lora16 = [c for c in shown if c.setting.lora_rank == 16 and not c.setting.liger and not c.setting.quantization
              and not c.setting.gradient_checkpointing and c.setting.seq_len == 2048]
    assert [c.oom_batches for c in lora16 if c.oom_batches] == [[8]]
