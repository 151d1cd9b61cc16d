"""The commands agree on where calibrations live, say what their warnings are about, explain every option,
and name the card an ambiguous GPU alias was taken as."""

from __future__ import annotations

import json
import shutil

import pytest

from ftplan.core.architecture import load_architecture
from ftplan.core.paths import calibrations_dir
from ftplan.store.records import build_record
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from tests.helpers import run_ftplan, synthetic_records


def _write(path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_fit_without_arguments_reads_the_users_calibrations_folder_like_plan(tmp_path, capsys, monkeypatch):
    _write(tmp_path / "calibrations" / "mine.jsonl", synthetic_records([1, 2, 4], setting=Setting("tiny-llama")))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_ftplan(["fit", "--out", tmp_path / "fits.json"], capsys, monkeypatch)
    assert code == 0, err
    inputs = json.loads((tmp_path / "fits.json").read_text())["provenance"]["inputs"]
    assert any(path.startswith(str(calibrations_dir())) for path in inputs)  # the shipped ones, as before
    assert "calibrations/mine.jsonl" in inputs
    assert "tiny-llama" in out


def test_fit_never_replaces_a_file_unasked_nor_the_records_it_reads(tmp_path, capsys, monkeypatch):
    """`fit cal.jsonl --out cal.jsonl` wrote the fits over the measurements; any existing --out was replaced."""
    records = tmp_path / "cal.jsonl"
    _write(records, synthetic_records([1, 2, 4], setting=Setting("tiny-llama")))
    kept = records.read_text()
    for out, force in ((records, True), (tmp_path / "notes.json", False)):
        if out != records:
            out.write_text("the user's")
        code, _, err = run_ftplan(["fit", records, "--out", out, *(["--force"] if force else [])], capsys, monkeypatch)
        assert code == 2 and err.strip().count("\n") == 0 and "error:" in err, err
    assert records.read_text() == kept and (tmp_path / "notes.json").read_text() == "the user's"
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    code, _, err = run_ftplan(["fit", records, "--out", tmp_path / "link.json", "--force"], capsys, monkeypatch)
    assert code == 2 and "symlink" in err and not (tmp_path / "elsewhere.json").exists()
    (tmp_path / "hard.jsonl").hardlink_to(records)  # the same file by another name, and through a folder's link
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "l.jsonl").symlink_to(records)
    for source, out in ((records, tmp_path / "hard.jsonl"), (tmp_path / "folder", records)):
        code, _, err = run_ftplan(["fit", source, "--out", out, "--force"], capsys, monkeypatch)
        assert code == 2 and "records file this fit reads" in err, err
    assert records.read_text() == kept
    other = tmp_path / "other.jsonl"  # records this fit does not read: --force still keeps them
    other.write_text(kept)
    code, _, err = run_ftplan(["fit", records, "--out", other, "--force"], capsys, monkeypatch)
    assert code == 2 and "holds calibration records; fits never replace them" in err and other.read_text() == kept
    code, _, err = run_ftplan(["fit", records, "--out", tmp_path / "notes.json", "--force"], capsys, monkeypatch)
    assert code == 0 and "fits" in json.loads((tmp_path / "notes.json").read_text())


def test_a_fit_warning_names_its_model(tmp_path, capsys, monkeypatch):
    lone = build_record(Setting("tiny-llama"), 1, "ok", gpu_name="H200", gpu_memory_total_bytes=141 * GIB,
                        peak_allocated_bytes=GIB, peak_reserved_bytes=2 * GIB, seconds_per_step=0.1,
                        num_alloc_retries=0)
    _write(tmp_path / "c.jsonl", [lone, *synthetic_records([1, 2, 4])])
    code, _, err = run_ftplan(["fit", tmp_path / "c.jsonl", "--out", tmp_path / "fits.json"], capsys, monkeypatch)
    assert code == 0, err
    (warning,) = [line for line in err.splitlines() if "nothing to fit" in line]
    assert warning.startswith("warning: tiny-llama ddp full s2048 on H200:")


def test_the_calibrations_line_says_trials_and_training_runs_apart(tmp_path, capsys, monkeypatch):
    run = dict(synthetic_records([2], setting=Setting("llama-3-8b", lora_rank=16))[0], source="trainer_callback")
    _write(tmp_path / "calibrations" / "mine.jsonl", [run])
    monkeypatch.chdir(tmp_path)
    code, out, err = run_ftplan(["plan", "--model", "llama-3-8b", "--dataset-size", 1000, "--gpu", "H200", "--lora"],
                                capsys, monkeypatch)
    assert code == 0, err
    line = " ".join(out.split())
    assert "from calibration trials (short real fine-tunes by `ftplan calibrate`)" in line
    assert "1 from your own training runs (the Trainer callback)" in line and "real training runs" not in line


@pytest.mark.parametrize("command", ["plan", "eta", "predict", "report", "calibrate"])
def test_help_has_no_empty_range_and_every_option_says_what_it_does(command, capsys, monkeypatch):
    code, out, _ = run_ftplan([command, "--help"], capsys, monkeypatch)
    assert code == 0 and "None]" not in out and "FLOAT RANGE" not in out.replace("FLOAT RANGE  ", "")
    mine = {"predict": ["--gradient-checkpointing", "--nodes", "--precision", "--lora-rank"],
            "eta": ["--gradient-checkpointing", "--nodes", "--price-per-hour"],
            "calibrate": ["--device", "--warmup-steps", "--gradient-checkpointing", "--precision"],
            "report": ["--epochs", "--gpus-per-node", "--safety-margin"],
            "plan": ["--max-hours", "--safety-margin", "--all"]}[command]
    for option in mine:
        block = out.split(f"  {option} ", 1)[1].split("\n  --", 1)[0]
        assert len(block.split()) > 3, (option, block)  # a metavar alone is not help


def test_gpus_lists_the_aliases_each_card_answers_to(capsys, monkeypatch):
    code, out, _ = run_ftplan(["gpus"], capsys, monkeypatch)
    rtx = next(line for line in out.splitlines() if line.startswith("RTX-3090"))
    a100 = next(line for line in out.splitlines() if line.startswith("A100-40GB"))
    assert code == 0 and "3090" in rtx.split()[1:] and "a100" in a100.split()[1:]


def test_an_alias_of_several_cards_says_which_one_it_took(capsys, monkeypatch):
    args = ["plan", "--model", "qwen2.5-0.5b", "--dataset-size", 1000, "--lora", "--json"]
    code, out, err = run_ftplan([*args, "--gpu", "A100"], capsys, monkeypatch)
    assert code == 0 and json.loads(out)["request"]["gpu"] == "A100-40GB"
    assert "GPU 'A100' is taken as A100-40GB (40 GB); name A100-80GB" in err
    code, _, err = run_ftplan([*args, "--gpu", "3090"], capsys, monkeypatch)
    assert code == 0 and "taken as" not in err  # one card answers to 3090


def test_model_takes_a_local_hugging_face_model_folder(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(load_architecture("qwen2.5-0.5b").config))
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    for model in (folder, folder / "config.json"):
        code, out, err = run_ftplan(["plan", "--model", model, "--dataset-size", 1000, "--gpu", "H200", "--lora",
                                     "--json"], capsys, monkeypatch)
        assert code == 0, err
        assert json.loads(out)["recommendation"]["largest_safe_batch"] >= 1
    code, out, err = run_ftplan(["predict", "--model", folder, "--batch-size", 2, "--gpu", "H200", "--json"],
                                capsys, monkeypatch)
    assert code == 0 and json.loads(out)["seconds_per_step"] > 0, err


@pytest.mark.parametrize("switch", ["--liger", "--offload", "--gradient-checkpointing"])
def test_a_switch_copied_from_a_calibrate_command_means_what_the_bare_flag_does(switch, capsys, monkeypatch):
    base = ["predict", "--model", "qwen2.5-0.5b", "--batch-size", "2", "--zero-stage", "2", "--json"]
    outputs = {}
    for spelled in ([switch], [switch, "on"], [switch, "off"], []):
        code, out, err = run_ftplan([*base, *spelled], capsys, monkeypatch)
        assert code == 0, err
        outputs[" ".join(spelled)] = json.loads(out)["setting"]
    assert outputs[switch] == outputs[f"{switch} on"] != outputs[f"{switch} off"] == outputs[""]
