"""FtplanCallback never records a batch that ran out of memory as healthy, even when the user's code caught the
error (issue 17 #4), and never takes part in a collective or breaks training when it fails (issue 17 #5)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from ftplan.calibration import measure
from ftplan.store.records import read_records
from tests.test_callback import tiny_model, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # it skips them without transformers

# torch, transformers and the callback are imported inside the tests (one_torch_thread skips them all without
# transformers), and the TrainerCallback and Trainer subclasses made on first use: collecting must not load them.

REPO = Path(__file__).resolve().parent.parent
CALLBACK_RANK = REPO / "tests" / "fixtures" / "reliability" / "callback_rank.py"
CUDA_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (injected)"


@cache
def allocator_counts_an_oom_at_step() -> type:
    from transformers import TrainerCallback

    class AllocatorCountsAnOomAtStep(TrainerCallback):
        """As the CUDA allocator does when it raises an OOM that the training code catches and goes on from."""

        def __init__(self, step: int, stats: dict) -> None:
            self.step, self.stats = step, stats

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == self.step:
                self.stats["num_ooms"] += 1

    return AllocatorCountsAnOomAtStep


def test_an_oom_counted_by_the_cuda_allocator_makes_the_record_oom_though_training_went_on(tmp_path, monkeypatch):
    import torch

    from ftplan.calibration.callback import FtplanCallback

    stats = {"num_ooms": 5}  # earlier OOMs of the process (a retry loop's first attempts) do not count
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: dict(stats))
    out = tmp_path / "c.jsonl"
    train(tmp_path, [FtplanCallback(out=out, warmup_steps=1), allocator_counts_an_oom_at_step()(3, stats)], steps=5)
    [record] = read_records([out])
    assert record["status"] == "oom" and "out of memory" in record["message"], record["message"]


def test_a_run_whose_allocator_counted_no_new_oom_is_still_ok(tmp_path, monkeypatch):
    import torch

    from ftplan.calibration.callback import FtplanCallback

    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {"num_ooms": 5})
    out = tmp_path / "c.jsonl"
    train(tmp_path, [FtplanCallback(out=out, warmup_steps=1)], steps=4)
    [record] = read_records([out])
    assert record["status"] == "ok"


def oom_in_forward_at(model, call: int) -> None:
    """The first decoder layer raises a CUDA OOM on its call-th forward, as a too-large batch does."""
    import torch

    calls = []

    def pre_hook(module, args):
        calls.append(1)
        if len(calls) == call:
            raise torch.OutOfMemoryError(CUDA_OOM)

    model.model.layers[0].register_forward_pre_hook(pre_hook)


@cache
def skip_oom_trainer() -> type:
    import torch
    from transformers import Trainer

    class SkipOomTrainer(Trainer):
        """The common "skip the batch that ran out of memory" pattern."""

        def training_step(self, *args, **kwargs):
            try:
                return super().training_step(*args, **kwargs)
            except torch.OutOfMemoryError:
                return torch.tensor(0.0)

    return SkipOomTrainer


def test_an_oom_the_training_loop_caught_and_skipped_makes_the_record_oom(tmp_path):
    from transformers import TrainingArguments

    from ftplan.calibration.callback import FtplanCallback
    from ftplan.calibration.trial import RandomTokens

    model = tiny_model()
    oom_in_forward_at(model, 3)
    out = tmp_path / "c.jsonl"
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=2, max_steps=5, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    skip_oom_trainer()(model=model, args=args, callbacks=[FtplanCallback(out=out, warmup_steps=1)],
                   train_dataset=RandomTokens(10, 32, 8192)).train()
    [record] = read_records([out])
    assert record["status"] == "oom" and "OutOfMemoryError" in record["message"], record["message"]


def test_an_oom_caught_around_train_then_the_process_exiting_is_recorded_oom_not_ok(tmp_path):
    import torch

    from ftplan.calibration.callback import FtplanCallback

    model = tiny_model()
    oom_in_forward_at(model, 4)
    out = tmp_path / "c.jsonl"
    callback = FtplanCallback(out=out, warmup_steps=1)
    try:  # a retry loop or a notebook cell: the error is shown or handled, never reaches sys.excepthook
        train(tmp_path, [callback], model=model, steps=6)
    except torch.OutOfMemoryError:
        pass
    callback._at_exit()  # the interpreter exits later
    [record] = read_records([out])
    assert record["status"] == "oom", record["message"]


def test_a_failure_inside_the_callback_at_a_step_is_reported_and_training_goes_on(tmp_path, monkeypatch, capsys):
    from ftplan.calibration.callback import FtplanCallback

    def broken(device: str) -> None:
        raise OSError("no such device (injected)")

    monkeypatch.setattr(measure, "reset_peak_memory", broken)
    out = tmp_path / "c.jsonl"
    trainer = train(tmp_path, [FtplanCallback(out=out, warmup_steps=1)], steps=3)
    assert trainer.state.global_step == 3 and not out.exists()
    assert "ftplan: callback disabled, nothing recorded: OSError" in capsys.readouterr().err


def test_an_unwritable_output_never_raises_into_training(tmp_path, capsys):
    from ftplan.calibration.callback import FtplanCallback

    blocker = tmp_path / "a-file"
    blocker.write_text("")  # so the output's folder cannot be made, even by root
    trainer = train(tmp_path, [FtplanCallback(out=blocker / "c.jsonl", warmup_steps=1)], steps=3)
    assert trainer.state.global_step == 3
    assert "ftplan: callback disabled, nothing recorded: " in capsys.readouterr().err


def test_the_callback_uses_no_collective():
    from ftplan.calibration import callback as callback_module

    source = Path(callback_module.__file__).read_text()
    assert "torch.distributed" not in source and "all_gather" not in source and "barrier" not in source


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_two_ranks(out: Path, failing_rank: int) -> list[str]:
    """Both ranks' output, as torchrun would start them; fails the test when they hang."""
    env = {**os.environ, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    ranks = [subprocess.Popen([sys.executable, str(CALLBACK_RANK), str(out), str(failing_rank)], cwd=REPO, text=True,
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for rank in range(2)]
    try:
        logs = [rank.communicate(timeout=150)[0] for rank in ranks]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the ranks hung after the callback failed on rank {failing_rank}")
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], logs
    assert all("finished training and the collective after it" in log for log in logs)
    return logs


def test_a_callback_failing_on_one_of_two_ranks_does_not_hang_the_users_next_collective(tmp_path):
    out = tmp_path / "c.jsonl"
    logs = run_two_ranks(out, failing_rank=1)
    assert "callback disabled" in logs[1]
    [record] = read_records([out])  # rank 0 still records its own measurements, and says whose are missing
    assert record["status"] == "ok" and record["gpus"] == 2 and record["message"] == "no measurements from rank(s) 1"
    assert len(record["peak_reserved_bytes_per_gpu"]) == 1


def test_two_healthy_ranks_pass_their_results_to_rank_0_through_files_it_cleans_up(tmp_path):
    out = tmp_path / "c.jsonl"
    run_two_ranks(out, failing_rank=-1)
    [record] = read_records([out])
    assert record["status"] == "ok" and record["message"] == "" and record["gpu_count"] == 2
    assert len(record["peak_reserved_bytes_per_gpu"]) == 2 and record["steps_measured"] == 2
    assert not any((tmp_path / ".ftplan-ranks").iterdir())
