"""One rule for the largest safe batch: the planner's search and the accuracy benchmark's answer agree."""

from __future__ import annotations

import warnings

import pytest

from ftplan.core.hardware import find_gpu
from ftplan.core.paths import calibrations_dir
from ftplan.store.records import read_records
from ftplan.models.fitset import fit_records
from ftplan.models.predictor import Predictor
from ftplan.models.safe_batch import (
    MemoryBudget,
    fit_largest_safe_batch,
    largest_safe_batch,
    proven_batch,
)
from ftplan.planner.search import safe_prediction


@pytest.fixture(scope="module")
def h200_records():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_records([calibrations_dir() / "h200.jsonl"])


def test_planner_search_over_the_predictor_lands_on_the_fits_own_safe_batch(h200_records):
    predictor, fits = Predictor.fit(h200_records), fit_records(h200_records).fits
    assert len(fits) >= 5
    for fit in fits:
        gpu, budget = find_gpu(fit.gpu_name), MemoryBudget(fit.capacity_bytes)
        for seq in fit.seq_lens:
            setting = fit.setting_at(seq)
            found = safe_prediction(lambda b: predictor.predict(setting, b, gpu), budget)
            expected = fit_largest_safe_batch(fit, seq, budget)
            assert (found.micro_batch if found else 0) == expected, fit.label


def test_a_batch_seen_out_of_memory_bounds_the_safe_batch_even_when_the_fit_says_it_fits(h200_records):
    # llama-3-8b LoRA r16 ran batch 7 and ran out of memory at 8 on the H200
    lora16 = next(f for f in fit_records(h200_records).fits
                  if f.setting["model"] == "llama-3-8b" and f.setting["lora_rank"] == 16)
    roomy = MemoryBudget(10 * lora16.capacity_bytes)
    assert fit_largest_safe_batch(lora16, 2048, roomy) == lora16.observed_limit(2048) - 1


def test_nothing_fits_is_zero_and_max_batch_caps_the_answer():
    budget = MemoryBudget(100)
    assert largest_safe_batch(lambda b: 200.0, budget) == 0
    assert largest_safe_batch(lambda b: 1.0, budget, max_batch=37) == 37


def test_a_batch_measured_healthy_is_safe_within_the_budget_and_no_further(h200_records):
    # qwen2.5-0.5b with checkpointing ran batch 31 at 137.3 GiB reserved and ran out of memory at 32
    fit = next(f for f in fit_records(h200_records).fits
               if f.setting["model"] == "qwen2.5-0.5b" and f.setting["gradient_checkpointing"])
    budget = MemoryBudget(fit.capacity_bytes)
    assert proven_batch(fit.measured_healthy(2048), fit.capacity_bytes) == 31
    assert largest_safe_batch(lambda b: fit.peak_reserved(b, 2048).upper, budget, fit.observed_limit(2048)) <= 30
    # the default 2% margin holds for measured peaks too: 31 used 98.2% of the card, 30 used 95.1%
    assert fit_largest_safe_batch(fit, 2048, budget) == 30
    assert fit_largest_safe_batch(fit, 2048, MemoryBudget(fit.capacity_bytes, safety_margin=0.0)) == 31
    smaller = MemoryBudget(100 * 2**30)  # on a smaller card only what fitted in it counts (24: 107 GiB)
    assert proven_batch(fit.measured_healthy(2048), smaller.capacity_bytes) == 16
    assert fit_largest_safe_batch(fit, 2048, smaller) < 24


def test_the_margin_applies_to_measured_batches_too(h200_records):
    # qwen2.5-0.5b full ran batch 19 at 99.2% of the H200: healthy on the card, but not within the default 2%
    # margin (a few calibration steps say little of hours of training), nor within a user's 10%
    fit = next(f for f in fit_records(h200_records).fits
               if f.setting["model"] == "qwen2.5-0.5b" and not f.setting["gradient_checkpointing"]
               and not f.setting["liger"] and not f.setting["zero_stage"] and f.setting["precision"] == "bf16")
    default, user = MemoryBudget(fit.capacity_bytes), MemoryBudget(fit.capacity_bytes, safety_margin=0.10)
    assert fit_largest_safe_batch(fit, 2048, MemoryBudget(fit.capacity_bytes, safety_margin=0.0)) == 19
    assert fit_largest_safe_batch(fit, 2048, default) == 18
    within = fit_largest_safe_batch(fit, 2048, user)
    assert 0 < within < 18
    assert fit.peak_reserved(within, 2048).upper <= user.usable_bytes or dict(fit.measured_healthy(2048))[within] <= user.usable_bytes
    reserved_only = MemoryBudget(fit.capacity_bytes, context_reserve_bytes=20 * 2**30)
    assert fit_largest_safe_batch(fit, 2048, reserved_only) < 19
