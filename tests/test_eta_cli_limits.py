"""`ftplan eta` refuses a run that can never take a full step (a micro-batch larger than each GPU's share of
the dataset) and a LoRA rank above the model's hidden size, in one line each."""

from __future__ import annotations

import pytest

from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from ftplan.cli.main import main
from ftplan.models.eta import estimate_eta

ETA = ["eta", "--model", "llama-3-8b", "--gpu", "H200"]


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "64", "--dataset-size", "10"], "batch 64 per GPU × 1 GPU(s) is more than the dataset's 10 samples"),
    (["--batch-size", "4", "--dataset-size", "10", "--lora-rank", "5000"],
     "LoRA rank 5000 is above llama-3-8b's hidden size 4096"),
    # a prime count made the even-split search step through a billion node counts (the fuzz test hung CI)
    (["--batch-size", "1", "--dataset-size", "10000000000", "--gpus", "1000000007"],
     "1,000,000,007 GPUs is more than any cluster"),
])
def test_impossible_runs_are_one_line_errors(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        main([*ETA, *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_each_gpu_may_take_its_padded_share_of_the_dataset():
    assert estimate_eta(1.0, 10, 1.0, 3, 4).steps == 1  # 10 samples over 4 GPUs: 3 each, the sampler pads
    with pytest.raises(FtplanError, match="use a batch up to 3"):
        estimate_eta(1.0, 10, 1.0, 4, 4)
    assert estimate_eta(1.0, 10, 1.0, 10, 1).steps == 1


def test_lora_rank_up_to_the_hidden_size_is_accepted():
    arch = load_architecture("tiny-llama")
    assert arch.lora_params(arch.hidden) > 0
    with pytest.raises(FtplanError, match="hidden size"):
        arch.lora_params(arch.hidden + 1)
