"""The Python API checks what a notebook passes, as click checks the CLI: a string or a fraction is a
one-line FtplanError, never a bare TypeError or a fractional batch predicted as if it were real."""

from __future__ import annotations

import pytest

import ftplan
from ftplan.core.errors import FtplanError


@pytest.mark.parametrize("kwargs, message", [
    ({"dataset_size": "abc"}, "dataset_size must be a whole number, got 'abc'"),
    ({"dataset_size": 10.5}, "dataset_size must be a whole number"),
    ({"dataset_size": 100, "seq_len": 100.5}, "seq_len must be a whole number"),
    ({"dataset_size": 100, "epochs": "x"}, "epochs must be a number"),
    ({"dataset_size": 100, "gpus": 2.5}, "gpus must be a whole number"),
    ({"dataset_size": 100, "lora_ranks": [8.0]}, r"lora_ranks\[0\] must be a whole number"),
    ({"dataset_size": 100, "gpu": 200}, "gpu must be a string"),
])
def test_plan_refuses_mistyped_arguments(kwargs, message):
    with pytest.raises(FtplanError, match=message):
        ftplan.plan(**{"model": "llama-3-8b", "gpu": "H200", **kwargs})


@pytest.mark.parametrize("batch, setting, message", [
    (4.5, {}, "batch_size must be a whole number, got 4.5"),
    ("4", {}, "batch_size must be a whole number"),
    (4, {"seq_len": "x"}, "seq_len must be a whole number"),
    (4, {"seqlen": 512}, "unknown setting field"),
])
def test_predict_refuses_a_fractional_batch_and_mistyped_settings(batch, setting, message):
    with pytest.raises(FtplanError, match=message):
        ftplan.predict("llama-3-8b", batch, "H200", **setting)


def test_numpy_integers_are_whole_numbers():
    np = pytest.importorskip("numpy")
    assert ftplan.predict("llama-3-8b", np.int64(4), "H200", seq_len=np.int64(512)).micro_batch == 4


def test_nan_epochs_are_not_positive():
    with pytest.raises(FtplanError, match="epochs must be positive, got nan"):
        ftplan.plan(model="llama-3-8b", dataset_size=100, gpu="H200", epochs=float("nan"))


@pytest.mark.parametrize("switch", ["liger", "gradient_checkpointing", "offload_optimizer"])
def test_a_switch_given_as_a_string_is_refused_not_taken_as_on(switch):
    with pytest.raises(FtplanError, match=f"{switch} must be True or False, got 'no'"):
        ftplan.predict("llama-3-8b", 4, "H200", **{switch: "no"})  # "no" is truthy: it once planned Liger on
