"""`ftplan rehearse` and what it rests on: the folder's plan.json, the heaviest-first row order, the lowered
batch that keeps the global batch, and rewriting only what ftplan wrote. The GPU run itself is measured by
benchmarks/gpu/emitted_runs.py; here the parts that decide what runs and what is written."""

from __future__ import annotations

import json
import os
import sys

import pytest

from ftplan.calibration.rehearsal import HEAVY_STEPS, rehearsal_lengths
from ftplan.core.errors import FtplanError
from ftplan.planner.emit import PLAN_JSON, README, TRAINING_ARGS, TRAINING_ARGS_PY, rewrite_rehearsed
from ftplan.planner.rehearse import lowered, read_plan, rehearsal_seconds
from tests.helpers import run_ftplan

PLAN = ["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset-size", "1000", "--full"]


def emit(tmp_path, capsys, monkeypatch, *args):
    folder = tmp_path / "configs"
    code, out, err = run_ftplan([*PLAN, *args, "--emit", folder], capsys, monkeypatch)
    assert code == 0, err
    return folder


def test_rows_put_the_longest_samples_in_the_first_steps_then_a_random_mix():
    lengths = list(range(1, 501))
    plan = {"micro_batch": 4, "accumulation": 2, "length": 500, "lengths": lengths}
    rows, heavy = rehearsal_lengths(plan, steps=10)
    assert heavy == HEAVY_STEPS and len(rows) == 4 * 2 * 10
    assert rows[:8 * HEAVY_STEPS] == sorted(lengths, reverse=True)[:8 * HEAVY_STEPS]
    assert set(rows[8 * HEAVY_STEPS:]) <= set(lengths) and rows[8 * HEAVY_STEPS:] != sorted(rows[8 * HEAVY_STEPS:])


def test_rows_without_a_dataset_are_shorter_than_the_planned_length_so_every_batch_is_padded():
    rows, heavy = rehearsal_lengths({"micro_batch": 3, "accumulation": 1, "length": 2048, "lengths": None}, steps=5)
    assert heavy == 0 and len(rows) == 15 and all(1024 <= n < 2048 for n in rows)


@pytest.mark.parametrize("micro, accumulation, reserved, usable, expected", [
    (10, 1, 150, 137, (9, 2)),     # over by 9%: one less, accumulation keeps at least the global batch of 10
    (40, 1, 160, 100, (25, 2)),    # over by 60%: by the share it went over
    (2, 3, 200, 100, (1, 6)),
    (1, 1, 200, 100, (1, 1)),      # nothing below 1
])
def test_a_lowered_batch_keeps_the_global_batch(micro, accumulation, reserved, usable, expected):
    new = lowered(micro, accumulation, reserved, usable)
    assert new == expected and new[0] * new[1] >= micro * accumulation


def test_rewrite_changes_the_batch_split_in_every_file_and_keeps_force_working(tmp_path, capsys, monkeypatch):
    folder = emit(tmp_path, capsys, monkeypatch)
    rewrite_rehearsed(folder, 3, 5, {"verdict": "test"}, "LOWERED by a test")
    args = json.loads((folder / TRAINING_ARGS).read_text())
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == (3, 5)
    assert "'per_device_train_batch_size': 3" in (folder / TRAINING_ARGS_PY).read_text()
    readme = (folder / README).read_text()
    assert "micro-batch 3 x gradient accumulation 5 per GPU" in readme and readme.rstrip().endswith("LOWERED by a test")
    numbers = read_plan(folder)
    assert (numbers["micro_batch"], numbers["accumulation"], numbers["rehearsals"]) == (3, 5, [{"verdict": "test"}])
    code, _, err = run_ftplan([*PLAN, "--emit", folder, "--force"], capsys, monkeypatch)  # the manifest followed
    assert code == 0, err


def test_rewrite_never_replaces_a_file_the_user_edited(tmp_path, capsys, monkeypatch):
    folder = emit(tmp_path, capsys, monkeypatch)
    (folder / TRAINING_ARGS_PY).write_text("# mine\n")
    with pytest.raises(FtplanError, match="was not written by ftplan"):
        rewrite_rehearsed(folder, 2, 1, {}, "note")
    assert (folder / TRAINING_ARGS_PY).read_text() == "# mine\n"


def test_rehearse_refuses_a_folder_emit_did_not_write_in_one_line(tmp_path, capsys, monkeypatch):
    code, out, err = run_ftplan(["rehearse", tmp_path], capsys, monkeypatch)
    assert code == 2 and err.strip().count("\n") == 0 and "has no plan.json" in err
    (tmp_path / PLAN_JSON).write_text("[1, 2]")
    code, _, err = run_ftplan(["rehearse", tmp_path], capsys, monkeypatch)
    assert code == 2 and "not as `ftplan plan --emit` wrote it" in err


def test_a_folder_missing_a_run_file_is_refused(tmp_path, capsys, monkeypatch):
    """A deleted training_args.json (or ds_config.json) passed: only files present were checked."""
    folder = emit(tmp_path, capsys, monkeypatch)
    (folder / "training_args.json").unlink()
    code, _, err = run_ftplan(["rehearse", folder, "--dry-run"], capsys, monkeypatch)
    assert code == 2 and "training_args.json is not as `ftplan plan --emit` wrote it (edited or deleted" in err


@pytest.mark.parametrize("name, edit", [(PLAN_JSON, lambda numbers: {**numbers, "predicted": None}),
                                        (PLAN_JSON, lambda numbers: {**numbers, "micro_batch": 0}),
                                        ("training_args.py", None)])
def test_an_edited_folder_is_refused_before_any_gpu_time(tmp_path, capsys, monkeypatch, name, edit):
    """Tampered plan.json fields gave tracebacks (TypeError, RecursionError) or were taken as they were, and an
    edited file was refused only when rewritten, after the GPU runs."""
    folder = emit(tmp_path, capsys, monkeypatch)
    path = folder / name
    path.write_text(json.dumps(edit(json.loads(path.read_text()))) if edit else path.read_text() + "\n# mine\n")
    for extra in ([], ["--dry-run"]):
        code, _, err = run_ftplan(["rehearse", folder, *extra], capsys, monkeypatch)
        assert code == 2 and err.strip().count("\n") == 0 and f"{name} is not as `ftplan plan --emit` wrote it" in err


def test_dry_run_prints_the_plan_and_its_gpu_time_without_a_gpu(tmp_path, capsys, monkeypatch):
    folder = emit(tmp_path, capsys, monkeypatch)
    code, out, err = run_ftplan(["rehearse", folder, "--dry-run"], capsys, monkeypatch)
    assert code == 0, err
    said = " ".join(out.split())
    assert "micro-batch" in said and "GPU-minutes a run" in said  # and what would run, as the help promises:
    assert f"would train with {folder / 'training_args.py'} unchanged" in said and "20 steps" in said
    assert "records to calibrations/rehearsals.jsonl" in said


def test_emit_setup_writes_the_named_ranked_setup_or_lists_them(tmp_path, capsys, monkeypatch):
    code, _, err = run_ftplan([*PLAN, "--emit", tmp_path / "a", "--emit-setup", "no such"], capsys, monkeypatch)
    assert code == 2 and "ranked:" in err and "'ddp full s2048 padded'" in err
    folder = emit(tmp_path, capsys, monkeypatch, "--emit-setup", "ddp full s2048 padded")
    setting = read_plan(folder)["setting"]
    assert (setting["liger"], setting["zero_stage"], setting["padding"]) == (False, 0, "max_length")
    short = emit(tmp_path / "short", capsys, monkeypatch, "--emit-setup", "ddp full padded")  # as the table prints it
    assert read_plan(short)["setting"] == setting


def test_emit_setup_without_emit_is_refused(capsys, monkeypatch):
    code, _, err = run_ftplan([*PLAN, "--emit-setup", "ddp full padded"], capsys, monkeypatch)
    assert code == 2 and "--emit DIR" in err


def test_emitted_module_loads_the_model_as_the_trial_does_and_uses_current_argument_names(tmp_path, capsys,
                                                                                         monkeypatch):
    pytest.importorskip("transformers")
    import importlib.util
    import warnings

    folder = emit(tmp_path, capsys, monkeypatch, "--emit-setup", "ddp full gc s2048 padded")
    spec = importlib.util.spec_from_file_location("emitted_training_args", folder / TRAINING_ARGS_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.MODEL_KWARGS == {"dtype": "float32", "attn_implementation": "sdpa"} and module.LORA is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a deprecated key warns; the emitted names must not
        args = module.training_arguments(use_cpu=True, bf16=False)
    assert (getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing) is True


def test_plan_emit_says_how_to_rehearse_the_folder_and_its_gpu_time(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "configs"
    code, out, err = run_ftplan([*PLAN, "--emit", folder], capsys, monkeypatch)
    assert code == 0, err
    minutes = rehearsal_seconds(read_plan(folder), 20) / 60
    assert f"`ftplan rehearse {folder}`" in out and f"about {minutes:.1f} GPU-minutes" in out


def _search_runs(runs_at, usable=137, lower=True, grow=True, start=(5, 1)):
    """Drive a BatchSearch with reserved GiB per micro-batch (None: out of memory); the splits it asked for."""
    from ftplan.planner.rehearse import BatchSearch, Rehearsal

    search, split, asked = BatchSearch(usable * GIB, lower, grow), start, []
    while split is not None:
        asked.append(split)
        reserved = runs_at(split[0])
        status = "oom" if reserved is None else "ok"
        split = search.saw(Rehearsal(split[0], split[1], status, "", {"peak_reserved_bytes": (reserved or 0) * GIB},
                                     usable * GIB))
    return asked, search.answer


GIB = 2**30


def test_a_safe_run_with_room_is_raised_to_the_largest_split_that_runs_safely():
    # Llama-3-8B LoRA on the H200: 105.6 GiB reserved at the planned 5, 123.6 at 6 (17 GiB a sample over 16 static)
    asked, answer = _search_runs(lambda b: 16 + 17.9 * b)
    assert asked == [(5, 1), (6, 1)] and answer.micro_batch == 6  # 7 would reserve 141: not tried
    # a raise that overshoots is bisected back, and the largest safe split is kept
    asked, answer = _search_runs(lambda b: None if b > 44 else 20 + 2.4 * b, start=(39, 1))
    assert asked[:2] == [(39, 1), (47, 1)] and asked[2] == (43, 1)
    assert answer.micro_batch == max(b for b, _ in asked if b <= 44) and len(asked) <= 4


def test_no_raise_without_room_or_when_asked_not_to_and_lowering_is_unchanged():
    assert _search_runs(lambda b: 130, start=(9, 1))[0] == [(9, 1)]  # 9 * 137 / 130 rounds down to 9
    assert _search_runs(lambda b: 20 * b, grow=False)[0] == [(5, 1)]
    asked, answer = _search_runs(lambda b: 15 * b, start=(10, 1))  # 150 GiB: over by 9%, lowered to 9 x 2
    assert asked[:2] == [(10, 1), (9, 2)] and answer.micro_batch == 9 and answer.safe
    assert _search_runs(lambda b: 15 * b, start=(10, 1), lower=False)[0] == [(10, 1)]


def test_only_a_plan_that_chose_its_own_global_batch_and_accumulates_nothing_grows(tmp_path, capsys, monkeypatch):
    from ftplan.planner.rehearse import can_grow

    numbers = read_plan(emit(tmp_path, capsys, monkeypatch))
    assert numbers["global_batch_asked"] is None and can_grow(numbers)
    assert not can_grow({**numbers, "accumulation": 2})
    assert not can_grow({**numbers, "global_batch_asked": 64})
    assert not can_grow({**numbers, "strategy": "pack"})  # packing runs the fastest micro-batch, not the largest
    assert not can_grow({**numbers, "largest_fitting": numbers["micro_batch"] + 3})  # a smaller one was faster
    assert not can_grow({key: value for key, value in numbers.items() if key != "global_batch_asked"})  # older folder


def test_rehearse_ends_the_folder_at_the_largest_safe_batch_and_records_every_run(tmp_path, capsys, monkeypatch):
    """The whole loop on a fake GPU: each run's reserved memory grows with the folder's micro-batch."""
    import ftplan.planner.rehearse as rehearse

    folder = emit(tmp_path, capsys, monkeypatch)
    planned, usable = read_plan(folder)["micro_batch"], read_plan(folder)["usable_bytes"]

    def fake_run(directory, steps, timeout, log):
        micro = read_plan(directory)["micro_batch"]
        reserved = usable * (0.2 + 0.8 * micro / (planned + 2.5))  # planned + 2 is the largest that fits
        return {"status": "ok", "message": "", "peak_reserved_bytes": int(reserved), "gpu_name": "NVIDIA H200"}

    monkeypatch.setattr(rehearse, "cuda_problem", lambda: None)
    monkeypatch.setattr(rehearse, "run_once", fake_run)
    records = []
    search = rehearse.rehearse_folder(folder, 3, 60, True, tmp_path / "logs", records.append, lambda _: None)
    numbers = read_plan(folder)
    assert search.answer.micro_batch == numbers["micro_batch"] == planned + 2
    assert len(records) == len(search.runs) == len(numbers["rehearsals"]) and records[0]["micro_batch"] == planned
    assert json.loads((folder / TRAINING_ARGS).read_text())["per_device_train_batch_size"] == planned + 2
    assert (folder / README).read_text().rstrip().splitlines()[-1].startswith("VERIFIED by `ftplan rehearse`: "
                                                                              f"micro-batch {planned + 2}")


def test_a_packed_folder_rehearses_through_trls_sfttrainer_padding_free(tmp_path, capsys, monkeypatch):
    """What the rehearsal runs for --batching pack: the emitted SFTConfig, TRL packing the samples into rows and
    collating them padding-free (position_ids, no mask), here on the CPU with a tiny model."""
    pytest.importorskip("trl")
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from ftplan.calibration.rehearsal import load_emitted, packed_sample_lengths, packed_trainer

    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({"text": "word " * (20 + i % 50)}) + "\n" for i in range(200)))
    folder = tmp_path / "configs"
    code, _, err = run_ftplan(["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset", dataset, "--full",
                               "--batching", "pack", "--pack-length", "64", "--emit", folder,
                               "--emit-setup", "ddp full s64 packed"],  # DDP: no DeepSpeed batch to match
                              capsys, monkeypatch)
    assert code == 0, err
    numbers = read_plan(folder)
    lengths = packed_sample_lengths(numbers, steps=2)
    assert sum(lengths) >= 1.1 * numbers["micro_batch"] * 2 * 64 and max(lengths) <= 64
    emitted = load_emitted(folder)
    args = emitted.training_arguments(output_dir=str(tmp_path / "out"), max_steps=2, report_to=[], use_cpu=True,
                                      bf16=False, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                      per_device_train_batch_size=2, gradient_accumulation_steps=1,
                                      use_liger_kernel=False)  # Liger's kernels need a GPU
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=300)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.config.use_cache = False
    trainer = packed_trainer(model, args, lengths, 300, [])
    batch = next(iter(trainer.get_train_dataloader()))
    assert "position_ids" in batch and "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    assert trainer.train().global_step == 2


def test_a_cpu_plan_is_not_sent_to_rehearse_which_points_nowhere(tmp_path, capsys, monkeypatch):
    """A --gpu cpu folder was told to `ftplan rehearse` it, which then said 'use --device cpu', an option it lacks."""
    folder = tmp_path / "cpu"
    code, out, err = run_ftplan(["plan", "--model", "tiny-llama", "--seq-len", 256, "--dataset-size", 100, "--gpu",
                                 "cpu", "--precision", "fp32", "--emit", folder], capsys, monkeypatch)
    assert code == 0 and "verify it on the GPU" not in out and "run your train.py" in out, out
    assert "ftplan rehearse" not in (folder / "README.txt").read_text()
    assert json.loads((folder / "training_args.json").read_text())["use_cpu"] is True  # as the CPU trial ran
    for dry_run in ([], ["--dry-run"]):
        code, out, err = run_ftplan(["rehearse", folder, *dry_run], capsys, monkeypatch)
        assert code == 2 and "planned for this CPU" in err and "--device" not in err and "GPU-minutes" not in out


@pytest.mark.parametrize("key, value, words", [
    ("micro_batch", 0, "must be a positive"), ("micro_batch", -5, "must be a positive"),
    ("accumulation", 3.5, "must be a positive"), ("predicted", "nan", "must be a positive"),
    ("micro_batch", 10**9, "is above 1048576"), ("model", "no-such-model", "no-such-model"),
    ("setting", [], "setting is not a recipe"), ("setting", None, "setting is not a recipe"),
    ("setting", {}, "setting is not a recipe"), ("model", 5, "setting is not a recipe"),
    ("lora_targets", "q_proj", "setting is not a recipe"), ("seq_len", 10**12, "past every model's context")])
def test_plan_numbers_are_checked_even_under_a_rehashed_manifest(tmp_path, capsys, monkeypatch, key, value, words):
    """The manifest is a plain sha256 list: re-hashed after an edit, micro-batch 0 or a NaN prediction reached the
    dry run ('about inf GPU-minutes a run'), exit 0; an unknown GPU or model, or batch 10^9, reached the GPU."""
    import hashlib

    folder = emit(tmp_path, capsys, monkeypatch)
    numbers = json.loads((folder / PLAN_JSON).read_text())
    if key == "predicted":
        numbers["predicted"]["seconds_per_step"] = float(value)
    elif key in ("model", "lora_targets", "seq_len"):
        numbers["setting"][key] = value
    else:
        numbers[key] = value
    (folder / PLAN_JSON).write_text(json.dumps(numbers))
    manifest = json.loads((folder / ".ftplan-manifest.json").read_text())
    manifest["files"][PLAN_JSON] = hashlib.sha256((folder / PLAN_JSON).read_bytes()).hexdigest()
    (folder / ".ftplan-manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_ftplan(["rehearse", folder, "--dry-run"], capsys, monkeypatch)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", [".ftplan-manifest.json", "training_args.py"])
def test_a_folder_where_an_emitted_file_was_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch, name):
    """os.fdopen refused the folder's descriptor with IsADirectoryError before the regular-file check ran."""
    folder = emit(tmp_path, capsys, monkeypatch)
    (folder / name).unlink()
    (folder / name).mkdir()
    code, _, err = run_ftplan(["rehearse", folder, "--dry-run"], capsys, monkeypatch)
    assert code == 2 and err.startswith("error:") and err.strip().count("\n") == 0, err


def test_the_rehearsal_runs_the_folders_source_not_bytecode_planted_beside_it(tmp_path, capsys, monkeypatch):
    """Bytecode in the folder's __pycache__ whose header matches training_args.py's size and time ran in its
    place: the rehearsal recorded the source's digest and ran something else."""
    import importlib.util
    import py_compile

    from ftplan.calibration.rehearsal import load_emitted

    folder = emit(tmp_path, capsys, monkeypatch)
    source = folder / "training_args.py"
    planted = tmp_path / "planted.py"
    text = "PLANTED = True\n"
    planted.write_text(text + "#" * (source.stat().st_size - len(text) - 1) + "\n")  # the source's size
    os.utime(planted, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns))  # and time
    py_compile.compile(str(planted), cfile=importlib.util.cache_from_source(str(source)), doraise=True)
    before = sys.pycache_prefix
    assert not hasattr(load_emitted(folder), "PLANTED")
    assert sys.pycache_prefix == before  # nothing of this process's own imports moved
