"""Host RAM per node for CPU optimizer offload: consistent with the shipped H200 calibration, where
llama-3-8b ZeRO-2 + offload was killed by the host OOM killer on a 125 GiB host and qwen2.5-0.5b ran."""

from __future__ import annotations

import json

import pytest

from calibration.settings import Setting
from models.architecture import load_architecture
from models.errors import FtplanError
from models.hardware import GIB
from models.host_memory import host_bytes_per_node, offload_bytes_per_param, usable_host_bytes
from models.paths import calibrations_dir

CALIBRATION_HOST_GIB = 125  # data/calibrations/README.md


def _offload(model: str, **changes) -> Setting:
    return Setting(model=model, zero_stage=2, offload_optimizer=True, **changes)


def _shipped_offload_trials() -> dict[str, str]:
    lines = (calibrations_dir() / "h200.jsonl").read_text().splitlines()
    return {r["model"]: r["status"] for r in map(json.loads, lines) if r["offload_optimizer"]}


def test_shipped_calibration_has_the_8b_offload_kill_and_the_small_model_run():
    assert _shipped_offload_trials() == {"llama-3-8b": "error", "qwen2.5-0.5b": "ok"}


def test_8b_offload_needs_more_host_ram_than_the_host_that_killed_it():
    setting = _offload("llama-3-8b", gradient_checkpointing=True)
    assert host_bytes_per_node(load_architecture("llama-3-8b"), setting) > CALIBRATION_HOST_GIB * GIB


def test_small_model_offload_needs_far_less_than_the_host_it_ran_on():
    need = host_bytes_per_node(load_architecture("qwen2.5-0.5b"), _offload("qwen2.5-0.5b"))
    assert 0 < need < CALIBRATION_HOST_GIB * GIB / 10


def test_bf16_adamw_offload_costs_18_bytes_per_parameter_from_deepspeed_source():
    assert offload_bytes_per_param(_offload("llama-3-8b")) == 4 + 4 + 8 + 2


def test_partitioning_over_more_nodes_shrinks_each_nodes_need():
    arch = load_architecture("llama-3-8b")
    one, two, four = (host_bytes_per_node(arch, _offload("llama-3-8b", gpus=8, nodes=n)) for n in (1, 2, 4))
    assert one > two > four
    assert two < one * 0.55  # the states halve; only the per-rank staging buffer stays


def test_partitioning_keeps_a_nodes_share_of_optimizer_states_and_adds_per_rank_buffers():
    arch = load_architecture("llama-3-8b")
    one_gpu = host_bytes_per_node(arch, _offload("llama-3-8b"))
    eight_gpus = host_bytes_per_node(arch, _offload("llama-3-8b", gpus=8))
    assert one_gpu < eight_gpus < one_gpu * 1.1


def test_lora_offloads_only_the_adapters():
    arch = load_architecture("llama-3-8b")
    lora = host_bytes_per_node(arch, _offload("llama-3-8b", lora_rank=16))
    assert lora == pytest.approx(arch.lora_params(16) * 18, rel=0.01)


@pytest.mark.parametrize("setting", [Setting(model="llama-3-8b"), Setting(model="llama-3-8b", zero_stage=3),
                                     Setting(model="llama-3-8b", zero_stage=2, gpus=8)])
def test_no_offload_needs_no_host_ram(setting):
    assert host_bytes_per_node(load_architecture("llama-3-8b"), setting) == 0


@pytest.mark.parametrize("gib", [0, -1, float("nan"), float("inf")])
def test_host_memory_must_be_a_positive_finite_number(gib):
    with pytest.raises(FtplanError, match="host memory must be a positive"):
        usable_host_bytes(gib, 0.02)


def test_usable_host_memory_keeps_the_safety_margin_free():
    assert usable_host_bytes(100, 0.02) == int(98 * GIB)
