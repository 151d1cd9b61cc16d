"""FtplanCallback on real tiny Trainer runs (CPU, random weights): the record it leaves, also when interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest

from ftplan.calibration.trainer_setting import (
    collator_padding,
    deepspeed_zero,
    liger_applied,
    run_architecture,
)
from ftplan.calibration.trial import RandomTokens
from ftplan.core.architecture import load_architecture
from ftplan.core.hardware import load_catalog
from ftplan.core.paths import calibrations_dir
from ftplan.store.records import append_record, read_records

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # it skips them without transformers

REPO = Path(__file__).resolve().parent.parent
SEQ_LEN = 32


def tiny_model(layers: int | None = None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {k: v for k, v in load_architecture("tiny-llama").config.items() if not k.startswith("_")}
    if layers is not None:
        config["num_hidden_layers"] = layers
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**config))


def train(tmp_path: Path, callbacks: list, model=None, micro_batch: int = 2, steps: int = 6, collator=None, **arguments):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(**{"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": micro_batch,
                                "max_steps": steps, "use_cpu": True, "report_to": [], "save_strategy": "no",
                                "logging_strategy": "no", "disable_tqdm": True, "optim": "adamw_torch", **arguments})
    trainer = Trainer(model=model if model is not None else tiny_model(), args=args, callbacks=callbacks,
                      train_dataset=RandomTokens(micro_batch * steps, SEQ_LEN, 8192), data_collator=collator)
    trainer.train()
    return trainer


def test_lora_run_with_hand_enabled_checkpointing_leaves_one_record_of_its_setting_and_measurements(tmp_path):
    from peft import LoraConfig, get_peft_model

    from ftplan.calibration.callback import SOURCE, FtplanCallback

    model = get_peft_model(tiny_model(), LoraConfig(r=4, target_modules=["v_proj", "model.layers.0.self_attn.q_proj"]))
    model.activation_checkpointing_enable({"use_reentrant": False})  # by hand, not through TrainingArguments
    out = tmp_path / "calibrations.jsonl"
    callback = FtplanCallback(out=out, warmup_steps=2)
    train(tmp_path, [callback], model=model)

    [record] = read_records([out])
    arch = load_architecture("tiny-llama")
    assert record["source"] == SOURCE == "trainer_callback"
    assert record["status"] == "ok" and record["message"] == ""
    assert (record["model"], record["arch_hash"], record["seq_len"], record["micro_batch"]) == ("tiny-llama", arch.hash, SEQ_LEN, 2)
    assert (record["lora_rank"], record["lora_targets"]) == (4, ["q_proj", "v_proj"])
    assert record["gradient_checkpointing"] is True
    assert (record["precision"], record["optimizer"], record["zero_stage"], record["liger"]) == ("fp32", "adamw_torch", 0, False)
    assert (record["gpus"], record["nodes"], record["gpu_count"], record["device"]) == (1, 1, 1, "cpu")
    assert record["params_total"] == arch.params_total
    assert record["params_trainable"] < arch.params_total  # adapters only; PEFT may adapt fewer modules than named
    assert record["steps_measured"] == 4 == len(record["step_seconds"])
    assert record["seconds_per_step"] > 0 and record["tokens_per_second"] > 0
    assert record["peak_allocated_bytes"] > 0 and record["peak_reserved_bytes_per_gpu"] == [record["peak_reserved_bytes"]]
    assert record["versions"]["transformers"] and record["gradient_accumulation_steps"] == 1
    assert record["trainable_dtype"] == "float32"
    assert {k: v for k, v in callback.record.items()} == {k: v for k, v in record.items() if k != "_source"}


def test_earlier_runs_calibrate_the_prediction_of_a_later_run(tmp_path, capsys):
    from ftplan.calibration.callback import FtplanCallback

    out = tmp_path / "calibrations.jsonl"
    for batch in (1, 4):
        train(tmp_path, [FtplanCallback(out=out, warmup_steps=1)], micro_batch=batch, steps=3)
    callback = FtplanCallback(out=out, warmup_steps=1)
    train(tmp_path, [callback], micro_batch=2, steps=3)

    prediction = callback.record["prediction"]
    assert prediction["source"] == "interpolated" and prediction["gpu"] == "cpu"
    assert prediction["peak_allocated_bytes"] > 0 and prediction["seconds_per_step"] > 0
    printed = capsys.readouterr().err
    assert "ftplan prediction (interpolated) for micro-batch 2 on cpu" in printed
    assert "predicted   measured   error" in printed and "s/optimizer step" in printed
    assert len(read_records([out])) == 3


def __getattr__(name: str):
    """RaiseAtStep (`from test_callback import RaiseAtStep`), made on first use: a TrainerCallback subclass needs
    transformers, which collecting the suite must not import."""
    if name == "RaiseAtStep":
        return raise_at_step_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def raise_at_step_class() -> type:
    from transformers import TrainerCallback

    class RaiseAtStep(TrainerCallback):
        def __init__(self, step: int, error: BaseException):
            self.step, self.error = step, error

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == self.step:
                raise self.error

    return RaiseAtStep


def test_uncaught_out_of_memory_is_recorded_once_as_oom(tmp_path):
    import torch

    from ftplan.calibration.callback import FtplanCallback

    out = tmp_path / "calibrations.jsonl"
    callback = FtplanCallback(out=out, warmup_steps=1)
    with pytest.raises(torch.OutOfMemoryError) as raised:
        train(tmp_path, [callback, raise_at_step_class()(3, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))])
    assert callback.record is None
    assert not out.exists()  # nothing yet: the user might still catch the exception and go on
    sys.excepthook(raised.type, raised.value, raised.tb)  # what Python does with an uncaught exception
    callback._at_exit()  # and then the atexit handlers run

    [record] = read_records([out])
    assert record["status"] == "oom" and "out of memory after 2 measured step(s)" in record["message"]
    assert record["steps_measured"] == 2 and record["peak_reserved_bytes"] > 0
    assert sys.excepthook != callback._excepthook


INTERRUPTED_RUN = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    from test_callback import RaiseAtStep, train
    from ftplan.calibration.callback import FtplanCallback

    class Terminate(RaiseAtStep):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == self.step:
                os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler or `kill` would, mid-run

    train(Path({tmp!r}), [FtplanCallback(out={out!r}, warmup_steps=1), Terminate(4, None)], micro_batch=1, steps=40)
""")


def test_sigterm_mid_run_leaves_exactly_one_valid_record_and_still_terminates(tmp_path):
    from ftplan.calibration.callback import SOURCE

    out = tmp_path / "calibrations.jsonl"
    code = INTERRUPTED_RUN.format(tests=str(REPO / "tests"), tmp=str(tmp_path), out=str(out))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]
    [record] = read_records([out])
    assert record["status"] == "ok" and record["source"] == SOURCE
    assert record["message"] == "interrupted after 3 measured step(s): SIGTERM"
    assert record["steps_measured"] == 3 and record["seconds_per_step"] > 0
    assert len(out.read_text().splitlines()) == 1


def test_zero_stage_and_optimizer_offload_are_read_from_the_deepspeed_config(tmp_path):
    config = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    plain = SimpleNamespace(hf_deepspeed_config=None, deepspeed_plugin=None, deepspeed=None)
    assert deepspeed_zero(plain) == (0, False)
    assert deepspeed_zero(SimpleNamespace(**{**vars(plain), "deepspeed": config})) == (2, True)
    assert deepspeed_zero(SimpleNamespace(**{**vars(plain), "deepspeed": str(path)})) == (2, True)
    attached = SimpleNamespace(config={"zero_optimization": {"stage": 3}})
    assert deepspeed_zero(SimpleNamespace(**{**vars(plain), "hf_deepspeed_config": attached})) == (3, False)


def test_model_of_an_unshipped_shape_gets_its_config_written_next_to_the_records(tmp_path):
    arch = run_architecture(tiny_model(layers=3), tmp_path)
    assert Path(arch.id).parent == tmp_path and Path(arch.id).exists()
    assert load_architecture(arch.id).layers == 3 and arch.params_total > load_architecture("tiny-llama").params_total
    assert run_architecture(tiny_model(), tmp_path).id == "tiny-llama"


def test_a_model_type_holding_dot_dot_slash_writes_its_config_inside_the_records_folder(tmp_path):
    config = {k: v for k, v in load_architecture("tiny-llama").config.items() if not k.startswith("_")}
    config.update(num_hidden_layers=3, model_type="../../../escape")  # a remote-code model's config says what it likes
    folder = tmp_path / "a" / "b" / "c"
    arch = run_architecture(SimpleNamespace(config=SimpleNamespace(to_dict=lambda: dict(config))), folder)
    assert Path(arch.id).parent == folder
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [Path(arch.id)]


def test_a_module_from_liger_kernel_marks_the_run_as_liger():
    import torch

    model = tiny_model()
    assert not liger_applied(model)
    norm = type("LigerRMSNorm", (torch.nn.Module,), {"__module__": "liger_kernel.transformers.rms_norm"})
    model.model.norm = norm()
    assert liger_applied(model)


def test_a_failing_callback_never_breaks_training(tmp_path, capsys):
    from ftplan.calibration.callback import FtplanCallback

    out = tmp_path / "is-a-directory.jsonl"
    out.mkdir()
    trainer = train(tmp_path, [FtplanCallback(out=out, warmup_steps=1)], steps=3)
    assert trainer.state.global_step == 3
    assert "ftplan: callback disabled, nothing recorded: FtplanError: cannot write calibration file" in capsys.readouterr().err


def test_a_run_predicted_not_to_fit_is_warned_about_loudly():
    from ftplan.calibration.callback import _prediction_text
    from ftplan.core.settings import Setting
    from ftplan.models.prediction import Estimate, Prediction

    setting = Setting("llama-3-8b", seq_len=4096)
    run = SimpleNamespace(micro_batch=8, grad_accum=2, remaining_steps=1000, setting=lambda: setting)
    gib = 2**30

    def text(reserved_gib: float, upper_gib: float) -> str:
        prediction = Prediction(setting, 8, "H200", Estimate(reserved_gib * gib, upper_gib * gib),
                                Estimate(reserved_gib * gib, upper_gib * gib), Estimate(1.5, 1.8), "prior")
        return _prediction_text(prediction, run, capacity=141 * gib)

    assert "PREDICTED NOT TO FIT" in text(150, 160)
    assert "may not fit" in text(130, 150) and "PREDICTED NOT TO FIT" not in text(130, 150)
    fits = text(60, 70)
    assert "fit" not in fits.replace("ftplan prediction", "")
    assert "3 s/optimizer step, about 0:50:00 for the 1000 steps to go" in fits  # 2 micro-batches of 1.5 s per step


def test_cuda_run_records_the_allocator_peaks_of_the_card(tmp_path):
    import torch

    from ftplan.calibration.callback import FtplanCallback

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path / "calibrations.jsonl"
    train(tmp_path, [FtplanCallback(out=out, warmup_steps=2)], use_cpu=False, bf16=True)
    [record] = read_records([out])
    assert record["device"] == "cuda" and record["gpu_name"] == torch.cuda.get_device_name()
    assert 0 < record["peak_allocated_bytes"] <= record["peak_reserved_bytes"] < record["gpu_memory_total_bytes"]
    assert record["precision"] == "bf16" and record["steps_measured"] == 4 and record["num_alloc_retries"] == 0


def test_the_callback_predicts_through_the_plans_workspace_which_leaves_rehearsals_out(tmp_path, monkeypatch):
    """As in `ftplan plan`: one Workspace; a rehearsal verifies its emitted folder, its batches are the user's data,
    not a ladder, so it enters no fit."""
    import ftplan.calibration.callback as callback
    from ftplan.core.settings import Setting
    from ftplan.store.records import append_record, build_record

    setting = Setting("qwen2.5-0.5b")
    out = tmp_path / "records.jsonl"
    append_record(out, build_record(setting, 3, "ok", gpu_name="NVIDIA H200", peak_allocated_bytes=2**34))
    append_record(out, build_record(setting, 5, "ok", gpu_name="NVIDIA H200", peak_allocated_bytes=2**35,
                                    rehearsal=True))
    opened = []
    real_open = callback.Workspace.open
    monkeypatch.setattr(callback.Workspace, "open", lambda *a, **k: opened.append(real_open(*a, **k)) or opened[-1])
    prediction = callback._predict(setting, 3, "H200", out, "machine")
    evidence = opened[0].evidence
    assert prediction.micro_batch == 3
    assert [r["micro_batch"] for r in evidence.records if r.get("peak_allocated_bytes") in (2**34, 2**35)] == [3]
    assert [r["micro_batch"] for r in evidence.rehearsals] == [5]


def test_the_run_records_the_padding_its_collator_gives_the_batches(tmp_path):
    """The emitted padded recipe was recorded as padding none (no mask), so it never met its own calibration."""
    from tokenizers import Tokenizer, models
    from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from ftplan.calibration.callback import FtplanCallback

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0}, unk_token="<pad>")),
                                        pad_token="<pad>")
    assert collator_padding(DataCollatorForSeq2Seq(tokenizer, padding="longest", pad_to_multiple_of=8)) == \
        {"padding": "longest", "pad_to_multiple_of": 8}
    assert collator_padding(DataCollatorForSeq2Seq(tokenizer)) == {"padding": "longest", "pad_to_multiple_of": 0}
    assert collator_padding(DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True))["padding"] == "packed"
    assert collator_padding(None) == {"padding": "none", "pad_to_multiple_of": 0}
    out = tmp_path / "calibrations.jsonl"
    train(tmp_path, [FtplanCallback(out=out, warmup_steps=2)], steps=4,
          collator=DataCollatorForSeq2Seq(tokenizer, padding="max_length", max_length=SEQ_LEN))
    [record] = read_records([out])
    assert (record["padding"], record["attention"]) == ("max_length", "sdpa")


def test_without_a_cpu_calibration_the_callback_names_the_calibrate_command_of_this_very_run(tmp_path):
    """It said `ftplan calibrate --device cpu`, which calibrates padding to max_length: a plain Trainer run pads
    nothing, so the calibration it asked for was never found."""
    from ftplan.calibration.callback import _predict
    from ftplan.core.settings import Setting

    setting = Setting("tiny-llama", seq_len=256, precision="fp32", padding="none")
    message = _predict(setting, 2, "cpu", tmp_path / "none.jsonl", "no-such-machine")
    assert ("`ftplan calibrate --model tiny-llama --seq-len 256 --device cpu --precision fp32 --padding none`"
            in message), message


def test_a_run_accumulating_gradients_compares_but_leaves_no_record_and_old_ones_enter_no_fit(tmp_path, capsys):
    """Its seconds per step are 4 micro-batches' and were fitted as one's: a planned step 14 times too slow."""
    from ftplan.calibration.callback import FtplanCallback
    from ftplan.evidence.inputs import load_evidence

    out = tmp_path / "calibrations.jsonl"
    callback = FtplanCallback(out=out, warmup_steps=1)
    train(tmp_path, [callback], micro_batch=2, steps=3, gradient_accumulation_steps=4)
    assert callback.record["gradient_accumulation_steps"] == 4 and not out.exists()
    assert "no record appended: a step of 4 accumulated micro-batches" in capsys.readouterr().err
    append_record(out, callback.record)  # as an older ftplan wrote it
    with pytest.warns(UserWarning, match="a step of 4 accumulated micro-batches, not one micro-batch's; record skipped"):
        records = load_evidence([out, calibrations_dir()], load_catalog()).records
    assert records and not any(r["source"] == "trainer_callback" for r in records)
