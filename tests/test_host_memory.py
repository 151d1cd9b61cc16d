"""Host RAM per node for CPU optimizer offload: consistent with the shipped H200 calibration, where
llama-3-8b ZeRO-2 + offload was killed by the host OOM killer on a 125 GiB host while the small
models' full fine-tunes and the 8B's LoRA ran."""

from __future__ import annotations

import json

import pytest

from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.paths import calibrations_dir
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.host_memory import (
    host_bytes_per_node,
    offload_bytes_per_param,
    usable_host_bytes,
)

CALIBRATION_HOST_GIB = 125  # data/calibrations/README.md


def _offload(model: str, **changes) -> Setting:
    return Setting(model=model, zero_stage=2, offload_optimizer=True, **changes)


def _shipped_offload_statuses() -> dict[tuple[str, int], set[str]]:
    """(model, LoRA rank) -> statuses of the shipped trials with optimizer offload."""
    statuses: dict[tuple[str, int], set[str]] = {}
    for record in map(json.loads, (calibrations_dir() / "h200.jsonl").read_text().splitlines()):
        if record["offload_optimizer"]:
            statuses.setdefault((record["model"], record["lora_rank"]), set()).add(record["status"])
    return statuses


def test_shipped_calibration_has_the_8b_offload_kill_and_the_runs_that_fit_the_host():
    statuses = _shipped_offload_statuses()
    assert statuses[("llama-3-8b", 0)] == {"error"}
    assert all("ok" in statuses[key] for key in [("llama-3-8b", 16), ("llama-3.2-1b", 0), ("qwen2.5-0.5b", 0)])


def test_8b_lora_offload_that_ran_needs_far_less_than_its_host():
    need = host_bytes_per_node(load_architecture("llama-3-8b"), _offload("llama-3-8b", lora_rank=16))
    assert 0 < need < CALIBRATION_HOST_GIB * GIB / 4


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
